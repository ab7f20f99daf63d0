// Beam search: runs /v1/rill/beam on the Generate tab's prompt and draws the whole search tree.

import { postJson } from './api.js';
import { $, h, s, clear, showToken, probColor, probBorder, num, secs, pct } from './dom.js';

const COL = 104;
const ROW = 40;
const NW = 90;
const NH = 30;
const X0 = 74;
const Y0 = 24;

export class BeamView {
  constructor(app) {
    this.app = app;
    this.form = $('#beam-form');
    this.status = $('#beam-status');
    this.form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.run();
    });
    this.highlight = null;
  }

  body() {
    const int = (id) => Number($(id).value);
    return {
      ...this.app.promptBody(),
      width: int('#beam-width'),
      max_tokens: int('#beam-max_tokens'),
      length_penalty: Number($('#beam-length_penalty').value),
      early_stopping: $('#beam-early_stopping').value,
      ignore_eos: $('#beam-ignore_eos').checked,
    };
  }

  async run() {
    const body = this.body();
    const btn = $('#beam-run');
    btn.disabled = true;
    this.status.dataset.state = 'running';
    this.status.textContent = `Searching with ${body.width} beams… (one forward pass of all the beams per engine step, between other requests' steps)`;
    try {
      const res = await postJson('/v1/rill/beam', body);
      this.res = res;
      this.highlight = res.hypotheses && res.hypotheses.length ? 0 : null;
      this.render();
      this.status.dataset.state = 'done';
      this.status.textContent = `Done: ${res.nodes.length} candidates considered over ${res.steps} steps.`;
    } catch (err) {
      this.status.dataset.state = 'error';
      this.status.textContent = `Beam search failed: ${err.message}`;
    } finally {
      btn.disabled = false;
    }
  }

  render() {
    const res = this.res;
    if (!res) return;
    const byId = new Map(res.nodes.map((n) => [n.id, n]));
    clear($('#beam-summary')).append(
      h(
        'dl',
        { class: 'stats' },
        stat('stop', res.stop),
        stat('width', res.width),
        stat('length penalty', res.length_penalty),
        stat('steps', res.steps),
        stat('forward passes', res.forward_passes),
        stat('peak KV blocks', res.peak_kv_blocks),
        stat('prompt tokens', res.prompt_tokens),
        stat('prefill', secs(res.prefill_seconds)),
        stat('search', secs(res.search_seconds)),
      ),
    );
    this.drawTree(byId);
    const list = clear($('#beam-hyps'));
    (res.hypotheses || []).forEach((hyp, i) => {
      const btn = h(
        'button',
        {
          type: 'button',
          class: `hyp-btn${this.highlight === i ? ' on' : ''}`,
          'aria-pressed': this.highlight === i ? 'true' : 'false',
          onclick: () => {
            this.highlight = this.highlight === i ? null : i;
            this.render();
          },
        },
        this.highlight === i ? 'path shown' : 'show path',
      );
      list.append(
        h(
          'li',
          { class: 'hyp', 'data-testid': 'beam-hyp' },
          h(
            'div',
            { class: 'hyp-head' },
            h('strong', {}, `score ${num(hyp.score, 3)}`),
            h('span', { class: 'small muted' }, ` · log p ${num(hyp.cumulative_logprob, 3)} (p ${pct(Math.exp(hyp.cumulative_logprob), 3)}) · ${hyp.tokens.length} tokens · ${hyp.finish_reason}`),
            btn,
          ),
          h('p', { class: 'hyp-text' }, hyp.text),
        ),
      );
    });
  }

  drawTree(byId) {
    const res = this.res;
    const wrap = clear($('#beam-svg-wrap'));
    // Pruned proposals (most of a wide search: 8 beams x 64 steps draw ~8,000) are collapsed
    // into one "+N pruned" node per step unless the reader asks for them.
    const prunedCount = res.nodes.filter((n) => n.status === 'pruned').length;
    const showPruned = !!this.showPruned || prunedCount === 0;
    const nodes = showPruned ? res.nodes : res.nodes.filter((n) => n.status !== 'pruned');
    // Rows: the nodes drawn at each step, in rank order (original ranks when all are drawn).
    const row = new Map();
    const rowsAt = new Map();
    for (const n of [...nodes].sort((a, b) => a.step - b.step || a.rank - b.rank)) {
      const r = showPruned ? n.rank : rowsAt.get(n.step) || 0;
      row.set(n.id, r);
      rowsAt.set(n.step, Math.max(rowsAt.get(n.step) || 0, r + 1));
    }
    const prunedAt = new Map();
    if (!showPruned) for (const n of res.nodes) if (n.status === 'pruned') prunedAt.set(n.step, (prunedAt.get(n.step) || 0) + 1);
    let maxStep = 0;
    let maxRank = 0;
    for (const n of res.nodes) maxStep = Math.max(maxStep, n.step);
    for (const [step, rows] of rowsAt) maxRank = Math.max(maxRank, rows - 1 + (prunedAt.has(step) ? 1 : 0));
    if (prunedCount > 0) {
      wrap.append(
        h(
          'p',
          { class: 'small' },
          h(
            'button',
            {
              type: 'button',
              'data-testid': 'beam-toggle-pruned',
              'aria-pressed': showPruned ? 'true' : 'false',
              onclick: () => {
                this.showPruned = !showPruned;
                this.drawTree(byId);
              },
            },
            showPruned ? `Collapse the ${prunedCount.toLocaleString()} pruned candidates` : `Show the ${prunedCount.toLocaleString()} pruned candidates`,
          ),
          showPruned ? '' : ` The tree shows the beams kept and the finished answers; each step's pruned candidates are one grey node.`,
        ),
      );
    }
    const onPath = new Set();
    if (this.highlight !== null && res.hypotheses[this.highlight]) {
      let id = res.hypotheses[this.highlight].node;
      while (id !== null && id !== undefined && byId.has(id)) {
        onPath.add(id);
        id = byId.get(id).parent;
      }
    }
    const finalNodes = new Set((res.hypotheses || []).map((x) => x.node));
    const width = X0 + (maxStep + 1) * COL + 10;
    const height = Y0 + (maxRank + 1) * ROW + 10;
    const xy = (n) => [X0 + n.step * COL, Y0 + row.get(n.id) * ROW];
    const svg = s('svg', { width, height, viewBox: `0 0 ${width} ${height}`, class: 'beam-svg', 'data-testid': 'beam-svg', role: 'img', 'aria-label': `Beam search tree: ${nodes.length} candidates over ${maxStep + 1} steps` });
    const edges = s('g', {});
    const gNodes = s('g', {});
    svg.append(edges, gNodes);
    gNodes.append(s('rect', { x: 4, y: Y0, width: 56, height: NH, rx: 6, class: 'prompt-node' }), s('text', { x: 32, y: Y0 + 19, 'text-anchor': 'middle', class: 'lbl' }, 'prompt'));
    for (const n of nodes) {
      const [x, y] = xy(n);
      let px, py;
      if (n.parent === null || n.parent === undefined || !byId.has(n.parent)) {
        px = 60;
        py = Y0 + NH / 2;
      } else {
        const [ppx, ppy] = xy(byId.get(n.parent));
        px = ppx + NW;
        py = ppy + NH / 2;
      }
      const cy = y + NH / 2;
      edges.append(s('path', { d: `M${px},${py} C${px + 10},${py} ${x - 10},${cy} ${x},${cy}`, class: `bedge ${n.status}${onPath.has(n.id) ? ' path' : ''}` }));
    }
    for (const n of nodes) {
      const [x, y] = xy(n);
      const p = Math.exp(n.token_logprob);
      const label = showToken(n.text);
      const g = s(
        'g',
        {
          class: `bnode ${n.status}${onPath.has(n.id) ? ' path' : ''}${finalNodes.has(n.id) ? ' final' : ''}`,
          'data-testid': 'beam-node',
          'data-status': n.status,
          transform: `translate(${x},${y})`,
        },
        s('title', {}, `${label} (id ${n.token}) · step ${n.step}, rank ${n.rank} · ${n.status}\ntoken log p ${num(n.token_logprob, 3)} (p ${pct(p)}) · cumulative ${num(n.cumulative_logprob, 3)} · score ${num(n.score, 3)}`),
        s('rect', { width: NW, height: NH, rx: 5, fill: probColor(p, 88), stroke: probBorder(p) }),
        s('text', { x: 5, y: 12, class: 'btok' }, label.length > 12 ? `${label.slice(0, 11)}…` : label),
        s('text', { x: 5, y: 25, class: 'bscore' }, `${num(n.score, 2)}${n.status === 'finished' ? ' ■ end' : ''}`),
      );
      gNodes.append(g);
    }
    for (const [step, count] of prunedAt) {
      const x = X0 + step * COL;
      const y = Y0 + (rowsAt.get(step) || 0) * ROW;
      gNodes.append(
        s(
          'g',
          { class: 'bnode pruned-summary', 'data-testid': 'beam-pruned-summary', 'data-count': count, transform: `translate(${x},${y})` },
          s('title', {}, `${count} candidates of step ${step} were pruned: ranked below the kept beams`),
          s('rect', { width: NW, height: NH, rx: 5, class: 'pruned-box' }),
          s('text', { x: 5, y: 19, class: 'bscore' }, `+${count} pruned`),
        ),
      );
    }
    wrap.append(svg);
  }
}

function stat(k, v) {
  return h('div', {}, h('dt', {}, k), h('dd', {}, v === undefined || v === null ? '–' : String(v)));
}
