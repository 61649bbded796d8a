// A second question in the same conversation that refers back ("how do I connect it to ROS 2?" after "What is
// Gazebo?") is sent in the same session and cites the section about the thing it refers to.
import { BASE, ask, check, finished, openPanel, scenario, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  const requests = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/api/chat")) requests.push(JSON.parse(r.postData() ?? "{}"));
  });
  await page.goto(BASE + "/");
  await openPanel(page);
  await finished(await ask(page, "What is Gazebo?"));
  const second = await finished(await ask(page, "How do I connect it to ROS 2?"));
  await shot(page, "12-follow-up");
  const labels = await second.locator('section[aria-label="Sources"] li a').allInnerTexts();
  check(labels.length > 0 && labels[0].includes("Connecting Gazebo to ROS 2"), `the follow-up cites Gazebo's section first: ${labels}`);
  return { requests, labels };
});
