//! Every architecture on a tiny random model made by HF transformers' own classes and converted
//! by llama.cpp's `convert_hf_to_gguf.py` (`tools/models/make_tiny.py`), against references from
//! transformers in f32 on the original weights (`tests/data/tiny/<name>/`). The exact path must
//! match as closely as on the real models; the fast path (8-bit activations) is reported and held
//! to a loose bar, since random weights make near-ties common.

mod reference_check;

use reference_check::{check_exact, check_fast, data_dir, Fixture};
use rill_model::{Architecture, Model};

fn fixture(name: &str) -> Fixture {
    let dir = data_dir().join("tiny").join(name);
    let model = Model::load(dir.join("model.gguf"), 2)
        .unwrap_or_else(|e| panic!("{name}: the model does not load: {e}"));
    Fixture::new(model, dir)
}

fn check(name: &str, architecture: Architecture) {
    let f = fixture(name);
    assert_eq!(f.model.lock().unwrap().config().architecture, architecture);
    check_exact(&f);
    check_fast(&f, 0.95, 1e-3);
}

#[test]
fn qwen2_with_biases_and_a_tied_head() {
    check("qwen2-tiny", Architecture::Qwen2);
}

#[test]
fn qwen2_with_its_own_output_head() {
    check("qwen2-untied", Architecture::Qwen2);
}

#[test]
fn qwen3_with_head_norms_and_wider_heads_than_the_model() {
    check("qwen3-tiny", Architecture::Qwen3);
}

#[test]
fn qwen2_with_yarn_rope_scaling() {
    check("qwen2-yarn", Architecture::Qwen2);
}

#[test]
fn llama_with_llama3_rope_frequencies_and_its_own_head() {
    check("llama-tiny", Architecture::Llama);
}

#[test]
fn gemma2_with_soft_caps_and_alternating_sliding_windows() {
    check("gemma2-tiny", Architecture::Gemma2);
}

/// Gemma 3 at its 27B's query scale: llama.cpp knows the 27B by its 62 layers and scales its
/// queries by 1/sqrt(d_model / n_heads), not 1/sqrt(head_dim) (the GGUF does not say); a tiny
/// model of 62 layers with that ratio (1/4 against 1/sqrt(8)).
#[test]
fn gemma3_at_the_27b_query_scale() {
    let f = fixture("gemma3-27b-shape");
    assert_eq!(f.model.lock().unwrap().config().attention_scale, 0.25);
    check("gemma3-27b-shape", Architecture::Gemma3);
}

/// Phi-3 without rope scaling (Phi-3-mini-4k-instruct's kind): the converter writes the original
/// context but no LongRoPE factors; the rotation is plain RoPE over the partial rotary dims.
#[test]
fn phi3_with_plain_rope_and_no_rope_factors() {
    let f = fixture("phi3-plain-rope");
    assert_eq!(
        f.model.lock().unwrap().config().rope_scaling,
        rill_model::RopeScaling::None
    );
    check("phi3-plain-rope", Architecture::Phi3);
}

/// Qwen3.5: three Gated DeltaNet layers and a gated attention layer with partial RoPE; the
/// converter stores the value heads tiled over the key heads.
#[test]
fn qwen35_with_gated_deltanet_and_gated_attention() {
    check("qwen35-tiny", Architecture::Qwen35);
}

/// Qwen3.5 with its multi-token-prediction block (converted without `--no-mtp`): the main pass
/// stops before the block (`tests/mtp.rs` runs the block itself).
#[test]
fn qwen35_with_an_mtp_block_after_its_layers() {
    check("qwen35mtp-tiny", Architecture::Qwen35);
}

/// Qwen3.5-MoE: Qwen3.5's layers with routed experts and a sigmoid-gated shared expert.
#[test]
fn qwen35moe_with_a_gated_shared_expert() {
    check("qwen35moe-tiny", Architecture::Qwen35Moe);
}

/// LFM2: gated short convolutions with one attention layer; the final norm is stored as
/// `token_embd_norm`.
#[test]
fn lfm2_with_short_convolutions() {
    check("lfm2-tiny", Architecture::Lfm2);
}

/// Granite 4.0-H's kind: Mamba-2 layers (8 heads in 2 groups) with an attention layer without
/// RoPE, and Granite's multipliers.
#[test]
fn granitehybrid_with_mamba2_layers() {
    check("granitehybrid-tiny", Architecture::GraniteHybrid);
}

/// Gemma 4 (the E2B/E4B kind): per-layer input embeddings, sliding layers with heads half the
/// size of the global ones, three last layers attending over earlier layers' keys and values,
/// double-wide feed-forwards there, proportional RoPE on the global layers (`rope_freqs`),
/// weightless value norms, unit attention scale, a scale on each layer's output and a final
/// soft cap.
#[test]
fn gemma4_with_per_layer_inputs_and_shared_keys_and_values() {
    check("gemma4-tiny", Architecture::Gemma4);
}

