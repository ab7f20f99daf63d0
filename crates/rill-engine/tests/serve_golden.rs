//! The serving loop's golden record: a paused loop with every kind of work at once (`n` choices,
//! a constraint with forced tokens, prefix hits, preemption in a tiny arena, a beam search, a
//! speculative generation, a lens job) is stepped one iteration at a time, and everything it
//! does is written down: each step's batch (which sequences' rows, prompt or decode), the block
//! map, the prefix cache's events, every event every stream got and what the beam, speculative
//! and lens jobs returned. The record must stay the same, line for line, through any rework of
//! the loop (`tests/data/serve_golden.<kernel path>.txt`; `RILL_BLESS=1` writes it anew, for a
//! deliberate change of behaviour, which the commit then explains).
//!
//! One record per kernel path: the fast path's bits, and so every sampled token after them,
//! differ between the AVX2 kernels and the AVX512-VNNI ones (whose row-interleaved layouts sum
//! in another order), and CI runs both.
//!
//! Timings are left out (they vary), and so are loop-iteration counts (a paused loop wakes once
//! per command, however the commands happen to arrive); prefix hashes are named by the order
//! they first appear in (their values depend on the standard library's hasher). Step numbers
//! in the timeline count forward passes, which are deterministic.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rill_constrain::{Constrainer, ConstraintSpec};
use rill_engine::{
    spawn, BeamParams, DraftSource, LensOptions, ResponseStream, ServeConfig, ServeEvent,
    ServeHandle, ServeRequest, SpeculativeParams, Trace,
};
use rill_model::synthetic::SyntheticSpec;
use rill_model::KvEvent;

mod common;
use common::{greedy, load_synthetic, prompt, sampled};

/// Iterations stepped; every piece of work has ended well before.
const ITERATIONS: usize = 150;

/// The record of this process's kernel path.
fn golden_path() -> std::path::PathBuf {
    use rill_kernels::{cpu_path, has_vnni, wide_tiles, CpuPath};
    let path = match (cpu_path(), has_vnni(), wide_tiles()) {
        (CpuPath::Scalar, _, _) => "scalar",
        (CpuPath::Avx2, false, _) => "avx2",
        (CpuPath::Avx2, true, true) => "avx512-vnni",
        (CpuPath::Avx2, true, false) => "avx512-vnni-narrow",
    };
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/data/serve_golden.{path}.txt"))
}

/// Names prefix hashes by first appearance.
#[derive(Default)]
struct HashNames(HashMap<u64, usize>);

impl HashNames {
    fn name(&mut self, h: u64) -> String {
        let next = self.0.len();
        format!("h{}", self.0.entry(h).or_insert(next))
    }
}

fn kv_event(names: &mut HashNames, e: &KvEvent) -> String {
    match e {
        KvEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
        } => {
            let parent = parent.map_or("-".to_string(), |p| names.name(p));
            let hashes: Vec<String> = hashes.iter().map(|&h| names.name(h)).collect();
            format!(
                "stored {} after {parent} ({} tokens, block {block_size}, first {:?})",
                hashes.join(","),
                tokens.len(),
                tokens.first()
            )
        }
        KvEvent::Removed { hashes } => {
            let hashes: Vec<String> = hashes.iter().map(|&h| names.name(h)).collect();
            format!("removed {}", hashes.join(","))
        }
        KvEvent::AllCleared => "all cleared".into(),
    }
}

