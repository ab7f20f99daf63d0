//! Prompt tiles on Intel AMX (the `tdpbssd` tile multiply) for the super-block types in the
//! [row-interleaved](crate::WeightLayout::RowInterleaved) layout: IQ4_XS, Q4_K, Q5_K and Q6_K
//! (its nibble layout), with the blocks' own bits.
//!
//! One `tdpbssd` multiplies a 16 × 64 tile of signed bytes by a 64 × 16 one into sixteen by
//! sixteen 32-bit sums: sixteen times the work of a 512-bit `vpdpbusd`, in about sixteen cycles.
//! Its inputs are bytes, but the sums these types need weigh every sub-block by its own scale
//! (`isum = Σ_j scale_j · Σ q · y`, see `interleaved_super.rs`). So each call unpacks a group's
//! super-block once for all its tokens into the products `w = scale_j · q` (at most 4096 in
//! magnitude: 32 · 127 for IQ4_XS, 63 · 31 for Q5_K, 128 · 32 for Q6_K), split exactly as
//! `w = 128 · hi + lo` with `lo` in `0..128`: two byte planes, each laid out as the tile
//! multiply reads its second operand (per four elements, the sixteen rows' bytes side by side,
//! which is how the layout already holds the codes). Then, per super-block,
//! `isum = 128 · (y · hi) + (y · lo)`, exact in i32 (`|y · hi| ≤ 256 · 128 · 32`), is the
//! integer the scalar twin computes, and the f32 steps after it are the 512-bit tile's.
//!
//! The tokens are the first operand: each call copies its tokens' Q8_K quants once into
//! aligned tiles, sixteen tokens by 64 quants (read in place, a 292-byte block put every tile
//! row across two cache lines). A result tile has a token per row and the group's sixteen rows
//! across, the outputs' own order. Two token tiles meet the two planes of one row group at a
//! time (four result tiles, two token tiles, two weight tiles: AMX's eight). A call's tokens
//! past its last whole tile go to the 512-bit tile, which gives the same bits.
//!
//! Units of (super-block, group) run super-blocks outermost, so a super-block's token tiles stay
//! in L1 while every group meets them, and are software-pipelined: after each chunk's four
//! multiplies the vector units unpack a slice of the next unit and finish a slice of the
//! previous unit's f32 steps (the tile registers are not renamed, so vector work between two
//! tile stores would leave the tile unit idle).
//!
//! # Safety
//! Every function requires what [`crate::cpu::has_amx`] checked (AVX512-F/BW/VNNI/VL, AMX-TILE
//! and AMX-INT8, and the kernel's permission for the tile data) and pointers valid for the
//! groups, activation rows and outputs they are told to touch.

use crate::dot::GemmCall;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::layout::ROW_GROUP as GROUP_ROWS;
use crate::quant_types::BlockQ8K;
use crate::QK_K;

use super::interleaved_q32::iq4_code_table;
use super::interleaved_super::{self, Iq4Xs, SuperBlocks, Q4K, Q5K, Q6K};
use super::GemmKernel;

/// Tokens per tile (a result tile's rows).
const TILE_TOKENS: usize = 16;
/// Bytes of one tile: 16 rows of 64.
const TILE_BYTES: usize = 1024;
/// Bytes of one super-block's unpacked planes: four 64-element chunks, each a `hi` and a `lo`
/// tile.
const PLANES_BYTES: usize = 4 * 2 * TILE_BYTES;

/// The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

/// One token's super-block scale and its sub-blocks' sums in pairs (for the mins), as the
/// 512-bit tile's epilogue reads them.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct TokenBlock {
    d: f32,
    sum_pairs: [i32; 4],
}

