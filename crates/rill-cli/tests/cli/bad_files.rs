//! Bad files.

use super::*;

#[test]
fn truncated_real_model() {
    let real = std::fs::read(smollm2()).unwrap();
    let first_mb = write_tmp("smollm2-1mb.gguf", &real[..1 << 20]);
    // The cut falls inside the metadata (the merges array): either the array's count is seen to
    // be impossible for what is left, or a read runs past the end.
    let truncated = |stderr: String| {
        assert!(
            stderr.contains("file is truncated") || stderr.contains("bytes remain in the file"),
            "{stderr}"
        )
    };
    let args = ["probe", "-m", &first_mb, "-t", "1", "--token-ids", "1"];
    truncated(fails(&args, &rill(&args), &["smollm2-1mb.gguf"]));
    let args = ["tokenize", "-m", &first_mb, "hello"];
    truncated(fails(&args, &rill(&args), &[]));
    let args = ["inspect", &first_mb];
    truncated(fails(&args, &rill(&args), &[]));

    // Cut inside the tensor data: the directory is intact, the last tensors are not there.
    let file = rill_gguf::GgufFile::open(smollm2()).unwrap();
    assert!(file.data_start() < real.len() as u64 / 2);
    let cut = write_tmp("smollm2-cut.gguf", &real[..real.len() / 2]);
    load_fails(&cut, &["outside the file"]);
    let args = ["run", "-m", &cut, "-n", "1", "hi"];
    fails(&args, &rill(&args), &["outside the file"]);
    // Half a real model is too big to leave behind in the temp dir.
    std::fs::remove_file(&cut).unwrap();
}

#[test]
fn not_a_gguf_file() {
    let f = write_tmp("not-gguf.gguf", b"this is a text file, not a model\n");
    load_fails(&f, &["not a GGUF file"]);
    let args = ["tokenize", "-m", &f, "hello"];
    fails(&args, &rill(&args), &["not a GGUF file"]);
    let empty = write_tmp("empty.gguf", b"");
    load_fails(&empty, &["truncated"]);
    let mut v4 = synthetic_bytes().to_vec();
    v4[4..8].copy_from_slice(&4u32.to_le_bytes());
    load_fails(&write_tmp("v4.gguf", &v4), &["version 4"]);
}

/// Offset of the tensor directory entry of `name` just after its name (at its dimension count).
fn entry_of(bytes: &[u8], name: &str) -> usize {
    let needle = name.as_bytes();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor name in file");
    at + needle.len()
}

fn patched(name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut b = synthetic_bytes().to_vec();
    edit(&mut b);
    write_tmp(name, &b)
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn corrupted_counts_lengths_offsets_and_dimensions() {
    const T: &str = "blk.0.attn_q.weight";
    type Patch = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Patch, &[&str])> = vec![
        (
            "tensor-count",
            Box::new(|b| put_u64(b, 8, u64::MAX / 3)),
            &["tensor count"],
        ),
        (
            "kv-count",
            Box::new(|b| put_u64(b, 16, 1 << 50)),
            &["metadata entry count"],
        ),
        (
            "key-length",
            Box::new(|b| put_u64(b, 24, 1 << 40)),
            &["truncated"],
        ),
        // The dimension count, a dimension, the type, the offset of one directory entry.
        (
            "n-dims",
            Box::new(|b| {
                let at = entry_of(b, T);
                put_u32(b, at, 9)
            }),
            &["9 dimensions"],
        ),
        (
            "dim-overflow",
            Box::new(|b| {
                let at = entry_of(b, T) + 4;
                put_u64(b, at, u64::MAX / 2)
            }),
            &[T, "overflow"],
        ),
        (
            "dim-zero",
            Box::new(|b| {
                let at = entry_of(b, T) + 12;
                put_u64(b, at, 0)
            }),
            &[T, "zero"],
        ),
        (
            "dim-beyond-data",
            Box::new(|b| {
                let at = entry_of(b, T) + 12;
                put_u64(b, at, 1 << 30)
            }),
            &[T, "outside the file"],
        ),
        (
            "type",
            Box::new(|b| {
                let at = entry_of(b, T) + 20;
                put_u32(b, at, 200)
            }),
            &[T, "type id 200"],
        ),
        (
            "offset",
            Box::new(|b| {
                let at = entry_of(b, T) + 24;
                put_u64(b, at, 1 << 40)
            }),
            &[T, "outside the file"],
        ),
        (
            "offset-misaligned",
            Box::new(|b| {
                let at = entry_of(b, T) + 24;
                let off = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                put_u64(b, at, off + 2)
            }),
            &[T, "alignment"],
        ),
        (
            "offset-overflow",
            Box::new(|b| {
                let at = entry_of(b, T) + 24;
                put_u64(b, at, u64::MAX - 31)
            }),
            &[T, "outside the file"],
        ),
    ];
    for (name, edit, needles) in cases {
        let f = patched(&format!("patched-{name}.gguf"), edit);
        load_fails(&f, needles);
    }
    // The same file unpatched loads: the patches are what break it.
    let args = ["probe", "-m", synthetic(), "-t", "1", "--token-ids", "1"];
    ok(&args, &rill(&args));
}

