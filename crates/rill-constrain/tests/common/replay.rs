//! Replaying JSONSchemaBench (MaskBench) instances through a schema's constraint, token by
//! token: a valid instance must pass every mask and end accepting, an invalid one must not.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use rill_constrain::{Constrainer, ConstraintSpec};
use rill_tokenizer::Tokenizer;
use serde_json::Value;

#[derive(Debug, Default)]
pub struct Counts {
    pub schemas: usize,
    /// Schemas refused at compile time (unsupported keyword, limit, ...), by first words.
    pub refused: BTreeMap<String, usize>,
    pub valid_accepted: usize,
    /// Valid instances the constraint refused (lost coverage, not a safety problem).
    pub valid_rejected: usize,
    pub invalid_rejected: usize,
    /// Invalid instances the constraint let through: must be 0.
    pub invalid_accepted: usize,
    /// (file, instance) of each wrong accept.
    pub wrong_accepts: Vec<String>,
    pub wrong_rejects: Vec<String>,
    /// Seconds per mask and per compile.
    pub mask_seconds: Vec<f64>,
    pub compile_seconds: Vec<f64>,
}

impl Counts {
    pub fn refused_total(&self) -> usize {
        self.refused.values().sum()
    }

    pub fn report(&self) -> String {
        let pct = |v: &mut Vec<f64>, q: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            v.sort_by(f64::total_cmp);
            v[((v.len() - 1) as f64 * q).round() as usize]
        };
        let mut masks = self.mask_seconds.clone();
        let mut compiles = self.compile_seconds.clone();
        let mut s = format!(
            "{} schemas: {} compiled, {} refused at compile; valid instances: {} accepted, {} \
             wrongly rejected; invalid instances: {} rejected, {} WRONGLY ACCEPTED\n\
             masks: {} computed, p50 {:.1} us, p99 {:.1} us, max {:.1} us; compile p50 {:.2} ms, \
             p99 {:.2} ms\n",
            self.schemas,
            self.schemas - self.refused_total(),
            self.refused_total(),
            self.valid_accepted,
            self.valid_rejected,
            self.invalid_rejected,
            self.invalid_accepted,
            masks.len(),
            pct(&mut masks, 0.5) * 1e6,
            pct(&mut masks, 0.99) * 1e6,
            pct(&mut masks, 1.0) * 1e6,
            pct(&mut compiles, 0.5) * 1e3,
            pct(&mut compiles, 0.99) * 1e3,
        );
        for (why, n) in &self.refused {
            s.push_str(&format!("  refused {n:4}: {why}\n"));
        }
        s
    }
}

/// The first words of a compile error, with quoted names, numbers and paths removed, so that
/// errors of one kind count together.
fn error_kind(e: &str) -> String {
    if let Some(i) = e.find("Unimplemented keys") {
        return e[i..].chars().take(80).collect();
    }
    let e = e.split(':').skip(1).collect::<Vec<_>>().join(":");
    let words: Vec<&str> = e
        .split_whitespace()
        .filter(|w| !w.contains('"') && !w.contains('\'') && !w.contains('#') && !w.contains('`'))
        .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
        .take(6)
        .collect();
    words.join(" ")
}

/// Replays one schema's instances (`(valid, text)`) into `counts`.
pub fn replay(
    constrainer: &Arc<Constrainer>,
    tokenizer: &Tokenizer,
    file: &str,
    schema: &Value,
    tests: &[(bool, String)],
    counts: &mut Counts,
) {
    counts.schemas += 1;
    let started = Instant::now();
    let grammar = match constrainer.compile_with_timeout(ConstraintSpec::JsonSchema(schema.clone()))
    {
        Ok(g) => g,
        Err(e) => {
            *counts
                .refused
                .entry(error_kind(&e.to_string()))
                .or_default() += 1;
            return;
        }
    };
    counts.compile_seconds.push(started.elapsed().as_secs_f64());
    for (valid, text) in tests {
        let mut c = grammar.start();
        let mut passed = true;
        for token in tokenizer.encode(text, false) {
            let t = Instant::now();
            let allowed = c.allows(token);
            counts.mask_seconds.push(t.elapsed().as_secs_f64());
            if allowed != Ok(true) || c.commit(token).is_err() {
                passed = false;
                break;
            }
        }
        let accepted = passed && c.is_accepting();
        match (valid, accepted) {
            (true, true) => counts.valid_accepted += 1,
            (true, false) => {
                counts.valid_rejected += 1;
                counts.wrong_rejects.push(format!("{file}: {text}"));
            }
            (false, false) => counts.invalid_rejected += 1,
            (false, true) => {
                counts.invalid_accepted += 1;
                counts.wrong_accepts.push(format!("{file}: {text}"));
            }
        }
    }
}
