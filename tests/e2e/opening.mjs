// A scheduled opening in a real browser (Debian's Chromium, driven by
// playwright-core), against a queuegate whose route /gated has capacity 1
// and opens a few seconds after the start.
//
//   node opening.mjs <base-url> <screenshot-dir>
//
// Prints one "ok - …" line per check and exits 0, or prints "not ok - …"
// with the reason and exits 1.
import { check, open, run, screenshots } from "./lib.mjs";
import { mkdirSync } from "node:fs";

const [base, shots] = process.argv.slice(2);
if (!base || !shots) {
  console.error("usage: node opening.mjs <base-url> <screenshot-dir>");
  process.exit(2);
}


const state = (page) => page.getAttribute("body", "data-state");
const text = (page, name) => page.textContent(`[data-qg="${name}"]`);
const seconds = (shown) => {
  const m = /^(\d+):(\d\d):(\d\d)$/.exec((shown || "").trim());
  return m ? Number(m[1]) * 3600 + Number(m[2]) * 60 + Number(m[3]) : NaN;
};
const atOrigin = (page) => new URL(page.url()).pathname.startsWith("/gated/");

const screenshot = (page, name) => screenshots(page, shots, "opening", name);

await run(async (browser) => {
  mkdirSync(shots, { recursive: true });

  // Before the opening: the countdown, in English and in Korean.
  const b = await open(browser, "en-US");
  await b.page.goto(`${base}/gated/b?x=1`);
  check((await state(b.page)) === "prequeue", "B sees the countdown page", await state(b.page));
  check((await text(b.page, "headline")) === "Opening soon", "B's page says it opens soon",
    await text(b.page, "headline"));
  const first = seconds(await text(b.page, "opens-in"));
  check(first > 0, "B's page shows the time left", await text(b.page, "opens-in"));
  await b.page.waitForTimeout(2_200);
  const later = seconds(await text(b.page, "opens-in"));
  check(later < first, "B's countdown counts down", [first, later]);
  await screenshot(b.page, "en");

  const k = await open(browser, "ko-KR");
  await k.page.goto(`${base}/gated/k`);
  check((await state(k.page)) === "prequeue", "K sees the countdown page");
  check((await text(k.page, "headline")) === "곧 시작합니다", "K's page is in Korean",
    await text(k.page, "headline"));
  await screenshot(k.page, "ko");

  // At the opening the draw lets one in (capacity 1); the other's page
  // turns into the waiting page.
  const deadline = Date.now() + 30_000;
  let inside = null;
  while (!inside && Date.now() < deadline) {
    if (atOrigin(b.page)) inside = b;
    else if (atOrigin(k.page)) inside = k;
    else await b.page.waitForTimeout(200);
  }
  check(inside !== null, "at the opening one of them is let in");
  const other = inside === b ? k : b;
  await other.page.waitForFunction(() => document.body.getAttribute("data-state") === "waiting",
    null, { timeout: 10_000 });
  check((await text(other.page, "position")) === "1", "the other's page turns into the waiting page at place 1",
    await text(other.page, "position"));
  await screenshot(other.page, "waiting-after-opening");

  // The one inside leaves: the other moves on to the page it asked for.
  const left = await inside.context.request.post(`${base}/__queuegate/leave?route=gated`);
  check(left.status() === 200, "the first one leaves", left.status());
  await other.page.waitForURL((u) => u.pathname.startsWith("/gated/"), { timeout: 20_000 });
  const path = await other.page.textContent("#path");
  check(path === (other === b ? "/gated/b?x=1" : "/gated/k"), "the other moves on when admitted", path);
  console.log("opening: all checks passed");
});
