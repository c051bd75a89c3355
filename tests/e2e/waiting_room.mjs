// The waiting room in a real browser (Debian's Chromium, driven by
// playwright-core), against a queuegate whose route /gated has capacity 1.
//
//   node waiting_room.mjs <base-url> [screenshot-dir]
//
// Prints one "ok - …" line per check and exits 0, or prints "not ok - …"
// with the reason and exits 1.
import { check, run, DESKTOP, PHONE } from "./lib.mjs";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const base = process.argv[2];
const shots = process.argv[3];
if (!base) {
  console.error("usage: node waiting_room.mjs <base-url> [screenshot-dir]");
  process.exit(2);
}

const SETTLE = 20_000;

const text = (page, name) =>
  page.locator(`[data-qg="${name}"]`).first().textContent({ timeout: 5_000 });
const isWaitingPage = (page) => new URL(page.url()).pathname === "/__queuegate/waiting";
const policyErrors = [];

async function open(browser, locale) {
  const context = await browser.newContext({ locale, viewport: DESKTOP });
  const page = await context.newPage();
  page.on("console", (msg) => {
    if (msg.type() === "error" && /Content[- ]Security[- ]Policy/i.test(msg.text())) {
      policyErrors.push(msg.text());
    }
  });
  return { context, page };
}

async function screenshot(page, name) {
  if (!shots) return;
  for (const [size, viewport] of [["desktop", DESKTOP], ["360", PHONE]]) {
    await page.setViewportSize(viewport);
    await page.screenshot({ path: join(shots, `waiting-${name}-${size}.png`), fullPage: true });
  }
  await page.setViewportSize(DESKTOP);
  console.log(`ok - screenshots of the ${name} page`);
}

await run(async (browser) => {
  if (shots) mkdirSync(shots, { recursive: true });

  // A takes the one slot.
  const a = await open(browser, "en-US");
  await a.page.goto(`${base}/gated/a`);
  check((await a.page.textContent("#path")) === "/gated/a", "A is admitted and sees the origin");

  // B (Korean) is sent to the waiting page at place 1.
  const b = await open(browser, "ko-KR");
  await b.page.goto(`${base}/gated/page?x=1`);
  check(isWaitingPage(b.page), "B lands on the waiting page", b.page.url());
  check((await b.page.getAttribute("html", "lang")) === "ko", "B's page is in Korean");
  check((await text(b.page, "headline")) === "대기 중입니다", "B's headline is Korean");
  check((await text(b.page, "position")) === "1", "B is at place 1");
  check(b.page.workers().length === 1, "B polls from a worker", b.page.workers().length);
  const ticket = (await b.context.cookies()).find((c) => c.name === "qg_gated")?.value;
  check(ticket?.startsWith("v1.w."), "B holds a waiting ticket");

  // Reloading keeps the place (and the ticket).
  await b.page.reload();
  check(isWaitingPage(b.page), "B is still waiting after a reload");
  check((await text(b.page, "position")) === "1", "B keeps place 1 after a reload");
  const again = (await b.context.cookies()).find((c) => c.name === "qg_gated")?.value;
  check(again === ticket, "the reload kept B's ticket");

  await screenshot(b.page, "ko");
  await b.page.click('[data-qg="lang-switch"]');
  check((await text(b.page, "headline")) === "You're in line", "the switch shows English in place");
  await screenshot(b.page, "en");

  // A leaves; B is brought back by itself to the page it asked for.
  const left = await a.context.request.post(`${base}/__queuegate/leave?route=gated`);
  check(left.status() === 200 && (await left.json()).state === "left", "A leaves", left.status());
  await b.page.waitForURL((u) => u.pathname === "/gated/page", { timeout: SETTLE });
  const url = new URL(b.page.url());
  check(url.pathname + url.search === "/gated/page?x=1", "B is back at /gated/page?x=1", url.href);
  check((await b.page.textContent("#path")) === "/gated/page?x=1", "B sees the origin's page");

  // C waits behind B and loses the network for 10 s.
  const c = await open(browser, "en-US");
  await c.page.goto(`${base}/gated/c`);
  check(isWaitingPage(c.page), "C lands on the waiting page");
  check((await text(c.page, "position")) === "1", "C is at place 1");
  await c.context.setOffline(true);
  await c.page.locator('[data-qg="notice"]:not([hidden])').waitFor({ timeout: 10_000 });
  check(/Reconnecting/.test(await text(c.page, "notice")), "C's page says it is reconnecting");
  await c.page.waitForTimeout(10_000);
  check(isWaitingPage(c.page), "C's page did not go ahead while offline", c.page.url());
  check((await text(c.page, "position")) === "1", "C's place is still shown while offline");
  await c.context.setOffline(false);
  await c.page.locator('[data-qg="notice"]').waitFor({ state: "hidden", timeout: SETTLE });
  check(isWaitingPage(c.page), "C recovers on the waiting page");
  check((await text(c.page, "position")) === "1", "C keeps place 1 after the cut");

  // B leaves; C gets in by itself.
  const bLeft = await b.context.request.post(`${base}/__queuegate/leave?route=gated`);
  check(bLeft.status() === 200, "B leaves", bLeft.status());
  await c.page.waitForURL((u) => u.pathname === "/gated/c", { timeout: SETTLE });
  check((await c.page.textContent("#path")) === "/gated/c", "C reaches the origin after the cut");

  check(policyErrors.length === 0, "no Content-Security-Policy violations", policyErrors);
  console.log("waiting room: all checks passed");
});
