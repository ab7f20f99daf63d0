// The multiverse: where the model hesitated between two tokens, the other choice is followed
// too (/v1/rill/multiverse runs the branches together through the serving loop, from the
// answer's cached KV blocks). Drawn as a tree whose line widths are the paths' shares of
// probability among those shown; any branch can be opened, continued, or compared with another.

import { postJson } from './api.js';
import { $, h, s, clear, showToken, num, pct } from './dom.js';

const STEP_W = 26;
const LANE = 34;
const X0 = 12;
const Y0 = 22;
const MAX_W = 14;

function branchColor(id, light = 45) {
  return id === 0 ? `hsl(215 15% ${light - 10}%)` : `hsl(${((id * 137.508) % 360).toFixed(0)} 70% ${light}%)`;
}

export class MultiverseView {
  constructor(app) {
    this.app = app;
    this.status = $('#mv-status');
    this.res = null;
    this.open = null;
    this.compare = [];
    $('#mv-form').addEventListener('submit', (e) => {
      e.preventDefault();
      this.run();
    });
    $('#mv-threshold').addEventListener('input', () => {
      $('#mv-threshold-out').textContent = num(Number($('#mv-threshold').value));
    });
  }

  async run() {
    const int = (id) => Number($(id).value);
    let params = {};
    try {
      params = this.app.readParams().params;
      // Branches follow the model's own alternatives: no constraint here.
      delete params.structured_outputs;
    } catch (err) {
      this.status.dataset.state = 'error';
      this.status.textContent = err.message;
      return;
    }
    const body = {
      ...this.app.promptBody(),
      ...params,
      max_tokens: int('#mv-max_tokens'),
      branch_tokens: int('#mv-branch_tokens'),
      max_branches: int('#mv-max_branches'),
      threshold: Number($('#mv-threshold').value),
    };
    const btn = $('#mv-run');
    btn.disabled = true;
    this.status.dataset.state = 'running';
    this.status.textContent = 'Generating the answer, then every branch at once…';
    try {
      const res = await postJson('/v1/rill/multiverse', body);
      // Each branch's whole token path after the prompt, for drawing, opening and continuing.
      const main = res.branches[0];
      main.path = main.steps.map((st) => ({ ...st }));
      for (const b of res.branches.slice(1)) {
        b.path = main.path.slice(0, b.at).concat([{ ...b.token }], b.steps.map((st) => ({ ...st })));
      }
      this.res = res;
      this.open = null;
      this.compare = [];
      this.params = params;
      this.render();
      const n = res.branches.length - 1;
      this.status.dataset.state = 'done';
      this.status.textContent = n
        ? `${n} branch${n === 1 ? '' : 'es'} where the two most likely tokens were within ${pct(res.threshold)} of each other.`
        : `The model never hesitated by less than ${pct(res.threshold)}: no branch. Raise the threshold.`;
    } catch (err) {
      this.status.dataset.state = 'error';
      this.status.textContent = `The multiverse failed: ${err.message}`;
    } finally {
      btn.disabled = false;
    }
  }

  /** Path log-probability of branch `b` over its first `x` tokens. */
  static cumulative(b, x) {
    let lp = 0;
    for (let i = 0; i < Math.min(x, b.path.length); i++) lp += b.path[i].logprob;
    return lp;
  }

