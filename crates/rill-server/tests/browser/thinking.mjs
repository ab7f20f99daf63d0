// Headless-Chromium test of the glass-box page on a model that thinks (a tiny synthetic model
// whose chat template opens `<think>`, so its answer starts inside the thinking), served by
// `rill-server/tests/live.rs`.
//
//   node crates/rill-server/tests/browser/thinking.mjs --url http://127.0.0.1:PORT/ --out DIR
//
// Checks: a chat generation streams; its chips are marked as thinking (class, tooltip, label);
// the viewer says the chosen token is part of the thinking; no console errors or warnings,
// nothing printed as null/undefined/NaN. Exits 1 on the first failure.

import fs from 'node:fs';
import path from 'node:path';
import { arg, check, ok, openPage, runChecks } from './harness.mjs';

const url = arg('url', 'http://127.0.0.1:8080/');
const out = arg('out', 'thinking-screenshots');
fs.mkdirSync(out, { recursive: true });

async function run(browser) {
  const { page, problems, noBadText } = await openPage(browser, url);

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
    check(/thinking/.test(m.label) && /thinking/.test(m.title), `chip ${i}'s label or tooltip does not say thinking: ${JSON.stringify(m)}`);
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

await runChecks('thinking', run);
