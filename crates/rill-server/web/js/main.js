// The glass box: application state, the Generate form, streaming, tabs, and the wiring between
// the panels (viewer, tree, beam, speculative, cost).

import { getJson, postJson, postStream, getApiKey, setApiKey, isAbort } from './api.js';
import { $, $$, h, clear, showToken, num, secs, pct } from './dom.js';
import { ChipGroup, initTooltip, hideTooltip } from './chips.js';
import { Viewer } from './viewer.js';
import { TreeView } from './tree.js';
import { BeamView } from './beam.js';
import { SpeculativeView } from './speculative.js';
import { CostView } from './cost.js';
import { ServerView } from './server.js';
import { MultiverseView } from './multiverse.js';

/** One generated sequence: the main answer (id 0) or a fork of another branch. */
class Branch {
  constructor(fields) {
    this.id = 0;
    this.parent = null; // Branch
    this.forkStep = -1; // index in parent.steps that this branch replaced
    this.alt = null; // { token, text, raw, p }: the token chosen instead
    this.base = null; // prompt token ids of this branch's request (known from the first token)
    this.genOffset = 0; // generated tokens on the path before this branch's own steps (alt included)
    this.prefixPieces = []; // [{ token, text }] those tokens, for display
    this.steps = []; // rill objects, one per generated token
    this.text = '';
    this.params = {}; // sampling fields of the request
    this.maxTokens = 0; // the main generation's max_tokens (a fork gets what is left)
    this.status = 'idle'; // streaming | done | stopped | error
    this.finish = null;
    this.stopReason = null;
    this.usage = null;
    this.prompt = null; // rill.prompt of the first token
    this.error = null;
    this.controller = null;
    this.children = [];
    Object.assign(this, fields);
  }

  /** Token ids the model had read when it produced step j. */
  contextAt(j) {
    return (this.base || []).concat(this.steps.slice(0, j).map((s) => s.token));
  }

  get label() {
    return this.id === 0 ? 'main' : `fork ${this.id}`;
  }

  get cachedTokens() {
    const u = this.usage && this.usage.prompt_tokens_details;
    if (u && typeof u.cached_tokens === 'number') return u.cached_tokens;
    return this.prompt ? this.prompt.cached_tokens : null;
  }
}

class App {
  constructor() {
    this.model = null;
    this.branches = [];
    this.selected = null; // { branch, index }
    this.view = 'generate';
    this.listeners = [];
    this.rafPending = false;
    this.dirty = new Set();
  }

  init() {
    initTooltip();
    this.initKey();
    this.initTabs();
    this.initForm();
    this.genGroup = new ChipGroup($('#gen-output'), { onActivate: (i) => this.select(this.branches[0], i, { reveal: true }) });
    this.viewer = new Viewer(this);
    this.tree = new TreeView(this);
    this.beam = new BeamView(this);
    this.spec = new SpeculativeView(this);
    this.cost = new CostView(this);
    this.server = new ServerView(this);
    this.multiverse = new MultiverseView(this);
    this.loadModel();
  }

  // ---------------------------------------------------------------- header

  initKey() {
    const input = $('#api-key');
    input.value = getApiKey();
    input.addEventListener('change', () => {
      setApiKey(input.value.trim());
      this.loadModel();
    });
  }

  async loadModel() {
    const el = $('#model-info');
    try {
      const m = await getJson('/v1/rill/model');
      this.model = m;
      el.textContent = `${m.name} · ${m.architecture} · ${m.n_layers} layers · d_model ${m.d_model} · vocab ${m.vocab_size} · context ${m.context} · ${m.threads} threads`;
      el.dataset.state = 'ready';
      this.changed('model');
    } catch (err) {
      el.textContent = `model info unavailable (${err.message})${err.status === 401 ? ': set the API key' : ''}`;
      el.dataset.state = 'error';
    }
  }

  // ---------------------------------------------------------------- tabs

