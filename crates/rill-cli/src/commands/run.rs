//! `rill run PROMPT`: one answer, streamed to stdout (the generated text alone); log-probabilities,
//! the finish reason and timings go to stderr. Optionally with speculative decoding (a draft
//! model, the model's own first layers, or prompt lookup), or as a beam search.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};
use rill_constrain::ConstraintSpec;
use rill_engine::{
    check_top_logprobs, BeamParams, DraftSource, Engine, FinishCause, GenerateParams, Generation,
    NgramParams, Precision, SamplingParams, SpeculativeParams, SpeculativeStats, Speculator, Stage,
    TokenEvent, TokenLogprobs,
};
use rill_tokenizer::{ChatMessage, Tokenizer};

use super::sampling_defaults::SamplingDefaults;
use super::ModelArgs;

/// `--speculative KIND`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeculativeKind {
    /// Prompt lookup: draft the tokens that followed the last n-gram earlier in the text.
    Ngram,
    /// The model's own multi-token-prediction block (Qwen3.5 files converted with it).
    Mtp,
}

/// The speculative-decoding flags (shared with `rill bench`). At most one draft.
#[derive(clap::Args, Clone, Debug)]
pub struct SpeculativeArgs {
    /// Speculative decoding with a draft model (built-in name, path or hf: spec) that has
    /// exactly this model's vocabulary.
    #[arg(long, value_name = "MODEL", conflicts_with_all = ["draft_layers", "speculative"])]
    pub draft_model: Option<String>,
    /// Speculative decoding with the model's own first K layers as the draft (self-speculation).
    #[arg(long, value_name = "K", conflicts_with = "speculative")]
    pub draft_layers: Option<usize>,
    /// Speculative decoding without a draft model: `ngram` (prompt lookup) or `mtp` (the
    /// model's own multi-token-prediction block, where the file has one: Qwen3.5).
    #[arg(long, value_name = "KIND")]
    pub speculative: Option<SpeculativeKind>,
    /// Most tokens drafted per round of speculative decoding.
    #[arg(long, value_name = "K", default_value_t = 5)]
    pub draft_tokens: usize,
    /// Draft --draft-tokens every round instead of adapting the length. By default the length
    /// adapts between rounds (two more after all drafts are kept, one fewer after a rejection,
    /// up to --draft-tokens, down to plain decoding for a draft that is seldom right): measured
    /// on benches/prompts, it keeps a poor draft from slowing decoding down (0.67x fixed, 1.09x
    /// adaptive) and gives up at most 8% where every draft is kept.
    #[arg(long, conflicts_with = "adaptive_draft")]
    pub fixed_draft: bool,
    /// Adapt the draft length between rounds: the default (accepted for scripts that ask).
    #[arg(long)]
    pub adaptive_draft: bool,
    /// Prompt lookup: longest n-gram matched (then shorter ones, down to --ngram-min).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub ngram_max: usize,
    /// Prompt lookup: shortest n-gram matched.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub ngram_min: usize,
}

impl SpeculativeArgs {
    /// Whether a draft was asked for.
    pub fn enabled(&self) -> bool {
        self.draft_model.is_some() || self.draft_layers.is_some() || self.speculative.is_some()
    }

    /// The draft parameters, checked (before any model is loaded).
    pub fn params(&self) -> Result<SpeculativeParams> {
        let params = SpeculativeParams {
            draft_tokens: self.draft_tokens,
            adaptive: !self.fixed_draft,
            trace: false,
        };
        params.validate()?;
        self.ngram().validate()?;
        Ok(params)
    }

    fn ngram(&self) -> NgramParams {
        NgramParams {
            max_n: self.ngram_max,
            min_n: self.ngram_min,
        }
    }

    /// The speculator for `engine`, if a draft was asked for (a draft model is fetched and
    /// loaded with `threads` threads, and its vocabulary checked).
    pub fn speculator(&self, engine: &Engine, threads: usize) -> Result<Option<Speculator>> {
        let params = self.params()?;
        let source = if let Some(spec) = &self.draft_model {
            let path = ModelArgs::named(spec, threads).path()?;
            let draft = engine
                .load_draft_model(&path, threads)
                .with_context(|| format!("cannot use {} as a draft model", path.display()))?;
            DraftSource::Model(Box::new(draft))
        } else if let Some(k) = self.draft_layers {
            DraftSource::Layers(k)
        } else if let Some(kind) = self.speculative {
            match kind {
                SpeculativeKind::Ngram => DraftSource::Ngram(self.ngram()),
                SpeculativeKind::Mtp => DraftSource::Mtp,
            }
        } else {
            return Ok(None);
        };
        Ok(Some(Speculator::new(engine, source, params)?))
    }
}

