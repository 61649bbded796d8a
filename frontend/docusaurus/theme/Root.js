// The theme's Root with the chat panel beside the page. Rendered in the browser only (the panel uses
// window, storage and selection); navigation goes through the site's router.
import React from "react";
import BrowserOnly from "@docusaurus/BrowserOnly";
import { useHistory } from "@docusaurus/router";
import { usePluginData } from "@docusaurus/useGlobalData";

function Panel() {
  const { ChatPanel } = require("@textbook-chat/ChatPanel");
  require("@textbook-chat/panel.css");
  const { apiBase, title } = usePluginData("docusaurus-plugin-textbook-chat");
  const history = useHistory();
  return React.createElement(ChatPanel, {
    apiBase,
    ...(title ? { title } : {}),
    navigate: (to) => history.push(to),
  });
}

export default function Root({ children }) {
  return React.createElement(
    React.Fragment,
    null,
    children,
    React.createElement(BrowserOnly, null, () => React.createElement(Panel)),
  );
}
