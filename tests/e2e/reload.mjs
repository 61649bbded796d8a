// Reload mid-answer (history on): the panel finds the answer still being written in history and follows its
// stream to the end, instead of showing an empty answer marked "Stopped.".
import { BASE, ask, check, finished, openPanel, scenario, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  await page.goto(BASE + "/");
  await openPanel(page);
  const first = await ask(page, "What does the Zero Moment Point tell a walking humanoid?");
  await first.locator(".tc-markdown").waitFor();
  await page.waitForTimeout(400); // part of the answer is in
  await page.reload();
  await openPanel(page);
  const answer = page.locator("article.tc-answer").first();
  await answer.waitFor();
  await finished(answer);
  const text = await answer.locator(".tc-markdown").innerText();
  check((await answer.getAttribute("data-finish")) === "stop", `the answer finished ("${await answer.getAttribute("data-finish")}")`);
  check((await answer.getByText("Stopped.").count()) === 0, "the answer is not marked Stopped.");
  await shot(page, "13-resumed-after-reload");
  return { length: text.length, text };
});