/// One line on speculation: drafted and kept tokens, acceptance by draft position, timings.
pub fn speculative_summary(st: &SpeculativeStats) -> String {
    let by_position: Vec<String> = st
        .acceptance_by_position()
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Some(a) => format!("{}: {:.0}%", i + 1, 100.0 * a),
            None => format!("{}: -", i + 1),
        })
        .collect();
    format!(
        "[speculative decoding ({}, up to {} drafted per round): {} drafted, {} accepted ({:.1}%), \
         {:.2} tokens per pass of the model ({} passes); acceptance by draft position: {}; \
         drafting {:.2} s, verification {:.2} s]",
        st.draft,
        st.draft_tokens,
        st.drafted,
        st.accepted,
        100.0 * st.acceptance_rate(),
        st.tokens_per_round(),
        st.rounds,
        by_position.join(", "),
        st.draft_seconds,
        st.verify_seconds,
    )
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token every time (greedy). Default: the
    /// model file's general.sampling.temp, else 0.8 (llama.cpp's).
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    /// Keep only the K most likely tokens (0: off). Default: the file's, else 40.
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Keep the most likely tokens up to this probability mass, in (0, 1] (1: off). Default: the
    /// file's, else 0.95.
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Keep tokens at least P times as likely as the most likely one, in [0, 1] (0: off).
    /// Default: the file's, else 0.05.
    #[arg(long, value_name = "P")]
    pub min_p: Option<f32>,
    /// Locally typical sampling mass, in (0, 1] (1: off).
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    pub typical_p: f32,
    /// Repetition penalty over the last --repeat-last-n tokens (llama.cpp: positive logits
    /// divided, negative multiplied; 1: off). Default: the file's, else 1.
    #[arg(long, value_name = "R")]
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over (prompt included); 0: off, -1: all of them. Default:
    /// the file's, else 64.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub repeat_last_n: Option<i64>,
    /// OpenAI presence penalty, in [-2, 2].
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "X",
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, in [-2, 2].
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "X",
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// Add BIAS to the logit of token ID (repeatable; -inf forbids the token).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Order of the sampler stages, comma-separated (default:
    /// penalties,logit-bias,top-k,typical,top-p,min-p,temperature).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub sampler_order: Option<Vec<String>>,
    /// Seed of the sampler's random generator (same seed and parameters, same text).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop at this text (repeatable); it is not printed, nor anything after it. `\n`, `\t`,
    /// `\r` and `\\` stand for a newline, a tab, a carriage return and a backslash.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// Stop at this token id (repeatable).
    #[arg(long, value_name = "ID")]
    pub stop_token_id: Vec<u32>,
    /// End-of-generation and stop tokens are not sampled, nor stop strings matched, before this
    /// many tokens.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub min_tokens: usize,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print each token's N most likely alternatives (raw and after the sampler chain) to stderr
    /// (N <= 20).
    #[arg(long, value_name = "N")]
    pub top_logprobs: Option<usize>,
    /// Colour each token by the probability it was drawn with (only when stdout is a terminal).
    #[arg(long)]
    pub show_probs: bool,
    /// Use the prompt as it is, without the model's chat template (the default for a base
    /// model: a file without a chat template whose name says nothing of instruction tuning).
    #[arg(long)]
    pub raw: bool,
    /// Apply a chat template even to a base model (the built-in one its vocabulary suggests).
    #[arg(long, conflicts_with = "raw")]
    pub chat: bool,
    /// A system message for the chat template.
    #[arg(long, conflicts_with = "raw")]
    pub system: Option<String>,
    /// Context size in tokens (default: the prompt plus --max-tokens).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Compute with f32 activations and an f32 KV cache (the reference path; slower).
    #[arg(long)]
    pub exact: bool,
    /// Also print cache reuse, the seed and the sampler settings to stderr at the end.
    #[arg(long)]
    pub stats: bool,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    /// Beam search with W beams (W > 1): the best hypothesis goes to stdout, all W with their
    /// scores to stderr. Deterministic: it does not combine with sampling or stop flags.
    #[arg(long, value_name = "W", default_value_t = 1)]
    pub beam_width: usize,
    /// Beam search: a hypothesis scores logprob / length^ALPHA (above 0 favours longer ones).
    #[arg(
        long,
        value_name = "ALPHA",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub length_penalty: f64,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// Write a reproducibility receipt of the generation to FILE (the model's sha256, rill's
    /// version, the kernel paths, the precision, the prompt's token ids, every parameter with
    /// the seed, the tokens); `rill replay FILE` checks it bit for bit.
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<std::path::PathBuf>,
    /// The prompt (one starting with '-' goes after `--`, so that a mistyped flag is an error,
    /// not a prompt).
    pub prompt: String,
}

