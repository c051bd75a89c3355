// Pushed updates in a real browser (Debian's Chromium, driven by
// playwright-core), against a queuegate whose route /gated has capacity 1:
// the waiting page follows its place on the event stream instead of
// polling, and when the stream is blocked it polls as before and still
// moves on when admitted.
//
//   node events.mjs <base-url>
//
// Prints one "ok - …" line per check and exits 0, or prints "not ok - …"
// with the reason and exits 1.
import { check, run, DESKTOP, PHONE } from "./lib.mjs";

const base = process.argv[2];
if (!base) {
  console.error("usage: node events.mjs <base-url>");
  process.exit(2);
}

const SETTLE = 20_000;
const EVENTS = "/__queuegate/events";
const STATUS = "/__queuegate/status";

const text = (page, name) =>
  page.locator(`[data-qg="${name}"]`).first().textContent({ timeout: 5_000 });
const isWaitingPage = (page) => new URL(page.url()).pathname === "/__queuegate/waiting";
const policyErrors = [];

// A browser context and page, with the paths of the requests it made
// to queuegate's own endpoints, in order.
async function open(browser) {
  const context = await browser.newContext({ locale: "en-US" });
  const page = await context.newPage();
  const asked = [];
  page.on("request", (req) => {
    const path = new URL(req.url()).pathname;
    if (path === EVENTS || path === STATUS) asked.push(path);
  });
  page.on("console", (msg) => {
    if (msg.type() === "error" && /Content[- ]Security[- ]Policy/i.test(msg.text())) {
      policyErrors.push(msg.text());
    }
  });
  return { context, page, asked };
}

const count = (asked, path) => asked.filter((p) => p === path).length;

await run(async (browser) => {

  // A takes the one slot.
  const a = await open(browser);
  await a.page.goto(`${base}/gated/a`);
  check((await a.page.textContent("#path")) === "/gated/a", "A is admitted and sees the origin");

  // B waits, on the event stream.
  const b = await open(browser);
  await b.page.goto(`${base}/gated/b?x=1`);
  check(isWaitingPage(b.page), "B lands on the waiting page", b.page.url());
  check((await text(b.page, "position")) === "1", "B is at place 1");
  for (let i = 0; i < 50 && count(b.asked, EVENTS) === 0; i++) await b.page.waitForTimeout(100);
  check(count(b.asked, EVENTS) === 1, "B opens the event stream", b.asked);
  // Near the head a page polls about every second; on the stream it does not.
  await b.page.waitForTimeout(1_000);
  const polled = count(b.asked, STATUS);
  await b.page.waitForTimeout(4_000);
  check(count(b.asked, STATUS) === polled, "B does not poll while the stream is open", b.asked);

  // A leaves; the stream says B is admitted, one status request gets the pass.
  const left = await a.context.request.post(`${base}/__queuegate/leave?route=gated`);
  check(left.status() === 200, "A leaves", left.status());
  await b.page.waitForURL((u) => u.pathname === "/gated/b", { timeout: SETTLE });
  check((await b.page.textContent("#path")) === "/gated/b?x=1", "B is back at /gated/b?x=1");
  check(count(b.asked, STATUS) === polled + 1, "B asked status once, when admitted", b.asked);

  // C's browser cannot reach the stream: it polls, and gets in all the same.
  const c = await open(browser);
  await c.page.route(`**${EVENTS}**`, (route) => route.abort());
  await c.page.goto(`${base}/gated/c`);
  check(isWaitingPage(c.page), "C lands on the waiting page");
  check((await text(c.page, "position")) === "1", "C is at place 1");
  for (let i = 0; i < 100 && count(c.asked, STATUS) < 2; i++) await c.page.waitForTimeout(100);
  check(count(c.asked, EVENTS) >= 1, "C tried the event stream", c.asked);
  check(count(c.asked, STATUS) >= 2, "C falls back to polling", c.asked);
  const bLeft = await b.context.request.post(`${base}/__queuegate/leave?route=gated`);
  check(bLeft.status() === 200, "B leaves", bLeft.status());
  await c.page.waitForURL((u) => u.pathname === "/gated/c", { timeout: SETTLE });
  check((await c.page.textContent("#path")) === "/gated/c", "C reaches the origin by polling");

  check(policyErrors.length === 0, "no Content-Security-Policy violations", policyErrors);
  console.log("events: all checks passed");
});
