//! Sessions and the generation loop on tiny synthetic models: prefix reuse, stop conditions,
//! seeded sampling, cancellation and a full context.

use std::path::PathBuf;

use rill_engine::{
    Engine, EngineError, FinishCause, FinishReason, GenerateParams, Generation, Precision,
    SamplingParams,
};
use rill_gguf::{GgmlType, Value};
use rill_model::synthetic::{SyntheticModel, SyntheticSpec};

/// Writes the model to a file of its own (tests run in parallel, each with its own file).
fn write_model(name: &str, model: &SyntheticModel) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "rill-engine-{}-{n}-{name}.gguf",
        std::process::id()
    ));
    model.write_to_path(&path).unwrap();
    path
}

fn engine(name: &str, model: &SyntheticModel) -> Engine {
    let path = write_model(name, model);
    let engine = Engine::load(&path, 2, Precision::Fast).unwrap();
    std::fs::remove_file(path).unwrap();
    engine
}

fn tiny() -> Engine {
    engine("tiny", &SyntheticSpec::llama_tiny().build().unwrap())
}

/// A model whose output head is all zeros: every logit is 0, greedy picks token 0, which is
/// made the EOS token.
fn always_eos() -> Engine {
    let mut spec = SyntheticSpec::llama_tiny();
    spec.weight_type = GgmlType::F32;
    let mut m = spec.build().unwrap();
    m.tensor_mut("output.weight")
        .unwrap()
        .data
        .iter_mut()
        .for_each(|b| *b = 0);
    m.set_metadata("tokenizer.ggml.eos_token_id", Value::U32(0));
    engine("eos", &m)
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ..Default::default()
    }
}

#[test]
fn a_longer_prompt_reuses_the_cached_prefix_exactly() {
    let mut e = tiny();
    let a: Vec<u32> = "hello there".bytes().map(u32::from).collect();
    let ab: Vec<u32> = "hello there, general".bytes().map(u32::from).collect();
    let mut s = e.new_session(64).unwrap();
    assert_eq!(
        s.set_prompt(&mut e.model, e.precision, &a).unwrap(),
        (a.len(), 0)
    );
    assert_eq!(
        s.set_prompt(&mut e.model, e.precision, &ab).unwrap(),
        (ab.len() - a.len(), a.len())
    );
    let reused = s.last_logits().to_vec();
    let mut fresh = e.new_session(64).unwrap();
    fresh.set_prompt(&mut e.model, e.precision, &ab).unwrap();
    assert_eq!(reused, fresh.last_logits());
    // The same prompt again computes nothing; a diverging one keeps the common prefix.
    assert_eq!(
        s.set_prompt(&mut e.model, e.precision, &ab).unwrap(),
        (0, ab.len())
    );
    let ac: Vec<u32> = "hello world".bytes().map(u32::from).collect();
    assert_eq!(
        s.set_prompt(&mut e.model, e.precision, &ac).unwrap(),
        (5, 6)
    );
    let mut fresh = e.new_session(64).unwrap();
    fresh.set_prompt(&mut e.model, e.precision, &ac).unwrap();
    assert_eq!(s.last_logits(), fresh.last_logits());
}

#[test]
fn generation_stops_at_end_of_generation_unless_ignored() {
    let mut e = always_eos();
    let prompt = [72u32, 105];
    let mut s = e.new_session(32).unwrap();
    let g = s.generate(&mut e, &prompt, &greedy(10), |_| true).unwrap();
    assert_eq!(g.finish_reason, FinishReason::Stop);
    assert_eq!(g.tokens, vec![0]);
    assert_eq!(g.text, "");
    let params = GenerateParams {
        ignore_eos: true,
        ..greedy(5)
    };
    let g = s.generate(&mut e, &prompt, &params, |_| true).unwrap();
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.tokens, vec![0; 5]);
}

