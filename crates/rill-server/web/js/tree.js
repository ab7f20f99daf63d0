// The token tree: the main answer and its forks, drawn as lanes (SVG) and as side-by-side cards.

import { $, h, s, clear, chipText, showToken, probColor, probBorder, pct, secs } from './dom.js';
import { ChipGroup, plainChip } from './chips.js';

const DX = 34; // pixels per generated token
const LANE = 70; // pixels per branch lane
const X0 = 70;
const Y0 = 56;

export class TreeView {
  constructor(app) {
    this.app = app;
    this.cards = new Map(); // branch id -> { card, group, status, cached }
    this.wrap = $('#tree-svg-wrap');
    this.cardsEl = $('#branch-cards');
  }

  reset() {
    clear(this.cardsEl);
    this.cards.clear();
    clear(this.wrap).append(h('p', { class: 'empty' }, 'Generating… fork a candidate from the viewer to grow the tree.'));
    $('#tree-count').textContent = '';
    const root = this.app.branches[0];
    if (root) this.addBranch(root);
  }

  addBranch(b) {
    const status = h('span', { class: 'status', 'data-testid': 'branch-status', 'data-state': b.status }, b.status);
    const cached = h('span', { class: 'badge', 'data-testid': 'branch-cached' }, '');
    const stop = h('button', { type: 'button', class: 'small-btn', 'data-testid': 'branch-stop', onclick: () => this.app.stop(b), disabled: true }, 'Stop');
    const chips = h('div', { class: 'chips', role: 'group', 'aria-label': `${b.label}: tokens` });
    let title;
    if (b.id === 0) {
      title = h('h3', {}, 'main');
      const promptText = b.promptText || '';
      if (promptText) chips.append(h('span', { class: 'prefix', title: 'the prompt' }, chipText(promptText.length > 160 ? `…${promptText.slice(-160)}` : promptText)), ' ');
    } else {
      const parentStep = b.parent.steps[b.forkStep];
      title = h(
        'h3',
        {},
        `${b.label} `,
        h('span', { class: 'small muted' }, `from ${b.parent.label}, token ${b.genOffset}: `),
        h('code', {}, showToken(b.alt.text)),
        h('span', { class: 'small muted' }, ' instead of '),
        h('code', {}, showToken(parentStep ? parentStep.token_text : '?')),
      );
      const prefix = b.prefixPieces.map((p) => p.text).join('');
      if (prefix) chips.append(h('span', { class: 'prefix', 'data-testid': 'branch-prefix', title: 'shared with the branch it forked from' }, chipText(prefix)));
      chips.append(
        plainChip(b.alt.text, {
          p: b.alt.raw,
          cls: 'alt',
          testid: 'alt-chip',
          token: b.alt.token,
          title: `chosen by you: raw ${pct(b.alt.raw)}, ${b.alt.p > 0 ? `the sampler gave it ${pct(b.alt.p)}` : 'the sampler had cut it'}`,
        }),
      );
    }
    const card = h(
      'article',
      { class: `card branch-card${b.id === 0 ? ' root' : ''}`, 'data-testid': 'branch-card', 'data-branch': b.id, 'aria-label': b.label },
      h('div', { class: 'row-head' }, title, h('span', { class: 'head-right' }, cached, status, stop)),
      chips,
      h('p', { class: 'small muted branch-foot', 'data-testid': 'branch-foot' }),
    );
    const group = new ChipGroup(chips, { onActivate: (i) => this.app.select(b, i, { reveal: true }) });
    this.cards.set(b.id, { card, group, status, cached, stop, foot: card.querySelector('.branch-foot') });
    this.cardsEl.append(card);
    for (const step of b.steps) group.add(step, { branch: b.id });
    this.updateCard(b);
  }

  addToken(b, step) {
    const c = this.cards.get(b.id);
    if (c) c.group.add(step, { branch: b.id });
  }

  updateCard(b) {
    const c = this.cards.get(b.id);
    if (!c) return;
    c.status.textContent = b.status === 'error' ? `error: ${b.error}` : b.status;
    c.status.dataset.state = b.status;
    c.stop.disabled = b.status !== 'streaming';
    const cachedN = b.cachedTokens;
    if (b.prompt || b.usage) {
      const total = b.prompt ? b.prompt.tokens.length : b.usage ? b.usage.prompt_tokens : '?';
      c.cached.textContent = `cached ${cachedN === null || cachedN === undefined ? '?' : cachedN} of ${total} prompt tokens`;
      c.cached.dataset.cached = String(cachedN);
      c.cached.title = 'prompt tokens whose keys and values came from the prefix cache';
    }
    const parts = [`${b.steps.length} token${b.steps.length === 1 ? '' : 's'}`];
    if (b.prompt) parts.push(`prefill ${secs(b.prompt.prefill_seconds)} for ${b.prompt.computed_tokens} computed tokens`);
    if (b.finish) parts.push(`finish: ${b.finish}`);
    if (b.id !== 0 && b.requestedTokens) parts.push(`max_tokens ${b.requestedTokens} (what was left)`);
    c.foot.textContent = parts.join(' · ');
  }

