// The theme's Root with the chat panel beside the page. The panel renders in the browser only (it uses
// window, storage and the selection); same-site links in answers navigate through the site's router.
// CommonJS, as docusaurus/package.json says: the site's bundler compiles it as such.
const React = require("react");
const BrowserOnly = require("@docusaurus/BrowserOnly").default;
const { useHistory } = require("@docusaurus/router");
const { usePluginData } = require("@docusaurus/useGlobalData");
require("textbook-chat-panel/style.css");

function Panel() {
  const { ChatPanel } = require("textbook-chat-panel"); // only ever in the browser (BrowserOnly)
  const { apiBase, title } = usePluginData("docusaurus-plugin-textbook-chat");
  const history = useHistory();
  const navigate = React.useCallback((to) => history.push(to), [history]);
  return React.createElement(ChatPanel, { apiBase, ...(title ? { title } : {}), navigate });
}

function Root({ children }) {
  return React.createElement(
    React.Fragment,
    null,
    children,
    React.createElement(BrowserOnly, null, () => React.createElement(Panel)),
  );
}

module.exports = Root;
