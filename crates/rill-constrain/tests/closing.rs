//! Closing a constrained text from any point (`TokenConstraint::closing`): what a decoder
//! forces when `max_tokens` would otherwise cut a document in the middle.

mod common;

use common::{gemma3, schema, smollm2, start, walk};
use rill_constrain::{ConstraintSpec, TokenConstraint};
use rill_tokenizer::Tokenizer;
use serde_json::{json, Value};

/// `prefix` walked through `spec` on `model`, closed: the closing and the whole text.
fn close(
    model: &(
        std::sync::Arc<Tokenizer>,
        std::sync::Arc<rill_constrain::Constrainer>,
    ),
    spec: &ConstraintSpec,
    prefix: &str,
    max_tokens: usize,
) -> Option<(Vec<u32>, String)> {
    let (t, c) = model;
    let mut state = c.compile(spec).unwrap().start();
    assert!(walk(&mut state, t, prefix).is_ok(), "{prefix:?} is refused");
    let closing = state.closing(max_tokens)?;
    assert!(closing.len() <= max_tokens);
    // The closing is taken token by token and ends accepting; the state it was asked of is
    // unchanged (closing commits nothing).
    let mut after = state.clone();
    for &tok in &closing {
        after
            .commit(tok)
            .unwrap_or_else(|e| panic!("{prefix:?}: {e}"));
    }
    assert!(after.is_accepting(), "{prefix:?} + closing is not complete");
    let text = format!("{prefix}{}", t.decode(&closing));
    Some((closing, text))
}

fn person() -> ConstraintSpec {
    schema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    }))
}

#[test]
fn a_document_cut_anywhere_is_closed_into_a_valid_one() {
    let doc = r#"{"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines"]}"#;
    for model in [smollm2(), gemma3()] {
        let (t, _) = model;
        let tokens = t.encode(doc, false);
        for cut in 0..tokens.len() {
            let prefix = t.decode(&tokens[..cut]);
            let (closing, text) = close(model, &person(), &prefix, 64)
                .unwrap_or_else(|| panic!("no closing after {prefix:?}"));
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{text:?} (after {prefix:?}): {e}"));
            assert!(v["name"].is_string() && v["age"].is_u64(), "{text}");
            // Short: never more than the required keys and the brackets need.
            assert!(closing.len() <= 16, "{text:?}: {} tokens", closing.len());
        }
    }
}