/// Per-thread scratch: the planes of one group super-block, the result tiles, the tokens'
/// quants as tiles, their super-block sums and the f32 accumulators. The tiles' buffers are
/// vectors of 512-bit registers so that every tile row is one aligned cache line (a Q8_K
/// block is 292 bytes: read in place, each row of a token tile straddled two lines).
struct Scratch {
    planes: Vec<__m512i>,
    tiles: Vec<__m512i>,
    quants: Vec<__m512i>,
    tokens: Vec<TokenBlock>,
    acc: Vec<__m512>,
}

thread_local! {
    static SCRATCH: RefCell<Option<Box<Scratch>>> = const { RefCell::new(None) };
}

/// Configures this thread's tiles (`ldtilecfg`).
#[inline(always)]
unsafe fn load_config() {
    asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
}

/// Returns the tiles to their initial state, so the thread no longer carries their 8 KiB.
#[inline(always)]
unsafe fn release_tiles() {
    asm!("tilerelease", options(nostack, nomem));
}

/// Zeroes the four result tiles.
#[inline(always)]
unsafe fn zero_results() {
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        options(nostack, nomem)
    );
}

/// One 64-element chunk: token tiles at `a0` (and `a1` when `PAIR`), rows `lda` bytes apart,
/// times the `hi` and `lo` planes at `b` (`lo` 1 KiB after `hi`), into tmm0/tmm1 (first
/// tokens' `hi`/`lo`) and tmm2/tmm3 (second tokens').
#[inline(always)]
unsafe fn chunk<const PAIR: bool>(a0: *const u8, a1: *const u8, lda: usize, b: *const u8) {
    let lo = b.add(TILE_BYTES);
    if PAIR {
        asm!(
            "tileloadd tmm4, [{a0} + {lda}]",
            "tileloadd tmm6, [{hi} + {s}]",
            "tileloadd tmm7, [{lo} + {s}]",
            "tdpbssd tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a1} + {lda}]",
            "tdpbssd tmm1, tmm4, tmm7",
            "tdpbssd tmm2, tmm5, tmm6",
            "tdpbssd tmm3, tmm5, tmm7",
            a0 = in(reg) a0,
            a1 = in(reg) a1,
            lda = in(reg) lda,
            hi = in(reg) b,
            lo = in(reg) lo,
            s = in(reg) 64usize,
            options(nostack, readonly)
        );
    } else {
        asm!(
            "tileloadd tmm4, [{a0} + {lda}]",
            "tileloadd tmm6, [{hi} + {s}]",
            "tileloadd tmm7, [{lo} + {s}]",
            "tdpbssd tmm0, tmm4, tmm6",
            "tdpbssd tmm1, tmm4, tmm7",
            a0 = in(reg) a0,
            lda = in(reg) lda,
            hi = in(reg) b,
            lo = in(reg) lo,
            s = in(reg) 64usize,
            options(nostack, readonly)
        );
    }
}

/// Stores the result tiles (tmm0-tmm1, and tmm2-tmm3 when `PAIR`) 1 KiB apart at `dst`.
#[inline(always)]
unsafe fn store_results<const PAIR: bool>(dst: *mut i32) {
    let d = dst as *mut u8;
    if PAIR {
        asm!(
            "tilestored [{t0} + {s}], tmm0",
            "tilestored [{t1} + {s}], tmm1",
            "tilestored [{t2} + {s}], tmm2",
            "tilestored [{t3} + {s}], tmm3",
            t0 = in(reg) d,
            t1 = in(reg) d.add(TILE_BYTES),
            t2 = in(reg) d.add(2 * TILE_BYTES),
            t3 = in(reg) d.add(3 * TILE_BYTES),
            s = in(reg) 64usize,
            options(nostack)
        );
    } else {
        asm!(
            "tilestored [{t0} + {s}], tmm0",
            "tilestored [{t1} + {s}], tmm1",
            t0 = in(reg) d,
            t1 = in(reg) d.add(TILE_BYTES),
            s = in(reg) 64usize,
            options(nostack)
        );
    }
}

