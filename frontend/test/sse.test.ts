import { describe, expect, it } from "vitest";
import { readEventStream, SseParser, type SseEvent } from "../src/sse";

function feedAll(chunks: string[]): SseEvent[] {
  const parser = new SseParser();
  return chunks.flatMap((chunk) => parser.feed(chunk));
}

describe("SseParser", () => {
  it("parses a complete event with type, id and data", () => {
    expect(feedAll(['event: token\nid: 3\ndata: {"text":"hi"}\n\n'])).toEqual([
      { event: "token", id: "3", data: '{"text":"hi"}' },
    ]);
  });

  it("gives the same events however the bytes are split, even one character at a time", () => {
    const stream = 'event: meta\nid: 1\ndata: {"a":1}\n\n: ping\n\nevent: token\nid: 2\ndata: {"text":"x"}\n\n';
    const whole = feedAll([stream]);
    expect(feedAll(stream.split(""))).toEqual(whole);
    expect(feedAll([stream.slice(0, 17), stream.slice(17, 40), stream.slice(40)])).toEqual(whole);
    expect(whole).toHaveLength(2);
  });

  it("joins multi-line data with newlines", () => {
    expect(feedAll(["data: first\ndata: second\ndata:\n\n"])).toEqual([
      { event: "message", id: "", data: "first\nsecond\n" },
    ]);
  });

  it("ignores comments, including the server's keep-alive pings", () => {
    expect(feedAll([": ping\n\n: another comment\ndata: x\n\n"])).toEqual([{ event: "message", id: "", data: "x" }]);
  });

  it("accepts CRLF and lone CR line endings, also when a CRLF is split across chunks", () => {
    const events = feedAll(["event: token\r", "\nid: 7\r\ndata: a\r\r", "data: b\r\n\r\n"]);
    expect(events).toEqual([
      { event: "token", id: "7", data: "a" },
      { event: "message", id: "7", data: "b" },
    ]);
  });

  it("keeps the last id for later events, as EventSource does, and exposes it for Last-Event-ID", () => {
    const parser = new SseParser();
    const events = parser.feed("id: 5\ndata: a\n\ndata: b\n\n");
    expect(events.map((e) => e.id)).toEqual(["5", "5"]);
    expect(parser.lastEventId).toBe("5");
  });

  it("strips exactly one space after the colon and keeps the rest", () => {
    expect(feedAll(["data:  two spaces\n\n"])[0].data).toBe(" two spaces");
    expect(feedAll(["data:none\n\n"])[0].data).toBe("none");
  });

  it("does not dispatch an event without data, and resets the type after each event", () => {
    expect(feedAll(["event: token\n\ndata: x\n\n"])).toEqual([{ event: "message", id: "", data: "x" }]);
  });

  it("reads retry as the reconnection delay and ignores bad values and unknown fields", () => {
    const parser = new SseParser();
    parser.feed("retry: 1500\nfoo: bar\nretry: soon\ndata: x\n\n");
    expect(parser.retryMs).toBe(1500);
  });

  it("drops an event cut off before its blank line when the stream ends", () => {
    const parser = new SseParser();
    expect(parser.feed("data: partial")).toEqual([]);
    parser.end();
    expect(parser.feed("\n\n")).toEqual([]);
  });

  it("ignores an id containing NUL", () => {
    const parser = new SseParser();
    parser.feed("id: 4\n\nid: 9\0\ndata: x\n\n");
    expect(parser.lastEventId).toBe("4");
  });
});

describe("readEventStream", () => {
  it("decodes UTF-8 split inside a character across network chunks", async () => {
    const bytes = new TextEncoder().encode('event: token\nid: 1\ndata: {"text":"Gazebo – ü"}\n\n');
    const cut = bytes.indexOf(0xc3) + 1; // in the middle of "ü"
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(bytes.slice(0, cut));
        controller.enqueue(bytes.slice(cut));
        controller.close();
      },
    });
    const events: SseEvent[] = [];
    await readEventStream(body, (e) => events.push(e));
    expect(JSON.parse(events[0].data)).toEqual({ text: "Gazebo – ü" });
  });

  it("reads a long line sent in small chunks in time linear in its length (issue 34)", () => {
    const parser = new SseParser();
    const line = "data: " + "x".repeat(1 << 20) + "\n\n";
    const start = performance.now();
    const events: SseEvent[] = [];
    for (let i = 0; i < line.length; i += 64) events.push(...parser.feed(line.slice(i, i + 64)));
    expect(performance.now() - start).toBeLessThan(1_000); // scanning the line again per chunk: minutes
    expect(events.map((e) => e.data.length)).toEqual([1 << 20]);
  });
});
