//! Kernels over rows in the [row-interleaved](crate::WeightLayout::RowInterleaved) layout
//! (AVX512-F/BW/VNNI): sixteen rows' blocks side by side, so that one 512-bit register holds
//! four consecutive elements of each of sixteen rows. One `vpdpbusd` against a token's four
//! activation bytes, broadcast, then adds into sixteen (row, token) sums at once, and eight of
//! them finish a block: the block's integer dot product is complete in each lane, with no
//! horizontal sums, and it costs one conversion, one scale multiply and one FMA per sixteen
//! rows. The tiles of `blocks_q32/` spend three such instructions per row and token pair of lanes.
//!
//! # Canonical arithmetic (the 32-element types in this layout)
//!
//! Per row and token, in block order: `acc = fma(f32(Σ q · y), dx · dy, acc)`, starting from
//! zero, where the sum runs over the block's 32 (signed weight quant `q`: Q4_0's code minus 8,
//! Q4_1's code, Q5_0's code minus 16, Q8_0's byte, IQ4_NL's level, MXFP4's doubled FP4 level;
//! activation quant `y`) pairs in exact integer arithmetic and `dx · dy` is the f32 product of
//! the two block scales (MXFP4's: its E8M0 exponent's `2^(e - 128)`, exact in f32); for
//! Q4_1 then `acc = fma(mx, sy, acc)` with the weight block's min and the Q8_1 activation
//! block's `s`.
//! That is a different (and shorter) rounding sequence from the 8-lane order of the block and
//! scales-first layouts, so a matrix repacked this way gives its own bits: the same ones for one
//! token (decode) as in any batch, with any thread split, which is what batch invariance asks.
//! [`crate::dot::twins::rows_bitexact`] is its portable twin.
//!
//! The IQ4 types' codes are their levels plus 128, looked up from the index nibbles by one
//! `vpshufb` per register when a group's block is unpacked. IQ4_XS keeps its super-blocks:
//! each 32-element sub-block's sum is complete in its lane, one 32-bit multiply applies its
//! scale, and the super-block's exact integer sum meets `dx · dy` once, which is the
//! arithmetic of its blocks' own kernels, so for IQ4_XS the layout changes no bit.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA, F16C and AVX512-F/BW/VNNI/VL, and pointers
//! valid for the groups, activation rows and outputs they are told to touch.

use crate::dot::GemmCall;
use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::layout::{GROUP_BLOCK_Q5_0, GROUP_BLOCK_Q8_0, ROW_GROUP as GROUP_ROWS};

use super::blocks_q32::{prefetch_ahead, quant_sum};

/// Up to this many tokens (decode, and a decoding token's two activation parts), the kernel
/// prefetches the blocks it reads [`PREFETCH_AHEAD`] blocks ahead.
pub(crate) const PREFETCH_TOKENS: usize = 4;
const PREFETCH_AHEAD: usize = 4;

/// Tokens whose accumulators a group keeps at a time (in L1: 64 bytes each).
pub(crate) const TOKENS: usize = 64;

/// Activation blocks every thread's tables start with: every token block of the built-in
/// models' products, so that steady-state decoding never grows them.
const MIN_ACT_BLOCKS: usize = 64 * 64;

thread_local! {
    /// Per-thread tables of the call's token block's activation blocks, as the kernel's inner
    /// loop reads them, each `tokens · blocks` long and token-major (a token's blocks side by
    /// side, so that sixteen of them are widened and stored as one vector): each block's scale
    /// `dy`, its `s` field (Q8_1, met by the weights' min), then `-OFFSET · Σ y` as i32 bits
    /// (the start of its integer sum, which the unsigned codes complete to `Σ q · y` exactly).
    static ACT_TABLES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Allocates this thread's activation-block tables at their starting size (see
/// `matmul::prepare_thread`).
pub(crate) fn prepare_thread() {
    if crate::cpu::has_vnni() {
        ACT_TABLES.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < 3 * MIN_ACT_BLOCKS {
                buf.resize(3 * MIN_ACT_BLOCKS, 0.0);
            }
        });
        super::interleaved_super::prepare_thread();
    }
}

