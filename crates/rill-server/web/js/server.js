// The whole server, live: the KV arena's blocks (the notepad's pages: who holds each, shared
// prefix blocks with their reference counts, cached-free ones) and the engine loop's steps (the
// assembly line: each request's prompt chunks and decode rows per forward pass, admissions,
// preemptions, cancellations). Polls /v1/rill/server while the tab is open; can start a few
// clients itself so there is something to watch.

import { getJson, postStream, isAbort } from './api.js';
import { $, h, s, clear, secs, bytes } from './dom.js';

const POLL_MS = 400;
const STEPS = 80;
const CLIENT_PROMPTS = [
  'Write a short poem about the sea.',
  'List three facts about the moon.',
  'Explain what a noun is.',
  'Describe a cat in two sentences.',
];

/** A stable colour per request id. */
function requestColor(id, light = 58) {
  const hue = (Number(id) * 137.508) % 360;
  return `hsl(${hue.toFixed(0)} 65% ${light}%)`;
}

export class ServerView {
  constructor(app) {
    this.app = app;
    this.body = $('#server-body');
    this.status = $('#server-status');
    this.timer = null;
    this.clients = [];
    this.inflight = null;
    $('#server-clients').addEventListener('click', () => this.startClients(Number($('#server-n').value) || 3));
    $('#server-stop').addEventListener('click', () => this.stopClients());
  }

  /** Starts polling (the tab is shown) or stops (hidden). */
  setActive(on) {
    if (on && !this.timer) {
      this.refresh();
      this.timer = setInterval(() => this.refresh(), POLL_MS);
    } else if (!on && this.timer) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }

  /** Reads the server and redraws; a call while one is in flight shares it. */
  refresh() {
    if (this.inflight) return this.inflight;
    this.inflight = (async () => {
      try {
        const v = await getJson(`/v1/rill/server?steps=${STEPS}`);
        this.render(v);
      } catch (err) {
        if (!isAbort(err)) this.status.textContent = `Could not read the server: ${err.message}`;
      } finally {
        this.inflight = null;
      }
    })();
    return this.inflight;
  }

  startClients(n) {
    const max = $('#f-max_tokens') ? Number($('#f-max_tokens').value) || 48 : 48;
    for (let i = 0; i < n; i++) {
      const controller = new AbortController();
      const client = { controller, done: false };
      this.clients.push(client);
      const body = {
        messages: [{ role: 'user', content: CLIENT_PROMPTS[(this.clients.length + i) % CLIENT_PROMPTS.length] }],
        max_tokens: Math.max(16, max),
        stream: true,
        temperature: 0.8,
      };
      postStream('/v1/chat/completions', body, () => {}, { signal: controller.signal })
        .catch(() => {})
        .finally(() => {
          client.done = true;
          this.showClients();
          this.refresh();
        });
    }
    this.showClients();
    this.refresh();
  }

  stopClients() {
    for (const c of this.clients) if (!c.done) c.controller.abort();
  }

  showClients() {
    const running = this.clients.filter((c) => !c.done).length;
    const el = $('#server-client-count');
    el.textContent = running ? `${running} client${running === 1 ? '' : 's'} started here still generating` : '';
    el.dataset.running = String(running);
    $('#server-stop').disabled = running === 0;
  }