/// Unpacks sub-blocks `js` of super-block `blk` of a group into `planes`: chunk `c`'s `hi`
/// tile at `c · 2 KiB`, its `lo` tile 1 KiB after, row `m` of a tile holding elements
/// `4m..4m + 4` of the chunk for the sixteen rows. The codes are taken as 16-bit lanes, their
/// even and odd bytes multiplied apart (a row's four bytes share its scale), so no byte is
/// widened or narrowed across lanes.
#[inline(always)]
unsafe fn unpack<K: SuperBlocks>(
    blk: *const u8,
    js: std::ops::Range<usize>,
    table: __m512i,
    planes: *mut u8,
) {
    let low_byte = _mm512_set1_epi16(0x00FF);
    let low7 = _mm512_set1_epi8(0x7F);
    let offset = _mm512_set1_epi16(K::OFFSET as i16);
    let low_half = _mm512_set1_epi32(0xFFFF);
    // Odd bytes from the second operand.
    let odd: __mmask64 = 0xAAAA_AAAA_AAAA_AAAA;
    for j in js {
        let codes = K::codes(blk, j, table);
        let scales = K::scales(blk, j);
        // Row r's scale in both 16-bit halves of lane r (the scales fit 16 bits).
        let s0 = _mm512_or_si512(
            _mm512_and_si512(scales[0], low_half),
            _mm512_slli_epi32::<16>(scales[0]),
        );
        let s1 = if K::HALVES {
            _mm512_or_si512(
                _mm512_and_si512(scales[1], low_half),
                _mm512_slli_epi32::<16>(scales[1]),
            )
        } else {
            s0
        };
        let base = planes.add((j / 2) * 2 * TILE_BYTES + (j % 2) * 8 * 64);
        for (k, &code) in codes.iter().enumerate() {
            let scale = if K::HALVES && k >= 4 { s1 } else { s0 };
            let mut even = _mm512_and_si512(code, low_byte);
            let mut odd_codes = _mm512_srli_epi16::<8>(code);
            if K::OFFSET != 0 {
                even = _mm512_sub_epi16(even, offset);
                odd_codes = _mm512_sub_epi16(odd_codes, offset);
            }
            let w_even = _mm512_mullo_epi16(even, scale);
            let w_odd = _mm512_mullo_epi16(odd_codes, scale);
            let hi = _mm512_mask_blend_epi8(
                odd,
                _mm512_srai_epi16::<7>(w_even),
                _mm512_slli_epi16::<8>(_mm512_srai_epi16::<7>(w_odd)),
            );
            let lo = _mm512_and_si512(
                _mm512_mask_blend_epi8(odd, w_even, _mm512_slli_epi16::<8>(w_odd)),
                low7,
            );
            _mm512_store_si512(base.add(64 * k) as *mut _, hi);
            _mm512_store_si512(base.add(TILE_BYTES + 64 * k) as *mut _, lo);
        }
    }
}

/// What the epilogue of one (super-block, group) unit needs once its tiles are stored: the
/// group's `d` (and `dmin`, mins), where its tokens' blocks and accumulators are.
#[derive(Clone, Copy)]
struct Unit {
    dw: __m512,
    dmin: __m512,
    mins: [__m512i; 4],
    tokens: *const TokenBlock,
    acc: *mut __m512,
    results: *const i32,
}

