// The cost of steps: prefill versus decode, per-token latency, KV memory, FLOPs and bytes, and
// what shared the batch, for one branch of the current generation.

import { $, h, s, add, clear, secs, bytes, si, num, showToken, legendItems } from './dom.js';

let W = 640; // SVG width in user units: the panel's width when drawn, so text keeps its size
const H = 170;
const PAD = { l: 52, r: 10, t: 12, b: 26 };

export class CostView {
  constructor(app) {
    this.app = app;
    this.body = $('#cost-body');
    this.select = $('#cost-branch');
    this.select.addEventListener('change', () => this.render());
  }

  refreshBranches() {
    const cur = this.select.value;
    clear(this.select);
    for (const b of this.app.branches) this.select.append(h('option', { value: b.id }, b.label));
    if (this.app.branches.some((b) => String(b.id) === cur)) this.select.value = cur;
  }

  branch() {
    if (this.select.options.length !== this.app.branches.length) this.refreshBranches();
    const id = Number(this.select.value || 0);
    return this.app.branches.find((b) => b.id === id) || this.app.branches[0];
  }

  render() {
    const b = this.branch();
    const body = clear(this.body);
    if (!b || !b.steps.length) {
      body.append(h('p', { class: 'empty' }, 'Generate an answer first: every number here comes from its tokens.'));
      return;
    }
    const steps = b.steps;
    const m = this.app.model;
    W = Math.max(300, Math.min(900, Math.floor(body.clientWidth) || 640));
    add(body, this.timeSection(b), this.latencySection(steps), this.kvSection(steps, m), this.flopsSection(steps, m), this.batchSection(steps), m ? this.modelSection(m) : null);
  }

  timeSection(b) {
    const steps = b.steps;
    const first = steps[0];
    const last = steps[steps.length - 1];
    const pr = b.prompt || {};
    const queue = pr.queue_seconds || 0;
    const prefill = pr.prefill_seconds || 0;
    const ttft = first.elapsed_s;
    const other = Math.max(0, ttft - queue - prefill);
    const decodeWall = last.elapsed_s - first.elapsed_s;
    const decodePasses = steps.slice(1).reduce((a, st) => a + (st.step ? st.step.seconds : 0), 0);
    const total = Math.max(1e-9, last.elapsed_s);
    const seg = (v, cls, label) => (v > 0 ? h('span', { class: `seg ${cls}`, style: { width: `${(100 * v) / total}%` }, title: `${label}: ${secs(v)}` }) : null);
    const n = steps.length;
    const computed = pr.computed_tokens;
    const prefillRate = computed && prefill ? computed / prefill : null;
    const decodeRate = n > 1 && decodeWall > 0 ? (n - 1) / decodeWall : null;
    return h(
      'section',
      { class: 'cost-sec', 'data-testid': 'cost-time' },
      h('h3', {}, 'Prefill versus decode'),
      h('div', { class: 'flow time-flow', role: 'img', 'aria-label': `queue ${secs(queue)}, prefill ${secs(prefill)}, decode ${secs(decodeWall)}` }, seg(queue, 't-queue', 'queue'), seg(prefill, 't-prefill', 'prefill'), seg(other, 't-other', 'sampling and streaming the first token'), seg(decodeWall, 't-decode', 'decode')),
      h('div', { class: 'flow-legend small' }, legendItems([['t-queue', 'queue'], ['t-prefill', 'prefill'], ['t-other', 'first token out'], ['t-decode', 'decode']])),
      h(
        'dl',
        { class: 'stats' },
        stat('prompt tokens', pr.tokens ? pr.tokens.length : '–'),
        stat('from prefix cache', pr.cached_tokens),
        stat('computed', computed),
        stat('prefill', `${secs(prefill)} in ${pr.prefill_steps ?? '–'} step(s)`),
        stat('time to first token', secs(ttft)),
        stat('decode (wall)', `${secs(decodeWall)} for ${n - 1} tokens`),
        stat('decode forward passes', secs(decodePasses)),
        stat('prefill speed', prefillRate ? `${num(prefillRate, 0)} tokens/s` : '–'),
        stat('decode speed', decodeRate ? `${num(decodeRate, 1)} tokens/s` : '–'),
      ),
      prefillRate && decodeRate ? h('p', { class: 'small' }, prefillSentence(prefillRate / decodeRate, pr.cached_tokens || 0)) : null,
    );
  }