  render(v) {
    const kv = v.kv;
    const owners = new Map(); // block -> [{request, choice, seq}]
    const requests = new Map(); // request -> {running, waiting, blocks}
    for (const sq of v.sequences) {
      const r = requests.get(sq.request) || { id: sq.request, seqs: [], blocks: new Set() };
      r.seqs.push(sq);
      for (const b of sq.blocks) {
        r.blocks.add(b);
        if (!owners.has(b)) owners.set(b, []);
        owners.get(b).push(sq);
      }
      requests.set(sq.request, r);
    }
    // With a sliding window: the global blocks whose positions every holder's window layers
    // have let go of, and who holds each window block.
    const win = kv.window;
    const windowHeld = new Set();
    const windowOwners = new Map();
    if (win) {
      for (const sq of v.sequences) {
        const from = Math.floor((sq.window_from || 0) / kv.block_size);
        sq.blocks.forEach((b, i) => { if (i >= from) windowHeld.add(b); });
        for (const w of sq.window_blocks || []) {
          if (w === null) continue;
          if (!windowOwners.has(w)) windowOwners.set(w, []);
          windowOwners.get(w).push(sq);
        }
      }
    }
    let dropped = 0;
    let used = 0;
    let cachedFree = 0;
    let shared = 0;
    const grid = h('div', { class: 'kv-grid', 'data-testid': 'kv-grid' });
    // Free blocks are drawn one by one in short runs; a long run (an idle arena holds thousands)
    // is one summary of its size.
    const freeRun = [];
    for (let b = 0; b < kv.blocks; b++) {
      const refs = kv.refs[b];
      const published = kv.published[b] === 1;
      const who = owners.get(b) || [];
      let cls = 'kv-block';
      let style = {};
      let title = `block ${b}: `;
      if (refs > 0) {
        used++;
        const req = who.length ? who[0].request : null;
        style = { background: req === null ? '#999' : requestColor(req) };
        const holder = (q) =>
          q.state === 'beam'
            ? `beam search ${q.request} (beam ${q.choice + 1})`
            : q.state === 'reserved'
              ? `beam search ${q.request} (kept for its beams to grow into)`
              : `request ${q.request} (choice ${q.choice})`;
        title += `held by ${who.map(holder).join(', ') || 'a job'}`;
        if (who.some((q) => q.state === 'reserved')) cls += ' reserved';
        if (refs > 1) {
          shared++;
          cls += ' shared';
          title += `; shared by ${refs} sequences`;
        }
        if (published) title += '; in the prefix cache';
        if (win && !windowHeld.has(b)) {
          dropped++;
          cls += ' window-dropped';
          title += `; its ${win.layers} sliding-window layers have let go of these positions (a query reads only the last ${win.size}): only the ${win.global_layers} global layers keep them`;
        }
      } else if (published) {
        cachedFree++;
        cls += ' cached';
        title += 'free, but its keys and values stay in the prefix cache until the room is needed';
      } else {
        cls += ' free';
        title += 'free';
      }
      if (refs === 0 && !published) {
        freeRun.push(b);
        continue;
      }
      flushFree(grid, freeRun, 'kv-block');
      grid.append(
        h('span', {
          class: cls,
          style,
          title,
          'data-testid': 'kv-block',
          'data-block': b,
          'data-refs': refs,
          'data-request': who.length ? who[0].request : '',
          'data-state': refs > 0 ? 'used' : published ? 'cached' : 'free',
          'data-window': win ? (refs > 0 ? (windowHeld.has(b) ? 'held' : 'dropped') : (win.companions[b] ? 'kept' : 'none')) : '',
        }),
      );
    }
    flushFree(grid, freeRun, 'kv-block');
    // The window layers' own pages.
    let windowPart = [];
    if (win) {
      const wgrid = h('div', { class: 'kv-grid', 'data-testid': 'kv-window-grid' });
      let wUsed = 0;
      let wKept = 0;
      const wFree = [];
      for (let b = 0; b < win.blocks; b++) {
        const refs = win.refs[b];
        const who = windowOwners.get(b) || [];
        let cls = 'kv-block';
        let style = {};
        let title = `window block ${b}: `;
        if (who.length) {
          wUsed++;
          style = { background: requestColor(who[0].request) };
          title += `held by ${who.map((q) => `request ${q.request} (choice ${q.choice})`).join(', ')}`;
          if (who.length > 1) cls += ' shared';
        } else if (refs > 0) {
          wKept++;
          cls += ' cached';
          title += 'kept with a block of the prefix cache, so a prompt that ends there continues without recomputing its window; taken first when room is needed';
        } else {
          cls += ' free';
          title += 'free';
        }
        if (!who.length && refs === 0) {
          wFree.push(b);
          continue;
        }
        flushFree(wgrid, wFree, 'kv-window-block');
        wgrid.append(h('span', { class: cls, style, title, 'data-testid': 'kv-window-block', 'data-block': b, 'data-refs': refs, 'data-state': who.length ? 'used' : refs > 0 ? 'kept' : 'free' }));
      }
      flushFree(wgrid, wFree, 'kv-window-block');
      windowPart = [
        h('h4', {}, `The sliding-window layers' pages`),
        h(
          'p',
          { class: 'explain small' },
          `${win.layers} of the model's ${win.layers + win.global_layers} layers attend only to the last ${win.size} positions, so they keep only those: each request holds a window's worth of these pages (${bytes(win.bytes_per_block)} each) whatever its length, and lets go of a page once no query of it can read it again. The pages above hold the other ${win.global_layers} layers, for every position; greyed ones are positions the window layers have let go of.`,
        ),
        h('p', { class: 'small', 'data-testid': 'kv-window-summary' }, `${wUsed} of ${win.blocks} window blocks in use, ${wKept} kept for the prefix cache, ${win.blocks - wUsed - wKept} free; ${dropped} held block${dropped === 1 ? '' : 's'} above ${dropped === 1 ? 'is' : 'are'} kept by the global layers only; ${win.reclaims} kept window blocks reclaimed so far.`),
        wgrid,
      ];
    }
    // Recurrent layers (hybrid models): a fixed notepad per request beside the pages.
    const rec = kv.recurrent;
    let recurrentPart = [];
    if (rec) {
      const kinds = Object.entries(rec.kinds)
        .filter(([, n]) => n > 0)
        .map(([k, n]) => `${n} ${{ gated_deltanet: 'Gated DeltaNet', short_conv: 'short-convolution', mamba2: 'Mamba-2' }[k] || k}`)
        .join(', ');
      const held = v.sequences.filter((q) => q.state !== 'waiting');
      const rows = held.map((q) => {
        const kvWould = rec.kv_equivalent_bytes_per_token * q.positions;
        const snap = q.state_snapshot === null || q.state_snapshot === undefined ? 'no snapshot yet' : `a snapshot at position ${q.state_snapshot}`;
        const check = q.state_checkpoint === null || q.state_checkpoint === undefined ? '' : `, a checkpoint at ${q.state_checkpoint}`;
        return h(
          'li',
          { 'data-testid': 'state-sequence', 'data-seq': q.seq, 'data-snapshot': q.state_snapshot ?? '' },
          h('span', { class: 'swatch', style: { background: requestColor(q.request) } }),
          ` request ${q.request} (choice ${q.choice}): state at position ${q.positions}, ${snap}${check}; ${bytes(rec.state_bytes * rec.states_per_sequence)} held, where keys and values of these layers would take ${bytes(kvWould)} at this length`,
        );
      });
      recurrentPart = [
        h('h4', {}, 'The fixed notepad: recurrent layers'),
        h(
          'p',
          { class: 'explain small' },
          `${rec.layers} of the model's ${rec.layers + rec.attention_layers} layers (${kinds}) keep no keys or values: each keeps a state of fixed size per request (${bytes(rec.state_bytes)} for all of them), updated token by token, that never grows with the text. Only the other ${rec.attention_layers} layer${rec.attention_layers === 1 ? '' : 's'} write the pages above. A state is valid only at the position it was left at, so each request also keeps a snapshot at the last page boundary it crossed: the prefix cache keeps snapshots (not pages) for the next request with the same beginning, which resumes from the deepest one.`,
        ),
        h('p', { class: 'small', 'data-testid': 'state-summary' }, `${rec.max_sequences - rec.free_sequences} of ${rec.max_sequences} request states in use; ${rec.stored_snapshots} of ${rec.store_capacity} snapshots kept for the prefix cache.`),
        rows.length ? h('ul', { class: 'req-list small', 'data-testid': 'state-sequences' }, rows) : '',
      ];
    }
    // Each swatch and its words wrap as one item.
    const item = (cls, text, style) => h('span', { class: 'legend-item', 'data-testid': 'kv-legend-item' }, h('span', { class: `kv-block ${cls}`, style }), text);
    const legend = h(
      'div',
      { class: 'kv-legend small' },
      item('free', 'free'),
      item('cached', 'cached-free (prefix cache)'),
      item('shared', 'shared by several sequences', { background: '#bbb' }),
      item('reserved', 'kept for a beam search\'s beams to grow into', { background: '#bbb' }),
      win ? item('window-dropped', 'let go by the window layers', { background: '#bbb' }) : null,
    );
    const reqList = h(
      'ul',
      { class: 'req-list small', 'data-testid': 'server-requests' },
      [...requests.values()].map((r) => {
        const sq = r.seqs[0];
        const states = new Set(r.seqs.map((q) => q.state));
        const beams = r.seqs.filter((q) => q.state === 'beam');
        const kept = r.seqs.filter((q) => q.state === 'reserved').reduce((n, q) => n + q.blocks.length, 0);
        const text = beams.length
          ? ` beam search ${r.id}: ${beams.length} beam${beams.length === 1 ? '' : 's'} of ${beams[0].tokens} tokens (prompt ${beams[0].prompt_tokens}, ${beams[0].cached_prompt_tokens} from the prefix cache) sharing ${r.blocks.size - kept} block${r.blocks.size - kept === 1 ? '' : 's'}, and ${kept} kept for them to grow into`
          : ` request ${r.id}: ${r.seqs.length} sequence${r.seqs.length === 1 ? '' : 's'} (${[...states].join(', ')}), ${sq.tokens} tokens (prompt ${sq.prompt_tokens}, ${sq.cached_prompt_tokens} from the prefix cache), ${r.blocks.size} block${r.blocks.size === 1 ? '' : 's'}`;
        return h(
          'li',
          {
            'data-testid': 'server-request',
            'data-request': r.id,
            'data-blocks': r.blocks.size,
            'data-kind': beams.length ? 'beam' : 'request',
          },
          h('span', { class: 'swatch', style: { background: requestColor(r.id) } }),
          text,
        );
      }),
    );
    clear(this.body).append(
      h('h3', {}, 'The notepad: the KV cache'),
      h(
        'p',
        { class: 'explain small' },
        `Every square is one page of the notepad: a block of ${kv.block_size} positions holding their keys and values for ${win ? `the ${win.global_layers} layers that attend to everything` : rec ? `the ${rec.attention_layers} attention layer${rec.attention_layers === 1 ? '' : 's'}` : 'every layer'} (${bytes(kv.bytes_per_block)} each). A request takes pages as its conversation grows and gives them back when it ends; pages of a prompt other requests start with are shared (outlined), and pages nobody holds may stay filled (hatched) so the next request with the same beginning skips computing them.`,
      ),
      h('p', { class: 'small', 'data-testid': 'kv-summary' }, `${used} of ${kv.blocks} blocks in use (${shared} shared), ${cachedFree} cached-free, ${kv.blocks - used - cachedFree} free; ${kv.evictions} evicted so far. ${v.queued} request${v.queued === 1 ? '' : 's'} waiting in the queue.`),
      grid,
      legend,
      ...windowPart,
      ...recurrentPart,
      reqList.childElementCount ? reqList : h('p', { class: 'small muted', 'data-testid': 'server-idle' }, 'No request is running.'),
      h('h3', {}, 'The assembly line: the engine\'s steps'),
      h(
        'p',
        { class: 'explain small' },
        'Each column is one forward pass of the model, newest on the right; its height is the rows it computed, coloured by request: pale for a chunk of a prompt being read, solid for one new token of an answer. Requests join and leave between passes (continuous batching); marks show a request admitted (●), preempted to make room (▼), cancelled (✕) or finished (✓).',
      ),
      this.timeline(v),
    );
    this.status.textContent = `Updated ${secs(v.now)} after the engine started.`;
  }

