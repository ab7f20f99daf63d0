// Token chips (coloured by probability, keyboard-navigable) and the candidates tooltip.

import { h, add, clear, chipText, showToken, probColor, probBorder, prob, pct, num, secs } from './dom.js';

/**
 * A group of chips with a roving tabindex: Tab enters the group on one chip (the selected one, or
 * the first), arrow keys / Home / End move between chips, Enter or Space activates one.
 */
export class ChipGroup {
  constructor(el, { onActivate, tooltip = true } = {}) {
    this.el = el;
    this.onActivate = onActivate;
    this.items = []; // { chip, step, index }
    this.selected = -1;
    el.addEventListener('keydown', (e) => this.key(e));
    // On a touch screen there is no hover: the first tap on a chip shows its tooltip, a second
    // tap on the same chip opens its step (a mouse click or Enter opens it at once).
    let tipWasShown = true;
    el.addEventListener('pointerdown', (e) => {
      const chip = e.target.closest('.chip[data-index]');
      tipWasShown = e.pointerType !== 'touch' || !tooltip || (chip !== null && chip === tipAnchor);
    });
    el.addEventListener('click', (e) => {
      const chip = e.target.closest('.chip[data-index]');
      if (!chip || !el.contains(chip)) return;
      if (!tipWasShown) {
        tipWasShown = true;
        this.tip(chip);
        return;
      }
      this.activate(Number(chip.dataset.index));
    });
    if (tooltip) {
      el.addEventListener('mouseover', (e) => {
        const chip = e.target.closest('.chip[data-index]');
        if (chip && el.contains(chip)) this.tip(chip);
      });
      el.addEventListener('mouseout', (e) => {
        // A finger leaves no hover: the compatibility mouse events after a tap (the pointer
        // "moving" onto the tooltip that just opened) must not close it.
        if (touching) return;
        const chip = e.target.closest('.chip[data-index]');
        if (chip && !chip.contains(e.relatedTarget)) hideTooltip(chip);
      });
      el.addEventListener('focusin', (e) => {
        const chip = e.target.closest('.chip[data-index]');
        if (chip) this.tip(chip);
      });
      el.addEventListener('focusout', (e) => {
        const chip = e.target.closest('.chip[data-index]');
        if (chip) hideTooltip(chip);
      });
    }
  }

  tip(chip) {
    const item = this.items[Number(chip.dataset.index)];
    if (item && item.step) showTooltip(chip, item.step);
  }

  clear() {
    clear(this.el);
    this.items = [];
    this.selected = -1;
  }

  /** Appends a chip for a step's rill object; returns the chip. */
  add(step, extra = {}) {
    const index = this.items.length;
    const chip = stepChip(step, { index, ...extra });
    chip.tabIndex = this.items.length === 0 && this.selected < 0 ? 0 : -1;
    this.items.push({ chip, step, index });
    this.el.append(chip);
    if ((step.token_text || '').includes('\n')) this.el.append(h('br'));
    return chip;
  }

  /** Appends an element that is not a step (e.g. a fork's chosen token) to the group. */
  addStatic(node) {
    this.el.append(node);
  }

  setSelected(i) {
    for (const it of this.items) {
      const on = it.index === i;
      it.chip.classList.toggle('selected', on);
      it.chip.setAttribute('aria-pressed', on ? 'true' : 'false');
    }
    this.selected = i;
    this.roving(i >= 0 ? i : 0);
  }

  roving(i) {
    this.items.forEach((it) => {
      it.chip.tabIndex = it.index === i ? 0 : -1;
    });
  }

  focus(i) {
    const it = this.items[i];
    if (!it) return;
    this.roving(i);
    it.chip.focus();
  }

  activate(i) {
    if (this.onActivate && this.items[i]) this.onActivate(i, this.items[i].step);
  }

  key(e) {
    const chip = e.target.closest('.chip[data-index]');
    if (!chip) return;
    const i = Number(chip.dataset.index);
    const last = this.items.length - 1;
    let j = null;
    if (e.key === 'ArrowRight' || e.key === 'ArrowDown') j = Math.min(last, i + 1);
    else if (e.key === 'ArrowLeft' || e.key === 'ArrowUp') j = Math.max(0, i - 1);
    else if (e.key === 'Home') j = 0;
    else if (e.key === 'End') j = last;
    else if (e.key === 'Enter' || e.key === ' ' || e.key === 'Spacebar') {
      e.preventDefault();
      this.activate(i);
      return;
    } else if (e.key === 'Escape') {
      hideTooltip();
      return;
    }
    if (j !== null) {
      e.preventDefault();
      this.focus(j);
    }
  }
}