fn stream_event(name: &str, e: &ServeEvent) -> String {
    match e {
        ServeEvent::Token {
            choice,
            token,
            text,
            logprobs,
            detail,
        } => {
            let mut line = format!("{name}[{choice}] token {token} {text:?}");
            if let Some(lp) = logprobs {
                let _ = write!(
                    line,
                    " logprob {:08x} top {:?}",
                    lp.logprob.to_bits(),
                    lp.top.iter().map(|t| t.0).collect::<Vec<_>>()
                );
            }
            if let Some(d) = detail {
                let _ = write!(
                    line,
                    " | {} p {:08x} index {} position {} rows {} seqs {} reqs {} prefill {} decode {} kv {} blocks {} bytes ({} unwindowed) cost {:?}",
                    d.rule.as_str(),
                    d.probability.to_bits(),
                    d.index,
                    d.position,
                    d.step.rows,
                    d.step.sequences,
                    d.step.requests,
                    d.step.prefill_rows,
                    d.step.decode_rows,
                    d.kv_blocks,
                    d.kv_bytes,
                    d.kv_bytes_without_window,
                    (d.cost.flops, d.cost.weight_bytes, d.cost.kv_bytes),
                );
                if let Some(c) = &d.constraint {
                    let _ = write!(line, " constraint {} allows {}", c.kind, c.allowed);
                }
                if let Some(draw) = &d.draw {
                    let _ = write!(line, " draw {draw:?}");
                }
                if let Some(p) = &d.prompt {
                    let _ = write!(
                        line,
                        " prompt {} cached {} computed {} in {} steps",
                        p.tokens.len(),
                        p.cached_tokens,
                        p.computed_tokens,
                        p.prefill_steps
                    );
                }
            }
            line
        }
        ServeEvent::Done {
            choice,
            finish_reason,
            cause,
        } => format!("{name}[{choice}] done {finish_reason} ({cause})"),
        ServeEvent::Usage {
            prompt_tokens,
            completion_tokens,
            cached_prompt_tokens,
        } => format!(
            "{name} usage prompt {prompt_tokens} completion {completion_tokens} cached {cached_prompt_tokens}"
        ),
        ServeEvent::Error { message } => format!("{name} error {message}"),
    }
}

struct Record {
    text: String,
    names: HashNames,
}

impl Record {
    fn line(&mut self, line: impl AsRef<str>) {
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }

    /// The block map and the sequences, as of now.
    fn view(&mut self, h: &ServeHandle) {
        let view = h.server_view(0).unwrap().blocking_recv().unwrap();
        let kv = &view.kv;
        let refs: String = kv
            .refs
            .iter()
            .zip(&kv.published)
            .map(|(&r, &p)| match (r, p) {
                (0, false) => '.'.to_string(),
                (0, true) => 'c'.to_string(),
                (r, _) => r.min(9).to_string(),
            })
            .collect();
        self.line(format!("  blocks [{refs}] evictions {}", kv.evictions));
        for (id, len, table) in &kv.sequences {
            self.line(format!("  kv seq {id}: {len} positions, blocks {table:?}"));
        }
        for s in &view.sequences {
            self.line(format!(
                "  seq {} request {} choice {} {:?} tokens {} computed {} prompt {} cached {}",
                s.seq,
                s.request,
                s.choice,
                s.state,
                s.tokens,
                s.computed,
                s.prompt_tokens,
                s.cached_prompt
            ));
        }
        self.line(format!("  queued {}", view.queued));
    }
}

