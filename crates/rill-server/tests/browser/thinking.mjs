// Headless-Chromium test of the glass-box page on a model that thinks (a tiny synthetic model
// whose chat template opens `<think>`, so its answer starts inside the thinking), served by a
// test harness with the engine loop under its control (`@engine pause|step|resume` on stdout,
// answered `ok <blocks>` on stdin).
//
//   node crates/rill-server/tests/browser/thinking.mjs --url http://127.0.0.1:PORT/ --out DIR
//
// Checks: a chat generation streams; its chips are marked as thinking (class, tooltip, label);
// the viewer says the chosen token is part of the thinking; no console errors or warnings,
// nothing printed as null/undefined/NaN. Exits 1 on the first failure.

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const url = arg('url', 'http://127.0.0.1:8080/');
const out = arg('out', 'hybrid-screenshots');
const replies = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function engine(command) {
  console.log(`@engine ${command}`);
  const { value } = await replies.next();
  if (!(value || '').startsWith('ok')) throw new Error(`engine ${command}: ${value}`);
}
fs.mkdirSync(out, { recursive: true });

class CheckError extends Error {}
function check(cond, msg) {
  if (!cond) throw new CheckError(msg);
}
const ok = (msg) => console.log(`ok   ${msg}`);
const BAD_TEXT = /\bnull\b|\bundefined\b|\bNaN\b|\[object /;

async function run(browser) {
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

  // A chat answer: the template opened the thinking, so every token of it is thinking.
  await page.check('[data-testid=mode-chat]');
  await page.fill('[data-testid=prompt]', 'What is two and two?');
  await page.fill('[data-testid=f-max_tokens]', '5');
  await page.fill('[data-testid=f-temperature]', '0');
  await page.click('[data-testid=generate]');
  await page.waitForFunction(() => ['done', 'error', 'stopped'].includes(document.querySelector('[data-testid=gen-status]').dataset.state));
  check((await page.getAttribute('[data-testid=gen-status]', 'data-state')) === 'done', `the generation did not finish: ${await page.textContent('[data-testid=gen-status]')}`);
  const chips = page.locator('[data-testid=gen-output] [data-testid=chip]');
  const n = await chips.count();
  check(n >= 1, `the answer has ${n} chips`);
  const marks = await chips.evaluateAll((els) => els.map((e) => ({ cls: e.className, part: e.dataset.part, title: e.getAttribute('title') || '', label: e.getAttribute('aria-label') || '' })));
  for (const [i, m] of marks.entries()) {
    check(m.part === 'reasoning' && /\bthinking\b/.test(m.cls), `chip ${i} is not marked as thinking: ${JSON.stringify(m)}`);
    check(/thinking/.test(m.label), `chip ${i}'s label does not say thinking: ${m.label}`);
  }
  ok(`${n} chips marked as thinking`);
  await chips.first().click();
  await page.waitForFunction(() => document.querySelector('[data-testid=viewer-step]').textContent.includes('after'));
  const stepLine = await page.textContent('[data-testid=viewer-step]');
  check((await page.locator('[data-testid=viewer-thinking]').count()) === 1, `the viewer's step line says: ${stepLine}`);
  const note = await page.textContent('[data-testid=viewer-thinking]');
  check(/thinking/.test(note) && /apart from the answer/.test(note), `the viewer says ${note}`);
  await noBadText('[data-testid=viewer-step]');
  ok(`the viewer says: ${note.trim()}`);
  await page.screenshot({ path: path.join(out, 'thinking.png') });

  check(problems.length === 0, `console errors or warnings:\n  ${problems.join('\n  ')}`);
  ok('no console errors or warnings');
}

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
  replies.return?.();
}
if (failed) process.exit(1);
console.log('all thinking page checks passed');
process.exit(0);
