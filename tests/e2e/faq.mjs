// Retrieval is down: the answer comes from the FAQ with a plain notice. Then the question budget runs out:
// a 429 says when the next question is allowed, and asking is disabled until then.
import { BASE, ask, check, finished, openPanel, scenario, shot } from "./lib.mjs";

await scenario(
  async ({ page }) => {
    await page.goto(BASE + "/");
    await openPanel(page);
    const answer = await finished(await ask(page, "How do I install ROS 2?"));
    await answer.locator('.tc-notice[data-code="fallback_faq"]').waitFor();
    const text = await answer.locator(".tc-markdown").innerText();
    check(text.includes("ROS 2"), `an FAQ answer: ${text.slice(0, 80)}`);
    await shot(page, "13-faq-fallback");

    await finished(await ask(page, "Is there a simulator chapter?"));
    const limited = await finished(await ask(page, "One more question?"));
    const error = limited.getByRole("alert");
    await error.waitFor();
    const message = await error.innerText();
    check(/ask again (in \d+ (s|min)|at \d)/.test(message), `429 says when: ${message}`);
    check(await page.getByRole("button", { name: "Send" }).isDisabled(), "Send is disabled while limited");
    await page.locator('.tc-composer [data-code="rate_limited"]').waitFor();
    await shot(page, "14-rate-limited");
    return { message };
  },
  { expectHttpErrors: true },
);
