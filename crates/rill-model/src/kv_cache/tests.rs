use super::*;
use rill_kernels::ops::KvView;

fn cache(blocks: usize) -> KvCache {
    KvCache::new(1, 1, 2, blocks * 4, 4, KvDtype::F32).unwrap()
}

#[test]
fn reserve_write_truncate_and_free() {
    let mut c = cache(3);
    c.add_sequence(1).unwrap();
    c.reserve(1, 6).unwrap();
    assert_eq!(c.free_blocks(), 1);
    for p in 0..6 {
        c.write(0, 1, p, &[p as f32, 0.0], &[0.0, p as f32])
            .unwrap();
    }
    c.set_len(1, 6).unwrap();
    let v = c.view(0, 1, 0, 6).unwrap();
    assert_eq!(v.key_dot(5, &[1.0, 0.0]), 5.0);
    c.truncate(1, 3).unwrap();
    assert_eq!(c.free_blocks(), 2);
    assert!(matches!(c.reserve(1, 13), Err(KvError::OutOfBlocks { .. })));
    c.remove_sequence(1).unwrap();
    assert_eq!(c.free_blocks(), 3);
}

#[test]
fn fork_shares_blocks_and_copies_on_write() {
    let mut c = cache(4);
    c.add_sequence(1).unwrap();
    c.reserve(1, 6).unwrap();
    for p in 0..6 {
        c.write(0, 1, p, &[p as f32, 1.0], &[1.0, 1.0]).unwrap();
    }
    c.set_len(1, 6).unwrap();
    c.fork(1, 2).unwrap();
    assert_eq!(c.free_blocks(), 2);
    // Seq 2 writes position 6 into the shared, partly filled block: it gets its own copy.
    assert_eq!(c.blocks_needed(2, 7).unwrap(), 1);
    c.reserve(2, 7).unwrap();
    c.write(0, 2, 6, &[100.0, 0.0], &[0.0, 0.0]).unwrap();
    c.set_len(2, 7).unwrap();
    assert_eq!(c.free_blocks(), 1);
    // The copy kept the shared prefix; the original is untouched.
    let v2 = c.view(0, 2, 0, 7).unwrap();
    assert_eq!(v2.key_dot(5, &[1.0, 0.0]), 5.0);
    assert_eq!(v2.key_dot(6, &[1.0, 0.0]), 100.0);
    c.remove_sequence(1).unwrap();
    c.remove_sequence(2).unwrap();
    assert_eq!(c.free_blocks(), 4);
}

/// Quantized rows are stored whole per position and head, survive a copy-on-write of
/// their block, and read back as ggml dequantizes them.
#[test]
fn quantized_rows_round_trip_through_copy_on_write() {
    for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
        let (heads, dim) = (2, 32);
        let mut c = KvCache::new(1, heads, dim, 16, 4, dtype).unwrap();
        assert_eq!(c.bytes_per_token(), 2 * dtype.row_bytes(heads * dim));
        c.add_sequence(1).unwrap();
        c.reserve(1, 2).unwrap();
        let row = |p: usize| -> Vec<f32> {
            (0..heads * dim)
                .map(|i| ((i * 7 + p * 3) % 19) as f32 - 9.0)
                .collect()
        };
        for p in 0..2 {
            c.write(0, 1, p, &row(p), &row(p + 10)).unwrap();
        }
        c.set_len(1, 2).unwrap();
        c.fork(1, 2).unwrap();
        // Writing position 2 of the fork copies the shared, partly filled block.
        c.reserve(2, 3).unwrap();
        c.write(0, 2, 2, &row(2), &row(12)).unwrap();
        c.set_len(2, 3).unwrap();
        let ty = dtype.block_type().unwrap();
        let stored = |x: &[f32]| {
            let mut bytes = vec![0u8; dtype.row_bytes(x.len())];
            match dtype {
                KvDtype::Q8_0 => rill_kernels::quantize_row_q8_0(x, &mut bytes).unwrap(),
                _ => rill_kernels::quantize_row_q4_0(x, &mut bytes).unwrap(),
            }
            let mut back = vec![0f32; x.len()];
            rill_kernels::dequantize_row(ty, &bytes, &mut back).unwrap();
            back
        };
        let q: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.37).sin()).collect();
        for head in 0..heads {
            let view = c.view(0, 2, head, 3).unwrap();
            for p in 0..3 {
                let key = stored(&row(p))[head * dim..(head + 1) * dim].to_vec();
                let want: f32 = key.iter().zip(&q).map(|(k, q)| k * q).sum();
                let got = view.key_dot(p, &q);
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{dtype} {p}"
                );
                let value = stored(&row(p + 10))[head * dim..(head + 1) * dim].to_vec();
                let mut out = vec![0f32; dim];
                view.value_axpy(p, 2.0, &mut out);
                for (o, v) in out.iter().zip(&value) {
                    assert_eq!(*o, 2.0 * v, "{dtype} value {p}");
                }
            }
        }
    }
}

/// A prefetch of any positions, part and head of every type stays inside the arena (the last
/// row of the last block included) and changes nothing read after it.
#[test]
fn prefetch_covers_every_type_head_and_block_edge() {
    use rill_kernels::attention::CachePart;
    for dtype in KvDtype::ALL {
        let (heads, dim, block) = (2, 32, 4);
        // Every block in use, so the last row read is the arena's last.
        let mut c = KvCache::new(1, heads, dim, 3 * block, block, dtype).unwrap();
        c.add_sequence(1).unwrap();
        c.reserve(1, 3 * block).unwrap();
        for p in 0..3 * block {
            let row: Vec<f32> = (0..heads * dim).map(|i| (i + p) as f32 * 0.25).collect();
            c.write(0, 1, p, &row, &row).unwrap();
        }
        c.set_len(1, 3 * block).unwrap();
        let q: Vec<f32> = (0..dim).map(|i| i as f32).collect();
        for head in 0..heads {
            let view = c.view(0, 1, head, 3 * block).unwrap();
            let before: Vec<f32> = (0..3 * block).map(|p| view.key_dot(p, &q)).collect();
            for (j0, n) in [(0, 3 * block), (block - 1, 2), (2 * block + 1, block - 1)] {
                view.prefetch(j0, n, CachePart::Keys);
                view.prefetch(j0, n, CachePart::Values);
            }
            let after: Vec<f32> = (0..3 * block).map(|p| view.key_dot(p, &q)).collect();
            assert_eq!(before, after, "{dtype}");
        }
    }
}
