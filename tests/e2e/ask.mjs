// Ask a question on the demo page: the answer streams in, citations link to the cited section's anchor,
// sources show module › chapter › heading with an excerpt on hover, feedback sticks, history survives a reload.
import { BASE, ask, check, finished, openPanel, scenario, shot } from "./lib.mjs";

const QUESTION = "What does the Zero Moment Point tell a walking humanoid?";

await scenario(async ({ page }) => {
  const requests = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/api/chat")) requests.push(JSON.parse(r.postData() ?? "{}"));
  });
  await page.goto(BASE + "/");
  check((await page.title()).includes("Physical AI"), "the demo page shows the book");
  await openPanel(page);
  await page.locator(".tc-scope select option").nth(1).waitFor({ state: "attached" });
  await shot(page, "01-panel-open");

  const answer = await ask(page, QUESTION);
  // Tokens arrive one by one (the fake model is paced): the text grows while the answer is busy.
  const markdown = answer.locator(".tc-markdown");
  await markdown.waitFor();
  const early = (await markdown.innerText()).length;
  await page.waitForTimeout(400);
  const busy = await answer.getAttribute("aria-busy");
  const later = (await markdown.innerText()).length;
  await shot(page, "02-streaming");
  check(busy === "true" && later > early, `text grows while streaming (${early} -> ${later}, busy=${busy})`);
  await finished(answer);
  await shot(page, "03-answer");

  const cite = answer.locator("a.tc-cite").first();
  const href = await cite.getAttribute("href");
  check(href.startsWith(BASE + "/docs/") && href.includes("#"), `citation links to a section: ${href}`);
  const source = answer.locator(".tc-sources li").first();
  const label = await source.locator("a").innerText();
  check(label.split(" › ").length >= 2 && label.startsWith("Module"), `source label is module › chapter: ${label}`);
  await source.hover();
  const excerpt = source.locator(".tc-excerpt");
  check(await excerpt.isVisible(), "the excerpt shows on hover");
  await shot(page, "04-source-excerpt");
  // The answer cites [1] and [2]: those are its sources; any other result is listed apart as related.
  const cited = await answer.locator('section[aria-label="Sources"] li').evaluateAll((items) => items.map((li) => li.value));
  const related = await answer.locator('section[aria-label="Related sections"] li').count();
  check(JSON.stringify(cited) === "[1,2]", `the sources are the cited ones: ${JSON.stringify(cited)}`);

  await answer.getByRole("button", { name: "Helpful", exact: true }).click();
  check((await answer.getByRole("button", { name: "Helpful", exact: true }).getAttribute("aria-pressed")) === "true", "thumbs up is pressed");
  // Changing to thumbs-down asks what was wrong; the comment is stored with the rating.
  await answer.getByRole("button", { name: "Not helpful", exact: true }).click();
  await answer.getByLabel(/What was wrong or missing/).fill("It never says how the support polygon is measured.");
  await answer.getByRole("button", { name: "Send", exact: true }).click();
  await page.getByText(/the book's authors will see this/).waitFor();

  // Following the citation lands on the cited heading of the book page.
  await cite.click();
  await page.waitForURL((url) => url.href === href);
  const target = await page.evaluate(() => {
    const el = document.querySelector(":target");
    return el ? { id: el.id, tag: el.tagName, top: Math.round(el.getBoundingClientRect().top) } : null;
  });
  check(target && href.endsWith("#" + target.id), `the page has the anchor as :target (${JSON.stringify(target)})`);
  check(target.top >= 0 && target.top < 400, `the cited heading is scrolled into view (top=${target.top})`);
  await shot(page, "05-citation-target");

  // After the navigation (a full page load), the conversation comes back from the server.
  await page.reload();
  await openPanel(page);
  await page.locator(".tc-question", { hasText: QUESTION }).waitFor();
  const restored = page.locator("article.tc-answer").first();
  check((await restored.locator("a.tc-cite").count()) > 0, "restored answer keeps its citation links");
  check((await restored.getByRole("button", { name: "Not helpful", exact: true }).getAttribute("aria-pressed")) === "true", "restored feedback (the last rating: thumbs down)");
  await shot(page, "06-history-after-reload");

  // Dark theme follows the page's switch.
  await page.locator("#theme-toggle").click();
  const panelBg = await page.locator(".tc-panel").evaluate((el) => getComputedStyle(el).backgroundColor);
  check(panelBg === "rgb(30, 31, 36)", `dark panel background: ${panelBg}`);
  await shot(page, "07-dark-theme");

  // Delete this chat: gone now and after a reload.
  await page.getByRole("button", { name: "Delete this chat" }).click();
  await page.getByRole("button", { name: "Keep" }).click(); // the first click only asks
  check((await page.locator(".tc-question").count()) > 0, "keeping the conversation keeps it");
  await page.getByRole("button", { name: "Delete this chat" }).click();
  await page.getByRole("button", { name: "Delete for good" }).click();
  await page.getByText("This conversation was deleted.").waitFor();
  await page.reload();
  await openPanel(page);
  await page.waitForTimeout(500);
  check((await page.locator(".tc-question").count()) === 0, "a deleted chat does not come back");
  return { requests, href, label, cited, related };
});
