//! Kernels over Q4_K and Q6_K rows in the [row-interleaved](crate::WeightLayout::RowInterleaved)
//! layout against 16-bit activations ([`quantize_row_i16`](crate::quantize_row_i16))
//! (AVX512-F/BW/VNNI): each super-block's scaled codes meet the activations in `vpdpwssd`
//! pairs, sixteen rows to a register (see [`InterleavedK`] for the arithmetic).
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA, F16C and AVX512-F/BW/VNNI/VL, and pointers
//! valid for the groups, activation rows and outputs they are told to touch.

use crate::dot::GemmCall;
use std::arch::x86_64::*;

use crate::layout::ROW_GROUP as GROUP_ROWS;
use crate::quantize::I16_QUANTS;

use super::interleaved_q32::TOKENS;

/// A K-quant type in the row-interleaved layout, against 16-bit activations
/// ([`quantize_row_i16`](crate::quantize_row_i16)).
///
/// # Canonical arithmetic
///
/// Per row and token, per super-block in order: `isum = Σ w'·y` over its 256 elements, where
/// `w' = scale · (q - 32)` (Q6_K) or `scale · q` (Q4_K) with the element's sub-block scale, and
/// for Q4_K `msum = Σ m · Σ y` over its eight sub-blocks (both exact in i32: `|w'| ≤ 4096` and
/// `|y| ≤ 2047`); then `acc = fma(f32(isum), dx · dy, acc)` and, for Q4_K,
/// `acc = fma(f32(msum), (-dmin) · dy, acc)`. [`crate::dot::twins::k_rows_i16_bitexact`]
/// is its portable twin.
pub(crate) trait InterleavedK {
    /// Bytes of one super-block of a group.
    const GROUP_BLOCK: usize;
    /// The type has a min term (Q4_K).
    const HAS_MIN: bool;
    /// Writes the group super-block's 128 pairs of scaled codes `w'` (sixteen rows' two
    /// elements as i16 pairs) to `panel`.
    unsafe fn panel(blk: *const u8, panel: *mut __m512i);
    /// The mins of the group super-block: eight registers, sixteen rows' mins of each
    /// sub-block as i32 (zero without a min term).
    unsafe fn mins(blk: *const u8) -> [__m512i; 8] {
        let _ = blk;
        [_mm512_setzero_si512(); 8]
    }
    /// `Σ w'·y` of one token (quants at `y`) straight from the group super-block, without a
    /// panel: each sub-block's unscaled sum, then one 32-bit multiply by its scales (the same
    /// integers as the panel's: a token decoded alone pays one multiply per sub-block instead
    /// of one per pair).
    unsafe fn one_token(blk: *const u8, y: *const u8) -> __m512i;
}

pub(crate) struct Q6K;
pub(crate) struct Q4K;

/// Sixteen rows' sub-block scales (bytes at `p`, signed or not) as i16 pairs `(s, s)`.
#[inline(always)]
unsafe fn scale_pairs(p: *const u8, signed: bool) -> __m512i {
    let bytes = _mm_loadu_si128(p as *const __m128i);
    let s = if signed {
        _mm512_cvtepi8_epi32(bytes)
    } else {
        _mm512_cvtepu8_epi32(bytes)
    };
    _mm512_or_si512(
        _mm512_and_si512(s, _mm512_set1_epi32(0xFFFF)),
        _mm512_slli_epi32::<16>(s),
    )
}

/// Pair `p`'s codes of sixteen rows (32 bytes at `codes + 32p`) widened to i16.
#[inline(always)]
unsafe fn code_pair(codes: *const u8, p: usize) -> __m512i {
    _mm512_cvtepu8_epi16(_mm256_loadu_si256(codes.add(32 * p) as *const __m256i))
}