  latencySection(steps) {
    const gaps = steps.map((st, i) => (i === 0 ? st.elapsed_s : st.elapsed_s - steps[i - 1].elapsed_s));
    const passes = steps.map((st) => (st.step ? st.step.seconds : 0));
    const decodeGaps = gaps.slice(1);
    let ymax = Math.max(1e-6, ...decodeGaps, ...passes.slice(1));
    if (!decodeGaps.length) ymax = Math.max(ymax, gaps[0]);
    ymax *= 1.1;
    const iw = W - PAD.l - PAD.r;
    const ih = H - PAD.t - PAD.b;
    const bw = iw / steps.length;
    const y = (v) => PAD.t + ih - (Math.min(v, ymax) / ymax) * ih;
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', 'data-testid': 'cost-timeline', role: 'img', 'aria-label': 'Per-token latency' });
    axis(svg, ymax, (v) => secs(v), steps.length);
    steps.forEach((st, i) => {
      const x = PAD.l + i * bw;
      const g = gaps[i];
      const clipped = g > ymax;
      svg.append(
        s(
          'rect',
          { x: x + bw * 0.1, y: y(g), width: Math.max(1, bw * 0.8), height: PAD.t + ih - y(g), class: i === 0 ? 'bar-first' : 'bar-gap', 'data-testid': 'latency-bar' },
          s('title', {}, `token ${i + 1} ${showToken(st.token_text)}: ${secs(g)} since ${i === 0 ? 'the request arrived' : 'the previous token'}; its forward pass ${secs(passes[i])} (${st.step ? st.step.rows : '?'} rows)`),
        ),
        s('rect', { x: x + bw * 0.3, y: y(passes[i]), width: Math.max(1, bw * 0.4), height: PAD.t + ih - y(passes[i]), class: 'bar-pass' }),
      );
      if (clipped) svg.append(s('text', { x: x + bw / 2, y: PAD.t + 10, 'text-anchor': 'middle', class: 'lbl small-lbl' }, `${secs(g)}↑`));
    });
    return h(
      'section',
      { class: 'cost-sec' },
      h('h3', {}, 'Per-token latency'),
      h('p', { class: 'small muted' }, 'Each bar is the time since the previous token (the first: since the request arrived, including the prefill; clipped when taller). The dark inner bar is that token’s forward pass; the rest is sampling, streaming and waiting for the batch.'),
      svg,
    );
  }