/// Gemma 4 26B-A4B's kind: a dense feed-forward beside 2 of 8 routed experts in every layer
/// (each branch normed, the router reading the residual stream with a scale of its own, a
/// factor per expert), keys equal to values on the global layers, which have fewer KV heads.
#[test]
fn gemma4_with_experts_beside_the_dense_feed_forward_and_keys_as_values() {
    check("gemma4moe-tiny", Architecture::Gemma4);
}

/// Past Gemma 4's last layer that stores keys and values, only the rows with logits go on (the
/// KV-shared layers change nothing later rows read): a prompt asking for its last row's logits
/// gives the bits of one asking for every row's, alone or batched with another sequence's
/// decoding row, and the reference's logits.
#[test]
fn gemma4_rows_without_logits_stop_before_the_shared_layers() {
    use reference_check::{ids, kl, read_f32};
    use rill_model::{Batch, Precision};
    let f = fixture("gemma4-tiny");
    let mut model = f.model.lock().unwrap();
    let vocab = model.config().vocab_size;
    for case in f.reference["cases"].as_array().unwrap() {
        let name = case["id"].as_str().unwrap();
        let tokens = ids(&case["token_ids"]);
        let n = tokens.len();
        let mut last = Vec::new();
        for all_logits in [true, false] {
            let mut kv = model.new_kv_cache(n + 32, Precision::Exact).unwrap();
            kv.add_sequence(0).unwrap();
            kv.add_sequence(1).unwrap();
            // Sequence 1 holds the prompt's first token and decodes its second beside it.
            let mut logits = Vec::new();
            let first = Batch::prompt(1, &tokens[..1], 0, true);
            model
                .forward(&first, &mut kv, Precision::Exact, &mut logits)
                .unwrap();
            let mut batch = Batch::prompt(0, &tokens, 0, all_logits);
            if n > 1 {
                batch.push(1, tokens[1], 1, true);
            }
            model
                .forward(&batch, &mut kv, Precision::Exact, &mut logits)
                .unwrap();
            let rows = batch.n_logits();
            let prompt_last = if n > 1 { rows - 2 } else { rows - 1 };
            let row = logits[prompt_last * vocab..(prompt_last + 1) * vocab].to_vec();
            if n > 1 {
                let decoded = &logits[(rows - 1) * vocab..];
                let mut alone = Vec::new();
                let mut kv1 = model.new_kv_cache(2, Precision::Exact).unwrap();
                kv1.add_sequence(0).unwrap();
                let two = Batch::prompt(0, &tokens[..2], 0, false);
                model
                    .forward(&two, &mut kv1, Precision::Exact, &mut alone)
                    .unwrap();
                assert_eq!(decoded, &alone[..], "{name}: the decoding row's logits");
            }
            if all_logits {
                last = row;
            } else {
                assert_eq!(
                    row, last,
                    "{name}: the last row's logits with and without the others'"
                );
                let reference = read_f32(&f.dir.join(format!("{name}.last_logits.f32")));
                let d = kl(&reference, &row);
                assert!(d <= 1e-4, "{name}: KL(ref || rill) = {d}");
            }
        }
    }
}

/// LFM2-MoE: LFM2's layers, a dense first layer, then 2 of 8 experts chosen by a sigmoid router
/// plus a per-layer selection bias (which changes the chosen pair at a third of the positions).
#[test]
fn lfm2moe_with_a_sigmoid_router_and_a_selection_bias() {
    check("lfm2moe-tiny", Architecture::Lfm2Moe);
}

#[test]
fn olmo2_with_norms_after_the_sublayers() {
    check("olmo2-tiny", Architecture::Olmo2);
}

#[test]
fn smollm3_with_layers_without_rope() {
    check("smollm3-tiny", Architecture::Smollm3);
}

#[test]
fn granite_with_its_multipliers() {
    check("granite-tiny", Architecture::Granite);
}

#[test]
fn qwen3moe_routes_each_token_to_two_of_eight_experts() {
    check("qwen3moe-tiny", Architecture::Qwen3Moe);
}

/// A routed feed-forward groups a step's rows by expert: each row's logits must still be
/// bit-identical whatever rows share its batch (fast and exact paths).
#[test]
fn qwen3moe_rows_are_the_same_alone_or_batched() {
    use rill_model::{Batch, Precision};
    let f = fixture("qwen3moe-tiny");
    let mut model = f.model.lock().unwrap();
    let vocab = model.config().vocab_size;
    let a: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 500).collect();
    let b: Vec<u32> = (0..13).map(|i| (i * 11 + 200) % 500).collect();
    for precision in [Precision::Fast, Precision::Exact] {
        let mut alone = Vec::new();
        for tokens in [&a, &b] {
            let mut kv = model.new_kv_cache(64, precision).unwrap();
            kv.add_sequence(0).unwrap();
            let mut logits = Vec::new();
            model
                .forward(
                    &Batch::prompt(0, tokens, 0, true),
                    &mut kv,
                    precision,
                    &mut logits,
                )
                .unwrap();
            alone.push(logits);
        }
        let mut kv = model.new_kv_cache(128, precision).unwrap();
        kv.add_sequence(0).unwrap();
        kv.add_sequence(1).unwrap();
        let mut batch = Batch::prompt(0, &a, 0, true);
        batch.rows.extend(Batch::prompt(1, &b, 0, true).rows);
        let mut logits = Vec::new();
        model
            .forward(&batch, &mut kv, precision, &mut logits)
            .unwrap();
        let (got_a, got_b) = logits.split_at(a.len() * vocab);
        assert!(
            got_a == alone[0].as_slice(),
            "{precision:?}: sequence a changed when batched"
        );
        assert!(
            got_b == alone[1].as_slice(),
            "{precision:?}: sequence b changed when batched"
        );
    }
}

