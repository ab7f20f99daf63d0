//! Chat.

use super::*;

/// Parses "[prompt: R reused from the cache, C computed; ...]" lines.
fn chat_stats(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("[prompt: ")?;
            let (reused, rest) = rest.split_once(" reused from the cache, ")?;
            let (computed, _) = rest.split_once(" computed")?;
            Some((reused.parse().ok()?, computed.parse().ok()?))
        })
        .collect()
}

#[test]
fn chat_smollm2_reuses_the_cache() {
    let args = ["chat", "-m", smollm2(), "-t", "2", "-n", "12", "--stats"];
    let out = {
        let _g = heavy();
        rill_with(
            &args,
            Some(b"What is the capital of France?\nAnd of Italy?\n"),
            &[],
        )
    };
    let stdout = ok(&args, &out);
    let stderr = text(&out.stderr);
    let stats = chat_stats(&stderr);
    assert_eq!(stats.len(), 2, "two turns expected: {stderr}");
    assert!(!stdout.trim().is_empty());
    let (reused1, computed1) = stats[0];
    let (reused2, computed2) = stats[1];
    assert_eq!(reused1, 0, "{stderr}");
    // The second turn reuses at least the whole first prompt, and computes less than it reuses.
    assert!(reused2 >= computed1, "history prefilled again: {stderr}");
    assert!(computed2 < reused2, "{stderr}");
}

#[test]
fn chat_synthetic_two_turns() {
    let args = [
        "chat",
        "-m",
        synthetic(),
        "-t",
        "1",
        "-n",
        "6",
        "--stats",
        "--seed",
        "1",
    ];
    let out = rill_with(&args, Some(b"hello\n\nsecond turn\n"), &[]);
    ok(&args, &out);
    let stderr = text(&out.stderr);
    let stats = chat_stats(&stderr);
    assert_eq!(stats.len(), 2, "{stderr}");
    assert!(stats[1].0 >= stats[0].1, "{stderr}");
}
