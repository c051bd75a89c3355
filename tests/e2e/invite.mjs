// Invite links in a real browser (Debian's Chromium, driven by
// playwright-core), against a queuegate whose route /gated has capacity 1
// and the lanes main and vip.
//
//   node invite.mjs <base-url> <vip-invite-token> <screenshot-dir>
//
// Prints one "ok - …" line per check and exits 0, or prints "not ok - …"
// with the reason and exits 1.
import { check, open, run, screenshots } from "./lib.mjs";
import { mkdirSync } from "node:fs";

const [base, token, shots] = process.argv.slice(2);
if (!base || !token || !shots) {
  console.error("usage: node invite.mjs <base-url> <vip-invite-token> <screenshot-dir>");
  process.exit(2);
}


const lane = (page) => page.locator('[data-qg="lane"]').first();
const isWaitingPage = (page) => new URL(page.url()).pathname === "/__queuegate/waiting";

const screenshot = (page, name) => screenshots(page, shots, "invite", name);

await run(async (browser) => {
  mkdirSync(shots, { recursive: true });

  // A takes the one slot.
  const a = await open(browser, "en-US");
  await a.page.goto(`${base}/gated/a`);
  check((await a.page.textContent("#path")) === "/gated/a", "A is admitted and sees the origin");

  // B waits in the main lane: no priority line.
  const b = await open(browser, "en-US");
  await b.page.goto(`${base}/gated/b`);
  check(isWaitingPage(b.page), "B lands on the waiting page");
  check(await lane(b.page).isHidden(), "B's page shows no priority line");

  // C (English) follows an invite link: the priority line, and the token is
  // gone from the address bar and from the way back.
  const c = await open(browser, "en-US");
  await c.page.goto(`${base}/gated/c?x=1&qg_invite=${encodeURIComponent(token)}`);
  check(isWaitingPage(c.page), "C lands on the waiting page", c.page.url());
  check(!c.page.url().includes("qg_invite") && !c.page.url().includes(token.slice(0, 20)),
    "C's address bar has no invite", c.page.url());
  await lane(c.page).waitFor({ state: "visible", timeout: 5_000 });
  check((await lane(c.page).textContent()) === "Priority line", "C's page says priority line");
  const status = await (await c.context.request.get(`${base}/__queuegate/status?route=gated`)).json();
  check(status.state === "waiting" && status.lane === "vip" && status.position === 1,
    "C is first in the vip lane", status);
  await screenshot(c.page, "en");

  // D (Korean) follows the same link.
  const d = await open(browser, "ko-KR");
  await d.page.goto(`${base}/gated/d?qg_invite=${encodeURIComponent(token)}`);
  check(isWaitingPage(d.page), "D lands on the waiting page", d.page.url());
  await lane(d.page).waitFor({ state: "visible", timeout: 5_000 });
  check((await lane(d.page).textContent()) === "우선 대기열", "D's page says priority line in Korean");
  await screenshot(d.page, "ko");

  // A leaves: the vip lane goes first, so C is let in before B, and comes
  // back to the page it asked for without the invite.
  const left = await a.context.request.post(`${base}/__queuegate/leave?route=gated`);
  check(left.status() === 200, "A leaves", left.status());
  await c.page.waitForURL((u) => u.pathname === "/gated/c", { timeout: 20_000 });
  check((await c.page.textContent("#path")) === "/gated/c?x=1", "C reaches /gated/c?x=1 without the invite",
    await c.page.textContent("#path"));
  check(isWaitingPage(b.page), "B still waits");
  console.log("invite: all checks passed");
});
