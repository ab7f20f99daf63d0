//! Kernels over super-block types (256 elements: IQ4_XS, Q4_K, Q5_K; Q6_K in its nibble layout)
//! in the [row-interleaved](crate::WeightLayout::RowInterleaved) layout against their 8-bit Q8_K
//! activations (AVX512-F/BW/VNNI). A group's super-block holds sixteen rows' scale fields and
//! decoded sub-block scales (and mins) in front of the codes, each 32-element sub-block's codes
//! laid out as Q4_0's group block holds its block's (see `interleaved_q32.rs`): one `vpdpbusd` adds four
//! elements of sixteen rows at once, eight of them complete a sub-block's integer sum in each
//! lane, and one 32-bit multiply applies the sixteen rows' sub-block scales.
//!
//! # Canonical arithmetic: the blocks' own
//!
//! Per row and token, per super-block in order: `isum = Σ_j scale_j · Σ q · y` over the eight
//! sub-blocks (IQ4_XS: level `q`, scale `ls - 32`; Q4_K, Q5_K: 4- or 5-bit code, 6-bit scale;
//! Q6_K: code minus 32, a signed 8-bit scale per 16 elements), exact in i32; for Q4_K and Q5_K
//! also `msum = Σ_j m_j · Σ y` (exact); then
//! `acc += (dy · dx) · f32(isum)` (minus `(dy · dmin) · f32(msum)`), multiplies and adds
//! unfused. That is what [`scalar::iq4_xs_q8_k`](crate::dot::scalar::iq4_xs_q8_k),
//! [`scalar::q4_k_q8_k`](crate::dot::scalar::q4_k_q8_k),
//! [`scalar::q5_k_q8_k`](crate::dot::scalar::q5_k_q8_k) and
//! [`scalar::q6_k_q8_k`](crate::dot::scalar::q6_k_q8_k) compute on the file's blocks, so they
//! are the twins (Q4_K's and Q6_K's blocks run other tiles, `blocks_k.rs`, with their own
//! canonical order).
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA, F16C and AVX512-F/BW/VNNI/VL, and pointers
//! valid for the groups, activation rows and outputs they are told to touch.

use crate::dot::GemmCall;
use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::layout::{GROUP_BLOCK_IQ4_XS, GROUP_BLOCK_Q5_K, ROW_GROUP as GROUP_ROWS};
use crate::quant_types::BlockQ8K;
use crate::QK_K;

use super::blocks_q32::prefetch_ahead;
use super::interleaved_q32::{
    add_bit_plane, iq4_code_table, iq4_codes, nibble_codes, PREFETCH_TOKENS, TOKENS,
};

/// One token's Q8_K super-block as the kernels' inner loops read it.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct SuperAct {
    /// `dy` (f32).
    d: f32,
    /// Each 16 quants' `-OFFSET · Σ y` (from the block's sums): where an integer sum starts, so
    /// that the unsigned codes complete it to `Σ q · y` exactly.
    start: [i32; 16],
    /// Sub-blocks `2p` and `2p + 1`'s `Σ y` as an i16 pair (`|Σ y| ≤ 32 · 127`), which meet
    /// the rows' mins in one `vpdpwssd` per pair.
    sum_pairs: [i32; 4],
}

/// Super-blocks of activations a thread's buffer starts with (64 tokens of 8192 columns).
const MIN_SUPER_ACTS: usize = 64 * 32;

thread_local! {
    /// Per-thread [`SuperAct`]s of the call's token block, super-block-major.
    static SUPER_ACTS: RefCell<Vec<SuperAct>> = const { RefCell::new(Vec::new()) };
}

/// Allocates this thread's activation buffer at its starting size (see
/// `matmul::prepare_thread`).
pub(crate) fn prepare_thread() {
    SUPER_ACTS.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < MIN_SUPER_ACTS {
            buf.resize(MIN_SUPER_ACTS, SuperAct::default());
        }
    });
}

/// A super-block type in the row-interleaved layout.
pub(crate) trait SuperBlocks {
    /// Bytes of one super-block of a group.
    const GROUP_BLOCK: usize;
    /// What the codes add to the signed quants.
    const OFFSET: i32;
    /// The type has mins (Q4_K, Q5_K), whose `dmin` follows the sixteen `d`.
    const HAS_MIN: bool;
    /// Scales per 16 elements (Q6_K) rather than per 32-element sub-block.
    const HALVES: bool = false;
    /// Sub-block `j`'s codes: register `k` holds elements `4k..4k + 4` of every row.
    unsafe fn codes(blk: *const u8, j: usize, table: __m512i) -> [__m512i; 8];
    /// Sub-block `j`'s scales of the sixteen rows, as i32 (with [`Self::HALVES`]: its first
    /// half's, and its second half's in the second register).
    unsafe fn scales(blk: *const u8, j: usize) -> [__m512i; 2];
    /// The sixteen rows' mins of sub-blocks `2p` and `2p + 1` as i16 pairs, `p < 4`.
    unsafe fn min_pairs(blk: *const u8) -> [__m512i; 4] {
        let _ = blk;
        [_mm512_setzero_si512(); 4]
    }
}

