//! Float-activation tiles: weight rows dequantized exactly to f32 (a panel of [`PANEL_ROWS`]
//! rows, [`CHUNK`] elements at a time) and multiplied with **unquantized** f32 activations. For
//! products whose inputs have outliers that 8-bit blocks resolve poorly (Gemma's GeGLU output
//! going into `ffn_down`), this is both more accurate and cheaper than two-level 8-bit
//! activations: the dequantization is paid once per panel and shared by every token, and the
//! inner loop is one FMA per 8 products.
//!
//! # Canonical arithmetic (what makes the results batch invariant)
//!
//! Every (row, token) value is `hsum(acc)`, where lane `l` of the 8-lane accumulator is the
//! fused multiply-add chain `acc = fma(w[k], x[k], acc)` over the elements `k ≡ l (mod 8)` in
//! increasing `k`, `w` being exactly what [`dequantize_row`](crate::dequantize_row) produces, and
//! `hsum` the fixed tree of [`hsum_ps`]. The tile shape, the chunking (accumulators are stored
//! and reloaded unchanged between chunks), the batch size and the thread split never change a
//! bit. [`crate::dot::twins::deq_bitexact`] reproduces it in portable code.
//!
//! Where the CPU has AVX512-F (and [`crate::wide_tiles`] is on), three tokens or more go in
//! pairs through 512-bit registers ([`gemm_wide`]): each register holds a pair's two
//! accumulators with their lanes interleaved, against a panel stored with every element twice,
//! so every lane runs the same chain.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA and F16C, and pointers valid for the rows,
//! activations and outputs they are told to touch.

use crate::dot::GemmCall;
use std::arch::x86_64::*;

use super::blocks_q32::{hsum4_paired, hsum_ps, idx, prefetch_ahead, PAIR};

mod chunks;
pub use chunks::dequantize_row_simd;
use chunks::*;

/// Elements dequantized per panel row at a time: one K-quant super-block, eight 32-blocks.
pub(crate) const CHUNK: usize = 256;
/// Weight rows per panel: eight independent accumulator chains when decoding one token.
pub(crate) const PANEL_ROWS: usize = 8;
/// Rows interleaved when decoding one token: independent FMA chains in flight.
const DECODE_ROWS: usize = 2;
/// Tokens per call the accumulator buffer is first sized for (the drivers' token block).
const START_TOKENS: usize = 64;

/// `acc[c][r] += panel row r · x row c` over `kl` elements (a multiple of 8), the R × C tile's
/// accumulators loaded from and stored back to `accs` (token `c`'s at `accs + c * PANEL_ROWS`),
/// or started from zero when `first`.
#[inline(always)]
unsafe fn micro<const R: usize, const C: usize>(
    panel: *const f32,
    x: *const f32,
    ldx: usize,
    kl: usize,
    accs: *mut __m256,
    first: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    if !first {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            for (c, a) in acc_r.iter_mut().enumerate() {
                *a = *accs.add(c * PANEL_ROWS + r);
            }
        }
    }
    let mut k = 0;
    while k < kl {
        let mut xv = [_mm256_setzero_ps(); C];
        for (c, v) in xv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(x.add(c * ldx + k));
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let w = _mm256_loadu_ps(panel.add(r * CHUNK + k));
            for (c, a) in acc_r.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(w, xv[c], *a);
            }
        }
        k += 8;
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (c, a) in acc_r.iter().enumerate() {
            *accs.add(c * PANEL_ROWS + r) = *a;
        }
    }
}

/// Tokens per 512-bit float tile: two pairs.
const WIDE_PAIRS: usize = 2;

