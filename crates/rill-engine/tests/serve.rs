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

mod common;
use common::{load_synthetic, prompt};

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

fn sampled(seed: u64, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            repeat_penalty: 1.1,
            seed,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ignore_eos: true,
        ..GenerateParams::default()
    }
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

#[test]
fn sixteen_seeded_requests_batched_give_what_each_gives_alone() {
    let mut e = tiny();
    let h = serve(ServeConfig {
        max_batch_tokens: 48,
        ..config()
    });
    // Prompts of different lengths (some chunked over several steps), one seed each.
    let requests: Vec<(Vec<u32>, GenerateParams)> = (0..16)
        .map(|i| {
            (
                prompt(5 + 9 * i, i as u32),
                sampled(100 + i as u64, 20 + i % 5),
            )
        })
        .collect();
    let alone: Vec<Generation> = requests
        .iter()
        .map(|(p, params)| reference(&mut e, p, params))
        .collect();
    // One at a time through the loop, then all at once.
    for (i, (p, params)) in requests.iter().enumerate() {
        let out = run(&h, p, params);
        assert_same(&out.choices[0], &alone[i], &format!("request {i} alone"));
    }
    let mut streams = submit_all(&h, &requests);
    for (i, s) in streams.iter_mut().enumerate() {
        let out = collect(s, 1);
        assert_same(&out.choices[0], &alone[i], &format!("request {i} batched"));
        assert_eq!(out.usage.unwrap().0, requests[i].0.len());
    }
    // Different seeds do differ.
    assert_ne!(
        alone[0].tokens,
        reference(&mut e, &requests[0].0, &sampled(7, 20)).tokens
    );
    h.shutdown();
}