pub(crate) struct Iq4Xs;
pub(crate) struct Q4K;
pub(crate) struct Q5K;

/// Sub-block `j`'s 6-bit scales of a Q4_K/Q5_K group super-block, as i32.
#[inline(always)]
unsafe fn k_scales(blk: *const u8, j: usize) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(64 + 16 * j) as *const _))
}

/// The mins of sub-blocks `2p` and `2p + 1` of a Q4_K/Q5_K group super-block as i16 pairs.
#[inline(always)]
unsafe fn k_min_pairs(blk: *const u8) -> [__m512i; 4] {
    let mut pairs = [_mm512_setzero_si512(); 4];
    for (p, pair) in pairs.iter_mut().enumerate() {
        let m = |j: usize| _mm_loadu_si128(blk.add(192 + 16 * j) as *const __m128i);
        let (lo, hi) = (
            _mm512_cvtepu8_epi32(m(2 * p)),
            _mm512_cvtepu8_epi32(m(2 * p + 1)),
        );
        *pair = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
    }
    pairs
}

impl SuperBlocks for Q4K {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_Q4_K;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn codes(blk: *const u8, j: usize, _table: __m512i) -> [__m512i; 8] {
        nibble_codes(blk.add(320 + 256 * j))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, j: usize) -> [__m512i; 2] {
        let s = k_scales(blk, j);
        [s, s]
    }
    #[inline(always)]
    unsafe fn min_pairs(blk: *const u8) -> [__m512i; 4] {
        k_min_pairs(blk)
    }
}

impl SuperBlocks for Iq4Xs {
    const GROUP_BLOCK: usize = GROUP_BLOCK_IQ4_XS;
    const OFFSET: i32 = 128;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn codes(blk: *const u8, j: usize, table: __m512i) -> [__m512i; 8] {
        iq4_codes(blk.add(160 + 256 * j), table)
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, j: usize) -> [__m512i; 2] {
        let s = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(32 + 16 * j) as *const _));
        [s, s]
    }
}

impl SuperBlocks for Q5K {
    const GROUP_BLOCK: usize = GROUP_BLOCK_Q5_K;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    /// Q4_K's nibbles, each with its fifth bit from the sub-block's plane, as Q5_0's.
    #[inline(always)]
    unsafe fn codes(blk: *const u8, j: usize, table: __m512i) -> [__m512i; 8] {
        let mut codes = Q4K::codes(blk, j, table);
        add_bit_plane(&mut codes, blk.add(2368 + 64 * j), 16);
        codes
    }
    /// Q4_K's: the group super-blocks share their layout up to the bit planes.
    #[inline(always)]
    unsafe fn scales(blk: *const u8, j: usize) -> [__m512i; 2] {
        Q4K::scales(blk, j)
    }
    #[inline(always)]
    unsafe fn min_pairs(blk: *const u8) -> [__m512i; 4] {
        Q4K::min_pairs(blk)
    }
}

pub(crate) struct Q6K;

impl SuperBlocks for Q6K {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_Q6_K_NIBBLES;
    const OFFSET: i32 = 32;
    const HAS_MIN: bool = false;
    const HALVES: bool = true;
    /// The nibbles, each with bits 4 and 5 from the part's two rearranged planes.
    #[inline(always)]
    unsafe fn codes(blk: *const u8, j: usize, _table: __m512i) -> [__m512i; 8] {
        let planes = blk.add(2336 + 128 * j);
        let mut codes = nibble_codes(blk.add(288 + 256 * j));
        add_bit_plane(&mut codes, planes, 16);
        add_bit_plane(&mut codes, planes.add(64), 32);
        codes
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, j: usize) -> [__m512i; 2] {
        let half = |h: usize| {
            _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(32 + 16 * (2 * j + h)) as *const _))
        };
        [half(0), half(1)]
    }
}

