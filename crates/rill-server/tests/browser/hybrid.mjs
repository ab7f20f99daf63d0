// Headless-Chromium test of the glass-box page on a hybrid model (Qwen3.5's kind: Gated DeltaNet
// layers with a fixed state, and attention layers), served by a test harness with the engine loop
// under its control (`@engine pause|step|resume` on stdout, answered `ok <blocks>` on stdin).
//
//   node crates/rill-server/tests/browser/hybrid.mjs --url http://127.0.0.1:PORT/ --out DIR
//
// Checks: a generation streams; the logit lens marks the recurrent layers; the attention view
// starts on an attention layer and, moved to a recurrent one, says what that layer keeps instead
// of weights; the server view's KV section shows each request's fixed state and its snapshot;
// no console errors or warnings, nothing printed as null/undefined/NaN. Exits 1 on the first
// failure.

import fs from 'node:fs';
import path from 'node:path';
import { arg, check, engine, ok, openPage, runChecks } from './harness.mjs';

const url = arg('url', 'http://127.0.0.1:8080/');
const out = arg('out', 'hybrid-screenshots');
fs.mkdirSync(out, { recursive: true });

async function run(browser) {
  const { page, problems, noBadText } = await openPage(browser, url);

  // A generation, then its first step in the viewer with the logit lens and attention.
  await page.check('[data-testid=mode-completion]');
  await page.fill('[data-testid=prompt]', 'the quick brown fox jumps over the lazy dog and runs');
  await page.fill('[data-testid=f-max_tokens]', '6');
  await page.fill('[data-testid=f-temperature]', '0');
  await page.click('[data-testid=generate]');
  await page.waitForFunction(() => ['done', 'error', 'stopped'].includes(document.querySelector('[data-testid=gen-status]').dataset.state));
  check((await page.getAttribute('[data-testid=gen-status]', 'data-state')) === 'done', 'the generation did not finish');
  await page.locator('[data-testid=gen-output] [data-testid=chip]').first().click();
  await page.waitForFunction(() => ['ready', 'error'].includes(document.querySelector('[data-testid=viewer-lens]').dataset.state));
  check((await page.getAttribute('[data-testid=viewer-lens]', 'data-state')) === 'ready', `the lens did not load: ${await page.textContent('[data-testid=viewer-lens]')}`);
  const layers = await page.$$eval('[data-testid=viewer-lens] [data-testid=lens-row] td:first-child', (els) => els.map((e) => e.textContent));
  // qwen35-tiny: blocks 1-3 are Gated DeltaNet, block 4 attention.
  check(layers.join(',') === 'emb,1ʳ,2ʳ,3ʳ,4', `the lens's layer column reads ${layers}`);
  ok(`the lens marks the recurrent layers: ${layers.join(' ')}`);
  await page.waitForSelector('[data-testid=attn-token]');
  const slider = '[data-testid=attn-layer]';
  check((await page.inputValue(slider)) === '4', `the attention view starts on layer ${await page.inputValue(slider)}`);
  const weights = await page.$$eval('[data-testid=attn-token]', (els) => els.reduce((a, e) => a + Number(e.dataset.weight), 0));
  check(Math.abs(weights - 1) < 1e-3, `the attention layer's weights sum to ${weights}`);
  await page.$eval(slider, (el) => {
    el.value = '2';
    el.dispatchEvent(new Event('input'));
  });
  const note = await page.$eval('[data-testid=attn-window]', (e) => ({ mixer: e.dataset.mixer, text: e.textContent }));
  check(note.mixer === 'gated_deltanet' && /Gated DeltaNet layer/.test(note.text) && /fixed size/.test(note.text), `the note on layer 2 says ${JSON.stringify(note)}`);
  ok(`on a recurrent layer the attention view says: ${note.text.slice(0, 80)}…`);
  await noBadText('[data-testid=viewer-lens]');
  await page.screenshot({ path: path.join(out, 'hybrid-lens-1280.png'), fullPage: false });

  // The server view while a request is part-way: its fixed state and snapshot.
  await page.click('[data-testid=tab-server]');
  await page.waitForSelector('[data-testid=panel-server]:not([hidden])');
  await page.waitForSelector('[data-testid=kv-grid]');
  await engine('pause');
  await page.fill('[data-testid=server-n]', '1');
  await page.click('[data-testid=server-clients]');
  let snapshot = -1;
  for (let i = 0; i < 400 && snapshot < 16; i++) {
    await engine('step');
    snapshot = await page.evaluate(async () => {
      await window.rillGlassBox.server.refresh();
      const el = document.querySelector('[data-testid=state-sequence]');
      return el && el.dataset.snapshot !== '' ? Number(el.dataset.snapshot) : -1;
    });
  }
  check(snapshot >= 16 && snapshot % 16 === 0, `the request's state snapshot is at ${snapshot}`);
  const summary = await page.textContent('[data-testid=state-summary]');
  check(/1 of \d+ request states in use/.test(summary), `the state summary says ${summary}`);
  const line = await page.textContent('[data-testid=state-sequence]');
  check(/state at position \d+/.test(line) && /where keys and values of these layers would take/.test(line), `the request's state line says ${line}`);
  await noBadText('[data-testid=panel-server]');
  ok(`the server view shows the fixed notepad: ${summary.trim()} ${line.trim().slice(0, 90)}…`);
  await page.screenshot({ path: path.join(out, 'hybrid-server-1280.png'), fullPage: true });
  await engine('resume');
  await page.waitForFunction(() => document.querySelector('[data-testid=server-client-count]').dataset.running === '0');
  check(problems.length === 0, `console errors or warnings:\n  ${problems.join('\n  ')}`);
  ok('no console errors or warnings');
}

await runChecks('hybrid', run);