#[test]
fn same_seed_same_tokens_and_streamed_text_adds_up() {
    let mut e = tiny();
    let prompt: Vec<u32> = "abc".bytes().map(u32::from).collect();
    let params = |seed| GenerateParams {
        max_tokens: 24,
        sampling: SamplingParams::with_temperature(1.0, seed),
        ignore_eos: true,
        ..Default::default()
    };
    let mut run = |seed| {
        let mut s = e.new_session(64).unwrap();
        let mut streamed = String::new();
        let g = s
            .generate(&mut e, &prompt, &params(seed), |ev| {
                streamed.push_str(ev.text);
                true
            })
            .unwrap();
        assert_eq!(streamed, g.text);
        g.tokens
    };
    let a = run(7);
    assert_eq!(a, run(7));
    assert_ne!(a, run(8));
}

#[test]
fn cancellation_and_a_full_context_end_generation_cleanly() {
    let mut e = tiny();
    let prompt: Vec<u32> = "abc".bytes().map(u32::from).collect();
    let mut s = e.new_session(64).unwrap();
    let g = s
        .generate(
            &mut e,
            &prompt,
            &GenerateParams {
                ignore_eos: true,
                ..greedy(50)
            },
            |ev| ev.index < 2,
        )
        .unwrap();
    assert_eq!(g.finish_reason, FinishReason::Cancelled);
    assert_eq!(g.tokens.len(), 3);

    let mut s = e.new_session(5).unwrap();
    let g = s
        .generate(
            &mut e,
            &prompt,
            &GenerateParams {
                ignore_eos: true,
                ..greedy(50)
            },
            |_| true,
        )
        .unwrap();
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.finish, FinishCause::ContextFull { context: 5 });
    assert_eq!(s.tokens().len(), 5);

    let long: Vec<u32> = (0..6).collect();
    assert!(matches!(
        s.generate(&mut e, &long, &greedy(1), |_| true),
        Err(EngineError::PromptTooLong {
            prompt: 6,
            context: 5
        })
    ));
    assert!(matches!(
        s.generate(&mut e, &[], &greedy(1), |_| true),
        Err(EngineError::EmptyPrompt)
    ));
    let bad = SamplingParams::with_temperature(-1.0, 0);
    assert!(s
        .generate(
            &mut e,
            &prompt,
            &GenerateParams {
                sampling: bad,
                ..greedy(1)
            },
            |_| true
        )
        .is_err());
}

#[test]
fn chat_prompt_renders_the_template_once_with_control_tokens() {
    let e = tiny();
    let ids = e
        .chat_prompt(&[rill_tokenizer::ChatMessage::new("user", "hi")])
        .unwrap();
    let text = e.tokenizer.decode_with(&ids, true);
    assert_eq!(
        text,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(ids[0], rill_model::synthetic::IM_START_ID);
}

// ---------------------------------------------------------------------------------------------
// The sampler chain, stop conditions and log-probabilities in the generation loop.

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// Greedy tokens and text after `prompt`, past end-of-generation tokens.
fn greedy_run(e: &mut Engine, prompt: &[u32], n: usize) -> Generation {
    let mut s = e.new_session(256).unwrap();
    s.generate(
        e,
        prompt,
        &GenerateParams {
            ignore_eos: true,
            ..greedy(n)
        },
        |_| true,
    )
    .unwrap()
}

#[test]
fn the_full_chain_is_reproducible_from_its_seed_and_reuses_nothing_random() {
    let mut e = tiny();
    let prompt = bytes("the chain");
    let params = |seed| GenerateParams {
        max_tokens: 32,
        ignore_eos: true,
        sampling: SamplingParams {
            temperature: 0.9,
            seed,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.02,
            typical_p: 0.98,
            repeat_penalty: 1.3,
            repeat_last_n: 16,
            presence_penalty: 0.2,
            frequency_penalty: 0.1,
            logit_bias: vec![(b'a'.into(), 1.0)],
            banned_tokens: vec![b'e'.into()],
            ..SamplingParams::default()
        },
        ..Default::default()
    };
    let mut s = e.new_session(128).unwrap();
    let a = s.generate(&mut e, &prompt, &params(3), |_| true).unwrap();
    // Again on the same session (the prompt comes from the cache) and on a fresh one.
    let b = s.generate(&mut e, &prompt, &params(3), |_| true).unwrap();
    // All but the last prompt token, whose logits are computed again.
    assert_eq!(b.prompt_tokens_reused, prompt.len() - 1);
    let mut fresh = e.new_session(128).unwrap();
    let c = fresh
        .generate(&mut e, &prompt, &params(3), |_| true)
        .unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.tokens, c.tokens);
    assert!(!a.tokens.contains(&u32::from(b'e')));
    let d = fresh
        .generate(&mut e, &prompt, &params(4), |_| true)
        .unwrap();
    assert_ne!(a.tokens, d.tokens);
}

