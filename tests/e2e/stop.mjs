// Stop a long generation: the Stop button cancels it, the text stops growing and the answer says so.
import { BASE, ask, check, openPanel, scenario, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  await page.goto(BASE + "/");
  await openPanel(page);
  const answer = await ask(page, "What does the Zero Moment Point tell a walking humanoid?");
  await answer.locator(".tc-markdown").waitFor();
  await page.waitForTimeout(300);
  await page.getByRole("button", { name: "Stop" }).click();
  await answer.getByText("Stopped.").waitFor();
  const stoppedAt = (await answer.locator(".tc-markdown").innerText()).length;
  await page.waitForTimeout(1000);
  const after = (await answer.locator(".tc-markdown").innerText()).length;
  check(after === stoppedAt, `no text after stopping (${stoppedAt} -> ${after})`);
  check((await answer.getAttribute("data-finish")) === "cancelled", "finish reason is cancelled");
  await page.getByRole("button", { name: "Send" }).waitFor();
  await shot(page, "12-stopped");
  return { length: after, messageId: await answer.getAttribute("data-message-id") };
});
