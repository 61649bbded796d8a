// A Docusaurus 3 plugin: the Textbook Chat panel on every page, in one line of docusaurus.config:
//
//   plugins: [[require.resolve("./textbook-chat/docusaurus"), { apiBase: "https://chat.example.org" }]],
//
// It provides the theme's Root (mounted once, kept across client-side navigation, so the panel and a live
// answer survive moving between pages) and compiles the panel's TypeScript sources with the site's own
// bundler, so nothing is copied into the site. Options: apiBase (the chat server; "" when it serves the
// site), title. Citation links navigate inside the single-page app (the site's router), not by reloading.
const path = require("node:path");

const SOURCES = path.resolve(__dirname, "..", "src");

module.exports = function textbookChat(context, options = {}) {
  return {
    name: "docusaurus-plugin-textbook-chat",
    getThemePath() {
      return path.resolve(__dirname, "theme");
    },
    contentLoaded({ actions }) {
      actions.setGlobalData({ apiBase: String(options.apiBase ?? ""), title: options.title ?? null });
    },
    configureWebpack() {
      // The panel's sources live outside the site: the site's loaders compile them, the theme's Root imports
      // them by this alias, and React resolves to the site's own copy (two Reacts break hooks).
      const fromSite = (name) => path.dirname(require.resolve(`${name}/package.json`, { paths: [context.siteDir] }));
      return { resolve: { alias: { "@textbook-chat": SOURCES, react: fromSite("react"), "react-dom": fromSite("react-dom") } } };
    },
  };
};

module.exports.validateOptions = ({ options }) => {
  if (options.apiBase !== undefined && typeof options.apiBase !== "string") {
    throw new Error("docusaurus-plugin-textbook-chat: apiBase must be a string (the chat server's URL)");
  }
  return { id: "default", ...options }; // Docusaurus namespaces a plugin's data by its id
};
