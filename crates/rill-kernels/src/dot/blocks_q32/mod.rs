//! Register-tiled AVX2 kernels for the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! and IQ4_NL and MXFP4, whose nibbles index a table of levels),
//! computing an R × C tile of outputs (R weight rows × C activation rows) per call, and the
//! single-pair [`vec_dot`](crate::vec_dot) kernels as the 1 × 1 case of the same code.
//!
//! # Canonical arithmetic (what makes the results batch invariant)
//!
//! Every (row, token) pair is computed with exactly the same sequence of operations whatever the
//! tile shape, so its value does not depend on which tile it lands in, on the batch size or on
//! the thread split:
//!
//! * per block `b`, the 32 integer products are summed into 8 i32 lanes (lane `l` = elements
//!   `4l..4l+4`, via `maddubs` + `madd`, or one `vpdpbusd` where the CPU has AVX512-VNNI: both
//!   exact, since no pair sum of these formats reaches the i16 limit) and converted to f32;
//! * blocks are taken in groups of 8: the group's scale products `d_b = dx_b · dy_b` are formed
//!   lane-wise in f32, then each block does `acc = fma(d_b, q_b, acc)` into one 8-lane
//!   accumulator per pair, in block order;
//! * for the types with a min term, lane `k` of a second accumulator takes
//!   `fma(mx_b, sy_b, ·)` for the blocks `b ≡ k (mod 8)`, in order: Q4_1/Q5_1's `m` and Q8_1's
//!   `s`; for Q5_0, whose unsigned 5-bit codes go into the integer sums as they are,
//!   `mx_b = -16 · dx_b` and `sy_b = dy_b · Σ y` (the activation block's exact quant sum);
//! * the result is `hsum(acc)` (plus `hsum(min_acc)`), with a fixed reduction tree.
//!
//! [`crate::dot::twins`] reproduces this bit for bit in portable code.
//!
//! # 512-bit tiles
//!
//! On CPUs with AVX512-F/BW/VNNI, whole tiles of 8 or 16 tokens run in 512-bit registers
//! (`zmm.rs`) without changing a bit: each register holds two tokens' 8 lanes interleaved,
//! so one `vpdpbusd`, conversion and FMA serve two (row, token) pairs, and every pair still
//! takes the canonical per-lane steps above. The signed types multiply unsigned codes and start
//! each lane sum from `-offset · Σ y`, which gives the same integers as the sign trick.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA and F16C, and pointers valid for the rows, blocks
//! and outputs they are told to touch.

use crate::dot::GemmCall;
use std::arch::x86_64::*;

mod formats;
mod zmm;

pub(crate) use formats::*;
pub(crate) use zmm::*;

/// Fixed-order horizontal sum: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
#[inline(always)]
pub(crate) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The f16 values at `p`, `p + stride`, ... (`cnt` ≤ 8 of them) widened into f32 lanes; lanes
/// from `cnt` on are zero. (Inserting them one by one measured twice as fast as a vector gather
/// here: gathers are microcoded on some CPUs.)
#[inline(always)]
unsafe fn gather_f16(p: *const u8, stride: usize, cnt: usize) -> __m256 {
    let rd = |k: usize| (p.add(k * stride) as *const i16).read_unaligned();
    let h = if cnt == 8 {
        _mm_set_epi16(rd(7), rd(6), rd(5), rd(4), rd(3), rd(2), rd(1), rd(0))
    } else {
        let mut buf = [0i16; 8];
        for (k, v) in buf.iter_mut().enumerate().take(cnt) {
            *v = rd(k);
        }
        _mm_loadu_si128(buf.as_ptr() as *const __m128i)
    };
    _mm256_cvtph_ps(h)
}

/// Where a block's min term factor comes from (see [`Q32::WMIN`], [`Q32::AMIN`]).
#[derive(Clone, Copy)]
pub(crate) enum Mins {
    /// None (types without a min term).
    None,
    /// The f16 at offset 2 of the block (Q4_1/Q5_1's `m`, Q8_1's `s`).
    Field,
    /// The block's `d` times a constant (Q5_0's `-16 · d`; exact, a power of two).
    Scaled(f32),
    /// The block's `d` times the exact sum of its 32 signed quants at this offset (one f32
    /// multiply).
    QuantSum(usize),
}

