// The demo-page bundle: one entry (src/main.tsx), hashed files under dist/assets, and a manifest that
// server/textbook_chat/web/webapp.py reads to write the <script> and <link> tags.
import react from "@vitejs/plugin-react";
import { defineConfig } from "vitest/config";

export default defineConfig({
  plugins: [react()],
  base: "/assets/",
  build: {
    outDir: "dist",
    assetsDir: "",
    manifest: "manifest.json",
    emptyOutDir: true,
    rolldownOptions: { input: "src/main.tsx" },
  },
  test: {
    include: ["test/**/*.test.{ts,tsx}"],
    environment: "node",
  },
});
