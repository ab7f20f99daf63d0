//! Every quant type on a real model file: the `qwen2-q256` tiny model (every row a multiple of
//! 256) quantized by llama.cpp's own `llama-quantize` to each type (`tools/models/quantize_tiny.py`,
//! `tests/data/tiny-quant/<TYPE>/`), against references from transformers in f32 on gguf-py's
//! dequantization of that file. The exact path must match as on the real models. The fast path's
//! mean last-position KL is printed next to llama.cpp's own on the same file and prompts
//! (`llama_cpp.json`, from `llama-server`) and held to a sanity bar only: on this model rill's
//! fast path is worse than llama.cpp's for about half of the types (four prompts each, so the
//! means are noisy), which is reported, not hidden behind a tolerance, and still open.

mod reference_check;

use reference_check::{check_exact, check_fast, data_dir, Fixture};
use rill_model::Model;

fn check(ty: &str) {
    let dir = data_dir().join("tiny-quant").join(ty);
    let model = Model::load(dir.join("model.gguf"), 2)
        .unwrap_or_else(|e| panic!("{ty}: the model does not load: {e}"));
    let f = Fixture::new(model, dir.clone());
    check_exact(&f);
    let llama: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("llama_cpp.json")).unwrap())
            .unwrap();
    let llama_kl = llama["mean_kl"].as_f64().unwrap();
    // Not broken: llama.cpp's own worst type here (IQ1_M) is at 0.065.
    let (agreement, mean_kl) = check_fast(&f, 0.85, 0.1);
    let verdict = if mean_kl <= llama_kl {
        "better"
    } else {
        "WORSE"
    };
    eprintln!(
        "{ty}: fast path mean KL {mean_kl:.5}, llama.cpp {llama_kl:.5} ({verdict}), top-1 agreement {agreement:.3}"
    );
}

macro_rules! types {
    ($($name:ident => $ty:literal;)*) => {$(
        #[test]
        fn $name() {
            check($ty);
        }
    )*};
}

types! {
    q4_0 => "Q4_0";
    q4_1 => "Q4_1";
    q5_0 => "Q5_0";
    q5_1 => "Q5_1";
    q8_0 => "Q8_0";
    q2_k => "Q2_K";
    q3_k => "Q3_K";
    q4_k => "Q4_K";
    q5_k => "Q5_K";
    q6_k => "Q6_K";
    iq4_nl => "IQ4_NL";
    iq4_xs => "IQ4_XS";
    iq3_xxs => "IQ3_XXS";
    iq3_s => "IQ3_S";
    iq2_xxs => "IQ2_XXS";
    iq2_xs => "IQ2_XS";
    iq2_s => "IQ2_S";
    iq1_s => "IQ1_S";
    iq1_m => "IQ1_M";
    tq1_0 => "TQ1_0";
    tq2_0 => "TQ2_0";
}
