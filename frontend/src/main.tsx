/** The demo page's entry: mount the panel with the settings the server wrote into the page, and the theme switch. */
import { mountChatPanel } from "./index";
import "./panel.css";
import "./demo.css";

const config = document.getElementById("textbook-chat-config");
const settings = config ? (JSON.parse(config.textContent || "{}") as { apiBase?: string; title?: string }) : {};
mountChatPanel({ apiBase: settings.apiBase ?? "", title: settings.title }, document.getElementById("textbook-chat") ?? undefined);

// The panel follows the page's theme (html[data-theme]), as it does on a Docusaurus site.
const toggle = document.getElementById("theme-toggle");
const stored = localStorage.getItem("theme");
const prefersDark = window.matchMedia?.("(prefers-color-scheme: dark)").matches;
document.documentElement.dataset.theme = stored ?? (prefersDark ? "dark" : "light");
toggle?.addEventListener("click", () => {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  document.documentElement.dataset.theme = next;
  localStorage.setItem("theme", next);
});
