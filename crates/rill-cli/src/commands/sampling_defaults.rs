//! What `rill run` and `rill chat` sample with when a flag is not given: the model file's own
//! recommendation (`general.sampling.*`, written by llama.cpp's converter from a model's
//! generation config), else llama.cpp's defaults, which keep a small model from the loops greedy
//! decoding falls into.

use rill_gguf::Metadata;

/// Default sampler settings, and where they came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: i64,
    /// "the model file" when any value came from `general.sampling.*`, else "llama.cpp".
    pub source: &'static str,
}

impl SamplingDefaults {
    /// llama.cpp's (`common_params_sampling`): temperature 0.8, top-k 40, top-p 0.95,
    /// min-p 0.05, no repetition penalty over the last 64 tokens.
    pub const LLAMA_CPP: SamplingDefaults = SamplingDefaults {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        source: "llama.cpp",
    };

    /// The file's `general.sampling.{temp,top_k,top_p,min_p,penalty_repeat,penalty_last_n}`,
    /// each falling back to llama.cpp's. Values of the wrong type or out of range are ignored.
    pub fn from_metadata(meta: &Metadata) -> SamplingDefaults {
        let mut d = SamplingDefaults::LLAMA_CPP;
        let mut found = false;
        let f = |k: &str| {
            meta.get_f64(&format!("general.sampling.{k}"))
                .ok()
                .flatten()
        };
        let i = |k: &str| {
            meta.get(&format!("general.sampling.{k}"))
                .and_then(|v| v.as_i64())
        };
        let mut take = |slot: &mut f32, v: Option<f64>, ok: fn(f64) -> bool| {
            if let Some(v) = v.filter(|v| v.is_finite() && ok(*v)) {
                *slot = v as f32;
                found = true;
            }
        };
        take(&mut d.temperature, f("temp"), |v| v >= 0.0);
        take(&mut d.top_p, f("top_p"), |v| v > 0.0 && v <= 1.0);
        take(&mut d.min_p, f("min_p"), |v| (0.0..=1.0).contains(&v));
        take(&mut d.repeat_penalty, f("penalty_repeat"), |v| v > 0.0);
        if let Some(k) = i("top_k").and_then(|k| usize::try_from(k).ok()) {
            d.top_k = k;
            found = true;
        }
        if let Some(n) = i("penalty_last_n").filter(|&n| n >= -1) {
            d.repeat_last_n = n;
            found = true;
        }
        if found {
            d.source = "the model file";
        }
        d
    }
}
