// What the browser scripts share: the check that prints "ok - …", Debian's
// Chromium launched headless on a fresh profile, and the run that prints
// "not ok - …" and exits 1 when a check fails.
import { chromium } from "playwright-core";
import { join } from "node:path";

export const DESKTOP = { width: 1280, height: 900 };
export const PHONE = { width: 360, height: 780 };

export function check(cond, what, detail) {
  if (!cond) {
    throw new Error(`${what}${detail === undefined ? "" : `: ${JSON.stringify(detail)}`}`);
  }
  console.log(`ok - ${what}`);
}

// A fresh context in `locale` at the desktop size, and its page.
export async function open(browser, locale) {
  const context = await browser.newContext({ locale, viewport: DESKTOP });
  return { context, page: await context.newPage() };
}

// Full-page screenshots of `page`, desktop and phone sized, as
// `<dir>/<prefix>-<name>-desktop.png` and `…-360.png`.
export async function screenshots(page, dir, prefix, name) {
  for (const [size, viewport] of [["desktop", DESKTOP], ["360", PHONE]]) {
    await page.setViewportSize(viewport);
    await page.screenshot({ path: join(dir, `${prefix}-${name}-${size}.png`), fullPage: true });
  }
  await page.setViewportSize(DESKTOP);
}

// Runs `body(browser)` and exits: 0 when it returns, 1 when it throws.
// launch() starts Chromium on a fresh temporary profile and removes it on close.
export async function run(body) {
  let browser;
  let failed = false;
  try {
    browser = await chromium.launch({
      executablePath: "/usr/bin/chromium",
      headless: true,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
    });
    await body(browser);
  } catch (err) {
    failed = true;
    console.log(`not ok - ${err && err.message ? err.message : err}`);
  } finally {
    if (browser) await browser.close().catch(() => {});
  }
  process.exit(failed ? 1 : 0);
}
