//! Every quant type on a real model file: the `qwen2-q256` tiny model (every row a multiple of
//! 256) quantized by llama.cpp's own `llama-quantize` to each type (`tools/models/quantize_tiny.py`,
//! `tests/data/tiny-quant/<TYPE>/`), against references from transformers in f32 on gguf-py's
//! dequantization of that file. The exact path must match as on the real models.
//!
//! The fast path is compared with llama.cpp on the same file over 96 more prompts per type
//! (`kl_cases.json`, `tools/models/kl_cases.py`), prompt by prompt: a prompt's last-position KL
//! spans two orders of magnitude on these random models, and the four reference prompts alone
//! cannot rank two engines (their means swing by tens of percent with the choice of prompts).

mod reference_check;

use reference_check::{
    argmax, check_exact, check_fast, data_dir, ids, kl, read_f32, run_case, Fixture,
};
use rill_model::{Model, Precision};

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
    eprintln!(
        "{ty}: fast path mean KL {mean_kl:.5}, llama.cpp {llama_kl:.5} over the 4 reference prompts, top-1 agreement {agreement:.3}"
    );
    compare_with_llama_cpp(ty, &f);
}

/// The fast path against llama.cpp on the same file, prompt by prompt, over the many prompts of
/// `kl_cases.json` (`tools/models/kl_cases.py`): each prompt's last-position KL from the
/// reference, for both engines. The engines are compared through the per-prompt differences
/// (paired): rill's mean may not exceed llama.cpp's by three standard errors of the mean
/// difference. Both engines quantize the layers' activations the same way (rill refines the
/// head's for the 32-element block types) and differ in rounding noise, so "no worse" can only
/// be a statistical statement; three standard errors keep the
/// chance that one of the 22 types fails by noise alone near 3% (one-sided 0.13% each).
/// Measured when the data was made: rill's mean is the lower on 12 types; the largest excess is
/// IQ3_XXS's, +0.0020 ± 0.0009.
fn compare_with_llama_cpp(ty: &str, f: &Fixture) -> (Vec<bool>, Vec<bool>, usize) {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.join("kl_cases.json")).unwrap())
            .unwrap();
    let vocab = doc["vocab"].as_u64().unwrap() as usize;
    let logits = read_f32(&f.dir.join("kl_cases.last_logits.f32"));
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(logits.len(), cases.len() * vocab);
    let mut model = f.model.lock().unwrap();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut top1_each, mut top1_llama_each) = (Vec::new(), Vec::new());
    for (case, reference) in cases.iter().zip(logits.chunks_exact(vocab)) {
        let (_, last, _) = run_case(&mut model, &ids(&case["token_ids"]), Precision::Fast, 0);
        ours.push(kl(reference, &last));
        theirs.push(case["llama_cpp_kl"].as_f64().unwrap());
        top1_each.push(argmax(&last) == argmax(reference));
        top1_llama_each.push(case["llama_cpp_top1_same"].as_bool().unwrap());
    }
    let top1 = top1_each.iter().filter(|&&x| x).count();
    let top1_llama = top1_llama_each.iter().filter(|&&x| x).count();
    let n = ours.len() as f64;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let diffs: Vec<f64> = ours.iter().zip(&theirs).map(|(a, b)| a - b).collect();
    let d = mean(&diffs);
    let se = (diffs.iter().map(|x| (x - d).powi(2)).sum::<f64>() / (n - 1.0) / n).sqrt();
    let better = ours.iter().zip(&theirs).filter(|(a, b)| a < b).count();
    eprintln!(
        "{ty}: {} prompts: mean KL rill {:.5}, llama.cpp {:.5}; rill - llama.cpp {d:+.5} ± {se:.5} (SE); \
         rill lower on {better}; top-1 rill {top1}, llama.cpp {top1_llama}",
        ours.len(),
        mean(&ours),
        mean(&theirs)
    );
    assert!(
        d <= 3.0 * se,
        "{ty}: the fast path's KL is higher than llama.cpp's by {d:.5} ± {se:.5} on the same prompts"
    );
    let n = top1_each.len();
    (top1_each, top1_llama_each, n)
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
    mxfp4 => "MXFP4";
}

