/** The package's public surface: the panel component for a Docusaurus Root, and a mount helper for plain pages. */
import { createRoot, type Root } from "react-dom/client";
import { createElement } from "react";
import { ChatPanel, type ChatPanelProps } from "./ChatPanel";

export { ChatPanel, type ChatPanelProps };

/** Render the panel into `element` (created and appended to <body> when omitted); returns the React root. */
export function mountChatPanel(props: ChatPanelProps = {}, element?: HTMLElement): Root {
  let host = element;
  if (!host) {
    host = document.createElement("div");
    host.id = "textbook-chat";
    document.body.appendChild(host);
  }
  const root = createRoot(host);
  root.render(createElement(ChatPanel, props));
  return root;
}