/// A weight type in the row-interleaved layout: how a group's block is laid out and unpacked.
/// Every type's codes are unsigned bytes `q + OFFSET` for the signed quant `q`, and each
/// block's integer sum starts from `-OFFSET · Σ y`, which gives `Σ q · y` exactly.
pub(crate) trait Interleaved {
    /// Bytes of one block of a group (sixteen rows' blocks).
    const GROUP_BLOCK: usize;
    /// What the codes add to the signed quants.
    const OFFSET: i32;
    /// The weight blocks have a min `m` (Q4_1), met by the Q8_1 activation block's `s`.
    const HAS_MIN: bool = false;
    /// Activation block bytes (Q8_0: 34; Q8_1: 36) and the offset of its quants.
    const AB: usize = 34;
    const AQ: usize = 2;
    /// The codes of the group's block at `blk`: register `k` holds elements `4k..4k+4` of every
    /// row, row `j` in lane `j`.
    unsafe fn codes(blk: *const u8) -> [__m512i; 8];
    /// The sixteen rows' block scales `dx` (row `j` in lane `j`): sixteen f16 at the start of
    /// the group's block.
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i))
    }
}

/// Q4_0/Q4_1 codes: the nibbles of four 4-byte parts per row (low nibbles elements `4m..4m+4`,
/// high nibbles `16+4m..`).
#[inline(always)]
pub(crate) unsafe fn nibble_codes(q: *const u8) -> [__m512i; 8] {
    let nibble = _mm512_set1_epi8(0x0F);
    let mut codes = [_mm512_setzero_si512(); 8];
    for m in 0..4 {
        let v = _mm512_loadu_si512(q.add(64 * m) as *const _);
        codes[m] = _mm512_and_si512(v, nibble);
        codes[m + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
    }
    codes
}

pub(crate) struct Q40;
pub(crate) struct Q41;

impl Interleaved for Q40 {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_Q4_0;
    const OFFSET: i32 = 8;
    #[inline(always)]
    unsafe fn codes(blk: *const u8) -> [__m512i; 8] {
        nibble_codes(blk.add(32))
    }
}

impl Interleaved for Q41 {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_Q4_1;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    const AB: usize = 36;
    const AQ: usize = 4;
    #[inline(always)]
    unsafe fn codes(blk: *const u8) -> [__m512i; 8] {
        nibble_codes(blk.add(64))
    }
}

pub(crate) struct Q50;
pub(crate) struct Q80;
pub(crate) struct Iq4Nl;

/// Sixteen 4-bit-indexed `levels` plus 128, as unsigned bytes, in every 128-bit lane: what a
/// `vpshufb` of index nibbles turns into the kernels' unsigned codes.
#[inline(always)]
unsafe fn code_table(levels: &[i8; 16]) -> __m512i {
    let mut t = [0u8; 16];
    for (c, &l) in t.iter_mut().zip(levels.iter()) {
        *c = (i32::from(l) + 128) as u8;
    }
    _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// The IQ4 levels' [`code_table`].
#[inline(always)]
pub(crate) unsafe fn iq4_code_table() -> __m512i {
    code_table(&crate::dequant::IQ4_LEVELS)
}

/// IQ4 codes (levels plus 128) of a sub-block's index nibbles at `q`, laid out as
/// [`nibble_codes`] reads Q4_0's.
#[inline(always)]
pub(crate) unsafe fn iq4_codes(q: *const u8, table: __m512i) -> [__m512i; 8] {
    nibble_codes(q).map(|idx| _mm512_shuffle_epi8(table, idx))
}

impl Interleaved for Iq4Nl {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_Q4_0;
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn codes(blk: *const u8) -> [__m512i; 8] {
        iq4_codes(blk.add(32), iq4_code_table())
    }
}

pub(crate) struct Mxfp4;

impl Interleaved for Mxfp4 {
    const GROUP_BLOCK: usize = crate::layout::GROUP_BLOCK_MXFP4;
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn codes(blk: *const u8) -> [__m512i; 8] {
        // The doubled FP4 levels; the halved E8M0 scale makes up the doubling.
        iq4_codes(blk.add(16), code_table(&crate::dequant::FP4_LEVELS))
    }
    /// Sixteen E8M0 bytes made `2^(e - 128)` from their bits, as
    /// [`crate::dequant::e8m0_half`]: `(e - 1) << 23`, or for `e < 2` (subnormal)
    /// `0x0020_0000 << e`.
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> __m512 {
        let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk as *const __m128i));
        let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
        let subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
        let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal))
    }
}