/// Sub-block `j`'s sixteen pairs of Q4_K codes of sixteen rows as i16 pairs, in element order
/// (register `c`: elements `32j + 2c` and `+ 1`): each 64-byte register of nibbles (four
/// elements of each row per 32-bit lane, see `layout.rs`) spread by byte shuffles.
#[inline(always)]
unsafe fn sub_block_pairs(codes: *const u8, j: usize) -> [__m512i; 16] {
    let (nibble, zero) = (_mm512_set1_epi8(0x0F), -128i8);
    let spread = |a: i8, b: i8| {
        let lane = _mm_setr_epi8(
            a,
            zero,
            b,
            zero,
            4 + a,
            zero,
            4 + b,
            zero,
            8 + a,
            zero,
            8 + b,
            zero,
            12 + a,
            zero,
            12 + b,
            zero,
        );
        _mm512_broadcast_i32x4(lane)
    };
    let (first, second) = (spread(0, 1), spread(2, 3));
    let mut out = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let v = _mm512_loadu_si512(codes.add(256 * j + 64 * m) as *const _);
        let lo = _mm512_and_si512(v, nibble);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
        out[2 * m] = _mm512_shuffle_epi8(lo, first);
        out[2 * m + 1] = _mm512_shuffle_epi8(lo, second);
        out[8 + 2 * m] = _mm512_shuffle_epi8(hi, first);
        out[9 + 2 * m] = _mm512_shuffle_epi8(hi, second);
    }
    out
}

impl InterleavedK for Q6K {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_Q6_K;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn panel(blk: *const u8, panel: *mut __m512i) {
        for j in 0..16 {
            let scale = scale_pairs(blk.add(32 + 16 * j), true);
            for (c, q) in q6_k_pairs(blk, j).into_iter().enumerate() {
                _mm512_store_si512(panel.add(8 * j + c), _mm512_mullo_epi16(q, scale));
            }
        }
    }
    #[inline(always)]
    unsafe fn one_token(blk: *const u8, y: *const u8) -> __m512i {
        let mut isum = _mm512_setzero_si512();
        for j in 0..16 {
            let mut part = [_mm512_setzero_si512(); 2];
            for (c, q) in q6_k_pairs(blk, j).into_iter().enumerate() {
                let pair =
                    _mm512_set1_epi32((y.add(4 * (8 * j + c)) as *const i32).read_unaligned());
                part[c % 2] = _mm512_dpwssd_epi32(part[c % 2], q, pair);
            }
            let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(32 + 16 * j) as *const _));
            let sum = _mm512_add_epi32(part[0], part[1]);
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sum, scale));
        }
        isum
    }
}

/// Sub-block `j`'s eight pairs of Q6_K codes of sixteen rows, minus 32, as i16.
#[inline(always)]
unsafe fn q6_k_pairs(blk: *const u8, j: usize) -> [__m512i; 8] {
    let (codes, offset) = (blk.add(288), _mm512_set1_epi16(32));
    let mut out = [_mm512_setzero_si512(); 8];
    for (c, q) in out.iter_mut().enumerate() {
        *q = _mm512_sub_epi16(code_pair(codes, 8 * j + c), offset);
    }
    out
}

impl InterleavedK for Q4K {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_Q4_K;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn panel(blk: *const u8, panel: *mut __m512i) {
        let codes = blk.add(320);
        for j in 0..8 {
            let scale = scale_pairs(blk.add(64 + 16 * j), false);
            for (c, q) in sub_block_pairs(codes, j).into_iter().enumerate() {
                _mm512_store_si512(panel.add(16 * j + c), _mm512_mullo_epi16(q, scale));
            }
        }
    }
    #[inline(always)]
    unsafe fn mins(blk: *const u8) -> [__m512i; 8] {
        let mut mins = [_mm512_setzero_si512(); 8];
        for (j, m) in mins.iter_mut().enumerate() {
            *m = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(192 + 16 * j) as *const __m128i));
        }
        mins
    }
    #[inline(always)]
    unsafe fn one_token(blk: *const u8, y: *const u8) -> __m512i {
        let codes = blk.add(320);
        let mut isum = _mm512_setzero_si512();
        for j in 0..8 {
            let mut part = [_mm512_setzero_si512(); 2];
            for (c, q) in sub_block_pairs(codes, j).into_iter().enumerate() {
                let at = y.add(4 * (16 * j + c));
                let pair = _mm512_set1_epi32((at as *const i32).read_unaligned());
                part[c % 2] = _mm512_dpwssd_epi32(part[c % 2], q, pair);
            }
            let scale = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(64 + 16 * j) as *const _));
            let sum = _mm512_add_epi32(part[0], part[1]);
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sum, scale));
        }
        isum
    }
}

/// Tokens per register tile of the K-quant kernels: each scaled-code pair, loaded once from
/// the panel, meets this many tokens.
const K_TILE: usize = 4;