/// Structured output: at most one constraint on the answer's text.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(multiple = false)]
pub struct ConstraintArgs {
    /// The answer is JSON matching the JSON Schema in FILE.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// The answer is any JSON object.
    #[arg(long)]
    pub json_object: bool,
    /// The answer follows the grammar in FILE: llama.cpp's GBNF when it defines `root ::=`,
    /// else llguidance's Lark syntax.
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<std::path::PathBuf>,
    /// The answer matches this regular expression (whole).
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
    /// The answer is one of these strings (comma-separated).
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub choice: Option<Vec<String>>,
}

impl ConstraintArgs {
    /// The constraint asked for, its files read and checked for syntax.
    pub fn spec(&self) -> Result<Option<ConstraintSpec>> {
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
        };
        Ok(if let Some(path) = &self.json_schema {
            let text = read(path)?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            Some(ConstraintSpec::JsonSchema(schema))
        } else if self.json_object {
            Some(ConstraintSpec::JsonObject)
        } else if let Some(path) = &self.grammar {
            Some(ConstraintSpec::grammar(&read(path)?))
        } else if let Some(rx) = &self.regex {
            Some(ConstraintSpec::Regex(rx.clone()))
        } else {
            self.choice.clone().map(ConstraintSpec::Choice)
        })
    }

    /// The constraint compiled for `engine`'s vocabulary (within the default limits).
    pub fn compile(&self, engine: &Engine) -> Result<Option<rill_constrain::Grammar>> {
        let Some(spec) = self.spec()? else {
            return Ok(None);
        };
        let constrainer =
            std::sync::Arc::new(rill_constrain::Constrainer::new(engine.tokenizer.clone())?);
        Ok(Some(constrainer.compile_with_timeout(spec)?))
    }
}

/// `ID=BIAS`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("expected ID=BIAS, got {s:?}"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("token id {id:?} is not a non-negative integer"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("bias {bias:?} is not a number"))?;
    Ok((id, bias))
}

impl Args {
    /// The generation parameters, checked (token ids excepted: they need the vocabulary), with
    /// `defaults` where a sampling flag was not given.
    fn generate_params(&self, seed: u64, defaults: &SamplingDefaults) -> Result<GenerateParams> {
        let order = match &self.sampler_order {
            Some(names) => names
                .iter()
                .map(|n| n.parse::<Stage>())
                .collect::<Result<Vec<_>, _>>()?,
            None => Stage::DEFAULT_ORDER.to_vec(),
        };
        let repeat_last_n = match self.repeat_last_n.unwrap_or(defaults.repeat_last_n) {
            -1 => usize::MAX,
            n if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            n => bail!("--repeat-last-n must be >= 0, or -1 for the whole history, got {n}"),
        };
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            seed,
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty.unwrap_or(defaults.repeat_penalty),
            repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
            banned_tokens: Vec::new(),
            order,
        };
        sampling.validate()?;
        if let Some(n) = self.top_logprobs {
            check_top_logprobs(n)?;
        }
        let stop: Vec<String> = self.stop.iter().map(|s| unescape(s)).collect();
        if stop.iter().any(String::is_empty) {
            bail!("--stop needs a non-empty string");
        }
        Ok(GenerateParams {
            max_tokens: self.max_tokens,
            sampling,
            ignore_eos: self.ignore_eos,
            min_tokens: self.min_tokens,
            stop,
            stop_token_ids: self.stop_token_id.clone(),
            top_logprobs: self.top_logprobs,
            prompt_logprobs: false,
            constraint: None,
            thinking_budget: None,
        })
    }
}

