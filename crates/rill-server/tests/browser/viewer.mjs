// Headless-Chromium test of rill's glass-box page (crates/rill-server/web).
//
//   node crates/rill-server/tests/browser/viewer.mjs --url http://127.0.0.1:PORT/ --out DIR [--api-key KEY]
//
// With --api-key the page starts with that key saved (as a user would have typed it).
//
// At 1280x800 and 390x844: the page loads without console errors or warnings, a generation
// streams token chips, a chip's tooltip lists candidates, keyboard activation selects a step, the
// viewer's sliders reshape the bars (temperature moves the bars, top-k = 1 cuts all but one), a
// fork creates a branch that starts with the chosen token and generates more, the beam view draws
// nodes, the speculative view shows rounds, the cost view draws the timeline. Saves
// DIR/<view>-<width>.png for every view. Prints a line per check; exits 1 on the first failure.

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const url = arg('url', 'http://127.0.0.1:8080/');
const out = arg('out', 'viewer-screenshots');
const TIMEOUT = Number(arg('timeout', '300')) * 1000;
const apiKey = arg('api-key', '');
// `--control stdio`: the harness holds the engine loop on request (`@engine pause|step|resume` on
// stdout, answered `ok <KV blocks used>` on stdin), so the page can be tested mid-generation
// without racing the engine.
const control = arg('control', '') === 'stdio' ? readline.createInterface({ input: process.stdin }) : null;
const replies = control ? control[Symbol.asyncIterator]() : null;
async function engine(command) {
  if (!replies) throw new Error(`engine control needed for "${command}": run with --control stdio`);
  console.log(`@engine ${command}`);
  const { value } = await replies.next();
  const [word, blocks] = (value || '').split(' ');
  if (word !== 'ok') throw new Error(`engine ${command}: ${value}`);
  return Number(blocks);
}
fs.mkdirSync(out, { recursive: true });

