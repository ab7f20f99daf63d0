//! The serving loop with a sliding-window model: the window layers get an arena of about one
//! window per running sequence, far smaller than the global layers', and requests many windows
//! long still give exactly what each gives alone, batched, chunked, preempted and through the
//! prefix cache (a conversation's next turn starts from its whole history).

use rill_engine::{
    spawn, split_kv_budget, Engine, GenerateParams, SamplingParams, ServeConfig, ServeEvent,
    ServeHandle, ServeRequest,
};
use rill_model::synthetic::SyntheticSpec;

mod common;
use common::{load_synthetic, prompt};

const WINDOW: usize = 16;

fn windowed_engine() -> Engine {
    let mut spec = SyntheticSpec::gemma3_tiny();
    spec.context_length = 1024;
    spec.sliding_window = Some(WINDOW);
    load_synthetic(&spec.build().unwrap())
}

fn config(kv_cache_bytes: usize) -> ServeConfig {
    ServeConfig {
        kv_cache_bytes,
        max_batch_tokens: 64,
        max_running: 4,
        max_queue: 64,
        ..ServeConfig::default()
    }
}

fn sampled(seed: u64, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 40,
            seed,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

/// Tokens and (prompt, cached prompt) tokens of a finished request.
fn collect(mut stream: rill_engine::ResponseStream) -> (Vec<u32>, usize) {
    let mut tokens = Vec::new();
    let mut cached = None;
    while let Some(event) = stream.blocking_recv() {
        match event {
            ServeEvent::Token { token, .. } => tokens.push(token),
            ServeEvent::Usage {
                cached_prompt_tokens,
                ..
            } => cached = Some(cached_prompt_tokens),
            ServeEvent::Error { message } => panic!("{message}"),
            ServeEvent::Done { .. } => {}
        }
    }
    (tokens, cached.expect("usage"))
}

/// Every request submitted at once (before any is read).
fn submit_all(
    h: &ServeHandle,
    requests: &[(Vec<u32>, GenerateParams)],
) -> Vec<rill_engine::ResponseStream> {
    requests
        .iter()
        .map(|(p, params)| {
            h.submit(ServeRequest::new(p.clone(), params.clone()))
                .unwrap()
        })
        .collect()
}

fn alone(e: &mut Engine, prompt: &[u32], params: &GenerateParams) -> Vec<u32> {
    let mut s = e.new_session(1024).unwrap();
    s.generate(e, prompt, params, |_| true).unwrap().tokens
}

#[test]
fn the_window_arena_holds_a_window_per_request_and_outputs_match_sessions() {
    let mut e = windowed_engine();
    let cfg = config(4 << 20);
    let split = split_kv_budget(e.model.config(), e.model.kv_types(e.precision), &cfg);
    // The budget holds more conversations of the context's length than twice `max_running`:
    // a window (one block) and two more for each of those, and a step's prompt rows; the rest
    // of the budget goes to the global layer.
    assert_eq!(split.window_blocks, 2 * 4 * 3 + 4);
    assert!(split.blocks > 10 * split.window_blocks, "{split:?}");
    let h = spawn(windowed_engine(), cfg).unwrap();
    let summary = h.model_summary();
    assert_eq!(summary.kv_window_blocks_total, split.window_blocks);
    assert_eq!(summary.kv_blocks_total, split.blocks);
    assert_eq!(
        summary.kv_context_bytes_per_token * 3,
        summary.kv_bytes_per_token
    );
    // Six requests, each 12 to 25 windows long, four at a time: chunked prompts beside
    // decoding ones.
    let requests: Vec<(Vec<u32>, GenerateParams)> = (0..6)
        .map(|i| {
            (
                prompt(150 + 30 * i, i as u32 + 1),
                sampled(i as u64, 40 + 5 * i),
            )
        })
        .collect();
    let streams = submit_all(&h, &requests);
    for (i, stream) in streams.into_iter().enumerate() {
        let (got, _) = collect(stream);
        let (p, params) = &requests[i];
        assert_eq!(got, alone(&mut e, p, params), "request {i}");
    }
    let kv = h.next_step().unwrap().blocking_recv().unwrap();
    assert_eq!(kv.window_blocks_total, split.window_blocks);
    assert_eq!(kv.window_blocks_used, 0, "{kv:?}");
    assert_eq!(kv.blocks_used, 0, "{kv:?}");
    h.shutdown();
}

#[test]
fn a_conversations_next_turn_starts_from_its_whole_history() {
    let mut e = windowed_engine();
    let h = spawn(windowed_engine(), config(4 << 20)).unwrap();
    let first = prompt(200, 7);
    let params = sampled(3, 30);
    let (answer, cached) = collect(
        h.submit(ServeRequest::new(first.clone(), params.clone()))
            .unwrap(),
    );
    assert_eq!(cached, 0);
    assert_eq!(answer, alone(&mut e, &first, &params));
    // The next turn: the history (the answer's last token was never computed) and more.
    let next = [first.as_slice(), &answer, &prompt(20, 8)].concat();
    let (again, cached) = collect(
        h.submit(ServeRequest::new(next.clone(), params.clone()))
            .unwrap(),
    );
    assert_eq!(cached, first.len() + answer.len() - 1);
    assert_eq!(again, alone(&mut e, &next, &params));
    h.shutdown();
}

#[test]
fn preemption_when_the_window_arena_runs_out_completes_every_request_unchanged() {
    let mut e = windowed_engine();
    // Room for six window blocks: every request holds one or two while it decodes and up to
    // three while its prompt goes in, so four at once cannot all fit, though the global layer
    // has room for all of them.
    let window_block_bytes = 2 * 2 * 32 * 2 * 16;
    let cfg = ServeConfig {
        kv_window_cache_bytes: 6 * window_block_bytes,
        max_batch_tokens: 16,
        ..config(4 << 20)
    };
    let split = split_kv_budget(e.model.config(), e.model.kv_types(e.precision), &cfg);
    assert_eq!(split.window_blocks, 6);
    let h = spawn(windowed_engine(), cfg).unwrap();
    assert_eq!(h.kv_stats().window_blocks_total, 6);
    let requests: Vec<(Vec<u32>, GenerateParams)> = (0..4)
        .map(|i| {
            (
                prompt(60 + 10 * i, 20 + i as u32),
                sampled(10 + i as u64, 40),
            )
        })
        .collect();
    // All four arrive before the first step (the loop is held by a job meanwhile).
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let held = h
        .run_job(move |_| {
            let _ = gate.recv();
        })
        .unwrap();
    let streams = submit_all(&h, &requests);
    release.send(()).unwrap();
    held.blocking_recv().unwrap();
    for (i, stream) in streams.into_iter().enumerate() {
        let (got, _) = collect(stream);
        let (p, params) = &requests[i];
        assert_eq!(got, alone(&mut e, p, params), "request {i}");
    }
    let preempted = h
        .render_prometheus()
        .lines()
        .find_map(|l| {
            l.strip_prefix("rill_preemptions_total ")?
                .parse::<f64>()
                .ok()
        })
        .unwrap();
    assert!(
        preempted > 0.0,
        "no preemption: the test needs a tighter window arena"
    );
    let kv = h.next_step().unwrap().blocking_recv().unwrap();
    assert_eq!((kv.blocks_used, kv.window_blocks_used), (0, 0), "{kv:?}");
    h.shutdown();
}

/// A standalone session of a window model holds a window (plus one pass and the rollback
/// slack) in its window layers, not the context: a prompt many passes and windows long gives the
/// bits of one pass over an unwindowed cache, and speculation's rollbacks stay inside it.
#[test]
fn a_sessions_window_layers_hold_a_window_and_one_pass_not_the_context() {
    let mut spec = SyntheticSpec::gemma3_tiny();
    spec.context_length = 4096;
    spec.sliding_window = Some(WINDOW);
    let mut e = load_synthetic(&spec.build().unwrap());
    let context = 4096;
    let mut s = e.new_session(context).unwrap();
    let held = s.kv_cache().window_capacity_tokens();
    let pass = rill_engine::SESSION_PASS_ROWS;
    assert!(held >= WINDOW + pass, "{held}");
    assert!(held <= WINDOW + pass + 64 + 3 * 16, "{held}");
    assert!(held * 4 < context, "{held}");

    // Two and a half passes of prompt: the same last logits as one pass over a cache that
    // keeps every position.
    let p = prompt(2 * pass + pass / 2, 5);
    let (computed, reused) = s.set_prompt(&mut e.model, e.precision, &p).unwrap();
    assert_eq!((computed, reused), (p.len(), 0));
    let mut full = e.model.new_kv_cache(context, e.precision).unwrap();
    full.add_sequence(0).unwrap();
    let mut logits = Vec::new();
    let batch = rill_model::Batch::prompt(0, &p, 0, false);
    e.model
        .forward(&batch, &mut full, e.precision, &mut logits)
        .unwrap();
    assert_eq!(s.last_logits(), logits.as_slice());

    // Generation after it, plain and speculative (drafts rolled back in the window layers),
    // the same tokens.
    let params = sampled(9, 96);
    let want = s.generate(&mut e, &p, &params, |_| true).unwrap();
    // Prompt lookup, and the model's first layer, whose own cache is windowed the same way: its
    // window arena could not take the prompt's 1,280 positions in one pass, so the same tokens
    // also show that it catches up in passes of the session's size.
    for source in [
        rill_engine::DraftSource::Ngram(rill_engine::NgramParams::default()),
        rill_engine::DraftSource::Layers(1),
    ] {
        let mut sp =
            rill_engine::Speculator::new(&e, source, rill_engine::SpeculativeParams::default())
                .unwrap();
        let mut s = e.new_session(context).unwrap();
        let got = s
            .generate_speculative(&mut e, &mut sp, &p, &params, |_| true)
            .unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert!(got.speculative.unwrap().rounds > 0);
    }
}