  setSelected(b, index) {
    for (const [id, c] of this.cards) c.group.setSelected(id === b.id ? index : -1);
    this.selectedKey = `${b.id}:${index}`;
    if (this.app.view === 'tree') this.draw();
  }

  /** Lanes in depth-first order, children after their parent (latest fork point first). */
  lanes() {
    const out = [];
    const visit = (b) => {
      out.push(b);
      const kids = [...b.children].sort((a, c) => c.forkStep - a.forkStep || a.id - c.id);
      for (const k of kids) visit(k);
    };
    if (this.app.branches[0]) visit(this.app.branches[0]);
    return out;
  }

  draw() {
    const branches = this.app.branches;
    if (!branches.length) return;
    const lanes = this.lanes();
    const laneOf = new Map(lanes.map((b, i) => [b.id, i]));
    let maxG = 1;
    for (const b of branches) maxG = Math.max(maxG, b.genOffset + b.steps.length);
    const width = X0 + maxG * DX + 40;
    const height = Y0 + (lanes.length - 1) * LANE + 34;
    const xOf = (g) => X0 + g * DX;
    const yOf = (b) => Y0 + laneOf.get(b.id) * LANE;
    const svg = s('svg', {
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      class: 'tree-svg',
      'data-testid': 'tree-svg',
      role: 'img',
      'aria-label': `Token tree: ${branches.length} branch${branches.length === 1 ? '' : 'es'}`,
    });
    const edges = s('g', { class: 'edges' });
    const nodes = s('g', { class: 'nodes' });
    svg.append(edges, nodes);
    // the prompt
    const rootY = Y0;
    nodes.append(s('rect', { x: 8, y: rootY - 11, width: 44, height: 22, rx: 5, class: 'prompt-node' }), s('text', { x: 30, y: rootY + 4, 'text-anchor': 'middle', class: 'lbl' }, 'prompt'));
    for (const b of lanes) {
      const y = yOf(b);
      let prevX, prevY;
      if (b.id === 0) {
        prevX = 52;
        prevY = rootY;
      } else {
        // the alternative token, at the step it replaced
        const g = b.genOffset - 1;
        const px = g === 0 ? 52 : xOf(g - 1);
        const py = yOf(b.parent);
        const ax = xOf(g);
        edges.append(s('path', { d: `M${px},${py} C${px + DX / 2},${py} ${ax - DX / 2},${y} ${ax},${y}`, class: 'edge fork-edge' }));
        nodes.append(this.node(b, -1, ax, y, { token: b.alt.token, token_text: b.alt.text, probability: b.alt.raw }, true));
        if (b.parent) nodes.append(s('text', { x: ax, y: y + 24, 'text-anchor': 'middle', class: 'lbl small-lbl' }, `fork ${b.id}`));
        prevX = ax;
        prevY = y;
      }
      b.steps.forEach((step, i) => {
        const x = xOf(b.genOffset + i);
        edges.append(s('line', { x1: prevX, y1: prevY, x2: x, y2: y, class: 'edge' }));
        nodes.append(this.node(b, i, x, y, step, false));
        prevX = x;
        prevY = y;
      });
      if (b.status === 'streaming') {
        nodes.append(s('text', { x: prevX + 14, y: y + 4, class: 'lbl muted-lbl' }, '…'));
      }
    }
    clear(this.wrap).append(svg);
  }

  node(b, i, x, y, step, isAlt) {
    const p = step.probability;
    const selected = this.selectedKey === `${b.id}:${i}`;
    const label = showToken(step.token_text);
    const g = s(
      'g',
      {
        class: `tnode${isAlt ? ' alt' : ''}${selected ? ' selected' : ''}`,
        'data-testid': 'tree-node',
        'data-branch': b.id,
        'data-index': i,
        transform: `translate(${x},${y})`,
      },
      s('title', {}, `${b.label} · ${label} · ${isAlt ? 'chosen by you' : `p = ${pct(p)}`}`),
      s('circle', { r: isAlt ? 8 : 7, fill: probColor(p, 70), stroke: probBorder(p), class: 'dot' }),
      s('text', { class: 'tok-lbl', transform: 'rotate(-40) translate(8,-6)' }, label.length > 10 ? `${label.slice(0, 9)}…` : label),
    );
    if (!isAlt) g.addEventListener('click', () => this.app.select(b, i));
    return g;
  }
}