/// Decoding a token reads only the experts it chose: the profile's weight bytes of a one-row
/// pass are the dense matrices, the head, the token's embedding row and, per layer, `n_used`
/// experts (distinct by construction); a prompt pass reads each chosen expert once however
/// many of its rows chose it.
#[test]
fn qwen3moe_decoding_reads_only_the_chosen_experts() {
    use rill_model::{Batch, FeedForward, Precision};
    let f = fixture("qwen3moe-tiny");
    let mut model = f.model.lock().unwrap();
    let w = model.weights();
    let (mut dense, mut expert_bytes, mut all_experts, mut n_used) = (0, 0, 0, 0);
    for layer in &w.layers {
        let read = |m: &rill_model::Weight| m.bytes_read(Precision::Fast);
        dense += layer.mixer.matrices().into_iter().map(read).sum::<usize>();
        let FeedForward::Routed {
            router,
            experts,
            n_used: k,
            ..
        } = &layer.ffn
        else {
            panic!("a dense layer in qwen3moe-tiny");
        };
        dense += read(router);
        let of = |e: &rill_model::Expert| read(&e.gate) + read(&e.up) + read(&e.down);
        let one = of(&experts[0]);
        assert!(experts.iter().all(|e| of(e) == one));
        expert_bytes += k * one;
        all_experts += experts.len() * one;
        n_used = *k;
    }
    let embedding_row = w.token_embd.row_bytes();
    dense += w.output.bytes_read(Precision::Fast) + embedding_row;
    assert!(n_used > 0);
    let mut kv = model.new_kv_cache(64, Precision::Fast).unwrap();
    kv.add_sequence(0).unwrap();
    let mut logits = Vec::new();
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 500).collect();
    model.set_profiling(true);
    model
        .forward(
            &Batch::prompt(0, &prompt, 0, false),
            &mut kv,
            Precision::Fast,
            &mut logits,
        )
        .unwrap();
    let prompt_bytes = model.stage_times().unwrap().weight_bytes as usize;
    // The prompt's 24 rows chose more than one token's experts, and at most all of them.
    let prompt_dense = dense + (prompt.len() - 1) * embedding_row;
    assert!(prompt_bytes > prompt_dense + expert_bytes, "{prompt_bytes}");
    assert!(prompt_bytes <= prompt_dense + all_experts, "{prompt_bytes}");
    model.reset_stage_times();
    let mut step = Batch::new();
    step.push(0, 42, prompt.len(), true);
    model
        .forward(&step, &mut kv, Precision::Fast, &mut logits)
        .unwrap();
    let p = model.stage_times().unwrap().clone();
    model.set_profiling(false);
    assert_eq!((p.passes, p.rows), (1, 1));
    assert_eq!(p.weight_bytes as usize, dense + expert_bytes);
}

#[test]
fn gpt_oss_with_sinks_biases_clamped_experts_and_yarn() {
    check("gptoss-tiny", Architecture::GptOss);
}

/// Phi-3 decides LongRoPE's factors by the context's size, as llama.cpp does; transformers decides
/// per forward call, so its references use the long factors throughout only where the prompt alone
/// passes the original 32 positions (the 33- and 70-token cases), which are the cases checked
/// (with a cache of prompt + 32 positions, past the original context).
#[test]
fn phi3_with_fused_projections_partial_rotary_and_longrope() {
    let mut f = fixture("phi3-tiny");
    assert_eq!(
        f.model.lock().unwrap().config().architecture,
        Architecture::Phi3
    );
    let cases = f.reference["cases"].as_array().unwrap().clone();
    // The short factors: the one-token case with 31 greedy tokens stays within the original 32
    // positions in both engines (a cache of exactly 32).
    {
        let case = &cases[0];
        let tokens = reference_check::ids(&case["token_ids"]);
        assert_eq!(tokens.len(), 1);
        let mut model = f.model.lock().unwrap();
        let (_, last, greedy) =
            reference_check::run_case(&mut model, &tokens, rill_model::Precision::Exact, 31);
        let want = reference_check::read_f32(&f.dir.join("len1.last_logits.f32"));
        let d = reference_check::kl(&want, &last);
        assert!(d <= 1e-4, "short factors: KL {d}");
        assert_eq!(greedy, reference_check::ids(&case["greedy_ids"])[..31]);
    }
    let past_original: Vec<_> = cases
        .into_iter()
        .filter(|c| c["token_ids"].as_array().unwrap().len() > 32)
        .collect();
    assert_eq!(past_original.len(), 2);
    f.reference["cases"] = serde_json::Value::Array(past_original);
    check_exact(&f);
    check_fast(&f, 0.95, 1e-3);
}
