//! The 512-bit tiles (AVX512-F/BW/VNNI): two tokens' 8 lanes interleaved per register, so one
//! `vpdpbusd`, conversion and FMA serve two (row, token) pairs with the canonical per-lane
//! steps of the parent module, bit for bit.

use std::arch::x86_64::*;

use super::*;

/// Sixteen f32 lanes: one group's scale products for two tokens side by side (block `k`'s pair
/// at lanes `2k`, `2k + 1`), read back as one 64-bit broadcast per block.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Lanes16([f32; 16]);

/// Lane `2k + h` of a 512-bit register is lane `k` of token `h` of a pair: [`PAIR`] interleaves
/// two 8-lane vectors that way, [`DUP`] gives both tokens the same lane.
pub(crate) const PAIR: [i32; 16] = [0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23];
pub(crate) const DUP: [i32; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];

#[inline(always)]
pub(crate) unsafe fn idx(v: [i32; 16]) -> __m512i {
    _mm512_loadu_si512(v.as_ptr().cast())
}

/// 64 bytes, the unit of the paired activation buffer.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct Z64(pub(crate) [u8; 64]);

/// Where [`pair_acts`] puts one tile's paired activations: `P` pairs of `nb` blocks (`ng`
/// groups of 8), in one buffer of [`Z64`] units.
#[derive(Clone, Copy)]
struct Paired {
    /// Pair `p`'s block `b` at `quants + p * nb + b`: the two tokens' 4-byte groups of quants
    /// interleaved (token `h`'s group `g` at position `2g + h`).
    quants: *mut Z64,
    /// The signed types' starting lane sums, `-OFFSET · Σ y` per 4-byte group, laid out as
    /// `quants` (unused for the unsigned types).
    corr: *mut Z64,
    /// Pair `p`'s scales `d` of group `g` at `dy + p * ng + g`, the two tokens interleaved.
    dy: *mut Z64,
    /// The same for the activation min factors (min types only).
    sy: *mut Z64,
}

impl Paired {
    /// Units needed for `pairs` pairs of `nb` blocks.
    fn units<K: Q32>(pairs: usize, nb: usize) -> usize {
        let ng = nb.div_ceil(8);
        pairs * (nb * if K::OFFSET != 0 { 2 } else { 1 } + ng * if K::HAS_MIN { 2 } else { 1 })
    }

    /// The layout over `buf` (at least [`Paired::units`] long).
    unsafe fn over<K: Q32>(buf: *mut Z64, pairs: usize, nb: usize) -> Paired {
        let ng = nb.div_ceil(8);
        let quants = buf;
        let corr = quants.add(if K::OFFSET != 0 { pairs * nb } else { 0 });
        let dy = corr.add(pairs * nb);
        let sy = dy.add(if K::HAS_MIN { pairs * ng } else { 0 });
        Paired {
            quants,
            corr,
            dy,
            sy,
        }
    }
}

/// Pairs tokens `0..2 * pairs` (activation rows `lda` bytes apart, `nb` blocks, scales in `sa`)
/// into `dst` for [`micro_zmm`].
#[inline(always)]
unsafe fn pair_acts<K: Q32>(
    a: *const u8,
    lda: usize,
    sa: &Pre,
    pairs: usize,
    nb: usize,
    dst: &Paired,
) {
    let pair = idx(PAIR);
    let ng = nb.div_ceil(8);
    for p in 0..pairs {
        let a0 = a.add(2 * p * lda + K::AQ);
        let a1 = a0.add(lda);
        for b in 0..nb {
            let y0 = _mm512_castsi256_si512(loadu(a0.add(b * K::AB)));
            let y1 = _mm512_castsi256_si512(loadu(a1.add(b * K::AB)));
            let v = _mm512_permutex2var_epi32(y0, pair, y1);
            _mm512_store_si512(dst.quants.add(p * nb + b).cast(), v);
            if K::OFFSET != 0 {
                let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), v);
                let c = _mm512_mullo_epi32(sums, _mm512_set1_epi32(-K::OFFSET));
                _mm512_store_si512(dst.corr.add(p * nb + b).cast(), c);
            }
        }
        for g in 0..ng {
            let (d0, s0) = sa.dm8(2 * p, 8 * g, 8, K::HAS_MIN);
            let (d1, s1) = sa.dm8(2 * p + 1, 8 * g, 8, K::HAS_MIN);
            let d = _mm512_permutex2var_ps(
                _mm512_castps256_ps512(d0),
                pair,
                _mm512_castps256_ps512(d1),
            );
            _mm512_store_ps(dst.dy.add(p * ng + g).cast(), d);
            if K::HAS_MIN {
                let s = _mm512_permutex2var_ps(
                    _mm512_castps256_ps512(s0),
                    pair,
                    _mm512_castps256_ps512(s1),
                );
                _mm512_store_ps(dst.sy.add(p * ng + g).cast(), s);
            }
        }
    }
}

