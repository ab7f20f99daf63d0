//! The two real models against the exact f32 references in `tests/data/reference/` (computed by
//! independent implementations with `tools/reference/`): dequantization of real tensors,
//! per-position top-1, last-position KL and greedy continuations, on both the exact path and the
//! fast path. Each model is loaded once.

mod reference_check;

use std::sync::OnceLock;

use reference_check::{check_exact, check_fast, data_dir, read_f32, Fixture};
use rill_model::Model;
use serde_json::Value;

fn load(builtin: &str, folder: &str) -> Fixture {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve(builtin, &opts)
        .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull {builtin}`)"));
    let model = Model::load(&path, 0).expect("model loads");
    Fixture::new(model, data_dir().join("reference").join(folder))
}

fn smollm2() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| load("smollm2-135m", "smollm2-135m-instruct-q4_1"))
}

fn gemma3() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| load("gemma3-270m", "gemma3-270m-q4_k_m"))
}

fn check_dequant(f: &Fixture) {
    let model = f.model.lock().unwrap();
    let list: Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("dequant.json")).unwrap()).unwrap();
    let file = model.file();
    for entry in list.as_array().unwrap() {
        let name = entry["tensor"].as_str().unwrap();
        let row_len = entry["row_length"].as_u64().unwrap() as usize;
        let expected = read_f32(&f.dir.join(entry["file"].as_str().unwrap()));
        let info = file.tensor(name).unwrap();
        let ty = rill_kernels::QuantType::from_ggml_id(info.ggml_type.id()).unwrap();
        let row_bytes = ty.row_bytes(row_len).unwrap();
        let mut got = vec![0f32; 2 * row_len];
        let data = file.tensor_data(info);
        for r in 0..2 {
            rill_kernels::dequantize_row(
                ty,
                &data[r * row_bytes..(r + 1) * row_bytes],
                &mut got[r * row_len..(r + 1) * row_len],
            )
            .unwrap();
        }
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() <= 1e-6 * scale, "{name}[{i}]: {a} vs {b}");
        }
    }
}

#[test]
fn smollm2_dequantizes_real_tensors() {
    check_dequant(smollm2());
}

#[test]
fn gemma3_dequantizes_real_tensors() {
    check_dequant(gemma3());
}

#[test]
fn smollm2_exact_path_matches_reference() {
    check_exact(smollm2());
}

#[test]
fn gemma3_exact_path_matches_reference() {
    check_exact(gemma3());
}

#[test]
fn smollm2_fast_path_is_as_close_as_llama_cpp() {
    check_fast(smollm2(), 0.96, 0.0085);
}

#[test]
fn gemma3_fast_path_is_as_close_as_llama_cpp() {
    check_fast(gemma3(), 0.96, 0.006);
}
