//! Tiny hand-written vocabularies: algorithm details, defaults, errors, and no panics on any
//! input. No model files needed.

use proptest::prelude::*;
use rill_gguf::{Metadata, Value};
use rill_tokenizer::{ModelKind, TokenType, Tokenizer, TokenizerError, VocabConfig};

/// Byte-level BPE: the 256 byte characters, a few merges, and two control tokens.
fn tiny_bpe(pre: &str) -> VocabConfig {
    let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string()];
    // GPT-2 byte characters, in byte order.
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cp = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        tokens.push(char::from_u32(cp).unwrap().to_string());
    }
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut cfg = VocabConfig::new(ModelKind::Bpe, tokens);
    cfg.pre_tokenizer = pre.to_string();
    cfg.merges = merges.iter().map(|s| s.to_string()).collect();
    cfg.token_types = (0..cfg.tokens.len())
        .map(|i| {
            if i < 2 {
                TokenType::Control
            } else {
                TokenType::Normal
            }
        })
        .collect();
    cfg.special.bos = Some(0);
    cfg.special.eos = Some(0);
    cfg
}

/// SentencePiece: control tokens, byte fallback for all 256 bytes, a few scored pieces.
fn tiny_spm() -> VocabConfig {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into(), "<ctl>".into()];
    let mut types = vec![
        TokenType::Unknown,
        TokenType::Control,
        TokenType::Control,
        TokenType::Control,
    ];
    let mut scores = vec![0.0f32; 4];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte);
        scores.push(0.0);
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -2.0),
        ("t", -2.0),
        ("e", -2.0),
        ("r", -2.0),
        ("▁h", -3.0),
        ("▁hi", -1.5),
        ("▁t", -3.0),
        ("he", -3.0),
        ("▁the", -2.5),
        ("re", -3.0),
        ("▁there", -1.0),
    ] {
        tokens.push(piece.into());
        types.push(TokenType::Normal);
        scores.push(score);
    }
    let mut cfg = VocabConfig::new(ModelKind::Spm, tokens);
    cfg.token_types = types;
    cfg.scores = scores;
    cfg
}

fn ids_to_texts(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&i| t.token_text(i).unwrap().to_string())
        .collect()
}

#[test]
fn bpe_merges_and_specials() {
    let t = Tokenizer::from_config(tiny_bpe("gpt-2")).unwrap();
    let ids = t.encode("hello world", false);
    assert_eq!(ids_to_texts(&t, &ids), ["hello", "Ġworld"]);
    assert_eq!(t.decode(&ids), "hello world");
    let ids = t.encode("<|im_start|>hello", true);
    assert_eq!(ids_to_texts(&t, &ids), ["<|im_start|>", "hello"]);
    let ids = t.encode("<|im_start|>", false);
    assert_eq!(
        ids.len(),
        12,
        "without parse_special the marker is plain text"
    );
    // BPE defaults: no BOS unless asked, no space prefix.
    assert!(!t.add_bos());
    assert!(!t.add_space_prefix());
    // <|endoftext|> is end-of-generation by its text.
    assert!(t.is_end_of_generation(0));
    assert_eq!(t.eot_id(), Some(0));
}

#[test]
fn bpe_pre_tokenizers_are_validated() {
    for pre in [
        "default",
        "",
        "gpt-2",
        "llama3",
        "llama-bpe",
        "qwen2",
        "qwen35",
        "smollm",
        "falcon",
        "deepseek-llm",
        "deepseek-coder",
    ] {
        let t = Tokenizer::from_config(tiny_bpe(pre)).unwrap();
        assert_eq!(
            t.decode(&t.encode("héllo  wörld 12345!?", false)),
            "héllo  wörld 12345!?"
        );
    }
    let llama3 = Tokenizer::from_config(tiny_bpe("llama3")).unwrap();
    assert!(
        llama3.add_bos(),
        "llama3 pre-tokenizer implies add_bos by default"
    );
    let err = Tokenizer::from_config(tiny_bpe("tekken")).unwrap_err();
    assert!(matches!(&err, TokenizerError::UnsupportedPreTokenizer(n) if n == "tekken"));
    assert!(err.to_string().contains("smollm"), "{err}");
}

/// Gemma 4: merges over raw UTF-8 with `▁` for spaces, `<0xNN>` byte fallback, BOS forced on.
#[test]
fn gemma4_merges_raw_text_with_byte_fallback() {
    let mut tokens: Vec<String> = vec!["<pad>".into(), "<eos>".into(), "<bos>".into()];
    let mut types = vec![TokenType::Control; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte);
    }
    let merges = ["h e", "l l", "he ll", "hell o", "\u{2581} w", "\n \n"];
    for piece in ["\u{2581}", "h", "e", "l", "o", "w", "r", "d", "\n"] {
        tokens.push(piece.to_string());
        types.push(TokenType::Normal);
    }
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(TokenType::Normal);
    }
    let mut cfg = VocabConfig::new(ModelKind::Gemma4, tokens);
    cfg.token_types = types;
    cfg.merges = merges.iter().map(|s| s.to_string()).collect();
    cfg.pre_tokenizer = "ignored".into();
    cfg.special.bos = Some(2);
    cfg.special.eos = Some(1);
    cfg.add_bos = Some(false);
    let t = Tokenizer::from_config(cfg).unwrap();
    assert_eq!(t.model_kind(), ModelKind::Gemma4);
    assert_eq!(t.pre_tokenizer(), "gemma4");
    assert!(t.add_bos(), "llama.cpp forces add_bos for gemma4");
    assert!(!t.add_space_prefix());

    let text = "hello w\u{f6}rld\n\n\n";
    let ids = t.encode(text, false);
    let pieces: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(
        pieces,
        [
            "hello",
            "\u{2581}w",
            "<0xC3>",
            "<0xB6>",
            "r",
            "l",
            "d",
            "\n\n",
            "\n"
        ]
    );
    assert_eq!(t.decode(&ids), text);
    assert_eq!(t.encode_with_special("\n\n", true, false)[0], 2);
}

