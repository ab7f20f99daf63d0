//! Sessions and the generation loop on tiny synthetic models: prefix reuse, stop conditions,
//! seeded sampling, cancellation and a full context.

use std::path::PathBuf;

use rill_engine::{Engine, EngineError, FinishReason, GenerateParams, Precision, SamplingParams};
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
        sampling: SamplingParams {
            temperature: 1.0,
            seed,
        },
        ignore_eos: true,
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
    let bad = SamplingParams {
        temperature: -1.0,
        seed: 0,
    };
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
