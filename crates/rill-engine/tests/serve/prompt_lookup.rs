//! Prompt lookup inside the loop (`ServeConfig::prompt_lookup_tokens`): drafted tokens are
//! verified in the step's own pass, and what a request gets is exactly plain decoding's
//! (tokens, text, finish, log-probabilities, seeded draws), in fewer steps where its output
//! repeats what came before. Where a test counts drafts or steps, drafts are sized by the
//! adaptive length alone (`prompt_lookup_measured: false`): the measured rule depends on
//! step times. What a request gets is checked with both.

use super::*;

/// The tests' loop, its drafts sized without timing.
fn deterministic() -> ServeConfig {
    ServeConfig {
        prompt_lookup_measured: false,
        ..config()
    }
}

/// A prompt whose continuation the tiny model copies: a phrase said three times.
fn repetitive() -> Vec<u32> {
    let phrase = bytes("the lamp by the window, ");
    phrase.repeat(3)
}

/// Runs one request on a paused loop, one step at a time: its outcome and the steps it took.
fn stepped(h: &ServeHandle, prompt: &[u32], params: &GenerateParams) -> (Outcome, usize) {
    h.pause().unwrap();
    let mut stream = h
        .submit(ServeRequest::new(prompt.to_vec(), params.clone()))
        .unwrap();
    let mut out = Outcome {
        choices: vec![Choice::default()],
        ..Outcome::default()
    };
    let mut steps = 0;
    while out.usage.is_none() && out.error.is_none() {
        step(h);
        steps += 1;
        assert!(steps < 1000, "the request never ended");
        while let Some(event) = stream.try_recv() {
            apply(&mut out, event);
        }
    }
    (out, steps)
}

#[test]
fn drafts_kept_give_plain_decodings_tokens_in_fewer_steps() {
    let mut e = tiny();
    let p = repetitive();
    let with = serve(deterministic());
    let measured = serve(config());
    let without = serve(ServeConfig {
        prompt_lookup_tokens: 0,
        ..config()
    });
    let mut logprobs = greedy(48);
    logprobs.top_logprobs = Some(3);
    let cases = [
        ("greedy", greedy(48)),
        ("greedy, log-probabilities", logprobs),
        ("sampled", sampled(11, 48)),
    ];
    for (what, params) in cases {
        let want = reference(&mut e, &p, &params);
        let (plain, plain_steps) = stepped(&without, &p, &params);
        let (got, steps) = stepped(&with, &p, &params);
        let (timed, _) = stepped(&measured, &p, &params);
        assert_same(&plain.choices[0], &want, &format!("{what}, plain"));
        assert_same(&got.choices[0], &want, &format!("{what}, prompt lookup"));
        assert_same(
            &timed.choices[0],
            &want,
            &format!("{what}, measured drafts"),
        );
        assert!(
            steps <= plain_steps,
            "{what}: {steps} steps with prompt lookup, {plain_steps} without"
        );
    }
    // Greedy decoding of the repeated phrase copies it: drafts were kept.
    let (_, plain_steps) = stepped(&without, &p, &greedy(48));
    let (_, steps) = stepped(&with, &p, &greedy(48));
    assert!(
        steps < plain_steps,
        "{steps} steps, {plain_steps} without drafts"
    );
    let drafted = metric(&with, "rill_spec_decode_draft_tokens_total");
    let kept = metric(&with, "rill_spec_decode_accepted_tokens_total");
    assert!(kept > 0.0 && kept <= drafted, "kept {kept} of {drafted}");
    assert_eq!(metric(&without, "rill_spec_decode_draft_tokens_total"), 0.0);
    // Every draft's rows were rolled back or kept: nothing leaked.
    let kv = settled(&with);
    assert_eq!(kv.blocks_used, 0, "{kv:?}");
}

#[test]
fn batched_requests_with_drafts_each_get_what_they_get_alone() {
    let mut e = tiny();
    let requests: Vec<(Vec<u32>, GenerateParams)> = vec![
        (repetitive(), greedy(40)),
        (prompt(30, 3), sampled(7, 30)),
        (repetitive(), sampled(5, 40)),
        ([prompt(12, 1), repetitive()].concat(), greedy(25)),
    ];
    for (sizing, config) in [("adaptive", deterministic()), ("measured", config())] {
        let h = serve(config);
        let mut streams = submit_all(&h, &requests);
        for (i, ((p, params), stream)) in requests.iter().zip(&mut streams).enumerate() {
            let got = collect(stream, 1);
            let want = reference(&mut e, p, params);
            assert_same(&got.choices[0], &want, &format!("{sizing}: request {i}"));
        }
        if sizing == "adaptive" {
            assert!(metric(&h, "rill_spec_decode_accepted_tokens_total") > 0.0);
        }
        let kv = settled(&h);
        assert_eq!(kv.blocks_used, 0, "{sizing}: {kv:?}");
    }
}

#[test]
fn a_stop_string_inside_a_kept_draft_ends_the_answer_where_plain_decoding_does() {
    let mut e = tiny();
    let p = repetitive();
    // Where greedy decoding goes: stop at a piece of it that comes a few tokens in.
    let free = reference(&mut e, &p, &greedy(40));
    let text = free.text.clone();
    let at = text.chars().count() / 2;
    let stop: String = text.chars().skip(at).take(3).collect();
    let params = GenerateParams {
        stop: vec![stop],
        ..greedy(40)
    };
    let want = reference(&mut e, &p, &params);
    // Drafts sized without timing, so that they run (and are kept) on every run.
    let h = serve(deterministic());
    let got = run(&h, &p, &params);
    assert_same(&got.choices[0], &want, "stop string");
    assert!(metric(&h, "rill_spec_decode_accepted_tokens_total") > 0.0);
    let max = GenerateParams {
        max_tokens: 7,
        ..greedy(40)
    };
    let got = run(&h, &p, &max);
    assert_same(&got.choices[0], &reference(&mut e, &p, &max), "max_tokens");
}

#[test]
fn drafts_on_a_sliding_window_model_roll_back_within_the_window() {
    let mut spec = SyntheticSpec::gemma3_tiny();
    spec.context_length = 512;
    spec.sliding_window = Some(8);
    let bytes = spec.build().unwrap();
    let mut e = common::load_synthetic(&bytes);
    let h = spawn(common::load_synthetic(&bytes), deterministic()).unwrap();
    // The repeated phrase is longer than the window: drafted rows run past it.
    let p = repetitive();
    for params in [greedy(60), sampled(3, 60)] {
        let got = run(&h, &p, &params);
        assert_same(&got.choices[0], &reference(&mut e, &p, &params), "windowed");
    }
    assert!(metric(&h, "rill_spec_decode_draft_tokens_total") > 0.0);
    let kv = settled(&h);
    assert_eq!(kv.blocks_used, 0, "{kv:?}");
    assert_eq!(kv.window_blocks_used, 0, "{kv:?}");
}