/// Exact sum of the 32 signed bytes at `p`.
#[inline(always)]
pub(crate) unsafe fn quant_sum(p: *const u8) -> i32 {
    let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), loadu(p));
    let v = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

/// The scales `d` of `cnt` ≤ 8 blocks `bb` bytes apart, widened, and their min factors as
/// `mins` says (zero for [`Mins::None`]).
#[inline(always)]
unsafe fn gather_scales(p: *const u8, bb: usize, cnt: usize, mins: Mins) -> (__m256, __m256) {
    if cnt == 8 && matches!(mins, Mins::Field) {
        // `d` and `m` are adjacent: one 32-bit insert per block instead of two 16-bit ones
        // (decoding rows in the block layout gathers every row's scales once: a tenth of its
        // instructions; the model repacks such rows scales first where these tiles run).
        let rd = |k: usize| (p.add(k * bb) as *const i32).read_unaligned();
        let v = _mm256_setr_epi32(rd(0), rd(1), rd(2), rd(3), rd(4), rd(5), rd(6), rd(7));
        let d_words = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
        let m_words = _mm256_srli_epi32(v, 16);
        // [d0..d3 m0..m3 | d4..d7 m4..m7] → [d0..d7 | m0..m7]
        let both = _mm256_permute4x64_epi64(_mm256_packus_epi32(d_words, m_words), 0xD8);
        let d = _mm256_cvtph_ps(_mm256_castsi256_si128(both));
        let m = _mm256_cvtph_ps(_mm256_extracti128_si256(both, 1));
        return (d, m);
    }
    let d = gather_f16(p, bb, cnt);
    let m = match mins {
        Mins::None => _mm256_setzero_ps(),
        Mins::Field => gather_f16(p.add(2), bb, cnt),
        Mins::Scaled(k) => _mm256_mul_ps(d, _mm256_set1_ps(k)),
        Mins::QuantSum(off) => {
            let mut sums = [0i32; 8];
            for (k, v) in sums.iter_mut().enumerate().take(cnt) {
                *v = quant_sum(p.add(k * bb + off));
            }
            let sums = _mm256_loadu_si256(sums.as_ptr() as *const __m256i);
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums))
        }
    };
    (d, m)
}

/// Where a microkernel reads the f32 scales (`d`, and `m`/`s` for the min types) of 8
/// consecutive blocks. Both sources yield the exact same values (f16 → f32 is exact), zero in
/// the lanes past the last block, so the choice never changes a result.
trait Scales {
    /// Scales `d` of blocks `b0..b0 + cnt` of row `i`, and their min factors (weights' mins,
    /// activations' scaled sums); the second is only meaningful for the min types.
    unsafe fn dm8(&self, i: usize, b0: usize, cnt: usize, with_min: bool) -> (__m256, __m256);
}

/// Reads the f16 fields straight from the blocks: rows `stride` bytes apart, blocks `bb` bytes.
#[derive(Clone, Copy)]
struct Gather {
    p: *const u8,
    stride: usize,
    bb: usize,
    mins: Mins,
    /// The scale is an e8m0 byte read as half its power of two (MXFP4), not an f16.
    e8m0: bool,
}

impl Scales for Gather {
    #[inline(always)]
    unsafe fn dm8(&self, i: usize, b0: usize, cnt: usize, with_min: bool) -> (__m256, __m256) {
        // The gather's own `mins` already says whether there is a min term.
        let _ = with_min;
        if self.e8m0 {
            // No min term: MXFP4's levels are signed.
            let p = self.p.add(i * self.stride + b0 * self.bb);
            let mut d = [0f32; 8];
            for (k, v) in d.iter_mut().enumerate().take(cnt) {
                *v = crate::dequant::e8m0_half(*p.add(k * self.bb));
            }
            return (_mm256_loadu_ps(d.as_ptr()), _mm256_setzero_ps());
        }
        gather_scales(
            self.p.add(i * self.stride + b0 * self.bb),
            self.bb,
            cnt,
            self.mins,
        )
    }
}

/// Reads the f16 fields of a [scales-first](crate::WeightLayout::ScalesFirst) row: rows
/// `stride` bytes apart, each starting with its `nb` blocks' `d`, then (Q4_1/Q5_1) their `m`.
#[derive(Clone, Copy)]
struct ScalesFirst {
    p: *const u8,
    stride: usize,
    nb: usize,
    mins: Mins,
}