impl Args {
    /// Beam search's parameters when `--beam-width` > 1, refusing the flags it cannot honour.
    fn beam_params(&self) -> Result<Option<BeamParams>> {
        if self.beam_width == 0 {
            bail!("--beam-width must be at least 1");
        }
        if self.beam_width == 1 {
            return Ok(None);
        }
        let mut conflicts = Vec::new();
        let mut conflict = |on: bool, flag: &'static str| {
            if on {
                conflicts.push(flag);
            }
        };
        // Given flags that would change a sampled token (the defaults do not apply to a beam).
        conflict(self.temperature.is_some_and(|t| t != 0.0), "--temperature");
        conflict(self.top_k.is_some_and(|k| k != 0), "--top-k");
        conflict(self.top_p.is_some_and(|p| p != 1.0), "--top-p");
        conflict(self.min_p.is_some_and(|p| p != 0.0), "--min-p");
        conflict(self.typical_p != 1.0, "--typical-p");
        conflict(
            self.repeat_penalty.is_some_and(|r| r != 1.0),
            "--repeat-penalty",
        );
        conflict(self.presence_penalty != 0.0, "--presence-penalty");
        conflict(self.frequency_penalty != 0.0, "--frequency-penalty");
        conflict(!self.logit_bias.is_empty(), "--logit-bias");
        conflict(self.sampler_order.is_some(), "--sampler-order");
        conflict(!self.stop.is_empty(), "--stop");
        conflict(!self.stop_token_id.is_empty(), "--stop-token-id");
        conflict(self.min_tokens != 0, "--min-tokens");
        conflict(self.top_logprobs.is_some(), "--top-logprobs");
        conflict(self.show_probs, "--show-probs");
        conflict(self.speculative.enabled(), "speculative decoding");
        if !conflicts.is_empty() {
            bail!(
                "--beam-width {} does not combine with {}: beam search ranks the model's own \
                 log-probabilities",
                self.beam_width,
                conflicts.join(", ")
            );
        }
        let params = BeamParams {
            width: self.beam_width,
            max_tokens: self.max_tokens,
            length_penalty: self.length_penalty,
            ignore_eos: self.ignore_eos,
            trace: false,
            ..BeamParams::default()
        };
        params.validate()?;
        Ok(Some(params))
    }
}