#[test]
fn the_serving_loop_does_exactly_what_its_golden_record_says() {
    let spec = SyntheticSpec::llama_tiny().build().unwrap();
    let engine = load_synthetic(&spec);
    // One block: 2 layers x (keys + values) x 2 KV heads x 16 x f16 x 16 positions.
    let block = 2 * 2 * 2 * 16 * 2 * 16;
    let constrainer = Constrainer::new(engine.tokenizer.clone()).unwrap();
    let h = spawn(
        engine,
        ServeConfig {
            kv_cache_bytes: 14 * block,
            max_batch_tokens: 32,
            max_prefill_rows_while_decoding: 16,
            max_running: 6,
            max_queue: 16,
            kv_events: true,
            // The record is of plain steps (drafts would add rows and blocks to every one);
            // prompt lookup's own tests (tests/serve/prompt_lookup.rs) hold what it gives.
            prompt_lookup_tokens: 0,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let mut kv_events = h.take_kv_events().unwrap();
    h.pause().unwrap();

    let mut record = Record {
        text: String::new(),
        names: HashNames::default(),
    };
    let mut streams: Vec<(String, ResponseStream)> = Vec::new();
    let submit = |streams: &mut Vec<(String, ResponseStream)>, name: &str, r: ServeRequest| {
        streams.push((name.to_string(), h.submit(r).unwrap()));
    };

    // At the start: three sampled choices of one prompt, with log-probabilities.
    let shared = prompt(40, 1);
    let mut choices = ServeRequest::new(shared.clone(), sampled(3, 10));
    choices.n = 3;
    choices.params.top_logprobs = Some(2);
    submit(&mut streams, "choices", choices);
    // A constrained request whose pattern forces tokens after the ones it lets the model pick
    // (appended without sampling).
    let mut constrained = greedy(24);
    constrained.constraint = Some(
        constrainer
            .compile(&ConstraintSpec::Regex(
                "(ab|cd|ef)[0-9]{2}-fixed-tail".into(),
            ))
            .unwrap(),
    );
    submit(
        &mut streams,
        "constrained",
        ServeRequest::new(prompt(20, 2), constrained),
    );
    // A speculative generation on a session of its own.
    let (spec_id, mut spec_reply) = h
        .speculative(
            prompt(16, 7),
            DraftSource::Layers(1),
            SpeculativeParams {
                draft_tokens: 3,
                adaptive: false,
                trace: true,
            },
            sampled(9, 12),
            64,
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
    record.line(format!("speculative is request {spec_id}"));
    let mut beam_reply = None;
    let mut lens_reply = None;
    let mut spec_done = false;

    for iteration in 0..ITERATIONS {
        match iteration {
            // Shares the first two blocks of `shared`'s prompt (a prefix hit), explained token
            // by token.
            3 => {
                let mut p = shared[..32].to_vec();
                p.extend(prompt(9, 3));
                let mut r = ServeRequest::new(p, greedy(14));
                r.trace = Trace {
                    explain: true,
                    full_logits: false,
                };
                submit(&mut streams, "prefix", r);
            }
            // Short prompts with long answers, admitted together, outgrow the arena as they
            // decode: the newest is preempted, and recomputed later.
            4 => {
                submit(
                    &mut streams,
                    "long-a",
                    ServeRequest::new(prompt(20, 4), sampled(5, 60)),
                );
                submit(
                    &mut streams,
                    "long-b",
                    ServeRequest::new(prompt(18, 5), greedy(60)),
                );
                submit(
                    &mut streams,
                    "long-c",
                    ServeRequest::new(prompt(22, 8), greedy(56)),
                );
            }
            6 => {
                let (id, reply) = h
                    .beam_search(
                        prompt(12, 6),
                        BeamParams {
                            width: 2,
                            max_tokens: 5,
                            ignore_eos: true,
                            trace: false,
                            ..BeamParams::default()
                        },
                        Arc::new(AtomicBool::new(false)),
                    )
                    .unwrap();
                record.line(format!("beam is request {id}"));
                beam_reply = Some(reply);
            }
            8 => {
                // A lens over the shared prompt, from the prefix cache.
                let p = shared.clone();
                lens_reply = Some(
                    h.run_cache_job(move |engine, lease| {
                        engine
                            .logit_lens_in(lease, &p, LensOptions::top(3))
                            .map(|lens| (lens.chosen, lens.settled_at, lens.layers.len()))
                    })
                    .unwrap(),
                );
            }
            _ => {}
        }
        let stats = h.next_step().unwrap().blocking_recv().unwrap();
        record.line(format!(
            "iteration {iteration}: used {} cached-free {} of {}",
            stats.blocks_used, stats.blocks_cached_free, stats.blocks_total
        ));
        record.view(&h);
        while let Ok(batch) = kv_events.try_recv() {
            for e in &batch.events {
                let line = kv_event(&mut record.names, e);
                record.line(format!("  kv event {}: {line}", batch.seq));
            }
        }
        for (name, stream) in &mut streams {
            while let Some(e) = stream.try_recv() {
                record.line(format!("  {}", stream_event(name, &e)));
            }
        }
        if !spec_done {
            if let Ok(result) = spec_reply.try_recv() {
                let g = result.unwrap();
                let stats = g.speculative.unwrap();
                record.line(format!(
                    "  speculative done: tokens {:?} finish {} rounds {} drafted {} accepted {}",
                    g.tokens, g.finish, stats.rounds, stats.drafted, stats.accepted
                ));
                for round in &stats.trace {
                    record.line(format!(
                        "    round at {} drafted {:?} accepted {} next {:?}",
                        round.position, round.drafted, round.accepted, round.next
                    ));
                }
                spec_done = true;
            }
        }
        if let Some(reply) = beam_reply.as_mut() {
            if let Ok(result) = reply.try_recv() {
                let out = result.unwrap();
                for hyp in &out.hypotheses {
                    record.line(format!(
                        "  beam hypothesis {:?} score {:016x}",
                        hyp.tokens,
                        hyp.score.to_bits()
                    ));
                }
                record.line(format!(
                    "  beam done: {:?} after {} steps, {} passes, peak {} blocks",
                    out.stop, out.steps, out.forward_passes, out.peak_kv_blocks
                ));
                beam_reply = None;
            }
        }
        if let Some(reply) = lens_reply.as_mut() {
            if let Ok(result) = reply.try_recv() {
                record.line(format!("  lens: {:?}", result.unwrap()));
                lens_reply = None;
            }
        }
    }
    // The whole timeline at the end: every step's parts, every request's events.
    let view = h.server_view(usize::MAX).unwrap().blocking_recv().unwrap();
    for step in &view.steps {
        let parts: Vec<String> = step
            .parts
            .iter()
            .map(|p| {
                format!(
                    "r{}/s{} {}{}",
                    p.request,
                    p.seq,
                    if p.decode { "decode " } else { "prompt " },
                    p.rows
                )
            })
            .collect();
        record.line(format!("step {}: {}", step.id, parts.join(", ")));
    }
    for e in &view.events {
        let kind = match e.kind {
            rill_engine::serve::timeline::LoopEventKind::Admitted { cached_tokens, .. } => {
                format!("admitted with {cached_tokens} cached")
            }
            k => format!("{k:?}"),
        };
        record.line(format!(
            "after step {}: request {} {kind}",
            e.after_step, e.request
        ));
    }
    assert!(spec_done && beam_reply.is_none() && lens_reply.is_none());
    assert_eq!(
        h.in_flight(),
        0,
        "every request ended within the iterations"
    );
    h.shutdown();

    let got = record.text;
    // Every kind of work showed up.
    for needle in [
        "Preempted",
        "admitted with 32 cached",
        "prompt 41 cached 32 computed 9",
        "speculative done",
        "beam done",
        "lens: (",
        "choices[2] done",
    ] {
        assert!(got.contains(needle), "the record has no {needle:?}:\n{got}");
    }
    let golden = golden_path();
    if std::env::var_os("RILL_BLESS").is_some() {
        std::fs::write(&golden, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}): run this test with RILL_BLESS=1, on the loop before the change \
             being tested, to write this kernel path's record",
            golden.display()
        )
    });
    if got != want {
        let (line, (g, w)) = got
            .lines()
            .zip(want.lines())
            .enumerate()
            .find(|(_, (g, w))| g != w)
            .unwrap_or((
                got.lines().count().min(want.lines().count()),
                ("(end)", "(end)"),
            ));
        panic!(
            "the loop's record differs from {} at line {}:\n  got:  {g}\n  want: {w}\n(got {} lines, want {})",
            golden.display(),
            line + 1,
            got.lines().count(),
            want.lines().count()
        );
    }
}