impl Scales for ScalesFirst {
    #[inline(always)]
    unsafe fn dm8(&self, i: usize, b0: usize, cnt: usize, with_min: bool) -> (__m256, __m256) {
        let _ = with_min;
        let row = self.p.add(i * self.stride);
        // Eight consecutive f16 from `at`, zero past `cnt` (the last group of a row). The 16
        // bytes are inside the row even then: the `m` fields or the quants follow (a row of
        // `nb` blocks has at least 18·nb ≥ 2·nb + 16 bytes, and 20·nb ≥ 4·nb + 16 with `m`).
        let keep = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(cnt as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let load8 = |at: *const u8| {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(at as *const __m128i));
            _mm256_and_ps(v, _mm256_castsi256_ps(keep))
        };
        let d = load8(row.add(2 * b0));
        let m = match self.mins {
            Mins::None | Mins::QuantSum(_) => _mm256_setzero_ps(),
            Mins::Field => load8(row.add(2 * (self.nb + b0))),
            Mins::Scaled(k) => _mm256_mul_ps(d, _mm256_set1_ps(k)),
        };
        (d, m)
    }
}

/// Reads scales converted beforehand by [`convert_scales`]: per row, `nbp` values of `d` then
/// (for the min types) `nbp` of `m`, `nbp` = blocks rounded up to 8, zero padded.
#[derive(Clone, Copy)]
struct Pre {
    p: *const f32,
    stride: usize,
    nbp: usize,
}

impl Pre {
    /// The same layout starting at row `i`.
    #[inline(always)]
    fn row(&self, i: usize) -> Pre {
        Pre {
            p: self.p.wrapping_add(i * self.stride),
            ..*self
        }
    }
}

impl Scales for Pre {
    #[inline(always)]
    unsafe fn dm8(&self, i: usize, b0: usize, _cnt: usize, with_min: bool) -> (__m256, __m256) {
        let d = _mm256_loadu_ps(self.p.add(i * self.stride + b0));
        let m = if with_min {
            _mm256_loadu_ps(self.p.add(i * self.stride + self.nbp + b0))
        } else {
            _mm256_setzero_ps()
        };
        (d, m)
    }
}

/// Converts the scales of `rows` rows (`nb` blocks each, read through `src`) into `dst` in the
/// [`Pre`] layout, with `per_row` = `nbp` or `2 * nbp` floats per row.
#[inline(always)]
unsafe fn convert_scales<S: Scales>(
    src: &S,
    nb: usize,
    rows: usize,
    mins: Mins,
    dst: &mut [f32],
) -> Pre {
    let with_min = !matches!(mins, Mins::None);
    let nbp = nb.div_ceil(8) * 8;
    let per_row = if with_min { 2 * nbp } else { nbp };
    debug_assert!(dst.len() >= rows * per_row);
    for i in 0..rows {
        let row = dst.as_mut_ptr().add(i * per_row);
        let mut b0 = 0;
        while b0 < nbp {
            let cnt = nb.saturating_sub(b0).min(8);
            let (d, m) = if cnt == 0 {
                (_mm256_setzero_ps(), _mm256_setzero_ps())
            } else {
                src.dm8(i, b0, cnt, with_min)
            };
            _mm256_storeu_ps(row.add(b0), d);
            if with_min {
                _mm256_storeu_ps(row.add(nbp + b0), m);
            }
            b0 += 8;
        }
    }
    Pre {
        p: dst.as_ptr(),
        stride: per_row,
        nbp,
    }
}

/// Prefetches the `bytes` bytes (rounded up to cache lines) at `w + offset`. Addresses past the
/// matrix are harmless: a prefetch never faults.
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(w: *const u8, offset: usize, bytes: usize) {
    let p = w.wrapping_add(offset);
    let mut line = 0;
    while line < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8);
        line += 64;
    }
}

/// How a block's 32 products (unsigned × signed bytes) become 8 i32 lane sums. Both ways give
/// exactly the same integers, so the choice never changes a result.
pub(crate) trait LaneSums {
    /// Full token tiles run in 512-bit registers (`zmm::micro_zmm`); only for CPUs with
    /// AVX512-F/BW/VNNI.
    const ZMM: bool = false;
    unsafe fn sums(ax: __m256i, y: __m256i) -> __m256i;
}