/** A chip for one generated token (its rill object). */
export function stepChip(step, { index, testid = 'chip', branch } = {}) {
  const p = step.probability;
  const forced = !!(step.constraint && step.constraint.forced);
  // A reasoning model's thinking, returned apart from its answer.
  const thinking = step.part === 'reasoning';
  const chip = h(
    'span',
    {
      class: ['chip', forced ? 'forced' : '', thinking ? 'thinking' : ''].filter(Boolean).join(' '),
      'data-forced': forced ? 'true' : undefined,
      'data-part': step.part,
      title: thinking ? 'thinking (returned apart from the answer)' : undefined,
      role: 'button',
      tabindex: '-1',
      'aria-pressed': 'false',
      'data-testid': testid,
      'data-index': index,
      'data-token': step.token,
      'data-p': p,
      'data-branch': branch,
      'aria-label': `token ${index + 1}${thinking ? ' (thinking)' : ''}: ${showToken(step.token_text)}, probability ${pct(p)}`,
      style: { background: probColor(p), borderColor: probBorder(p) },
    },
    chipText(step.token_text),
  );
  return chip;
}

/** A plain (non-interactive) chip for a token id + text, e.g. a fork's chosen alternative. */
export function plainChip(text, { p, cls = '', testid, token, title } = {}) {
  return h(
    'span',
    {
      class: `chip plain ${cls}`,
      'data-testid': testid,
      'data-token': token,
      title,
      style: p === undefined ? undefined : { background: probColor(p), borderColor: probBorder(p) },
    },
    chipText(text),
  );
}

// ------------------------------------------------------------------ tooltip

let tipEl = null;
let tipAnchor = null;
/** The last pointer was a finger: the tooltip says to tap again, and a tap elsewhere hides it. */
let touching = false;

export function initTooltip() {
  tipEl = document.getElementById('tooltip');
  document.addEventListener(
    'pointerdown',
    (e) => {
      touching = e.pointerType === 'touch';
      if (touching && tipAnchor && !e.target.closest('.chip[data-index]') && !tipEl.contains(e.target)) hideTooltip();
    },
    { capture: true, passive: true },
  );
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') hideTooltip();
  });
  const follow = () => {
    if (!tipAnchor) return;
    if (!tipAnchor.isConnected) hideTooltip();
    else place(tipAnchor);
  };
  window.addEventListener('scroll', follow, { passive: true, capture: true });
  window.addEventListener('resize', follow, { passive: true });
}

export function hideTooltip(anchor) {
  if (!tipEl) return;
  if (anchor && anchor !== tipAnchor) return;
  tipEl.hidden = true;
  if (tipAnchor) tipAnchor.removeAttribute('aria-describedby');
  tipAnchor = null;
}

/** The rule that picked a token, in words. */
export function ruleText(step) {
  // A token the constraint forced was not chosen by the sampler: nothing was drawn for it.
  if (step.constraint && step.constraint.forced) return `forced by the ${step.constraint.kind} constraint: the only token it allowed, so nothing was drawn`;
  switch (step.rule) {
    case 'greedy':
      return 'greedy (temperature 0): the most likely token';
    case 'sampled':
      return step.draw
        ? `sampled at random with p = ${prob(step.probability)}: the generator drew u = ${step.draw.uniform.toFixed(4)}, which fell in [${step.draw.from.toFixed(4)}, ${step.draw.to.toFixed(4)}), this token's share of the cumulative distribution`
        : `sampled at random with p = ${prob(step.probability)}`;
    case 'beam':
      return 'kept by beam search';
    case 'accepted_draft':
      return 'a drafted token the model accepted';
    case 'corrected':
      return "the model's correction of a rejected draft";
    default:
      return step.rule || 'unknown';
  }
}

