//! Weight quantization against llama.cpp's reference (`gguf` Python package) on random rows
//! (`tools/reference/quantize_vectors.py`): the bytes are ggml's, bit for bit.

use rill_kernels::QuantType;

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/data/reference/quantize"
);

fn check(
    name: &str,
    ty: QuantType,
    quantize: fn(&[f32], &mut [u8]) -> Result<(), rill_kernels::KernelError>,
) {
    let read = |ext: &str| {
        std::fs::read(format!("{DIR}/{name}.{ext}")).unwrap_or_else(|e| {
            panic!("{DIR}/{name}.{ext} not readable ({e}): the reference data is required")
        })
    };
    let x: Vec<f32> = read("f32")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let expected = read("bin");
    let cols = 512;
    let row = ty.row_bytes(cols).unwrap();
    assert_eq!(expected.len(), x.len() / cols * row);
    for (r, (xr, want)) in x.chunks(cols).zip(expected.chunks(row)).enumerate() {
        let mut got = vec![0u8; row];
        quantize(xr, &mut got).unwrap();
        assert_eq!(got, want, "{name} row {r}");
    }
}

#[test]
fn q4_0_matches_ggml() {
    check("Q4_0", QuantType::Q4_0, rill_kernels::quantize_row_q4_0);
}

#[test]
fn q5_0_matches_ggml() {
    check("Q5_0", QuantType::Q5_0, rill_kernels::quantize_row_q5_0);
}
