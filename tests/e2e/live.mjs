// The admin listener's live view in a real browser (Debian's Chromium,
// driven by playwright-core), against a queuegate whose route /gated has
// capacity 1 and whose admin token is given: the route and its figures
// appear, the waiting count follows visitors joining and leaving within
// 2 s, the chart draws, the controls ask for the token, a wrong token is
// refused and the right one closes the route for the next visitor.
//
//   node live.mjs <base-url> <admin-url> <token> <screenshot-dir>
//
// Prints one "ok - …" line per check and exits 0, or prints "not ok - …"
// with the reason and exits 1.
import { join } from "node:path";
import { check, run } from "./lib.mjs";

const [base, admin, token, shots] = process.argv.slice(2);
if (!base || !admin || !token || !shots) {
  console.error("usage: node live.mjs <base-url> <admin-url> <token> <screenshot-dir>");
  process.exit(2);
}

// Joins and leaves show on the page within this long.
const FOLLOW_MS = 2_000;
const policyErrors = [];

async function visitor(browser) {
  const context = await browser.newContext({ locale: "en-US" });
  return { context, page: await context.newPage() };
}

await run(async (browser) => {
  const context = await browser.newContext({ locale: "en-US", viewport: { width: 1280, height: 900 } });
  const live = await context.newPage();
  live.on("console", (msg) => {
    if (msg.type() === "error" && /Content[- ]Security[- ]Policy/i.test(msg.text())) {
      policyErrors.push(msg.text());
    }
  });
  await live.goto(`${admin}/`);
  const route = live.locator("#route-gated");
  await route.waitFor({ timeout: 10_000 });
  const figure = (name) => route.locator(`[data-f="${name}"]`).textContent();
  check((await route.locator(".route-name").textContent()) === "gated", "the route appears");
  check((await figure("active")) === "0 / 1", "active / capacity show", await figure("active"));
  check((await figure("waiting")) === "0", "nobody waits", await figure("waiting"));
  check(
    (await route.locator(".mode-name").textContent()) === "Mode: gate"
      && await route.locator(".override-badge").isHidden(),
    "the mode shows, no override",
  );
  check(
    await route.locator('[data-if="capacity_range"]').isHidden()
      && await route.locator('[data-if="origin"]').isHidden(),
    "figures the route does not have are hidden",
  );

  // A takes the slot, B waits: the count follows within 2 s.
  const a = await visitor(browser);
  await a.page.goto(`${base}/gated/a`);
  check((await a.page.textContent("#path")) === "/gated/a", "A is admitted");
  const b = await visitor(browser);
  await b.page.goto(`${base}/gated/b`);
  check(new URL(b.page.url()).pathname === "/__queuegate/waiting", "B waits");
  let since = Date.now();
  await live.waitForFunction(
    () => document.querySelector('#route-gated [data-f="waiting"]').textContent === "1",
    null,
    { timeout: FOLLOW_MS },
  );
  check(true, "the waiting count follows B joining within 2 s", Date.now() - since);
  check((await figure("active")) === "1 / 1", "A is counted active", await figure("active"));

  since = Date.now();
  // B's page stops first (a waiting page that finds itself out of line
  // would join again), then B leaves with its cookies.
  await b.page.goto("about:blank");
  const left = (await b.context.request.post(`${base}/__queuegate/leave?route=gated`)).status();
  check(left < 400, "B leaves", left);
  await live.waitForFunction(
    () => document.querySelector('#route-gated [data-f="waiting"]').textContent === "0",
    null,
    { timeout: FOLLOW_MS },
  ).catch(async (e) => {
    throw new Error(`${e.message} waiting shows ${await figure("waiting")}`);
  });
  check(true, "the waiting count follows B leaving within 2 s", Date.now() - since);
  await b.context.close();

  // The chart: a line of the samples so far, and its history kept.
  await live.waitForFunction(
    () => Number(document.querySelector("#route-gated .plot").getAttribute("data-samples")) >= 3,
    null,
    { timeout: 10_000 },
  );
  const points = await route.locator(".plot polyline.waiting").getAttribute("points");
  check(points.split(" ").length >= 3, "the chart draws the line length", points);
  check(await route.locator(".plot polyline.capacity").count() === 1, "the chart draws the capacity");

  // A page opened now draws the history it missed.
  const late = await context.newPage();
  await late.goto(`${admin}/`);
  await late.waitForFunction(
    () => Number(document.querySelector("#route-gated .plot")?.getAttribute("data-samples")) >= 3,
    null,
    { timeout: 5_000 },
  );
  check(true, "a page opened late draws the earlier samples");
  await late.close();

  // The controls ask for the token first.
  const form = route.locator("form.control");
  await form.locator('select[name="mode"]').selectOption("closed");
  await form.locator('button[type="submit"]').click();
  await live.waitForFunction(() => /admin token/.test(document.getElementById("result").textContent));
  check(
    await live.evaluate(() => document.activeElement && document.activeElement.id === "token"),
    "the controls ask for the token",
  );
  check(!(await live.url()).includes("token"), "no token in the address");

  // A wrong token is refused, nothing changes.
  await live.fill("#token", "not-the-admin-token-at-all");
  await live.click('#token-form button[type="submit"]');
  await form.locator('button[type="submit"]').click();
  await live.waitForFunction(() => /refused/i.test(document.getElementById("result").textContent));
  check(true, "a wrong token is refused");
  check((await route.locator(".mode-name").textContent()) === "Mode: gate", "the route stays open");

  // The right one closes the route.
  await live.check("#keep");
  await live.fill("#token", token);
  await live.click('#token-form button[type="submit"]');
  check(
    await live.evaluate(() => sessionStorage.getItem("queuegate-admin-token") !== null
      && !location.href.includes("queuegate-admin-token")),
    "the token is kept in this tab only",
  );
  await form.locator('button[type="submit"]').click();
  await live.waitForFunction(() => /set/.test(document.getElementById("result").textContent));
  await live.waitForFunction(
    () => document.querySelector("#route-gated .mode-name").textContent === "Mode: closed",
    null,
    { timeout: FOLLOW_MS * 2 },
  );
  check(await route.locator(".override-badge").isVisible(), "the route shows as closed by an override");
  const c = await visitor(browser);
  await c.page.goto(`${base}/gated/c`);
  check(
    await c.page.evaluate(() => document.body.dataset.state) === "closed",
    "the next visitor gets the closed answer",
    c.page.url(),
  );
  await c.context.close();

  // Screenshots, laptop and phone, once the chart is drawn at the size.
  const fitted = () => live.waitForFunction(() => {
    const svg = document.querySelector("#route-gated .plot");
    return svg.viewBox.baseVal.width === Math.max(200, Math.round(svg.clientWidth));
  });
  for (const [width, height] of [[1280, 900], [390, 844]]) {
    await live.setViewportSize({ width, height });
    await fitted();
    await live.screenshot({ path: join(shots, `live-${width}.png`), fullPage: true });
  }
  const wide = await live.evaluate(() => document.documentElement.scrollWidth);
  check(wide <= 390, "nothing wider than a phone", wide);

  check(policyErrors.length === 0, "no Content-Security-Policy violations", policyErrors);
  await a.context.close();
  console.log("live: all checks passed");
});