impl Interleaved for Q50 {
    const GROUP_BLOCK: usize = GROUP_BLOCK_Q5_0;
    const OFFSET: i32 = 16;
    /// The 5-bit codes: Q4_0's nibbles, each with its high bit from the rearranged words (one
    /// byte test per group `k` of bit `k`).
    #[inline(always)]
    unsafe fn codes(blk: *const u8) -> [__m512i; 8] {
        let mut codes = nibble_codes(blk.add(96));
        add_bit_plane(&mut codes, blk.add(32), 16);
        codes
    }
}

/// Adds `value` to the codes whose bit is set in the 64-byte plane at `plane` (rows' words
/// rearranged as `layout.rs`'s `spread_high_bits` does: bit `k` of each byte belongs to
/// register `k`): one byte test and one masked add per register.
#[inline(always)]
pub(crate) unsafe fn add_bit_plane(codes: &mut [__m512i; 8], plane: *const u8, value: i8) {
    let (h, add) = (
        _mm512_loadu_si512(plane as *const _),
        _mm512_set1_epi8(value),
    );
    for (k, code) in codes.iter_mut().enumerate() {
        let set = _mm512_test_epi8_mask(h, _mm512_set1_epi8(1 << k));
        *code = _mm512_mask_add_epi8(*code, set, *code, add);
    }
}

impl Interleaved for Q80 {
    const GROUP_BLOCK: usize = GROUP_BLOCK_Q8_0;
    const OFFSET: i32 = 128;
    /// The codes are stored as they are used (each quant's sign bit flipped at repacking).
    #[inline(always)]
    unsafe fn codes(blk: *const u8) -> [__m512i; 8] {
        let mut codes = [_mm512_setzero_si512(); 8];
        for (k, code) in codes.iter_mut().enumerate() {
            *code = _mm512_loadu_si512(blk.add(32 + 64 * k) as *const _);
        }
        codes
    }
}

/// `out[t * ldo + r] = dot(row r, act row t)` for `r < nr` (a multiple of 16: whole groups,
/// `16 · ldw` bytes apart, starting at `w`), `t < nt` (Q8_0 activation rows `lda` bytes apart),
/// over `n` elements, in the canonical order above.
#[inline(always)]
unsafe fn gemm<K: Interleaved>(c: &GemmCall) {
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
    let nb = n / 32;
    if nb == 0 {
        // No blocks: every sum is zero (and the accumulators below are never written).
        for t in 0..nt {
            std::ptr::write_bytes(out.add(t * ldo), 0, nr);
        }
        return;
    }
    // Take the buffer out of the thread-local rather than working inside a `with` closure: a
    // closure would not inherit this function's target features.
    let mut tables = ACT_TABLES.with(|cell| cell.take());
    // Uninitialised until a group's first block writes it: zeroing it per group (a
    // `memset` the loads right after cannot forward from) cost 3% of SmolLM2's prompt.
    let mut acc = [std::mem::MaybeUninit::<__m512>::uninit(); TOKENS];
    // Byte offsets of sixteen consecutive blocks' headers in a token's activation row.
    let header_at = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(K::AB as i32),
    );
    let mut t0 = 0;
    while t0 < nt {
        let tn = TOKENS.min(nt - t0);
        if tables.len() < 3 * nb * tn {
            // Large steps: the block count varies by product.
            let len = (nb * tn).next_power_of_two().max(MIN_ACT_BLOCKS);
            tables.resize(3 * len, 0.0);
        }
        let (ds, rest) = tables.split_at_mut(nb * tn);
        let (ss, starts) = rest.split_at_mut(nb * tn);
        let (pd, ps, pst) = (
            ds.as_mut_ptr(),
            ss.as_mut_ptr(),
            starts.as_mut_ptr() as *mut i32,
        );
        for t in 0..tn {
            let y = a.add((t0 + t) * lda);
            // Sixteen blocks' headers at a time (one gather; the f16 `d`, and Q8_1's `s`, in
            // the halves of each word), widened in one conversion each: a task's rows prepare
            // every token's blocks, and one block at a time this cost 9% of an 80-row task
            // (SmolLM2's attention output and down products).
            for b in (0..nb).step_by(16) {
                let k = (nb - b).min(16);
                let lanes: __mmask16 = if k == 16 { !0 } else { (1 << k) - 1 };
                let words = _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    lanes,
                    header_at,
                    y.add(b * K::AB) as *const i32,
                );
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
                _mm512_mask_storeu_ps(pd.add(t * nb + b), lanes, d);
                if K::HAS_MIN {
                    // The block's `s` field: `Σ y` times the unrounded scale, in f16. Closer to
                    // the activations' own sum than `dy · Σ y` with the rounded `dy` (which
                    // measured twice the KL on SmolLM2).
                    let high = _mm512_srli_epi32::<16>(words);
                    let s = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(high));
                    _mm512_mask_storeu_ps(ps.add(t * nb + b), lanes, s);
                }
            }
            if K::OFFSET != 0 {
                for b in 0..nb {
                    *pst.add(t * nb + b) = -K::OFFSET * quant_sum(y.add(b * K::AB + K::AQ));
                }
            }
        }
        for g in 0..nr / GROUP_ROWS {
            let wg = w.add(g * GROUP_ROWS * ldw);
            for b in 0..nb {
                let blk = wg.add(b * K::GROUP_BLOCK);
                if tn <= PREFETCH_TOKENS {
                    // Few tokens: the block loop streams from memory faster than the hardware
                    // prefetcher alone fetches.
                    prefetch_ahead(blk, PREFETCH_AHEAD * K::GROUP_BLOCK, K::GROUP_BLOCK);
                }
                let dw = K::scales(blk);
                let codes = K::codes(blk);
                let mw = if K::HAS_MIN {
                    _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i))
                } else {
                    _mm512_setzero_ps()
                };
                let y = a.add(t0 * lda + b * K::AB + K::AQ);
                for (t, v) in acc.iter_mut().enumerate().take(tn) {
                    // The first block's sums start from zero, as the canonical order says.
                    let prev = if b == 0 {
                        _mm512_setzero_ps()
                    } else {
                        v.assume_init()
                    };
                    let (yt, at) = (y.add(t * lda), t * nb + b);
                    let start = if K::OFFSET == 0 { 0 } else { *pst.add(at) };
                    // Two chains of four: half the latency a token's sum waits on (exact
                    // integer sums, so the same bits in either grouping).
                    let mut halves = [_mm512_set1_epi32(start), _mm512_setzero_si512()];
                    for (k, code) in codes.iter().enumerate() {
                        let group = (yt.add(4 * k) as *const i32).read_unaligned();
                        let h = &mut halves[k / 4];
                        *h = _mm512_dpbusd_epi32(*h, *code, _mm512_set1_epi32(group));
                    }
                    let s = _mm512_add_epi32(halves[0], halves[1]);
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*pd.add(at)));
                    let mut sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, prev);
                    if K::HAS_MIN {
                        sum = _mm512_fmadd_ps(mw, _mm512_set1_ps(*ps.add(at)), sum);
                    }
                    v.write(sum);
                }
            }
            for (t, v) in acc.iter().enumerate().take(tn) {
                // Written by block 0 (`nb` ≥ 1).
                _mm512_storeu_ps(out.add((t0 + t) * ldo + g * GROUP_ROWS), v.assume_init());
            }
        }
        t0 += tn;
    }
    ACT_TABLES.with(|cell| cell.replace(tables));
}

