// The layers tier under the viewer's bars: the logit lens at the selected step, what each layer
// and head wrote towards the chosen token, the attention (value-weighted by default) with sliding
// windows marked, and counterfactuals ("what if this token were not there?"). Everything comes
// from /v1/rill/lens and /v1/rill/counterfactual, computed by the engine from its prefix cache.

import { postJson, isAbort } from './api.js';
import { h, clear, showToken, pct, num } from './dom.js';

/** How many of the strongest sources the counterfactual button drops. */
const CF_SOURCES = 5;

function signed(x) {
  return `${x >= 0 ? '+' : ''}${num(x)}`;
}

/** Blue for negative, orange for positive, fading to white at 0; `max` is full strength. */
function divergingColor(x, max) {
  const a = Math.min(1, Math.abs(x) / Math.max(max, 1e-9));
  const hue = x >= 0 ? 25 : 215;
  return `hsla(${hue}, 85%, 52%, ${(0.08 + 0.8 * a).toFixed(3)})`;
}

export class LayersTier {
  constructor(el) {
    this.el = el;
    this.seq = 0;
  }

  reset() {
    this.seq++;
    clear(this.el);
    this.el.dataset.state = 'empty';
  }

  /** Shows the lens for the step that follows context `ctx`, whose chosen token is `step.token`:
   * every view follows that token, or with `mostLikely` the model's most likely one. */
  async show(ctx, step, mostLikely = false) {
    const seq = ++this.seq;
    const el = this.el;
    el.dataset.state = 'loading';
    clear(el).append(h('p', { class: 'small muted' }, 'Reading the model layer by layer…'));
    let lens;
    let pieces;
    const follow = mostLikely || typeof step.token !== 'number' ? {} : { token: step.token };
    try {
      [lens, pieces] = await Promise.all([
        postJson('/v1/rill/lens', { tokens: ctx, top: 3, attention: true, value_weighted: true, ...follow }),
        postJson('/detokenize', { tokens: ctx, pieces: true }).then((r) => r.pieces),
      ]);
    } catch (err) {
      if (seq !== this.seq || isAbort(err)) return;
      el.dataset.state = 'error';
      clear(el).append(h('p', { class: 'error' }, `Could not compute the logit lens: ${err.message}`));
      return;
    }
    if (seq !== this.seq) return;
    this.lens = lens;
    this.pieces = pieces;
    this.ctx = ctx;
    if (step !== this.step) this.chosenText = undefined;
    if (lens.chosen === step.token) this.chosenText = lens.chosen_text;
    this.step = step;
    this.mostLikely = mostLikely;
    clear(el).append(this.followSwitch(lens, step), this.lensTable(lens, ctx.length), this.headsOverview(lens));
    this.attention = this.attentionView(lens, pieces);
    el.append(this.attention.root, this.counterfactualView());
    el.dataset.state = 'ready';
  }

  /** Which token the layer views follow: the chip's chosen token by default; when the sampler
   * drew another than the most likely, a switch to the most likely one. */
  followSwitch(lens, step) {
    const chosen = step.token;
    const differs = typeof chosen === 'number' && lens.most_likely !== chosen;
    const following = lens.chosen === chosen ? 'chosen' : 'most-likely';
    const label = h(
      'p',
      { class: 'follow-label', 'data-testid': 'lens-following', 'data-following': following, 'data-token': lens.chosen },
      'The layer views below follow ',
      following === 'chosen' ? 'the token that was chosen, ' : 'the most likely token, ',
      h('code', { class: 'tok-inline' }, showToken(lens.chosen_text)),
      differs
        ? following === 'chosen'
          ? ` (drawn at random; the model's most likely token was ${showToken(lens.most_likely_text)}).`
          : ` (the token drawn was another one).`
        : ' (it was also the most likely token).',
    );
    if (!differs) return label;
    const option = (value, text) =>
      h(
        'label',
        { class: 'check' },
        h('input', {
          type: 'radio',
          name: 'lens-follow',
          value,
          'data-testid': `lens-follow-${value}`,
          checked: value === following ? true : undefined,
          onchange: () => this.show(this.ctx, this.step, value === 'most-likely'),
        }),
        ' ',
        text,
      );
    return h(
      'div',
      { class: 'follow', role: 'radiogroup', 'aria-label': 'Token the layer views follow' },
      label,
      option('chosen', ['the chosen token ', h('code', { class: 'tok-inline' }, this.chosenText === undefined ? `#${chosen}` : showToken(this.chosenText))]),
      option('most-likely', ['the most likely token ', h('code', { class: 'tok-inline' }, showToken(lens.most_likely_text))]),
    );
  }