#[test]
fn greedy_results_equal_session_generate_with_every_stop_condition() {
    let mut e = tiny();
    let h = serve(config());
    let p = bytes("The quick brown fox");
    let base = reference(&mut e, &p, &greedy(30));
    let text = base.text.clone();
    // A stop string from the middle of the greedy text, a stop token from its tokens.
    let mut stop: String = text.chars().skip(6).take(2).collect();
    if stop.is_empty() {
        stop = "zz".into();
    }
    let cases = vec![
        greedy(30),
        GenerateParams {
            stop: vec![stop, "zzzz".into()],
            ..greedy(30)
        },
        GenerateParams {
            stop_token_ids: vec![base.tokens[9]],
            ..greedy(30)
        },
        GenerateParams {
            stop_token_ids: vec![base.tokens[0]],
            min_tokens: 4,
            ..greedy(30)
        },
        GenerateParams {
            top_logprobs: Some(3),
            ..greedy(12)
        },
        GenerateParams {
            top_logprobs: Some(0),
            ..sampled(5, 12)
        },
        GenerateParams {
            ignore_eos: false,
            ..greedy(40)
        },
    ];
    let mut streams = Vec::new();
    for params in &cases {
        let want = reference(&mut e, &p, params);
        let got = run(&h, &p, params);
        assert_same(&got.choices[0], &want, &format!("{params:?}"));
        streams.push((
            h.submit(ServeRequest::new(p.clone(), params.clone()))
                .unwrap(),
            want,
        ));
    }
    // All together too.
    for (s, want) in &mut streams {
        assert_same(&collect(s, 1).choices[0], want, "batched");
    }
    h.shutdown();
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_while_others_decode() {
    let mut e = tiny();
    let h = serve(ServeConfig {
        max_batch_tokens: 24,
        max_running: 4,
        prefix_caching: false,
        ..config()
    });
    let long = prompt(230, 3);
    let short: Vec<Vec<u32>> = (0..3).map(|i| prompt(6 + i, 10 + i as u32)).collect();
    // All at once (the loop paused meanwhile): the short ones prefill in the first step, then
    // decode one token a step while the long one gets the rest of each step's 24 rows (about
    // 21): 11 steps or more.
    h.pause().unwrap();
    let mut shorts: Vec<ResponseStream> = short
        .iter()
        .map(|p| h.submit(ServeRequest::new(p.clone(), greedy(6))).unwrap())
        .collect();
    let mut l = h
        .submit(ServeRequest::new(long.clone(), greedy(20)))
        .unwrap();
    h.resume().unwrap();
    let first = l.blocking_recv().unwrap();
    // Everything the short requests streamed was sent before that: they are finished.
    for (i, s) in shorts.iter_mut().enumerate() {
        let mut out = Outcome {
            choices: vec![Choice::default()],
            ..Outcome::default()
        };
        while let Some(ev) = s.try_recv() {
            apply(&mut out, ev);
        }
        assert!(
            out.usage.is_some(),
            "short request {i} did not finish while the long prompt prefilled"
        );
        let want = reference(&mut e, &short[i], &greedy(6));
        assert_same(&out.choices[0], &want, &format!("short request {i}"));
    }
    let out = collect_after(first, &mut l);
    let want = reference(&mut e, &long, &greedy(20));
    assert_same(&out.choices[0], &want, "chunked prompt");
    assert!(metric(&h, "rill_engine_steps_total") >= 11.0);
    h.shutdown();
}

/// A loop whose steps that decode take at most `cap` prompt rows (64 rows a step in all, no
/// prefix cache).
fn capped_prompt_rows(cap: usize) -> ServeHandle {
    serve(ServeConfig {
        max_batch_tokens: 64,
        max_prefill_rows_while_decoding: cap,
        prefix_caching: false,
        ..config()
    })
}

/// A request whose tokens come with their explanation (rule, step, prompt).
fn explained(p: Vec<u32>, params: GenerateParams) -> ServeRequest {
    ServeRequest {
        trace: Trace {
            explain: true,
            full_logits: false,
        },
        ..ServeRequest::new(p, params)
    }
}

#[test]
fn a_step_that_decodes_takes_at_most_the_prefill_cap_of_prompt_rows() {
    let cap = 8;
    let h = capped_prompt_rows(cap);
    // One step alone for the short prompt, then the long one arrives while it decodes (the
    // loop paused, so however fast it runs, the decoding request has 199 tokens to go).
    h.pause().unwrap();
    let mut decoding = h.submit(explained(prompt(5, 1), greedy(200))).unwrap();
    step(&h);
    let first = decoding.try_recv().expect("the first step sampled a token");
    // Alone, the short prompt was taken in whole (no one was decoding).
    let ServeEvent::Token {
        detail: Some(d), ..
    } = &first
    else {
        panic!("{first:?}")
    };
    assert_eq!(d.step.prefill_rows, 5);
    let long = prompt(100, 2);
    let mut l = h.submit(explained(long.clone(), greedy(2))).unwrap();
    h.resume().unwrap();
    let out = collect_after(first, &mut decoding);
    let steps: Vec<_> = out.choices[0].details.iter().map(|d| d.step).collect();
    for s in &steps[1..] {
        assert!(s.decode_rows >= 1, "{s:?}");
        assert!(s.prefill_rows <= cap, "{s:?}");
    }
    assert!(
        steps.iter().filter(|s| s.prefill_rows == cap).count() >= 100 / cap - 1,
        "the long prompt went through in chunks of {cap} beside the decoding one"
    );
    let lo = collect(&mut l, 1);
    let taken = lo.choices[0].details[0].prompt.as_ref().unwrap();
    assert!(taken.prefill_steps >= 100 / cap, "{taken:?}");
    let mut e = tiny();
    assert_same(
        &lo.choices[0],
        &reference(&mut e, &long, &greedy(2)),
        "capped chunks",
    );
    h.shutdown();
}

#[test]
fn a_short_prompt_is_read_before_a_long_one_already_reading() {
    let cap = 8;
    let h = capped_prompt_rows(cap);
    // One request decoding (so prompts get `cap` rows a step), a long prompt reading.
    h.pause().unwrap();
    let mut decoding = h
        .submit(ServeRequest::new(prompt(5, 1), greedy(40)))
        .unwrap();
    step(&h);
    let long = prompt(100, 2);
    let mut l = h.submit(explained(long.clone(), greedy(2))).unwrap();
    step(&h);
    step(&h);
    // A short prompt arrives: it is read whole in its first step (6 of the 8 rows; the long
    // one, older, is sure of a quarter and gets the other 2).
    let short = prompt(6, 3);
    let mut s = h.submit(explained(short.clone(), greedy(3))).unwrap();
    step(&h);
    let first = s
        .try_recv()
        .expect("the short prompt's first token in its first step");
    let ServeEvent::Token {
        detail: Some(d), ..
    } = &first
    else {
        panic!("{first:?}")
    };
    assert_eq!(d.step.prefill_rows, cap, "{:?}", d.step);
    assert_eq!(d.prompt.as_ref().unwrap().prefill_steps, 1);
    assert!(
        l.try_recv().is_none(),
        "the long prompt is still being read"
    );
    h.resume().unwrap();
    let out = collect_after(first, &mut s);
    let mut e = tiny();
    assert_same(
        &out.choices[0],
        &reference(&mut e, &short, &greedy(3)),
        "short",
    );
    let lo = collect(&mut l, 1);
    assert_same(
        &lo.choices[0],
        &reference(&mut e, &long, &greedy(2)),
        "long",
    );
    // Every step of the long prompt's reading while one decoded moved it on.
    let taken = lo.choices[0].details[0].prompt.as_ref().unwrap();
    assert!(taken.prefill_steps <= 100 / 2, "{taken:?}");
    collect(&mut decoding, 1);
    h.shutdown();
}

#[test]
fn a_repeated_prompt_hits_the_prefix_cache_with_identical_output() {
    let mut e = tiny();
    let h = serve(config());
    let p = prompt(40, 4);
    let params = sampled(9, 16);
    let want = reference(&mut e, &p, &params);
    let first = run(&h, &p, &params);
    assert_eq!(first.usage, Some((40, 16, 0)));
    let second = run(&h, &p, &params);
    // Every position but the last (whose logits are wanted) is reused: two full blocks of 16
    // and 7 positions of the third, which the first request published as it ended.
    assert_eq!(second.usage, Some((40, 16, 39)));
    assert_same(&first.choices[0], &want, "first");
    assert_same(&second.choices[0], &want, "cached");
    // A prompt sharing the first 20 tokens reuses them: the first block whole and 4 positions
    // of the second, shared part-way (and copied before it is written).
    let mut other = p[..20].to_vec();
    other.extend(prompt(10, 5));
    let third = run(&h, &other, &params);
    assert_eq!(third.usage.unwrap().2, 20);
    assert_same(
        &third.choices[0],
        &reference(&mut e, &other, &params),
        "partial hit",
    );
    assert_eq!(metric(&h, "rill_prefix_cache_hits_total"), 59.0);
    assert_eq!(metric(&h, "rill_prefix_cache_queries_total"), 110.0);
    let ratio = metric(&h, "rill_prefix_cache_hit_ratio");
    assert!((ratio - 59.0 / 110.0).abs() < 1e-9, "{ratio}");
    // Blocks kept for the cache are free, not used.
    let kv = settled(&h);
    assert_eq!(kv.blocks_used, 0, "{kv:?}");
    assert!(kv.blocks_cached_free >= 3, "{kv:?}");
    h.shutdown();
}

#[test]
fn preemption_under_a_tiny_kv_budget_completes_every_request_unchanged() {
    let mut e = tiny();
    let bb = block_bytes(&e);
    // Eight blocks (128 positions) for eight requests of up to 60 positions each.
    let h = spawn(
        tiny(),
        ServeConfig {
            kv_cache_bytes: 8 * bb,
            max_batch_tokens: 64,
            max_running: 8,
            ..config()
        },
    )
    .unwrap();
    assert_eq!(h.kv_stats().blocks_total, 8);
    assert_eq!(h.model_info().context, 128);
    let requests: Vec<(Vec<u32>, GenerateParams)> = (0..8)
        .map(|i| (prompt(20 + i, 20 + i as u32), sampled(i as u64, 40)))
        .collect();
    let want: Vec<Generation> = requests
        .iter()
        .map(|(p, params)| reference(&mut e, p, params))
        .collect();
    // All eight arrive before the first step (the loop is held by a job meanwhile), whatever
    // the scheduling of this thread: then they cannot all fit, and some must be preempted.
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let held = h
        .run_job(move |_| {
            let _ = gate.recv();
        })
        .unwrap();
    let mut streams = submit_all(&h, &requests);
    release.send(()).unwrap();
    held.blocking_recv().unwrap();
    for (i, s) in streams.iter_mut().enumerate() {
        let out = collect(s, 1);
        assert!(out.error.is_none(), "{:?}", out.error);
        assert_same(&out.choices[0], &want[i], &format!("request {i}"));
    }
    assert!(metric(&h, "rill_preemptions_total") > 0.0);
    assert_eq!(settled(&h).blocks_used, 0);
    // A request that needs the whole arena alone still runs.
    let whole = run(&h, &prompt(100, 1), &greedy(28));
    assert_same(
        &whole.choices[0],
        &reference(&mut e, &prompt(100, 1), &greedy(28)),
        "whole arena",
    );
    h.shutdown();
}

#[test]
fn a_paused_loop_takes_requests_in_but_steps_only_when_told() {
    let mut e = tiny();
    let h = serve(config());
    h.pause().unwrap();
    let p = prompt(8, 3);
    let mut s = h.submit(ServeRequest::new(p.clone(), greedy(6))).unwrap();
    // A job runs on the loop between iterations: the request was taken in, and no step ran.
    h.run_job(|_| ()).unwrap().blocking_recv().unwrap();
    assert!(s.try_recv().is_none());
    assert_eq!(h.queued(), 1);
    // One step per `next_step`: the prompt and its first token, then one token each.
    let mut out = Outcome {
        choices: vec![Choice::default()],
        ..Outcome::default()
    };
    for want in 1..=3 {
        let kv = step(&h);
        assert!(kv.blocks_used > 0, "{kv:?}");
        let event = s.try_recv();
        assert!(
            matches!(event, Some(ServeEvent::Token { .. })),
            "step {want}"
        );
        apply(&mut out, event.unwrap());
        assert!(s.try_recv().is_none(), "step {want}: one token");
        h.run_job(|_| ()).unwrap().blocking_recv().unwrap();
        assert!(s.try_recv().is_none(), "no step without next_step");
    }
    // Resumed, it runs to the end with what it gives unpaused.
    h.resume().unwrap();
    while let Some(event) = s.blocking_recv() {
        apply(&mut out, event);
    }
    assert_same(
        &out.choices[0],
        &reference(&mut e, &p, &greedy(6)),
        "paused",
    );
    h.shutdown();
    assert!(h.next_step().is_err());
}

#[test]
fn dropping_a_stream_frees_its_blocks_within_a_step() {
    for prefix_caching in [false, true] {
        let h = serve(ServeConfig {
            prefix_caching,
            ..config()
        });
        // Step by step until three tokens came (the prompt takes two steps), then the stream is
        // dropped.
        h.pause().unwrap();
        let mut a = h
            .submit(ServeRequest::new(prompt(100, 1), greedy(150)))
            .unwrap();
        let mut tokens = 0;
        while tokens < 3 {
            assert!(step(&h).blocks_used > 0);
            while let Some(ev) = a.try_recv() {
                assert!(matches!(ev, ServeEvent::Token { .. }), "{ev:?}");
                tokens += 1;
            }
        }
        drop(a);
        // The next iteration reaps it (a paused loop still reaps).
        let kv = step(&h);
        assert_eq!(kv.blocks_used, 0, "{kv:?}");
        // With prefix caching, its full blocks stay cached, and free.
        assert_eq!(kv.blocks_cached_free > 0, prefix_caching, "{kv:?}");
        assert!(
            h.render_prometheus()
                .contains("rill_requests_finished_total{finish_reason=\"cancelled\"} 1"),
            "{}",
            h.render_prometheus()
        );
        assert_eq!(metric(&h, "rill_requests_running"), 0.0);
        h.shutdown();
    }
}

#[test]
fn a_full_queue_refuses_at_once() {
    let h = serve(ServeConfig {
        max_running: 1,
        max_queue: 2,
        ..config()
    });
    // The loop paused: nothing leaves the queue, and `submit` must answer without it.
    h.pause().unwrap();
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..4 {
        match h.submit(ServeRequest::new(prompt(8, i), greedy(200))) {
            Ok(s) => held.push(s),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let Some(SubmitError::QueueFull { retry_after_s }) = refused else {
        panic!("no QueueFull after 4 requests: {refused:?}");
    };
    assert_eq!(held.len(), 2);
    assert!((1..=60).contains(&retry_after_s));
    let message = SubmitError::QueueFull { retry_after_s }.to_string();
    assert!(message.contains("queue is full") && message.contains("retry after"));
    assert!(h
        .render_prometheus()
        .contains("rill_requests_rejected_total{reason=\"queue_full\"} 1"));
    // Room again once a queued request is cancelled (the step reaps it, and schedules the first).
    held.pop();
    step(&h);
    assert_eq!(h.queued(), 0);
    held.push(
        h.submit(ServeRequest::new(prompt(8, 9), greedy(200)))
            .unwrap(),
    );
    h.shutdown();
}

#[test]
fn n_choices_share_the_prompt_and_each_matches_its_seed() {
    let mut e = tiny();
    let h = serve(config());
    let p = prompt(64, 6);
    // 64 + 16 positions: four shared prompt blocks and one block of each choice's own, however
    // far the choices have got when the blocks are counted.
    let params = sampled(40, 16);
    let mut s = h
        .submit(ServeRequest {
            prompt: p.clone(),
            params: params.clone(),
            n: 4,
            trace: Default::default(),
        })
        .unwrap();
    // Once every choice has produced a token: four shared prompt blocks and one block each.
    let mut out = Outcome {
        choices: vec![Choice::default(); 4],
        ..Outcome::default()
    };
    while out.choices.iter().any(|c| c.tokens.len() < 2) {
        apply(&mut out, s.blocking_recv().unwrap());
    }
    let used = h.kv_stats().blocks_used;
    assert!(used <= 8, "{used} blocks for 4 choices of a 4-block prompt");
    while let Some(ev) = s.blocking_recv() {
        apply(&mut out, ev);
    }
    assert_eq!(out.usage, Some((64, 4 * 16, 0)));
    for (c, got) in out.choices.iter().enumerate() {
        let mut own = params.clone();
        own.sampling.seed += c as u64;
        assert_same(got, &reference(&mut e, &p, &own), &format!("choice {c}"));
    }
    assert_ne!(out.choices[0].tokens, out.choices[1].tokens);
    // Greedy choices are all the same; the prompt's blocks are cached for the next request.
    let mut s = h
        .submit(ServeRequest {
            prompt: p.clone(),
            params: greedy(5),
            n: 3,
            trace: Default::default(),
        })
        .unwrap();
    let out = collect(&mut s, 3);
    // All but the prompt's last position: the earlier choices published their last block as
    // they ended, with 15 of its 16 positions computed.
    assert_eq!(out.usage, Some((64, 15, 63)));
    assert!(out
        .choices
        .iter()
        .all(|c| c.tokens == out.choices[0].tokens));
    assert_eq!(settled(&h).blocks_used, 0);
    h.shutdown();
}

#[test]
fn shutdown_ends_every_stream_and_refuses_new_requests() {
    let h = serve(ServeConfig {
        max_running: 2,
        ..config()
    });
    // One step, then the shutdown: nothing can have finished on its own.
    h.pause().unwrap();
    let mut streams: Vec<(ResponseStream, usize)> = (0..5)
        .map(|i| {
            let n = 1 + i % 2;
            let r = ServeRequest {
                prompt: prompt(10, i as u32),
                params: greedy(240),
                n,
                trace: Default::default(),
            };
            (h.submit(r).unwrap(), n)
        })
        .collect();
    step(&h);
    let first = streams[0].0.try_recv().unwrap();
    assert!(matches!(first, ServeEvent::Token { .. }));
    h.shutdown();
    h.shutdown();
    for (i, (s, n)) in streams.iter_mut().enumerate() {
        let mut out = Outcome {
            choices: vec![Choice::default(); *n],
            ..Outcome::default()
        };
        if i == 0 {
            apply(&mut out, first.clone());
        }
        while let Some(ev) = s.blocking_recv() {
            apply(&mut out, ev);
        }
        assert!(out.error.is_none());
        // Running (one token at most) or never started: cancelled either way.
        for c in &out.choices {
            assert_eq!(c.finish, Some(FinishCause::Cancelled), "request {i}");
            assert!(c.tokens.len() <= 1, "request {i}: {:?}", c.tokens);
        }
    }
    assert_eq!(
        h.submit(ServeRequest::new(prompt(4, 1), greedy(4))).err(),
        Some(SubmitError::ShuttingDown)
    );
    assert_eq!(h.kv_stats().blocks_used, 0);
}

#[test]
fn no_block_leaks_after_many_mixed_requests() {
    let h = serve(ServeConfig {
        kv_cache_bytes: 40 * block_bytes(&tiny()),
        max_batch_tokens: 32,
        max_running: 6,
        ..config()
    });
    let mut streams = Vec::new();
    for i in 0..40u32 {
        let n = 1 + (i % 3) as usize;
        let mut params = if i % 2 == 0 {
            greedy(5 + (i % 7) as usize)
        } else {
            sampled(i as u64, 9)
        };
        if i % 5 == 0 {
            params.stop = vec!["e".into()];
            params.ignore_eos = false;
        }
        // Some prompts repeat (prefix hits), some are long (chunked).
        let p = if i % 4 == 0 {
            prompt(40, 1)
        } else {
            prompt(5 + (i as usize * 13) % 90, i)
        };
        streams.push((
            h.submit(ServeRequest {
                prompt: p,
                params,
                n,
                trace: Default::default(),
            })
            .unwrap(),
            n,
            i,
        ));
    }
    let mut finished = 0;
    for (mut s, n, i) in streams {
        if i % 7 == 3 {
            // Cancelled after its first event.
            s.blocking_recv();
            drop(s);
            continue;
        }
        let out = collect(&mut s, n);
        assert!(out.error.is_none());
        finished += n;
    }
    let kv = settled(&h);
    assert_eq!(kv.blocks_used, 0, "{kv:?}");
    assert!(kv.blocks_cached_free > 0 && kv.blocks_cached_free <= kv.blocks_total);
    let by_reason: f64 = ["stop", "length"]
        .iter()
        .map(|r| {
            metric(
                &h,
                &format!("rill_requests_finished_total{{finish_reason=\"{r}\"}}"),
            )
        })
        .sum();
    assert!(by_reason >= finished as f64);
    // The gauges were published with those statistics.
    assert_eq!(metric(&h, "rill_requests_running"), 0.0);
    assert_eq!(metric(&h, "rill_requests_waiting"), 0.0);
    assert_eq!(metric(&h, "rill_kv_blocks_used"), 0.0);
    h.shutdown();
}

#[test]
fn bad_requests_are_refused_with_the_parameter_named() {
    let h = serve(config());
    let info = h.model_info();
    assert_eq!(info.context, 256);
    assert_eq!(info.vocab_size, 259);
    let invalid = |r: ServeRequest| match h.submit(r) {
        Err(SubmitError::Invalid { param, message }) => (param, message),
        other => panic!("{other:?}"),
    };
    assert_eq!(invalid(ServeRequest::new(vec![], greedy(1))).0, "prompt");
    let (param, message) = invalid(ServeRequest::new(vec![1, 999], greedy(1)));
    assert_eq!(param, "prompt");
    assert!(message.contains("999"));
    for n in [0, 17] {
        let r = ServeRequest {
            n,
            ..ServeRequest::new(vec![1], greedy(1))
        };
        assert_eq!(invalid(r).0, "n");
    }
    assert_eq!(
        invalid(ServeRequest::new(vec![1], greedy(0))).0,
        "max_tokens"
    );
    let hot = GenerateParams {
        sampling: SamplingParams::with_temperature(-1.0, 0),
        ..greedy(1)
    };
    assert_eq!(invalid(ServeRequest::new(vec![1], hot)).0, "temperature");
    let top = GenerateParams {
        sampling: SamplingParams {
            top_p: 2.0,
            ..SamplingParams::default()
        },
        ..greedy(1)
    };
    assert_eq!(invalid(ServeRequest::new(vec![1], top)).0, "top_p");
    let stop = GenerateParams {
        stop_token_ids: vec![5000],
        ..greedy(1)
    };
    assert_eq!(
        invalid(ServeRequest::new(vec![1], stop)).0,
        "stop_token_ids"
    );
    let empty = GenerateParams {
        stop: vec![String::new()],
        ..greedy(1)
    };
    assert_eq!(invalid(ServeRequest::new(vec![1], empty)).0, "stop");
    let e = h
        .submit(ServeRequest::new(prompt(200, 1), greedy(100)))
        .unwrap_err();
    assert_eq!(
        e,
        SubmitError::PromptTooLong {
            prompt_tokens: 200,
            max_tokens: 100,
            context: 256
        }
    );
    assert!(e.to_string().contains("200") && e.to_string().contains("100"));
    // Nothing reached the loop.
    assert_eq!(metric(&h, "rill_requests_submitted_total"), 0.0);
    let bad = ServeConfig {
        max_batch_tokens: 8,
        max_running: 16,
        ..config()
    };
    assert!(spawn(tiny(), bad).is_err());
    assert!(spawn(
        tiny(),
        ServeConfig {
            kv_cache_bytes: 100,
            ..config()
        }
    )
    .is_err());
    h.shutdown();
}

#[test]
fn streams_are_read_asynchronously_and_metrics_render() {
    let h = serve(config());
    let p = bytes("async");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (tokens, usage) = rt.block_on(async {
        let mut s = h.submit(ServeRequest::new(p.clone(), greedy(6))).unwrap();
        let mut tokens = 0;
        let mut usage = None;
        while let Some(ev) = s.recv().await {
            match ev {
                ServeEvent::Token { .. } => tokens += 1,
                ServeEvent::Usage { .. } => usage = Some(ev),
                _ => {}
            }
        }
        (tokens, usage)
    });
    assert_eq!(tokens, 6);
    assert!(usage.is_some());
    let text = h.render_prometheus();
    for name in [
        "rill_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
        "rill_inter_token_latency_seconds_count 5",
        "rill_e2e_request_latency_seconds_count 1",
        "rill_request_queue_time_seconds_count 1",
        "rill_prompt_tokens_total 5",
        "rill_generation_tokens_total 6",
        "rill_requests_finished_total{finish_reason=\"length\"} 1",
        "rill_kv_blocks_total ",
        "rill_spec_decode_acceptance_ratio 0",
        "# TYPE rill_time_to_first_token_seconds histogram",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    // Every sample line is `name{labels} value` with a number.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(name.starts_with("rill_"), "{line}");
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    h.shutdown();
}

/// SmolLM2 through the loop: chat prompts batched together give what `Session::generate` gives,
/// and a repeated system prompt is served from the prefix cache.
#[test]
fn explained_tokens_report_rule_step_kv_and_cost_without_changing_the_output() {
    let h = serve(config());
    let p = prompt(40, 3);
    let plain = run(&h, &p, &sampled(5, 12));
    let explain = |params: &GenerateParams| {
        let mut stream = h
            .submit(ServeRequest {
                trace: Trace {
                    explain: true,
                    full_logits: false,
                },
                ..ServeRequest::new(p.clone(), params.clone())
            })
            .unwrap();
        collect(&mut stream, 1)
    };
    let explained = explain(&sampled(5, 12));
    assert_eq!(explained.choices[0].tokens, plain.choices[0].tokens);
    assert!(plain.choices[0].details.is_empty());
    let details = &explained.choices[0].details;
    assert_eq!(details.len(), 12);
    let summary = h.model_summary().clone();
    let block = summary.kv_block_size;
    for (i, d) in details.iter().enumerate() {
        assert_eq!(d.index, i);
        assert_eq!(d.position, p.len() + i);
        assert_eq!(d.rule, PickRule::Sampled);
        assert!(d.probability > 0.0 && d.probability <= 1.0);
        assert!(d.step.rows >= 1 && d.step.sequences >= 1 && d.step.requests >= 1);
        assert_eq!(d.step.rows, d.step.prefill_rows + d.step.decode_rows);
        assert!(d.step.seconds > 0.0);
        assert_eq!(d.kv_blocks, (d.position + 1).div_ceil(block));
        assert_eq!(d.kv_bytes, d.kv_blocks * block * summary.kv_bytes_per_token);
        // The row that computed this token attended to `position` positions.
        let attention = summary.cost.attention_flops_per_position * d.position as u64;
        assert_eq!(d.cost.flops, summary.cost.flops_per_token + attention);
        assert_eq!(d.cost.weight_bytes, summary.cost.weight_bytes_per_token);
        assert_eq!(
            d.cost.kv_bytes,
            (summary.kv_bytes_per_token * d.position) as u64
        );
        assert!(d.logits.is_none());
        if i > 0 {
            assert!(d.elapsed_s >= details[i - 1].elapsed_s);
            assert!(d.prompt.is_none());
            assert_eq!(
                d.step.decode_rows, 1,
                "alone, every later step is one decode row"
            );
        }
    }
    // The first token tells how the prompt was taken in; the first request computed it all,
    // this one found the plain request's positions in the prefix cache (all but the last).
    let first = details[0]
        .prompt
        .as_ref()
        .expect("the first token reports the prompt");
    assert_eq!(first.tokens, p);
    let cached = p.len() - 1;
    assert_eq!(first.cached_tokens, cached);
    assert_eq!(first.computed_tokens, p.len() - cached);
    assert!(first.prefill_steps >= 1 && first.prefill_seconds > 0.0);

    let greedy_details = explain(&greedy(3));
    assert!(greedy_details.choices[0]
        .details
        .iter()
        .all(|d| d.rule == PickRule::Greedy && d.probability == 1.0));
    h.shutdown();
}

#[test]
fn full_logits_are_the_distribution_the_token_was_drawn_from() {
    let h = serve(config());
    let p = prompt(21, 9);
    let mut stream = h
        .submit(ServeRequest {
            trace: Trace {
                explain: false,
                full_logits: true,
            },
            ..ServeRequest::new(p.clone(), greedy(2))
        })
        .unwrap();
    let out = collect(&mut stream, 1);
    let c = &out.choices[0];
    assert_eq!(c.details.len(), 2, "full logits imply explaining");
    for (d, &token) in c.details.iter().zip(&c.tokens) {
        let logits = d.logits.as_ref().expect("logits asked for");
        assert_eq!(logits.len(), h.model_info().vocab_size);
        assert_eq!(rill_engine::argmax(logits), token);
    }
    // Bit for bit the logits a session computes after the prompt (batch invariance).
    let mut e = tiny();
    let mut session = e.new_session(64).unwrap();
    session.generate(&mut e, &p, &greedy(1), |_| true).unwrap();
    assert_eq!(session.tokens(), &p[..]);
    assert_eq!(Some(session.last_logits()), c.details[0].logits.as_deref());
    h.shutdown();
}

#[test]
fn jobs_run_on_the_loop_with_the_whole_engine_between_steps() {
    let h = serve(config());
    // A request in flight while a job runs: both finish, the request unchanged.
    let p = prompt(30, 4);
    let alone = run(&h, &p, &greedy(20));
    let mut stream = h.submit(ServeRequest::new(p.clone(), greedy(20))).unwrap();
    let job = h
        .run_job(|engine: &mut Engine| {
            let out = engine
                .beam_search(
                    &[70, 71, 72],
                    &rill_engine::BeamParams {
                        width: 2,
                        max_tokens: 4,
                        ignore_eos: true,
                        ..rill_engine::BeamParams::default()
                    },
                    |_| true,
                )
                .unwrap();
            (engine.model.config().vocab_size, out.hypotheses.len())
        })
        .unwrap();
    let (vocab, hypotheses) = job.blocking_recv().unwrap();
    assert_eq!(vocab, h.model_info().vocab_size);
    assert_eq!(hypotheses, 2);
    assert_eq!(
        collect(&mut stream, 1).choices[0].tokens,
        alone.choices[0].tokens
    );
    assert!(metric(&h, "rill_jobs_total") >= 1.0);
    h.shutdown();
    // After shutdown a job is refused.
    assert!(h.run_job(|_| ()).is_err());
}

#[test]
fn smollm2_batched_chat_equals_sessions() {
    let mut e = common::engine("smollm2-135m", Precision::Fast);
    let questions = [
        "What is the capital of France?",
        "Write a haiku about rain.",
        "Name three primary colors.",
        "What is 12 times 12?",
    ];
    let system = "You are a concise assistant. Answer in one short sentence, without any preamble.";
    let prompts: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| {
            e.chat_prompt(&[
                rill_tokenizer::ChatMessage::new("system", system),
                rill_tokenizer::ChatMessage::new("user", *q),
            ])
            .unwrap()
        })
        .collect();
    let params = |i: usize| GenerateParams {
        max_tokens: 24,
        sampling: if i.is_multiple_of(2) {
            SamplingParams::greedy()
        } else {
            SamplingParams::with_temperature(0.7, i as u64)
        },
        ..GenerateParams::default()
    };
    let want: Vec<Generation> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut s = e.new_session(1024).unwrap();
            s.generate(&mut e, p, &params(i), |_| true).unwrap()
        })
        .collect();
    let h = spawn(
        e,
        ServeConfig {
            kv_cache_bytes: 64 << 20,
            max_batch_tokens: 64,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    assert!(!h.model_info().name.is_empty());
    // The first warms the prefix cache with the shared system prompt.
    let mut first = h
        .submit(ServeRequest::new(prompts[0].clone(), params(0)))
        .unwrap();
    let out = collect(&mut first, 1);
    assert_same(&out.choices[0], &want[0], "first");
    let mut streams: Vec<ResponseStream> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| h.submit(ServeRequest::new(p.clone(), params(i))).unwrap())
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        let out = collect(s, 1);
        assert_same(&out.choices[0], &want[i], &format!("question {i}"));
        let (prompt_tokens, _, cached) = out.usage.unwrap();
        assert!(
            cached >= 16 && cached < prompt_tokens,
            "{cached} of {prompt_tokens}"
        );
        assert!(!out.choices[0].text.is_empty());
    }
    h.shutdown();
}

#[test]
fn a_speculative_generation_takes_one_loop_step_at_a_time_beside_the_others() {
    use rill_engine::serve::timeline::SeqState;
    use rill_engine::{DraftSource, SpeculativeParams, Speculator};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    let mut e = tiny();
    let p = prompt(40, 7);
    let params = sampled(5, 24);
    let spec = SpeculativeParams {
        draft_tokens: 3,
        adaptive: false,
        trace: true,
    };
    let want = {
        let mut sp = Speculator::new(&e, DraftSource::Layers(1), spec).unwrap();
        let mut s = e.new_session(128).unwrap();
        s.generate_speculative(&mut e, &mut sp, &p, &params, |_| true)
            .unwrap()
    };
    let want_stats = want.speculative.clone().unwrap();

    let h = serve(config());
    h.pause().unwrap();
    let mut stream = h
        .submit(ServeRequest::new(prompt(8, 9), greedy(60)))
        .unwrap();
    let cancelled = Arc::new(AtomicBool::new(false));
    let (id, mut reply) = h
        .speculative(
            p.clone(),
            DraftSource::Layers(1),
            spec,
            params.clone(),
            128,
            cancelled,
        )
        .unwrap();
    // Each loop iteration: one step of the request (its prompt and first token, then a token)
    // and one of the speculative generation (its prompt's pass, the draft's pass over it, then
    // a round each).
    let mut iterations = 0;
    let mut other_tokens = 0;
    let got = loop {
        step(&h);
        iterations += 1;
        while let Some(event) = stream.try_recv() {
            other_tokens += usize::from(matches!(event, ServeEvent::Token { .. }));
        }
        assert_eq!(other_tokens, iterations, "the request was held up");
        if let Ok(result) = reply.try_recv() {
            break result.unwrap();
        }
        let view = h.server_view(0).unwrap().blocking_recv().unwrap();
        let s = view
            .sequences
            .iter()
            .find(|s| s.request == id)
            .expect("the speculative generation is in the server's view");
        assert_eq!(s.state, SeqState::Speculative);
        assert_eq!(s.prompt_tokens, p.len());
        assert!(iterations < 100, "no end");
    };
    assert_eq!(iterations, 2 + want_stats.rounds, "one round per iteration");
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.text, want.text);
    let stats = got.speculative.unwrap();
    assert_eq!(stats.trace.len(), want_stats.trace.len());
    for (a, b) in stats.trace.iter().zip(&want_stats.trace) {
        assert_eq!(
            (&a.drafted, a.accepted, a.next),
            (&b.drafted, b.accepted, b.next)
        );
    }
    // The view lets go of it once it ended.
    let view = h.server_view(0).unwrap().blocking_recv().unwrap();
    assert!(view.sequences.iter().all(|s| s.request != id));
    h.shutdown();
}

