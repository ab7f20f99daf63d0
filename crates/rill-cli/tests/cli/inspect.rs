//! Inspect.

use super::*;

fn check_inspect(model: &str) -> String {
    let args = ["inspect", model];
    let out = ok(&args, &rill(&args));
    for needle in [
        "parameters",
        "FLOPs per token",
        "KV cache per token",
        "metadata",
        "tensors",
    ] {
        assert!(
            out.contains(needle),
            "inspect {model}: no {needle:?} in:\n{out}"
        );
    }
    out
}

#[test]
fn inspect_synthetic_and_smollm2() {
    let out = check_inspect(synthetic());
    assert!(out.contains("llama (2 layers, d_model 64"), "{out}");
    let out = check_inspect(synthetic_gemma());
    assert!(out.contains("sliding window 4 on 2 of 3 layers"), "{out}");
    let out = check_inspect(smollm2());
    assert!(out.contains("30 layers"), "{out}");
    assert!(out.contains("vocab 49152"), "{out}");
    // Every product's kernel, by the registry's name: the Q4_1 layers' and the tied Q8_0 head's
    // (which path depends on the CPU and the leg's switches; a registered module either way).
    let kernels = &out[out.find("kernels on this CPU's fast path").expect(&out)..];
    let q4_1 = kernels.find("Q4_1,").expect(kernels);
    assert!(
        kernels.contains("output (tied to token_embd): Q8_0"),
        "{kernels}"
    );
    assert!(
        ["blocks_q32::", "interleaved_q32::", "scalar::"]
            .iter()
            .any(|module| kernels[q4_1..].contains(module)),
        "no registered Q4_1 kernel named in:\n{kernels}"
    );
    let args = ["inspect", synthetic(), "--all-tensors"];
    let out = ok(&args, &rill(&args));
    assert!(out.contains("blk.1.ffn_down.weight"), "{out}");
}

#[test]
fn usage_errors_do_not_panic() {
    for args in [
        &["frobnicate"][..],
        &["run"][..],
        &["probe", "--top", "many", "x"][..],
        &["tokenize", "--file", "a", "b"][..],
    ] {
        let out = rill(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "rill {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
}