rows_entry!(gemm_q4_0_rows, gemm::<Q40>, "Q4_0");
rows_entry!(gemm_q4_1_rows, gemm::<Q41>, "Q4_1");
rows_entry!(gemm_q5_0_rows, gemm::<Q50>, "Q5_0");
rows_entry!(gemm_q8_0_rows, gemm::<Q80>, "Q8_0");
rows_entry!(gemm_iq4_nl_rows, gemm::<Iq4Nl>, "IQ4_NL");
rows_entry!(gemm_mxfp4_rows, gemm::<Mxfp4>, "MXFP4");

#[cfg(test)]
mod tests {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    unsafe fn mxfp4_scales(e: &[u8; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), Mxfp4::scales(e.as_ptr()));
        out
    }

    /// Every E8M0 byte, the subnormal 0 and 1 and the largest 255 among them, becomes the
    /// scale bits the scalar dequantization gives.
    #[test]
    #[cfg_attr(
        not(rill_vnni_host),
        ignore = "needs a CPU with AVX512-VNNI (Zen 4, Ice Lake or later); this one was built without"
    )]
    fn mxfp4_group_scales_equal_the_scalar_conversion_for_every_exponent() {
        assert!(crate::cpu::vnni_in_hardware());
        for first in (0..256).step_by(16) {
            let e: [u8; 16] = std::array::from_fn(|j| (first + j) as u8);
            let got = unsafe { mxfp4_scales(&e) };
            for (j, g) in got.iter().enumerate() {
                let want = crate::dequant::e8m0_half(e[j]);
                assert_eq!(g.to_bits(), want.to_bits(), "exponent byte {}", e[j]);
            }
        }
    }
}
