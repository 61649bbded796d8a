/** A small "Copy" button that says "Copied" (or "Copy failed") for two seconds after a click. */
import { useEffect, useState, type ReactNode } from "react";
import { copyToClipboard } from "./copyText";

export function CopyButton({ text, label = "Copy", what }: { text: () => string; label?: string; what: string }): ReactNode {
  const [outcome, setOutcome] = useState<"copied" | "failed" | null>(null);
  useEffect(() => {
    if (!outcome) return;
    const timer = setTimeout(() => setOutcome(null), 2000);
    return () => clearTimeout(timer);
  }, [outcome]);
  return (
    <button
      type="button"
      className="tc-button tc-small tc-copy"
      aria-label={outcome ? undefined : `Copy ${what}`}
      onClick={() => void copyToClipboard(text()).then((ok) => setOutcome(ok ? "copied" : "failed"))}
    >
      <span aria-live="polite">{outcome === "copied" ? "Copied" : outcome === "failed" ? "Copy failed" : label}</span>
    </button>
  );
}
