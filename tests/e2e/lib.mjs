// Shared helpers for the browser tests: launch Debian's chromium through playwright-core (resolved from
// frontend/node_modules), drive the panel, take screenshots, and report results as one JSON line.
import { createRequire } from "node:module";
import { mkdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const require = createRequire(path.join(root, "frontend", "package.json"));
const { chromium } = require("playwright-core");

export const BASE = process.env.E2E_BASE_URL;
export const OUT = process.env.E2E_OUTPUT_DIR ?? path.join(root, "test-output", "e2e");
const TIMEOUT = 20_000;

/** A browser with one page; `touch` makes it a 390 px phone (touch events, no hover, mobile viewport). */
export async function launch({ colorScheme = "light", touch = false } = {}) {
  mkdirSync(OUT, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  });
  const device = touch
    ? { viewport: { width: 390, height: 844 }, hasTouch: true, isMobile: true }
    : { viewport: { width: 1280, height: 860 } };
  const context = await browser.newContext({ ...device, colorScheme });
  context.setDefaultTimeout(TIMEOUT);
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  page.on("response", (response) => {
    if (response.status() >= 400) errors.push(`HTTP ${response.status()} ${response.url()}`);
  });
  page.on("console", (message) => {
    // Failed fetches are reported (with their URL) by the response handler above.
    if (message.type() === "error" && !message.text().startsWith("Failed to load resource")) errors.push(message.text());
  });
  return { browser, context, page, errors };
}

export async function openPanel(page) {
  const launcher = page.getByRole("button", { name: /Ask the textbook/ });
  await launcher.click();
  await page.getByRole("dialog", { name: "Ask the textbook" }).waitFor();
}

/** Type a question and send it; returns the locator of the answer it produced. */
export async function ask(page, question) {
  const before = await page.locator("article.tc-answer").count();
  await page.getByRole("textbox", { name: "Your question" }).fill(question);
  await page.keyboard.press("Enter");
  const answer = page.locator("article.tc-answer").nth(before);
  await answer.waitFor();
  return answer;
}

export async function finished(answer) {
  await answer.locator("xpath=self::*[@aria-busy='false']").waitFor({ timeout: TIMEOUT });
  return answer;
}

/** Once a streaming answer overflows the log by `overflow` px, scroll the log to its top, let `waitMs` of tokens
 * arrive, and return where the log is then (0 when the panel kept the reader's place). */
export async function scrollUpWhileStreaming(page, { overflow, waitMs }) {
  const log = page.locator(".tc-log");
  await page.waitForFunction((extra) => {
    const el = document.querySelector(".tc-log");
    return el && el.scrollHeight > el.clientHeight + extra;
  }, overflow);
  await log.evaluate((el) => el.scrollTo({ top: 0 }));
  await page.waitForTimeout(waitMs);
  return log.evaluate((el) => el.scrollTop);
}

/** Ask `word` (one long word): whether its bubble and the log both hold it without sideways overflow. */
export async function longWordFits(page, word) {
  await ask(page, word);
  const fits = (el) => el.scrollWidth <= el.clientWidth + 1;
  const bubble = await page.locator(".tc-question").last().evaluate(fits);
  const log = await page.locator(".tc-log").evaluate(fits);
  return bubble && log;
}

/** Ask `question`, reload the page once part of the answer is in, reopen the panel and wait for that answer
 * (found in history) to finish; returns its locator. */
export async function reloadMidAnswer(page, question) {
  const answer = await ask(page, question);
  const index = (await page.locator("article.tc-answer").count()) - 1;
  await answer.locator(".tc-markdown").waitFor();
  await page.waitForTimeout(400); // part of the answer is in
  await page.reload();
  await openPanel(page);
  const resumed = page.locator("article.tc-answer").nth(index);
  await resumed.waitFor();
  return finished(resumed);
}

export async function shot(page, name) {
  const file = path.join(OUT, `${name}.png`);
  await page.screenshot({ path: file });
  return file;
}

export function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

/** Run a scenario: print its result as the last JSON line; exit 1 with the error otherwise. */
export async function scenario(body, { expectHttpErrors = false } = {}) {
  const session = await launch();
  try {
    const result = await body(session);
    // Scenarios that provoke failed requests (429, a 503 from a dependency that is down) say so.
    const errors = session.errors.filter((e) => !(expectHttpErrors && /^HTTP [45]\d\d /.test(e)));
    check(errors.length === 0, `no errors in the page console: ${errors.join(" | ")}`);
    console.log(JSON.stringify({ ok: true, ...result }));
  } catch (error) {
    await shot(session.page, `failure-${path.basename(process.argv[1], ".mjs")}`).catch(() => {});
    console.error(error.stack ?? String(error));
    process.exitCode = 1;
  } finally {
    await session.browser.close();
  }
}
