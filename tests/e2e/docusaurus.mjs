// The panel on a real Docusaurus 3 site (tests/docusaurus_site, the plugin installed from the package's
// tarball): ask; scroll up mid-stream and stay there; follow a citation mid-stream without a page load while
// the answer goes on; reload mid-answer and see it resume and complete; a 300-character word; a 390 px phone
// (nothing past the edge, the launcher clear of the mobile menu); the launcher clear of back-to-top.
import { BASE, ask, check, finished, longWordFits, openPanel, reloadMidAnswer, scenario, scrollUpWhileStreaming, shot } from "./lib.mjs";

const QUESTION = "What does the Zero Moment Point tell a walking humanoid?";
const LAST_WORD = process.env.E2E_LAST_WORD ?? "word149";

function overlap(a, b) {
  return a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
}

await scenario(async ({ page }) => {
  await page.goto(BASE + "/docs/intro");
  await page.evaluate(() => (window.__sameDocument = true)); // gone if a click reloads the page

  // Scrolling back up a long page, Docusaurus shows its back-to-top button in the bottom-right corner: the
  // launcher stands above it.
  await page.evaluate(() => window.scrollTo(0, document.body.scrollHeight));
  await page.waitForTimeout(100);
  await page.mouse.move(640, 400);
  await page.mouse.wheel(0, -200);
  const backToTop = page.locator(".theme-back-to-top-button");
  await page.waitForFunction(() => {
    const box = document.querySelector(".theme-back-to-top-button")?.getBoundingClientRect();
    return box && box.width > 20;
  });
  await page.waitForTimeout(300); // its scale-in transition
  const colours = await page.evaluate(() => {
    const probe = document.createElement("span");
    probe.style.color = getComputedStyle(document.documentElement).getPropertyValue("--ifm-color-primary");
    document.body.append(probe);
    const primary = getComputedStyle(probe).color;
    probe.remove();
    return { primary, launcher: getComputedStyle(document.querySelector(".tc-launcher")).backgroundColor };
  });
  check(colours.launcher === colours.primary, `the launcher wears the site's primary colour: ${JSON.stringify(colours)}`);
  const launcherBox = await page.locator(".tc-launcher").boundingBox();
  const backToTopBox = await backToTop.boundingBox();
  check(!overlap(launcherBox, backToTopBox), `the launcher ${JSON.stringify(launcherBox)} clears back-to-top ${JSON.stringify(backToTopBox)}`);
  await shot(page, "docusaurus-01-launcher");

  // Ask; scroll up while it streams: the log stays where the reader put it.
  await openPanel(page);
  const answer = await ask(page, QUESTION);
  await answer.locator(".tc-markdown").waitFor();
  const kept = await scrollUpWhileStreaming(page, { overflow: 100, waitMs: 600 });
  check(kept < 5, `scrolled up mid-stream, the log stays put (scrollTop ${kept})`);
  await shot(page, "docusaurus-02-scrolled-up");

  // A citation mid-stream navigates inside the single-page app: no page load, the panel open, the answer goes on.
  check((await answer.getAttribute("aria-busy")) === "true", "the answer is still streaming when its citation is clicked");
  const cite = answer.locator("a.tc-cite").first();
  const href = await cite.getAttribute("href");
  check(href.startsWith(BASE + "/docs/") && href.includes("#"), `the citation links to a section of the site: ${href}`);
  const before = page.url();
  await cite.click();
  await page.waitForURL((url) => url.href !== before);
  const landed = page.url();
  check(landed.split("#")[0] === href.split("#")[0], `the citation opened its page (${landed})`);
  check(await page.evaluate(() => window.__sameDocument === true), "no full page load: the same document");
  check(await page.getByRole("dialog", { name: "Ask the textbook" }).isVisible(), "the panel stays open");
  await finished(answer);
  const whole = await answer.locator(".tc-markdown").innerText();
  check(whole.includes(LAST_WORD), "the answer streamed on to its end across the navigation");
  await shot(page, "docusaurus-03-citation-followed");

  // Reload mid-answer: the panel finds the answer in history and follows its stream to the end.
  const resumed = await reloadMidAnswer(page, "How does a humanoid keep its balance?");
  const resumedText = await resumed.locator(".tc-markdown").innerText();
  check((await resumed.getAttribute("data-finish")) === "stop", `the resumed answer finished (${await resumed.getAttribute("data-finish")})`);
  check(resumedText.includes(LAST_WORD), "the resumed answer is complete");
  await shot(page, "docusaurus-04-resumed");

  // A 300-character word wraps inside its bubble and the panel.
  check(await longWordFits(page, "y".repeat(300)), "a 300-character word stays inside its bubble and the log");
  await shot(page, "docusaurus-05-long-word");

  // A 390 px phone: the open panel is the screen, nothing runs past its edge.
  await page.setViewportSize({ width: 390, height: 844 });
  const dialog = page.getByRole("dialog", { name: "Ask the textbook" });
  const box = await dialog.boundingBox();
  check(box.x === 0 && box.width === 390, `the panel fills the phone's width: ${JSON.stringify(box)}`);
  const widest = await page.evaluate(() =>
    Math.max(...[...document.querySelectorAll(".tc-root *")].map((el) => el.getBoundingClientRect().right)),
  );
  check(widest <= 390.5, `nothing in the panel runs past the edge (rightmost ${widest} px)`);
  await shot(page, "docusaurus-06-phone-panel");
  await dialog.getByRole("button", { name: "Close" }).click();
  await page.locator("button.navbar__toggle").click();
  await page.locator(".navbar-sidebar--show").waitFor();
  await page.waitForTimeout(400); // the menu slides in
  check(!(await page.locator(".tc-launcher").isVisible()), "the launcher steps aside while the mobile menu is open");
  await shot(page, "docusaurus-07-phone-menu");
  return { href, landed, kept };
});