  lensTable(lens, n) {
    const last = lens.layers.length - 1;
    const rows = lens.layers.map((l) => {
      const top = l.top[0] || { text: '', logprob: -Infinity, token: -1 };
      const p = Math.exp(l.chosen_logprob);
      return h(
        'tr',
        { class: l.layer >= lens.settled_at ? 'settled' : '', 'data-testid': 'lens-row', 'data-layer': l.layer, 'data-top-token': top.token },
        h('td', { class: 'n', title: l.mixer && l.mixer !== 'attention' ? `a recurrent layer (${l.mixer}): a fixed state instead of attention` : '' }, l.layer === 0 ? 'emb' : l.mixer && l.mixer !== 'attention' ? `${l.layer}ʳ` : String(l.layer)),
        h('td', { class: 'tok' }, h('code', {}, showToken(top.text)), ` ${pct(Math.exp(top.logprob))}`),
        h('td', { class: 'n' }, String(l.chosen_rank + 1)),
        h('td', { class: 'lensbar' }, h('span', { class: 'fill', style: { width: `${(100 * p).toFixed(1)}%` } }), h('span', { class: 'nums' }, pct(p))),
        h('td', { class: 'n' }, num(l.kl_to_final)),
        h(
          'td',
          { class: 'n', 'data-testid': 'lens-writes' },
          l.writes ? `${signed(l.writes.attention_logit)} / ${signed(l.writes.ffn_logit)}` : signed(lens.embedding_logit),
        ),
      );
    });
    const computed = n - lens.cached_tokens;
    return h(
      'div',
      {},
      h('h3', {}, 'Layer by layer: the logit lens'),
      h(
        'p',
        { class: 'explain small' },
        `What the model would predict if it stopped after each layer: its final norm and output head applied to the residual stream at this position (the unadjusted lens, so early layers read poorly). `,
        h('code', { class: 'tok-inline' }, showToken(lens.chosen_text)),
        lens.settled_at > last
          ? ` is not the most likely token even at the last layer (rank ${lens.layers[last].chosen_rank + 1} there): the sampler drew it from the processed distribution.`
          : lens.settled_at === last
            ? ' becomes the most likely token only at the last layer.'
            : ` becomes the most likely token at layer ${lens.settled_at} and stays: where the model made up its mind.`,
        ` Its logit, ${num(lens.chosen_logit)}, is what the embeddings and each layer's attention and feed-forward wrote into the residual stream, read through the output head (last column).`,
      ),
      h(
        'p',
        { class: 'small muted', 'data-testid': 'lens-cost' },
        `Recorded from a forward pass over ${computed} position${computed === 1 ? '' : 's'}; the other ${lens.cached_tokens} came from the prefix cache (${(1000 * lens.seconds).toFixed(0)} ms).`,
      ),
      h(
        'div',
        { class: 'table-scroll', 'data-testid': 'lens-scroll' },
        h(
          'table',
          { class: 'lens-table small' },
          h('thead', {}, h('tr', {}, h('th', {}, 'layer'), h('th', {}, 'top token'), h('th', {}, 'rank of the choice'), h('th', {}, 'p(choice)'), h('th', {}, 'KL to final'), h('th', { title: "what the layer's attention / feed-forward added to the choice's logit, directly through the output head" }, 'attention / FFN → logit'))),
          h('tbody', {}, rows),
        ),
      ),
    );
  }

