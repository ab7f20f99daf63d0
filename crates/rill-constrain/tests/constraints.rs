//! Constraints on the real vocabularies: what each kind accepts and refuses token by token,
//! forced tokens, rollback and forks, end-of-generation, and errors that name the construct.

mod common;

use common::{matches, schema, smollm2, start, walk};
use rill_constrain::{CompileLimits, Constrainer, ConstraintError, ConstraintSpec};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn person() -> ConstraintSpec {
    schema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    }))
}

#[test]
fn json_schema_accepts_matching_text_and_refuses_the_rest() {
    let p = person();
    assert!(matches(&p, r#"{"name": "Ada", "age": 36}"#));
    assert!(matches(
        &p,
        r#"{"name": "Ada", "age": 36, "tags": ["a", "b"]}"#
    ));
    // Wrong type, missing key, extra key, too long, out of range, too many items.
    assert!(!matches(&p, r#"{"name": "Ada", "age": "36"}"#));
    assert!(!matches(&p, r#"{"name": "Ada"}"#));
    assert!(!matches(&p, r#"{"name": "Ada", "age": 36, "x": 1}"#));
    assert!(!matches(
        &p,
        r#"{"name": "abcdefghijklmnopqrstuvwxyz", "age": 1}"#
    ));
    assert!(!matches(&p, r#"{"name": "Ada", "age": -1}"#));
    assert!(!matches(
        &p,
        r#"{"name": "Ada", "age": 1, "tags": ["a", "b", "a"]}"#
    ));
    // The layout: one space after `,` and `:`, nowhere else.
    assert!(!matches(&p, r#"{"name":"Ada","age":36}"#));
    assert!(!matches(&p, "{\n  \"name\": \"Ada\", \"age\": 36}"));
    // A schema's own layout wins.
    let flexible = schema(json!({"type": "object", "x-guidance": {"whitespace_flexible": true}}));
    assert!(matches(&flexible, "{\n  \"a\" :1 }"));
}

#[test]
fn a_prefix_is_allowed_but_not_accepting() {
    let (t, _) = smollm2();
    let mut c = start(person());
    assert_eq!(walk(&mut c, t, r#"{"name": "Ada""#), Ok(false));
    assert!(!c.is_finished());
}

#[test]
fn json_object_and_boolean_schemas() {
    assert!(matches(
        &ConstraintSpec::JsonObject,
        r#"{"a": [1, 2.5, null, true]}"#
    ));
    assert!(!matches(&ConstraintSpec::JsonObject, "[1]"));
    // rill's JSON layout is the text the default layout accepts.
    let v = json!({"name": "Zoë", "list": [1, 2.5, {"k": null}], "ok": true});
    assert_eq!(
        rill_constrain::layout_json(&v),
        r#"{"name": "Zoë", "list": [1, 2.5, {"k": null}], "ok": true}"#
    );
    assert!(matches(
        &ConstraintSpec::JsonObject,
        &rill_constrain::layout_json(&v)
    ));
    assert!(matches(&schema(json!(true)), "[1, \"x\"]"));
    let e = smollm2().1.compile(&schema(json!(false))).unwrap_err();
    assert!(e.to_string().contains("accepts no value"), "{e}");
}

#[test]
fn regex_choice_and_lark() {
    let rx = ConstraintSpec::Regex(r"\d{3}-[a-z]+".into());
    assert!(matches(&rx, "123-abc"));
    assert!(!matches(&rx, "12-abc"));
    assert!(!matches(&rx, "123-abc!"));
    let choice = ConstraintSpec::Choice(vec![
        "positive".into(),
        "negative".into(),
        "neutral \"q\"".into(),
    ]);
    assert!(matches(&choice, "negative"));
    assert!(matches(&choice, "neutral \"q\""));
    assert!(!matches(&choice, "neg"));
    assert!(!matches(&choice, "negatives"));
    let lark = ConstraintSpec::Lark("start: item (\",\" item)*\nitem: /[0-9]+/ | \"x\"\n".into());
    assert!(matches(&lark, "1,x,22"));
    assert!(!matches(&lark, "1,,2"));
}

#[test]
fn gbnf_grammars_are_lowered_with_their_language() {
    let g = ConstraintSpec::Gbnf(
        r#"# arithmetic, as llama.cpp's example
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"#
        .into(),
    );
    assert!(matches(&g, "1+2= 3\n"));
    assert!(matches(&g, "(a*b)-c_1= x\n2= 2\n"));
    assert!(!matches(&g, "1+= 3\n"));
    let rep = ConstraintSpec::Gbnf(
        "root ::= Digit{2,3} \"-\" [^x]? (\"a\" | \"b\"){2} alt-Name\nDigit ::= [0-9]\nalt-Name ::= \"!\" | \"\"".into(),
    );
    assert!(matches(&rep, "12-yab!"));
    assert!(matches(&rep, "123-ba"));
    assert!(!matches(&rep, "1-ab"));
    assert!(!matches(&rep, "12-xab"));
    assert!(!matches(&rep, "1234-ab"));
    let escapes = ConstraintSpec::Gbnf(r#"root ::= "\x41\u00e9\"" [\]\-] ."#.into());
    assert!(matches(&escapes, "Aé\"]z"));
    assert!(matches(&escapes, "Aé\"-\n"));
}

#[test]
fn gbnf_errors_name_the_place() {
    let err = |src: &str| -> String {
        match smollm2().1.compile(&ConstraintSpec::Gbnf(src.into())) {
            Err(e @ ConstraintError::Gbnf { .. }) => e.to_string(),
            other => panic!("{src:?}: {other:?}"),
        }
    };
    assert!(err("rot ::= \"a\"").contains("no `root` rule"));
    assert!(err("root ::= a\n").contains("`a`, which is not defined"));
    assert!(err("root ::= \"a").contains("line 1 column 10: unterminated string literal"));
    assert!(err("root ::= \"a\"\nroot ::= \"b\"")
        .contains("line 2 column 1: rule `root` is defined twice"));
    assert!(err("root ::= <[1000]>").contains("token references"));
    assert!(err("root ::= \"a\"{3,1}").contains("below the minimum"));
    assert!(err("root ::= [z-a]").contains("reversed"));
    assert!(err("root ::= \"\\q\"").contains("unknown escape"));
    assert!(err("root ::= \"a\" )").contains("unexpected `)`"));
}

#[test]
fn forced_tokens_and_completion() {
    let (t, _) = smollm2();
    let mut c = start(ConstraintSpec::Choice(vec!["internationalization".into()]));
    let forced = c.forced();
    assert_eq!(t.decode(&forced), "internationalization");
    for &tok in &forced {
        c.commit(tok).unwrap();
    }
    // Complete, and nothing may follow: generation ends.
    assert!(c.is_finished());
    // A schema forces its fixed parts: `{"` then the only key.
    let mut c = start(schema(json!({
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": false
    })));
    // (Not the space after the colon: the model's tokens join it with what follows.)
    assert_eq!(t.decode(&c.forced()), "{\"answer\":");
}

#[test]
fn end_of_generation_is_allowed_exactly_where_the_text_may_end() {
    let (t, _) = smollm2();
    let im_end = t.token_id("<|im_end|>").unwrap();
    let mut c = start(ConstraintSpec::Regex("a+".into()));
    assert!(!c.allows(im_end).unwrap());
    walk(&mut c, t, "aa").unwrap();
    assert!(c.allows(im_end).unwrap());
    c.commit(im_end).unwrap();
    assert!(c.is_finished());
    // Control tokens are never spelled by text.
    let im_start = t.token_id("<|im_start|>").unwrap();
    let mut c = start(schema(json!({"type": "string"})));
    walk(&mut c, t, "\"").unwrap();
    assert!(!c.allows(im_start).unwrap());
}

#[test]
fn rollback_and_fork() {
    let (t, _) = smollm2();
    let mut c = start(person());
    walk(&mut c, t, r#"{"name": "Ada", "age": 3"#).unwrap();
    let before = c.allowed().unwrap().to_vec();
    let mut fork = c.clone();
    let ids = t.encode("6}", false);
    for &id in &ids {
        c.commit(id).unwrap();
    }
    assert!(c.is_accepting());
    assert!(!fork.is_accepting());
    c.rollback(ids.len()).unwrap();
    assert_eq!(c.allowed().unwrap(), &before[..]);
    assert_eq!(fork.allowed().unwrap(), &before[..]);
    // The fork goes its own way.
    assert_eq!(walk(&mut fork, t, "}"), Ok(true));
    assert!(!c.is_accepting());
    assert!(c.rollback(1000).is_err());
    // A refused token changes nothing.
    let x = t.encode("x", false)[0];
    assert!(matches!(c.commit(x), Err(ConstraintError::Rejected { .. })));
    assert_eq!(c.allowed().unwrap(), &before[..]);
}

#[test]
fn invalid_constraints_fail_closed_naming_the_problem() {
    let c = &smollm2().1;
    let bad = |spec: ConstraintSpec| -> String {
        match c.compile(&spec) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{spec:?} compiled"),
        }
    };
    assert!(bad(ConstraintSpec::Regex("a(b".into())).contains("regex"));
    assert!(bad(ConstraintSpec::Regex(String::new())).contains("empty"));
    assert!(bad(ConstraintSpec::Choice(vec![])).contains("no choices"));
    assert!(bad(ConstraintSpec::Lark("start: undefined_rule".into())).contains("undefined_rule"));
    assert!(bad(schema(json!({"type": "strin"}))).contains("strin"));
    assert!(bad(schema(json!({"$ref": "https://example.com/s.json"}))).contains("example.com"));
    assert!(bad(schema(
        json!({"type": "integer", "minimum": 5, "maximum": 1})
    ))
    .to_lowercase()
    .contains("unsatisfiable"));
    assert!(bad(schema(json!([1]))).contains("not an array"));
}

#[test]
fn hostile_schemas_hit_a_limit_or_the_timeout() {
    let (t, _) = smollm2();
    let limits = CompileLimits {
        timeout: Duration::from_secs(30),
        max_grammar_size: 2_000,
        ..CompileLimits::default()
    };
    let c = Arc::new(Constrainer::with_limits(t.clone(), limits).unwrap());
    // 400 nested objects with 10 properties each: far past 2,000 symbols.
    let mut s = json!({"type": "string"});
    for _ in 0..400 {
        let props: serde_json::Map<String, serde_json::Value> =
            (0..10).map(|i| (format!("k{i}"), s.clone())).collect();
        s = json!({"type": "object", "properties": props});
        if s.to_string().len() > 200_000 {
            break;
        }
    }
    let e = c.compile_with_timeout(schema(s)).unwrap_err();
    assert!(matches!(e, ConstraintError::Invalid { .. }), "{e}");
    // A zero timeout gives up at once, whatever the schema.
    let limits = CompileLimits {
        timeout: Duration::ZERO,
        ..CompileLimits::default()
    };
    let c = Arc::new(Constrainer::with_limits(t.clone(), limits).unwrap());
    let e = c.compile_with_timeout(person()).unwrap_err();
    assert!(matches!(e, ConstraintError::Timeout { .. }), "{e}");
}

#[test]
fn gemma3_vocabulary() {
    let (t, c) = common::gemma3();
    let mut s = c.compile(&person()).unwrap().start();
    assert_eq!(walk(&mut s, t, r#"{"name": "Ada", "age": 36}"#), Ok(true));
    let end = t.token_id("<end_of_turn>").unwrap();
    assert!(s.allows(end).unwrap());
}

mod tools {
    use super::*;
    use rill_constrain::tools::{plan, Tool, ToolChoice, ToolFormat, ToolReader};

    fn tools() -> Vec<Tool> {
        vec![
            Tool {
                name: "get_weather".into(),
                description: Some("Weather of a city".into()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}),
            },
            Tool {
                name: "get_time".into(),
                description: None,
                parameters: json!({}),
            },
        ]
    }

    fn compiled(
        format: ToolFormat,
        choice: ToolChoice,
        parallel: bool,
    ) -> rill_constrain::TokenConstraint {
        let p = plan(format, &tools(), &choice, parallel, false);
        let mut g = smollm2().1.compile(&p.constraint.unwrap()).unwrap();
        if let Some(t) = &p.trigger {
            g = g.after(t);
        }
        g.start()
    }

    #[test]
    fn hermes_calls_are_constrained_from_the_first_token_or_once_opened() {
        let (t, _) = smollm2();
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let two = format!(
            "{call}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>"
        );
        let mut c = compiled(ToolFormat::Hermes, ToolChoice::Required, true);
        assert_eq!(walk(&mut c, t, call), Ok(true));
        let mut c = compiled(ToolFormat::Hermes, ToolChoice::Required, true);
        assert_eq!(walk(&mut c, t, &two), Ok(true));
        let mut c = compiled(ToolFormat::Hermes, ToolChoice::Required, false);
        assert!(walk(&mut c, t, &two).is_err(), "one call only");
        let mut c = compiled(ToolFormat::Hermes, ToolChoice::Required, true);
        assert!(
            walk(&mut c, t, "Sure! ").is_err(),
            "a call from the first token"
        );
        let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}";
        let mut c = compiled(ToolFormat::Hermes, ToolChoice::Required, true);
        assert!(
            walk(&mut c, t, bad).is_err(),
            "arguments match the parameters"
        );
        let mut c = compiled(
            ToolFormat::Hermes,
            ToolChoice::Named("get_time".into()),
            true,
        );
        assert!(walk(&mut c, t, call).is_err(), "only the named tool");
        // auto: prose is free until the model opens a call, which is then constrained.
        let mut c = compiled(ToolFormat::Hermes, ToolChoice::Auto, true);
        assert!(c.is_waiting());
        assert_eq!(walk(&mut c, t, &format!("Let me check. {call}")), Ok(true));
        assert!(!c.is_waiting());
        let mut c = compiled(ToolFormat::Hermes, ToolChoice::Auto, true);
        assert!(walk(&mut c, t, &format!("Let me check. {bad}")).is_err());
        let parsed = ToolReader::parse(ToolFormat::Hermes, &format!("Let me check. {two}"));
        assert_eq!(parsed.content, "Let me check.");
        assert_eq!(parsed.calls.len(), 2);
    }

    #[test]
    fn llama3_calls_are_one_json_object_with_parameters() {
        let (t, _) = smollm2();
        let call = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
        let bad = r#"{"name": "get_weather", "parameters": {"town": "Paris"}}"#;
        for choice in [ToolChoice::Required, ToolChoice::Auto] {
            let mut c = compiled(ToolFormat::Llama3Json, choice.clone(), true);
            assert_eq!(walk(&mut c, t, call), Ok(true), "{choice:?}");
            assert!(c.is_finished(), "one call, then the answer ends");
            let mut c = compiled(ToolFormat::Llama3Json, choice.clone(), true);
            assert!(walk(&mut c, t, bad).is_err(), "{choice:?}");
        }
        // auto: prose is free.
        let mut c = compiled(ToolFormat::Llama3Json, ToolChoice::Auto, true);
        assert_eq!(
            walk(&mut c, t, "It is sunny.").map(|_| c.is_waiting()),
            Ok(true)
        );
        let mut c = compiled(
            ToolFormat::Llama3Json,
            ToolChoice::Named("get_time".into()),
            true,
        );
        assert!(walk(&mut c, t, call).is_err());
    }

    #[test]
    fn generic_answers_are_a_call_or_a_reply() {
        let (t, _) = smollm2();
        let call = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}"#;
        let reply = r#"{"response": "It is sunny."}"#;
        let mut c = compiled(ToolFormat::Generic, ToolChoice::Auto, true);
        assert_eq!(walk(&mut c, t, call), Ok(true));
        let mut c = compiled(ToolFormat::Generic, ToolChoice::Auto, true);
        assert_eq!(walk(&mut c, t, reply), Ok(true));
        let mut c = compiled(ToolFormat::Generic, ToolChoice::Required, true);
        assert!(walk(&mut c, t, reply).is_err());
        let none = plan(
            ToolFormat::Generic,
            &tools(),
            &ToolChoice::None,
            true,
            false,
        );
        let mut c = smollm2()
            .1
            .compile(&none.constraint.unwrap())
            .unwrap()
            .start();
        assert!(walk(&mut c, t, call).is_err());
        let mut c = smollm2()
            .1
            .compile(
                &plan(
                    ToolFormat::Generic,
                    &tools(),
                    &ToolChoice::None,
                    true,
                    false,
                )
                .constraint
                .unwrap(),
            )
            .unwrap()
            .start();
        assert_eq!(walk(&mut c, t, reply), Ok(true));
        assert!(
            plan(ToolFormat::Hermes, &tools(), &ToolChoice::None, true, false)
                .constraint
                .is_none()
        );
    }
}

#[test]
fn dates_are_narrowed_to_what_every_validator_accepts() {
    let dt = schema(json!({"type": "string", "format": "date-time"}));
    assert!(matches(&dt, "\"2024-02-29T23:59:59Z\""));
    assert!(matches(&dt, "\"2000-02-29T00:00:00.5+01:00\""));
    assert!(!matches(&dt, "\"2023-02-29T00:00:00Z\""));
    assert!(!matches(&dt, "\"1900-02-29T00:00:00Z\""));
    assert!(!matches(&dt, "\"2018-04-30T09:57:60Z\""));
    assert!(!matches(&dt, "\"0000-01-01T00:00:00Z\""));
    let d = schema(
        json!({"properties": {"when": {"format": "date"}}, "required": ["when"], "type": "object"}),
    );
    assert!(matches(&d, r#"{"when": "2024-04-30"}"#));
    assert!(!matches(&d, r#"{"when": "2024-04-31"}"#));
    // Data keeps its words: an enum value that looks like a schema is not rewritten.
    let e = schema(json!({"enum": [{"format": "date"}]}));
    assert!(matches(&e, r#"{"format": "date"}"#));
}

/// Of llama.cpp's 70 real templates (fetched on first use by rill-testkit): the Hermes family and
/// Llama 3.x (calls enforced by the constraint stage), the families whose own syntax is read from
/// free text (Qwen3-Coder / Qwen3.5 XML, Mistral, DeepSeek, Gemma 4, gpt-oss's harmony); every
/// other one gets the generic format.
#[test]
fn the_native_tool_formats_of_llama_cpp_templates_are_recognised() {
    use rill_constrain::tools::ToolFormat;
    let dir = rill_testkit::peer_data(rill_testkit::PeerData::ChatTemplates);
    let mut hermes = Vec::new();
    let mut llama3 = Vec::new();
    let mut native = Vec::new();
    let mut total = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jinja") {
            total += 1;
            let source = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            match ToolFormat::detect(Some(&source)) {
                ToolFormat::Hermes => hermes.push(name),
                ToolFormat::Llama3Json => llama3.push(name),
                f @ (ToolFormat::Native(_) | ToolFormat::Harmony) => {
                    native.push(format!("{}: {name}", f.name()))
                }
                ToolFormat::Generic => {}
            }
        }
    }
    hermes.sort();
    llama3.sort();
    native.sort();
    assert_eq!(total, 70);
    assert_eq!(
        native,
        [
            "deepseek: llama-cpp-deepseek-r1.jinja",
            "gemma4: google-gemma-4-31B-it-interleaved.jinja",
            "gemma4: google-gemma-4-31B-it.jinja",
            "harmony: openai-gpt-oss-120b.jinja",
            "mistral: Mistral-Small-3.2-24B-Instruct-2506.jinja",
            "mistral: mistralai-Ministral-3-14B-Reasoning-2512.jinja",
            "mistral: mistralai-Mistral-Nemo-Instruct-2407.jinja",
            "mistral: unsloth-mistral-Devstral-Small-2507.jinja",
            "qwen_xml: NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
            "qwen_xml: Qwen3-Coder.jinja",
            "qwen_xml: Qwen3.5-4B.jinja",
            "qwen_xml: StepFun3.5-Flash.jinja",
        ]
    );
    assert_eq!(
        llama3,
        [
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
        ]
    );
    assert_eq!(
        hermes,
        [
            "Bielik-11B-v3.0-Instruct.jinja",
            "MiMo-VL.jinja",
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
            "Qwen-QwQ-32B.jinja",
            "Qwen-Qwen2.5-7B-Instruct.jinja",
            "Qwen-Qwen3-0.6B.jinja",
            "Reka-Edge.jinja",
            "ibm-granite-granite-4.0.jinja",
            "ibm-granite-granite-4.1.jinja",
        ]
    );
}