/// `out[t * ldo + r] = dot(row r, act row t)` for rows of `K` in whole groups of 16 and Q8_K
/// activation rows `lda` bytes apart, over `n` elements, in the canonical order above.
#[inline(always)]
unsafe fn gemm<K: SuperBlocks>(c: &GemmCall) {
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
    debug_assert!(nr.is_multiple_of(GROUP_ROWS));
    let nsb = n / QK_K;
    let table = iq4_code_table();
    // Take the buffer out of the thread-local rather than working inside a `with` closure: a
    // closure would not inherit this function's target features.
    let mut acts = SUPER_ACTS.with(|cell| cell.take());
    let mut acc = [_mm512_setzero_ps(); TOKENS];
    let mut isum = [_mm512_setzero_si512(); TOKENS];
    let mut t0 = 0;
    while t0 < nt {
        let tn = TOKENS.min(nt - t0);
        if acts.len() < nsb * tn {
            acts.resize(
                (nsb * tn).next_power_of_two().max(MIN_SUPER_ACTS),
                SuperAct::default(),
            );
        }
        for t in 0..tn {
            let y = a.add((t0 + t) * lda);
            for sb in 0..nsb {
                let yb = y.add(sb * BlockQ8K::BYTES);
                // The block's exact sums of each 16 quants, and of each 32.
                let bsum = |g: usize| {
                    (yb.add(BlockQ8K::BSUMS + 2 * g) as *const i16).read_unaligned() as i32
                };
                let halves: [i32; 16] = std::array::from_fn(bsum);
                let sums: [i32; 8] = std::array::from_fn(|j| halves[2 * j] + halves[2 * j + 1]);
                acts[sb * tn + t] = SuperAct {
                    d: (yb.add(BlockQ8K::D) as *const f32).read_unaligned(),
                    start: halves.map(|s| -K::OFFSET * s),
                    sum_pairs: std::array::from_fn(|p| {
                        (sums[2 * p] & 0xFFFF) | (sums[2 * p + 1] << 16)
                    }),
                };
            }
        }
        for g in 0..nr / GROUP_ROWS {
            let wg = w.add(g * GROUP_ROWS * ldw);
            for v in acc.iter_mut().take(tn) {
                *v = _mm512_setzero_ps();
            }
            for sb in 0..nsb {
                let blk = wg.add(sb * K::GROUP_BLOCK);
                if tn <= PREFETCH_TOKENS {
                    // Few tokens: stream the next super-block in ahead of the hardware
                    // prefetcher.
                    prefetch_ahead(blk, K::GROUP_BLOCK, K::GROUP_BLOCK);
                }
                let ab = acts.as_ptr().add(sb * tn);
                let ya = a.add(t0 * lda + sb * BlockQ8K::BYTES + BlockQ8K::QS);
                // Sub-block by sub-block, its codes and scales in registers while every token
                // meets them (each token's super-block sum kept in `isum`).
                for j in 0..8 {
                    let codes = K::codes(blk, j, table);
                    let [scale, second_scale] = K::scales(blk, j);
                    for (t, s) in isum.iter_mut().enumerate().take(tn) {
                        let yt = ya.add(t * lda + 32 * j);
                        let start = &(*ab.add(t)).start;
                        let (first, second) = (start[2 * j], start[2 * j + 1]);
                        let mut part =
                            _mm512_set1_epi32(if K::HALVES { first } else { first + second });
                        let mut half = _mm512_set1_epi32(second);
                        for (k, code) in codes.iter().enumerate() {
                            let at = yt.add(4 * k) as *const i32;
                            let act = _mm512_set1_epi32(at.read_unaligned());
                            if K::HALVES && k >= 4 {
                                half = _mm512_dpbusd_epi32(half, *code, act);
                            } else {
                                part = _mm512_dpbusd_epi32(part, *code, act);
                            }
                        }
                        let mut scaled = _mm512_mullo_epi32(part, scale);
                        if K::HALVES {
                            scaled =
                                _mm512_add_epi32(scaled, _mm512_mullo_epi32(half, second_scale));
                        }
                        *s = if j == 0 {
                            scaled
                        } else {
                            _mm512_add_epi32(*s, scaled)
                        };
                    }
                }
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
                let (dmin, mins) = if K::HAS_MIN {
                    let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i));
                    (dmin, K::min_pairs(blk))
                } else {
                    (_mm512_setzero_ps(), [_mm512_setzero_si512(); 4])
                };
                for (t, s) in isum.iter().enumerate().take(tn) {
                    let act = &*ab.add(t);
                    let dy = _mm512_set1_ps(act.d);
                    let mut term = _mm512_mul_ps(_mm512_mul_ps(dy, dw), _mm512_cvtepi32_ps(*s));
                    if K::HAS_MIN {
                        let mut msum = _mm512_setzero_si512();
                        for (m, &pair) in mins.iter().zip(&act.sum_pairs) {
                            msum = _mm512_dpwssd_epi32(msum, *m, _mm512_set1_epi32(pair));
                        }
                        let min_term =
                            _mm512_mul_ps(_mm512_mul_ps(dy, dmin), _mm512_cvtepi32_ps(msum));
                        term = _mm512_sub_ps(term, min_term);
                    }
                    acc[t] = _mm512_add_ps(acc[t], term);
                }
            }
            for (t, v) in acc.iter().enumerate().take(tn) {
                _mm512_storeu_ps(out.add((t0 + t) * ldo + g * GROUP_ROWS), *v);
            }
        }
        t0 += tn;
    }
    SUPER_ACTS.with(|cell| cell.replace(acts));
}

gemm_entry!(
    /// IQ4_XS rows in the row-interleaved layout (`nr` a multiple of 16).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_iq4_xs_rows,
    gemm::<Iq4Xs>
);
gemm_entry!(
    /// Q4_K rows in the row-interleaved layout (`nr` a multiple of 16), 8-bit activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_q4_k_rows_i8,
    gemm::<Q4K>
);
gemm_entry!(
    /// Q6_K rows in the [row-interleaved nibble](crate::WeightLayout::RowInterleavedNibbles)
    /// layout (`nr` a multiple of 16), 8-bit activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_q6_k_nibbles,
    gemm::<Q6K>
);
gemm_entry!(
    /// Q5_K rows in the row-interleaved layout (`nr` a multiple of 16), 8-bit activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_q5_k_rows,
    gemm::<Q5K>
);