  kvSection(steps, m) {
    const vals = steps.map((st) => (st.kv ? st.kv.bytes : 0));
    const ymax = Math.max(1, ...vals) * 1.1;
    const iw = W - PAD.l - PAD.r;
    const ih = H - PAD.t - PAD.b;
    const x = (i) => PAD.l + (steps.length === 1 ? iw / 2 : (i * iw) / (steps.length - 1));
    const y = (v) => PAD.t + ih - (v / ymax) * ih;
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', 'data-testid': 'cost-kv', role: 'img', 'aria-label': 'KV-cache bytes held per token' });
    axis(svg, ymax, (v) => bytes(v), steps.length);
    // a step line: flat within a block, a jump when a new block is taken
    let path = '';
    vals.forEach((v, i) => {
      path += i === 0 ? `M${x(0)},${y(v)}` : `H${x(i)}V${y(v)}`;
    });
    svg.append(s('path', { d: `${path}V${y(0)}H${x(0)}Z`, class: 'area' }), s('path', { d: path, class: 'line' }));
    const last = steps[steps.length - 1].kv || {};
    // The global layers' arena, and the window layers' (which hold only their windows).
    const arena = m
      ? m.kv_block_size * (m.kv_blocks_total * m.kv_context_bytes_per_token + (m.kv_window_blocks_total || 0) * (m.kv_bytes_per_token - m.kv_context_bytes_per_token))
      : null;
    const windowed = m && m.kv_window_blocks_total > 0;
    return h(
      'section',
      { class: 'cost-sec' },
      h('h3', {}, 'KV cache held by this sequence'),
      h('p', { class: 'small muted' }, `Keys and values of every position, over all layers, kept so that no token is recomputed. They are allocated in blocks of ${last.block_size ?? '?'} positions: the line steps up when a new block is taken.${windowed ? ` The model's ${m.sliding_layers} sliding-window layers read only the last ${m.sliding_window} positions and keep only those, so past the window the line grows by the other ${m.n_layers - m.sliding_layers} layers' ${bytes(m.kv_context_bytes_per_token)} per position.` : ''}`),
      svg,
      h(
        'dl',
        { class: 'stats' },
        stat('now', bytes(last.bytes)),
        stat('blocks', last.blocks),
        stat('positions', last.positions),
        stat('per position', m ? (windowed ? `${bytes(m.kv_bytes_per_token)} inside the window, ${bytes(m.kv_context_bytes_per_token)} past it` : bytes(m.kv_bytes_per_token)) : '–'),
        ...(windowed && last.bytes_without_window ? [stat('without the window cache', `${bytes(last.bytes_without_window)} (${num(last.bytes_without_window / Math.max(1, last.bytes), 2)}× as much)`)] : []),
        stat('share of the arena', arena && last.bytes ? `${num((100 * last.bytes) / arena, 2)}% of ${bytes(arena)}` : '–'),
      ),
    );
  }

  flopsSection(steps, m) {
    const flops = steps.map((st) => (st.cost ? st.cost.flops : 0));
    const wb = steps.map((st) => (st.cost ? st.cost.weight_bytes : 0));
    const kb = steps.map((st) => (st.cost ? st.cost.kv_bytes : 0));
    const sum = (a) => a.reduce((x, y) => x + y, 0);
    const last = steps[steps.length - 1];
    const lastCost = last.cost || {};
    const intensity = lastCost.flops / Math.max(1, (lastCost.weight_bytes || 0) + (lastCost.kv_bytes || 0));
    const decode = steps.slice(1).filter((st) => st.step && st.step.seconds > 0);
    const meanPass = decode.length ? decode.reduce((a, st) => a + st.step.seconds, 0) / decode.length : null;
    const meanRows = decode.length ? decode.reduce((a, st) => a + st.step.rows, 0) / decode.length : null;
    // bytes moved per token, stacked: weights + KV
    const ymax = Math.max(1, ...wb.map((w, i) => w + kb[i])) * 1.1;
    const iw = W - PAD.l - PAD.r;
    const ih = H - PAD.t - PAD.b;
    const bw = iw / steps.length;
    const y = (v) => PAD.t + ih - (v / ymax) * ih;
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', 'data-testid': 'cost-bytes', role: 'img', 'aria-label': 'Bytes read per token: weights and KV cache' });
    axis(svg, ymax, (v) => bytes(v), steps.length);
    steps.forEach((st, i) => {
      const x = PAD.l + i * bw + bw * 0.1;
      svg.append(
        s('rect', { x, y: y(wb[i]), width: Math.max(1, bw * 0.8), height: PAD.t + ih - y(wb[i]), class: 'bar-weights' }, s('title', {}, `token ${i + 1}: weights ${bytes(wb[i])}, KV ${bytes(kb[i])}, ${si(flops[i], 'FLOP')}`)),
        s('rect', { x, y: y(wb[i] + kb[i]), width: Math.max(1, bw * 0.8), height: y(wb[i]) - y(wb[i] + kb[i]), class: 'bar-kv' }),
      );
    });
    return h(
      'section',
      { class: 'cost-sec', 'data-testid': 'cost-flops' },
      h('h3', {}, 'Arithmetic and memory traffic per token'),
      h('p', { class: 'small muted' }, 'Every token multiplies by every weight matrix once (2 FLOPs per weight) and attends over all earlier positions, so each decode step reads all the weights and a growing KV cache: it is limited by memory bandwidth, not arithmetic.'),
      svg,
      h('div', { class: 'flow-legend small' }, legendItems([['bar-weights', 'weights read'], ['bar-kv', 'KV cache read']])),
      h(
        'dl',
        { class: 'stats' },
        stat('FLOPs, last token', si(lastCost.flops, 'FLOP')),
        stat('weights read', bytes(lastCost.weight_bytes)),
        stat('KV read, last token', bytes(lastCost.kv_bytes)),
        stat('arithmetic intensity', `${num(intensity, 2)} FLOP/byte`),
        stat(`all ${steps.length} tokens`, `${si(sum(flops), 'FLOP')}, ${bytes(sum(wb) + sum(kb))}`),
        stat('model: per token', m ? `${si(m.flops_per_token, 'FLOP')} + ${si(m.attention_flops_per_position, 'FLOP')} per position` : '–'),
        stat('attention share, last token', m && lastCost.flops ? `${num((100 * Math.max(0, lastCost.flops - m.flops_per_token)) / lastCost.flops, 1)}% of its FLOPs` : '–'),
        stat('attention share as context grows', m ? attentionShares(m) : '–'),
        stat('mean decode pass', meanPass ? `${secs(meanPass)} (${num(meanRows, 1)} rows)` : '–'),
        stat('achieved', meanPass ? `${si((lastCost.flops * meanRows) / meanPass, 'FLOP/s')}, ${bytes((lastCost.weight_bytes || 0) / meanPass)}/s of weights` : '–'),
      ),
    );
  }

