/** Inline SVG icons (no emoji: headless and minimal systems often lack an emoji font). */
import type { ReactNode } from "react";

const common = { width: 16, height: 16, viewBox: "0 0 24 24", fill: "none", stroke: "currentColor", strokeWidth: 2, "aria-hidden": true } as const;

export function ChatIcon(): ReactNode {
  return (
    <svg {...common}>
      <path d="M21 12a8 8 0 0 1-11.6 7.1L4 20l1-4.6A8 8 0 1 1 21 12z" strokeLinejoin="round" />
    </svg>
  );
}

export function ThumbIcon({ down = false }: { down?: boolean }): ReactNode {
  return (
    <svg {...common} style={down ? { transform: "rotate(180deg)" } : undefined}>
      <path d="M7 10v11H3V10h4zm0 0 4-8a3 3 0 0 1 3 3v4h5.5a2 2 0 0 1 2 2.3l-1.4 8A2 2 0 0 1 18 21H7" strokeLinejoin="round" />
    </svg>
  );
}