  /** Layers × heads: each head's direct contribution to the chosen token's logit. */
  headsOverview(lens) {
    const blocks = lens.layers.slice(1);
    const all = blocks.flatMap((l) => l.writes.head_logits);
    const max = Math.max(...all.map(Math.abs), 1e-9);
    const nHeads = blocks[0] ? blocks[0].writes.head_logits.length : 0;
    const grid = h('div', { class: 'heads-grid', 'data-testid': 'heads-grid', style: { gridTemplateColumns: `3em repeat(${nHeads}, minmax(14px, 1fr))` } });
    grid.append(h('span', { class: 'corner small muted' }, 'layer'));
    for (let k = 0; k < nHeads; k++) grid.append(h('span', { class: 'hd small muted' }, String(k)));
    for (const l of blocks) {
      grid.append(h('span', { class: 'ln small muted' }, String(l.layer)));
      l.writes.head_logits.forEach((x, k) => {
        const window = lens.windows[l.layer - 1];
        grid.append(
          h('button', {
            type: 'button',
            class: `head-cell${window ? ' windowed' : ''}`,
            'data-testid': 'head-cell',
            'data-layer': l.layer,
            'data-head': k,
            'data-logit': x.toFixed(6),
            title: `layer ${l.layer}, head ${k}: ${signed(x)} to the logit of “${showToken(lens.chosen_text)}”${window ? ` (sliding window of ${window})` : ''}. Click to see its attention.`,
            style: { background: divergingColor(x, max) },
            onclick: () => this.attention && this.attention.select(l.layer, k),
          }),
        );
      });
    }
    return h(
      'div',
      { class: 'heads' },
      h('h3', {}, 'Which heads pushed this token'),
      h(
        'p',
        { class: 'explain small' },
        `Each square is one attention head of one layer: orange pushed `,
        h('code', { class: 'tok-inline' }, showToken(lens.chosen_text)),
        ` up, blue pushed it down, by what the head wrote into the residual stream read directly through the output head (the direct logit attribution; strongest ${signed(max)}). Dashed squares are sliding-window layers. Click one to see what it read.`,
      ),
      grid,
    );
  }

  /** The context shaded by how much the predicting position took from each token. */
  attentionView(lens, pieces) {
    const raw = lens.attention || [];
    const weighted = lens.value_weighted || raw;
    const nLayers = raw.length;
    // Recurrent layers (hybrid models) have no attention weights: an empty list of heads.
    const nHeads = Math.max(0, ...raw.map((heads) => heads.length));
    const mixerOf = (l) => (lens.layers[l + 1] || {}).mixer || 'attention';
    const mixerName = { gated_deltanet: 'Gated DeltaNet', short_conv: 'short-convolution', mamba2: 'Mamba-2' };
    const n = pieces.length;
    // The last layer with attention weights to show first.
    const shown = raw.map((heads) => heads.length > 0).lastIndexOf(true) + 1 || nLayers;
    const layer = h('input', { type: 'range', min: 1, max: nLayers, step: 1, value: shown, 'data-testid': 'attn-layer', 'aria-label': 'layer' });
    const layerOut = h('output', {}, String(shown));
    const head = h('select', { 'data-testid': 'attn-head', 'aria-label': 'head' }, h('option', { value: 'mean' }, 'mean of the heads'), ...Array.from({ length: nHeads }, (_, i) => h('option', { value: String(i) }, `head ${i}`)));
    const mode = h('select', { 'data-testid': 'attn-mode', 'aria-label': 'weighting' }, h('option', { value: 'weighted' }, 'value-weighted'), h('option', { value: 'raw' }, 'raw softmax weights'));
    const note = h('p', { class: 'small muted', 'data-testid': 'attn-window' });
    const text = h('div', { class: 'attn-text', 'data-testid': 'attn-text' });
    const pick = (arrays, l) =>
      !arrays[l].length
        ? pieces.map(() => 0)
        : head.value === 'mean'
          ? pieces.map((_, j) => arrays[l].reduce((a, w) => a + w[j], 0) / arrays[l].length)
          : arrays[l][Number(head.value)];
    const view = {
      root: null,
      /** The current layer's and head's shares (summing to 1) per position. */
      shares: () => {
        const l = Number(layer.value) - 1;
        const w = pick(mode.value === 'raw' ? raw : weighted, l);
        const total = w.reduce((a, x) => a + x, 0) || 1;
        // (All zero on a recurrent layer.)
        return w.map((x) => x / total);
      },
      draw: () => {
        const l = Number(layer.value) - 1;
        layerOut.textContent = String(l + 1);
        const rawW = pick(raw, l);
        const shares = view.shares();
        const window = lens.windows[l];
        const first = window ? Math.max(0, n - window) : 0;
        const recurrent = !raw[l].length;
        note.dataset.mixer = mixerOf(l);
        note.textContent = recurrent
          ? `Layer ${l + 1} is a ${mixerName[mixerOf(l)] || 'recurrent'} layer: it reads earlier positions only through a state of fixed size, updated token by token, so there are no attention weights to show. Pick an attention layer.`
          : window
            ? `Layer ${l + 1} uses a sliding window: it reads only the last ${window} positions; the ${first} before them (struck through) are invisible to it.`
            : `Layer ${l + 1} reads every earlier position.`;
        // Raw weights: the first token collects most of them (a sink), so the shading is
        // scaled to the largest of the others.
        const scaleTo = mode.value === 'raw' ? Math.max(...shares.slice(1), 1e-9) : Math.max(...shares, 1e-9);
        clear(text);
        pieces.forEach((p, j) => {
          const share = shares[j] || 0;
          const alpha = mode.value === 'raw' && j === 0 ? Math.min(1, share) : Math.min(1, share / scaleTo);
          text.append(
            h(
              'span',
              {
                class: `attn-token${j < first ? ' outside-window' : ''}`,
                'data-testid': 'attn-token',
                'data-position': j,
                'data-weight': (rawW[j] || 0).toFixed(6),
                'data-share': share.toFixed(6),
                title: `position ${j}: ${pct(share)} of this view (raw weight ${pct(rawW[j] || 0)}). Click: what if it were not there?`,
                style: { background: `hsla(25, 90%, 55%, ${alpha.toFixed(3)})` },
                onclick: () => this.runCounterfactuals([j]),
              },
              showToken(p.text),
            ),
          );
        });
      },
      select: (l, k) => {
        layer.value = String(l);
        head.value = String(k);
        view.draw();
        text.scrollIntoView({ block: 'nearest' });
      },
    };
    if (!lens.value_weighted) {
      // The server left value weighting out (too long a context for one engine step).
      mode.value = 'raw';
      mode.options[0].disabled = true;
    }
    layer.addEventListener('input', view.draw);
    head.addEventListener('change', view.draw);
    mode.addEventListener('change', view.draw);
    view.root = h(
      'div',
      { class: 'attn' },
      h('h3', {}, 'What this step read: attention'),
      h(
        'p',
        { class: 'explain small' },
        'How much the position that predicts this token took from each earlier token, at the layer on the slider. Value-weighted (the default) multiplies each attention weight by the size of what that token\'s value writes through the head, so it shows what actually moved the prediction; raw softmax weights pile onto the first token, which most models use as a resting place. Click a token to see what happens without it.',
      ),
      h('div', { class: 'attn-controls small' }, h('label', {}, 'layer ', layer, ' ', layerOut), ' ', h('label', {}, head), ' ', h('label', {}, mode)),
      lens.value_weighted_skipped ? h('p', { class: 'small muted', 'data-testid': 'attn-weighting-skipped' }, `Raw weights only: ${lens.value_weighted_skipped}.`) : null,
      note,
      text,
    );
    view.draw();
    return view;
  }