/// The 512-bit twin of [`micro`]: `R` rows of a duplicated panel ([`StoreDup`]) against `P`
/// token pairs (`xs[p]`: a pair's activations for this chunk, interleaved by [`pair_tokens`]),
/// each register holding a pair's two 8-lane accumulators interleaved. Every lane takes exactly
/// the FMA chain of [`micro`]. Pair `p`'s row `r` accumulator lives at
/// `accs + p * PANEL_ROWS + r`.
#[inline(always)]
unsafe fn micro_wide<const R: usize, const P: usize>(
    panel: *const f32,
    xs: &[*const f32; P],
    kl: usize,
    accs: *mut __m512,
    first: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if !first {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            for (p, a) in acc_r.iter_mut().enumerate() {
                *a = *accs.add(p * PANEL_ROWS + r);
            }
        }
    }
    let mut k = 0;
    while k < kl {
        let mut xv = [_mm512_setzero_ps(); P];
        for (p, v) in xv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(xs[p].add(2 * k));
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let w = _mm512_loadu_ps(panel.add(2 * (r * CHUNK + k)));
            for (p, a) in acc_r.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(w, xv[p], *a);
            }
        }
        k += 8;
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (p, a) in acc_r.iter().enumerate() {
            *accs.add(p * PANEL_ROWS + r) = *a;
        }
    }
}

/// Lays out `nt` tokens' f32 activations (rows `ldx` floats apart, `n` elements) for
/// [`micro_wide`]: chunk `c` of pair `p` is `2 * CHUNK` floats at `((c * pairs) + p) * 2 *
/// CHUNK`, the two tokens' elements interleaved (a lone last token pairs with itself). The
/// tiles then read one sequential stream per pair.
#[inline(always)]
unsafe fn pair_tokens(x: *const f32, ldx: usize, n: usize, nt: usize, dst: *mut f32) {
    let pair = idx(PAIR);
    let pairs = nt.div_ceil(2);
    for p in 0..pairs {
        let x0 = x.add(2 * p * ldx);
        let x1 = x.add((2 * p + 1).min(nt - 1) * ldx);
        let mut k = 0;
        while k < n {
            let v = _mm512_permutex2var_ps(
                _mm512_castps256_ps512(_mm256_loadu_ps(x0.add(k))),
                pair,
                _mm512_castps256_ps512(_mm256_loadu_ps(x1.add(k))),
            );
            let at = ((k / CHUNK) * pairs + p) * 2 * CHUNK + 2 * (k % CHUNK);
            _mm512_storeu_ps(dst.add(at), v);
            k += 8;
        }
    }
}

/// One chunk of a duplicated panel of `rq` rows against `pairs` token pairs laid out by
/// [`pair_tokens`] (`xc`: this chunk's first pair), pair `p`'s accumulators at
/// `accs + p * PANEL_ROWS`.
#[inline(always)]
unsafe fn panel_pairs(
    panel: *const f32,
    rq: usize,
    xc: *const f32,
    pairs: usize,
    kl: usize,
    accs: *mut __m512,
    first: bool,
) {
    let mut p = 0;
    while p < pairs {
        let (a, x) = (accs.add(p * PANEL_ROWS), xc.add(p * 2 * CHUNK));
        if pairs - p >= WIDE_PAIRS {
            let mut xs = [x; WIDE_PAIRS];
            for (i, xp) in xs.iter_mut().enumerate() {
                *xp = x.add(i * 2 * CHUNK);
            }
            rows_wide(panel, rq, &xs, kl, a, first);
            p += WIDE_PAIRS;
        } else {
            rows_wide(panel, rq, &[x], kl, a, first);
            p += 1;
        }
    }
}

/// [`micro_wide`] over the `rq` rows of a panel: eight, four or one at a time.
#[inline(always)]
unsafe fn rows_wide<const P: usize>(
    panel: *const f32,
    rq: usize,
    xs: &[*const f32; P],
    kl: usize,
    accs: *mut __m512,
    first: bool,
) {
    if rq == PANEL_ROWS {
        return micro_wide::<PANEL_ROWS, P>(panel, xs, kl, accs, first);
    }
    let mut r = 0;
    while r < rq {
        let (pr, ar) = (panel.add(2 * r * CHUNK), accs.add(r));
        if rq - r >= 4 {
            micro_wide::<4, P>(pr, xs, kl, ar, first);
            r += 4;
        } else {
            micro_wide::<1, P>(pr, xs, kl, ar, first);
            r += 1;
        }
    }
}