/// `maddubs` (pairs to i16) then `madd` with ones (pairs of those to i32): AVX2.
pub(crate) struct Madd;

impl LaneSums for Madd {
    #[inline(always)]
    unsafe fn sums(ax: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, y), _mm256_set1_epi16(1))
    }
}

/// One `vpdpbusd` (AVX512-VNNI on 256-bit registers): a quarter fewer instructions in the
/// innermost loop. Only inlined into functions compiled with `avx512vnni,avx512vl`.
pub(crate) struct Vnni;

impl LaneSums for Vnni {
    const ZMM: bool = true;
    #[inline(always)]
    unsafe fn sums(ax: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, y)
    }
}

/// Where row 0's first quant part starts in a matrix at `w` with `nb` blocks per row: inside
/// the first block, or (`SF`, scales first) after the row's `nb` blocks of f16 fields.
#[inline(always)]
unsafe fn quants<K: Q32, const SF: bool>(w: *const u8, nb: usize) -> *const u8 {
    w.add(if SF { K::QOFF * nb } else { K::QOFF })
}

/// Bytes from one block's quant part to the next one's.
#[inline(always)]
const fn quant_stride<K: Q32, const SF: bool>() -> usize {
    if SF {
        K::WB - K::QOFF
    } else {
        K::WB
    }
}

/// Per-pair scale products of one group of 8 blocks, laid out for broadcast loads.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Lanes([f32; 8]);

/// The R × C microkernel: outputs `out[c * ldo + r] = dot(w row r, act row c)` over `nb` blocks,
/// where row `r`'s first quant part is at `q + r * ldw` (see [`quants`]) and activation row `c`
/// starts at `a + c * lda`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<
    K: Q32,
    L: LaneSums,
    const R: usize,
    const C: usize,
    SW: Scales,
    SA: Scales,
    const SF: bool,
>(
    q: *const u8,
    ldw: usize,
    sw: &SW,
    a: *const u8,
    lda: usize,
    sa: &SA,
    nb: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut macc = [[_mm256_setzero_ps(); C]; R];
    let mut dd = [[Lanes([0.0; 8]); C]; R];
    let mut b0 = 0;
    while b0 < nb {
        let cnt = (nb - b0).min(8);
        let mut dy = [_mm256_setzero_ps(); C];
        let mut sy = [_mm256_setzero_ps(); C];
        for c in 0..C {
            (dy[c], sy[c]) = sa.dm8(c, b0, cnt, K::HAS_MIN);
        }
        for r in 0..R {
            let (dx, mx) = sw.dm8(r, b0, cnt, K::HAS_MIN);
            for c in 0..C {
                _mm256_store_ps(dd[r][c].0.as_mut_ptr(), _mm256_mul_ps(dx, dy[c]));
                if K::HAS_MIN {
                    macc[r][c] = _mm256_fmadd_ps(mx, sy[c], macc[r][c]);
                }
            }
        }
        // Read the products back through an opaque pointer: LLVM otherwise keeps them in
        // registers and broadcasts each with two shuffles, which saturates the shuffle port in
        // the larger tiles, where a broadcast load only needs a load port.
        let ddp: *const Lanes = std::hint::black_box(dd.as_ptr().cast::<Lanes>());
        for k in 0..cnt {
            let b = b0 + k;
            if R == RD && C <= 2 {
                // Decode streams the matrix from memory once: ask for the rows two tiles ahead,
                // spread over this tile's blocks (the tile spans `R * ldw` bytes in `nb` steps).
                prefetch_ahead(q, 2 * R * ldw + b * R * K::WB, R * K::WB);
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let xq = K::unpack(q.add(r * ldw + b * quant_stride::<K, SF>()));
                let ax = if K::SIGNED {
                    _mm256_sign_epi8(xq, xq)
                } else {
                    xq
                };
                for (c, acc_rc) in acc_r.iter_mut().enumerate() {
                    let y = loadu(a.add(c * lda + b * K::AB + K::AQ));
                    let y = if K::SIGNED {
                        _mm256_sign_epi8(y, xq)
                    } else {
                        y
                    };
                    let q = _mm256_cvtepi32_ps(L::sums(ax, y));
                    let d = _mm256_broadcast_ss(&*ddp.add(r * C + c).cast::<f32>().add(k));
                    *acc_rc = _mm256_fmadd_ps(d, q, *acc_rc);
                }
            }
        }
        b0 += cnt;
    }
    for r in 0..R {
        for c in 0..C {
            let mut v = hsum_ps(acc[r][c]);
            if K::HAS_MIN {
                v += hsum_ps(macc[r][c]);
            }
            *out.add(c * ldo + r) = v;
        }
    }
}

