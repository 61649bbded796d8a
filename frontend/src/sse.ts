/**
 * A streaming parser for `text/event-stream` (the WHATWG "event stream interpretation"), fed by fetch.
 * It owns framing only: what the events mean is `protocol.ts`'s and the reducer's business.
 */

export interface SseEvent {
  /** `message` when the stream names no type. */
  event: string;
  data: string;
  /** The last event id seen so far (ids persist across events, as in EventSource). */
  id: string;
}

export class SseParser {
  /** The pieces of a line not yet ended: joined once, when its end arrives (a long line costs linear time). */
  private partial: string[] = [];
  private dataLines: string[] = [];
  private eventType = "";
  private lastId = "";
  private pendingCR = false;
  /** Reconnection delay the server asked for with `retry:`, in milliseconds. */
  retryMs: number | null = null;

  get lastEventId(): string {
    return this.lastId;
  }

  /** Feed decoded text (any split, even mid-line or between CR and LF); returns the events it completed. */
  feed(chunk: string): SseEvent[] {
    let text = chunk;
    if (this.pendingCR) {
      this.pendingCR = false;
      if (text.startsWith("\n")) text = text.slice(1); // the LF of a CRLF split across chunks
    }
    const events: SseEvent[] = [];
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const ch = text[i];
      if (ch !== "\n" && ch !== "\r") continue;
      const piece = text.slice(start, i);
      const line = this.partial.length ? this.partial.join("") + piece : piece;
      this.partial = [];
      if (ch === "\r") {
        if (i + 1 === text.length) this.pendingCR = true;
        else if (text[i + 1] === "\n") i++;
      }
      start = i + 1;
      const event = this.line(line);
      if (event) events.push(event);
    }
    if (start < text.length) this.partial.push(text.slice(start));
    return events;
  }

  /** The stream ended: an event without its closing blank line is dropped, as the spec says. */
  end(): void {
    this.partial = [];
    this.dataLines = [];
    this.eventType = "";
    this.pendingCR = false;
  }

  private line(line: string): SseEvent | null {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null; // a comment, e.g. the server's `: ping`
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.dataLines.push(value);
        break;
      case "event":
        this.eventType = value;
        break;
      case "id":
        if (!value.includes("\0")) this.lastId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retryMs = Number(value);
        break;
      default: // unknown fields are ignored
    }
    return null;
  }

  private dispatch(): SseEvent | null {
    const type = this.eventType || "message";
    this.eventType = "";
    if (this.dataLines.length === 0) return null;
    const data = this.dataLines.join("\n");
    this.dataLines = [];
    return { event: type, data, id: this.lastId };
  }
}

/** Read a fetch body as SSE, calling `onEvent` for each event until the body ends or `signal` aborts. */
export async function readEventStream(
  body: ReadableStream<Uint8Array>,
  onEvent: (event: SseEvent) => void,
  parser: SseParser = new SseParser(),
): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      for (const event of parser.feed(decoder.decode(value, { stream: true }))) onEvent(event);
    }
    for (const event of parser.feed(decoder.decode())) onEvent(event);
  } finally {
    parser.end();
    reader.releaseLock();
  }
}