  initTabs() {
    const tabs = $$('[role=tab]');
    tabs.forEach((tab, i) => {
      tab.addEventListener('click', () => this.showView(tab.dataset.view));
      tab.addEventListener('keydown', (e) => {
        let j = null;
        if (e.key === 'ArrowRight') j = (i + 1) % tabs.length;
        else if (e.key === 'ArrowLeft') j = (i - 1 + tabs.length) % tabs.length;
        else if (e.key === 'Home') j = 0;
        else if (e.key === 'End') j = tabs.length - 1;
        if (j !== null) {
          e.preventDefault();
          this.showView(tabs[j].dataset.view);
          tabs[j].focus();
        }
      });
    });
  }

  showView(view) {
    hideTooltip();
    this.view = view;
    for (const tab of $$('[role=tab]')) {
      const on = tab.dataset.view === view;
      tab.setAttribute('aria-selected', on ? 'true' : 'false');
      tab.tabIndex = on ? 0 : -1;
    }
    for (const panel of $$('[role=tabpanel]')) panel.hidden = panel.id !== `panel-${view}`;
    // The viewer lives on the Generate tab and follows you to the Tree tab.
    const viewerEl = $('#viewer');
    if (view === 'tree') $('#tree-viewer-slot').append(viewerEl);
    else if (view === 'generate') $('.gen-right').append(viewerEl);
    if (view === 'tree') this.tree.draw();
    if (view === 'cost') this.cost.render();
    this.server.setActive(view === 'server');
  }

  // ---------------------------------------------------------------- the form