#[test]
fn min_tokens_suppresses_end_of_generation() {
    let mut e = always_eos();
    let prompt = [72u32, 105];
    let mut s = e.new_session(32).unwrap();
    let g = s
        .generate(
            &mut e,
            &prompt,
            &GenerateParams {
                min_tokens: 3,
                ..greedy(10)
            },
            |_| true,
        )
        .unwrap();
    // Every logit is 0: token 0 (EOS) wins unless suppressed; then token 1.
    assert_eq!(g.tokens, vec![1, 1, 1, 0]);
    assert_eq!(g.finish_reason, FinishReason::Stop);
    assert_eq!(g.finish, FinishCause::EndOfGeneration(0));
    assert_eq!(g.stop_token(), Some(0));
    assert_eq!(g.text, "\u{1}\u{1}\u{1}");
}

#[test]
fn stop_token_ids_end_generation_and_are_not_in_the_text() {
    let mut e = tiny();
    let prompt = bytes("stop tokens");
    let base = greedy_run(&mut e, &prompt, 16);
    let stop = base.tokens[6];
    let at = base.tokens.iter().position(|&t| t == stop).unwrap();
    let mut s = e.new_session(128).unwrap();
    let params = GenerateParams {
        stop_token_ids: vec![stop],
        ignore_eos: true,
        ..greedy(16)
    };
    let mut last_reason = None;
    let g = s
        .generate(&mut e, &prompt, &params, |ev| {
            last_reason = ev.finish_reason;
            true
        })
        .unwrap();
    assert_eq!(g.tokens, base.tokens[..=at]);
    assert_eq!(g.finish, FinishCause::StopToken(stop));
    assert_eq!(last_reason, Some(FinishReason::Stop));
    assert_eq!(g.text, e.tokenizer.decode(&base.tokens[..at]));
    // With min_tokens past it, the stop token cannot be sampled that early.
    let g = s
        .generate(
            &mut e,
            &prompt,
            &GenerateParams {
                min_tokens: at + 1,
                ..params
            },
            |_| true,
        )
        .unwrap();
    assert!(!g.tokens[..=at].contains(&stop), "{:?}", g.tokens);
}

#[test]
fn stop_strings_cut_the_text_and_are_never_streamed() {
    let mut e = tiny();
    let prompt = bytes("stop strings");
    let base = greedy_run(&mut e, &prompt, 40);
    let chars: Vec<char> = base.text.chars().collect();
    assert!(chars.len() >= 12, "{:?}", base.text);
    for (from, len) in [(0usize, 1usize), (5, 2), (9, 3)] {
        let stop: String = chars[from..from + len].iter().collect();
        let cut = base.text.find(&stop).unwrap();
        let mut s = e.new_session(128).unwrap();
        let mut streamed = String::new();
        let mut pieces = Vec::new();
        let g = s
            .generate(
                &mut e,
                &prompt,
                &GenerateParams {
                    stop: vec!["never seen \u{0}".into(), stop.clone()],
                    ignore_eos: true,
                    ..greedy(40)
                },
                |ev| {
                    streamed.push_str(ev.text);
                    pieces.push(ev.text.to_string());
                    true
                },
            )
            .unwrap();
        assert_eq!(g.text, base.text[..cut], "stop {stop:?}");
        assert_eq!(streamed, g.text);
        assert_eq!(g.finish, FinishCause::StopString(stop.clone()));
        assert_eq!(g.stop_string(), Some(stop.as_str()));
        assert_eq!(g.finish_reason, FinishReason::Stop);
        assert!(pieces.iter().all(|p| !p.contains(&stop)));
        assert!(g.tokens.len() <= base.tokens.len());
        assert_eq!(g.tokens, base.tokens[..g.tokens.len()]);
    }
}

/// log-softmax of a row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

fn entropy(lp: &[f64]) -> f64 {
    lp.iter().map(|&l| -l.exp() * l).sum()
}