#[test]
fn closings_are_short_where_the_grammar_allows() {
    let model = smollm2();
    let cases = [
        // Inside a string: the quote and the brace.
        (r#"{"name": "Ada"#, r#"{"name": "Ada", "age": 0}"#),
        (
            r#"{"name": "Ada", "age": 3"#,
            r#"{"name": "Ada", "age": 3}"#,
        ),
        (
            r#"{"name": "Ada", "age": 3, "tags": ["a", "b"#,
            r#"{"name": "Ada", "age": 3, "tags": ["a", "b"]}"#,
        ),
    ];
    for (prefix, want) in cases {
        let (_, text) = close(model, &person(), prefix, 32).unwrap();
        assert_eq!(text, want);
    }
    // A complete text needs nothing.
    let (closing, _) = close(model, &person(), r#"{"name": "A", "age": 1}"#, 4).unwrap();
    assert!(closing.is_empty());
}

#[test]
fn a_closing_longer_than_the_tokens_left_is_not_offered() {
    let model = smollm2();
    let open = r#"{"name": ""#;
    let (all, _) = close(model, &person(), open, 64).unwrap();
    assert!(all.len() > 2);
    assert!(close(model, &person(), open, all.len()).is_some());
    assert!(close(model, &person(), open, all.len() - 1).is_none());
    assert!(close(model, &person(), open, 0).is_none());
}

#[test]
fn regexes_choices_and_grammars_are_closed_too() {
    let model = smollm2();
    let email = ConstraintSpec::Regex(r"[a-z]+@[a-z]+\.(com|org)".into());
    let (_, text) = close(model, &email, "ada", 16).unwrap();
    assert!(
        regex_like_email(&text),
        "{text:?} does not match the pattern"
    );
    let choice = ConstraintSpec::Choice(vec!["yes".into(), "no, never".into()]);
    let (_, text) = close(model, &choice, "no", 8).unwrap();
    assert_eq!(text, "no, never");
    let list = ConstraintSpec::Lark("start: \"[\" item (\",\" item)* \"]\"\nitem: /[0-9]+/".into());
    let (_, text) = close(model, &list, "[12,3", 8).unwrap();
    assert_eq!(text, "[12,3]");
}

fn regex_like_email(s: &str) -> bool {
    let Some((user, domain)) = s.split_once('@') else {
        return false;
    };
    let Some((host, tld)) = domain.rsplit_once('.') else {
        return false;
    };
    !user.is_empty()
        && user.bytes().all(|b| b.is_ascii_lowercase())
        && !host.is_empty()
        && host.bytes().all(|b| b.is_ascii_lowercase())
        && (tld == "com" || tld == "org")
}

/// Every valid instance of the committed MaskBench subset, cut after every few tokens, is
/// closed into a text the schema accepts (the matcher's accepting state is the check: a
/// text it accepts is one the schema's replay accepts, `maskbench.rs`).
#[test]
fn benchmark_documents_cut_every_few_tokens_are_closed() {
    let (t, c) = smollm2();
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/maskbench/subset.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (mut cuts, mut closed, mut longest, mut compiled) = (0usize, 0usize, 0usize, 0usize);
    let mut open = Vec::new();
    let mut searching = std::time::Duration::ZERO;
    for s in doc["schemas"].as_array().unwrap().iter().take(120) {
        let Ok(grammar) = c.compile(&ConstraintSpec::JsonSchema(s["schema"].clone())) else {
            continue;
        };
        compiled += 1;
        for inst in s["tests"].as_array().unwrap() {
            if inst["valid"] != true {
                continue;
            }
            let tokens = t.encode(inst["text"].as_str().unwrap(), false);
            let mut state: TokenConstraint = grammar.start();
            for (i, &tok) in tokens.iter().enumerate() {
                if i % 7 == 3 {
                    cuts += 1;
                    let t0 = std::time::Instant::now();
                    let found = state.closing(256);
                    searching += t0.elapsed();
                    match found {
                        Some(closing) => {
                            let mut after = state.clone();
                            for &x in &closing {
                                after.commit(x).unwrap();
                            }
                            assert!(after.is_accepting());
                            longest = longest.max(closing.len());
                            closed += 1;
                        }
                        None => open.push(s["file"].to_string()),
                    }
                }
                if state.commit(tok).is_err() {
                    break; // a known wrong reject (maskbench.rs counts them)
                }
            }
        }
    }
    let per_cut = searching.as_secs_f64() / cuts.max(1) as f64;
    let mut schemas_open = open.clone();
    schemas_open.dedup();
    eprintln!(
        "{closed} of {cuts} cut points closed (longest closing {longest} tokens), {:.2} ms a search; \
         not closed in {} of {compiled} schemas: {schemas_open:?}",
        per_cut * 1e3,
        schemas_open.len(),
    );
    assert!(cuts > 300, "{cuts}");
    // The search is bounded and heuristic: a pattern whose only way out comes late in its
    // byte order (`[a-z]+(?:-+[a-z]+)*-v\d+` loops on letters and dashes before it tries `v`)
    // finds no closing. Measured: 3,119 of 3,286 closed (95%); 6 of the 112 schemas keep some open.
    assert!(closed * 100 >= cuts * 94, "{closed} of {cuts} closed");
}

#[test]
fn a_waiting_lazy_constraint_offers_no_closing() {
    let (_, c) = smollm2();
    let g = c.compile(&person()).unwrap().after("<tool_call>");
    assert!(g.start().closing(64).is_none());
    let _ = start(person()).closing(64).unwrap();
}

/// A text cut inside a UTF-8 character (a byte-level token of a CJK character or an emoji) is
/// closed too: the search continues the character first.
#[test]
fn a_text_cut_inside_a_character_is_closed() {
    let spec = schema(json!({
        "type": "object",
        "properties": {"summary": {"type": "string"}},
        "required": ["summary"]
    }));
    for model in [smollm2(), gemma3()] {
        let (t, c) = model;
        let tokens = t.encode(r#"{"summary": "日本語のテキスト 🌊🌊 終わり"}"#, false);
        let grammar = c.compile(&spec).unwrap();
        let mut state = grammar.start();
        let mut mid_character = 0;
        for (i, &tok) in tokens.iter().enumerate() {
            let text = t.decode(&tokens[..i]);
            mid_character += usize::from(text.ends_with('\u{FFFD}'));
            match state.closing_search(32) {
                rill_constrain::Closing::Found(closing) => {
                    let mut after = state.clone();
                    for &x in &closing {
                        after.commit(x).unwrap();
                    }
                    assert!(after.is_accepting(), "after {i} tokens");
                }
                other => panic!("after {i} tokens ({text:?}): {other:?}"),
            }
            state.commit(tok).unwrap();
        }
        // SmolLM2's byte-level vocabulary splits these characters; the test must cut inside one.
        if std::ptr::eq(model, smollm2()) {
            assert!(mid_character > 0, "no cut fell inside a character");
        }
    }
}
