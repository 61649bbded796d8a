/** What the book offers the panel: its modules (the "Search in" menu) and its common questions, loaded when the
 * panel first opens; a server without them is not an error (the menu and the suggestions stay empty). */
import { useEffect, useState } from "react";
import type { ChatClient } from "./client";
import type { FaqEntry, ModuleInfo } from "./protocol";

export function useBookInfo(client: ChatClient, open: boolean): { modules: ModuleInfo[]; faq: FaqEntry[] } {
  const [modules, setModules] = useState<ModuleInfo[]>([]);
  const [faq, setFaq] = useState<FaqEntry[]>([]);
  const loaded = modules.length > 0 || faq.length > 0;
  useEffect(() => {
    if (!open || loaded) return;
    client.modules().then(setModules, () => setModules([]));
    client.faq().then(setFaq, () => setFaq([]));
    // Not again when they arrive: only when the panel opens (or the client changes) with none loaded.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [open, client]);
  return { modules, faq };
}
