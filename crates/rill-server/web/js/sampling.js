// Reshaping a next-token distribution exactly as rill's engine does (docs/glass-box-api.md,
// "Reshaping exactly as the engine does"). Pure functions, no DOM: everything is computed over the
// whole vocabulary in float64.
//
// The chain, applied to the raw logits l in this order:
//   0. a structured-output constraint (when the step had one): tokens it does not allow are
//      removed before anything else (their logits become -inf)
//   1. top-k  (k > 0 and k < vocab): keep the k largest logits (ties: lower token id first)
//   2. top-p  (p < 1): softmax of the kept logits (no temperature), sorted by probability descending
//      (ties: lower id first), keep the shortest prefix whose mass reaches p (at least one)
//   3. min-p  (m > 0): keep tokens with l >= max(l) + ln(m) among those kept
//   4. temperature: T = 0 keeps only the most likely token (and skips 1-3); otherwise l / T
//   5. softmax over what is kept
//
// Every stage keeps the order of the logits, so each kept set is a prefix of the vocabulary sorted
// by logit (descending, ties by lower id): the whole chain reduces to three prefix lengths.

/** Reasons a token is cut (values of `cutBy`). */
export const KEPT = 0;
export const CUT_TOP_K = 1;
export const CUT_TOP_P = 2;
export const CUT_MIN_P = 3;
export const CUT_GREEDY = 4;
export const CUT_GRAMMAR = 5;

export const CUT_LABELS = ['', 'top-k', 'top-p', 'min-p', 'T = 0', 'grammar'];

/**
 * The tokens a step's constraint allowed (its `constraint` object: `allowed_ids`, `blocked_ids`
 * or `mask`, base64 of little-endian u32 words, token t is bit t % 32 of word t / 32), as a
 * Uint8Array of 1 (allowed) and 0 over the vocabulary; null when the step has none.
 */
export function constraintMask(c, vocab) {
  if (!c) return null;
  const out = new Uint8Array(vocab);
  if (c.allowed_ids) {
    for (const t of c.allowed_ids) if (t < vocab) out[t] = 1;
  } else if (c.blocked_ids) {
    out.fill(1);
    for (const t of c.blocked_ids) if (t < vocab) out[t] = 0;
  } else if (c.mask) {
    const bin = atob(c.mask);
    for (let t = 0; t < vocab; t++) {
      const byte = bin.charCodeAt(t >>> 3);
      out[t] = (byte >>> (t & 7)) & 1;
    }
  } else {
    return null;
  }
  return out;
}

/** Decodes base64 of little-endian f32 values into a Float32Array. */
export function decodeLogits(b64) {
  const bin = atob(b64);
  const n = bin.length >>> 2;
  if (bin.length !== n * 4) throw new Error(`logits: ${bin.length} bytes is not a whole number of f32`);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = view.getFloat32(i * 4, true);
  return out;
}

/** Encodes a Float32Array as base64 of little-endian f32 (the inverse of decodeLogits). */
export function encodeLogits(f32) {
  const bytes = new Uint8Array(f32.length * 4);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < f32.length; i++) view.setFloat32(i * 4, f32[i], true);
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

/**
 * OpenAI/llama.cpp-style penalties over the last `lastN` tokens of `context` (prompt included):
 * repetition (positive logits divided by r, negative multiplied), then presence (once) and
 * frequency (per occurrence) subtracted. Returns a new Float64Array; `logits` is left as is.
 */
export function applyPenalties(logits, context, { repetition = 1, presence = 0, frequency = 0, lastN = 64 } = {}) {
  const out = Float64Array.from(logits);
  if ((repetition === 1 && presence === 0 && frequency === 0) || lastN === 0) return out;
  const window = lastN < 0 ? context : context.slice(Math.max(0, context.length - lastN));
  const counts = new Map();
  for (const t of window) counts.set(t, (counts.get(t) || 0) + 1);
  for (const [t, c] of counts) {
    if (t < 0 || t >= out.length) continue;
    let l = out[t];
    if (repetition !== 1) l = l > 0 ? l / repetition : l * repetition;
    l -= c * frequency + (c > 0 ? presence : 0);
    out[t] = l;
  }
  return out;
}

/**
 * The vocabulary sorted by logit, descending, ties broken by lower token id (a Uint32Array of
 * token ids). NaN logits sort last.
 */
export function sortByLogit(logits) {
  const n = logits.length;
  const order = new Uint32Array(n);
  for (let i = 0; i < n; i++) order[i] = i;
  order.sort((a, b) => {
    const la = logits[a], lb = logits[b];
    if (la > lb) return -1;
    if (la < lb) return 1;
    if (la === lb) return a - b;
    // NaN involved
    const na = Number.isNaN(la), nb = Number.isNaN(lb);
    if (na !== nb) return na ? 1 : -1;
    return a - b;
  });
  return order;
}

/** Softmax of `logits` (any numeric array) in float64. */
export function softmax(logits) {
  const n = logits.length;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (logits[i] > max) max = logits[i];
  const out = new Float64Array(n);
  if (max === -Infinity) return out;
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const e = Math.exp(logits[i] - max);
    out[i] = e;
    sum += e;
  }
  for (let i = 0; i < n; i++) out[i] /= sum;
  return out;
}

/** Shannon entropy in nats of a probability vector. */
export function entropy(probs) {
  let h = 0;
  for (let i = 0; i < probs.length; i++) {
    const p = probs[i];
    if (p > 0) h -= p * Math.log(p);
  }
  return h;
}

