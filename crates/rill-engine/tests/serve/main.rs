//! The serving loop on tiny synthetic models (and one test on SmolLM2): batched requests give
//! exactly what each gives alone through `Session::generate`, however they are batched,
//! chunked, cached or preempted; cancellation, backpressure, `n` choices, shutdown and block
//! accounting.

use rill_engine::{
    spawn, Engine, FinishCause, GenerateParams, Generation, KvStats, PickRule, Precision,
    ResponseStream, SamplingParams, ServeConfig, ServeEvent, ServeHandle, ServeRequest,
    SubmitError, TokenDetail, TokenLogprobs, Trace,
};
use rill_model::synthetic::SyntheticSpec;

#[path = "../common/mod.rs"]
mod common;
use common::{greedy, load_synthetic, prompt, sampled};

fn tiny() -> Engine {
    load_synthetic(&SyntheticSpec::llama_tiny().build().unwrap())
}

/// Bytes of one KV block of the tiny llama (f16, 16 positions).
fn block_bytes(e: &Engine) -> usize {
    let c = e.model.config();
    2 * c.n_layers * c.n_kv_heads * c.head_dim * 2 * 16
}

fn config() -> ServeConfig {
    ServeConfig {
        kv_cache_bytes: 4 << 20,
        max_batch_tokens: 64,
        max_running: 16,
        max_queue: 64,
        ..ServeConfig::default()
    }
}

fn serve(config: ServeConfig) -> ServeHandle {
    spawn(tiny(), config).unwrap()
}

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

#[derive(Debug, Default, Clone, PartialEq)]
struct Choice {
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishCause>,
    logprobs: Vec<TokenLogprobs>,
    details: Vec<TokenDetail>,
}

#[derive(Debug, Default)]
struct Outcome {
    choices: Vec<Choice>,
    /// (prompt, completion, cached prompt) tokens.
    usage: Option<(usize, usize, usize)>,
    error: Option<String>,
}

/// Reads a stream to its end, checking the protocol: a choice's tokens, then its `Done`; `Usage`
/// once every choice is done; nothing after.
fn collect(stream: &mut ResponseStream, n: usize) -> Outcome {
    let out = Outcome {
        choices: vec![Choice::default(); n],
        ..Outcome::default()
    };
    collect_into(out, stream)
}

/// [`collect`] for a one-choice stream whose first event was already received.
fn collect_after(first: ServeEvent, stream: &mut ResponseStream) -> Outcome {
    let mut out = Outcome {
        choices: vec![Choice::default()],
        ..Outcome::default()
    };
    apply(&mut out, first);
    collect_into(out, stream)
}

/// The rest of `stream` applied to `out`, which must end with Usage or Error.
fn collect_into(mut out: Outcome, stream: &mut ResponseStream) -> Outcome {
    while let Some(event) = stream.blocking_recv() {
        assert!(
            out.usage.is_none() && out.error.is_none(),
            "event after the end: {event:?}"
        );
        apply(&mut out, event);
    }
    assert!(
        out.usage.is_some() || out.error.is_some(),
        "stream ended without Usage or Error"
    );
    assert!(stream.blocking_recv().is_none());
    out
}

fn apply(out: &mut Outcome, event: ServeEvent) {
    match event {
        ServeEvent::Token {
            choice,
            token,
            text,
            logprobs,
            detail,
        } => {
            let c = &mut out.choices[choice];
            assert!(c.finish.is_none(), "token after Done");
            c.tokens.push(token);
            c.text.push_str(&text);
            c.logprobs.extend(logprobs);
            c.details.extend(detail.map(|d| *d));
        }
        ServeEvent::Done {
            choice,
            finish_reason,
            cause,
        } => {
            let c = &mut out.choices[choice];
            assert!(c.finish.is_none(), "two Done events for one choice");
            assert_eq!(finish_reason, cause.reason());
            c.finish = Some(cause);
        }
        ServeEvent::Usage {
            prompt_tokens,
            completion_tokens,
            cached_prompt_tokens,
        } => {
            assert!(
                out.choices.iter().all(|c| c.finish.is_some()),
                "Usage before every Done"
            );
            let generated: usize = out.choices.iter().map(|c| c.tokens.len()).sum();
            assert_eq!(completion_tokens, generated);
            out.usage = Some((prompt_tokens, completion_tokens, cached_prompt_tokens));
        }
        ServeEvent::Error { message } => out.error = Some(message),
    }
}

fn run(h: &ServeHandle, prompt: &[u32], params: &GenerateParams) -> Outcome {
    let mut s = h
        .submit(ServeRequest::new(prompt.to_vec(), params.clone()))
        .unwrap();
    collect(&mut s, 1)
}

/// What `Session::generate` gives alone, in a fresh session.
/// Every request submitted at once (before any is read).
fn submit_all(h: &ServeHandle, requests: &[(Vec<u32>, GenerateParams)]) -> Vec<ResponseStream> {
    requests
        .iter()
        .map(|(p, params)| {
            h.submit(ServeRequest::new(p.clone(), params.clone()))
                .unwrap()
        })
        .collect()
}

fn reference(e: &mut Engine, prompt: &[u32], params: &GenerateParams) -> Generation {
    let mut s = e.new_session(256).unwrap();
    s.generate(e, prompt, params, |_| true).unwrap()
}

fn assert_same(got: &Choice, want: &Generation, what: &str) {
    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
    assert_eq!(got.text, want.text, "{what}: text");
    assert_eq!(got.finish.as_ref(), Some(&want.finish), "{what}: finish");
    assert_eq!(got.logprobs, want.logprobs, "{what}: logprobs");
}

/// The KV statistics at the end of a loop iteration that began after this call: whatever the
/// streams have reported (and every stream dropped) before it is reflected.
fn settled(h: &ServeHandle) -> KvStats {
    h.next_step().unwrap().blocking_recv().unwrap()
}

/// Lets a paused loop run one iteration (one step, with work).
fn step(h: &ServeHandle) -> KvStats {
    settled(h)
}

fn metric(h: &ServeHandle, name: &str) -> f64 {
    let text = h.render_prometheus();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

mod batching;
mod control;
mod explain_and_jobs;
mod prompt_lookup;