  counterfactualView() {
    this.cfTable = h('tbody', {});
    this.cfNote = h('p', { class: 'small muted', 'data-testid': 'cf-note' });
    const button = h(
      'button',
      { type: 'button', 'data-testid': 'cf-run', onclick: () => this.runCounterfactuals(this.topSources(CF_SOURCES)) },
      `Drop each of the ${CF_SOURCES} strongest sources`,
    );
    this.cfRoot = h(
      'div',
      { class: 'cf', 'data-testid': 'counterfactuals', 'data-state': 'empty' },
      h('h3', {}, 'What if a token were not there?'),
      h(
        'p',
        { class: 'explain small' },
        'Remove one earlier token, or put another in its place, and run the model again from that point (the tokens before it come from the KV cache): how likely would the followed token still be? The strongest sources are the earlier tokens the attention view above shades most, at its layer and head.',
      ),
      button,
      this.replaceForm(),
      this.cfNote,
      h(
        'div',
        { class: 'table-scroll' },
        h(
        'table',
        { class: 'lens-table small' },
        h('thead', {}, h('tr', {}, h('th', {}, 'edit'), h('th', {}, 'p(choice)'), h('th', {}, 'change'), h('th', {}, 'top token then'), h('th', { title: 'KL divergence from the real distribution to the counterfactual one, nats' }, 'KL'))),
        this.cfTable,
        ),
      ),
    );
    return this.cfRoot;
  }

  /** The `k` earlier positions with the largest shares in the attention view's current
   * selection (not the predicting position itself: without it another position would predict). */
  topSources(k) {
    const shares = this.attention.shares();
    return shares
      .slice(0, -1)
      .map((s, j) => [s, j])
      .sort((a, b) => b[0] - a[0])
      .slice(0, k)
      .map(([, j]) => j);
  }