  batchSection(steps) {
    const iw = W - PAD.l - PAD.r;
    const ih = H - PAD.t - PAD.b;
    const bw = iw / steps.length;
    const rows = steps.map((st) => (st.step ? st.step.rows : 0));
    const ymax = Math.max(1, ...rows) * 1.1;
    const y = (v) => PAD.t + ih - (v / ymax) * ih;
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', 'data-testid': 'cost-batch', role: 'img', 'aria-label': 'Rows of each step: decode and prefill' });
    axis(svg, ymax, (v) => num(v, 0), steps.length, { integer: true });
    let reqPath = '';
    steps.forEach((st, i) => {
      const p = st.step || { decode_rows: 0, prefill_rows: 0, requests: 0, rows: 0 };
      const x = PAD.l + i * bw + bw * 0.1;
      const wdt = Math.max(1, bw * 0.8);
      svg.append(
        s('rect', { x, y: y(p.decode_rows), width: wdt, height: PAD.t + ih - y(p.decode_rows), class: 'bar-decode' }, s('title', {}, `token ${i + 1}: step ${p.id}, ${p.rows} rows (${p.decode_rows} decode, ${p.prefill_rows} prefill), ${p.sequences} sequences, ${p.requests} request(s)`)),
        s('rect', { x, y: y(p.decode_rows + p.prefill_rows), width: wdt, height: y(p.decode_rows) - y(p.decode_rows + p.prefill_rows), class: 'bar-prefill' }),
      );
      const cx = PAD.l + i * bw + bw / 2;
      reqPath += `${i === 0 ? 'M' : 'L'}${cx},${y(p.requests)}`;
    });
    svg.append(s('path', { d: reqPath, class: 'req-line' }));
    const shared = steps.filter((st) => st.step && st.step.requests > 1).length;
    const maxReq = Math.max(0, ...steps.map((st) => (st.step ? st.step.requests : 0)));
    return h(
      'section',
      { class: 'cost-sec', 'data-testid': 'cost-batch-sec' },
      h('h3', {}, 'Who shared the batch'),
      h('p', { class: 'small muted' }, 'Each forward pass carries one row per decoding sequence plus chunks of prompts being read. Rows of other requests ride along almost for free, since the weights are read once per pass.'),
      svg,
      h('div', { class: 'flow-legend small' }, legendItems([['bar-decode', 'decode rows'], ['bar-prefill', 'prefill rows'], ['req-line', 'requests in the step']])),
      h('dl', { class: 'stats' }, stat('steps shared with other requests', `${shared} of ${steps.length}`), stat('most requests in one step', maxReq), stat('most rows in one step', Math.max(...rows))),
    );
  }

