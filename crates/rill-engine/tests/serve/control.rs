//! Holding the loop, cancellation, backpressure, `n` choices, shutdown, block accounting, bad requests and the metrics.

use super::*;

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
