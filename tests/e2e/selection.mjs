// Select text on a book page: "Ask about this" opens the panel in selection mode with the quote visible,
// and the question goes out with the selected text.
import { BASE, ask, check, finished, scenario, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  const requests = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/api/chat")) requests.push(JSON.parse(r.postData() ?? "{}"));
  });
  await page.goto(BASE + "/docs/foundations/kinematics-and-balance");
  const paragraph = page.locator("article.markdown p", { hasText: "Zero Moment Point" }).first();
  await paragraph.selectText();
  const button = page.getByRole("button", { name: "Ask about this" });
  await button.waitFor();
  await shot(page, "08-ask-about-selection");
  await button.click();
  const quote = page.locator(".tc-selection blockquote");
  await quote.waitFor();
  const quoted = await quote.innerText();
  check(quoted.includes("Zero Moment Point"), `the quote is visible: ${quoted.slice(0, 60)}`);
  const answer = await ask(page, "Explain this in simpler words.");
  await finished(answer);
  await page.locator(".tc-question blockquote.tc-quote").waitFor();
  await shot(page, "09-selection-answer");
  return { requests, quoted };
});