let failed = false;
const t0 = Date.now();
function ok(msg) {
  console.log(`ok   ${msg} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}
class CheckError extends Error {}
// what a page shows when it formats a missing value
const BAD_TEXT = /\bnull\b|\bundefined\b|\bNaN\b|\[object /;
async function noBadText(page, sel, what) {
  const text = await page.textContent(sel);
  check(!BAD_TEXT.test(text), `${what}: ${sel} shows "${text.match(BAD_TEXT)}"`);
}
function check(cond, msg) {
  if (!cond) throw new CheckError(msg);
}

// The running size's console errors and page errors, printed with a failure: a page that
// throws inside an async view otherwise shows only as a wait that timed out.
let pageProblems = [];

async function run(browser, width, height) {
  const tag = `${width}x${height}`;
  // The phone size has a touch screen (taps as well as clicks).
  const context = await browser.newContext({ viewport: { width, height }, deviceScaleFactor: 1, hasTouch: width < 600 });
  if (apiKey) {
    await context.addInitScript((key) => localStorage.setItem('rill.apiKey', key), apiKey);
  }
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const problems = [];
  pageProblems = problems;
  page.on('console', (msg) => {
    if (msg.type() === 'error' || msg.type() === 'warning') problems.push(`console ${msg.type()}: ${msg.text()}`);
  });
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('response', async (res) => {
    if (res.status() >= 400) {
      let body = '';
      try {
        body = (await res.text()).slice(0, 300);
      } catch {
        /* gone */
      }
      problems.push(`HTTP ${res.status()} from ${res.request().method()} ${res.url()} ${res.request().postData() || ''}: ${body}`);
    }
  });
  const noProblems = (when) => check(problems.length === 0, `${tag}: console errors or warnings ${when}:\n  ${problems.join('\n  ')}`);
  const shot = async (view, fullPage = true) => {
    const file = path.join(out, `${view}-${width}.png`);
    await page.screenshot({ path: file, fullPage });
    ok(`${tag}: screenshot ${file}`);
  };
  const tab = async (view) => {
    await page.click(`[data-testid=tab-${view}]`);
    await page.waitForSelector(`[data-testid=panel-${view}]:not([hidden])`);
  };

  // ---------------------------------------------------------------- load
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForFunction(() => {
    const el = document.querySelector('[data-testid=model-info]');
    return el && (el.dataset.state === 'ready' || el.dataset.state === 'error');
  });
  const modelState = await page.getAttribute('[data-testid=model-info]', 'data-state');
  check(modelState === 'ready', `${tag}: /v1/rill/model did not load: ${await page.textContent('[data-testid=model-info]')}`);
  noProblems('on load');
  ok(`${tag}: page loads, model info shown, no console errors`);

  // every interactive control of the form is reachable with Tab
  const tabbable = await page.evaluate(() =>
    Array.from(document.querySelectorAll('#panel-generate input, #panel-generate button, #panel-generate textarea, #panel-generate select'))
      .filter((e) => !e.disabled && e.offsetParent !== null && e.tabIndex >= 0)
      .map((e) => e.id || e.dataset.testid || e.name),
  );
  const reached = new Set();
  await page.focus('[data-testid=prompt]');
  for (let i = 0; i < 40; i++) {
    await page.keyboard.press('Tab');
    const id = await page.evaluate(() => document.activeElement && (document.activeElement.id || document.activeElement.name));
    if (id) reached.add(id);
  }
  for (const id of ['f-max_tokens', 'f-temperature', 'f-top_k', 'f-top_p', 'f-min_p', 'f-repetition_penalty', 'f-presence_penalty', 'f-frequency_penalty', 'f-seed', 'f-stop', 'generate']) {
    check(reached.has(id), `${tag}: #${id} not reachable with Tab (reached: ${[...reached].join(', ')}; focusable: ${tabbable.join(', ')})`);
  }
  ok(`${tag}: the sampling controls and Generate are reachable with Tab`);

  // ---------------------------------------------------------------- generate
  await page.check('[data-testid=mode-chat]');
  await page.fill('[data-testid=prompt]', 'What is the capital of France?');
  await page.fill('[data-testid=f-max_tokens]', '12');
  await page.fill('[data-testid=f-temperature]', '0');
  await page.click('[data-testid=generate]');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid=gen-output] [data-testid=chip]').length >= 2);
  ok(`${tag}: chips stream in`);
  await page.waitForFunction(() => ['done', 'error', 'stopped'].includes(document.querySelector('[data-testid=gen-status]').dataset.state));
  const genState = await page.getAttribute('[data-testid=gen-status]', 'data-state');
  check(genState === 'done', `${tag}: generation ended as ${genState}: ${await page.textContent('[data-testid=gen-error]')}`);
  const chips = await page.$$eval('[data-testid=gen-output] [data-testid=chip]', (els) => els.map((e) => ({ token: Number(e.dataset.token), p: Number(e.dataset.p), bg: e.style.background })));
  check(chips.length >= 3 && chips.length <= 12, `${tag}: expected 3..12 chips, got ${chips.length}`);
  check(chips.every((c) => c.bg && c.p >= 0 && c.p <= 1), `${tag}: chips are not coloured by probability`);
  ok(`${tag}: generation done with ${chips.length} coloured chips`);
  // The reproducibility receipt: replaying the answer gives the same tokens, bit for bit.
  await page.waitForSelector('[data-testid=replay]');
  const receiptHref = await page.getAttribute('[data-testid=receipt-link]', 'href');
  check(/^\/v1\/rill\/receipts\/chatcmpl-/.test(receiptHref), `${tag}: the receipt link is ${receiptHref}`);
  await page.click('[data-testid=replay]');
  await page.waitForFunction(() => ['ready', 'error'].includes(document.querySelector('[data-testid=replay-result]').dataset.state));
  const replayed = await page.$eval('[data-testid=replay-result]', (e) => ({ state: e.dataset.state, identical: e.dataset.identical, text: e.textContent }));
  check(replayed.state === 'ready' && replayed.identical === 'true', `${tag}: the replay says ${replayed.text}`);
  ok(`${tag}: the answer's receipt replays:${replayed.text}`);
  await page.locator('[data-testid=gen-receipt]').scrollIntoViewIfNeeded();
  await shot('receipt', false);

  // ---------------------------------------------------------------- the tokenization tier
  await page.evaluate(() => {
    document.getElementById('prompt-tier').open = true;
  });
  await page.waitForFunction(() => document.querySelectorAll('[data-testid=prompt-tokens] [data-testid=prompt-token]').length > 0);
  const promptTokens = await page.$$eval('[data-testid=prompt-tokens] [data-testid=prompt-token]', (els) => els.map((e) => ({ special: e.dataset.special === 'true', text: e.textContent, title: e.title })));
  check(promptTokens.some((t) => t.special), `${tag}: the prompt shows no special token`);
  check(promptTokens.map((t) => t.text).join('').replace(/·/g, ' ').includes('capital of France'), `${tag}: the prompt's tokens do not spell the question`);
  check(promptTokens.every((t) => /id \d+ · bytes/.test(t.title)), `${tag}: a prompt token lacks its id and bytes`);
  const promptSummary = await page.textContent('[data-testid=prompt-summary]');
  check(new RegExp(`^${promptTokens.length} tokens`).test(promptSummary), `${tag}: the prompt summary says ${promptSummary}`);
  ok(`${tag}: the prompt tier shows ${promptTokens.length} tokens with their ids and bytes (${promptTokens.filter((t) => t.special).length} special)`);
  await page.evaluate(() => {
    document.getElementById('prompt-tier').open = false;
  });

  // ---------------------------------------------------------------- tooltip on hover
  const firstChip = page.locator('[data-testid=gen-output] [data-testid=chip]').first();
  await firstChip.hover();
  await page.waitForSelector('[data-testid=tooltip]:not([hidden])');
  const cands = await page.$$eval('[data-testid=tooltip] [data-testid=tooltip-candidates] tbody tr', (rows) => rows.length);
  check(cands >= 2, `${tag}: tooltip shows ${cands} candidates`);
  const tipText = await page.textContent('[data-testid=tooltip]');
  check(/greedy|sampled/.test(tipText) && /entropy/.test(tipText), `${tag}: tooltip lacks the rule or the entropy: ${tipText}`);
  check(!BAD_TEXT.test(tipText), `${tag}: the tooltip prints ${tipText.match(BAD_TEXT)}`);
  ok(`${tag}: hovering a chip shows ${cands} candidates, the rule and the entropy`);
  await shot('tooltip', false);
  await page.mouse.move(2, 2);
  // A chip in the middle of the window, where a tall tooltip fits neither below nor above it,
  // and one at the bottom edge: each tooltip stays inside the window.
  const lastChip = page.locator('[data-testid=gen-output] [data-testid=chip]').last();
  await lastChip.scrollIntoViewIfNeeded();
  await page.evaluate(() => {
    const chips = document.querySelectorAll('[data-testid=gen-output] [data-testid=chip]');
    const r = chips[chips.length - 1].getBoundingClientRect();
    window.scrollBy(0, (r.top + r.bottom) / 2 - window.innerHeight / 2);
  });
  await lastChip.hover();
  await page.waitForSelector('[data-testid=tooltip]:not([hidden])');
  const tipBox = await page.evaluate(() => {
    const r = document.querySelector('[data-testid=tooltip]').getBoundingClientRect();
    return { top: r.top, bottom: r.bottom, left: r.left, right: r.right, vh: window.innerHeight, vw: document.documentElement.clientWidth };
  });
  check(tipBox.top >= 0 && tipBox.bottom <= tipBox.vh && tipBox.left >= 0 && tipBox.right <= tipBox.vw, `${tag}: the tooltip leaves the window: ${JSON.stringify(tipBox)}`);
  ok(`${tag}: a middle chip's tooltip stays inside the window (${Math.round(tipBox.top)}-${Math.round(tipBox.bottom)} of ${tipBox.vh})`);
  await page.mouse.move(2, 2);
  await page.evaluate(() => window.scrollTo(0, 0));

  // ---------------------------------------------------------------- keyboard: Enter on a chip selects the step
  const kIndex = Math.min(2, chips.length - 1);
  await page.focus(`[data-testid=gen-output] [data-testid=chip][data-index="${kIndex}"]`);
  await page.waitForSelector('[data-testid=tooltip]:not([hidden])');
  await page.keyboard.press('Enter');
  await page.waitForFunction((i) => document.querySelector(`[data-testid=gen-output] [data-testid=chip][data-index="${i}"]`).getAttribute('aria-pressed') === 'true', kIndex);
  await page.waitForFunction(() => document.querySelector('[data-testid=viewer-bars]').dataset.state === 'ready');
  ok(`${tag}: focus shows the tooltip, Enter opens the step in the viewer`);
  // Activating a chip brings the viewer into view (it starts below the fold at both sizes).
  const viewerTop = () => page.$eval('[data-testid=viewer]', (e) => [e.getBoundingClientRect().top, window.innerHeight]);
  let [vTop, vh] = await viewerTop();
  check(vTop >= -1 && vTop <= vh / 2, `${tag}: after Enter on a chip the viewer's top is at ${vTop} px of ${vh}`);
  ok(`${tag}: activating a chip scrolls the viewer into view (top at ${Math.round(vTop)} px)`);
  if (width < 600) {
    // A tap shows the tooltip (there is no hover); a second tap on the chip opens its step.
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.mouse.move(2, 2);
    const tapChip = '[data-testid=gen-output] [data-testid=chip][data-index="1"]';
    const stepBefore = await page.textContent('[data-testid=viewer-step]');
    await page.tap(tapChip);
    await page.waitForSelector('[data-testid=tooltip]:not([hidden])');
    const hint = await page.textContent('[data-testid=tooltip-hint]');
    check(/Tap the token again/.test(hint), `${tag}: a tapped chip's tooltip says: ${hint}`);
    const tipBox = await page.$eval('[data-testid=tooltip]', (e) => { const r = e.getBoundingClientRect(); return [r.left, r.right, r.top, r.bottom, window.innerWidth, window.innerHeight]; });
    check(tipBox[0] >= 0 && tipBox[1] <= tipBox[4] && tipBox[2] >= 0 && tipBox[3] <= tipBox[5], `${tag}: the tapped tooltip leaves the window: ${tipBox}`);
    check((await page.textContent('[data-testid=viewer-step]')) === stepBefore, `${tag}: the first tap opened the step instead of showing its tooltip`);
    await page.tap(tapChip);
    await page.waitForFunction(() => document.querySelector('[data-testid=viewer-step]').textContent.includes('token 2 '));
    [vTop, vh] = await viewerTop();
    check(vTop >= -1 && vTop <= vh / 2, `${tag}: after the second tap the viewer's top is at ${vTop} px of ${vh}`);
    await page.tap('[data-testid=viewer-step]');
    await page.waitForSelector('[data-testid=tooltip]', { state: 'hidden' });
    ok(`${tag}: a tap shows a chip's tooltip inside the window, a second tap opens its step and reveals the viewer, a tap elsewhere hides the tooltip`);
  }

  // ---------------------------------------------------------------- viewer: click step 1 and reshape
  await firstChip.click();
  await page.waitForFunction(() => document.querySelector('[data-testid=viewer-step]').textContent.includes('token 1'));
  await page.waitForFunction(() => document.querySelector('[data-testid=viewer-bars]').dataset.state === 'ready');
  const bars = () =>
    page.$$eval('[data-testid=viewer-bars] [data-testid=bar]', (els) =>
      els.map((e) => ({ token: Number(e.dataset.token), raw: Number(e.dataset.raw), p: Number(e.dataset.p), cut: e.dataset.cut, chosen: e.classList.contains('chosen'), width: e.querySelector('.fill').style.width })),
    );
  let b = await bars();
  check(b.length >= 20, `${tag}: expected at least 20 bars, got ${b.length}`);
  check(b[0].chosen && b[0].token === chips[0].token, `${tag}: the chosen (greedy) token is not the highlighted first bar`);
  check(b.filter((x) => !x.cut).length === 1, `${tag}: at temperature 0 only one bar should be kept, got ${b.filter((x) => !x.cut).length}`);
  const engineCheck = await page.textContent('[data-testid=engine-check]');
  check(engineCheck.includes('✓'), `${tag}: the viewer disagrees with the engine: ${engineCheck}`);
  ok(`${tag}: viewer shows ${b.length} bars from the full distribution; greedy keeps one; agrees with the engine`);
  // The layers tier: the logit lens at this step; its last layer is the model's own choice.
  await page.waitForFunction(() => ['ready', 'error'].includes(document.querySelector('[data-testid=viewer-lens]').dataset.state));
  check((await page.getAttribute('[data-testid=viewer-lens]', 'data-state')) === 'ready', `${tag}: the logit lens did not load: ${await page.textContent('[data-testid=viewer-lens]')}`);
  const lensRows = await page.$$eval('[data-testid=viewer-lens] [data-testid=lens-row]', (els) => els.map((e) => ({ layer: Number(e.dataset.layer), top: Number(e.dataset.topToken) })));
  check(lensRows.length >= 2 && lensRows[0].layer === 0, `${tag}: the lens has ${lensRows.length} rows`);
  const lensOverflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  check(lensOverflow <= 1, `${tag}: with the lens open the page scrolls sideways by ${lensOverflow}px (the lens table should scroll inside its panel)`);
  check(lensRows[lensRows.length - 1].top === chips[0].token, `${tag}: the lens's last layer predicts ${lensRows[lensRows.length - 1].top}, the greedy chip is ${chips[0].token}`);
  const writes = await page.$$eval('[data-testid=viewer-lens] [data-testid=lens-writes]', (els) => els.map((e) => e.textContent));
  check(writes.length === lensRows.length && writes.slice(1).every((w) => /^[+-]\d+\.\d\d \/ [+-]\d+\.\d\d$/.test(w)), `${tag}: the lens's writes column reads ${writes.slice(0, 3)}`);
  ok(`${tag}: the logit lens shows ${lensRows.length} layers; the last one's top token is the chosen token`);
  await page.waitForSelector('[data-testid=viewer-lens] [data-testid=attn-token]');
  const attnWeights = async () => page.$$eval('[data-testid=attn-token]', (els) => els.map((e) => Number(e.dataset.weight)));
  const lastLayer = await attnWeights();
  const sum = lastLayer.reduce((a, w) => a + w, 0);
  check(lastLayer.length >= 2 && Math.abs(sum - 1) < 1e-3, `${tag}: the attention weights over ${lastLayer.length} tokens sum to ${sum}`);
  await page.$eval('[data-testid=attn-layer]', (el) => {
    el.value = '1';
    el.dispatchEvent(new Event('input', { bubbles: true }));
  });
  const firstLayer = await attnWeights();
  check(firstLayer.some((w, i) => Math.abs(w - lastLayer[i]) > 1e-6), `${tag}: moving the layer slider changed no weight`);
  ok(`${tag}: the attention view shades ${lastLayer.length} context tokens; the layer slider changes them`);
  // Value-weighted by default: shares of the view sum to 1, and differ from the raw weights.
  check((await page.$eval('[data-testid=attn-mode]', (el) => el.value)) === 'weighted', `${tag}: the attention view is not value-weighted by default`);
  const shares = async () => page.$$eval('[data-testid=attn-token]', (els) => els.map((e) => Number(e.dataset.share)));
  const weightedShares = await shares();
  check(Math.abs(weightedShares.reduce((a, x) => a + x, 0) - 1) < 1e-3, `${tag}: the value-weighted shares sum to ${weightedShares.reduce((a, x) => a + x, 0)}`);
  await page.selectOption('[data-testid=attn-mode]', 'raw');
  const rawShares = await shares();
  check(rawShares.some((x, i) => Math.abs(x - weightedShares[i]) > 1e-6), `${tag}: raw and value-weighted attention are the same`);
  await page.selectOption('[data-testid=attn-mode]', 'weighted');
  ok(`${tag}: attention is value-weighted by default; the raw weights are one switch away`);
  // The layers × heads overview: one square per head and layer; a click opens that head.
  const cells = await page.$$eval('[data-testid=head-cell]', (els) => els.map((e) => ({ layer: Number(e.dataset.layer), head: Number(e.dataset.head), logit: Number(e.dataset.logit) })));
  check(cells.length >= 2 && cells.every((c) => Number.isFinite(c.logit)), `${tag}: the heads overview has ${cells.length} squares`);
  const strongest = cells.reduce((a, c) => (Math.abs(c.logit) > Math.abs(a.logit) ? c : a));
  await page.click(`[data-testid=head-cell][data-layer="${strongest.layer}"][data-head="${strongest.head}"]`);
  const picked = await page.evaluate(() => [document.querySelector('[data-testid=attn-layer]').value, document.querySelector('[data-testid=attn-head]').value]);
  check(picked[0] === String(strongest.layer) && picked[1] === String(strongest.head), `${tag}: clicking layer ${strongest.layer} head ${strongest.head} opened ${picked}`);
  ok(`${tag}: the heads overview shows ${cells.length} heads; the strongest (layer ${strongest.layer}, head ${strongest.head}, ${strongest.logit.toFixed(2)}) opens its attention`);
  await page.locator('[data-testid=heads-grid]').scrollIntoViewIfNeeded();
  await shot('heads', false);
  // Counterfactuals: drop the strongest sources, one at a time.
  await page.click('[data-testid=cf-run]');
  await page.waitForFunction(() => ['ready', 'error'].includes(document.querySelector('[data-testid=counterfactuals]').dataset.state));
  check((await page.getAttribute('[data-testid=counterfactuals]', 'data-state')) === 'ready', `${tag}: the counterfactuals failed: ${await page.textContent('[data-testid=cf-note]')}`);
  const cfRows = await page.$$eval('[data-testid=cf-row]', (els) => els.map((e) => ({ position: Number(e.dataset.position), p: Number(e.dataset.p) })));
  check(cfRows.length >= 1 && cfRows.length <= 5 && cfRows.every((r) => r.p >= 0 && r.p <= 1), `${tag}: ${cfRows.length} counterfactual rows`);
  ok(`${tag}: dropping the ${cfRows.length} strongest sources gives p(choice) ${cfRows.map((r) => r.p.toFixed(3)).join(', ')}`);
  // Replacing a token: one token of the vocabulary in another's place; more than one is refused.
  const lastPos = await page.$eval('[data-testid=cf-replace-position]', (e) => e.value);
  await page.fill('[data-testid=cf-replace-text]', ' red');
  await page.click('[data-testid=cf-replace-run]');
  await page.waitForFunction(() => document.querySelector('[data-testid=cf-row][data-replaced]') || document.querySelector('[data-testid=counterfactuals]').dataset.state === 'error');
  check((await page.getAttribute('[data-testid=counterfactuals]', 'data-state')) !== 'error', `${tag}: the replacement failed: ${await page.textContent('[data-testid=cf-note]')}`);
  const replaced = await page.$eval('[data-testid=cf-row][data-replaced]', (e) => ({ position: e.dataset.position, text: e.textContent, p: Number(e.dataset.p) }));
  check(replaced.position === lastPos && /→/.test(replaced.text) && /red/.test(replaced.text) && replaced.p >= 0 && replaced.p <= 1, `${tag}: the replacement row reads ${JSON.stringify(replaced)}`);
  await page.fill('[data-testid=cf-replace-text]', ' extraordinarily unbelievable');
  await page.click('[data-testid=cf-replace-run]');
  await page.waitForFunction(() => document.querySelector('[data-testid=counterfactuals]').dataset.state === 'error');
  check(/must be one token/.test(await page.textContent('[data-testid=cf-note]')), `${tag}: a two-token replacement is not refused clearly`);
  ok(`${tag}: replacing the token at @${lastPos} with " red" gives p(choice) ${replaced.p.toFixed(3)}; a replacement of several tokens is refused`);
  await page.locator('[data-testid=counterfactuals]').scrollIntoViewIfNeeded();
  await shot('counterfactuals', false);
  await page.locator('[data-testid=attn-text]').scrollIntoViewIfNeeded();
  await shot('attention', false);
  await page.locator('[data-testid=viewer-lens]').scrollIntoViewIfNeeded();
  await shot('lens', false);

  const setSlider = (name, value) =>
    page.$eval(
      `[data-testid=vw-${name}]`,
      (el, v) => {
        el.value = String(v);
        el.dispatchEvent(new Event('input', { bubbles: true }));
      },
      value,
    );
  const settle = () => page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  await setSlider('temperature', 1);
  await settle();
  const atT1 = await bars();
  const keptT1 = atT1.filter((x) => !x.cut).length;
  check(keptT1 === atT1.length, `${tag}: at temperature 1 with no other rule every bar should be kept (${keptT1}/${atT1.length})`);
  check(atT1.every((x) => Math.abs(x.p - x.raw) < 1e-9), `${tag}: at temperature 1 the reshaped probabilities should equal the raw ones`);
  await setSlider('temperature', 2);
  await settle();
  const atT2 = await bars();
  check(atT2[0].p < atT1[0].p - 1e-6 && atT2[0].width !== atT1[0].width, `${tag}: temperature 2 did not lower the top bar (${atT1[0].p} -> ${atT2[0].p})`);
  const ratio = (xs) => xs[0].p / xs[xs.length - 1].p;
  check(ratio(atT2) < ratio(atT1), `${tag}: temperature 2 did not flatten the bars (top/last ${ratio(atT1)} -> ${ratio(atT2)})`);
  ok(`${tag}: temperature 1 -> 2 flattens the bars (top ${atT1[0].p.toFixed(4)} -> ${atT2[0].p.toFixed(4)})`);
  await setSlider('top_k', 1);
  await settle();
  const atK1 = await bars();
  const keptK1 = atK1.filter((x) => !x.cut);
  check(keptK1.length === 1 && Math.abs(keptK1[0].p - 1) < 1e-12, `${tag}: top-k 1 keeps ${keptK1.length} bars`);
  check(atK1.slice(1).every((x) => x.cut === 'top-k'), `${tag}: top-k 1 does not mark the others "top-k"`);
  const cutLabels = await page.$$eval('[data-testid=viewer-bars] [data-testid=cut-label]', (els) => els.filter((e) => e.textContent.includes('cut by top-k')).length);
  check(cutLabels === atK1.length - 1, `${tag}: ${cutLabels} "cut by top-k" labels for ${atK1.length - 1} cut bars`);
  const massLine = await page.textContent('[data-testid=mass-line]');
  check(/Cut: 49,?151 of/.test(massLine) || /Cut: \d/.test(massLine), `${tag}: the mass line is missing: ${massLine}`);
  ok(`${tag}: top-k 1 keeps one bar and marks ${cutLabels} "cut by top-k"`);
  await setSlider('top_k', 0);
  await setSlider('top_p', 0.5);
  await settle();
  const atP = await bars();
  // Top-p 0.5 cuts tokens: among the bars shown, or (when the bars kept hold less than half the
  // mass) past them, which the mass line counts.
  const massAtP = await page.textContent('[data-testid=mass-line]');
  check(atP.some((x) => x.cut === 'top-p') || /Cut: [1-9]/.test(massAtP), `${tag}: top-p 0.5 changed nothing (${massAtP})`);
  await setSlider('top_p', 1);
  await setSlider('min_p', 0.2);
  await settle();
  const atM = await bars();
  check(atM.some((x) => x.cut === 'min-p'), `${tag}: min-p 0.2 cut nothing`);
  ok(`${tag}: top-p and min-p cut (${atP.filter((x) => x.cut === 'top-p').length} and ${atM.filter((x) => x.cut === 'min-p').length} bars)`);
  await noBadText(page, '[data-testid=viewer]', tag);
  await page.evaluate(() => document.activeElement && document.activeElement.blur());
  await shot('generate');
  await page.click('[data-testid=vw-reset]');
  await settle();
  const sliders = await page.evaluate(() => ['temperature', 'top_k', 'top_p', 'min_p'].map((n) => document.querySelector(`[data-testid=vw-${n}]`).value));
  check(sliders.join(',') === '0,0,1,0', `${tag}: reset did not restore the generation's values: ${sliders}`);
  noProblems('after the viewer');

  // ---------------------------------------------------------------- fork
  const alt = atT1.find((x) => !x.chosen);
  await page.click(`[data-testid=viewer-bars] [data-testid=bar][data-token="${alt.token}"] [data-testid=fork]`);
  await page.waitForSelector('[data-testid=panel-tree]:not([hidden])');
  const card = page.locator('[data-testid=branch-card][data-branch="1"]');
  await card.waitFor();
  const altTok = await card.locator('[data-testid=alt-chip]').getAttribute('data-token');
  check(Number(altTok) === alt.token, `${tag}: the fork's first token is ${altTok}, not the chosen ${alt.token}`);
  await page.waitForFunction(() => {
    const c = document.querySelector('[data-testid=branch-card][data-branch="1"]');
    return c && c.querySelectorAll('[data-testid=chip]').length >= 2;
  });
  await page.waitForFunction(() => {
    const s = document.querySelector('[data-testid=branch-card][data-branch="1"] [data-testid=branch-status]');
    return s && ['done', 'error', 'stopped'].includes(s.dataset.state);
  });
  const forkState = await card.locator('[data-testid=branch-status]').getAttribute('data-state');
  check(forkState === 'done', `${tag}: the fork ended as ${forkState}: ${await card.locator('[data-testid=branch-status]').textContent()}`);
  const forkChips = await card.locator('[data-testid=chip]').count();
  const cached = await card.locator('[data-testid=branch-cached]').textContent();
  check(/cached \d+ of \d+/.test(cached), `${tag}: the fork shows no cached tokens: "${cached}"`);
  const cachedN = Number(await card.locator('[data-testid=branch-cached]').getAttribute('data-cached'));
  // The tree is redrawn on the next animation frame after a token (the card's status is set at
  // once): wait for that frame's drawing, then count.
  const wantNodes = chips.length + 1 + forkChips;
  await page
    .waitForFunction((n) => document.querySelectorAll('[data-testid=tree-svg] [data-testid=tree-node]').length >= n, wantNodes)
    .catch(() => {});
  const treeNodes = await page.locator('[data-testid=tree-svg] [data-testid=tree-node]').count();
  check(treeNodes >= wantNodes, `${tag}: the tree draws ${treeNodes} nodes for ${chips.length} + 1 + ${forkChips} tokens`);
  ok(`${tag}: fork at token 1 with ${JSON.stringify(alt.token)} -> branch starts with it, ${forkChips} more chips, ${cached}; tree has ${treeNodes} nodes`);
  if (cachedN === 0) console.log(`note ${tag}: the fork reused no cached tokens`);

  // fork the fork: a second-level branch from the fork's first own token
  await card.locator('[data-testid=chip]').first().click();
  await page.waitForFunction(() => document.querySelector('[data-testid=viewer-bars]').dataset.state === 'ready');
  const fb = await bars();
  const alt2 = fb.find((x) => !x.chosen);
  await page.click(`[data-testid=viewer-bars] [data-testid=bar][data-token="${alt2.token}"] [data-testid=fork]`);
  const card2 = page.locator('[data-testid=branch-card][data-branch="2"]');
  await card2.waitFor();
  await page.waitForFunction(() => {
    const s = document.querySelector('[data-testid=branch-card][data-branch="2"] [data-testid=branch-status]');
    return s && ['done', 'error', 'stopped'].includes(s.dataset.state);
  });
  check((await card2.locator('[data-testid=alt-chip]').getAttribute('data-token')) === String(alt2.token), `${tag}: the second fork does not start with its chosen token`);
  await noBadText(page, '[data-testid=panel-tree]', tag);
  ok(`${tag}: a fork of the fork works`);
  await page.locator('[data-testid=tree-svg-wrap]').scrollIntoViewIfNeeded();
  await shot('tree');
  noProblems('after forking');

  // ---------------------------------------------------------------- beam
  await tab('beam');
  await page.fill('[data-testid=beam-width]', '3');
  await page.fill('[data-testid=beam-max_tokens]', '6');
  await page.click('[data-testid=beam-run]');
  await page.waitForFunction(() => ['done', 'error'].includes(document.querySelector('[data-testid=beam-status]').dataset.state));
  check((await page.getAttribute('[data-testid=beam-status]', 'data-state')) === 'done', `${tag}: ${await page.textContent('[data-testid=beam-status]')}`);
  const beamCounts = () =>
    page.evaluate(() => ({
      drawn: document.querySelectorAll('[data-testid=beam-svg] [data-testid=beam-node]').length,
      pruned: document.querySelectorAll('[data-testid=beam-svg] [data-testid=beam-node][data-status=pruned]').length,
      summarized: [...document.querySelectorAll('[data-testid=beam-pruned-summary]')].reduce((a, e) => a + Number(e.dataset.count), 0),
      height: document.querySelector('[data-testid=beam-svg]').getBoundingClientRect().height,
    }));
  // Pruned candidates start collapsed into one node per step; the toggle draws them all.
  const collapsed = await beamCounts();
  const hyps = await page.locator('[data-testid=beam-hyp]').count();
  check(collapsed.drawn >= 6 && hyps >= 1 && collapsed.pruned === 0 && collapsed.summarized > 0, `${tag}: beam view drew ${JSON.stringify(collapsed)} and ${hyps} hypotheses`);
  await page.click('[data-testid=beam-toggle-pruned]');
  const expanded = await beamCounts();
  check(expanded.pruned === collapsed.summarized && expanded.drawn === collapsed.drawn + collapsed.summarized && expanded.height > collapsed.height, `${tag}: expanding the pruned candidates drew ${JSON.stringify(expanded)} after ${JSON.stringify(collapsed)}`);
  const beamNodes = expanded.drawn;
  await page.click('[data-testid=beam-toggle-pruned]');
  await noBadText(page, '[data-testid=panel-beam]', tag);
  ok(`${tag}: beam search draws ${beamNodes} nodes and ${hyps} hypotheses; its ${collapsed.summarized} pruned candidates collapse into one node per step (${Math.round(collapsed.height)} px tall, ${Math.round(expanded.height)} px expanded)`);
  await shot('beam');

  // ---------------------------------------------------------------- speculative
  await tab('speculative');
  await page.click('[data-testid=spec-copying]');
  await page.fill('[data-testid=spec-max_tokens]', '16');
  await page.click('[data-testid=spec-run]');
  await page.waitForFunction(() => ['done', 'error'].includes(document.querySelector('[data-testid=spec-status]').dataset.state));
  check((await page.getAttribute('[data-testid=spec-status]', 'data-state')) === 'done', `${tag}: ${await page.textContent('[data-testid=spec-status]')}`);
  const rounds = await page.locator('[data-testid=spec-round]').count();
  check(rounds >= 1, `${tag}: speculative view shows ${rounds} rounds`);
  const summaryText = await page.textContent('[data-testid=spec-summary]');
  check(/acceptance/.test(summaryText), `${tag}: no acceptance rate shown`);
  await noBadText(page, '[data-testid=panel-speculative]', tag);
  ok(`${tag}: speculative decoding shows ${rounds} rounds`);
  await shot('speculative');

  // ---------------------------------------------------------------- cost
  await tab('cost');
  await page.selectOption('[data-testid=cost-branch]', '0');
  await page.waitForSelector('[data-testid=cost-timeline]');
  const latencyBars = await page.locator('[data-testid=cost-timeline] [data-testid=latency-bar]').count();
  check(latencyBars === chips.length, `${tag}: the timeline has ${latencyBars} bars for ${chips.length} tokens`);
  for (const id of ['cost-kv', 'cost-bytes', 'cost-batch', 'cost-time']) {
    check((await page.locator(`[data-testid=${id}]`).count()) === 1, `${tag}: cost view lacks ${id}`);
  }
  await noBadText(page, '[data-testid=panel-cost]', tag);
  // Every chart's labels stay clear of its axes and of each other, and inside the chart; the
  // batch chart's row axis counts whole rows (no "1 / 1 / 0").
  const charts = await page.$$eval('[data-testid=panel-cost] svg.chart', (svgs) =>
    svgs.map((svg) => {
      const box = (e) => e.getBoundingClientRect();
      const lines = [...svg.querySelectorAll('line.axis')].map(box);
      const yAxis = lines.find((r) => r.width < 1.5);
      const xAxis = lines.find((r) => r.height < 1.5);
      const chart = box(svg);
      const labels = [...svg.querySelectorAll('text.lbl')].map((t) => ({ text: t.textContent, r: box(t), y: t.dataset.axis === 'y', x: t.dataset.axis === 'x' }));
      const problems = [];
      for (const l of labels) {
        if (l.r.left < chart.left - 0.5 || l.r.right > chart.right + 0.5 || l.r.top < chart.top - 0.5 || l.r.bottom > chart.bottom + 0.5) problems.push(`${l.text} leaves the chart`);
        if (l.y && l.r.right > yAxis.left - 1) problems.push(`${l.text} crosses the y axis`);
        if (l.x && l.r.top < xAxis.bottom) problems.push(`${l.text} crosses the x axis`);
      }
      const ys = labels.filter((l) => l.y);
      for (let i = 0; i < ys.length; i++) for (let j = i + 1; j < ys.length; j++) if (ys[i].r.bottom > ys[j].r.top && ys[j].r.bottom > ys[i].r.top) problems.push(`${ys[i].text} overlaps ${ys[j].text}`);
      return { id: svg.dataset.testid, ticks: ys.map((l) => l.text), problems };
    }),
  );
  for (const c of charts) check(c.problems.length === 0, `${tag}: chart ${c.id}: ${c.problems.join('; ')}`);
  const batchTicks = charts.find((c) => c.id === 'cost-batch').ticks;
  check(new Set(batchTicks).size === batchTicks.length && batchTicks.every((t) => /^\d+$/.test(t)), `${tag}: the batch chart's axis reads ${batchTicks.join(' / ')}`);
  ok(`${tag}: ${charts.length} charts keep their labels clear of the axes and each other; the batch axis reads ${batchTicks.join(' / ')}`);
  // The prefill-versus-decode sentence stays true below 1 and says when the cache served.
  const sentences = await page.evaluate(async () => {
    const m = await import('/js/cost.js');
    return [m.prefillSentence(12, 0), m.prefillSentence(0.8, 5), m.prefillSentence(1, 0)];
  });
  check(sentences[0].includes('12.0× faster'), `${tag}: ${sentences[0]}`);
  check(sentences[1].includes('1.3× slower') && sentences[1].includes('5 of its tokens came from the prefix cache') && !sentences[1].includes('faster'), `${tag}: ${sentences[1]}`);
  check(sentences[2].includes('about as fast'), `${tag}: ${sentences[2]}`);
  ok(`${tag}: cost view draws the latency timeline (${latencyBars} bars), KV, bytes and batch charts; the prefill sentence says slower below 1`);
  await shot('cost');

  // ---------------------------------------------------------------- the multiverse
  await tab('multiverse');
  await page.$eval('[data-testid=mv-threshold]', (el) => {
    el.value = '1';
    el.dispatchEvent(new Event('input', { bubbles: true }));
  });
  await page.fill('[data-testid=mv-max_tokens]', '8');
  await page.fill('[data-testid=mv-branch_tokens]', '4');
  await page.fill('[data-testid=mv-max_branches]', '3');
  await page.click('[data-testid=mv-run]');
  await page.waitForFunction(() => ['done', 'error'].includes(document.querySelector('[data-testid=mv-status]').dataset.state));
  check((await page.getAttribute('[data-testid=mv-status]', 'data-state')) === 'done', `${tag}: the multiverse failed: ${await page.textContent('[data-testid=mv-status]')}`);
  const mvBranches = await page.$$eval('[data-testid=mv-branch]', (els) => els.map((e) => Number(e.dataset.branch)));
  check(mvBranches.length >= 2, `${tag}: the multiverse made ${mvBranches.length - 1} branches at threshold 1`);
  const widths = await page.$$eval('[data-testid=mv-edge]', (els) => els.map((e) => Number(e.dataset.width)));
  check(widths.length > 0 && widths.every((w) => w >= 1 && w <= 14.001), `${tag}: multiverse edge widths ${widths.slice(0, 5)}`);
  await page.click('[data-testid=mv-branch][data-branch="1"]');
  await page.waitForSelector('[data-testid=mv-continue]');
  const edgesBefore = await page.locator('[data-testid=mv-edge][data-branch="1"]').count();
  await page.click('[data-testid=mv-continue]');
  await page.waitForFunction((n) => document.querySelectorAll('[data-testid=mv-edge][data-branch="1"]').length > n, edgesBefore);
  await page.click('[data-testid=mv-compare]');
  await page.click('[data-testid=mv-branch][data-branch="0"]');
  await page.click('[data-testid=mv-compare]');
  const columns = await page.$$eval('[data-testid=mv-column]', (els) => els.map((e) => Number(e.dataset.branch)));
  check(columns.length === 2 && columns.includes(0) && columns.includes(1), `${tag}: the comparison shows branches ${columns}`);
  await noBadText(page, '[data-testid=panel-multiverse]', tag);
  ok(`${tag}: the multiverse draws ${mvBranches.length - 1} branches by path probability; a branch continues and compares side by side`);
  await shot('multiverse', false);

  // ---------------------------------------------------------------- the whole server, live
  // The engine is held while two clients start, then stepped until both hold KV blocks (however
  // fast either side is); the view is re-read after each step, not on a timer.
  await tab('server');
  await page.waitForSelector('[data-testid=kv-grid]');
  await engine('pause');
  await page.fill('[data-testid=server-n]', '2');
  await page.click('[data-testid=server-clients]');
  const holders = () =>
    page.evaluate(async () => {
      await window.rillGlassBox.server.refresh();
      return new Set([...document.querySelectorAll('[data-testid=kv-block][data-state=used]')].map((e) => e.dataset.request)).size;
    });
  let held = 0;
  for (let i = 0; i < 500 && held < 2; i++) {
    await engine('step');
    held = await holders();
  }
  check(held >= 2, `${tag}: the server view shows blocks of ${held} requests`);
  const listed = await page.locator('[data-testid=server-request]').count();
  check(listed >= 2, `${tag}: the server view lists ${listed} requests`);
  const parts = await page.locator('[data-testid=server-timeline] [data-testid=step-part]').count();
  check(parts >= 1, `${tag}: the timeline draws no step`);
  await noBadText(page, '[data-testid=panel-server]', tag);
  ok(`${tag}: the server view shows the KV blocks of ${held} concurrent requests and ${parts} step parts`);
  const legendItems = await page.$$eval('[data-testid=kv-legend-item]', (els) =>
    els.map((e) => {
      const r = e.getBoundingClientRect();
      const sw = e.firstElementChild.getBoundingClientRect();
      return { text: e.textContent, height: r.height, swatchInside: sw.top >= r.top - 1 && sw.bottom <= r.bottom + 1 && sw.left >= r.left - 1 };
    }),
  );
  check(legendItems.length >= 4 && legendItems.every((l) => l.height < 30 && l.swatchInside), `${tag}: a KV legend swatch is parted from its words: ${JSON.stringify(legendItems)}`);
  ok(`${tag}: the KV legend keeps each swatch with its words (${legendItems.length} entries)`);
  await shot('server', false);
  await engine('resume');
  await page.waitForFunction(() => document.querySelector('[data-testid=server-client-count]').dataset.running === '0');
  const after = await page.evaluate(async () => {
    await window.rillGlassBox.server.refresh();
    return {
      used: document.querySelectorAll('[data-testid=kv-block][data-state=used]').length,
      finished: document.querySelectorAll('[data-testid=loop-event][data-kind=finished]').length,
    };
  });
  check(after.used === 0 && after.finished >= 2, `${tag}: after the clients ended, ${after.used} blocks are still used, ${after.finished} requests finished`);
  ok(`${tag}: when the clients end their blocks are freed (${after.finished} finished on the timeline)`);
  // An idle arena: long runs of free blocks are one summary each, not thousands of squares.
  const arena = await page.evaluate(async () => {
    await window.rillGlassBox.server.refresh();
    const kv = { blocks: Number(/of (\d+) blocks in use/.exec(document.querySelector('[data-testid=kv-summary]').textContent)[1]) };
    const runs = [...document.querySelectorAll('[data-testid=kv-grid] [data-testid=kv-free-run]')].map((e) => Number(e.dataset.count));
    const squares = document.querySelectorAll('[data-testid=kv-grid] [data-testid=kv-block]').length;
    return { blocks: kv.blocks, runs, squares };
  });
  const summarized = arena.runs.reduce((a, n) => a + n, 0);
  check(arena.runs.length >= 1 && summarized + arena.squares === arena.blocks && arena.squares < 200, `${tag}: the idle KV map: ${JSON.stringify({ ...arena, runs: arena.runs.length, summarized })}`);
  ok(`${tag}: the idle KV map draws ${arena.squares} squares and ${arena.runs.length} summaries for ${arena.blocks} blocks`);

  // ---------------------------------------------------------------- layout and a clean console
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  check(overflow <= 1, `${tag}: the page scrolls sideways by ${overflow}px`);
  if (width < 600) {
    const stacked = await page.evaluate(() => {
      document.querySelector('[data-testid=tab-generate]').click();
      const a = document.querySelector('[data-testid=gen-form]').getBoundingClientRect();
      const v = document.querySelector('[data-testid=viewer]').getBoundingClientRect();
      return v.top >= a.bottom - 1;
    });
    check(stacked, `${tag}: the panels do not stack`);
    ok(`${tag}: panels stack, no sideways scrolling`);
  } else {
    ok(`${tag}: no sideways scrolling`);
  }
  // ---------------------------------------------------------------- a sampled generation: the viewer matches the engine
  if (width >= 600) {
    await tab('generate');
    await page.check('[data-testid=mode-completion]');
    await page.fill('[data-testid=prompt]', 'The sky is blue because');
    await page.fill('[data-testid=f-max_tokens]', '4');
    await page.fill('[data-testid=f-temperature]', '0.8');
    await page.fill('[data-testid=f-top_k]', '40');
    await page.fill('[data-testid=f-top_p]', '0.9');
    await page.fill('[data-testid=f-min_p]', '0.05');
    await page.fill('[data-testid=f-seed]', '7');
    await page.click('[data-testid=generate]');
    await page.waitForFunction(() => ['done', 'error', 'stopped'].includes(document.querySelector('[data-testid=gen-status]').dataset.state));
    const n = await page.locator('[data-testid=gen-output] [data-testid=chip]').count();
    for (let i = 0; i < n; i++) {
      await page.click(`[data-testid=gen-output] [data-testid=chip][data-index="${i}"]`);
      await page.waitForFunction((k) => document.querySelector('[data-testid=viewer-step]').textContent.includes(`token ${k + 1} `) && document.querySelector('[data-testid=viewer-bars]').dataset.state === 'ready', i);
      const line = await page.textContent('[data-testid=engine-check]');
      check(line.includes('✓'), `${tag}: sampled step ${i + 1}: ${line}`);
      // The draw, literally: the uniform's marker lies inside the chosen token's interval.
      const draw = await page.$eval('[data-testid=viewer-draw]', (e) => {
        const bar = e.querySelector('.draw-bar').getBoundingClientRect();
        const chosen = e.querySelector('[data-testid=draw-chosen]').getBoundingClientRect();
        const u = e.querySelector('[data-testid=draw-u]').getBoundingClientRect();
        return { u: Number(e.dataset.uniform), from: Number(e.dataset.from), to: Number(e.dataset.to), bar: [bar.left, bar.right], chosen: [chosen.left, chosen.right], mark: u.left + u.width / 2, caption: e.querySelector('figcaption').textContent };
      });
      check(draw.from <= draw.u && draw.u < draw.to, `${tag}: sampled step ${i + 1}: u ${draw.u} is outside [${draw.from}, ${draw.to})`);
      check(draw.mark >= draw.chosen[0] - 1.5 && draw.mark <= draw.chosen[1] + 1.5 && draw.chosen[0] >= draw.bar[0] - 1 && draw.chosen[1] <= draw.bar[1] + 1, `${tag}: sampled step ${i + 1}: the marker at ${draw.mark} px is not drawn in the chosen interval ${draw.chosen}`);
      check(/in the order the sampler lists them/.test(draw.caption) && /not sorted by probability/.test(draw.caption), `${tag}: the draw's caption does not say whose order it is: ${draw.caption}`);
    }
    await page.locator('[data-testid=viewer-draw]').scrollIntoViewIfNeeded();
    await shot('draw', false);
    // The layer views follow the chip's chosen token (here a sampled one the model did not rank
    // first), with a switch to the most likely one; each says which it shows.
    const lastChip = await page.$eval(`[data-testid=gen-output] [data-testid=chip][data-index="${n - 1}"]`, (e) => Number(e.dataset.token));
    await page.waitForFunction(() => document.querySelector('[data-testid=viewer-lens]').dataset.state === 'ready');
    const following = await page.$eval('[data-testid=lens-following]', (e) => ({ mode: e.dataset.following, token: Number(e.dataset.token), text: e.textContent }));
    check(following.mode === 'chosen' && following.token === lastChip, `${tag}: the lens follows ${JSON.stringify(following)}, the chip's token is ${lastChip}`);
    const lensTop = await page.$$eval('[data-testid=viewer-lens] [data-testid=lens-row]', (els) => Number(els[els.length - 1].dataset.topToken));
    check(lensTop !== lastChip, `${tag}: the last sampled token (${lastChip}) was also the most likely: this check needs one that was not`);
    check(/drawn at random; the model's most likely token was/.test(following.text), `${tag}: the lens does not say what it follows: ${following.text}`);
    const settled = await page.textContent('[data-testid=viewer-lens] .explain');
    check(/is not the most likely token even at the last layer/.test(settled), `${tag}: the lens's sentence for a sampled token reads: ${settled}`);
    await page.locator('[data-testid=lens-following]').scrollIntoViewIfNeeded();
    await shot('lens-follows-chosen', false);
    await page.check('[data-testid=lens-follow-most-likely]');
    await page.waitForFunction(() => {
      const e = document.querySelector('[data-testid=lens-following]');
      return document.querySelector('[data-testid=viewer-lens]').dataset.state === 'ready' && e && e.dataset.following === 'most-likely';
    });
    const followingTop = await page.$eval('[data-testid=lens-following]', (e) => Number(e.dataset.token));
    check(followingTop === lensTop, `${tag}: switched to the most likely token, the lens follows ${followingTop}, not ${lensTop}`);
    await page.check('[data-testid=lens-follow-chosen]');
    await page.waitForFunction((t) => {
      const e = document.querySelector('[data-testid=lens-following]');
      return document.querySelector('[data-testid=viewer-lens]').dataset.state === 'ready' && e && Number(e.dataset.token) === t;
    }, lastChip);
    ok(`${tag}: the layer views follow the sampled token (not the most likely), switch to the most likely one and back, and say which they show`);
    ok(`${tag}: sampled generation (T 0.8, top-k 40, top-p 0.9, min-p 0.05): the viewer's probability of each of ${n} chosen tokens matches the engine's, and its draw bar puts u in the chosen interval`);
    await page.hover('[data-testid=gen-output] [data-testid=chip][data-index="0"]');
    await page.waitForSelector('[data-testid=tooltip]:not([hidden])');
    const drawText = await page.textContent('[data-testid=tooltip]');
    check(/the generator drew u = 0\.\d{4}, which fell in \[0\.\d{4}, [01]\.\d{4}\)/.test(drawText), `${tag}: the tooltip does not show the draw: ${drawText}`);
    await page.mouse.move(2, 2);
    ok(`${tag}: a sampled chip's tooltip shows the uniform drawn and the interval it fell in`);

    // Stop aborts a long generation. The engine is held between steps, so the generation is
    // still running when Stop is clicked however fast either side is: step until the request
    // holds KV blocks (its prompt and first token), then once more (a second token).
    await page.fill('[data-testid=f-max_tokens]', '400');
    await page.fill('[data-testid=prompt]', 'Once upon a time');
    await engine('pause');
    await page.click('[data-testid=generate]');
    while ((await engine('step')) === 0) {}
    await engine('step');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid=gen-output] [data-testid=chip]').length >= 2);
    await page.click('[data-testid=stop]');
    await engine('resume');
    await page.waitForFunction(() => document.querySelector('[data-testid=gen-status]').dataset.state !== 'streaming');
    const stopped = await page.getAttribute('[data-testid=gen-status]', 'data-state');
    const got = await page.locator('[data-testid=gen-output] [data-testid=chip]').count();
    check(stopped === 'stopped' && got < 400, `${tag}: Stop left the generation ${stopped} with ${got} tokens`);
    ok(`${tag}: Stop aborts the stream after ${got} tokens`);

    // Chat mode sends the optional system message before the user's; completion mode hides it
    check(await page.isHidden('[data-testid=system]'), `${tag}: the system message shows in completion mode`);
    await page.check('[data-testid=mode-chat]');
    await page.fill('[data-testid=system]', 'Answer in one word.');
    await page.fill('[data-testid=f-max_tokens]', '3');
    const sent = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
    await page.click('[data-testid=generate]');
    const body = JSON.parse((await sent).postData());
    check(
      body.messages.length === 2 && body.messages[0].role === 'system' && body.messages[0].content === 'Answer in one word.' && body.messages[1].role === 'user',
      `${tag}: chat request messages ${JSON.stringify(body.messages)}`,
    );
    await page.waitForFunction(() => ['done', 'error', 'stopped'].includes(document.querySelector('[data-testid=gen-status]').dataset.state));
    check((await page.getAttribute('[data-testid=gen-status]', 'data-state')) === 'done', `${tag}: the chat with a system message did not finish`);
    ok(`${tag}: a chat with a system message streams`);
  }

  // ---------------------------------------------------------------- structured output
  // A choice constraint: its first token is picked among the few it allows, the rest are
  // forced; the viewer applies the constraint before its sliders and marks what it cut; a fork
  // from an allowed alternative continues inside the constraint.
  await tab('generate');
  await page.check('[data-testid=mode-chat]');
  await page.fill('[data-testid=system]', '');
  await page.evaluate(() => {
    document.getElementById('constraint-box').open = true;
  });
  await page.selectOption('[data-testid=f-constraint]', 'choice');
  await page.fill('[data-testid=f-constraint_value]', 'positive review\nnegative review');
  await page.fill('[data-testid=prompt]', 'I loved this film. Is this review positive or negative?');
  await page.fill('[data-testid=f-max_tokens]', '10');
  await page.fill('[data-testid=f-temperature]', '0');
  await page.click('[data-testid=generate]');
  await page.waitForFunction(() => ['done', 'error', 'stopped'].includes(document.querySelector('[data-testid=gen-status]').dataset.state));
  check((await page.getAttribute('[data-testid=gen-status]', 'data-state')) === 'done', `${tag}: the constrained generation did not finish: ${await page.textContent('[data-testid=gen-error]')}`);
  const cchips = await page.$$eval('[data-testid=gen-output] [data-testid=chip]', (els) => els.map((e) => ({ token: Number(e.dataset.token), forced: e.dataset.forced === 'true' })));
  check(cchips.length >= 2 && !cchips[0].forced && cchips.slice(1).every((c) => c.forced), `${tag}: a choice should pick its first token and force the rest: ${JSON.stringify(cchips)}`);
  ok(`${tag}: a choice-constrained generation picks 1 token and the constraint forces ${cchips.length - 1}`);
  const missing = await page.textContent('[data-testid=gen-receipt]');
  check(/no reproducibility receipt: receipts record unconstrained generations only/.test(missing), `${tag}: a constrained answer's receipt line reads: ${missing}`);
  ok(`${tag}: a constrained answer says why it has no receipt`);
  await page.hover('[data-testid=gen-output] [data-testid=chip][data-index="1"]');
  await page.waitForSelector('[data-testid=tooltip]:not([hidden])');
  const forcedTip = await page.textContent('[data-testid=tooltip]');
  check(/forced by the choice constraint/.test(forcedTip) && !/sampled at random/.test(forcedTip), `${tag}: a forced chip's tooltip reads: ${forcedTip}`);
  await page.mouse.move(2, 2);
  check(/forced by the constraint/.test(await page.textContent('.legend')), `${tag}: the legend does not explain the dashed outline`);
  ok(`${tag}: a forced chip reads "forced by the constraint"; the legend explains the dashed outline`);
  const constrainedChip = page.locator('[data-testid=gen-output] [data-testid=chip]').first();
  await constrainedChip.hover();
  await page.waitForSelector('[data-testid=tooltip] [data-testid=tooltip-constraint]');
  const ctip = await page.textContent('[data-testid=tooltip] [data-testid=tooltip-constraint]');
  check(/choice constraint allowed \d+ tokens/.test(ctip), `${tag}: the tooltip does not describe the constraint: ${ctip}`);
  const grammarCuts = await page.locator('[data-testid=tooltip] [data-testid=cut-by-grammar]').count();
  check(grammarCuts >= 1, `${tag}: the tooltip marks no candidate "cut by grammar"`);
  await page.mouse.move(2, 2);
  await constrainedChip.click();
  await page.waitForFunction(() => document.querySelector('[data-testid=viewer-bars]').dataset.state === 'ready');
  const gstage = await page.textContent('[data-testid=grammar-stage]');
  check(/choice constraint/.test(gstage) && /keeps \d+ token/.test(gstage), `${tag}: the viewer shows no constraint stage: ${gstage}`);
  const gb = await bars();
  check(gb.some((x) => x.cut === 'grammar') && gb.filter((x) => !x.cut).length === 1, `${tag}: at temperature 0 the viewer should keep one bar and cut others by the grammar: ${JSON.stringify(gb.slice(0, 5))}`);
  const gcheck = await page.textContent('[data-testid=engine-check]');
  check(gcheck.includes('✓'), `${tag}: the viewer disagrees with the engine under the constraint: ${gcheck}`);
  await setSlider('temperature', 1);
  await settle();
  const gb1 = await bars();
  const kept1 = gb1.filter((x) => !x.cut);
  const sum1 = kept1.reduce((a, x) => a + x.p, 0);
  check(kept1.length >= 2 && gb1.filter((x) => x.cut === 'grammar').every((x) => x.p === 0), `${tag}: at temperature 1 the constraint's cut should still hold: ${JSON.stringify(gb1.slice(0, 5))}`);
  check(sum1 <= 1 + 1e-9, `${tag}: the allowed bars hold ${sum1} probability`);
  ok(`${tag}: the viewer applies the constraint before its sliders (${gb.filter((x) => x.cut === 'grammar').length} bars cut by grammar)`);
  await page.locator('[data-testid=viewer]').scrollIntoViewIfNeeded();
  await shot('constraint', false);
  const allowedAlt = gb1.find((x) => !x.chosen && x.cut !== 'grammar');
  check(!!allowedAlt, `${tag}: no allowed alternative to fork`);
  await page.click(`[data-testid=viewer-bars] [data-testid=bar][data-token="${allowedAlt.token}"] [data-testid=fork]`);
  const gcard = page.locator('[data-testid=branch-card][data-branch="1"]');
  await gcard.waitFor();
  await page.waitForFunction(() => {
    const st = document.querySelector('[data-testid=branch-card][data-branch="1"] [data-testid=branch-status]');
    return st && ['done', 'error', 'stopped'].includes(st.dataset.state);
  });
  const gforkState = await gcard.locator('[data-testid=branch-status]').getAttribute('data-state');
  check(gforkState === 'done', `${tag}: the constrained fork ended as ${gforkState}: ${await gcard.locator('[data-testid=branch-status]').textContent()}`);
  const gforkForced = await gcard.locator('[data-testid=chip][data-forced=true]').count();
  check(gforkForced >= 1, `${tag}: the fork's tokens are not forced by the constraint`);
  ok(`${tag}: a fork from an allowed alternative continues inside the constraint (${gforkForced} forced tokens)`);
  await tab('generate');
  await page.selectOption('[data-testid=f-constraint]', '');

  noProblems('at the end');
  ok(`${tag}: no console errors or warnings`);
  await context.close();
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  for (const [w, hgt] of [
    [1280, 800],
    [390, 844],
  ]) {
    await run(browser, w, hgt);
  }
} catch (err) {
  failed = true;
  console.log(`FAIL ${err instanceof CheckError ? err.message : err.stack || err}`);
  if (pageProblems.length) console.log(`page problems before the failure: ${pageProblems.join(' | ')}`);
} finally {
  await browser.close();
  control?.close();
}
if (failed) process.exit(1);
console.log('all viewer checks passed');
