//! Round trips through the writer, and every kind of malformed file the reader must reject.

use proptest::prelude::*;
use rill_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()))
        .unwrap()
        .add_metadata("u8", Value::U8(7))
        .unwrap()
        .add_metadata("i8", Value::I8(-7))
        .unwrap()
        .add_metadata("u16", Value::U16(65535))
        .unwrap()
        .add_metadata("i16", Value::I16(-300))
        .unwrap()
        .add_metadata("u32", Value::U32(4_000_000_000))
        .unwrap()
        .add_metadata("i32", Value::I32(-5))
        .unwrap()
        .add_metadata("u64", Value::U64(1 << 40))
        .unwrap()
        .add_metadata("i64", Value::I64(-(1 << 40)))
        .unwrap()
        .add_metadata("f32", Value::F32(1.5))
        .unwrap()
        .add_metadata("f64", Value::F64(-2.25))
        .unwrap()
        .add_metadata("bool", Value::Bool(true))
        .unwrap()
        .add_metadata(
            "nested",
            Value::Array(vec![
                Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
                Value::Array(vec![]),
            ]),
        )
        .unwrap();
    let f32_data: Vec<u8> = (0..8u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("t.f32", &[4, 2], GgmlType::F32, f32_data)
        .unwrap()
        .add_tensor("t.q8", &[32], GgmlType::Q8_0, vec![1u8; 34])
        .unwrap();
    w
}

#[test]
fn round_trip_every_value_type() {
    let bytes = sample_writer().to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version(), 3);
    let m = f.metadata();
    assert_eq!(m.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(m.get("u8"), Some(&Value::U8(7)));
    assert_eq!(m.get("i8"), Some(&Value::I8(-7)));
    assert_eq!(m.get_u64("u32").unwrap(), Some(4_000_000_000));
    assert_eq!(m.get("i64").and_then(Value::as_i64), Some(-(1 << 40)));
    assert_eq!(m.get_f64("f32").unwrap(), Some(1.5));
    assert_eq!(m.get_bool("bool").unwrap(), Some(true));
    let nested = m.get_array("nested").unwrap().unwrap();
    assert_eq!(nested[0].as_array().unwrap()[1].as_str(), Some("bc"));
    assert!(nested[1].as_array().unwrap().is_empty());
    assert!(matches!(m.get_str("u8"), Err(GgufError::WrongType { .. })));
    let t = f.tensor("t.f32").unwrap();
    assert_eq!(t.dims, vec![4, 2]);
    assert_eq!((t.row_len(), t.n_rows()), (4, 2));
    let data = f.tensor_data(t);
    assert_eq!(&data[4..8], &1f32.to_le_bytes());
    let q = f.tensor("t.q8").unwrap();
    assert_eq!(q.offset % 32, 0);
    assert_eq!(f.tensor_data(q), &[1u8; 34][..]);
}

#[test]
fn version_2_reads_and_others_are_rejected() {
    let mut w = sample_writer();
    w.set_version(2);
    assert_eq!(
        GgufFile::from_bytes(w.to_bytes().unwrap())
            .unwrap()
            .version(),
        2
    );
    w.set_version(1);
    assert!(matches!(
        GgufFile::from_bytes(w.to_bytes().unwrap()),
        Err(GgufError::UnsupportedVersion(1))
    ));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::U32(64)).unwrap();
    w.add_tensor("a", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    w.add_tensor("b", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_start() % 64, 0);
    assert_eq!(f.tensor("b").unwrap().offset, 64);
}

#[test]
fn not_gguf_and_empty_files() {
    assert!(matches!(
        GgufFile::from_bytes(b"PK\x03\x04 not a model".to_vec()),
        Err(GgufError::BadMagic { .. })
    ));
    assert!(matches!(
        GgufFile::from_bytes(Vec::new()),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn truncated_anywhere_is_an_error() {
    let bytes = sample_writer().to_bytes().unwrap();
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(r.is_err(), "truncation at {len} was accepted");
    }
}

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn corrupted_counts_and_lengths() {
    let good = sample_writer().to_bytes().unwrap();
    // Header: magic(4) version(4) n_tensors(8 @8) n_kv(8 @16), first key length @24.
    let mut b = good.clone();
    set_u64(&mut b, 8, u64::MAX);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::ImpossibleCount { .. })
    ));
    let mut b = good.clone();
    set_u64(&mut b, 16, 1 << 60);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::ImpossibleCount { .. })
    ));
    let mut b = good.clone();
    set_u64(&mut b, 24, u64::MAX - 3);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::Truncated { .. })
    ));
    // The first value's type id sits right after the key "general.architecture" (20 bytes).
    let mut b = good.clone();
    b[32 + 20..32 + 24].copy_from_slice(&99u32.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::UnknownValueType { type_id: 99, .. })
    ));
}

