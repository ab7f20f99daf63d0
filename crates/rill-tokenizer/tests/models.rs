//! Behaviour on the two real models: special tokens, BOS handling, end-of-generation ids,
//! decoding, streaming, chat templates, speed.

mod common;

use std::time::Instant;

use proptest::prelude::*;
use rill_tokenizer::{ChatMessage, ChatTemplateSource, ModelKind, Tokenizer};

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello! How can I help?"),
        ChatMessage::new("user", "What is 2+2?"),
    ]
}

#[test]
fn smollm2_metadata() {
    let t = common::smollm2();
    assert_eq!(t.model_kind(), ModelKind::Bpe);
    assert_eq!(t.pre_tokenizer(), "smollm");
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.merge_count(), 48900);
    assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
    assert!(!t.add_bos());
    assert_eq!(t.token_text(1), Some("<|im_start|>"));
    assert_eq!(t.token_id("<|im_end|>"), Some(2));
    assert!(t.is_control(1));
    assert!(!t.is_control(100));
    assert_eq!(t.eot_id(), Some(2));
    // <|endoftext|>, <|im_end|>, and <reponame> (llama.cpp's FIM-repo detection).
    assert_eq!(t.end_of_generation_ids(), &[0, 2, 4]);
    assert!(t.is_end_of_generation(2));
    assert!(!t.is_end_of_generation(1));
    assert_eq!(t.chat_template_source(), Some(ChatTemplateSource::Metadata));
}

#[test]
fn gemma3_metadata() {
    let t = common::gemma3();
    assert_eq!(t.model_kind(), ModelKind::Spm);
    assert_eq!(t.vocab_size(), 262144);
    assert_eq!((t.bos_id(), t.eos_id()), (Some(2), Some(1)));
    assert!(t.add_bos());
    assert!(!t.add_space_prefix());
    assert_eq!(t.eot_id(), Some(106)); // <end_of_turn>
                                       // <eos>, <end_of_turn>, and "</s>" (type user-defined, forced to control by llama.cpp).
    assert_eq!(t.end_of_generation_ids(), &[1, 106, 212]);
    assert!(t.is_control(212));
    assert_eq!(
        t.chat_template(),
        Some(rill_tokenizer::ChatTemplate::GEMMA3)
    );
    assert_eq!(
        t.chat_template_source(),
        Some(ChatTemplateSource::BuiltinGemma)
    );
}

#[test]
fn bos_is_added_once() {
    let t = common::gemma3();
    let ids = t.encode_with_special("Hello world", true, false);
    assert_eq!(ids, vec![2, 9259, 1902]);
    // Text that already starts with <bos> (as the chat template renders it) gets no second one.
    let ids = t.encode_with_special("<bos>Hello world", true, true);
    assert_eq!(ids, vec![2, 9259, 1902]);
    assert_eq!(
        t.encode_with_special("Hello world", false, false),
        vec![9259, 1902]
    );
    // SmolLM2 does not add BOS.
    let s = common::smollm2();
    assert_eq!(
        s.encode_with_special("Hello world", true, false),
        s.encode("Hello world", false)
    );
}

#[test]
fn decode_roundtrips_reference_texts() {
    for (tok, model) in [
        (common::smollm2(), "smollm2-135m-instruct-q4_1"),
        (common::gemma3(), "gemma3-270m-q4_k_m"),
    ] {
        for case in common::cases(model) {
            assert_eq!(tok.decode(&case.ids), case.text, "{model}");
            assert_eq!(
                tok.decode_with(&case.ids_parse_special, true),
                case.text,
                "{model}"
            );
        }
    }
}

#[test]
fn control_tokens_render_only_on_request() {
    let t = common::smollm2();
    let ids = t.encode("<|im_start|>user\nHi<|im_end|>", true);
    assert_eq!(t.decode(&ids), "user\nHi");
    assert_eq!(t.decode_with(&ids, true), "<|im_start|>user\nHi<|im_end|>");
    assert_eq!(&*t.token_to_bytes(1, false).unwrap(), b"");
    assert_eq!(&*t.token_to_bytes(1, true).unwrap(), b"<|im_start|>");
    let g = common::gemma3();
    assert_eq!(&*g.token_to_bytes(238, false).unwrap(), &[0u8]); // <0x00>
    assert_eq!(&*g.token_to_bytes(236743, false).unwrap(), b" "); // "▁"
}

#[test]
fn invalid_ids_do_not_panic() {
    for t in [common::smollm2(), common::gemma3()] {
        let n = t.vocab_size() as u32;
        assert!(t.token_to_bytes(n, true).is_err());
        assert!(t.token_to_bytes(u32::MAX, false).is_err());
        assert_eq!(t.decode(&[n, u32::MAX]), "");
        assert!(t.token_text(n).is_none());
        assert!(!t.is_control(n) && !t.is_end_of_generation(n));
        let mut d = t.stream_decoder();
        assert_eq!(d.push(u32::MAX), "");
    }
}

