//! Acceptance test: identical ids to the reference tokenizations (llama.cpp, and HF transformers)
//! for both models, with and without special-token parsing.

mod common;

use rill_tokenizer::Tokenizer;

fn check(tok: &Tokenizer, model: &str) {
    let cases = common::cases(model);
    assert!(
        cases.len() >= 20,
        "{model}: expected the full reference case list"
    );
    let mut failures = Vec::new();
    for case in &cases {
        let plain = tok.encode(&case.text, false);
        if plain != case.ids {
            failures.push(format!(
                "{:?} (parse_special=false)\n   got {plain:?}\n  want {:?}",
                case.text, case.ids
            ));
        }
        let special = tok.encode(&case.text, true);
        if special != case.ids_parse_special {
            failures.push(format!(
                "{:?} (parse_special=true)\n   got {special:?}\n  want {:?}",
                case.text, case.ids_parse_special
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} of {} encodings differ:\n{}",
        failures.len(),
        2 * cases.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_matches_reference_tokenization() {
    check(common::smollm2(), "smollm2-135m-instruct-q4_1");
}

#[test]
fn gemma3_matches_reference_tokenization() {
    check(common::gemma3(), "gemma3-270m-q4_k_m");
}
