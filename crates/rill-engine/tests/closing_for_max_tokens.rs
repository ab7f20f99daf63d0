//! Constrained answers that end: with `max_tokens` about to cut a constrained text, the decoder
//! forces a closing, so the answer is a complete document (finish `length`, cause
//! `ClosedForMaxTokens`), the same in sessions and in the serving loop. SmolLM2, greedy.

mod common;

use std::sync::Arc;

use rill_constrain::{Constrainer, ConstraintSpec};
use rill_engine::{
    spawn, Engine, FinishCause, FinishReason, GenerateParams, Generation, Precision,
    SamplingParams, ServeConfig, ServeRequest,
};
use rill_tokenizer::ChatMessage;
use serde_json::{json, Value};

fn story_schema() -> ConstraintSpec {
    ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "story": {"type": "string"},
            "moral": {"type": "string"}
        },
        "required": ["title", "story", "moral"],
        "additionalProperties": false
    }))
}

fn generate(
    engine: &mut Engine,
    prompt: &[u32],
    spec: &ConstraintSpec,
    constrainer: &Constrainer,
    max_tokens: usize,
) -> (GenerateParams, Generation) {
    let params = GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        constraint: Some(constrainer.compile(spec).unwrap()),
        ..GenerateParams::default()
    };
    let mut s = engine.new_session(2048).unwrap();
    let g = s.generate(engine, prompt, &params, |_| true).unwrap();
    (params, g)
}

#[test]
fn a_long_answer_is_closed_into_a_valid_document_within_max_tokens() {
    let mut engine = common::engine("smollm2-135m", Precision::Fast);
    let constrainer = Constrainer::new(engine.tokenizer.clone()).unwrap();
    let prompt = engine
        .chat_prompt(&[ChatMessage::new(
            "user",
            "Write a very long story about a lighthouse keeper, as JSON with a title, the story \
             and its moral.",
        )])
        .unwrap();
    let mut closed = 0;
    for max_tokens in [14, 20, 33, 48, 70] {
        let (_, g) = generate(
            &mut engine,
            &prompt,
            &story_schema(),
            &constrainer,
            max_tokens,
        );
        assert!(
            g.tokens.len() <= max_tokens,
            "{max_tokens}: {}",
            g.tokens.len()
        );
        let v: Value = serde_json::from_str(&g.text)
            .unwrap_or_else(|e| panic!("max_tokens {max_tokens}: {:?} ({e})", g.text));
        for key in ["title", "story", "moral"] {
            assert!(v[key].is_string(), "{}", g.text);
        }
        match g.finish {
            FinishCause::ClosedForMaxTokens {
                max_tokens: m,
                closing,
            } => {
                assert_eq!(m, max_tokens);
                assert_eq!(g.finish_reason, FinishReason::Length);
                assert!(closing >= 1 && closing <= g.forced_tokens, "{closing}");
                closed += 1;
            }
            // Never cut mid-document: an answer that is not closed ended on its own.
            ref other => assert_eq!(g.finish_reason, FinishReason::Stop, "{other}"),
        }
    }
    // Which budgets the model fills depends on the kernel path's rounding (greedy answers of a
    // 135M model; the AVX2 path's story is shorter): 5 of 5 closed on AVX512-VNNI, 3 on AVX2.
    // 14 tokens cannot hold three keys' values of any story: at least those are closed.
    assert!(closed >= 2, "{closed} closed");
}

#[test]
fn regexes_are_closed_too() {
    let mut engine = common::engine("smollm2-135m", Precision::Fast);
    let constrainer = Constrainer::new(engine.tokenizer.clone()).unwrap();
    let prompt = engine
        .chat_prompt(&[ChatMessage::new("user", "Describe the sea at length.")])
        .unwrap();
    let spec = ConstraintSpec::Regex(r"[A-Za-z ,]+\. The end\.".into());
    for max_tokens in [6, 9] {
        let (_, g) = generate(&mut engine, &prompt, &spec, &constrainer, max_tokens);
        assert!(g.tokens.len() <= max_tokens);
        assert!(g.text.ends_with(". The end."), "{:?}", g.text);
        assert!(matches!(g.finish, FinishCause::ClosedForMaxTokens { .. }));
    }
}

/// The serving loop decodes with the same decoder: the same tokens, text and cause.
#[test]
fn the_serving_loop_closes_as_sessions_do() {
    let mut engine = common::engine("smollm2-135m", Precision::Fast);
    let constrainer = Arc::new(Constrainer::new(engine.tokenizer.clone()).unwrap());
    let prompt = engine
        .chat_prompt(&[ChatMessage::new(
            "user",
            "Tell a long fable as JSON with a title, the story and its moral.",
        )])
        .unwrap();
    let (params, want) = generate(&mut engine, &prompt, &story_schema(), &constrainer, 40);
    assert!(matches!(
        want.finish,
        FinishCause::ClosedForMaxTokens { .. }
    ));
    let h = spawn(
        engine,
        ServeConfig {
            kv_cache_bytes: 64 << 20,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let mut stream = h.submit(ServeRequest::new(prompt, params)).unwrap();
    let (tokens, text, cause) = common::collect_text(&mut stream);
    assert_eq!(tokens, want.tokens);
    assert_eq!(text, want.text);
    assert_eq!(cause, Some(want.finish));
    h.shutdown();
}
