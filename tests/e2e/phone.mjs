// A 390 px phone: the open panel fills the screen, the module menu stays inside it, the launcher steps
// aside, and closing gives focus back to the launcher.
import { BASE, check, scenario, shot } from "./lib.mjs";

await scenario(async ({ page }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(BASE + "/");
  const launcher = page.getByRole("button", { name: /Ask the textbook/ });
  await launcher.click();
  const dialog = page.getByRole("dialog", { name: "Ask the textbook" });
  await dialog.waitFor();
  const panel = await dialog.boundingBox();
  check(panel && panel.x === 0 && panel.y === 0 && panel.width === 390 && panel.height === 844, `full screen: ${JSON.stringify(panel)}`);
  const menu = await page.locator(".tc-scope select").boundingBox();
  check(menu && menu.x + menu.width <= 390, `module menu inside the panel: ${JSON.stringify(menu)}`);
  check(!(await page.locator(".tc-launcher").isVisible()), "the launcher is out of the way while the panel is open");
  const fontSize = await page.getByRole("textbox", { name: "Your question" }).evaluate((e) => getComputedStyle(e).fontSize);
  check(parseFloat(fontSize) >= 16, `input font ${fontSize} (iOS zooms below 16 px)`);
  await shot(page, "14-phone-open");
  await dialog.getByRole("button", { name: "Close" }).click();
  await page.waitForFunction(() => document.activeElement?.classList.contains("tc-launcher"));
  return { panel, menu };
});