pub fn main(args: Args) -> Result<()> {
    let seed = args.seed.unwrap_or_else(random_seed);
    // Bad options fail before the model is loaded (checked with llama.cpp's defaults; the file's
    // are checked once it is read).
    args.generate_params(seed, &SamplingDefaults::LLAMA_CPP)?;
    let beam = args.beam_params()?;
    if args.speculative.enabled() {
        args.speculative.params()?;
    }
    args.constraint.spec()?;
    if args.receipt.is_some()
        && (beam.is_some() || args.speculative.enabled() || args.constraint.spec()?.is_some())
    {
        bail!("--receipt records plain generations: not with beam search, speculative decoding or a constraint");
    }
    let precision = if args.exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let mut engine = args.model.load(precision)?;
    let defaults = SamplingDefaults::from_metadata(engine.model.file().metadata());
    let mut params = args.generate_params(seed, &defaults)?;
    params.validate(engine.model.config().vocab_size)?;
    params.constraint = args.constraint.compile(&engine)?;
    let base = super::template_choice::looks_like_base_model(engine.model.file().metadata());
    let raw = args.raw || (base && !args.chat && args.system.is_none());
    let template = super::template_choice::template_note(&engine.tokenizer, args.raw, raw);
    let prompt_tokens = if raw {
        engine
            .tokenizer
            .encode_with_special(&args.prompt, true, false)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        engine.chat_prompt(&messages)?
    };
    if let Some(beam) = beam {
        return run_beam(
            &mut engine,
            &prompt_tokens,
            &beam,
            params.constraint.as_ref(),
        );
    }
    let mut speculator = args.speculative.speculator(&engine, args.model.threads)?;
    let context = args
        .ctx_size
        .unwrap_or(prompt_tokens.len().saturating_add(args.max_tokens));
    let mut session = engine.new_session(context)?;
    let colour = args.show_probs && std::io::stdout().is_terminal();
    // The callback cannot borrow the tokenizer while generation holds the engine: the token
    // texts it prints come from a table, built only when asked for.
    let texts: Vec<String> = if params.top_logprobs.is_some() {
        (0..engine.model.config().vocab_size as u32)
            .map(|id| token_text(&engine.tokenizer, id))
            .collect()
    } else {
        Vec::new()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Ctrl-C stops the answer (finish `cancelled`, the end line still printed).
    let interrupts = super::interrupt::Interrupts::install();
    let generating = interrupts.generating();
    let on_token = |event: &TokenEvent<'_>| {
        if let Some(lp) = event.logprobs {
            print_logprobs(&texts, event, lp);
        }
        // A closed stdout (e.g. piped into `head`) cancels generation instead of failing.
        let written = if colour && !event.text.is_empty() {
            write!(
                out,
                "\x1b[{}m{}\x1b[0m",
                colour_code(event.probability),
                event.text
            )
        } else {
            out.write_all(event.text.as_bytes())
        };
        written.is_ok() && out.flush().is_ok() && !generating.interrupted(!event.text.is_empty())
    };
    let generation = match &mut speculator {
        Some(sp) => {
            session.generate_speculative(&mut engine, sp, &prompt_tokens, &params, on_token)?
        }
        None => session.generate(&mut engine, &prompt_tokens, &params, on_token)?,
    };
    drop(generating);
    drop(interrupts);
    let _ = writeln!(out);
    drop(out);
    if colour {
        eprintln!(
            "[colours: \x1b[32mp >= 0.8\x1b[0m \x1b[36m>= 0.5\x1b[0m \x1b[33m>= 0.2\x1b[0m \x1b[35m>= 0.05\x1b[0m \x1b[31m< 0.05\x1b[0m]"
        );
    }
    let head = engine.model.head_stats();
    print_summary(
        &args,
        &engine.tokenizer,
        (&generation, &head),
        &params,
        &defaults,
        &template,
    );
    if let Some(path) = &args.receipt {
        super::replay::write(
            path,
            &args.model.path()?,
            precision,
            engine.model.kv_types(precision),
            &prompt_tokens,
            &params,
            &generation,
        )?;
        eprintln!(
            "[receipt written to {}: `rill replay {}` checks it]",
            path.display(),
            path.display()
        );
    }
    if let Some(st) = &generation.speculative {
        eprintln!("{}", speculative_summary(st));
    }
    Ok(())
}

/// A beam search: the best hypothesis's text on stdout, every hypothesis with its score on
/// stderr, then the search's statistics.
fn run_beam(
    engine: &mut Engine,
    prompt: &[u32],
    params: &BeamParams,
    constraint: Option<&rill_constrain::Grammar>,
) -> Result<()> {
    let output = engine.beam_search_constrained(prompt, params, constraint, |_| true)?;
    let best = output.hypotheses.first().map_or("", |h| h.text.as_str());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{best}");
    drop(out);
    for (i, h) in output.hypotheses.iter().enumerate() {
        eprintln!(
            "[beam {}] score {:.4} (logprob {:.4}, {} tokens, finish: {}) {:?}",
            i + 1,
            h.score,
            h.cumulative_logprob,
            h.tokens.len(),
            h.finish_reason.as_str(),
            h.text
        );
    }
    eprintln!(
        "[{} prompt tokens in {:.2} s, beam search of width {} (length penalty {}): {} steps, \
         {} forward passes in {:.2} s, ended: {}]",
        output.prompt_tokens,
        output.prefill_seconds,
        params.width,
        params.length_penalty,
        output.steps,
        output.forward_passes,
        output.search_seconds,
        format!("{:?}", output.stop).to_lowercase()
    );
    Ok(())
}

/// ANSI foreground colour for a probability.
fn colour_code(p: f32) -> u8 {
    match p {
        p if p >= 0.8 => 32,
        p if p >= 0.5 => 36,
        p if p >= 0.2 => 33,
        p if p >= 0.05 => 35,
        _ => 31,
    }
}

/// A token's text, quoted and escaped (control tokens by name).
fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    match tokenizer.token_to_bytes(id, true) {
        Ok(bytes) => format!("{:?}", String::from_utf8_lossy(&bytes)),
        Err(_) => format!("<{id}>"),
    }
}