#[test]
fn token_logprobs_raw_and_processed() {
    let mut e = tiny();
    let prompt = bytes("logprobs");
    // Nobody asks: nothing is computed.
    let mut s = e.new_session(128).unwrap();
    let g = s
        .generate(&mut e, &prompt, &greedy(4), |ev| {
            assert!(ev.logprobs.is_none());
            true
        })
        .unwrap();
    assert!(g.logprobs.is_empty() && g.prompt_logprobs.is_empty());

    let params = GenerateParams {
        max_tokens: 12,
        ignore_eos: true,
        top_logprobs: Some(5),
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 3,
            seed: 5,
            ..SamplingParams::default()
        },
        ..Default::default()
    };
    let mut events = Vec::new();
    let g = s
        .generate(&mut e, &prompt, &params, |ev| {
            events.push((ev.token, ev.probability, ev.logprobs.cloned().unwrap()));
            true
        })
        .unwrap();
    assert_eq!(g.logprobs.len(), g.tokens.len());
    for (i, (token, probability, lp)) in events.iter().enumerate() {
        assert_eq!(&g.logprobs[i], lp);
        assert_eq!(lp.token, *token);
        assert!((lp.logprob - probability.ln()).abs() < 1e-6);
        // Processed: the top-k 3 survivors only, the token among them, probabilities summing to
        // 1, tempered entropy.
        assert_eq!(lp.top.len(), 3);
        assert!(lp
            .top
            .iter()
            .any(|&(t, l)| t == *token && (l - lp.logprob).abs() < 1e-6));
        let total: f32 = lp.top.iter().map(|&(_, l)| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        let h: f32 = lp.top.iter().map(|&(_, l)| -l.exp() * l).sum();
        assert!((h - lp.entropy).abs() < 1e-5);
        // Raw: the log-softmax of the logits at that step, recomputed from scratch.
        let mut fresh = e.new_session(128).unwrap();
        let mut seq = prompt.clone();
        seq.extend_from_slice(&g.tokens[..i]);
        fresh.set_prompt(&mut e.model, e.precision, &seq).unwrap();
        let want = log_softmax(fresh.last_logits());
        assert!((lp.raw_logprob as f64 - want[*token as usize]).abs() < 1e-4);
        assert!((lp.raw_entropy as f64 - entropy(&want)).abs() < 1e-4);
        assert_eq!(lp.raw_top.len(), 5);
        let mut order: Vec<usize> = (0..want.len()).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
        for (j, &(t, l)) in lp.raw_top.iter().enumerate() {
            assert_eq!(t as usize, order[j]);
            assert!((l as f64 - want[order[j]]).abs() < 1e-4);
        }
        // The processed survivors are the raw top 3.
        let mut processed: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        processed.sort_unstable();
        let mut raw3: Vec<u32> = lp.raw_top[..3].iter().map(|t| t.0).collect();
        raw3.sort_unstable();
        assert_eq!(processed, raw3);
    }
    // Greedy: the processed distribution is one token, certain.
    let g = s
        .generate(
            &mut e,
            &prompt,
            &GenerateParams {
                top_logprobs: Some(0),
                ..greedy(3)
            },
            |_| true,
        )
        .unwrap();
    for lp in &g.logprobs {
        assert_eq!((lp.logprob, lp.entropy), (0.0, 0.0));
        assert!(lp.top.is_empty() && lp.raw_top.is_empty());
        assert!(lp.raw_logprob < 0.0);
    }
}

