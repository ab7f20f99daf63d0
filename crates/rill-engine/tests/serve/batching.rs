//! Batching, chunked prefill, prompt-row sharing, the prefix cache and preemption: every request gives what it gives alone.

use super::*;

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
