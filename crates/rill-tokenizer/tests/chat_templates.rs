//! Conformance of rill's chat-template renderer with HF transformers' on real templates.
//!
//! The templates are llama.cpp's collection of real models' chat templates
//! (`models/templates/*.jinja`, from the sdist of PyPI `llama-cpp-python==0.3.36`; fetched by
//! `tools/llama-templates.sh`). `tests/data/templates/expected.json` holds what HF transformers'
//! `apply_chat_template` machinery renders for each template and a fixed set of conversations
//! (Jinja2 3.1.6 under transformers' sandbox and its globals and filters; written by
//! `tools/templates/render.py`), or the fact that Jinja2 raised. This test renders the same
//! templates and conversations with [`ChatTemplate`] and requires:
//! * a rendering Jinja2 completed: the same text, byte for byte;
//! * a rendering Jinja2 refused (`raise_exception`, an undefined name, ...): an error (the message
//!   may differ);
//! * every template in the directory to be in `expected.json` with the same sha256 (a changed
//!   collection means re-running render.py), and every template of `expected.json` to be present.
//!
//! `strftime_now` sees the date render.py fixed (2026-01-15, midnight), through
//! [`ChatTemplate::with_date`].
//!
//! The directory is `$RILL_LLAMA_TEMPLATES`, else that script's
//! `~/.cache/rill-peers/llama-templates-0.3.36`, else an unpacked sdist under
//! `~/.cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp/models/templates`. With none present
//! the test runs the script itself (first use; it needs pip and PyPI; see `rill_testkit::peer_data`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rill_tokenizer::{ChatMessage, ChatTemplate, TemplateDate};
use serde::Deserialize;
use sha2::{Digest, Sha256};

const EXPECTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/data/templates/expected.json"
);
const PROBES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/data/templates/probes"
);

