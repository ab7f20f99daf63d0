//! The serving loop with hybrid models (Qwen3.5's Gated DeltaNet, LFM2's short convolutions,
//! Granite 4.0-H's Mamba-2), on the tiny random models: requests batched, chunked, preempted,
//! forked into `n` choices and resumed from the prefix cache's stored state give exactly what
//! each gives alone through a session; the recurrent state's slots all come back.

use rill_engine::{spawn, state_budget, GenerateParams, ServeConfig, ServeRequest};

mod common;
use common::{
    alone, collect, greedy, metric, sampled, settled, tiny_engine as engine, tiny_prompt as prompt,
    tiny_serve_config as config,
};

const MODELS: [&str; 3] = ["qwen35-tiny", "lfm2-tiny", "granitehybrid-tiny"];

/// Six requests, four at a time, prompts chunked over several steps beside decoding ones.
#[test]
fn batched_and_chunked_requests_match_sessions() {
    for name in MODELS {
        let mut e = engine(name);
        let h = spawn(engine(name), config()).unwrap();
        let summary = h.model_summary();
        assert!(summary.state_bytes_per_sequence > 0, "{name}");
        let b = state_budget(e.model.config(), &config()).unwrap();
        assert_eq!(summary.state_sequences, b.sequences, "{name}");
        let requests: Vec<(Vec<u32>, GenerateParams)> = (0..6)
            .map(|i| (prompt(40 + 17 * i, i as u32 + 1), sampled(i as u64, 24)))
            .collect();
        let streams: Vec<_> = requests
            .iter()
            .map(|(p, params)| {
                h.submit(ServeRequest::new(p.clone(), params.clone()))
                    .unwrap()
            })
            .collect();
        for (i, stream) in streams.into_iter().enumerate() {
            let (got, _) = collect(stream, 1);
            let (p, params) = &requests[i];
            assert_eq!(got[0], alone(&mut e, p, params), "{name}: request {i}");
        }
        let kv = settled(&h);
        assert_eq!(kv.blocks_used, 0, "{name}: {kv:?}");
        h.shutdown();
    }
}

/// A conversation's next turn resumes from the state stored at the last block boundary of the
/// previous turn (the prompt, its answer and the next message), and gives what it gives alone.
#[test]
fn a_conversations_next_turn_resumes_from_the_stored_state() {
    for name in MODELS {
        let mut e = engine(name);
        let h = spawn(engine(name), config()).unwrap();
        let first = prompt(70, 3);
        let params = greedy(30);
        let (answer, cached) = collect(
            h.submit(ServeRequest::new(first.clone(), params.clone()))
                .unwrap(),
            1,
        );
        assert_eq!(cached, 0);
        assert_eq!(answer[0], alone(&mut e, &first, &params), "{name}");
        // The history (the answer's last token was never computed) and more: the sequence
        // ended at 99 positions, its snapshot at 96.
        let next = [first.as_slice(), &answer[0], &prompt(20, 4)].concat();
        let (again, cached) = collect(
            h.submit(ServeRequest::new(next.clone(), params.clone()))
                .unwrap(),
            1,
        );
        assert_eq!(cached, 96, "{name}");
        assert_eq!(again[0], alone(&mut e, &next, &params), "{name}");
        h.shutdown();
    }
}

/// `n` sampled choices fork the prompt's state: each is its own seed's generation alone.
#[test]
fn n_choices_fork_the_state() {
    for name in MODELS {
        let mut e = engine(name);
        let h = spawn(engine(name), config()).unwrap();
        let p = prompt(50, 6);
        let params = sampled(40, 16);
        let (got, _) = collect(
            h.submit(ServeRequest {
                prompt: p.clone(),
                params: params.clone(),
                n: 3,
                trace: Default::default(),
            })
            .unwrap(),
            3,
        );
        for (c, tokens) in got.iter().enumerate() {
            let mut own = params.clone();
            own.sampling.seed += c as u64;
            assert_eq!(tokens, &alone(&mut e, &p, &own), "{name}: choice {c}");
        }
        h.shutdown();
    }
}

/// A KV budget too small for four long requests at once: sequences are preempted (their state
/// freed) and recomputed, and every request still gives what it gives alone. (On LFM2, whose
/// state is small: the state's share is at most half the budget, so a budget of a few blocks
/// holds only a few sequences of the larger states.)
#[test]
fn preempted_requests_recompute_their_state_and_match_sessions() {
    let name = "lfm2-tiny";
    let mut e = engine(name);
    // The attention layer's blocks: 2 KV heads × 16 × 2 bytes × 2 (keys, values) × 16 positions.
    let block = 2 * 16 * 2 * 2 * 16;
    let cfg = ServeConfig {
        kv_cache_bytes: 0,
        max_batch_tokens: 16,
        ..config()
    };
    // A budget whose state share leaves 14 blocks: four requests of up to 7 blocks cannot all
    // run at once. (The share depends on the budget: the smallest budget that is its own share,
    // with room for all four sequences' state, plus 14 blocks.)
    let kv_cache_bytes = (1024..64 << 20)
        .step_by(256)
        .find(|&bytes| {
            let c = ServeConfig {
                kv_cache_bytes: bytes,
                ..cfg.clone()
            };
            let share = state_budget(e.model.config(), &c).unwrap();
            share.sequences >= 4 && bytes >= share.bytes + 14 * block
        })
        .unwrap();
    let cfg = ServeConfig {
        kv_cache_bytes,
        ..cfg
    };
    let h = spawn(engine(name), cfg).unwrap();
    assert_eq!(h.kv_stats().blocks_total, 14);
    let requests: Vec<(Vec<u32>, GenerateParams)> = (0..4)
        .map(|i| {
            (
                prompt(60 + 10 * i, 20 + i as u32),
                sampled(10 + i as u64, 60),
            )
        })
        .collect();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let held = h
        .run_job(move |_| {
            let _ = gate.recv();
        })
        .unwrap();
    let streams: Vec<_> = requests
        .iter()
        .map(|(p, params)| {
            h.submit(ServeRequest::new(p.clone(), params.clone()))
                .unwrap()
        })
        .collect();
    release.send(()).unwrap();
    held.blocking_recv().unwrap();
    for (i, stream) in streams.into_iter().enumerate() {
        let (got, _) = collect(stream, 1);
        let (p, params) = &requests[i];
        assert_eq!(got[0], alone(&mut e, p, params), "request {i}");
    }
    assert!(
        metric(&h, "rill_preemptions_total") > 0.0,
        "no preemption: the test needs a tighter budget"
    );
    assert_eq!(settled(&h).blocks_used, 0);
    h.shutdown();
}