/// Streaming the ids one by one yields exactly `decode` of all of them, and never a partial
/// character in between.
fn check_stream(tok: &Tokenizer, ids: &[u32]) {
    let mut decoder = tok.stream_decoder();
    let mut streamed = String::new();
    for &id in ids {
        let piece = decoder.push(id);
        streamed.push_str(&piece);
    }
    streamed.push_str(&decoder.finish());
    assert_eq!(streamed, tok.decode(ids));
}

#[test]
fn stream_decoder_holds_partial_characters() {
    let t = common::smollm2();
    // "🚀" is split over three byte-level tokens: nothing is emitted until it is complete.
    let ids = t.encode("🚀!", false);
    assert!(ids.len() >= 3);
    let mut d = t.stream_decoder();
    let outputs: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    assert_eq!(outputs.concat(), "🚀!");
    assert_eq!(outputs[0], "");
    assert!(outputs
        .iter()
        .all(|o| o.is_empty() || o.starts_with('🚀') || o == "!"));
    // A sequence cut off at the end is flushed lossily.
    let mut d = t.stream_decoder();
    assert_eq!(d.push(ids[0]), "");
    assert!(!d.pending_bytes().is_empty());
    assert_eq!(d.finish(), "\u{FFFD}");
    for model in ["smollm2-135m-instruct-q4_1", "gemma3-270m-q4_k_m"] {
        let tok = if model.starts_with("smollm") {
            common::smollm2()
        } else {
            common::gemma3()
        };
        for case in common::cases(model) {
            check_stream(tok, &case.ids);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn stream_equals_decode_on_arbitrary_id_sequences(
        ids in proptest::collection::vec(0u32..49152, 0..40),
        gemma_ids in proptest::collection::vec(0u32..262144, 0..40),
    ) {
        check_stream(common::smollm2(), &ids);
        check_stream(common::gemma3(), &gemma_ids);
    }

    #[test]
    fn encode_decode_roundtrip_on_arbitrary_text(text in "\\PC{0,60}") {
        // Both tokenizers are lossless on text without special-token markup.
        prop_assert_eq!(common::smollm2().decode(&common::smollm2().encode(&text, false)), text.clone());
        prop_assert_eq!(common::gemma3().decode(&common::gemma3().encode(&text, false)), text);
    }
}

#[test]
fn smollm2_chat_template() {
    let t = common::smollm2();
    let out = t.apply_chat_template(&conversation(), true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello! How can I help?<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let ids = t.encode_with_special(&out, true, true);
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 5);
    assert!(ids.ends_with(&t.encode("<|im_start|>assistant\n", true)));
}

#[test]
fn gemma3_chat_template() {
    let t = common::gemma3();
    let out = t.apply_chat_template(&conversation(), true).unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n\
         <start_of_turn>model\nHello! How can I help?<end_of_turn>\n\
         <start_of_turn>user\nWhat is 2+2?<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    let ids = t.encode_with_special(&out, true, true);
    assert_eq!(&ids[..3], &[2, 105, 2364]); // <bos> <start_of_turn> user (one BOS only)
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
}

#[test]
fn malicious_template_runs_out_of_fuel() {
    let t = common::gemma3();
    let template =
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}";
    // 10^10 iterations: only the fuel limit ends it (the error says so).
    let err = rill_tokenizer::ChatTemplate::new(template, "<bos>", "<eos>")
        .render(&conversation(), true)
        .unwrap_err();
    assert!(
        matches!(err, rill_tokenizer::TokenizerError::Template(_)),
        "{err}"
    );
    assert!(err.to_string().contains("fuel"), "{err}");
    let _ = t;
}

#[test]
/// Reports the encoding speed of a few KB (benchmarks report, tests never assert timings) and
/// checks the round trip.
fn encoding_a_few_kilobytes_round_trips() {
    let text =
        "The quick brown fox jumps over the lazy dog. 1234567890 — naïve café, 東京! \n".repeat(64);
    assert!(text.len() > 4000);
    for t in [common::smollm2(), common::gemma3()] {
        let _ = t.encode(&text, true);
        let start = Instant::now();
        let ids = t.encode(&text, true);
        let elapsed = start.elapsed();
        assert!(!ids.is_empty());
        eprintln!(
            "{:?}: {} bytes -> {} tokens in {elapsed:?}",
            t.model_kind(),
            text.len(),
            ids.len()
        );
        assert_eq!(t.decode(&ids), text);
    }
}
