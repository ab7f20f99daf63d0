//! Dequantization against llama.cpp's reference (`gguf` Python package) on random blocks.

use rill_kernels::{dequantize_row, QuantType};
use std::path::Path;

/// Made by `tools/reference/` with the `gguf` Python package.
const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/data/reference/dequant"
);

#[test]
fn dequant_matches_reference_vectors() {
    let dir = Path::new(DIR);
    let index = match std::fs::read_to_string(dir.join("index.json")) {
        Ok(s) => s,
        Err(e) => panic!("{DIR}/index.json not readable ({e}): the reference data is required"),
    };
    let index: serde_json::Value = serde_json::from_str(&index).expect("index.json parses");
    let cases = index["cases"].as_array().expect("cases array");
    assert!(cases.len() >= 24, "expected the 24 documented cases");
    for case in cases {
        let name = case["type"].as_str().unwrap();
        let ty = QuantType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
        assert_eq!(
            case["block_elements"].as_u64().unwrap() as usize,
            ty.block_size(),
            "{name}"
        );
        assert_eq!(
            case["block_bytes"].as_u64().unwrap() as usize,
            ty.block_bytes(),
            "{name}"
        );
        let n = case["elements"].as_u64().unwrap() as usize;
        let raw = std::fs::read(dir.join(case["raw"].as_str().unwrap())).unwrap();
        let exp_bytes = std::fs::read(dir.join(case["f32"].as_str().unwrap())).unwrap();
        let expected: Vec<f32> = exp_bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(expected.len(), n, "{name}");
        assert_eq!(Some(raw.len()), ty.row_bytes(n), "{name}");
        let mut got = vec![0f32; n];
        dequantize_row(ty, &raw, &mut got).unwrap();
        let maxmag = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        let tol = 1e-6 * maxmag;
        let mut worst = 0f32;
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            let err = (g - e).abs();
            worst = worst.max(err);
            assert!(err <= tol, "{name}[{i}]: got {g}, expected {e} (tol {tol})");
        }
        eprintln!("{name}: {n} elements, max err {worst:e} (max magnitude {maxmag})");
    }
}

#[test]
fn dequant_rejects_bad_lengths() {
    let mut out = vec![0f32; 32];
    assert!(dequantize_row(QuantType::Q4_0, &[0u8; 17], &mut out).is_err());
    let mut out = vec![0f32; 33];
    assert!(dequantize_row(QuantType::Q4_0, &[0u8; 18], &mut out).is_err());
    let mut out = vec![0f32; 256];
    assert!(dequantize_row(QuantType::Q4_K, &[0u8; 143], &mut out).is_err());
    assert!(dequantize_row(QuantType::Q4_K, &[0u8; 144], &mut out).is_ok());
}

#[test]
fn ggml_ids_round_trip() {
    for ty in QuantType::ALL {
        assert_eq!(QuantType::from_ggml_id(ty.ggml_id()), Some(ty));
        assert_eq!(QuantType::from_name(ty.name()), Some(ty));
    }
    assert_eq!(QuantType::from_ggml_id(4), None);
    assert_eq!(QuantType::from_ggml_id(30), Some(QuantType::BF16));
    assert_eq!(QuantType::Q4_K.row_bytes(512), Some(288));
    assert_eq!(QuantType::Q4_K.row_bytes(500), None);
    assert_eq!(QuantType::Q8_K.block_bytes(), 292);
    assert_eq!(QuantType::F32.row_bytes(usize::MAX), None);
}
