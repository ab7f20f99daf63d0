//! What a sampler chain does: its parameters, its stages and their order, and their validation.

use std::fmt;
use std::str::FromStr;

use crate::EngineError;

/// One stage of the sampler chain. Banned tokens and `min_tokens` suppression are applied before
/// every stage; the draw comes after the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Repetition (llama.cpp), presence and frequency (OpenAI) penalties over the last
    /// `repeat_last_n` tokens of the history.
    Penalties,
    /// `logit_bias` added to the logits.
    LogitBias,
    /// The `top_k` most likely tokens.
    TopK,
    /// Locally typical sampling: the tokens whose surprisal is closest to the entropy, up to a
    /// mass of `typical_p`.
    Typical,
    /// Nucleus: the most likely tokens up to a mass of `top_p`.
    TopP,
    /// Tokens at least `min_p` times as likely as the most likely one.
    MinP,
    /// Logits divided by `temperature`; at 0, only the most likely token is kept (greedy).
    Temperature,
}

impl Stage {
    /// The default order (llama.cpp's): penalties, logit bias, top-k, typical, top-p, min-p,
    /// temperature.
    pub const DEFAULT_ORDER: [Stage; 7] = [
        Stage::Penalties,
        Stage::LogitBias,
        Stage::TopK,
        Stage::Typical,
        Stage::TopP,
        Stage::MinP,
        Stage::Temperature,
    ];

    /// The stage's name, as [`Stage::from_str`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Penalties => "penalties",
            Stage::LogitBias => "logit-bias",
            Stage::TopK => "top-k",
            Stage::Typical => "typical",
            Stage::TopP => "top-p",
            Stage::MinP => "min-p",
            Stage::Temperature => "temperature",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Stage {
    type Err = EngineError;

    /// Reads a stage name; `_` and `-` are interchangeable, case is ignored, and `typical-p`,
    /// `bias` and `temp` are accepted too.
    fn from_str(s: &str) -> Result<Stage, EngineError> {
        let name = s.trim().to_ascii_lowercase().replace('_', "-");
        Ok(match name.as_str() {
            "penalties" | "penalty" => Stage::Penalties,
            "logit-bias" | "bias" => Stage::LogitBias,
            "top-k" => Stage::TopK,
            "typical" | "typical-p" => Stage::Typical,
            "top-p" => Stage::TopP,
            "min-p" => Stage::MinP,
            "temperature" | "temp" => Stage::Temperature,
            _ => {
                return Err(EngineError::BadParameter(format!(
                    "unknown sampler stage {s:?} (known: {})",
                    Stage::DEFAULT_ORDER.map(Stage::name).join(", ")
                )))
            }
        })
    }
}

/// How to pick tokens. The default is greedy with every other stage disabled.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, `>= 0`; 0 keeps only the most likely token (greedy).
    pub temperature: f32,
    /// Seed of the chain's generator: the same seed and parameters give the same tokens.
    pub seed: u64,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the most likely tokens up to this probability mass, in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Keep tokens at least `min_p` times as likely as the most likely one, in [0, 1]; 0
    /// disables.
    pub min_p: f32,
    /// Locally typical sampling mass, in (0, 1]; 1 disables.
    pub typical_p: f32,
    /// Repetition penalty (llama.cpp): a positive logit of a token among the last
    /// `repeat_last_n` is divided by it, a negative one multiplied. `> 0`; 1 disables.
    pub repeat_penalty: f32,
    /// How many of the last tokens of the history (prompt and generated) the three penalties
    /// look at; 0 disables them, `usize::MAX` means the whole history.
    pub repeat_last_n: usize,
    /// OpenAI presence penalty, in [-2, 2]: subtracted once from the logit of every token
    /// present in the window.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, in [-2, 2]: subtracted from a token's logit once per occurrence
    /// in the window.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens (a finite value, or `-inf` to forbid the token);
    /// several entries for one token add up.
    pub logit_bias: Vec<(u32, f32)>,
    /// Tokens never produced.
    pub banned_tokens: Vec<u32>,
    /// Order of the stages. Each stage may appear once; a stage whose parameter is not neutral
    /// must appear.
    pub order: Vec<Stage>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            seed: 0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            banned_tokens: Vec::new(),
            order: Stage::DEFAULT_ORDER.to_vec(),
        }
    }
}

fn bad(message: String) -> EngineError {
    EngineError::BadParameter(message)
}