#[test]
fn speculative_generations_run_two_at_a_time_and_the_rest_wait_their_turn() {
    use rill_engine::serve::timeline::SeqState;
    use rill_engine::{DraftSource, NgramParams, SpeculativeParams, Speculator};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    let mut e = tiny();
    let spec = SpeculativeParams {
        draft_tokens: 4,
        adaptive: false,
        trace: false,
    };
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(12 + 5 * i, 20 + i as u32)).collect();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut sp =
                Speculator::new(&e, DraftSource::Ngram(NgramParams::default()), spec).unwrap();
            let mut s = e.new_session(64).unwrap();
            s.generate_speculative(&mut e, &mut sp, p, &greedy(16), |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    let h = serve(config());
    h.pause().unwrap();
    let mut replies: Vec<_> = prompts
        .iter()
        .map(|p| {
            h.speculative(
                p.clone(),
                DraftSource::Ngram(NgramParams::default()),
                spec,
                greedy(16),
                64,
                Arc::new(AtomicBool::new(false)),
            )
            .unwrap()
        })
        .collect();
    let mut got: Vec<Option<Vec<u32>>> = vec![None; 3];
    let mut most_at_once = 0;
    for _ in 0..100 {
        step(&h);
        for (i, (_, reply)) in replies.iter_mut().enumerate() {
            if got[i].is_none() {
                if let Ok(result) = reply.try_recv() {
                    got[i] = Some(result.unwrap().tokens);
                }
            }
        }
        if got.iter().all(Option::is_some) {
            break;
        }
        let view = h.server_view(0).unwrap().blocking_recv().unwrap();
        let running = view
            .sequences
            .iter()
            .filter(|s| s.state == SeqState::Speculative)
            .count();
        most_at_once = most_at_once.max(running);
        assert!(running <= 2, "{running} speculative generations at once");
        // The third starts only after one of the first two ended.
        if got[..2].iter().all(Option::is_none) {
            assert!(view.sequences.iter().all(|s| s.request != replies[2].0));
        }
    }
    assert_eq!(most_at_once, 2);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.as_ref(), Some(w));
    }
    h.shutdown();
}
