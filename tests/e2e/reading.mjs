// Reading an answer: Ctrl+I opens the panel from the page; a finished answer says how well the book supports
// it; its code is highlighted and copies with one click; the whole answer copies with its sources; on a touch
// screen (no hover) a source's excerpt opens in place with "Preview".
import { BASE, ask, check, finished, launch, scenario, shot } from "./lib.mjs";

const QUESTION = "What does the Zero Moment Point tell a walking humanoid?";

await scenario(async ({ page, context }) => {
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: BASE });
  await page.goto(BASE + "/");
  await page.getByRole("button", { name: /Ask the textbook/ }).waitFor(); // the panel is mounted
  await page.keyboard.press("Control+I");
  await page.getByRole("dialog", { name: "Ask the textbook" }).waitFor();
  const focused = await page.evaluate(() => document.activeElement?.getAttribute("aria-label"));
  check(focused === "Your question", `Ctrl+I opens the panel with the question field focused (${focused})`);

  const answer = await finished(await ask(page, QUESTION));
  const cue = answer.locator(".tc-confidence");
  const level = await cue.getAttribute("data-level");
  const cueText = await cue.innerText();
  check(["high", "medium", "low"].includes(level) && /supported by the book/.test(cueText), `a confidence cue: ${level} "${cueText}"`);

  const code = answer.locator(".tc-code");
  check((await code.locator(".token.keyword").count()) > 0, "the Python code block is highlighted");
  await answer.getByRole("button", { name: "Copy code" }).click();
  const copiedCode = await page.evaluate(() => navigator.clipboard.readText());
  check(copiedCode === "def zmp_inside(support, zmp):\n    return support.contains(zmp)", `Copy code copies the code: ${JSON.stringify(copiedCode)}`);
  await answer.getByRole("button", { name: "Copy answer" }).click();
  const copiedAnswer = await page.evaluate(() => navigator.clipboard.readText());
  const firstSource = await answer.locator('section[aria-label="Sources"] a').first().getAttribute("href");
  check(copiedAnswer.includes("Sources:\n[1] ") && copiedAnswer.includes(firstSource), "Copy answer copies the text and its sources");
  await shot(page, "reading-answer");

  // A phone: touch, no hover.
  const phone = await launch({ touch: true });
  try {
    await phone.page.goto(BASE + "/");
    await phone.page.getByRole("button", { name: /Ask the textbook/ }).tap();
    const onPhone = await finished(await ask(phone.page, QUESTION));
    const toggle = onPhone.getByRole("button", { name: "Preview" }).first();
    await toggle.tap();
    const excerpt = onPhone.locator(".tc-previewing .tc-excerpt");
    check(await excerpt.isVisible(), "Preview opens the source's excerpt in place on a touch screen");
    check((await toggle.getAttribute("aria-expanded")) === "true", "the toggle says it is open");
    await shot(phone.page, "reading-touch-preview");
    check(phone.errors.length === 0, `no errors on the phone: ${phone.errors.join(" | ")}`);
  } finally {
    await phone.browser.close();
  }
  return { level, copiedAnswer };
});