/** A constrained step in words. */
export function constraintText(c) {
  if (c.forced) return `forced by the ${c.kind} constraint: the only token it allowed`;
  const cut = c.cut && c.cut.length ? `, cutting ${c.cut.length} of the model's top candidates` : '';
  return `the ${c.kind} constraint allowed ${c.allowed} tokens${cut}`;
}

export function showTooltip(anchor, step) {
  if (!tipEl) return;
  const processed = new Map((step.processed_top || []).map((c) => [c.token, c]));
  const grammarCut = new Set((step.constraint && step.constraint.cut) || []);
  const rows = (step.top || []).slice(0, 10).map((c, r) => {
    const pc = processed.get(c.token);
    const raw = Math.exp(c.logprob);
    const pp = pc ? Math.exp(pc.logprob) : null;
    const cut = grammarCut.has(c.token)
      ? h('span', { class: 'cut grammar', 'data-testid': 'cut-by-grammar' }, 'cut by grammar')
      : h('span', { class: 'cut' }, 'cut');
    return h(
      'tr',
      { class: c.token === step.token ? 'chosen' : '' },
      h('td', { class: 'r' }, r + 1),
      h('td', { class: 'tok' }, h('code', {}, showToken(c.text))),
      h('td', { class: 'n' }, pct(raw)),
      h('td', { class: 'n' }, pp === null ? cut : pct(pp)),
    );
  });
  const chosenInTop = (step.top || []).slice(0, 10).some((c) => c.token === step.token);
  add(
    clear(tipEl),
    h('div', { class: 'tt-head' }, h('code', { class: 'tt-tok' }, showToken(step.token_text)), h('span', { class: 'small' }, ` id ${step.token} · token ${step.index + 1} · position ${step.position}`)),
    h('div', { class: 'tt-rule' }, ruleText(step)),
    step.constraint ? h('div', { class: 'small', 'data-testid': 'tooltip-constraint' }, constraintText(step.constraint)) : null,
    h(
      'div',
      { class: 'small' },
      `probability ${pct(step.probability)} (raw ${pct(Math.exp(step.raw_logprob))}) · entropy ${num(step.raw_entropy)} → ${num(step.entropy)} nats`,
    ),
    h(
      'table',
      { class: 'tt-table', 'data-testid': 'tooltip-candidates' },
      h('thead', {}, h('tr', {}, h('th', {}, '#'), h('th', {}, 'candidate'), h('th', {}, 'raw'), h('th', {}, 'processed'))),
      h('tbody', {}, rows),
    ),
    chosenInTop ? null : h('div', { class: 'small' }, 'The chosen token is outside the raw top 10.'),
    step.step ? h('div', { class: 'small muted' }, `engine step ${step.step.id}: ${secs(step.step.seconds)}, ${step.step.rows} rows from ${step.step.requests} request(s)`) : null,
    h('div', { class: 'small muted', 'data-testid': 'tooltip-hint' }, touching ? 'Tap the token again to open this step in the viewer and fork from it.' : 'Click or press Enter to open this step in the viewer and fork from it.'),
  );
  tipEl.hidden = false;
  if (tipAnchor && tipAnchor !== anchor) tipAnchor.removeAttribute('aria-describedby');
  tipAnchor = anchor;
  anchor.setAttribute('aria-describedby', 'tooltip');
  place(anchor);
}

/** Puts the tooltip by its chip, inside the window: below the chip, else above it, else against
 * the window's bottom edge; taller than the window, it scrolls. */
function place(anchor) {
  const r = anchor.getBoundingClientRect();
  const vw = document.documentElement.clientWidth;
  const vh = window.innerHeight;
  const margin = 6;
  tipEl.style.left = '0px';
  tipEl.style.top = '0px';
  tipEl.style.maxHeight = `${vh - 2 * margin}px`;
  tipEl.style.overflowY = 'auto';
  const tw = tipEl.offsetWidth;
  const th = tipEl.offsetHeight;
  let left = r.left + r.width / 2 - tw / 2;
  left = Math.max(margin, Math.min(vw - tw - margin, left));
  let top = r.bottom + margin;
  if (top + th > vh - margin) {
    top = r.top - th - margin >= margin ? r.top - th - margin : vh - th - margin;
  }
  tipEl.style.left = `${Math.round(left)}px`;
  tipEl.style.top = `${Math.round(Math.max(margin, top))}px`;
}
