//! Explained tokens, full logits, jobs on the loop, SmolLM2 batched, and speculative generations beside the requests.

use super::*;

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

    // Prompt lookup off: the plain request takes exactly one token per step.
    let h = serve(ServeConfig {
        prompt_lookup_tokens: 0,
        ..config()
    });
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