thread_local! {
    /// Per-thread paired activations and their offset corrections for `zmm::micro_zmm`.
    static PAIRED: std::cell::RefCell<Vec<Z64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows per tile and tokens per tile of the main microkernel (measured on Cascade Lake).
const RM: usize = 2;
const CM: usize = 4;
/// Rows per tile when there is a single token (decode): the activation block is reused across
/// rows and four independent accumulator chains hide the FMA latency.
const RD: usize = 4;

/// Floats of scale buffer every thread starts with: enough for every rectangle of the built-in
/// models' products, so steady-state decoding never grows it.
const MIN_SCALES: usize = 16 * 1024;

thread_local! {
    /// Per-thread converted scales for [`gemm`], grown on demand and kept for reuse.
    static SCALES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Units of paired activations every thread starts with where the 512-bit tiles run: enough
/// for any decoding pair and every tile of the built-in models' products, so steady-state
/// decoding never grows it.
const MIN_PAIRED: usize = 2048;

/// Allocates this thread's scale buffer (and, where the 512-bit tiles run, its paired
/// activations) at their starting sizes (see `matmul::prepare_thread`).
pub(crate) fn prepare_thread() {
    SCALES.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < MIN_SCALES {
            buf.resize(MIN_SCALES, 0.0);
        }
    });
    if crate::cpu::has_vnni() {
        PAIRED.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < MIN_PAIRED {
                buf.resize(MIN_PAIRED, Z64([0; 64]));
            }
        });
    }
}

/// `out[t * ldo + r] = dot(w row r, act row t)` for `r < nr`, `t < nt`, rows `ldw` bytes apart
/// and activation rows `lda` bytes apart, over `n` elements. Full token tiles read f32 scales
/// converted once for the rectangle; the tokens left over (all of them when decoding) read the
/// weights' scales straight from the blocks, since converting first would cost a pass over rows
/// used once or twice.
#[inline(always)]
unsafe fn gemm<K: Q32, L: LaneSums, const SF: bool>(c: &GemmCall) {
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
    let nb = n / 32;
    let per_row = nb.div_ceil(8) * 8 * if K::HAS_MIN { 2 } else { 1 };
    // Take the buffer out of the thread-local rather than working inside a `with` closure: a
    // closure would not inherit this function's target features, and every intrinsic in it
    // would become a call.
    let mut buf = SCALES.with(|cell| cell.take());
    {
        let convert_w = nt >= CM;
        let need = (if convert_w { nr } else { 0 } + nt) * per_row;
        if buf.len() < need {
            // Grow in large steps: which thread gets which (differently sized) chunk is decided
            // at run time, so small steps would keep allocating long after warm-up.
            buf.resize(need.next_power_of_two().max(MIN_SCALES), 0.0);
        }
        let (wbuf, abuf) = buf.split_at_mut(if convert_w { nr * per_row } else { 0 });
        let acts = Gather {
            p: a,
            stride: lda,
            bb: K::AB,
            mins: K::AMIN,
            e8m0: false,
        };
        let sa = convert_scales(&acts, nb, nt, K::AMIN, abuf);
        let mut t = 0;
        if convert_w {
            let sw = if SF {
                convert_scales(&scales_first::<K>(w, ldw, nb), nb, nr, K::WMIN, wbuf)
            } else {
                convert_scales(&blocks::<K>(w, ldw), nb, nr, K::WMIN, wbuf)
            };
            if L::ZMM && nt >= 2 * pairs_per_tile::<K>() && crate::cpu::wide_tiles() {
                t = if pairs_per_tile::<K>() == 4 {
                    zmm_tiles::<K, SF, 4>(w, ldw, &sw, a, lda, &sa, nb, nr, nt, out, ldo)
                } else {
                    zmm_tiles::<K, SF, 8>(w, ldw, &sw, a, lda, &sa, nb, nr, nt, out, ldo)
                };
            }
            while t + CM <= nt {
                let (at, ot, st) = (a.add(t * lda), out.add(t * ldo), sa.row(t));
                let mut r = 0;
                while r + RM <= nr {
                    let (qr, swr) = (quants::<K, SF>(w.add(r * ldw), nb), sw.row(r));
                    micro::<K, L, RM, CM, _, _, SF>(
                        qr,
                        ldw,
                        &swr,
                        at,
                        lda,
                        &st,
                        nb,
                        ot.add(r),
                        ldo,
                    );
                    r += RM;
                }
                while r < nr {
                    let (qr, swr) = (quants::<K, SF>(w.add(r * ldw), nb), sw.row(r));
                    micro::<K, L, 1, CM, _, _, SF>(qr, ldw, &swr, at, lda, &st, nb, ot.add(r), ldo);
                    r += 1;
                }
                t += CM;
            }
        }
        while t < nt {
            let pair = nt - t >= 2;
            let (at, ot, st) = (a.add(t * lda), out.add(t * ldo), sa.row(t));
            if L::ZMM && pair && crate::cpu::wide_tiles() {
                zmm_decode_pair::<K, SF>(w, ldw, at, lda, &st, nb, nr, ot, ldo);
                t += 2;
                continue;
            }
            let mut r = 0;
            while r < nr {
                let wr = w.add(r * ldw);
                let o = ot.add(r);
                let rows = if nr - r >= RD { RD } else { 1 };
                let qr = quants::<K, SF>(wr, nb);
                if SF {
                    let sw = scales_first::<K>(wr, ldw, nb);
                    decode_tile::<K, L, SF, _>(qr, ldw, &sw, at, lda, &st, nb, o, ldo, rows, pair);
                } else {
                    let sw = blocks::<K>(wr, ldw);
                    decode_tile::<K, L, SF, _>(qr, ldw, &sw, at, lda, &st, nb, o, ldo, rows, pair);
                }
                r += rows;
            }
            t += if pair { 2 } else { 1 };
        }
    }
    SCALES.with(|cell| cell.replace(buf));
}