  render() {
    const res = this.res;
    if (!res) return;
    const branches = res.branches;
    const longest = Math.max(...branches.map((b) => b.path.length));
    const W = X0 * 2 + STEP_W * longest + 140;
    const H = Y0 + LANE * branches.length + 10;
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: 'mv-tree', 'data-testid': 'mv-tree', role: 'img', 'aria-label': 'the answer and its branches' });
    // Widths: at every step, each path gets its share of the probability of the paths that
    // have split off by then (a path that already ended keeps its whole probability).
    const share = (b, x) => {
      const alive = branches.filter((o) => o.id === 0 || o.at < x);
      const lps = alive.map((o) => MultiverseView.cumulative(o, x));
      const max = Math.max(...lps);
      const total = lps.reduce((a, lp) => a + Math.exp(lp - max), 0);
      return Math.exp(MultiverseView.cumulative(b, x) - max) / total;
    };
    const laneY = (i) => Y0 + LANE * i;
    branches.forEach((b, i) => {
      const start = b.id === 0 ? 0 : b.at;
      const parentY = laneY(0);
      const y = laneY(i);
      for (let x = start; x < b.path.length; x++) {
        const w = Math.max(1, MAX_W * share(b, x + 1));
        const x1 = X0 + STEP_W * x;
        const x2 = x1 + STEP_W;
        const yFrom = x === start && b.id !== 0 ? parentY : y;
        svg.append(
          s(
            'line',
            { x1, y1: yFrom, x2, y2: y, stroke: branchColor(b.id), 'stroke-width': w.toFixed(2), 'stroke-linecap': 'round', class: 'mv-edge', 'data-testid': 'mv-edge', 'data-branch': b.id, 'data-width': w.toFixed(3) },
            s('title', {}, `“${showToken(b.path[x].text)}” p = ${pct(Math.exp(b.path[x].logprob))}`),
          ),
        );
      }
      const endX = X0 + STEP_W * b.path.length + 6;
      const label = s(
        'text',
        { x: endX, y: y + 4, class: `mv-label${this.open === b.id ? ' open' : ''}`, 'data-testid': 'mv-branch', 'data-branch': b.id, 'data-logprob': b.logprob.toFixed(4), tabindex: 0, role: 'button' },
        b.id === 0 ? 'the answer' : `branch ${b.id}: “${showToken(b.token.text)}”`,
      );
      const activate = () => this.openBranch(b.id);
      label.addEventListener('click', activate);
      label.addEventListener('keydown', (e) => {
        if (e.key === 'Enter' || e.key === ' ') {
          e.preventDefault();
          activate();
        }
      });
      svg.append(label);
    });
    clear($('#mv-svg-wrap')).append(svg);
    this.renderOpen();
    this.renderCompare();
  }

  openBranch(id) {
    this.open = id;
    this.render();
  }

  /** The shared prefix faded, the diverging token marked, the branch's own tokens after it. */
  pathText(b) {
    const split = b.id === 0 ? -1 : b.at;
    return h(
      'div',
      { class: 'mv-text' },
      b.path.map((st, i) =>
        h('span', { class: i < split ? 'mv-shared' : i === split ? 'mv-split' : 'mv-own', title: `p = ${pct(Math.exp(st.logprob))}` }, showToken(st.text)),
      ),
    );
  }

  renderOpen() {
    const box = clear($('#mv-open'));
    const b = this.res && this.res.branches.find((o) => o.id === this.open);
    if (!b) return;
    const cont = h('button', { type: 'button', 'data-testid': 'mv-continue' }, `Continue ${Number($('#mv-branch_tokens').value)} more tokens`);
    cont.addEventListener('click', () => this.continueBranch(b, cont));
    const cmp = h('button', { type: 'button', 'data-testid': 'mv-compare' }, this.compare.includes(b.id) ? 'Remove from comparison' : 'Compare side by side');
    cmp.addEventListener('click', () => {
      this.compare = this.compare.includes(b.id) ? this.compare.filter((x) => x !== b.id) : this.compare.concat([b.id]).slice(-2);
      this.render();
    });
    box.append(
      h('h3', {}, b.id === 0 ? 'The answer' : `Branch ${b.id}`),
      b.id === 0
        ? h('p', { class: 'small' }, `Path probability ${Math.exp(b.logprob).toExponential(2)} (log ${num(b.logprob)}) over ${b.path.length} tokens.`)
        : h(
            'p',
            { class: 'small' },
            `At token ${b.at + 1} the answer took `,
            h('code', { class: 'tok-inline' }, showToken(b.instead_of.text)),
            ` (p = ${pct(Math.exp(b.instead_of.logprob))}); this branch took `,
            h('code', { class: 'tok-inline' }, showToken(b.token.text)),
            ` (p = ${pct(Math.exp(b.token.logprob))}). Path probability ${Math.exp(b.logprob).toExponential(2)} (log ${num(b.logprob)}); ${b.cached_tokens} tokens of its context came from the answer's KV blocks.`,
          ),
      this.pathText(b),
      h('div', { class: 'mv-actions' }, cont, ' ', cmp),
    );
  }

  async continueBranch(b, button) {
    button.disabled = true;
    const n = Number($('#mv-branch_tokens').value);
    try {
      const tokens = this.res.prompt_token_ids.concat(b.path.map((st) => st.token));
      const res = await postJson('/v1/rill/multiverse', { tokens, ...this.params, max_tokens: n, max_branches: 0 });
      const more = res.branches[0];
      b.path = b.path.concat(more.steps);
      b.steps = b.steps.concat(more.steps);
      b.logprob += more.logprob;
      b.text += more.text;
      this.render();
    } catch (err) {
      this.status.dataset.state = 'error';
      this.status.textContent = `Could not continue: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  }

  renderCompare() {
    const box = clear($('#mv-compare'));
    if (this.compare.length < 2) {
      if (this.compare.length === 1) box.append(h('p', { class: 'small muted' }, 'Open another branch and add it to compare them side by side.'));
      return;
    }
    const [a, b] = this.compare.map((id) => this.res.branches.find((o) => o.id === id));
    box.append(
      h('h3', {}, 'Side by side'),
      h(
        'div',
        { class: 'mv-columns', 'data-testid': 'mv-columns' },
        [a, b].map((x) => h('div', { class: 'mv-column', 'data-testid': 'mv-column', 'data-branch': x.id }, h('strong', {}, x.id === 0 ? 'the answer' : `branch ${x.id}`), ` log p ${num(x.logprob)}`, this.pathText(x))),
      ),
    );
  }
}