#[derive(Deserialize)]
struct Expected {
    date: String,
    conversations: BTreeMap<String, Vec<Message>>,
    /// The tools of the cases that pass them.
    tools: serde_json::Value,
    templates: BTreeMap<String, TemplateCases>,
    probes: BTreeMap<String, TemplateCases>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
    #[serde(default)]
    tool_calls: Vec<serde_json::Value>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
struct TemplateCases {
    sha256: String,
    bos_token: String,
    eos_token: String,
    results: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    conversation: String,
    add_generation_prompt: bool,
    /// Rendered with the expectation's `tools`.
    #[serde(default)]
    tools: bool,
    output: Option<String>,
    error: Option<String>,
}

/// `YYYY-MM-DD` -> the date.
fn parse_date(s: &str) -> TemplateDate {
    let parts: Vec<u32> = s
        .split('-')
        .map(|p| p.parse().unwrap_or_else(|e| panic!("bad date {s:?}: {e}")))
        .collect();
    assert_eq!(parts.len(), 3, "bad date {s:?}");
    let year = i32::try_from(parts[0]).expect("year");
    TemplateDate::from_ymd(year, parts[1], parts[2]).unwrap_or_else(|| panic!("bad date {s:?}"))
}

/// Where two texts first differ, with a little context of each.
fn first_difference(got: &str, want: &str) -> String {
    let at = got
        .char_indices()
        .zip(want.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| got.len().min(want.len()));
    let around = |s: &str| {
        let mut start = at.saturating_sub(60).min(s.len());
        while !s.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (at + 60).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        format!("{:?}", &s[start..end])
    };
    format!(
        "first difference at byte {at} (got {} bytes, want {}):\n     got …{}…\n    want …{}…",
        got.len(),
        want.len(),
        around(got),
        around(want)
    )
}

/// llama.cpp templates on which rill knowingly differs from Jinja2 (with tools only), with the
/// reason. The test fails if one of them starts to match (then remove it here).
const KNOWN_TEMPLATE_DIFFERENCES: &[(&str, &str)] = &[
    (
        "llama-cpp-deepseek-r1.jinja",
        "with tools, Jinja2 raises (`tojson` of a Python generator made by `map`); minijinja's          `map` gives a list, which serializes",
    ),
    (
        "meetkai-functionary-medium-v3.1.jinja",
        "with tools, `\"...\"|safe + text` is Jinja2's Markup, which HTML-escapes the text it is          added to (`&#34;`); minijinja's `+` does not escape",
    ),
];

/// Probes on which rill knowingly differs from Jinja2, with the reason: minijinja behaviour that
/// rill cannot change from outside (no hook exists). None of llama.cpp's templates relies on
/// these. The test fails if one of them starts to match (then remove it here).
const KNOWN_PROBE_DIFFERENCES: &[(&str, &str)] = &[
    (
        "concat-list.jinja",
        "`~` joins a list or dict written by minijinja's own Display (JSON-like quotes), not \
         Python's str(); printing one with {{ }} or |string is Python-like",
    ),
    (
        "none-iterate.jinja",
        "a for loop over a none value renders nothing in minijinja, Python raises TypeError \
         (tools and documents are a Python-like None that does raise)",
    ),
    (
        "percent-format.jinja",
        "minijinja has no printf-style `'%s' % value` string formatting",
    ),
];

/// The outcome of rendering one set of templates.
struct Report {
    table: String,
    problems: Vec<String>,
    /// Mismatches listed in the `known` argument of [`check_set`].
    known: Vec<String>,
    /// Per template that raises in Jinja2: the first Jinja2 error and rill's for the same case.
    errors: Vec<String>,
    matched: usize,
    total: usize,
}

/// Renders every template of `set` (files in `dir`) for its cases and compares. A template in
/// `known` must mismatch (its mismatches are reported apart); every other one must match.
fn check_set(
    dir: &Path,
    set: &BTreeMap<String, TemplateCases>,
    conversations: &BTreeMap<String, Vec<Message>>,
    tools: &serde_json::Value,
    date: TemplateDate,
    known: &[(&str, &str)],
) -> Report {
    let mut report = Report {
        table: String::new(),
        problems: Vec::new(),
        known: Vec::new(),
        errors: Vec::new(),
        matched: 0,
        total: 0,
    };
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jinja"))
        .collect();
    on_disk.sort();
    assert!(
        !on_disk.is_empty(),
        "{} holds no *.jinja files",
        dir.display()
    );
    for name in &on_disk {
        if !set.contains_key(name) {
            report.problems.push(format!(
                "{name}: in {} but not in expected.json (re-run tools/templates/render.py)",
                dir.display()
            ));
        }
    }

    for (name, cases) in set {
        let path = dir.join(name);
        let Ok(bytes) = std::fs::read(&path) else {
            report
                .problems
                .push(format!("{name}: expected in {}", dir.display()));
            continue;
        };
        let sha = Sha256::digest(&bytes)
            .iter()
            .fold(String::new(), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            });
        if sha != cases.sha256 {
            report.problems.push(format!(
                "{name}: sha256 {sha} differs from expected.json's {} (the template changed; \
                 re-run tools/templates/render.py)",
                cases.sha256
            ));
            continue;
        }
        let source = String::from_utf8(bytes).unwrap_or_else(|e| panic!("{name}: not UTF-8: {e}"));
        let template =
            ChatTemplate::new(&source, &cases.bos_token, &cases.eos_token).with_date(date);
        let mut ok = 0;
        let mut mismatches = Vec::new();
        let mut error_pair = None;
        for case in &cases.results {
            let conversation = conversations
                .get(&case.conversation)
                .unwrap_or_else(|| panic!("{name}: unknown conversation {:?}", case.conversation));
            let messages: Vec<ChatMessage> = conversation
                .iter()
                .map(|m| {
                    let mut message = ChatMessage::new(&m.role, &m.content);
                    message.tool_calls = m.tool_calls.clone();
                    message.tool_call_id = m.tool_call_id.clone();
                    message
                })
                .collect();
            let label = format!(
                "{name} [{}, add_generation_prompt={}]",
                case.conversation, case.add_generation_prompt
            );
            let got = template.render_with_tools(
                &messages,
                case.tools.then_some(tools),
                case.add_generation_prompt,
            );
            let problem = match (&got, &case.output, &case.error) {
                (Ok(got), Some(want), None) if got == want => None,
                (Ok(got), Some(want), None) => {
                    Some(format!("{label}: {}", first_difference(got, want)))
                }
                (Err(e), None, Some(want)) => {
                    error_pair.get_or_insert_with(|| {
                        format!("{name}\n    jinja2: {want}\n    rill:   {e}")
                    });
                    None
                }
                (Err(e), Some(_), None) => {
                    Some(format!("{label}: rill failed where jinja2 rendered: {e}"))
                }
                (Ok(got), None, Some(want)) => Some(format!(
                    "{label}: rill rendered where jinja2 raised ({want}); rill's output: {:?}",
                    got.chars().take(200).collect::<String>()
                )),
                _ => panic!("{label}: a case needs exactly one of output / error"),
            };
            match problem {
                None => ok += 1,
                Some(p) => mismatches.push(p),
            }
        }
        report.errors.extend(error_pair);
        let known_reason = known.iter().find(|(n, _)| n == name).map(|(_, r)| *r);
        match known_reason {
            None => report.problems.extend(mismatches),
            Some(reason) if !mismatches.is_empty() => {
                report.known.push(format!("{name}: {reason}"));
                report.known.extend(mismatches);
            }
            Some(_) => report.problems.push(format!(
                "{name}: listed as a known difference but now matches; remove it from the list"
            )),
        }
        report.matched += ok;
        report.total += cases.results.len();
        let errors = cases.results.iter().filter(|c| c.error.is_some()).count();
        let _ = writeln!(
            report.table,
            "{name:<56} {ok}/{} match{}{}",
            cases.results.len(),
            if errors > 0 {
                format!(" ({errors} raise in jinja2)")
            } else {
                String::new()
            },
            if known_reason.is_some() {
                " (known difference)"
            } else {
                ""
            }
        );
    }
    report
}

