//! The serving loop with Gemma 4 (the tiny random model: a KV cache laid out per layer, sliding
//! layers with their own arena and smaller heads, KV-shared last layers that store nothing and
//! that a prompt's rows without logits skip): requests batched, chunked, preempted, forked into
//! `n` choices and resumed from the prefix cache give exactly what each gives alone through a
//! session, and every block comes back.

use rill_engine::{
    spawn, split_kv_budget, Engine, GenerateParams, Precision, ServeConfig, ServeRequest,
};

mod common;
use common::{
    alone, collect, greedy, metric, sampled, settled, tiny_engine, tiny_prompt as prompt,
    tiny_serve_config as config,
};

fn engine() -> Engine {
    tiny_engine("gemma4-tiny")
}

/// Six requests, four at a time, prompts several windows long chunked over several steps beside
/// decoding ones.
#[test]
fn batched_and_chunked_requests_match_sessions() {
    let mut e = engine();
    let h = spawn(engine(), config()).unwrap();
    // Only the three layers that compute keys and values store them.
    let layout = e.model.kv_layout().clone();
    assert_eq!(layout.n_storing(), 3, "{layout}");
    assert_eq!(
        h.model_summary().kv_bytes_per_token,
        e.model
            .new_kv_cache(16, Precision::Fast)
            .unwrap()
            .bytes_per_token()
    );
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
        assert_eq!(got[0], alone(&mut e, p, params), "request {i}");
    }
    let kv = settled(&h);
    assert_eq!(kv.blocks_used, 0, "{kv:?}");
    h.shutdown();
}

/// A conversation's next turn starts from the prefix cache (its history's blocks, and the
/// window layers' last blocks) and gives what it gives alone.
#[test]
fn a_conversations_next_turn_starts_from_the_prefix_cache() {
    let mut e = engine();
    let h = spawn(engine(), config()).unwrap();
    let first = prompt(70, 3);
    let params = greedy(30);
    let (answer, cached) = collect(
        h.submit(ServeRequest::new(first.clone(), params.clone()))
            .unwrap(),
        1,
    );
    assert_eq!(cached, 0);
    assert_eq!(answer[0], alone(&mut e, &first, &params));
    let next = [first.as_slice(), &answer[0], &prompt(20, 4)].concat();
    let (again, cached) = collect(
        h.submit(ServeRequest::new(next.clone(), params.clone()))
            .unwrap(),
        1,
    );
    assert!(cached >= 96, "{cached} cached");
    assert_eq!(again[0], alone(&mut e, &next, &params));
    h.shutdown();
}

/// `n` sampled choices fork the prompt's blocks: each is its own seed's generation alone.
#[test]
fn n_choices_fork_the_cache() {
    let mut e = engine();
    let h = spawn(engine(), config()).unwrap();
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
        assert_eq!(tokens, &alone(&mut e, &p, &own), "choice {c}");
    }
    h.shutdown();
}

/// A KV budget too small for four long requests at once: sequences are preempted and
/// recomputed, and every request still gives what it gives alone.
#[test]
fn preempted_requests_recompute_and_match_sessions() {
    let mut e = engine();
    let cfg = ServeConfig {
        max_batch_tokens: 16,
        ..config()
    };
    // The smallest budget whose global arena holds 14 blocks: four requests of up to 10 blocks
    // cannot all run at once.
    let types = e.model.kv_types(Precision::Fast);
    let kv_cache_bytes = (1024..64 << 20)
        .step_by(256)
        .find(|&bytes| {
            let c = ServeConfig {
                kv_cache_bytes: bytes,
                ..cfg.clone()
            };
            split_kv_budget(e.model.config(), types, &c).blocks >= 14
        })
        .unwrap();
    let h = spawn(
        engine(),
        ServeConfig {
            kv_cache_bytes,
            ..cfg
        },
    )
    .unwrap();
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
    let kv = settled(&h);
    assert_eq!(kv.blocks_used, 0, "{kv:?}");
    h.shutdown();
}
