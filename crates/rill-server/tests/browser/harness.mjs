// What the page scripts run by `rill-server/tests/live.rs` share: their arguments, checks that
// fail with one message, the engine-loop control (`@engine pause|step|resume` on stdout,
// answered `ok <blocks>` on stdin), opening the page on a served model, and running a script's
// checks in headless Chromium (exit 1 on the first failure).

import { chromium } from 'playwright-core';
import readline from 'node:readline';

/** The value after `--name` on the command line, else `fallback`. */
export function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

export class CheckError extends Error {}
export function check(cond, msg) {
  if (!cond) throw new CheckError(msg);
}
export const ok = (msg) => console.log(`ok   ${msg}`);
export const BAD_TEXT = /\bnull\b|\bundefined\b|\bNaN\b|\[object /;

let replies = null;
/** Asks the test harness to pause, step or resume the engine loop, and waits for its answer. */
export async function engine(command) {
  replies ??= readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  console.log(`@engine ${command}`);
  const { value } = await replies.next();
  if (!(value || '').startsWith('ok')) throw new Error(`engine ${command}: ${value}`);
}

/** Opens `url` at 1280×800 and waits for the model info; `problems` collects console errors
 * and warnings and page errors; `noBadText(sel)` checks nothing prints as null/undefined/NaN. */
export async function openPage(browser, url) {
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
  page.setDefaultTimeout(120000);
  const problems = [];
  page.on('console', (m) => ['error', 'warning'].includes(m.type()) && problems.push(`console ${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  const noBadText = async (sel) => {
    const text = await page.textContent(sel);
    check(!BAD_TEXT.test(text), `${sel} shows "${text.match(BAD_TEXT)}"`);
  };
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForFunction(() => ['ready', 'error'].includes(document.querySelector('[data-testid=model-info]')?.dataset.state));
  check((await page.getAttribute('[data-testid=model-info]', 'data-state')) === 'ready', 'the model info did not load');
  return { page, problems, noBadText };
}

/** Runs `run(browser)` in headless Chromium and exits: 0 when every check passed, else 1 after
 * printing the failure. */
export async function runChecks(name, run) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  let failed = false;
  try {
    await run(browser);
  } catch (err) {
    failed = true;
    console.log(`FAIL ${err instanceof CheckError ? err.message : err.stack || err}`);
  } finally {
    await browser.close();
    replies?.return?.();
  }
  if (failed) process.exit(1);
  console.log(`all ${name} page checks passed`);
  process.exit(0);
}