impl Unit {
    #[inline(always)]
    unsafe fn new<K: SuperBlocks>(
        blk: *const u8,
        tokens: *const TokenBlock,
        acc: *mut __m512,
        results: *const i32,
    ) -> Unit {
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
        let (dmin, mins) = if K::HAS_MIN {
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i));
            (dmin, K::min_pairs(blk))
        } else {
            (_mm512_setzero_ps(), [_mm512_setzero_si512(); 4])
        };
        Unit {
            dw,
            dmin,
            mins,
            tokens,
            acc,
            results,
        }
    }

    /// Adds tokens `ts`' terms of this unit to their accumulators: the 512-bit tile's f32 steps
    /// on `isum = 128 · hi + lo`. Token `t`'s tiles are at `(t / 32) · 4 KiB` (its pair's),
    /// `hi` then `lo` for the pair's first sixteen tokens, then the second's.
    #[inline(always)]
    unsafe fn epilogue<K: SuperBlocks>(&self, ts: std::ops::Range<usize>) {
        for t in ts {
            let hi = self.results.add(
                (t / (2 * TILE_TOKENS)) * TILE_BYTES
                    + ((t / TILE_TOKENS) % 2) * TILE_BYTES / 2
                    + (t % TILE_TOKENS) * 16,
            );
            let lo = hi.add(TILE_BYTES / 4);
            let isum = _mm512_add_epi32(
                _mm512_slli_epi32::<7>(_mm512_load_si512(hi as *const _)),
                _mm512_load_si512(lo as *const _),
            );
            let act = &*self.tokens.add(t);
            let dy = _mm512_set1_ps(act.d);
            let mut term = _mm512_mul_ps(_mm512_mul_ps(dy, self.dw), _mm512_cvtepi32_ps(isum));
            if K::HAS_MIN {
                let mut msum = _mm512_setzero_si512();
                for (m, &p) in self.mins.iter().zip(&act.sum_pairs) {
                    msum = _mm512_dpwssd_epi32(msum, *m, _mm512_set1_epi32(p));
                }
                let min_term =
                    _mm512_mul_ps(_mm512_mul_ps(dy, self.dmin), _mm512_cvtepi32_ps(msum));
                term = _mm512_sub_ps(term, min_term);
            }
            let acc = self.acc.add(t);
            *acc = _mm512_add_ps(*acc, term);
        }
    }
}