/// One chunk of a panel of `rq` rows against `nt` tokens (token `t`'s activations at
/// `x + t * ldx`, its accumulators at `accs + t * PANEL_ROWS`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_tokens(
    panel: *const f32,
    rq: usize,
    x: *const f32,
    ldx: usize,
    nt: usize,
    kl: usize,
    accs: *mut __m256,
    first: bool,
) {
    if rq == PANEL_ROWS && nt < 3 {
        // Two tokens (one goes through `decode`): all eight rows per token, eight independent
        // accumulator chains.
        for t in 0..nt {
            let (xt, at) = (x.add(t * ldx), accs.add(t * PANEL_ROWS));
            micro::<PANEL_ROWS, 1>(panel, xt, ldx, kl, at, first);
        }
        return;
    }
    let mut r = 0;
    while r < rq {
        let quad = rq - r >= 4;
        let (p, a) = (panel.add(r * CHUNK), accs.add(r));
        let mut t = 0;
        while quad && t + 3 <= nt {
            micro::<4, 3>(p, x.add(t * ldx), ldx, kl, a.add(t * PANEL_ROWS), first);
            t += 3;
        }
        while t < nt {
            let (xt, at) = (x.add(t * ldx), a.add(t * PANEL_ROWS));
            if quad {
                micro::<4, 1>(p, xt, ldx, kl, at, first);
            } else {
                micro::<1, 1>(p, xt, ldx, kl, at, first);
            }
            t += 1;
        }
        r += if quad { 4 } else { 1 };
    }
}