/// The canonical horizontal sums ([`hsum_ps`]'s tree) of four paired accumulators at once:
/// lanes `4i` and `4i + 1` of the result are register `i`'s two tokens.
#[inline(always)]
pub(crate) unsafe fn hsum4_paired(v: [__m512; 4]) -> __m512 {
    // Lanes k and k + 4 of each token (128-bit chunks c and c + 2 of a register).
    let ab = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(v[0], v[1]),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(v[0], v[1]),
    );
    let cd = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(v[2], v[3]),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(v[2], v[3]),
    );
    // Then k and k + 2 (chunks 0 and 1 of each register's half).
    let t = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
    );
    // Then k and k + 1 (the two 64-bit halves of each chunk).
    _mm512_add_ps(t, _mm512_permute_ps::<0b01_00_11_10>(t))
}

/// The R × 2P microkernel in 512-bit registers: the same values, bit for bit, as [`micro`].
/// Each register holds two tokens' 8 lanes interleaved (see [`PAIR`]), so every (row, token)
/// pair still takes exactly the canonical per-lane steps, and one `vpdpbusd`, conversion and
/// FMA serve two pairs. Activations come paired by [`pair_acts`]; weights as in [`micro`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::needless_range_loop)] // the block loop walks token pairs outside rows
unsafe fn micro_zmm<K: Q32, const R: usize, const P: usize, SW: Scales, const SF: bool>(
    q: *const u8,
    ldw: usize,
    sw: &SW,
    acts: &Paired,
    nb: usize,
    out: *mut f32,
    ldo: usize,
) {
    const { assert!(P.is_multiple_of(4) || P == 1) };
    let dup = idx(DUP);
    let ng = nb.div_ceil(8);
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    let mut dd = [[std::mem::MaybeUninit::<Lanes16>::uninit(); P]; R];
    for g in 0..ng {
        let b0 = 8 * g;
        let cnt = (nb - b0).min(8);
        for (r, dd_r) in dd.iter_mut().enumerate() {
            let (dx, _) = sw.dm8(r, b0, cnt, false);
            let dx = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(dx));
            for (p, dd_rp) in dd_r.iter_mut().enumerate() {
                let dy = _mm512_load_ps(acts.dy.add(p * ng + g).cast());
                _mm512_store_ps(dd_rp.as_mut_ptr().cast(), _mm512_mul_ps(dx, dy));
            }
        }
        // Read back through an opaque pointer, as in `micro`: a broadcast load per use.
        let ddp: *const Lanes16 = std::hint::black_box(dd.as_ptr().cast::<Lanes16>());
        for k in 0..cnt {
            let b = b0 + k;
            if P == 1 {
                // One pair is decoding (a token's two activation parts): the matrix streams
                // from memory once, so fetch the rows two tiles ahead, as `micro` does.
                prefetch_ahead(q, 2 * R * ldw + b * R * K::WB, R * K::WB);
            }
            let mut x = [_mm512_setzero_si512(); R];
            for (r, xr) in x.iter_mut().enumerate() {
                let u = K::unpack_unsigned(q.add(r * ldw + b * quant_stride::<K, SF>()));
                *xr = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(u));
            }
            for p in 0..P {
                let at = p * nb + b;
                let y = _mm512_load_si512(acts.quants.add(at).cast());
                for r in 0..R {
                    let start = if K::OFFSET != 0 {
                        _mm512_load_si512(acts.corr.add(at).cast())
                    } else {
                        _mm512_setzero_si512()
                    };
                    let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, x[r], y));
                    let pair_dd = (ddp.add(r * P + p).cast::<f64>()).add(k).read();
                    let d = _mm512_castpd_ps(_mm512_set1_pd(pair_dd));
                    acc[r][p] = _mm512_fmadd_ps(d, q, acc[r][p]);
                }
            }
        }
    }
    for r in 0..R {
        for p4 in (0..P).step_by(4) {
            // One pair (decoding) fills the first of four registers.
            let mut quad = [_mm512_setzero_ps(); 4];
            quad[..P.min(4)].copy_from_slice(&acc[r][p4..p4 + P.min(4)]);
            let mut sums = hsum4_paired(quad);
            if K::HAS_MIN {
                // The min terms' chains (one FMA per group, in group order) run here rather
                // than in the block loop, whose registers the main accumulators fill.
                let mut macc = [_mm512_setzero_ps(); 4];
                for g in 0..ng {
                    let (_, mx) = sw.dm8(r, 8 * g, (nb - 8 * g).min(8), true);
                    let mx = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(mx));
                    for (i, m) in macc.iter_mut().enumerate().take(P.min(4)) {
                        let sy = _mm512_load_ps(acts.sy.add((p4 + i) * ng + g).cast());
                        *m = _mm512_fmadd_ps(mx, sy, *m);
                    }
                }
                sums = _mm512_add_ps(sums, hsum4_paired(macc));
            }
            let mut lanes = Lanes16([0.0; 16]);
            _mm512_store_ps(lanes.0.as_mut_ptr(), sums);
            for i in 0..P.min(4) {
                for h in 0..2 {
                    *out.add((2 * (p4 + i) + h) * ldo + r) = lanes.0[4 * i + h];
                }
            }
        }
    }
}