/// The integer sums `Σ w'·y` of `T` tokens (quants at `y`, rows `lda` bytes apart) against a
/// super-block's panel. Each token's pairs go round `C` accumulators (added at the end:
/// integers, so exactly), which keeps four `vpdpwssd` chains in flight however few the tokens.
#[inline(always)]
unsafe fn tile_sums<const T: usize, const C: usize>(
    panel: *const __m512i,
    y: *const u8,
    lda: usize,
) -> [__m512i; T] {
    let mut part = [[_mm512_setzero_si512(); C]; T];
    let mut p = 0;
    while p < 128 {
        for c in 0..C {
            let wp = _mm512_load_si512(panel.add(p + c));
            for (u, acc) in part.iter_mut().enumerate() {
                let at = y.add(u * lda + 4 * (p + c));
                let pair = _mm512_set1_epi32((at as *const i32).read_unaligned());
                acc[c] = _mm512_dpwssd_epi32(acc[c], wp, pair);
            }
        }
        p += C;
    }
    let mut sums = [_mm512_setzero_si512(); T];
    for (s, acc) in sums.iter_mut().zip(&part) {
        for a in acc {
            *s = _mm512_add_epi32(*s, *a);
        }
    }
    sums
}

/// [`tile_sums`] with `C = 1` for two groups' panels at once: each token's activation pair,
/// broadcast once, meets both (the same integer sums, so the same bits, as two calls).
#[inline(always)]
unsafe fn tile_sums_two<const T: usize>(
    panels: [*const __m512i; 2],
    y: *const u8,
    lda: usize,
) -> [[__m512i; T]; 2] {
    let mut sums = [[_mm512_setzero_si512(); T]; 2];
    for p in 0..128 {
        let w = [
            _mm512_load_si512(panels[0].add(p)),
            _mm512_load_si512(panels[1].add(p)),
        ];
        let [first, second] = &mut sums;
        for (u, (s0, s1)) in first.iter_mut().zip(second.iter_mut()).enumerate() {
            let at = y.add(u * lda + 4 * p);
            let pair = _mm512_set1_epi32((at as *const i32).read_unaligned());
            *s0 = _mm512_dpwssd_epi32(*s0, w[0], pair);
            *s1 = _mm512_dpwssd_epi32(*s1, w[1], pair);
        }
    }
    sums
}

/// `T` sums in a tile of [`K_TILE`].
#[inline(always)]
unsafe fn pad<const T: usize>(sums: [__m512i; T]) -> [__m512i; K_TILE] {
    let mut out = [_mm512_setzero_si512(); K_TILE];
    out[..T].copy_from_slice(&sums);
    out
}

/// [`pad`] for both groups of [`tile_sums_two`].
#[inline(always)]
unsafe fn pad_two<const T: usize>(sums: [[__m512i; T]; 2]) -> [[__m512i; K_TILE]; 2] {
    [pad(sums[0]), pad(sums[1])]
}

/// 64-byte aligned storage for one super-block's panel of scaled codes.
#[repr(C, align(64))]
struct Panel([__m512i; 128]);

/// `out[t * ldo + r] = dot(row r, act row t)` for K-quant rows in whole groups of 16 and
/// 16-bit activation rows `lda` bytes apart, over `n` elements, in the canonical order of
/// [`InterleavedK`]. Groups go two at a time while there are (one at the end of an odd
/// count, and for a token decoded alone, which builds no panel).
#[inline(always)]
unsafe fn gemm_k<K: InterleavedK>(c: &GemmCall) {
    debug_assert!(c.nr.is_multiple_of(GROUP_ROWS));
    let groups = c.nr / GROUP_ROWS;
    let mut t0 = 0;
    while t0 < c.nt {
        let tn = TOKENS.min(c.nt - t0);
        let mut g = 0;
        while tn > 1 && g + 2 <= groups {
            groups_k::<K, 2>(c, g, t0, tn);
            g += 2;
        }
        while g < groups {
            groups_k::<K, 1>(c, g, t0, tn);
            g += 1;
        }
        t0 += tn;
    }
}

