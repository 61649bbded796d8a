// The package's library build (what `npm pack` ships and a Docusaurus site imports): src/index.ts as one
// ES module in lib/, with React and the highlighter left to the host site: a second React breaks hooks, and
// a Docusaurus site already has prism-react-renderer. Types come from tsconfig.lib.json; the demo page has
// its own build (vite.config.ts).
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

export default defineConfig({
  plugins: [react()],
  build: {
    outDir: "lib",
    emptyOutDir: true,
    lib: { entry: "src/index.ts", formats: ["es"], fileName: "index" },
    rolldownOptions: { external: [/^react($|\/)/, /^react-dom($|\/)/, /^prism-react-renderer($|\/)/] },
  },
});