#[test]
fn prompt_logprobs_match_a_full_batch_log_softmax() {
    let mut e = tiny();
    // Long enough for several chunks of prompt logits.
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 37 + 11) % 256).collect();
    let mut kv = e.model.new_kv_cache(256, e.precision).unwrap();
    kv.add_sequence(0).unwrap();
    let mut rows = Vec::new();
    e.model
        .forward(
            &rill_model::Batch::prompt(0, &prompt, 0, true),
            &mut kv,
            e.precision,
            &mut rows,
        )
        .unwrap();
    let vocab = e.model.config().vocab_size;
    assert_eq!(rows.len(), prompt.len() * vocab);

    let mut s = e.new_session(256).unwrap();
    // A cached prefix is not reused: its logits are gone.
    s.set_prompt(&mut e.model, e.precision, &prompt[..100])
        .unwrap();
    let params = GenerateParams {
        prompt_logprobs: true,
        top_logprobs: Some(4),
        ..greedy(5)
    };
    let g = s.generate(&mut e, &prompt, &params, |_| true).unwrap();
    assert_eq!((g.prompt_tokens_computed, g.prompt_tokens_reused), (150, 0));
    assert_eq!(g.prompt_logprobs.len(), prompt.len() - 1);
    for (i, p) in g.prompt_logprobs.iter().enumerate() {
        assert_eq!(p.position, i + 1);
        assert_eq!(p.token, prompt[i + 1]);
        let want = log_softmax(&rows[i * vocab..(i + 1) * vocab]);
        assert!(
            (p.logprob as f64 - want[prompt[i + 1] as usize]).abs() < 1e-4,
            "position {}: {} vs {}",
            i + 1,
            p.logprob,
            want[prompt[i + 1] as usize]
        );
        assert!((p.entropy as f64 - entropy(&want)).abs() < 1e-4);
        assert_eq!(p.top.len(), 4);
        let best = (0..vocab).max_by(|&a, &b| want[a].total_cmp(&want[b]).then(b.cmp(&a)));
        assert_eq!(Some(p.top[0].0 as usize), best);
    }
    // The generation itself is unchanged by asking.
    let plain = greedy_run(&mut e, &prompt, 5);
    assert_eq!(g.tokens, plain.tokens);
}

#[test]
fn bad_generation_parameters_are_refused_with_clear_errors() {
    let mut e = tiny();
    let prompt = bytes("x");
    let mut s = e.new_session(16).unwrap();
    let mut err = |params: GenerateParams| {
        s.generate(&mut e, &prompt, &params, |_| true)
            .unwrap_err()
            .to_string()
    };
    let msg = err(GenerateParams {
        stop_token_ids: vec![259],
        ..greedy(1)
    });
    assert!(
        msg.contains("stop_token_ids") && msg.contains("259"),
        "{msg}"
    );
    let msg = err(GenerateParams {
        top_logprobs: Some(21),
        ..greedy(1)
    });
    assert!(msg.contains("top_logprobs") && msg.contains("20"), "{msg}");
    let msg = err(GenerateParams {
        stop: vec![String::new()],
        ..greedy(1)
    });
    assert!(msg.contains("stop string"), "{msg}");
    let msg = err(GenerateParams {
        sampling: SamplingParams {
            top_p: f32::NAN,
            ..SamplingParams::default()
        },
        ..greedy(1)
    });
    assert!(msg.contains("top_p"), "{msg}");
    let msg = err(GenerateParams {
        sampling: SamplingParams {
            banned_tokens: vec![1 << 20],
            ..SamplingParams::default()
        },
        ..greedy(1)
    });
    assert!(msg.contains("banned_tokens"), "{msg}");
}

#[test]
fn a_full_context_stops_with_length_and_says_so() {
    let mut e = tiny();
    let prompt = bytes("abcd");
    let mut s = e.new_session(6).unwrap();
    let mut flushed_at_end = None;
    let g = s
        .generate(
            &mut e,
            &prompt,
            &GenerateParams {
                ignore_eos: true,
                ..greedy(100)
            },
            |ev| {
                flushed_at_end = ev.finish_reason;
                true
            },
        )
        .unwrap();
    assert_eq!(g.finish, FinishCause::ContextFull { context: 6 });
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(flushed_at_end, Some(FinishReason::Length));
    assert_eq!(g.tokens.len(), 3);
    assert!(g.finish.to_string().contains("context is full (6 tokens)"));
    // A prompt that fills the context still gets one token.
    let full = bytes("abcdef");
    let g = s
        .generate(
            &mut e,
            &full,
            &GenerateParams {
                ignore_eos: true,
                ..greedy(9)
            },
            |_| true,
        )
        .unwrap();
    assert_eq!(g.tokens.len(), 1);
    assert_eq!(g.finish_reason, FinishReason::Length);
    let g = s.generate(&mut e, &full, &greedy(1), |_| true).unwrap();
    assert_eq!(g.finish, FinishCause::MaxTokens(1));
}
