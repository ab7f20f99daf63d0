// The token probability viewer: one step's full next-token distribution, fetched as raw logits
// from /v1/rill/distribution and reshaped live in the browser (js/sampling.js).

import { postJson, isAbort } from './api.js';
import { $, h, add, clear, showToken, pct, num, prob, probColor, legendItems } from './dom.js';
import { LayersTier } from './layers.js';
import { constraintMask, decodeLogits, prepare, reshape, CUT_LABELS, KEPT } from './sampling.js';

const BARS = 25;

export class Viewer {
  constructor(app) {
    this.app = app;
    this.cache = new Map(); // context key -> { dist, logits }
    this.prepCache = new Map();
    this.seq = 0;
    this.branch = null;
    this.index = -1;
    this.prep = null;
    this.rows = [];
    this.els = {
      step: $('#viewer-step'),
      stats: $('#vw-stats'),
      bars: $('#vw-bars'),
      penalties: $('#vw-penalties'),
      penaltiesWrap: $('#vw-penalties-wrap'),
    };
    this.layers = new LayersTier($('#vw-lens'));
    this.sliders = {};
    for (const name of ['temperature', 'top_k', 'top_p', 'min_p']) {
      const input = $(`#vw-${name}`);
      const out = $(`#vw-${name}-out`);
      this.sliders[name] = { input, out };
      input.addEventListener('input', () => {
        this.showSliderValues();
        this.schedule();
      });
    }
    $('#vw-reset').addEventListener('click', () => {
      if (this.branch) this.setSliders(this.branch.params);
      this.els.penalties.checked = true;
      this.rebuild();
    });
    this.els.penalties.addEventListener('change', () => this.rebuild());
    this.pending = false;
    this.showSliderValues();
  }

  reset() {
    this.seq++;
    this.branch = null;
    this.index = -1;
    this.prep = null;
    this.dist = null;
    this.rows = [];
    this.els.step.textContent = 'Click a token to open its step here.';
    clear(this.els.stats);
    clear(this.els.bars);
    this.els.bars.dataset.state = 'empty';
    this.layers.reset();
    // a new generation: new contexts, but the cached distributions stay valid (same model)
    if (this.cache.size > 64) this.cache.clear();
    this.prepCache.clear();
  }

  params() {
    const v = (n) => Number(this.sliders[n].input.value);
    return { temperature: v('temperature'), topK: Math.round(v('top_k')), topP: v('top_p'), minP: v('min_p') };
  }

  setSliders(p) {
    const set = (n, x) => {
      const input = this.sliders[n].input;
      if (n === 'top_k' && x > Number(input.max)) input.max = String(x);
      input.value = String(x);
    };
    set('temperature', p.temperature === undefined ? 1 : p.temperature);
    set('top_k', p.top_k || 0);
    set('top_p', p.top_p === undefined ? 1 : p.top_p);
    set('min_p', p.min_p || 0);
    this.showSliderValues();
  }

