// The reader's scroll position is theirs: scrolled up while an answer streams, the log stays put and offers
// "Jump to latest"; at the bottom it follows. A 300-character word wraps inside the bubble and the panel.
import { BASE, ask, check, finished, longWordFits, openPanel, scenario, scrollUpWhileStreaming, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  await page.goto(BASE + "/");
  await openPanel(page);
  const log = page.locator(".tc-log");
  const answer = await ask(page, "What does the Zero Moment Point tell a walking humanoid?");
  await answer.locator(".tc-markdown").waitFor();
  const kept = await scrollUpWhileStreaming(page, { overflow: 200, waitMs: 800 });
  check(kept < 5, `scrolled up, the log stays where the reader put it (scrollTop ${kept})`);
  const jump = page.getByRole("button", { name: /Jump to latest/ });
  await jump.waitFor();
  await shot(page, "scroll-kept");
  await jump.click();
  const gap = await log.evaluate((el) => el.scrollHeight - el.clientHeight - el.scrollTop);
  check(gap < 30, `"Jump to latest" goes to the bottom (${gap} px left)`);
  await finished(answer);

  check(await longWordFits(page, "x".repeat(300)), "a 300-character word wraps inside its bubble and the log");
  const inputSize = await page.getByRole("textbox", { name: "Your question" }).evaluate((el) => getComputedStyle(el).fontSize);
  check(inputSize === "16px", `the question field is 16 px, so iOS does not zoom (${inputSize})`);
  await shot(page, "scroll-long-word");
  return { kept, gap };
});
