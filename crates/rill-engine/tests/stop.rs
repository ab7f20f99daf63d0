//! Stop strings over streamed text, as a property: however the text is split into pieces, what
//! is emitted is exactly the text before the first completed stop string, and neither the
//! emitted text nor the emitted text plus what is held back ever contains a stop string.

use proptest::prelude::*;
use rill_engine::StopMatcher;

/// Where the first stop string is completed: (end, start) of the earliest-ending occurrence.
fn first_completed(text: &str, stops: &[String]) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for s in stops {
        if let Some(start) = text.find(s.as_str()) {
            let key = (start + s.len(), start);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
    }
    best
}

/// Splits `text` at the given fractions, on character boundaries (a stream decoder only ever
/// releases whole characters).
fn split<'a>(text: &'a str, cuts: &[f64]) -> Vec<&'a str> {
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
    let mut at: Vec<usize> = cuts
        .iter()
        .filter(|_| !bounds.is_empty())
        .map(|&f| bounds[((f * bounds.len() as f64) as usize).min(bounds.len() - 1)])
        .collect();
    at.sort_unstable();
    at.dedup();
    let mut pieces = Vec::new();
    let mut prev = 0;
    for a in at {
        pieces.push(&text[prev..a]);
        prev = a;
    }
    pieces.push(&text[prev..]);
    pieces
}

/// A small alphabet (with multi-byte characters) so that stop strings and near misses are common.
fn text_strategy(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![Just('a'), Just('b'), Just(' '), Just('é'), Just('日')],
        0..max,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn holdback_emits_exactly_the_text_before_the_first_stop(
        text in text_strategy(40),
        stops in proptest::collection::vec(text_strategy(4).prop_filter("non-empty", |s| !s.is_empty()), 1..4),
        cuts in proptest::collection::vec(0.0f64..1.0, 0..20),
        empty_pieces in proptest::collection::vec(0usize..50, 0..3),
    ) {
        let mut pieces = split(&text, &cuts);
        for &i in &empty_pieces {
            pieces.insert(i.min(pieces.len()), "");
        }
        let mut m = StopMatcher::new(&stops).unwrap();
        let mut emitted = String::new();
        let mut matched = None;
        for p in &pieces {
            let mut out = String::new();
            let r = m.push(p, &mut out);
            emitted.push_str(&out);
            for s in &stops {
                prop_assert!(!emitted.contains(s.as_str()), "emitted {:?} contains {:?}", emitted, s);
                if r.is_none() {
                    let seen = format!("{emitted}{}", m.held());
                    prop_assert!(!seen.contains(s.as_str()), "{:?} + held {:?} contains {:?}", emitted, m.held(), s);
                }
            }
            if let Some(i) = r {
                matched = Some(i);
                break;
            }
        }
        match first_completed(&text, &stops) {
            Some((end, start)) => {
                prop_assert_eq!(&emitted, &text[..start]);
                let i = matched.expect("a stop string was in the text");
                // The reported stop string is one that ends there.
                prop_assert!(text[..end].ends_with(stops[i].as_str()));
                prop_assert_eq!(m.matched(), Some(stops[i].as_str()));
                // Nothing more comes out.
                let mut more = String::new();
                prop_assert_eq!(m.push("ab", &mut more), Some(i));
                m.finish(&mut more);
                prop_assert_eq!(more, "");
            }
            None => {
                prop_assert_eq!(matched, None);
                m.finish(&mut emitted);
                prop_assert_eq!(&emitted, &text);
            }
        }
    }

    #[test]
    fn held_text_is_never_longer_than_a_stop_string(
        text in text_strategy(60),
        stops in proptest::collection::vec(text_strategy(5).prop_filter("non-empty", |s| !s.is_empty()), 1..3),
        cuts in proptest::collection::vec(0.0f64..1.0, 0..30),
    ) {
        let longest = stops.iter().map(String::len).max().unwrap();
        let mut m = StopMatcher::new(&stops).unwrap();
        let mut out = String::new();
        for p in split(&text, &cuts) {
            if m.push(p, &mut out).is_some() {
                break;
            }
            prop_assert!(m.held().len() < longest);
            // What is held could still become a stop string.
            prop_assert!(m.held().is_empty() || stops.iter().any(|s| s.starts_with(m.held())));
        }
    }
}

#[test]
fn no_stop_strings_pass_text_through() {
    let mut m = StopMatcher::new::<&str>(&[]).unwrap();
    let mut out = String::new();
    assert_eq!(m.push("anything at all", &mut out), None);
    assert_eq!(m.held(), "");
    assert_eq!(out, "anything at all");
}

#[test]
fn reset_starts_a_new_stream() {
    let mut m = StopMatcher::new(&["END"]).unwrap();
    let mut out = String::new();
    assert_eq!(m.push("xEN", &mut out), None);
    assert_eq!(m.push("D", &mut out), Some(0));
    m.reset();
    out.clear();
    assert_eq!(m.push("E", &mut out), None);
    m.finish(&mut out);
    assert_eq!(out, "E");
}