/// Finds the directory entry of tensor `name` and returns the offset just after its name.
fn tensor_entry(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
        + needle.len()
}

#[test]
fn corrupted_tensor_directory() {
    let good = sample_writer().to_bytes().unwrap();
    let at = tensor_entry(&good, "t.q8"); // n_dims u32, dim u64, type u32, offset u64

    let mut b = good.clone();
    b[at..at + 4].copy_from_slice(&9u32.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::TooManyDims { n_dims: 9, .. })
    ));

    let mut b = good.clone();
    set_u64(&mut b, at + 4, 1 << 62);
    assert!(GgufFile::from_bytes(b).is_err());

    let mut b = good.clone();
    set_u64(&mut b, at + 4, 33); // not a multiple of the Q8_0 block
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::BadShape { .. })
    ));

    let mut b = good.clone();
    set_u64(&mut b, at + 4, 0);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::BadShape { .. })
    ));

    let mut b = good.clone();
    b[at + 12..at + 16].copy_from_slice(&77u32.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::UnknownTensorType { type_id: 77, .. })
    ));

    let mut b = good.clone();
    set_u64(&mut b, at + 16, 1 << 20);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::TensorOutOfBounds { .. })
    ));

    let mut b = good.clone();
    set_u64(&mut b, at + 16, u64::MAX - 31);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::TensorOutOfBounds { .. })
    ));

    let mut b = good;
    set_u64(&mut b, at + 16, 3);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::MisalignedTensor { .. })
    ));
}

#[test]
fn deeply_nested_arrays_are_rejected() {
    let mut v = Value::U8(1);
    for _ in 0..20 {
        v = Value::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", v).unwrap();
    assert!(matches!(
        GgufFile::from_bytes(w.to_bytes().unwrap()),
        Err(GgufError::NestingTooDeep { .. })
    ));
}

#[test]
fn writer_rejects_wrong_sizes_and_duplicates() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 33])
        .is_err());
    w.add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 34])
        .unwrap();
    assert!(w
        .add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 34])
        .is_err());
    w.add_metadata("k", Value::U8(1)).unwrap();
    assert!(w.add_metadata("k", Value::U8(1)).is_err());
    assert!(w
        .add_metadata("mixed", Value::Array(vec![Value::U8(1), Value::I8(1)]))
        .is_err());
}

#[test]
fn missing_file_is_an_io_error() {
    let e = GgufFile::open("/nonexistent/model.gguf").unwrap_err();
    assert!(e.to_string().contains("/nonexistent/model.gguf"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// Any corruption of any bytes yields Ok or a typed error, never a panic; every accepted
    /// tensor's data lies inside the file.
    #[test]
    fn random_corruption_never_panics(flips in prop::collection::vec((0usize..4096, any::<u8>()), 1..8)) {
        let mut bytes = sample_writer().to_bytes().unwrap();
        for (at, v) in flips {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            for t in f.tensors() {
                prop_assert_eq!(f.tensor_data(t).len() as u64, t.size);
            }
        }
    }
}

#[test]
fn metadata_value_count_is_bounded() {
    // A u8 array of MAX_METADATA_VALUES + 1 elements: one byte each in the file, far more in
    // memory, so it is refused.
    let n = rill_gguf::MAX_METADATA_VALUES as usize + 1;
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&3u64.to_le_bytes());
    bytes.extend_from_slice(b"big");
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&(n as u64).to_le_bytes());
    bytes.resize(bytes.len() + n, 0);
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::TooMuchMetadata { .. })
    ));
}

#[test]
fn writer_rejects_bad_alignment_and_partial_blocks() {
    let mut w = GgufWriter::new();
    assert!(w.add_metadata("general.alignment", Value::U32(48)).is_err());
    assert!(w
        .add_metadata("general.alignment", Value::F32(32.0))
        .is_err());
    assert!(w
        .add_tensor("x", &[16, 2], GgmlType::Q8_0, vec![0; 34])
        .is_err());
}
