// The module menu comes from /api/modules; a question asked within a module carries it, and the scope
// notice is shown plainly. An off-topic question is declined with suggested sections.
import { BASE, ask, check, finished, openPanel, scenario, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  const requests = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/api/chat")) requests.push(JSON.parse(r.postData() ?? "{}"));
  });
  await page.goto(BASE + "/docs/intro");
  await openPanel(page);
  const menu = page.getByRole("combobox", { name: "Module to search" });
  await menu.locator("option").nth(3).waitFor({ state: "attached" });
  const options = await menu.locator("option").allInnerTexts();
  check(options[0] === "The whole book" && options.some((o) => o.startsWith("Module 2")), `menu: ${options}`);
  await menu.selectOption({ label: "Module 2: ROS 2 for Humanoids" });
  // A question about another module: the server widens (or keeps) the scope and says so.
  const widened = await finished(await ask(page, "What does the Zero Moment Point tell a walking humanoid?"));
  const notices = await widened.locator(".tc-notice").evaluateAll((els) => els.map((e) => e.dataset.code));
  await shot(page, "10-module-scope");

  await menu.selectOption({ label: "The whole book" });
  const declined = await finished(await ask(page, "What is the best recipe for sourdough bread with a crispy crust?"));
  check((await declined.getAttribute("data-finish")) === "declined", "the off-topic question is declined");
  await declined.getByText("Sections that may help").waitFor();
  await shot(page, "11-declined");
  return { requests, notices };
});