fn in_range(name: &str, v: f32, ok: bool, range: &str) -> Result<(), EngineError> {
    if v.is_nan() {
        return Err(bad(format!("{name} must be a number {range}, got NaN")));
    }
    if !ok {
        return Err(bad(format!("{name} must be {range}, got {v}")));
    }
    Ok(())
}

impl SamplingParams {
    /// Greedy decoding (the default).
    pub fn greedy() -> SamplingParams {
        SamplingParams::default()
    }

    /// Plain sampling at `temperature` from a generator seeded with `seed`, no other stage.
    pub fn with_temperature(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            seed,
            ..SamplingParams::default()
        }
    }

    /// Whether the chain keeps only the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether the penalty stage changes anything.
    pub fn has_penalties(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }

    /// Whether `stage` changes anything with these parameters.
    pub fn is_active(&self, stage: Stage) -> bool {
        match stage {
            Stage::Penalties => self.has_penalties(),
            Stage::LogitBias => !self.logit_bias.is_empty(),
            Stage::TopK => self.top_k > 0,
            Stage::Typical => self.typical_p < 1.0,
            Stage::TopP => self.top_p < 1.0,
            Stage::MinP => self.min_p > 0.0,
            Stage::Temperature => self.temperature != 1.0,
        }
    }

    /// Checks every range (NaN included) and the stage order; token ids are checked by
    /// [`SamplingParams::validate_for_vocab`].
    pub fn validate(&self) -> Result<(), EngineError> {
        let t = self.temperature;
        // A temperature so small that 1/T overflows would turn probabilities into NaN.
        in_range(
            "temperature",
            t,
            t.is_finite() && t >= 0.0 && (t == 0.0 || (1.0 / t).is_finite()),
            "a finite number >= 0 (0 is greedy)",
        )?;
        in_range(
            "top_p",
            self.top_p,
            self.top_p > 0.0 && self.top_p <= 1.0,
            "in (0, 1] (1 disables it)",
        )?;
        in_range(
            "min_p",
            self.min_p,
            (0.0..=1.0).contains(&self.min_p),
            "in [0, 1] (0 disables it)",
        )?;
        in_range(
            "typical_p",
            self.typical_p,
            self.typical_p > 0.0 && self.typical_p <= 1.0,
            "in (0, 1] (1 disables it)",
        )?;
        in_range(
            "repeat_penalty",
            self.repeat_penalty,
            self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0,
            "a finite number > 0 (1 disables it)",
        )?;
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            in_range(
                name,
                v,
                (-2.0..=2.0).contains(&v),
                "in [-2, 2] (0 disables it)",
            )?;
        }
        for &(id, b) in &self.logit_bias {
            if b.is_nan() || b == f32::INFINITY {
                return Err(bad(format!(
                    "logit bias of token {id} must be a finite number or -inf, got {b}"
                )));
            }
        }
        for (i, stage) in self.order.iter().enumerate() {
            if self.order[..i].contains(stage) {
                return Err(bad(format!(
                    "sampler stage {stage} appears twice in the order"
                )));
            }
        }
        for stage in Stage::DEFAULT_ORDER {
            if self.is_active(stage) && !self.order.contains(&stage) {
                return Err(bad(format!(
                    "{} is set but the sampler order has no {stage} stage",
                    match stage {
                        Stage::Penalties => "a penalty",
                        Stage::LogitBias => "a logit bias",
                        Stage::TopK => "top_k",
                        Stage::Typical => "typical_p",
                        Stage::TopP => "top_p",
                        Stage::MinP => "min_p",
                        Stage::Temperature => "a temperature other than 1",
                    }
                )));
            }
        }
        Ok(())
    }

    /// [`SamplingParams::validate`], and every token id (logit bias, banned tokens) inside a
    /// vocabulary of `vocab_size` tokens.
    pub fn validate_for_vocab(&self, vocab_size: usize) -> Result<(), EngineError> {
        self.validate()?;
        let ids = self
            .logit_bias
            .iter()
            .map(|&(id, _)| ("logit_bias", id))
            .chain(self.banned_tokens.iter().map(|&id| ("banned_tokens", id)));
        for (what, id) in ids {
            check_token(what, id, vocab_size)?;
        }
        Ok(())
    }
}

/// `Ok` when `id` is a token of a vocabulary of `vocab_size` tokens.
pub(crate) fn check_token(
    what: &'static str,
    id: u32,
    vocab_size: usize,
) -> Result<(), EngineError> {
    if (id as usize) < vocab_size {
        Ok(())
    } else {
        Err(EngineError::TokenOutOfVocab {
            what,
            token: id,
            vocab_size,
        })
    }
}