  /** Put another token in place of one earlier token: which position, and the replacement's
   * text (it must be a single token of the model's vocabulary). */
  replaceForm() {
    const positions = h(
      'select',
      { 'data-testid': 'cf-replace-position', 'aria-label': 'Token to replace' },
      this.ctx.slice(0, -1).map((t, j) => h('option', { value: j }, `@${j} ${showToken(this.pieces && this.pieces[j] ? this.pieces[j].text : String(t))}`)),
    );
    positions.value = String(Math.max(0, this.ctx.length - 2));
    const text = h('input', { type: 'text', 'data-testid': 'cf-replace-text', 'aria-label': 'Replacement token', placeholder: 'replacement', size: 12 });
    const run = async () => {
      const position = Number(positions.value);
      let tokens;
      try {
        tokens = (await postJson('/tokenize', { prompt: text.value, add_special: false })).tokens;
      } catch (err) {
        this.cfNote.textContent = `Could not tokenize the replacement: ${err.message}`;
        return;
      }
      if (tokens.length !== 1) {
        this.cfRoot.dataset.state = 'error';
        this.cfNote.textContent = `The replacement must be one token of the vocabulary; ${JSON.stringify(text.value)} is ${tokens.length}.`;
        return;
      }
      this.runCounterfactuals([{ position, replace_with: tokens[0] }]);
    };
    return h(
      'form',
      {
        class: 'cf-replace small',
        'data-testid': 'cf-replace',
        onsubmit: (e) => {
          e.preventDefault();
          run();
        },
      },
      'Or replace ',
      positions,
      ' with ',
      text,
      ' ',
      h('button', { type: 'submit', 'data-testid': 'cf-replace-run' }, 'Replace'),
    );
  }

  /** Runs `edits`: positions to drop, or `{position, replace_with}` objects. */
  async runCounterfactuals(edits) {
    if (!edits.length || this.ctx.length < 2) return;
    const seq = this.seq;
    const root = this.cfRoot;
    root.dataset.state = 'loading';
    this.cfNote.textContent = `Recomputing ${edits.length} edit${edits.length === 1 ? '' : 's'}, one at a time…`;
    let cf;
    try {
      cf = await postJson('/v1/rill/counterfactual', {
        tokens: this.ctx,
        token: this.lens.chosen,
        top: 1,
        edits: edits.map((e) => (typeof e === 'number' ? { position: e } : e)),
      });
    } catch (err) {
      if (seq !== this.seq || isAbort(err)) return;
      root.dataset.state = 'error';
      this.cfNote.textContent = `Could not compute the counterfactuals: ${err.message}`;
      return;
    }
    if (seq !== this.seq) return;
    const before = Math.exp(cf.tracked_logprob);
    const computed = cf.edits.reduce((a, e) => a + e.computed_tokens, 0);
    this.cfNote.textContent = `The ${this.mostLikely ? 'most likely' : 'chosen'} token ${showToken(cf.token_text)} has p = ${pct(before)} with the whole context. ${cf.edits.length} edit${cf.edits.length === 1 ? '' : 's'} computed ${computed} positions in ${(1000 * cf.seconds).toFixed(0)} ms (the rest from the prefix cache).`;
    const originalTop = (cf.top || [])[0];
    for (const e of cf.edits) {
      const after = Math.exp(e.tracked_logprob);
      const top = e.top[0];
      this.cfTable.append(
        h(
          'tr',
          { 'data-testid': 'cf-row', 'data-position': e.position, 'data-p': after.toFixed(6), 'data-replaced': e.replace_with === undefined ? undefined : String(e.replace_with) },
          h(
            'td',
            { class: 'tok' },
            e.replace_with === undefined ? ['without ', h('code', {}, showToken(e.original_text))] : [h('code', {}, showToken(e.original_text)), ' → ', h('code', {}, showToken(e.replace_with_text))],
            h('span', { class: 'muted' }, ` @${e.position}`),
          ),
          h('td', { class: 'n' }, `${pct(before)} → ${pct(after)}`),
          h('td', { class: `n ${after < before ? 'down' : 'up'}` }, `${after >= before ? '+' : ''}${(100 * (after - before)).toFixed(1)} pts`),
          h('td', { class: 'tok' }, top ? h('code', {}, showToken(top.text)) : '–', top && originalTop && top.token !== originalTop.token ? h('span', { class: 'flip', 'data-testid': 'cf-flip', title: `the most likely token changes (it was ${showToken(originalTop.text)})` }, ' ⇄') : ''),
          h('td', { class: 'n' }, num(e.kl, 3)),
        ),
      );
    }
    root.dataset.state = 'ready';
  }
}
