// The authors' report page (GET /admin/report) in light and dark: it renders its topics and charts, fits a
// laptop and a phone without sideways scrolling, loads nothing from the network, and follows the colour mode.
import { OUT, BASE, check, launch, shot } from "./lib.mjs";
import path from "node:path";

const token = process.env.E2E_ADMIN_TOKEN;
const result = {};
for (const colorScheme of ["light", "dark"]) {
  const session = await launch({ colorScheme });
  const { context, page } = session;
  try {
    const requested = [];
    page.on("request", (request) => requested.push(request.url()));
    await context.setExtraHTTPHeaders({ Authorization: `Bearer ${token}` });
    const response = await page.goto(`${BASE}/admin/report`);
    check(response.status() === 200, `the page answers 200 (got ${response.status()})`);
    const topics = await page.locator("article.topic").count();
    check(topics >= 3, `at least three gap topics shown (got ${topics})`);
    check((await page.locator("svg").count()) >= 3, "charts drawn as inline SVG");
    const fits = () => page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth);
    check(await fits(), "no sideways scrolling at 1280 px");
    const background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    const ink = await page.evaluate(() => getComputedStyle(document.body).color);
    await page.screenshot({ path: path.join(OUT, `report-${colorScheme}.png`), fullPage: true });
    await page.setViewportSize({ width: 390, height: 844 });
    check(await fits(), "no sideways scrolling on a 390 px phone");
    await shot(page, `report-${colorScheme}-phone`);
    check(requested.every((url) => url.startsWith(BASE)), `nothing fetched from elsewhere: ${requested.join(", ")}`);
    check(requested.length === 1, `one self-contained page, no further requests (got ${requested.length})`);
    check(session.errors.length === 0, `no errors in the page console: ${session.errors.join(" | ")}`);
    result[colorScheme] = { topics, background, ink };
  } catch (error) {
    await shot(page, `failure-report-${colorScheme}`).catch(() => {});
    console.error(error.stack ?? String(error));
    process.exitCode = 1;
  } finally {
    await session.browser.close();
  }
}
if (!process.exitCode) console.log(JSON.stringify({ ok: true, ...result, out: OUT }));