#[test]
fn bad_metadata_and_tensors_made_with_the_writer() {
    let f = edited("meta-zero-layers.gguf", |m| {
        m.set_metadata("llama.block_count", Value::U32(0));
    });
    load_fails(&f, &["llama.block_count", "outside"]);
    let f = edited("meta-kv-heads.gguf", |m| {
        m.set_metadata("llama.attention.head_count_kv", Value::U32(3));
    });
    load_fails(&f, &["head_count_kv", "does not divide"]);
    let f = edited("meta-wrong-type.gguf", |m| {
        m.set_metadata("llama.embedding_length", Value::String("64".into()));
    });
    load_fails(&f, &["llama.embedding_length"]);
    let f = edited("meta-no-arch.gguf", |m| {
        m.remove_metadata("general.architecture");
    });
    load_fails(&f, &["general.architecture", "missing"]);
    let f = edited("meta-huge-context.gguf", |m| {
        m.set_metadata("llama.embedding_length", Value::U64(u64::MAX));
    });
    load_fails(&f, &["llama.embedding_length"]);
    // A matrix of the wrong shape (with the right number of bytes for that shape).
    let f = edited("tensor-shape.gguf", |m| {
        let t = m.tensor_mut("blk.1.attn_k.weight").unwrap();
        t.dims = vec![64, 64];
        t.data = vec![0; GgmlType::Q8_0.bytes_for(64 * 64).unwrap() as usize];
    });
    load_fails(&f, &["blk.1.attn_k.weight", "shape"]);
    // The tokenizer without its tokens: the model loads, the tokenizer cannot be built.
    let f = edited("no-tokens.gguf", |m| {
        m.remove_metadata("tokenizer.ggml.tokens");
    });
    let args = ["tokenize", "-m", &f, "hi"];
    fails(&args, &rill(&args), &["tokenizer.ggml.tokens"]);
}

#[test]
fn unsupported_architecture() {
    let f = edited("mamba.gguf", |m| {
        m.set_metadata("general.architecture", Value::String("mamba".into()));
    });
    load_fails(
        &f,
        &[
            "unsupported architecture",
            "mamba",
            "supported: llama, gemma2, gemma3, qwen2",
        ],
    );
    let args = ["run", "-m", &f, "-n", "1", "hi"];
    fails(&args, &rill(&args), &["mamba"]);
    // inspect still shows the file, and says why it cannot run it.
    let args = ["inspect", &f];
    let out = ok(&args, &rill(&args));
    assert!(out.contains("mamba"), "{out}");
    assert!(out.contains("cannot run"), "{out}");
}

/// A tiny model whose rows are 256 long, with `blk.0.ffn_up.weight` of type `ty` (zeros), written
/// to a temporary file named `name`.
fn model_with_ffn_up_of(ty: GgmlType, name: &str) -> String {
    let spec = SyntheticSpec {
        d_model: 256,
        ffn_dim: 256,
        ..SyntheticSpec::llama_tiny()
    };
    let mut m = spec.build().unwrap();
    let t = m.tensor_mut("blk.0.ffn_up.weight").unwrap();
    t.ggml_type = ty;
    t.data = vec![0; ty.bytes_for(256 * 256).unwrap() as usize];
    write_tmp(name, &m.to_bytes().unwrap())
}

#[test]
fn unsupported_quant_type_for_a_weight() {
    // A type GGUF knows but no model weight uses (64-bit floats).
    let f = model_with_ffn_up_of(GgmlType::F64, "f64.gguf");
    load_fails(&f, &["blk.0.ffn_up.weight", "F64"]);
}

#[test]
fn a_model_with_a_grid_i_quant_weight_runs() {
    // IQ2_XXS (grid i-quant) rows of zeros: loads and runs.
    let f = model_with_ffn_up_of(GgmlType::IQ2_XXS, "iq2.gguf");
    let out = rill(&["probe", "-m", &f, "-t", "1", "--token-ids", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn missing_tensor() {
    let f = edited("missing-tensor.gguf", |m| {
        m.remove_tensor("blk.1.ffn_down.weight").unwrap();
    });
    load_fails(&f, &["blk.1.ffn_down.weight", "missing"]);
    let f = edited("missing-norm.gguf", |m| {
        m.remove_tensor("output_norm.weight").unwrap();
    });
    load_fails(&f, &["output_norm.weight", "missing"]);
}

#[test]
fn nonexistent_paths_and_unknown_names() {
    let missing = tmp_path("does/not/exist.gguf");
    let missing = missing.to_str().unwrap();
    load_fails(missing, &["not found", "exist.gguf"]);
    let args = ["tokenize", "-m", missing, "hi"];
    fails(&args, &rill(&args), &["not found"]);
    let args = ["inspect", missing];
    fails(&args, &rill(&args), &["not found"]);
    load_fails("no-such-model", &["unknown model", "no-such-model"]);
    let args = ["pull", "no-such-model"];
    fails(&args, &rill(&args), &["no-such-model"]);
    // A directory is not a model.
    load_fails(tmp().to_str().unwrap(), &["directory"]);
}

#[test]
fn hf_spec_fails_naming_the_hub() {
    // A hub that cannot be reached, on this machine: a loopback port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let spec = "hf:rill-test-owner/no-such-repo/missing.gguf";
    let args = ["probe", "-m", spec, "--token-ids", "1"];
    let out = rill_with(&args, None, &[("HF_ENDPOINT", &endpoint)]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Progress lines may come first; the error is the last line.
    let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap();
    assert!(last.starts_with("error: "), "{stderr}");
    assert!(last.to_lowercase().contains("hugging face hub"), "{stderr}");
    assert!(last.contains(spec), "{stderr}");
    // A malformed spec is refused without any network access.
    let args = ["probe", "-m", "hf:only-owner", "--token-ids", "1"];
    fails(&args, &rill(&args), &["hf:"]);
}