/// `out[t * ldo + r] = dot(row r, act row t)` for rows of `K` in whole groups of 16 and Q8_K
/// activation rows `lda` bytes apart, over `n` elements: the 512-bit tile's bits.
#[inline(always)]
unsafe fn gemm<K: AmxTile>(c: &GemmCall) {
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
    let tiled = nt - nt % TILE_TOKENS;
    if tiled < nt {
        // The tokens past the last whole tile: the 512-bit tile, bit for bit the same.
        (K::TAIL)(&GemmCall {
            a: a.add(tiled * lda),
            nt: nt - tiled,
            out: out.add(tiled * ldo),
            ..*c
        });
    }
    if tiled == 0 {
        return;
    }
    let nsb = n / QK_K;
    let table = iq4_code_table();
    // Taken out of the thread-local for the call (and put back at its end).
    let mut scratch = SCRATCH
        .with(|cell| cell.borrow_mut().take())
        .unwrap_or_else(|| {
            Box::new(Scratch {
                planes: vec![_mm512_setzero_si512(); 2 * PLANES_BYTES / 64],
                tiles: Vec::new(),
                quants: Vec::new(),
                tokens: Vec::new(),
                acc: Vec::new(),
            })
        });
    if scratch.tokens.len() < nsb * tiled {
        scratch.tokens.resize(nsb * tiled, TokenBlock::default());
    }
    if scratch.acc.len() < nr / GROUP_ROWS * tiled {
        scratch
            .acc
            .resize(nr / GROUP_ROWS * tiled, _mm512_setzero_ps());
    }
    // Two units' result tiles: four per pair of token tiles.
    let tiles_len = 2 * tiled.div_ceil(2 * TILE_TOKENS) * 4 * TILE_BYTES / 64;
    if scratch.tiles.len() < tiles_len {
        scratch.tiles.resize(tiles_len, _mm512_setzero_si512());
    }
    // Super-block `sb`'s quants of token `t`: four 64-byte rows, one per chunk, in its tile's
    // chunk-major block of four tiles.
    let quants_len = nsb * tiled * 4;
    if scratch.quants.len() < quants_len {
        scratch.quants.resize(quants_len, _mm512_setzero_si512());
    }
    let Scratch {
        planes,
        tiles,
        quants,
        tokens,
        acc,
    } = &mut *scratch;
    let quants = quants.as_mut_ptr();
    let planes = planes.as_mut_ptr() as *mut u8;
    let tiles = tiles.as_mut_ptr() as *mut i32;
    let ones = _mm256_set1_epi16(1);
    for t in 0..tiled {
        let y = a.add(t * lda);
        for sb in 0..nsb {
            let yb = y.add(sb * BlockQ8K::BYTES);
            let tile = quants.add((sb * tiled + t - t % TILE_TOKENS) * 4 + t % TILE_TOKENS);
            for c in 0..4 {
                let q = _mm512_loadu_si512(yb.add(BlockQ8K::QS + 64 * c) as *const _);
                _mm512_store_si512(tile.add(c * TILE_TOKENS) as *mut _, q);
            }
            let mut block = TokenBlock {
                d: (yb.add(BlockQ8K::D) as *const f32).read_unaligned(),
                sum_pairs: [0; 4],
            };
            if K::HAS_MIN {
                // Sub-block j's sum (its two halves' sums, `|Σ y| ≤ 32 · 128`) as i16 j.
                let halves = _mm256_loadu_si256(yb.add(BlockQ8K::BSUMS) as *const __m256i);
                let sums = _mm256_madd_epi16(halves, ones);
                let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packs_epi32(sums, sums));
                _mm_storeu_si128(
                    block.sum_pairs.as_mut_ptr() as *mut __m128i,
                    _mm256_castsi256_si128(packed),
                );
            }
            tokens[sb * tiled + t] = block;
        }
    }
    let groups = nr / GROUP_ROWS;
    for v in acc.iter_mut().take(groups * tiled) {
        *v = _mm512_setzero_ps();
    }
    load_config();
    // Units (super-block, group), super-blocks outermost: a super-block's token tiles stay in
    // L1 while every group meets them (read from L2 for each group, the tile loads were most
    // of the time). Software-pipelined: while unit u's tiles multiply, the vector units unpack
    // unit u + 1's planes and finish unit u - 1's sums, a slice after each chunk, so that
    // neither waits for the other (the tiles are not renamed: a stretch of vector work between
    // two tile stores left the tile unit idle).
    let units = nsb * groups;
    let block_of =
        |u: usize| w.add((u % groups) * GROUP_ROWS * ldw + (u / groups) * K::GROUP_BLOCK);
    let pairs = tiled.div_ceil(2 * TILE_TOKENS);
    let steps = 4 * pairs;
    unpack::<K>(block_of(0), 0..8, table, planes);
    let mut previous: Option<Unit> = None;
    for u in 0..units {
        let cur_planes = planes.add((u % 2) * PLANES_BYTES);
        let next_planes = planes.add(((u + 1) % 2) * PLANES_BYTES);
        let results = tiles.add((u % 2) * pairs * 4 * TILE_BYTES / 4);
        let next_blk = (u + 1 < units).then(|| block_of(u + 1));
        if let Some(next) = next_blk {
            // The next unit's super-block, from memory while this one's tiles multiply.
            let mut at = 0;
            while at < K::GROUP_BLOCK {
                _mm_prefetch::<_MM_HINT_T0>(next.add(at) as *const i8);
                at += 64;
            }
        }
        let ya = quants.add((u / groups) * tiled * 4) as *const u8;
        let mut step = 0;
        for p in 0..pairs {
            let t0 = 2 * TILE_TOKENS * p;
            let pair = tiled - t0 >= 2 * TILE_TOKENS;
            let a0 = ya.add(t0 * 4 * 64);
            let a1 = a0.add(4 * TILE_BYTES);
            zero_results();
            for c in 0..4 {
                let b = cur_planes.add(c * 2 * TILE_BYTES);
                if pair {
                    chunk::<true>(a0.add(c * TILE_BYTES), a1.add(c * TILE_BYTES), 64, b);
                } else {
                    chunk::<false>(a0.add(c * TILE_BYTES), a0, 64, b);
                }
                // This step's slice of the vector work.
                if let Some(next) = next_blk {
                    unpack::<K>(
                        next,
                        step * 8 / steps..(step + 1) * 8 / steps,
                        table,
                        next_planes,
                    );
                }
                if let Some(prev) = &previous {
                    prev.epilogue::<K>(step * tiled / steps..(step + 1) * tiled / steps);
                }
                step += 1;
            }
            let dst = results.add(p * TILE_BYTES);
            if pair {
                store_results::<true>(dst);
            } else {
                store_results::<false>(dst);
            }
        }
        let (sb, g) = (u / groups, u % groups);
        previous = Some(Unit::new::<K>(
            block_of(u),
            tokens.as_ptr().add(sb * tiled),
            acc.as_mut_ptr().add(g * tiled),
            results,
        ));
    }
    if let Some(prev) = &previous {
        prev.epilogue::<K>(0..tiled);
    }
    // Token by token: each token's outputs are one run of memory (group by group, the
    // stores were a page apart).
    for t in 0..tiled {
        for g in 0..groups {
            _mm512_storeu_ps(out.add(t * ldo + g * GROUP_ROWS), acc[g * tiled + t]);
        }
    }
    release_tiles();
    SCRATCH.with(|cell| *cell.borrow_mut() = Some(scratch));
}