/**
 * Prepares a distribution for repeated reshaping: the logits (float64, after penalties when given),
 * the raw probabilities (softmax of the unpenalised logits), their entropy, and the sorted order.
 */
export function prepare(rawLogits, { context = [], penalties = null, allowed = null } = {}) {
  const logits = penalties ? applyPenalties(rawLogits, context, penalties) : Float64Array.from(rawLogits);
  let allowedCount = null;
  if (allowed) {
    allowedCount = 0;
    for (let t = 0; t < logits.length; t++) {
      if (allowed[t]) allowedCount++;
      else logits[t] = -Infinity;
    }
    if (allowedCount === 0) allowedCount = null;
  }
  const rawProbs = softmax(rawLogits);
  return {
    vocab: logits.length,
    logits,
    rawProbs,
    rawEntropy: entropy(rawProbs),
    order: sortByLogit(logits),
    allowedCount,
  };
}

/** Number of leading entries of `order` kept by top-k. */
export function topKCount(n, k) {
  return k > 0 && k < n ? k : n;
}

/**
 * Number of leading entries of `order` (restricted to the first `keptBefore`) kept by top-p: the
 * shortest prefix of the softmax of the kept logits (no temperature) whose mass reaches p.
 */
export function topPCount(logits, order, keptBefore, p) {
  if (!(p < 1)) return keptBefore;
  const max = logits[order[0]];
  let total = 0;
  const w = new Float64Array(keptBefore);
  for (let r = 0; r < keptBefore; r++) {
    const e = Math.exp(logits[order[r]] - max);
    w[r] = e;
    total += e;
  }
  let cum = 0;
  for (let r = 0; r < keptBefore; r++) {
    cum += w[r] / total;
    if (cum >= p) return r + 1;
  }
  return keptBefore;
}

/** Number of leading entries (among the first `keptBefore`) with l >= max(l) + ln(m). */
export function minPCount(logits, order, keptBefore, m) {
  if (!(m > 0)) return keptBefore;
  const threshold = logits[order[0]] + Math.log(m);
  let n = 1; // the most likely token is never cut
  while (n < keptBefore && logits[order[n]] >= threshold) n++;
  return n;
}

/**
 * Reshapes a prepared distribution (from `prepare`) with { temperature, topK, topP, minP }.
 * Returns:
 *   probs      Float64Array over the vocabulary: the distribution a token would be drawn from
 *   cutBy      Uint8Array: KEPT or the rule that cut each token
 *   kept       how many tokens are kept (they are order[0..kept])
 *   afterTopK, afterTopP, afterMinP: tokens kept after each rule
 *   massTopK, massTopP, massMinP: raw probability mass kept after each rule
 *   cutMass    raw probability mass of every cut token
 *   entropy    entropy of `probs` (nats); rawEntropy that of the raw distribution
 */
export function reshape(prep, { temperature = 1, topK = 0, topP = 1, minP = 0 } = {}) {
  const { logits, order, rawProbs, vocab } = prep;
  // The constraint's tokens come first in `order` (the others are -inf).
  const allowed = prep.allowedCount === null || prep.allowedCount === undefined ? vocab : prep.allowedCount;
  const cutBy = new Uint8Array(vocab);
  let afterTopK, afterTopP, afterMinP;
  if (temperature === 0) {
    afterTopK = afterTopP = afterMinP = 1;
  } else {
    afterTopK = topKCount(allowed, topK);
    afterTopP = topPCount(logits, order, afterTopK, topP);
    afterMinP = minPCount(logits, order, afterTopP, minP);
  }
  const kept = afterMinP;
  let massGrammar = 0, massTopK = 0, massTopP = 0, massMinP = 0;
  for (let r = 0; r < vocab; r++) {
    const t = order[r];
    const p = rawProbs[t];
    if (r < allowed) massGrammar += p;
    if (r >= allowed) {
      cutBy[t] = CUT_GRAMMAR;
      continue;
    }
    if (temperature === 0) {
      if (r >= 1) cutBy[t] = CUT_GREEDY;
    } else if (r >= afterTopK) cutBy[t] = CUT_TOP_K;
    else if (r >= afterTopP) cutBy[t] = CUT_TOP_P;
    else if (r >= afterMinP) cutBy[t] = CUT_MIN_P;
    if (r < afterTopK) massTopK += p;
    if (r < afterTopP) massTopP += p;
    if (r < afterMinP) massMinP += p;
  }
  const probs = new Float64Array(vocab);
  if (temperature === 0) {
    probs[order[0]] = 1;
  } else {
    const max = logits[order[0]] / temperature;
    let sum = 0;
    for (let r = 0; r < kept; r++) {
      const t = order[r];
      const e = Math.exp(logits[t] / temperature - max);
      probs[t] = e;
      sum += e;
    }
    for (let r = 0; r < kept; r++) probs[order[r]] /= sum;
  }
  let h = 0;
  for (let r = 0; r < kept; r++) {
    const p = probs[order[r]];
    if (p > 0) h -= p * Math.log(p);
  }
  return {
    probs,
    cutBy,
    kept,
    afterTopK,
    afterTopP,
    afterMinP,
    afterGrammar: allowed,
    massGrammar,
    massTopK,
    massTopP,
    massMinP,
    cutMass: Math.max(0, 1 - massMinP),
    entropy: h,
    rawEntropy: prep.rawEntropy,
  };
}
