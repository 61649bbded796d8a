// The Docusaurus 3 plugin: the Textbook Chat panel on every page of a site, in one line of docusaurus.config:
//
//   plugins: [["textbook-chat-panel/docusaurus", { apiBase: "https://chat.example.org" }]],
//
// after `npm install` of this package (the tarball `npm pack` makes, or its folder once `npm run build:lib`
// has run). It provides the theme's Root, mounted once and kept across client-side navigation, so the panel
// and a live answer survive moving between pages. The panel is the package's built library (lib/), with React
// taken from the site. Options: apiBase (the chat server's URL; "" when it serves the site too) and title.
// Citation links navigate through the site's router; colours follow the site's mode and primary colour.
const path = require("node:path");

const PLUGIN_NAME = "docusaurus-plugin-textbook-chat";

function textbookChat(context, options) {
  return {
    name: PLUGIN_NAME,
    getThemePath() {
      return path.resolve(__dirname, "theme");
    },
    contentLoaded({ actions }) {
      actions.setGlobalData({ apiBase: options.apiBase, title: options.title ?? null });
    },
    configureWebpack() {
      // Installed from a folder, the package is a symlink whose own node_modules hold a React for its tests:
      // every import of React must land on the site's copy, or hooks break.
      const fromSite = (name) => path.dirname(require.resolve(`${name}/package.json`, { paths: [context.siteDir] }));
      return { resolve: { alias: { react: fromSite("react"), "react-dom": fromSite("react-dom") } } };
    },
  };
}

function validateOptions({ options }) {
  const { apiBase = "", title } = options;
  if (typeof apiBase !== "string") {
    throw new Error(`${PLUGIN_NAME}: apiBase must be a string (the chat server's URL, "" for the same origin)`);
  }
  if (title !== undefined && typeof title !== "string") {
    throw new Error(`${PLUGIN_NAME}: title must be a string`);
  }
  const unknown = Object.keys(options).filter((key) => !["id", "apiBase", "title"].includes(key));
  if (unknown.length > 0) {
    throw new Error(`${PLUGIN_NAME}: unknown option(s) ${unknown.join(", ")}; the options are apiBase and title`);
  }
  return { id: "default", ...options, apiBase: apiBase.replace(/\/+$/, "") }; // Docusaurus keys plugin data by id
}

module.exports = textbookChat;
module.exports.default = textbookChat;
module.exports.validateOptions = validateOptions;