  timeline(v) {
    const steps = v.steps;
    const W = Math.max(300, Math.min(900, Math.floor(this.body.clientWidth) || 640));
    const H = 150;
    const pad = { l: 34, r: 8, t: 14, b: 18 };
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'timeline', 'data-testid': 'server-timeline', role: 'img', 'aria-label': 'rows per step by request' });
    if (!steps.length) {
      svg.append(s('text', { x: pad.l, y: H / 2, class: 'axis' }, 'No step yet.'));
      return svg;
    }
    const maxRows = Math.max(1, ...steps.map((st) => st.parts.reduce((a, p) => a + p.rows, 0)));
    const colW = (W - pad.l - pad.r) / STEPS;
    const y = (rows) => H - pad.b - ((H - pad.t - pad.b) * rows) / maxRows;
    svg.append(s('text', { x: 4, y: pad.t + 4, class: 'axis' }, String(maxRows)), s('text', { x: 4, y: H - pad.b, class: 'axis' }, '0'));
    const offset = STEPS - steps.length;
    steps.forEach((st, i) => {
      const x = pad.l + (offset + i) * colW;
      let acc = 0;
      for (const p of st.parts) {
        const top = y(acc + p.rows);
        svg.append(
          s(
            'rect',
            { x, y: top, width: Math.max(1, colW - 1), height: Math.max(0.5, y(acc) - top), fill: requestColor(p.request, p.decode ? 50 : 80), 'data-testid': 'step-part', 'data-step': st.id, 'data-request': p.request, 'data-decode': String(p.decode) },
            s('title', {}, `step ${st.id}: request ${p.request}, ${p.rows} ${p.decode ? 'decode row' : 'prompt rows'} (${secs(st.seconds)})`),
          ),
        );
        acc += p.rows;
      }
    });
    const marks = { admitted: '●', preempted: '▼', cancelled: '✕', finished: '✓', failed: '!' };
    const firstId = steps[0].id;
    for (const e of v.events) {
      const i = e.after_step - firstId + 1;
      const x = pad.l + (offset + Math.max(0, Math.min(steps.length, i))) * colW;
      svg.append(
        s(
          'text',
          { x, y: H - 4, class: `mark ${e.kind}`, fill: requestColor(e.request, 40), 'data-testid': 'loop-event', 'data-kind': e.kind, 'data-request': e.request },
          marks[e.kind] || '?',
          s('title', {}, `request ${e.request} ${e.kind}${e.queue_seconds !== undefined ? ` after ${secs(e.queue_seconds)} in the queue` : ''}`),
        ),
      );
    }
    return svg;
  }
}

/** Shortest run of free blocks drawn as one summary instead of block by block. */
const FREE_RUN = 24;

/** Draws the free blocks collected in `run` (consecutive ids) into `grid`, one square each when
 * the run is short, else one summary of its size; empties `run`. */
function flushFree(grid, run, testid) {
  if (!run.length) return;
  if (run.length < FREE_RUN) {
    for (const b of run) grid.append(h('span', { class: 'kv-block free', title: `${testid === 'kv-window-block' ? 'window block' : 'block'} ${b}: free`, 'data-testid': testid, 'data-block': b, 'data-refs': 0, 'data-state': 'free' }));
  } else {
    const first = run[0];
    const last = run[run.length - 1];
    grid.append(
      h(
        'span',
        { class: 'kv-free-run', 'data-testid': 'kv-free-run', 'data-count': run.length, 'data-from': first, 'data-to': last, title: `blocks ${first}-${last}: free` },
        `${run.length.toLocaleString()} free blocks (${first}–${last})`,
      ),
    );
  }
  run.length = 0;
}