/// Rows per 512-bit tile.
const RZ: usize = 2;

/// Token pairs per 512-bit tile: four for the signed types, whose offset corrections take as
/// many registers again as their activations (measured: 1.30x over the 256-bit tiles against
/// 1.13x with eight, on Q8_0); eight for the others (Q5_0 1.43x against 1.30x).
pub(super) const fn pairs_per_tile<K: Q32>() -> usize {
    if K::OFFSET != 0 {
        4
    } else {
        8
    }
}

/// Two tokens (a decoding token's two activation parts, usually) against every row, in
/// 512-bit registers: [`micro_zmm`] with one pair, [`RD`] rows at a time, scales read from the
/// rows themselves (each is used once).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn zmm_decode_pair<K: Q32, const SF: bool>(
    w: *const u8,
    ldw: usize,
    a: *const u8,
    lda: usize,
    sa: &Pre,
    nb: usize,
    nr: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut buf = PAIRED.with(|cell| cell.take());
    let need = Paired::units::<K>(1, nb);
    if buf.len() < need {
        buf.resize(need.next_power_of_two(), Z64([0; 64]));
    }
    let acts = Paired::over::<K>(buf.as_mut_ptr(), 1, nb);
    pair_acts::<K>(a, lda, sa, 1, nb, &acts);
    let mut r = 0;
    while r < nr {
        let (wr, o) = (w.add(r * ldw), out.add(r));
        let qr = quants::<K, SF>(wr, nb);
        let rows = if nr - r >= RD { RD } else { 1 };
        macro_rules! run {
            ($sw:expr) => {
                if rows == RD {
                    micro_zmm::<K, RD, 1, _, SF>(qr, ldw, &$sw, &acts, nb, o, ldo)
                } else {
                    micro_zmm::<K, 1, 1, _, SF>(qr, ldw, &$sw, &acts, nb, o, ldo)
                }
            };
        }
        if SF {
            run!(scales_first::<K>(wr, ldw, nb));
        } else {
            run!(blocks::<K>(wr, ldw));
        }
        r += rows;
    }
    PAIRED.with(|cell| cell.replace(buf));
}

/// The whole 2·`P`-token tiles of a rectangle in 512-bit registers (see [`micro_zmm`]);
/// returns the tokens done.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn zmm_tiles<K: Q32, const SF: bool, const P: usize>(
    w: *const u8,
    ldw: usize,
    sw: &Pre,
    a: *const u8,
    lda: usize,
    sa: &Pre,
    nb: usize,
    nr: usize,
    nt: usize,
    out: *mut f32,
    ldo: usize,
) -> usize {
    let tiles = nt / (2 * P);
    let mut buf = PAIRED.with(|cell| cell.take());
    // One tile's tokens at a time, so the paired copy stays in L1 while every row passes.
    let need = Paired::units::<K>(P, nb);
    if buf.len() < need {
        buf.resize(need.next_power_of_two(), Z64([0; 64]));
    }
    let acts = Paired::over::<K>(buf.as_mut_ptr(), P, nb);
    for tile in 0..tiles {
        let t = tile * 2 * P;
        pair_acts::<K>(a.add(t * lda), lda, &sa.row(t), P, nb, &acts);
        let ot = out.add(t * ldo);
        let mut r = 0;
        while r + RZ <= nr {
            let qr = quants::<K, SF>(w.add(r * ldw), nb);
            micro_zmm::<K, RZ, P, _, SF>(qr, ldw, &sw.row(r), &acts, nb, ot.add(r), ldo);
            r += RZ;
        }
        while r < nr {
            let qr = quants::<K, SF>(w.add(r * ldw), nb);
            micro_zmm::<K, 1, P, _, SF>(qr, ldw, &sw.row(r), &acts, nb, ot.add(r), ldo);
            r += 1;
        }
    }
    PAIRED.with(|cell| cell.replace(buf));
    tiles * 2 * P
}