fn expected() -> Expected {
    serde_json::from_str(
        &std::fs::read_to_string(EXPECTED)
            .unwrap_or_else(|e| panic!("cannot read {EXPECTED}: {e}")),
    )
    .unwrap_or_else(|e| panic!("cannot parse {EXPECTED}: {e}"))
}

fn finish(what: &str, dir: &Path, n_conversations: usize, report: Report) {
    let Report {
        table,
        problems,
        known,
        errors,
        matched,
        total,
    } = report;
    println!(
        "{what} in {} ({n_conversations} conversations):\n{table}\n{matched}/{total} renderings match",
        dir.display(),
    );
    if !errors.is_empty() {
        println!(
            "where Jinja2 raises (first case per template):\n{}",
            errors.join("\n")
        );
    }
    if !known.is_empty() {
        println!("known differences:\n{}", known.join("\n"));
    }
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s); {matched}/{total} renderings match:\n{}\n\n{table}",
        problems.len(),
        problems.join("\n")
    );
}

/// llama.cpp's collection of real chat templates.
#[test]
fn llama_cpp_chat_templates() {
    let dir = rill_testkit::peer_data(rill_testkit::PeerData::ChatTemplates);
    let expected = expected();
    let report = check_set(
        &dir,
        &expected.templates,
        &expected.conversations,
        &expected.tools,
        parse_date(&expected.date),
        KNOWN_TEMPLATE_DIFFERENCES,
    );
    finish(
        "llama.cpp chat templates",
        &dir,
        expected.conversations.len(),
        report,
    );
}

/// This repository's probes: small templates in `tests/data/templates/probes/`, one Jinja feature
/// each (printing values, undefined and none, `tojson`'s arguments, loop controls, Python string
/// methods, filters, tests, whitespace control, macros, `{% generation %}`), rendered for one
/// conversation. The probes in [`KNOWN_PROBE_DIFFERENCES`] must differ, all others match.
#[test]
fn jinja_feature_probes() {
    let expected = expected();
    let dir = PathBuf::from(PROBES);
    let report = check_set(
        &dir,
        &expected.probes,
        &expected.conversations,
        &expected.tools,
        parse_date(&expected.date),
        KNOWN_PROBE_DIFFERENCES,
    );
    finish("Jinja feature probes", &dir, 1, report);
}