/// Groups `g..g + G` (`G` is 1 or 2) of a [`gemm_k`] call against its tokens `t0..t0 + tn`.
#[inline(always)]
unsafe fn groups_k<K: InterleavedK, const G: usize>(c: &GemmCall, g: usize, t0: usize, tn: usize) {
    let GemmCall {
        w,
        ldw,
        a,
        lda,
        n,
        out,
        ldo,
        ..
    } = *c;
    let nsb = n / 256;
    // Left unwritten: `K::panel` fills all of it before any read (a token decoded alone, which
    // needs none, then pays nothing for it).
    let mut panels = [const { std::mem::MaybeUninit::<Panel>::uninit() }; G];
    let mut pp = [std::ptr::null_mut::<__m512i>(); G];
    for (p, panel) in pp.iter_mut().zip(panels.iter_mut()) {
        *p = panel.as_mut_ptr() as *mut __m512i;
    }
    // Only the call's `tn` tokens' accumulators are zeroed (a token decoded alone zeroes one).
    let mut acc = [[std::mem::MaybeUninit::<__m512>::uninit(); TOKENS]; G];
    for acc in acc.iter_mut() {
        for v in acc.iter_mut().take(tn) {
            v.write(_mm512_setzero_ps());
        }
    }
    for sb in 0..nsb {
        let mut blk = [w; G];
        let mut mins = [[_mm512_setzero_si512(); 8]; G];
        let mut dw = [_mm512_setzero_ps(); G];
        let mut neg_dmin = [_mm512_setzero_ps(); G];
        for i in 0..G {
            blk[i] = w.add((g + i) * GROUP_ROWS * ldw + sb * K::GROUP_BLOCK);
            mins[i] = K::mins(blk[i]);
            dw[i] = _mm512_cvtph_ps(_mm256_loadu_si256(blk[i] as *const __m256i));
            if K::HAS_MIN {
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk[i].add(32) as *const __m256i));
                neg_dmin[i] = _mm512_sub_ps(_mm512_setzero_ps(), dmin);
            }
            if tn > 1 {
                K::panel(blk[i], pp[i]);
            }
        }
        // This super-block of every token: its scale, sums and quants.
        let ya = a.add(t0 * lda + sb * crate::quantize::I16_BLOCK_BYTES);
        let mut t = 0;
        while t < tn {
            let tile = K_TILE.min(tn - t);
            let y = ya.add(t * lda + I16_QUANTS);
            let mut isum = [[_mm512_setzero_si512(); K_TILE]; G];
            if G == 2 {
                let two = match tile {
                    1 => pad_two(tile_sums_two::<1>([pp[0], pp[G - 1]], y, lda)),
                    2 => pad_two(tile_sums_two::<2>([pp[0], pp[G - 1]], y, lda)),
                    3 => pad_two(tile_sums_two::<3>([pp[0], pp[G - 1]], y, lda)),
                    _ => tile_sums_two::<4>([pp[0], pp[G - 1]], y, lda),
                };
                isum[0] = two[0];
                isum[G - 1] = two[1];
            } else {
                isum[0] = match tile {
                    1 if tn == 1 => pad([K::one_token(blk[0], y)]),
                    1 => pad(tile_sums::<1, 4>(pp[0], y, lda)),
                    2 => pad(tile_sums::<2, 2>(pp[0], y, lda)),
                    3 => pad(tile_sums::<3, 1>(pp[0], y, lda)),
                    _ => tile_sums::<4, 1>(pp[0], y, lda),
                };
            }
            for u in 0..tile {
                let yt = ya.add((t + u) * lda);
                let dy = _mm512_set1_ps((yt as *const f32).read_unaligned());
                for i in 0..G {
                    let v = acc[i][t + u].assume_init_mut();
                    *v = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(isum[i][u]),
                        _mm512_mul_ps(dw[i], dy),
                        *v,
                    );
                    if K::HAS_MIN {
                        let mut msum = _mm512_setzero_si512();
                        for (j, m) in mins[i].iter().enumerate() {
                            let sum = (yt.add(4 + 4 * j) as *const i32).read_unaligned();
                            let term = _mm512_mullo_epi32(*m, _mm512_set1_epi32(sum));
                            msum = _mm512_add_epi32(msum, term);
                        }
                        let scale = _mm512_mul_ps(neg_dmin[i], dy);
                        *v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), scale, *v);
                    }
                }
            }
            t += tile;
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (t, v) in acc.iter().enumerate().take(tn) {
            let v = v.assume_init();
            _mm512_storeu_ps(out.add((t0 + t) * ldo + (g + i) * GROUP_ROWS), v);
        }
    }
}

rows_entry!(gemm_q6_k_rows, gemm_k::<Q6K>, "Q6_K (16-bit activations)");
rows_entry!(gemm_q4_k_rows, gemm_k::<Q4K>, "Q4_K (16-bit activations)");
