// Reload mid-answer (history on): the panel finds the answer still being written in history and follows its
// stream to the end, instead of showing an empty answer marked "Stopped.".
import { BASE, check, openPanel, reloadMidAnswer, scenario, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  await page.goto(BASE + "/");
  await openPanel(page);
  const answer = await reloadMidAnswer(page, "What does the Zero Moment Point tell a walking humanoid?");
  const text = await answer.locator(".tc-markdown").innerText();
  check((await answer.getAttribute("data-finish")) === "stop", `the answer finished ("${await answer.getAttribute("data-finish")}")`);
  check((await answer.getByText("Stopped.").count()) === 0, "the answer is not marked Stopped.");
  await shot(page, "13-resumed-after-reload");
  return { length: text.length, text };
});
