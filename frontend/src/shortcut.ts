/**
 * The keyboard shortcut that opens the panel from anywhere on the page: Ctrl+I, or ⌘+I on a Mac (the chord
 * Mintlify's and kapa.ai's assistants use; Ctrl/⌘+K stays with the site's search).
 */
import { useEffect } from "react";
type Chord = Pick<KeyboardEvent, "key" | "ctrlKey" | "metaKey" | "altKey" | "shiftKey">;

export const SHORTCUT_LABEL = (mac: boolean): string => (mac ? "⌘I" : "Ctrl+I");
/** The same chord as `aria-keyshortcuts` spells it. */
export const SHORTCUT_KEYS = (mac: boolean): string => (mac ? "Meta+I" : "Control+I");

export function isOpenShortcut(event: Chord, mac: boolean): boolean {
  const command = mac ? event.metaKey && !event.ctrlKey : event.ctrlKey && !event.metaKey;
  return command && !event.altKey && !event.shiftKey && event.key.toLowerCase() === "i";
}

export function onMac(): boolean {
  return typeof navigator !== "undefined" && /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);
}

/** Call `onShortcut` when the reader presses the shortcut anywhere on the page (the browser's own use of it is
 * prevented). */
export function useOpenShortcut(mac: boolean, onShortcut: () => void): void {
  useEffect(() => {
    const onKey = (event: KeyboardEvent): void => {
      if (!isOpenShortcut(event, mac)) return;
      event.preventDefault();
      onShortcut();
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [mac, onShortcut]);
}
