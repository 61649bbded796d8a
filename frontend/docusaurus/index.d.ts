/** The Docusaurus 3 plugin that puts the Textbook Chat panel on every page of a site. */
import type { LoadContext, OptionValidationContext, Plugin } from "@docusaurus/types";

declare function textbookChat(context: LoadContext, options: textbookChat.Options): Plugin<void>;

declare namespace textbookChat {
  /** `plugins: [["textbook-chat-panel/docusaurus", { apiBase: "https://chat.example.org" }]]` */
  interface Options {
    /** The chat server's URL, e.g. "https://chat.example.org"; "" (the default) when it serves the site too. */
    apiBase?: string;
    /** The panel's title; the panel's own default when omitted. */
    title?: string;
  }
  function validateOptions(context: OptionValidationContext<Options, Options>): Options & { id: string };
}

export = textbookChat;
