// The browser's own EventSource reads an answer while the connection is cut under it (the test's TCP proxy
// aborts the stream mid-answer): it reconnects with Last-Event-ID, resumes, and stops at the 204 after done.
// The page is served by Playwright at the server's origin, so it talks to the server as a same-origin client.
import { BASE, check, scenario, shot } from "./lib.mjs";

const QUESTION = "What does the Zero Moment Point tell a walking humanoid?";
const PAGE = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>EventSource reader</title></head>
<body><main><h1>EventSource reader</h1><p id="status">idle</p><pre id="answer"></pre></main></body></html>`;

await scenario(async ({ page }) => {
  await page.route(BASE + "/eventsource-reader", (route) =>
    route.fulfill({ status: 200, contentType: "text/html", body: PAGE }),
  );
  await page.goto(BASE + "/eventsource-reader");
  const result = await page.evaluate(async (question) => {
    const created = await fetch("/api/chat/messages", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ question }),
    });
    if (created.status !== 202) throw new Error(`POST /api/chat/messages: ${created.status}`);
    const { message_id: messageId, stream_url: streamUrl } = await created.json();
    const status = document.getElementById("status");
    const answer = document.getElementById("answer");
    return await new Promise((resolve, reject) => {
      const events = [];
      let opens = 0;
      let errors = 0;
      const source = new EventSource(streamUrl);
      const timer = setTimeout(() => {
        source.close();
        reject(new Error(`no end after 45 s: ${JSON.stringify(events.map((e) => e.type))}`));
      }, 45_000);
      source.onopen = () => {
        opens += 1;
        status.textContent = "open";
      };
      source.onerror = () => {
        errors += 1;
        // CONNECTING: the browser reconnects by itself. CLOSED: it was told to stop (the 204 after done).
        status.textContent = source.readyState === EventSource.CLOSED ? "closed" : "reconnecting";
        if (source.readyState === EventSource.CLOSED) {
          clearTimeout(timer);
          resolve({ messageId, events, opens, errors, text: answer.textContent });
        }
      };
      for (const type of ["meta", "sources", "notice", "token", "done", "error"]) {
        source.addEventListener(type, (event) => {
          if (!(event instanceof MessageEvent)) return; // the browser's own "error" (connection lost)
          const data = JSON.parse(event.data);
          events.push({ type, id: event.lastEventId, data: type === "token" ? data : null });
          if (type === "token") answer.textContent += data.text;
        });
      }
    });
  }, QUESTION);
  await shot(page, "20-eventsource-resumed");
  const ids = result.events.map((e) => Number(e.id));
  check(
    ids.every((id, i) => id === i + 1),
    `every event once, in order: ${ids.join(",")}`,
  );
  check(result.events.at(-1).type === "done", "the stream ends with done");
  check((await page.locator("#status").innerText()) === "closed", "the browser stopped reconnecting");
  return {
    messageId: result.messageId,
    text: result.text,
    ids,
    types: result.events.map((e) => e.type),
    opens: result.opens,
    errors: result.errors,
  };
});