/// The weights' scales read from the blocks of rows `ldw` bytes apart.
#[inline(always)]
fn blocks<K: Q32>(w: *const u8, ldw: usize) -> Gather {
    Gather {
        p: w,
        stride: ldw,
        bb: K::WB,
        mins: K::WMIN,
        e8m0: K::E8M0,
    }
}

/// The weights' scales read from scales-first rows of `nb` blocks, `ldw` bytes apart.
#[inline(always)]
fn scales_first<K: Q32>(w: *const u8, ldw: usize, nb: usize) -> ScalesFirst {
    ScalesFirst {
        p: w,
        stride: ldw,
        nb,
        mins: K::WMIN,
    }
}

/// One decode tile: `rows` (1 or [`RD`]) weight rows (quants from `q`, see [`quants`]) against
/// one token, or two (`pair`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn decode_tile<K: Q32, L: LaneSums, const SF: bool, SW: Scales>(
    q: *const u8,
    ldw: usize,
    sw: &SW,
    a: *const u8,
    lda: usize,
    sa: &Pre,
    nb: usize,
    out: *mut f32,
    ldo: usize,
    rows: usize,
    pair: bool,
) {
    match (rows == RD, pair) {
        (true, true) => micro::<K, L, RD, 2, _, _, SF>(q, ldw, sw, a, lda, sa, nb, out, ldo),
        (true, false) => micro::<K, L, RD, 1, _, _, SF>(q, ldw, sw, a, lda, sa, nb, out, ldo),
        (false, true) => micro::<K, L, 1, 2, _, _, SF>(q, ldw, sw, a, lda, sa, nb, out, ldo),
        (false, false) => micro::<K, L, 1, 1, _, _, SF>(q, ldw, sw, a, lda, sa, nb, out, ldo),
    }
}

