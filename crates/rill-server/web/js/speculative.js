// Speculative decoding: runs /v1/rill/speculative and shows each round's drafted, accepted and
// rejected tokens.

import { postJson } from './api.js';
import { $, h, clear, chipText, showToken, pct, num, secs } from './dom.js';

const COPYING =
  'Repeat the following paragraph exactly, word for word:\n\n' +
  'The river carved its path one drop at a time. Each drop shaped where the next could go, and no drop ever flowed back uphill. ' +
  'By evening the water had found the sea, though none of it had known the way when it set out.';

export class SpeculativeView {
  constructor(app) {
    this.app = app;
    this.form = $('#spec-form');
    this.status = $('#spec-status');
    this.form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.run();
    });
    $('#spec-copying').addEventListener('click', () => {
      // a task whose answer copies the prompt: prompt lookup drafts it well
      $('#prompt').value = COPYING;
      this.status.dataset.state = 'idle';
      this.status.textContent = 'The prompt (Generate tab) now asks to copy a paragraph: prompt lookup can draft most of the answer.';
    });
    const draft = $('#spec-draft');
    draft.addEventListener('change', () => {
      $('#spec-layers-wrap').hidden = draft.value !== 'layers';
    });
  }

  body() {
    const body = {
      ...this.app.promptBody(),
      draft: $('#spec-draft').value,
      draft_tokens: Number($('#spec-draft_tokens').value),
      max_tokens: Number($('#spec-max_tokens').value),
      temperature: Number($('#spec-temperature').value),
      adaptive: $('#spec-adaptive').checked,
    };
    const layers = $('#spec-draft_layers').value.trim();
    if (body.draft === 'layers' && layers !== '') body.draft_layers = Number(layers);
    const seed = $('#spec-seed').value.trim();
    if (seed !== '') body.seed = Number(seed);
    return body;
  }

  async run() {
    const body = this.body();
    const btn = $('#spec-run');
    btn.disabled = true;
    this.status.dataset.state = 'running';
    this.status.textContent = `Drafting ${body.draft_tokens} tokens a round with ${body.draft}… (a round per engine step, beside the other requests)`;
    try {
      const res = await postJson('/v1/rill/speculative', body);
      this.res = res;
      // `tokens` holds {token, text} objects (or bare ids: then the text comes from /detokenize)
      this.firstText = null;
      this.firstId = null;
      const t0 = res.tokens && res.tokens.length ? res.tokens[0] : null;
      if (t0 !== null && typeof t0 === 'object') {
        this.firstId = t0.token;
        this.firstText = t0.text;
      } else if (t0 !== null) {
        this.firstId = t0;
        try {
          const d = await postJson('/detokenize', { tokens: [t0] });
          this.firstText = d.prompt;
        } catch {
          this.firstText = null;
        }
      }
      this.render();
      this.status.dataset.state = 'done';
      this.status.textContent = `Done: ${res.tokens.length} tokens in ${res.rounds.length} rounds.`;
    } catch (err) {
      this.status.dataset.state = 'error';
      this.status.textContent = `Speculative decoding failed: ${err.message}`;
    } finally {
      btn.disabled = false;
    }
  }

  render() {
    const res = this.res;
    const byPos = res.acceptance_by_position || [];
    const posBars = h(
      'div',
      { class: 'pos-bars', 'data-testid': 'spec-by-position', role: 'list', 'aria-label': 'Acceptance by draft position' },
      byPos.map((r, i) =>
        h(
          'div',
          { class: 'pos-bar', role: 'listitem', title: r === null ? 'never drafted' : `${pct(r)} of drafts at position ${i + 1} kept` },
          h('span', { class: 'pos-track' }, h('span', { class: 'pos-fill', style: { height: `${r === null ? 0 : r * 100}%` } })),
          h('span', { class: 'pos-val' }, r === null ? '–' : pct(r, 0)),
          h('span', { class: 'pos-lbl' }, `#${i + 1}`),
        ),
      ),
    );
    const passes = res.rounds.length + 1;
    clear($('#spec-summary')).append(
      h(
        'dl',
        { class: 'stats' },
        stat('acceptance', pct(res.acceptance_rate)),
        stat('drafted', res.drafted),
        stat('accepted', res.accepted),
        stat('rounds', res.rounds.length),
        stat('tokens per round', num(res.tokens_per_round)),
        stat('tokens per model pass', num(res.tokens.length / Math.max(1, passes))),
        stat('finish', res.finish_reason),
        stat('prefill', secs(res.prefill_seconds)),
        stat('drafting', secs(res.draft_seconds)),
        stat('verifying', secs(res.verify_seconds)),
        stat('decode total', secs(res.decode_seconds)),
      ),
      h('div', { class: 'by-pos' }, h('h3', {}, 'Acceptance by draft position'), h('p', { class: 'small muted' }, 'A draft at position k is only checked when the k − 1 before it were kept.'), posBars),
    );
    const list = clear($('#spec-rounds'));
    if (res.tokens && res.tokens.length) {
      list.append(
        h(
          'div',
          { class: 'round first', role: 'listitem' },
          h('span', { class: 'round-head small' }, 'prefill'),
          h('span', { class: 'chip mini plain', title: `token id ${this.firstId}` }, this.firstText === null ? `#${this.firstId}` : chipText(this.firstText)),
          h('span', { class: 'small muted' }, ' the first token comes from the prompt’s own logits'),
        ),
      );
    }
    res.rounds.forEach((round, i) => {
      const chips = round.drafted.map((d, k) => {
        const cls = k < round.accepted ? 'acc' : k === round.accepted ? 'rej' : 'disc';
        const word = cls === 'acc' ? 'accepted' : cls === 'rej' ? 'rejected' : 'discarded (after a rejection)';
        return h('span', { class: `chip mini ${cls}`, 'data-testid': `spec-${cls}`, title: `draft ${k + 1}: ${showToken(d.text)} (id ${d.token}) ${word}` }, chipText(d.text));
      });
      const next = round.next
        ? h('span', { class: `chip mini ${round.next.rule === 'bonus' ? 'bonus' : 'corr'}`, 'data-testid': `spec-${round.next.rule}`, title: `${round.next.rule}: ${showToken(round.next.text)} (id ${round.next.token})` }, chipText(round.next.text))
        : h('span', { class: 'small muted' }, '(ended)');
      list.append(
        h(
          'div',
          { class: 'round', role: 'listitem', 'data-testid': 'spec-round' },
          h('span', { class: 'round-head small' }, `round ${i + 1} · pos ${round.position} · ${round.accepted}/${round.drafted.length} kept · ${secs(round.seconds)}`),
          h('span', { class: 'round-chips' }, chips.length ? chips : h('span', { class: 'small muted' }, '(no draft) '), h('span', { class: 'arrow', 'aria-hidden': 'true' }, '→'), next),
        ),
      );
    });
    $('#spec-text').textContent = res.text;
  }
}

function stat(k, v) {
  return h('div', {}, h('dt', {}, k), h('dd', {}, v === undefined || v === null ? '–' : String(v)));
}