#[test]
fn spm_scores_space_prefix_and_byte_fallback() {
    let t = Tokenizer::from_config(tiny_spm()).unwrap();
    assert!(t.add_bos() && t.add_space_prefix());
    assert_eq!(
        (t.bos_id(), t.eos_id(), t.unk_id()),
        (Some(1), Some(2), Some(0))
    );
    let ids = t.encode("hi there", false);
    assert_eq!(ids_to_texts(&t, &ids), ["▁hi", "▁there"]);
    assert_eq!(t.decode(&ids), "hi there");
    // Unknown characters fall back to their UTF-8 bytes.
    let ids = t.encode("hé", false);
    assert_eq!(ids_to_texts(&t, &ids), ["▁h", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&ids), "hé");
    // A space prefix is added again after a special token.
    let ids = t.encode("hi<ctl>there", true);
    assert_eq!(ids_to_texts(&t, &ids), ["▁hi", "<ctl>", "▁there"]);
    // BOS added once; EOS not by default.
    assert_eq!(
        t.encode_with_special("hi", true, false),
        vec![1, t.token_id("▁hi").unwrap()]
    );
    assert_eq!(
        t.encode_with_special("<s>hi", true, true)[..2],
        [1, t.token_id("▁hi").unwrap()]
    );
    assert!(t.encode("", true).is_empty());
    assert_eq!(t.encode_with_special("", true, true), vec![1]);
}

#[test]
fn spm_without_space_prefix() {
    let mut cfg = tiny_spm();
    cfg.add_space_prefix = Some(false);
    cfg.add_bos = Some(false);
    let t = Tokenizer::from_config(cfg).unwrap();
    let ids = t.encode("hi there", false);
    assert_eq!(ids_to_texts(&t, &ids), ["h", "i", "▁there"]);
    assert_eq!(t.decode(&ids), "hi there");
    assert_eq!(
        t.encode_with_special("hi", true, false),
        t.encode("hi", false)
    );
}

#[test]
fn invalid_configs_are_errors() {
    let mut cfg = tiny_spm();
    cfg.tokens[5] = cfg.tokens[6].clone();
    assert!(matches!(
        Tokenizer::from_config(cfg),
        Err(TokenizerError::InvalidVocab(_))
    ));
    let cfg = VocabConfig::new(ModelKind::Spm, Vec::new());
    assert!(matches!(
        Tokenizer::from_config(cfg),
        Err(TokenizerError::InvalidVocab(_))
    ));
    let mut cfg = tiny_spm();
    cfg.scores.truncate(3);
    assert!(matches!(
        Tokenizer::from_config(cfg),
        Err(TokenizerError::InvalidVocab(_))
    ));
    // Out-of-range special ids are ignored rather than trusted.
    let mut cfg = tiny_spm();
    cfg.special.bos = Some(1_000_000);
    cfg.special.eos = Some(1_000_001);
    let t = Tokenizer::from_config(cfg).unwrap();
    assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
}

fn strings(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
}

