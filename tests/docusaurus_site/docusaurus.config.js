// A small Docusaurus 3 site made of the demo book, with the chat panel installed as a site owner would:
// `npm install` of the tarball `npm pack` makes in frontend/, then the one plugin line below.
// tests/e2e/test_e2e.py builds it with the chat server's URL and serves it beside the server.
const path = require("node:path");

/** @type {import('@docusaurus/types').Config} */
module.exports = {
  title: "Physical AI & Humanoid Robotics",
  url: process.env.SITE_URL ?? "http://127.0.0.1:3000",
  baseUrl: "/",
  onBrokenLinks: "throw",
  presets: [
    [
      "classic",
      {
        docs: { path: path.resolve(__dirname, "../../examples/textbook/docs"), routeBasePath: "docs" },
        blog: false,
      },
    ],
  ],
  plugins: [["textbook-chat-panel/docusaurus", { apiBase: process.env.CHAT_API_BASE ?? "" }]],
  themeConfig: {
    navbar: {
      title: "Physical AI & Humanoid Robotics",
      items: [{ to: "/docs/intro", label: "Book", position: "left" }],
    },
  },
};