/// The single-pair kernel (the 1 × 1 tile) and the tiled ones (block layout, and scales first)
/// of a type, with lane sums `$l`, compiled for `$features`.
macro_rules! q32_pair_and_gemm {
    ($pair:ident, $gemm:ident, $gemm_sf:ident, $k:ty, $l:ty, $features:literal) => {
        /// Single-pair dot product: the 1 × 1 tile.
        #[target_feature(enable = $features)]
        pub unsafe fn $pair(w: &[u8], a: &[u8], n: usize) -> f32 {
            debug_assert!(w.len() >= n / 32 * <$k>::WB && a.len() >= n / 32 * <$k>::AB);
            let mut v = 0.0f32;
            let sw = blocks::<$k>(w.as_ptr(), 0);
            let sa = Gather {
                p: a.as_ptr(),
                stride: 0,
                bb: <$k>::AB,
                mins: <$k>::AMIN,
                e8m0: false,
            };
            let q = quants::<$k, false>(w.as_ptr(), n / 32);
            micro::<$k, $l, 1, 1, _, _, false>(q, 0, &sw, a.as_ptr(), 0, &sa, n / 32, &mut v, 0);
            v
        }

        tiled_gemm!(
            $gemm,
            $k,
            $l,
            false,
            $features,
            "Tiled matrix × activations over a rectangle (see [`GemmKernel`](super::GemmKernel))."
        );
        tiled_gemm!(
            $gemm_sf,
            $k,
            $l,
            true,
            $features,
            "The tiled kernel over rows in the [scales-first](crate::WeightLayout::ScalesFirst) \
             layout: the same values, bit for bit."
        );
    };
}

/// One tiled kernel ([`GemmKernel`](super::GemmKernel) signature): [`gemm`] for type `$k`, lane
/// sums `$l` and layout `$sf` (scales first), compiled for `$features`.
macro_rules! tiled_gemm {
    ($name:ident, $k:ty, $l:ty, $sf:literal, $features:literal, $doc:literal) => {
        gemm_entry!(#[doc = $doc] #[target_feature(enable = $features)] pub $name, gemm::<$k, $l, $sf>);
    };
}

/// Every 32-element type's kernels: AVX2, and AVX512-VNNI (bit-identical) for CPUs that have it.
macro_rules! q32_kernels {
    ($($k:ty: $pair:ident, $gemm:ident, $gemm_sf:ident;
        $pair_vnni:ident, $gemm_vnni:ident, $gemm_sf_vnni:ident;)*) => {$(
        q32_pair_and_gemm!($pair, $gemm, $gemm_sf, $k, Madd, "avx2,fma,f16c");
        q32_pair_and_gemm!(
            $pair_vnni,
            $gemm_vnni,
            $gemm_sf_vnni,
            $k,
            Vnni,
            "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl"
        );
    )*};
}

q32_kernels! {
    Q40: q4_0_q8_0, gemm_q4_0, gemm_q4_0_sf; q4_0_q8_0_vnni, gemm_q4_0_vnni, gemm_q4_0_sf_vnni;
    Q41: q4_1_q8_1, gemm_q4_1, gemm_q4_1_sf; q4_1_q8_1_vnni, gemm_q4_1_vnni, gemm_q4_1_sf_vnni;
    Q50: q5_0_q8_0, gemm_q5_0, gemm_q5_0_sf; q5_0_q8_0_vnni, gemm_q5_0_vnni, gemm_q5_0_sf_vnni;
    Q51: q5_1_q8_1, gemm_q5_1, gemm_q5_1_sf; q5_1_q8_1_vnni, gemm_q5_1_vnni, gemm_q5_1_sf_vnni;
    Q80: q8_0_q8_0, gemm_q8_0, gemm_q8_0_sf; q8_0_q8_0_vnni, gemm_q8_0_vnni, gemm_q8_0_sf_vnni;
}

// The table-indexed types have no scales-first layout: their `_sf` kernels are never picked.
#[allow(dead_code)]
mod table_kernels {
    use super::*;
    q32_kernels! {
        Iq4Nl: iq4_nl_q8_0, gemm_iq4_nl, gemm_iq4_nl_sf;
            iq4_nl_q8_0_vnni, gemm_iq4_nl_vnni, gemm_iq4_nl_sf_vnni;
        Mxfp4: mxfp4_q8_0, gemm_mxfp4, gemm_mxfp4_sf;
            mxfp4_q8_0_vnni, gemm_mxfp4_vnni, gemm_mxfp4_sf_vnni;
    }
}
pub(crate) use table_kernels::{
    gemm_iq4_nl, gemm_iq4_nl_vnni, gemm_mxfp4, gemm_mxfp4_vnni, iq4_nl_q8_0, iq4_nl_q8_0_vnni,
    mxfp4_q8_0, mxfp4_q8_0_vnni,
};