thread_local! {
    /// Per-thread dequantized panel and accumulators for [`gemm`], kept for reuse.
    static BUFS: std::cell::RefCell<(Vec<f32>, Vec<__m256>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    /// Per-thread paired accumulators and paired activations of the 512-bit tiles.
    static WIDE_BUFS: std::cell::RefCell<(Vec<__m512>, Vec<__m512>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Allocates this thread's buffers at their starting size (see `matmul::prepare_thread`).
pub(crate) fn prepare_thread() {
    BUFS.with(|cell| {
        let mut bufs = cell.borrow_mut();
        bufs.0.resize(PANEL_ROWS * CHUNK, 0.0);
        if bufs.1.len() < START_TOKENS * PANEL_ROWS {
            // All-zero bits are a valid __m256; `zeroed` needs no AVX instruction, so this runs
            // on any x86-64 CPU (every pool thread prepares, whatever the kernels in use).
            let zero = unsafe { std::mem::zeroed::<__m256>() };
            bufs.1.resize(START_TOKENS * PANEL_ROWS, zero);
        }
    });
    if crate::cpu::has_vnni() {
        WIDE_BUFS.with(|cell| {
            let accs = &mut cell.borrow_mut().0;
            if accs.len() < START_TOKENS / 2 * PANEL_ROWS {
                // As above: all-zero bits, no AVX-512 instruction needed.
                let zero = unsafe { std::mem::zeroed::<__m512>() };
                accs.resize(START_TOKENS / 2 * PANEL_ROWS, zero);
            }
        });
    }
}

/// `out[t * ldo + r] = dot(dequantized w row r, x row t)` for `r < nr`, `t < nt`, rows `ldw`
/// bytes apart and f32 activation rows `lda` bytes apart, over `n` elements (whole blocks).
#[inline(always)]
unsafe fn gemm<D: ChunkDequant, const WIDE: bool>(c: &GemmCall) {
    let GemmCall {
        w,
        ldw,
        a,
        lda,
        n,
        nr,
        nt,
        out,
        ldo,
    } = *c;
    let (bs, bb) = (D::TY.block_size(), D::TY.block_bytes());
    let (x, ldx) = (a as *const f32, lda / 4);
    if nt == 1 {
        return decode::<D>(w, ldw, x, n, nr, out);
    }
    if WIDE && nt >= 3 && crate::cpu::wide_tiles() {
        return gemm_wide::<D>(w, ldw, x, ldx, n, nr, nt, out, ldo);
    }
    // Out of the thread-local rather than inside a `with` closure, which would not inherit
    // this function's target features.
    let (mut panel, mut accs) = BUFS.with(|cell| cell.take());
    if panel.len() < PANEL_ROWS * CHUNK {
        panel.resize(PANEL_ROWS * CHUNK, 0.0);
    }
    if accs.len() < nt * PANEL_ROWS {
        // Large steps: which thread gets which token count is decided at run time.
        accs.resize((nt * PANEL_ROWS).next_power_of_two(), _mm256_setzero_ps());
    }
    let (pp, ap) = (panel.as_mut_ptr(), accs.as_mut_ptr());
    let mut r0 = 0;
    while r0 < nr {
        let rq = PANEL_ROWS.min(nr - r0);
        let mut kc = 0;
        while kc < n {
            let kl = CHUNK.min(n - kc);
            let boff = kc / bs * bb;
            if nt < 3 {
                // Decode streams the matrix once: ask for the next panel's chunk now.
                for r in 0..PANEL_ROWS {
                    prefetch_ahead(w, (r0 + PANEL_ROWS + r) * ldw + boff, kl / bs * bb);
                }
            }
            let src = w.add(r0 * ldw + boff);
            for r in 0..rq {
                D::chunk(src.add(r * ldw), kl, &mut Store(pp.add(r * CHUNK)));
            }
            panel_tokens(pp, rq, x.add(kc), ldx, nt, kl, ap, kc == 0);
            kc += kl;
        }
        for t in 0..nt {
            for r in 0..rq {
                *out.add(t * ldo + r0 + r) = hsum_ps(*ap.add(t * PANEL_ROWS + r));
            }
        }
        r0 += rq;
    }
    BUFS.with(|cell| cell.replace((panel, accs)));
}

/// [`gemm`] for three tokens or more in 512-bit registers: the panel is stored duplicated and
/// the tokens go in pairs (see [`micro_wide`]); the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_wide<D: ChunkDequant>(
    w: *const u8,
    ldw: usize,
    x: *const f32,
    ldx: usize,
    n: usize,
    nr: usize,
    nt: usize,
    out: *mut f32,
    ldo: usize,
) {
    let (bs, bb) = (D::TY.block_size(), D::TY.block_bytes());
    let (mut panel, accs_256) = BUFS.with(|cell| cell.take());
    let (mut accs, mut paired) = WIDE_BUFS.with(|cell| cell.take());
    if panel.len() < 2 * PANEL_ROWS * CHUNK {
        panel.resize(2 * PANEL_ROWS * CHUNK, 0.0);
    }
    let pairs = nt.div_ceil(2);
    if accs.len() < pairs * PANEL_ROWS {
        accs.resize(
            (pairs * PANEL_ROWS).next_power_of_two(),
            _mm512_setzero_ps(),
        );
    }
    // 16 floats per unit.
    let paired_units = n.div_ceil(CHUNK) * pairs * 2 * CHUNK / 16;
    if paired.len() < paired_units {
        paired.resize(paired_units.next_power_of_two(), _mm512_setzero_ps());
    }
    let (pp, ap, xp) = (
        panel.as_mut_ptr(),
        accs.as_mut_ptr(),
        paired.as_mut_ptr().cast::<f32>(),
    );
    pair_tokens(x, ldx, n, nt, xp);
    let mut r0 = 0;
    while r0 < nr {
        let rq = PANEL_ROWS.min(nr - r0);
        let mut kc = 0;
        while kc < n {
            let kl = CHUNK.min(n - kc);
            let src = w.add(r0 * ldw + kc / bs * bb);
            for r in 0..rq {
                D::chunk(src.add(r * ldw), kl, &mut StoreDup(pp.add(2 * r * CHUNK)));
            }
            let xc = xp.add(kc / CHUNK * pairs * 2 * CHUNK);
            panel_pairs(pp, rq, xc, pairs, kl, ap, kc == 0);
            kc += kl;
        }
        for p in 0..pairs {
            for r4 in (0..rq).step_by(4) {
                let mut quad = [_mm512_setzero_ps(); 4];
                for (i, v) in quad.iter_mut().enumerate().take(rq - r4) {
                    *v = *ap.add(p * PANEL_ROWS + r4 + i);
                }
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), hsum4_paired(quad));
                for h in 0..2.min(nt - 2 * p) {
                    for i in 0..4.min(rq - r4) {
                        *out.add((2 * p + h) * ldo + r0 + r4 + i) = lanes[4 * i + h];
                    }
                }
            }
        }
        r0 += rq;
    }
    BUFS.with(|cell| cell.replace((panel, accs_256)));
    WIDE_BUFS.with(|cell| cell.replace((accs, paired)));
}