/// A super-block type's AMX tile: the 512-bit tile that takes its tokens past the last whole
/// tile of sixteen.
trait AmxTile: SuperBlocks {
    const TAIL: GemmKernel;
}

impl AmxTile for Iq4Xs {
    const TAIL: GemmKernel = interleaved_super::gemm_iq4_xs_rows;
}
impl AmxTile for Q4K {
    const TAIL: GemmKernel = interleaved_super::gemm_q4_k_rows_i8;
}
impl AmxTile for Q5K {
    const TAIL: GemmKernel = interleaved_super::gemm_q5_k_rows;
}
impl AmxTile for Q6K {
    const TAIL: GemmKernel = interleaved_super::gemm_q6_k_nibbles;
}

gemm_entry!(
    /// IQ4_XS rows in the row-interleaved layout (`nr` a multiple of 16).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_iq4_xs_rows_amx,
    gemm::<Iq4Xs>
);
gemm_entry!(
    /// Q4_K rows in the row-interleaved layout (`nr` a multiple of 16), 8-bit activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_q4_k_rows_i8_amx,
    gemm::<Q4K>
);
gemm_entry!(
    /// Q5_K rows in the row-interleaved layout (`nr` a multiple of 16), 8-bit activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_q5_k_rows_amx,
    gemm::<Q5K>
);
gemm_entry!(
    /// Q6_K rows in the row-interleaved nibble layout (`nr` a multiple of 16), 8-bit
    /// activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub gemm_q6_k_nibbles_amx,
    gemm::<Q6K>
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dot::test_data::{q8_k_rows, XorShift};
    use crate::{QuantType, WeightLayout};

    /// Each AMX tile gives the scalar twin's bits (on the file's rows) for every (row, token),
    /// across token counts that fill one tile, pairs of tiles, an odd tile after pairs and
    /// partial tiles (the 512-bit tile's), on random blocks and on blocks whose scales and
    /// codes are all at their extremes (the split products' limits).
    #[test]
    #[cfg_attr(
        not(rill_amx_host),
        ignore = "needs a CPU with AMX (Intel Sapphire Rapids or later); this one was built without"
    )]
    fn amx_tiles_equal_the_scalar_twin_bit_for_bit() {
        assert!(
            crate::cpu::amx_in_hardware(),
            "built on a CPU with AMX, but this one cannot run the AMX kernels (or Linux refused \
             the tile data)"
        );
        let cases: [(QuantType, GemmKernel, WeightLayout); 4] = [
            (
                QuantType::IQ4_XS,
                gemm_iq4_xs_rows_amx,
                WeightLayout::RowInterleaved,
            ),
            (
                QuantType::Q4_K,
                gemm_q4_k_rows_i8_amx,
                WeightLayout::RowInterleaved,
            ),
            (
                QuantType::Q5_K,
                gemm_q5_k_rows_amx,
                WeightLayout::RowInterleaved,
            ),
            (
                QuantType::Q6_K,
                gemm_q6_k_nibbles_amx,
                WeightLayout::RowInterleavedNibbles,
            ),
        ];
        let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
        let (n, rows, max_tokens) = (3 * QK_K, 32, 83);
        let ab = QuantType::Q8_K.row_bytes(n).unwrap();
        // Token 5 is all at one magnitude, so its quants sit at ±127.
        let a = q8_k_rows(n, max_tokens, |t, i| match t {
            5 if i % 3 == 0 => -1.0,
            5 => 1.0,
            _ => rng.unit(),
        });
        for (ty, kernel, layout) in cases {
            let rb = ty.row_bytes(n).unwrap();
            let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
            // Finite f16 scales (and mins) near 1/128; rows 16-31 at the extremes: every
            // byte 0xFF but those scales (largest codes and 6-bit scales; Q6_K below).
            let (d_at, dmin_at) = match ty {
                QuantType::Q6_K => (208, None),
                QuantType::IQ4_XS => (0, None),
                _ => (0, Some(2)),
            };
            for (b, blk) in w.chunks_exact_mut(ty.block_bytes()).enumerate() {
                if b >= 16 * n / QK_K {
                    blk.fill(0xFF);
                    if ty == QuantType::Q6_K {
                        // Signed scales at -128, and codes at 0 (q = -32): |w| = 4096.
                        blk[192..208].fill(0x80);
                        blk[..192].fill(0);
                    }
                }
                blk[d_at..d_at + 2].copy_from_slice(&0x2000u16.to_le_bytes());
                if let Some(m) = dmin_at {
                    blk[m..m + 2].copy_from_slice(&0x1C00u16.to_le_bytes());
                }
            }
            let prb = layout.row_bytes(ty, n).unwrap();
            let mut packed = vec![0u8; rows * prb];
            match layout {
                WeightLayout::RowInterleavedNibbles => {
                    crate::layout::repack_rows_interleaved_nibbles(ty, n, &w, &mut packed)
                }
                _ => crate::layout::repack_rows_interleaved(ty, n, &w, &mut packed),
            }
            .unwrap();
            let twin = super::super::scalar_kernel(ty).unwrap();
            for nt in [16usize, 32, 48, 83] {
                let mut out = vec![f32::NAN; nt * rows];
                // SAFETY: has_amx checked the features; the pointers span the groups, tokens
                // and outputs.
                unsafe {
                    kernel(&GemmCall {
                        w: packed.as_ptr(),
                        ldw: prb,
                        a: a.as_ptr(),
                        lda: ab,
                        n,
                        nr: rows,
                        nt,
                        out: out.as_mut_ptr(),
                        ldo: rows,
                    })
                };
                for t in 0..nt {
                    for r in 0..rows {
                        let (row, act) = (&w[r * rb..(r + 1) * rb], &a[t * ab..(t + 1) * ab]);
                        // SAFETY: lengths as the row and activation formats give them.
                        let expect = unsafe { twin(row, act, n) };
                        let got = out[t * rows + r];
                        assert!(
                            got.to_bits() == expect.to_bits() && got.is_finite(),
                            "{ty} nt {nt} token {t} row {r}: {got} against {expect}"
                        );
                    }
                }
            }
        }
    }
}