  showSliderValues() {
    const p = this.params();
    this.sliders.temperature.out.textContent = p.temperature === 0 ? '0 (greedy)' : num(p.temperature);
    this.sliders.top_k.out.textContent = p.topK === 0 ? 'off' : String(p.topK);
    this.sliders.top_p.out.textContent = p.topP >= 1 ? '1 (off)' : num(p.topP);
    this.sliders.min_p.out.textContent = p.minP <= 0 ? '0 (off)' : num(p.minP);
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  penaltyParams(branch) {
    const p = branch.params;
    const rep = p.repetition_penalty === undefined ? 1 : p.repetition_penalty;
    const pres = p.presence_penalty || 0;
    const freq = p.frequency_penalty || 0;
    if (rep === 1 && pres === 0 && freq === 0) return null;
    return { repetition: rep, presence: pres, frequency: freq, lastN: 64 };
  }

  /** Opens `branch`'s step `index`. */
  async show(branch, index) {
    const seq = ++this.seq;
    this.branch = branch;
    this.index = index;
    const step = branch.steps[index];
    const ctx = branch.contextAt(index);
    this.ctx = ctx;
    this.setSliders(branch.params);
    this.els.penaltiesWrap.hidden = !this.penaltyParams(branch);
    this.els.penalties.checked = true;
    add(
      clear(this.els.step),
      h('strong', {}, `${branch.label}, token ${branch.genOffset + index + 1}`),
      ` · after ${ctx.length} tokens the model chose `,
      h('code', { class: 'tok-inline' }, showToken(step.token_text)),
      ` (${step.rule === 'greedy' ? 'greedy' : `sampled at p = ${prob(step.probability)}`}, raw ${pct(Math.exp(step.raw_logprob))})`,
      // A reasoning model's thinking: the same choice, returned apart from the answer.
      step.part === 'reasoning'
        ? h('span', { class: 'thinking-note', 'data-testid': 'viewer-thinking' }, ' · part of the model’s thinking, returned apart from the answer')
        : null,
    );
    this.els.bars.dataset.state = 'loading';
    this.els.bars.setAttribute('aria-busy', 'true');
    clear(this.els.stats).append(h('p', { class: 'small muted' }, 'Fetching the whole distribution…'));
    const key = ctx.join(',');
    try {
      let entry = this.cache.get(key);
      if (!entry) {
        const dist = await postJson('/v1/rill/distribution', { tokens: ctx });
        entry = { dist, logits: decodeLogits(dist.logits) };
        if (entry.logits.length !== dist.vocab_size) {
          throw new Error(`the logits hold ${entry.logits.length} values, vocab_size says ${dist.vocab_size}`);
        }
        this.cache.set(key, entry);
      }
      if (seq !== this.seq) return;
      this.dist = entry.dist;
      this.logits = entry.logits;
      this.texts = new Map();
      for (const c of step.top || []) this.texts.set(c.token, c.text);
      for (const c of step.processed_top || []) this.texts.set(c.token, c.text);
      for (const c of entry.dist.top || []) this.texts.set(c.token, c.text);
      for (const c of (step.constraint && step.constraint.allowed_tokens) || []) this.texts.set(c.token, c.text);
      this.texts.set(step.token, step.token_text);
      this.rebuild();
      this.layers.show(ctx, step);
    } catch (err) {
      if (seq !== this.seq || isAbort(err)) return;
      this.els.bars.dataset.state = 'error';
      this.els.bars.removeAttribute('aria-busy');
      clear(this.els.stats).append(h('p', { class: 'error' }, `Could not fetch the distribution: ${err.message}`));
    }
  }

  /** Prepares (penalties, sort) and rebuilds the bar rows, then renders. */
  rebuild() {
    if (!this.logits || !this.branch) return;
    const pen = this.els.penalties.checked ? this.penaltyParams(this.branch) : null;
    const step = this.branch.steps[this.index];
    const key = `${this.ctx.join(',')}|${pen ? JSON.stringify(pen) : ''}|${step.constraint ? `${this.branch.id}:${this.index}` : ''}`;
    let prep = this.prepCache.get(key);
    if (!prep) {
      const allowed = constraintMask(step.constraint, this.logits.length);
      prep = prepare(this.logits, { context: this.ctx, penalties: pen, allowed });
      this.prepCache.set(key, prep);
    }
    this.prep = prep;
    this.penaltiesOn = !!pen;
    const ranks = [];
    for (let r = 0; r < Math.min(BARS, prep.vocab); r++) ranks.push(r);
    const chosenRank = prep.order.indexOf(step.token);
    if (chosenRank >= BARS) ranks.push(chosenRank);
    clear(this.els.bars);
    this.rows = ranks.map((r) => this.row(r, prep.order[r], step));
    this.els.bars.dataset.state = 'ready';
    this.els.bars.removeAttribute('aria-busy');
    this.render();
  }

  row(rank, token, step) {
    const text = this.texts.has(token) ? this.texts.get(token) : `#${token}`;
    const chosen = token === step.token;
    const ghost = h('span', { class: 'ghost' });
    const fill = h('span', { class: 'fill' });
    const nums = h('span', { class: 'nums' });
    const cut = h('span', { class: 'cutlabel', 'data-testid': 'cut-label' });
    const fork = h(
      'button',
      {
        type: 'button',
        class: 'fork',
        'data-testid': 'fork',
        'data-token': token,
        disabled: chosen,
        'aria-label': chosen ? `“${showToken(text)}” is the token the model chose` : `Fork: take “${showToken(text)}” here and continue`,
        onclick: () => this.fork(token, text),
      },
      chosen ? 'chosen' : 'fork ↳',
    );
    const el = h(
      'div',
      {
        class: `bar-row${chosen ? ' chosen' : ''}${rank >= BARS ? ' extra' : ''}`,
        role: 'listitem',
        'data-testid': 'bar',
        'data-token': token,
        'data-rank': rank + 1,
      },
      h('span', { class: 'rank' }, rank + 1),
      h('code', { class: 'tok', title: `token id ${token}` }, showToken(text)),
      h('span', { class: 'track' }, ghost, fill),
      nums,
      cut,
      fork,
    );
    this.els.bars.append(el);
    return { el, token, rank, ghost, fill, nums, cut, text };
  }

  fork(token, text) {
    if (!this.branch || !this.res) return;
    const raw = this.prep.rawProbs[token];
    const p = this.res.probs[token];
    this.app.fork(this.branch, this.index, token, text, { raw, p });
  }

  render() {
    if (!this.prep || !this.branch) return;
    const prep = this.prep;
    const params = this.params();
    const res = reshape(prep, params);
    this.res = res;
    const step = this.branch.steps[this.index];
    let scale = 0;
    for (const r of this.rows) scale = Math.max(scale, prep.rawProbs[r.token], res.probs[r.token]);
    scale = scale || 1;
    for (const r of this.rows) {
      const raw = prep.rawProbs[r.token];
      const p = res.probs[r.token];
      const cutBy = res.cutBy[r.token];
      r.ghost.style.width = `${(100 * raw) / scale}%`;
      r.fill.style.width = `${(100 * p) / scale}%`;
      r.fill.style.background = probColor(p, 55);
      r.el.classList.toggle('cut', cutBy !== KEPT);
      r.el.dataset.raw = String(raw);
      r.el.dataset.p = String(p);
      r.el.dataset.cut = cutBy === KEPT ? '' : CUT_LABELS[cutBy];
      const delta = p - raw;
      r.nums.textContent = cutBy === KEPT ? `${pct(raw)} → ${pct(p)}` : `${pct(raw)} → 0`;
      r.nums.title = cutBy === KEPT ? `${delta >= 0 ? '+' : ''}${(delta * 100).toFixed(2)} points` : 'cut';
      r.cut.textContent = cutBy === KEPT ? (delta > 0.0005 ? `+${(delta * 100).toFixed(1)}` : delta < -0.0005 ? (delta * 100).toFixed(1) : '') : `cut by ${CUT_LABELS[cutBy]}`;
      r.cut.classList.toggle('is-cut', cutBy !== KEPT);
      r.cut.classList.toggle('up', cutBy === KEPT && delta > 0.0005);
      r.cut.classList.toggle('down', cutBy === KEPT && delta < -0.0005);
    }
    this.renderStats(res, params, step);
  }

  renderStats(res, params, step) {
    const prep = this.prep;
    const V = prep.vocab;
    const greedy = params.temperature === 0;
    const seg = (w, cls, label) => (w > 0.0005 ? h('span', { class: `seg ${cls}`, style: { width: `${w * 100}%` }, title: `${label}: ${pct(w)}` }) : null);
    const grammarSeg = seg(1 - res.massGrammar, 'c-grammar', 'cut by the constraint');
    const flow = greedy
      ? [seg(res.massMinP, 'kept', 'kept'), seg(res.massGrammar - res.massMinP, 'c-greedy', 'cut by T = 0'), grammarSeg]
      : [
          seg(res.massMinP, 'kept', 'kept'),
          seg(res.massTopP - res.massMinP, 'c-minp', 'cut by min-p'),
          seg(res.massTopK - res.massTopP, 'c-topp', 'cut by top-p'),
          seg(res.massGrammar - res.massTopK, 'c-topk', 'cut by top-k'),
          grammarSeg,
        ];
    const c = step.constraint;
    const stage = (name, on, n, mass, what) =>
      h(
        'li',
        { class: on ? '' : 'off' },
        h('strong', {}, name),
        on ? ` keeps ${n.toLocaleString()} token${n === 1 ? '' : 's'}, ${pct(mass, 2)} of the raw mass` : ` off${what ? ` (${what})` : ''}`,
      );
    const chosenRaw = prep.rawProbs[step.token];
    const chosenP = res.probs[step.token];
    const gen = this.branch.params;
    const atGen =
      Math.abs(params.temperature - (gen.temperature === undefined ? 1 : gen.temperature)) < 1e-9 &&
      params.topK === (gen.top_k || 0) &&
      Math.abs(params.topP - (gen.top_p === undefined ? 1 : gen.top_p)) < 1e-9 &&
      Math.abs(params.minP - (gen.min_p || 0)) < 1e-9 &&
      (this.penaltiesOn || !this.penaltyParams(this.branch));
    let check = null;
    if (atGen && typeof step.probability === 'number') {
      const diff = Math.abs(chosenP - step.probability);
      check = h(
        'p',
        { class: `check-line ${diff < 2e-3 ? 'ok' : 'warn'}`, 'data-testid': 'engine-check' },
        `At the generation's settings the chosen token gets p = ${prob(chosenP)} here; the engine drew it with p = ${prob(step.probability)}`,
        diff < 2e-3 ? ' ✓' : ' (they differ)',
      );
    }
    add(
      clear(this.els.stats),
      h('div', { class: 'flow', role: 'img', 'aria-label': `Raw probability mass: ${pct(res.massMinP)} kept, ${pct(res.cutMass)} cut` }, flow),
      h('div', { class: 'flow-legend small' }, legendItems([['kept', 'kept'], ['c-topk', 'cut by top-k'], ['c-topp', 'top-p'], ['c-minp', 'min-p'], ['c-greedy', 'T = 0'], c ? ['c-grammar', 'constraint'] : null])),
      h(
        'ol',
        { class: 'stages small' },
        c
          ? h(
              'li',
              { 'data-testid': 'grammar-stage' },
              h('strong', {}, `${c.kind} constraint`),
              c.forced
                ? ' allows one token only: it forces it'
                : ` keeps ${res.afterGrammar.toLocaleString()} token${res.afterGrammar === 1 ? '' : 's'}, ${pct(res.massGrammar, 2)} of the raw mass; the stages below work on them alone`,
            )
          : null,
        this.penaltiesOn ? h('li', {}, h('strong', {}, 'penalties'), ' applied to the logits first (repetition, presence, frequency over the last 64 tokens)') : null,
        greedy
          ? h('li', {}, h('strong', {}, 'temperature 0'), ` (greedy) keeps only the most likely token: top-k, top-p and min-p are skipped`)
          : [
              stage('top-k', params.topK > 0 && params.topK < V, res.afterTopK, res.massTopK),
              stage('top-p', params.topP < 1, res.afterTopP, res.massTopP),
              stage('min-p', params.minP > 0, res.afterMinP, res.massMinP),
              h(
                'li',
                {},
                h('strong', {}, `temperature ${num(params.temperature)}`),
                params.temperature < 1 ? ' sharpens what is left (logits ÷ T > logits)' : params.temperature > 1 ? ' flattens what is left (logits ÷ T < logits)' : ' leaves the shape as is',
              ),
            ],
      ),
      h(
        'p',
        { class: 'small', 'data-testid': 'mass-line' },
        `Cut: ${(V - res.kept).toLocaleString()} of ${V.toLocaleString()} tokens, holding ${pct(res.cutMass, 2)} of the raw probability, now spread over the ${res.kept.toLocaleString()} kept. Entropy ${num(res.rawEntropy)} → ${num(res.entropy)} nats. The chosen token: raw ${pct(chosenRaw, 2)} → ${pct(chosenP, 2)}.`,
      ),
      check,
      step.draw && !(c && c.forced) ? this.drawFigure(step) : null,
      this.dist ? h('p', { class: 'small muted' }, `Distribution after ${this.dist.tokens} tokens: ${this.dist.cached_tokens} from the prefix cache, ${num((this.dist.seconds || 0) * 1000, 1)} ms on the server.`) : null,
    );
  }

  /** The draw, literally: the engine's cumulative distribution as one bar, the chosen token's
   * interval highlighted and the uniform it drew as a marker (the seeds' "why this token"). */
  drawFigure(step) {
    const d = step.draw;
    const at = (x) => `${(100 * Math.min(Math.max(x, 0), 1)).toFixed(3)}%`;
    const text = (this.texts && this.texts.get(step.token)) || `#${step.token}`;
    const chosenWidth = Math.max(d.to - d.from, 0.003);
    return h(
      'figure',
      { class: 'draw', 'data-testid': 'viewer-draw', 'data-uniform': String(d.uniform), 'data-from': String(d.from), 'data-to': String(d.to) },
      h(
        'div',
        { class: 'draw-bar', role: 'img', 'aria-label': `cumulative distribution from 0 to 1; the chosen token covers ${d.from.toFixed(4)} to ${d.to.toFixed(4)}; the generator drew ${d.uniform.toFixed(4)}` },
        h('span', { class: 'draw-before', style: { width: at(d.from) } }),
        h('span', { class: 'draw-chosen', 'data-testid': 'draw-chosen', style: { left: at(d.from), width: at(chosenWidth) } }),
        h('span', { class: 'draw-u', 'data-testid': 'draw-u', style: { left: at(d.uniform) } }),
      ),
      h('div', { class: 'draw-scale small', 'aria-hidden': 'true' }, h('span', {}, '0'), h('span', {}, `u = ${d.uniform.toFixed(4)}`), h('span', {}, '1')),
      h(
        'figcaption',
        { class: 'small', 'data-testid': 'draw-caption' },
        'Why this token, literally: at the generation\'s settings the kept tokens lie end to end on [0, 1), each as wide as its probability, ',
        h('strong', {}, 'in the order the sampler lists them'),
        ` (its candidate order, not sorted by probability; shaded: the tokens listed before it). The generator drew u = ${d.uniform.toFixed(4)}, which fell in [${d.from.toFixed(4)}, ${d.to.toFixed(4)}): the interval of `,
        showToken(text),
        ` (p = ${prob(step.probability)}).`,
      ),
    );
  }
}