  modelSection(m) {
    return h(
      'section',
      { class: 'cost-sec' },
      h('h3', {}, 'The model'),
      h(
        'dl',
        { class: 'stats' },
        stat('name', m.name),
        stat('layers', m.n_layers),
        stat('heads / kv heads', `${m.n_heads} / ${m.n_kv_heads} × ${m.head_dim}`),
        stat('d_model / d_ff', `${m.d_model} / ${m.d_ff}`),
        stat('vocabulary', m.vocab_size),
        stat('weights', bytes(m.weight_bytes)),
        stat('FLOPs per token', si(m.flops_per_token, 'FLOP')),
        stat('KV per token', `${bytes(m.kv_bytes_per_token)} (${m.kv_dtype})`),
        stat('KV per token by type', m.kv_bytes_per_token_by_type ? Object.entries(m.kv_bytes_per_token_by_type).map(([t, b]) => `${t} ${bytes(b)}`).join(', ') : '–'),
        stat('KV arena', `${m.kv_blocks_total} blocks × ${m.kv_block_size}${m.kv_window_blocks_total ? `, and ${m.kv_window_blocks_total} for the sliding-window layers` : ''}`),
        stat('precision', m.precision),
        stat('threads', m.threads),
      ),
    );
  }
}

/** The axes, three ticks on the y axis (0, half, the top: whole numbers only with `integer`,
 * never the same label twice) and the first and last token under the x axis. */
function axis(svg, ymax, fmt, n, { integer = false } = {}) {
  const ih = H - PAD.t - PAD.b;
  svg.append(s('line', { x1: PAD.l, y1: PAD.t + ih, x2: W - PAD.r, y2: PAD.t + ih, class: 'axis' }), s('line', { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: PAD.t + ih, class: 'axis' }));
  const top = ymax / 1.1;
  let values = [0, top / 2, top];
  if (integer) values = [0, Math.floor(top / 2), Math.floor(top)].filter((v, i, a) => i === 0 || v > a[i - 1]);
  const seen = new Set();
  for (const v of values) {
    const label = fmt(v);
    if (seen.has(label)) continue;
    seen.add(label);
    const y = PAD.t + ih - (v / ymax) * ih;
    svg.append(s('line', { x1: PAD.l - 3, y1: y, x2: W - PAD.r, y2: y, class: 'grid' }), s('text', { x: PAD.l - 5, y: y + 3, 'text-anchor': 'end', class: 'lbl', 'data-axis': 'y' }, label));
  }
  svg.append(s('text', { x: PAD.l, y: H - 6, class: 'lbl', 'data-axis': 'x' }, 'token 1'), s('text', { x: W - PAD.r, y: H - 6, 'text-anchor': 'end', class: 'lbl', 'data-axis': 'x' }, `token ${n}`));
}

/** Attention's share of one token's FLOPs after 1k, 4k and 32k cached positions: the part of a
 *  long conversation's cost that grows with it. */
function attentionShares(m) {
  return [1024, 4096, 32768]
    .map((n) => {
      const att = m.attention_flops_per_position * n;
      return `${n / 1024}k: ${num((100 * att) / (m.flops_per_token + att), 0)}%`;
    })
    .join(', ');
}

function stat(k, v) {
  return h('div', {}, h('dt', {}, k), h('dd', {}, v === undefined || v === null ? '–' : String(v)));
}

/** How reading the prompt compared with writing the answer, per token (`ratio` = prefill rate /
 * decode rate), in words that stay true below 1 and when the prompt came from the cache. */
export function prefillSentence(ratio, cached) {
  const cache = cached > 0 ? ` (${cached} of its tokens came from the prefix cache and were not computed again)` : '';
  if (ratio >= 1.05) {
    return `Reading the prompt ran ${num(ratio, 1)}× faster per token than writing the answer${cache}: prefill handles all its tokens in one pass, decode needs a pass per token.`;
  }
  if (ratio <= 0.95) {
    return `Reading the prompt ran ${num(1 / ratio, 1)}× slower per token than writing the answer${cache}; the batch chart below shows what shared its steps.`;
  }
  return `Reading the prompt ran about as fast per token as writing the answer${cache}.`;
}