/// `out[r] = dot(dequantized w row r, x)` for `r < nr`, one token: each row's weights go
/// straight into its accumulator, [`DECODE_ROWS`] rows interleaved, with no panel round trip.
#[inline(always)]
unsafe fn decode<D: ChunkDequant>(
    w: *const u8,
    ldw: usize,
    x: *const f32,
    n: usize,
    nr: usize,
    out: *mut f32,
) {
    let mut r0 = 0;
    while r0 < nr {
        let (wr, o) = (w.add(r0 * ldw), out.add(r0));
        if nr - r0 >= DECODE_ROWS {
            let accs = D::dot_rows::<DECODE_ROWS>(wr, ldw, x, n);
            for (r, acc) in accs.into_iter().enumerate() {
                *o.add(r) = hsum_ps(acc);
            }
            r0 += DECODE_ROWS;
        } else {
            *o = hsum_ps(D::dot_rows::<1>(wr, ldw, x, n)[0]);
            r0 += 1;
        }
    }
}

/// The tiled float-activation kernel of each weight type.
macro_rules! deq_gemms {
    ($($gemm:ident, $gemm_wide:ident, $d:ty;)*) => {$(
        gemm_entry!(
            /// Tiled dequantized-weight × f32-activation product over a rectangle (see
            /// [`GemmKernel`](super::GemmKernel)).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub $gemm, gemm::<$d, false>
        );
        gemm_entry!(
            /// The same product, with whole token pairs in 512-bit registers (AVX512-F): the
            /// same bits.
            #[target_feature(enable = "avx2,fma,f16c,avx512f")]
            pub $gemm_wide, gemm::<$d, true>
        );
    )*};
}

deq_gemms! {
    gemm_f32act_f32, gemm_f32act_f32_wide, DeqF32;
    gemm_f32act_f16, gemm_f32act_f16_wide, DeqF16;
    gemm_f32act_bf16, gemm_f32act_bf16_wide, DeqBf16;
    gemm_f32act_q4_0, gemm_f32act_q4_0_wide, DeqQ4_0;
    gemm_f32act_q4_1, gemm_f32act_q4_1_wide, DeqQ4_1;
    gemm_f32act_q5_0, gemm_f32act_q5_0_wide, DeqQ5_0;
    gemm_f32act_q5_1, gemm_f32act_q5_1_wide, DeqQ5_1;
    gemm_f32act_q8_0, gemm_f32act_q8_0_wide, DeqQ8_0;
    gemm_f32act_q2_k, gemm_f32act_q2_k_wide, DeqQ2K;
    gemm_f32act_q3_k, gemm_f32act_q3_k_wide, DeqQ3K;
    gemm_f32act_q4_k, gemm_f32act_q4_k_wide, DeqQ4K;
    gemm_f32act_q5_k, gemm_f32act_q5_k_wide, DeqQ5K;
    gemm_f32act_q6_k, gemm_f32act_q6_k_wide, DeqQ6K;
    gemm_f32act_iq4_nl, gemm_f32act_iq4_nl_wide, DeqIq4Nl;
    gemm_f32act_iq4_xs, gemm_f32act_iq4_xs_wide, DeqIq4Xs;
    gemm_f32act_mxfp4, gemm_f32act_mxfp4_wide, DeqMxfp4;
    gemm_f32act_iq2_xxs, gemm_f32act_iq2_xxs_wide, DeqIq2Xxs;
    gemm_f32act_iq2_xs, gemm_f32act_iq2_xs_wide, DeqIq2Xs;
    gemm_f32act_iq2_s, gemm_f32act_iq2_s_wide, DeqIq2S;
    gemm_f32act_iq3_xxs, gemm_f32act_iq3_xxs_wide, DeqIq3Xxs;
    gemm_f32act_iq3_s, gemm_f32act_iq3_s_wide, DeqIq3S;
    gemm_f32act_iq1_s, gemm_f32act_iq1_s_wide, DeqIq1S;
    gemm_f32act_iq1_m, gemm_f32act_iq1_m_wide, DeqIq1M;
    gemm_f32act_tq1_0, gemm_f32act_tq1_0_wide, DeqTq1;
    gemm_f32act_tq2_0, gemm_f32act_tq2_0_wide, DeqTq2;
}