/// The 2026 architectures quantized by llama-quantize (the hybrids `qwen35-q256`, `lfm2-q256`
/// and `gemma4-q256`: every matrix row a multiple of 256; the recurrent layers' small tensors
/// stay F32 as llama-quantize keeps them): the exact path against transformers on gguf-py's dequantization, the fast path
/// held to the same bars as the other types and, over the 96 prompts, to llama.cpp's own KL.
fn check_hybrid(folder: &str) {
    let dir = data_dir().join("tiny-quant").join(folder);
    let model = Model::load(dir.join("model.gguf"), 2)
        .unwrap_or_else(|e| panic!("{folder}: the model does not load: {e}"));
    let f = Fixture::new(model, dir.clone());
    check_exact(&f);
    // Top-1 over the 111 positions of the 4 reference prompts is not held to a fixed bar here:
    // these references have many near-ties (qwen35-q256-Q4_0 flips 15 to 17 of 111 positions
    // by the CPU path, at reference gaps from 0.013, for the same KL), so the fast path's top-1
    // is held to llama.cpp's on the same file over 96 prompts instead (below), with its KL.
    let (agreement, mean_kl) = check_fast(&f, 0.0, 0.1);
    let llama = std::fs::read_to_string(dir.join("llama_cpp.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["mean_kl"].as_f64());
    eprintln!(
        "{folder}: fast path mean KL {mean_kl:.5}, llama.cpp {llama:?} over the 4 reference prompts, top-1 agreement {agreement:.3}"
    );
    let (top1, top1_llama, n) = compare_with_llama_cpp(folder, &f);
    // Paired: per prompt, whether each engine keeps the reference's top token; rill may not
    // fall below llama.cpp by three standard errors of the mean difference.
    let (d, se) = top1_difference(&top1, &top1_llama);
    eprintln!("{folder}: top-1 at the last position over {n} prompts: rill - llama.cpp {d:+.4} ± {se:.4} (SE)");
    assert!(
        d >= -3.0 * se.max(0.5 / n as f64),
        "{folder}: the fast path keeps the top token less often than llama.cpp ({d:+.4} ± {se:.4})"
    );
}

/// The mean and standard error of the per-prompt difference of two 0/1 outcomes.
fn top1_difference(ours: &[bool], theirs: &[bool]) -> (f64, f64) {
    let n = ours.len() as f64;
    let diffs: Vec<f64> = ours
        .iter()
        .zip(theirs)
        .map(|(&a, &b)| f64::from(u8::from(a)) - f64::from(u8::from(b)))
        .collect();
    let d = diffs.iter().sum::<f64>() / n;
    let se = (diffs.iter().map(|x| (x - d).powi(2)).sum::<f64>() / (n - 1.0) / n).sqrt();
    (d, se)
}

macro_rules! hybrids {
    ($($name:ident => $folder:literal;)*) => {$(
        #[test]
        fn $name() {
            check_hybrid($folder);
        }
    )*};
}

hybrids! {
    qwen35_q8_0 => "qwen35-q256-Q8_0";
    qwen35_q4_0 => "qwen35-q256-Q4_0";
    qwen35_q4_k => "qwen35-q256-Q4_K";
    lfm2_q8_0 => "lfm2-q256-Q8_0";
    lfm2_q4_0 => "lfm2-q256-Q4_0";
    lfm2_q4_k => "lfm2-q256-Q4_K";
    gemma4_q8_0 => "gemma4-q256-Q8_0";
    gemma4_q4_0 => "gemma4-q256-Q4_0";
    gemma4_q4_k => "gemma4-q256-Q4_K";
}