  initForm() {
    const form = $('#gen-form');
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.generate();
    });
    $('#stop').addEventListener('click', () => this.stop(this.branches[0]));
    for (const r of $$('input[name=mode]')) {
      r.addEventListener('change', () => {
        $('#mode-explain').textContent =
          this.mode() === 'chat'
            ? "Chat: your text becomes a user message and goes through the model's chat template."
            : 'Completion: your text is fed to the model as is, and it continues it.';
        $('#system-field').hidden = this.mode() !== 'chat';
      });
    }
    $('#prompt').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        this.generate();
      }
    });
  }

  mode() {
    return $('input[name=mode]:checked').value;
  }

  /** The prompt part of a request body for the current mode: { messages } or { prompt }. */
  promptBody() {
    const text = $('#prompt').value;
    if (this.mode() === 'chat') {
      const system = $('#system').value.trim();
      const messages = system ? [{ role: 'system', content: system }] : [];
      messages.push({ role: 'user', content: text });
      return { messages };
    }
    return { prompt: text };
  }

  /** Reads the sampling fields; throws an Error naming a bad one. */
  readParams() {
    const val = (name) => $(`#f-${name}`).value.trim();
    const number = (name, { int = false, min = -Infinity, max = Infinity } = {}) => {
      const v = val(name);
      if (v === '') return null;
      const x = Number(v);
      if (!Number.isFinite(x) || (int && !Number.isInteger(x)) || x < min || x > max) {
        throw new Error(`${name}: ${v} is not ${int ? 'an integer' : 'a number'} in [${min}, ${max}]`);
      }
      return x;
    };
    const params = {};
    const maxTokens = number('max_tokens', { int: true, min: 1 });
    const temperature = number('temperature', { min: 0, max: 2 });
    params.temperature = temperature === null ? 1 : temperature;
    const topK = number('top_k', { int: true, min: 0 });
    if (topK) params.top_k = topK;
    const topP = number('top_p', { min: 0, max: 1 });
    if (topP !== null && topP < 1) params.top_p = topP;
    const minP = number('min_p', { min: 0, max: 1 });
    if (minP) params.min_p = minP;
    const rep = number('repetition_penalty', { min: 0 });
    if (rep !== null && rep !== 1) params.repetition_penalty = rep;
    const pres = number('presence_penalty', { min: -2, max: 2 });
    if (pres) params.presence_penalty = pres;
    const freq = number('frequency_penalty', { min: -2, max: 2 });
    if (freq) params.frequency_penalty = freq;
    const seed = number('seed', { int: true, min: 0 });
    if (seed !== null) params.seed = seed;
    const stops = val('stop')
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => l.replace(/\\(n|t|\\)/g, (_, c) => (c === 'n' ? '\n' : c === 't' ? '\t' : '\\')));
    if (stops.length > 16) throw new Error('stop: at most 16 strings');
    if (stops.length) params.stop = stops;
    const constraint = this.readConstraint();
    if (constraint) params.structured_outputs = constraint;
    return { params, maxTokens: maxTokens === null ? 48 : maxTokens };
  }

  /** The structured-output constraint (vLLM's `structured_outputs`), or null. */
  readConstraint() {
    const kind = $('#f-constraint').value;
    const value = $('#f-constraint_value').value;
    switch (kind) {
      case '':
        return null;
      case 'json_object':
        return { json_object: true };
      case 'json':
        try {
          return { json: JSON.parse(value) };
        } catch (err) {
          throw new Error(`constraint: the schema is not JSON (${err.message})`);
        }
      case 'choice': {
        const choices = value.split('\n').filter((l) => l !== '');
        if (!choices.length) throw new Error('constraint: give at least one choice');
        return { choice: choices };
      }
      default:
        if (!value.trim()) throw new Error(`constraint: the ${kind} is empty`);
        return { [kind]: value };
    }
  }

  showError(msg) {
    const el = $('#gen-error');
    el.textContent = msg || '';
    el.hidden = !msg;
  }

  // ---------------------------------------------------------------- generation

  generate() {
    let read;
    try {
      read = this.readParams();
    } catch (err) {
      this.showError(err.message);
      return;
    }
    this.showError('');
    for (const b of this.branches) if (b.controller) b.controller.abort();
    const root = new Branch({ id: 0, params: read.params, maxTokens: read.maxTokens, mode: this.mode(), promptText: $('#prompt').value });
    this.branches = [root];
    this.selected = null;
    this.genGroup.clear();
    $('#gen-summary').textContent = '';
    this.viewer.reset();
    this.tree.reset();
    this.changed('reset');
    const body = {
      ...this.promptBody(),
      ...read.params,
      max_tokens: read.maxTokens,
      stream: true,
      explain: true,
      stream_options: { include_usage: true },
    };
    const path = root.mode === 'chat' ? '/v1/chat/completions' : '/v1/completions';
    this.stream(root, path, body);
  }

  /** Forks a branch: at `branch`'s step `index`, take `token` instead and let the model go on. */
  fork(branch, index, token, text, info = {}) {
    if (!branch.base) return;
    const root = this.branches[0];
    const prompt = branch.contextAt(index).concat([token]);
    const used = branch.genOffset + index + 1;
    const left = Math.max(1, root.maxTokens - used);
    const child = new Branch({
      id: this.branches.length,
      parent: branch,
      forkStep: index,
      alt: { token, text, raw: info.raw, p: info.p },
      base: prompt,
      genOffset: used,
      prefixPieces: branch.prefixPieces.concat(branch.steps.slice(0, index).map((s) => ({ token: s.token, text: s.token_text }))),
      params: { ...root.params },
      maxTokens: root.maxTokens,
      requestedTokens: left,
      mode: 'completion',
    });
    branch.children.push(child);
    this.branches.push(child);
    $('#tree-count').textContent = `(${this.branches.length})`;
    this.tree.addBranch(child);
    this.changed('branch', child);
    this.showView('tree');
    const body = {
      prompt,
      ...child.params,
      max_tokens: left,
      stream: true,
      explain: true,
      stream_options: { include_usage: true },
    };
    // A constrained branch goes on inside the constraint: from the generated tokens before
    // the fork and the chosen one.
    if (child.params.structured_outputs) body.constraint_prefix = child.prefixPieces.map((p) => p.token).concat([token]);
    this.stream(child, '/v1/completions', body);
    return child;
  }

  stop(branch) {
    if (branch && branch.controller) branch.controller.abort();
  }

  async stream(branch, path, body) {
    const controller = new AbortController();
    branch.controller = controller;
    branch.status = 'streaming';
    branch.started = performance.now();
    this.branchStatus(branch);
    try {
      const onHeaders = (h) => {
        branch.receipt = h.get('x-rill-receipt');
      };
      await postStream(path, body, (obj) => this.chunk(branch, obj), { signal: controller.signal, onHeaders });
      branch.status = 'done';
    } catch (err) {
      if (isAbort(err)) {
        branch.status = 'stopped';
      } else {
        branch.status = 'error';
        branch.error = err.message;
      }
    } finally {
      if (branch.controller === controller) branch.controller = null;
    }
    if (!this.branches.includes(branch)) return; // a newer generation replaced it
    this.branchStatus(branch);
    this.changed('done', branch);
  }

  /** The tokenization tier: the prompt's tokens as the model saw them, cached blocks shaded. */
  async showPrompt(prompt, blockSize) {
    const box = $('#prompt-tokens');
    const summary = $('#prompt-summary');
    clear(box);
    summary.textContent = 'Fetching the tokens…';
    let pieces;
    try {
      pieces = (await postJson('/detokenize', { tokens: prompt.tokens, pieces: true })).pieces;
    } catch (err) {
      summary.textContent = `Could not fetch the prompt's tokens: ${err.message}`;
      return;
    }
    const cached = prompt.cached_tokens || 0;
    let special = 0;
    pieces.forEach((p, i) => {
      if (i > 0 && i % blockSize === 0) box.append(h('span', { class: 'block-sep', 'aria-hidden': 'true' }));
      if (p.special) special++;
      const bytes = p.bytes.map((b) => b.toString(16).padStart(2, '0')).join(' ');
      box.append(
        h(
          'span',
          {
            class: `chip plain prompt-token${p.special ? ' special' : ''}${i < cached ? ' cached' : ''}`,
            'data-testid': 'prompt-token',
            'data-token': p.token,
            'data-special': p.special ? 'true' : 'false',
            'data-cached': i < cached ? 'true' : 'false',
            title: `position ${i} · id ${p.token} · bytes ${bytes || '(none)'}${p.special ? ' · special token' : ''}${i < cached ? ' · from the prefix cache' : ''}`,
          },
          showToken(p.text),
        ),
      );
    });
    summary.textContent = `${pieces.length} tokens (${special} special); ${cached} came from the prefix cache (${Math.floor(cached / blockSize)} blocks of ${blockSize}), ${prompt.computed_tokens} were computed in ${prompt.prefill_steps} step(s).`;
  }

  chunk(branch, obj) {
    if (!this.branches.includes(branch)) return;
    if (obj.usage) branch.usage = obj.usage;
    const ch = obj.choices && obj.choices[0];
    if (!ch) return;
    const text = ch.delta ? ch.delta.content || '' : ch.text || '';
    branch.text += text;
    if (ch.rill) {
      const step = ch.rill;
      if (step.prompt) {
        branch.prompt = step.prompt;
        if (branch.id === 0 || !branch.base) branch.base = step.prompt.tokens;
        if (branch.id === 0) this.showPrompt(step.prompt, (step.kv && step.kv.block_size) || 16);
      }
      branch.steps.push(step);
      if (branch.id === 0) {
        this.genGroup.add(step, { branch: 0 });
        if (!this.selected && branch.steps.length === 1) this.genGroup.roving(0);
      }
      this.tree.addToken(branch, step);
      this.changed('token', branch);
    }
    if (ch.finish_reason) {
      branch.finish = ch.finish_reason;
      branch.stopReason = ch.stop_reason;
    }
    this.branchStatus(branch);
  }

  branchStatus(branch) {
    this.tree.updateCard(branch);
    if (branch.id !== 0) return;
    const st = $('#gen-status');
    st.dataset.state = branch.status;
    const n = branch.steps.length;
    const words = { streaming: 'streaming…', done: 'done', stopped: 'stopped', error: 'error', idle: 'idle' };
    st.textContent = `${words[branch.status] || branch.status} · ${n} token${n === 1 ? '' : 's'}`;
    $('#stop').disabled = branch.status !== 'streaming';
    $('#generate').disabled = false;
    if (branch.status === 'error') this.showError(branch.error);
    $('#gen-summary').textContent = summary(branch);
    this.showReceipt(branch);
  }

  /** The reproducibility receipt of the main answer, and a button that replays it. */
  showReceipt(branch) {
    const box = $('#gen-receipt');
    clear(box);
    if (branch.status !== 'done') return;
    if (!branch.receipt) {
      // Say why there is none, rather than leave a gap where a receipt usually is.
      box.append(
        h(
          'span',
          { 'data-testid': 'receipt-missing' },
          branch.params && branch.params.structured_outputs
            ? 'This answer has no reproducibility receipt: receipts record unconstrained generations only. The constraint (its schema or pattern, compiled into a mask at every step and the tokens it forced) is not part of what a receipt records, so a replay could not regenerate these tokens.'
            : 'This answer has no reproducibility receipt (the server records one per unconstrained single-prompt generation; it may have been switched off or dropped).',
        ),
      );
      return;
    }
    const result = h('span', { class: 'replay-result', 'data-testid': 'replay-result', 'aria-live': 'polite' });
    const button = h('button', { type: 'button', 'data-testid': 'replay' }, 'Replay and compare');
    button.addEventListener('click', async () => {
      button.disabled = true;
      result.dataset.state = 'loading';
      result.textContent = ' regenerating…';
      try {
        const id = branch.receipt.split('/').pop();
        const r = await postJson('/v1/rill/replay', { id });
        result.dataset.state = 'ready';
        result.dataset.identical = String(r.identical);
        result.textContent = r.identical
          ? ` ✓ identical: ${r.tokens} tokens, bit for bit (on ${r.kernels}).`
          : ` ✗ differs at token ${r.first_difference.index} of choice ${r.first_difference.choice}.`;
      } catch (err) {
        result.dataset.state = 'error';
        result.textContent = ` could not replay: ${err.message}`;
      } finally {
        button.disabled = false;
      }
    });
    box.append(
      'This answer has a ',
      h('a', { href: branch.receipt, target: '_blank', rel: 'noopener', 'data-testid': 'receipt-link' }, 'reproducibility receipt'),
      ': the model file\'s hash, the engine version, the kernels, every sampling setting with its seed, and the prompt\'s token ids. Replaying it regenerates the answer beside whatever else the server is doing and compares every token. They match because each row\'s arithmetic is independent of the batch it shares (batch invariance) and the kernels give the same bits on every CPU path. ',
      button,
      result,
    );
  }

  // ---------------------------------------------------------------- selection

  /** Opens step `index` of `branch` in the viewer; with `reveal` (a chip activated by the
   * reader) the viewer is scrolled into view when it starts below the middle of the window. */
  select(branch, index, { reveal = false } = {}) {
    if (!branch || !branch.steps[index]) return;
    this.selected = { branch, index };
    this.genGroup.setSelected(branch.id === 0 ? index : -1);
    this.tree.setSelected(branch, index);
    this.viewer.show(branch, index);
    if (reveal) {
      const viewer = $('#viewer');
      const top = viewer.getBoundingClientRect().top;
      if (top > window.innerHeight / 2 || top < 0) viewer.scrollIntoView({ block: 'start' });
    }
  }

  // ---------------------------------------------------------------- change notification

  changed(kind) {
    this.dirty.add(kind);
    if (this.rafPending) return;
    this.rafPending = true;
    requestAnimationFrame(() => {
      this.rafPending = false;
      const kinds = this.dirty;
      this.dirty = new Set();
      if (this.view === 'tree') this.tree.draw();
      if (this.view === 'cost') this.cost.render();
      else if (kinds.has('reset') || kinds.has('branch') || kinds.has('done')) this.cost.refreshBranches();
    });
  }
}

function summary(b) {
  const parts = [];
  if (b.prompt) {
    parts.push(`prompt ${b.prompt.tokens.length} tokens (${b.prompt.cached_tokens} cached, prefill ${secs(b.prompt.prefill_seconds)})`);
  }
  if (b.steps.length) {
    const last = b.steps[b.steps.length - 1];
    const first = b.steps[0];
    parts.push(`first token after ${secs(first.elapsed_s)}`);
    if (b.steps.length > 1) {
      const rate = (b.steps.length - 1) / Math.max(1e-9, last.elapsed_s - first.elapsed_s);
      parts.push(`decode ${num(rate, 1)} tokens/s`);
    }
    const mean = b.steps.reduce((a, s) => a + (s.probability || 0), 0) / b.steps.length;
    parts.push(`mean p ${pct(mean)}`);
  }
  if (b.finish) parts.push(`finish: ${b.finish}${b.stopReason !== undefined && b.stopReason !== null ? ` (${JSON.stringify(b.stopReason)})` : ''}`);
  if (b.usage) parts.push(`usage: ${b.usage.prompt_tokens} + ${b.usage.completion_tokens} tokens`);
  return parts.join(' · ');
}

const app = new App();
window.rillGlassBox = app; // for the console: inspect the state
app.init();