/// One token's log-probabilities on stderr: the token, then the raw alternatives with what the
/// sampler chain made of them (`removed`: the chain cut it).
fn print_logprobs(texts: &[String], event: &TokenEvent<'_>, lp: &TokenLogprobs) {
    let text = |id: u32| {
        texts
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| format!("<{id}>"))
    };
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "[{}] {} (id {}): p {:.4}, logprob {:.4} (raw {:.4}), entropy {:.3} nats (raw {:.3})",
        event.index,
        text(lp.token),
        lp.token,
        event.probability,
        lp.logprob,
        lp.raw_logprob,
        lp.entropy,
        lp.raw_entropy
    );
    // The processed list holds every surviving token when it is shorter than asked.
    let complete = lp.top.len() < lp.raw_top.len();
    for &(id, raw) in &lp.raw_top {
        let after = match lp.top.iter().find(|t| t.0 == id) {
            Some(&(_, l)) => format!("{l:.4}"),
            None if complete => "removed".into(),
            None => "-".into(),
        };
        let _ = writeln!(
            err,
            "    {:>20} {id:>7}  raw {raw:>9.4}  sampled {after}",
            text(id)
        );
    }
    for &(id, l) in lp
        .top
        .iter()
        .filter(|t| !lp.raw_top.iter().any(|r| r.0 == t.0))
    {
        let _ = writeln!(
            err,
            "    {:>20} {id:>7}  raw {:>9}  sampled {l:.4}",
            text(id),
            "-"
        );
    }
}

/// The finish reason and timings on stderr.
fn print_summary(
    args: &Args,
    tokenizer: &Tokenizer,
    (g, head): (&Generation, &rill_model::HeadStats),
    params: &GenerateParams,
    defaults: &SamplingDefaults,
    template: &str,
) {
    let finish = match &g.finish {
        FinishCause::EndOfGeneration(t) | FinishCause::StopToken(t) => {
            format!("{} {}", g.finish, token_text(tokenizer, *t))
        }
        other => other.to_string(),
    };
    let mut line = format!(
        "[{} prompt tokens in {:.2} s ({:.1} tok/s), {} generated in {:.2} s ({:.1} tok/s), finish: {} ({finish})",
        g.prompt_tokens_computed,
        g.prefill_seconds,
        g.prefill_tokens_per_second(),
        g.tokens.len(),
        g.decode_seconds,
        g.decode_tokens_per_second(),
        g.finish_reason.as_str(),
    );
    if args.stats {
        line.push_str(&format!(
            ", {} prompt tokens reused from the cache, kernels: {}, output head: {} of {} rows \
             in two passes ({:.2}% of the vocabulary refined)",
            g.prompt_tokens_reused,
            super::kernel_paths(),
            head.rows,
            head.rows + head.full_rows,
            head.refined_share() * 100.0
        ));
    }
    if let Some(grammar) = &params.constraint {
        line.push_str(&format!(
            ", constrained by a {} ({} tokens forced)",
            grammar.kind(),
            g.forced_tokens
        ));
    }
    let s = &params.sampling;
    if s.temperature > 0.0 {
        line.push_str(&format!(
            ", seed {}, temperature {} top-k {} top-p {} min-p {}",
            s.seed, s.temperature, s.top_k, s.top_p, s.min_p
        ));
        let given = [
            args.temperature.is_some(),
            args.top_k.is_some(),
            args.top_p.is_some(),
            args.min_p.is_some(),
        ];
        if given.contains(&false) {
            line.push_str(&format!(" (defaults: {}'s)", defaults.source));
        }
    }
    line.push_str(&format!(", {template}"));
    line.push(']');
    eprintln!("{line}");
    if matches!(g.finish, FinishCause::ContextFull { .. }) {
        eprintln!("(the context is full: raise --ctx-size to generate more)");
    }
}

/// A seed from the clock, for runs that did not ask for one.
pub fn random_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// `\n`, `\t`, `\r` and `\\` in a `--stop` string stand for a newline, a tab, a carriage return
/// and a backslash; any other backslash is kept as it is.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_escapes_and_logit_bias_parse() {
        assert_eq!(unescape(r"a\n\nb\t\\x\q\"), "a\n\nb\t\\x\\q\\");
        assert_eq!(parse_logit_bias("15=-2.5"), Ok((15, -2.5)));
        assert_eq!(parse_logit_bias("3=-inf"), Ok((3, f32::NEG_INFINITY)));
        assert!(parse_logit_bias("x=1").is_err());
        assert!(parse_logit_bias("1").is_err());
        assert!(parse_logit_bias("1=big").is_err());
    }
}