#[test]
fn gguf_metadata_errors() {
    let mut md = Metadata::new();
    assert!(
        matches!(Tokenizer::from_gguf(&md), Err(TokenizerError::MissingKey(k)) if k == "tokenizer.ggml.model")
    );
    md.insert("tokenizer.ggml.model".into(), Value::U32(3))
        .unwrap();
    assert!(matches!(
        Tokenizer::from_gguf(&md),
        Err(TokenizerError::WrongType { .. })
    ));

    let mut md = Metadata::new();
    md.insert("tokenizer.ggml.model".into(), Value::String("t5".into()))
        .unwrap();
    assert!(
        matches!(Tokenizer::from_gguf(&md), Err(TokenizerError::UnsupportedModel(m)) if m == "t5")
    );

    let mut md = Metadata::new();
    md.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()))
        .unwrap();
    md.insert("tokenizer.ggml.tokens".into(), strings(&["a", "b", "ab"]))
        .unwrap();
    assert!(
        matches!(Tokenizer::from_gguf(&md), Err(TokenizerError::MissingKey(k)) if k == "tokenizer.ggml.merges")
    );
    md.insert(
        "tokenizer.ggml.merges".into(),
        strings(&["a b", "garbage", ""]),
    )
    .unwrap();
    md.insert("tokenizer.ggml.pre".into(), Value::String("mystery".into()))
        .unwrap();
    assert!(matches!(
        Tokenizer::from_gguf(&md),
        Err(TokenizerError::UnsupportedPreTokenizer(_))
    ));

    let base = |token_type: Value| {
        let mut md = Metadata::new();
        md.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()))
            .unwrap();
        md.insert("tokenizer.ggml.tokens".into(), strings(&["a", "b", "ab"]))
            .unwrap();
        md.insert(
            "tokenizer.ggml.merges".into(),
            strings(&["a b", "garbage", ""]),
        )
        .unwrap();
        md.insert("tokenizer.ggml.pre".into(), Value::String("gpt-2".into()))
            .unwrap();
        md.insert("tokenizer.ggml.bos_token_id".into(), Value::I32(-1))
            .unwrap();
        md.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true))
            .unwrap();
        md.insert("tokenizer.ggml.token_type".into(), token_type)
            .unwrap();
        md
    };
    let md = base(Value::Array(vec![Value::String("x".into())]));
    assert!(matches!(
        Tokenizer::from_gguf(&md),
        Err(TokenizerError::WrongType { .. })
    ));
    let md = base(Value::Array(vec![Value::I32(1); 2]));
    assert!(matches!(
        Tokenizer::from_gguf(&md),
        Err(TokenizerError::InvalidVocab(_))
    ));
    let md = base(Value::Array(vec![Value::I32(1); 3]));
    // bos -1 = none, and the BPE default (11) is out of range: add_bos is dropped, not a panic.
    let t = Tokenizer::from_gguf(&md).unwrap();
    assert_eq!(t.bos_id(), None);
    assert!(!t.add_bos());
    assert_eq!(t.encode("abba", false), vec![2, 1, 0]);
    assert_eq!(t.chat_template(), None);
    assert!(matches!(
        t.apply_chat_template(&[], true),
        Err(TokenizerError::NoChatTemplate)
    ));
}

/// A WordPiece vocabulary where every lower-case letter a-c is a word's first piece and a
/// continuation.
fn tiny_wordpiece() -> VocabConfig {
    let mut tokens: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        .map(String::from)
        .into();
    for piece in ["a", "b", "c", "ab", "abc", "ca"] {
        tokens.push(format!("\u{2581}{piece}"));
        tokens.push(piece.to_string());
    }
    let mut cfg = VocabConfig::new(ModelKind::WordPiece, tokens);
    cfg.token_types = [vec![TokenType::Control; 4], vec![TokenType::Normal; 12]].concat();
    cfg.special.bos = Some(2);
    cfg.special.sep = Some(3);
    cfg.special.unk = Some(1);
    cfg
}

#[test]
fn wordpiece_wraps_in_cls_and_sep_and_takes_longest_pieces() {
    let t = Tokenizer::from_config(tiny_wordpiece()).unwrap();
    let id = |s: &str| t.token_id(s).unwrap();
    assert_eq!(
        t.encode_with_special("ABCA ab, d", true, false),
        vec![2, id("\u{2581}abc"), id("a"), id("\u{2581}ab"), 1, 1, 3]
    );
    assert_eq!(t.encode("  ", false), Vec::<u32>::new());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn wordpiece_never_panics_and_keeps_the_words(text in "[abcABC ]{0,30}", other in "\\PC{0,40}") {
        let t = Tokenizer::from_config(tiny_wordpiece()).unwrap();
        let ids = t.encode(&text, false);
        let decoded = t.decode(&ids);
        let want = text.to_lowercase();
        prop_assert_eq!(
            decoded.split_whitespace().collect::<Vec<_>>(),
            want.split_whitespace().collect::<Vec<_>>()
        );
        let _ = t.encode_with_special(&other, true, true);
    }

    #[test]
    fn bpe_never_panics_and_roundtrips(text in "\\PC{0,40}", pre in 0usize..5) {
        let name = ["default", "gpt-2", "llama3", "qwen2", "smollm"][pre];
        let t = Tokenizer::from_config(tiny_bpe(name)).unwrap();
        let ids = t.encode(&text, false);
        prop_assert_eq!(t.decode(&ids), text.clone());
        let _ = t.encode_with_special(&text, true, true);
    }

    #[test]
    fn spm_never_panics_and_roundtrips(text in "\\PC{0,40}") {
        let mut cfg = tiny_spm();
        cfg.add_space_prefix = Some(false);
        let t = Tokenizer::from_config(cfg).unwrap();
        let ids = t.encode(&text, false);
        prop_assert_eq!(t.decode(&ids), text);
    }

    #[test]
    fn decoding_arbitrary_ids_never_panics(ids in proptest::collection::vec(any::<u32>(), 0..30)) {
        let t = Tokenizer::from_config(tiny_spm()).unwrap();
        let text = t.decode_with(&ids, true);
        let mut d = t.stream_decoder_with(true);
        let mut streamed: String = ids.iter().map(|&i| d.push(i)).collect();
        streamed.push_str(&d.finish());
        prop_assert_eq!(streamed, text);
    }
}
