//! GGUF: the single-file model format of the ggml ecosystem.
//!
//! [`GgufFile`] reads versions 2 and 3: the header, every metadata value type (nested arrays
//! included), `general.alignment`, and the tensor directory, with the tensor data mmapped. Every
//! count, length, dimension, offset and size read from the file is checked (with overflow-checked
//! arithmetic, against the bytes actually present) before it is used, so a malformed file yields a
//! [`GgufError`], never a panic or an out-of-bounds read.
//!
//! [`GgufWriter`] writes the same format; tests use it to build tiny synthetic models and
//! deliberately corrupted files.

mod ggml_type;
mod reader;
mod value;
mod writer;

pub use ggml_type::GgmlType;
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS, MAX_METADATA_VALUES};
pub use value::{Metadata, Value, ValueType};
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// A file's first bytes as text where they are printable ASCII (`"hell"`), else as hex bytes
/// (`0x7f 0x45 0x4c 0x46`).
fn magic_text(bytes: &[u8]) -> String {
    if !bytes.is_empty() && bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(bytes))
    } else {
        let hex: Vec<String> = bytes.iter().map(|b| format!("0x{b:02x}")).collect();
        hex.join(" ")
    }
}

/// Everything that can be wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "not a GGUF file (starts with {}, expected \"GGUF\")",
        magic_text(found)
    )]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {0} (rill reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file is truncated: {what} needs {needed} bytes at offset {offset}, but the file has {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{what} count {count} is impossible: only {remaining} bytes remain in the file")]
    ImpossibleCount {
        what: String,
        count: u64,
        remaining: u64,
    },
    #[error("metadata key {key:?}: unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key {key:?}: arrays nested deeper than {max} levels")]
    NestingTooDeep { key: String, max: usize },
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: String },
    #[error("the metadata holds more than {max} values")]
    TooMuchMetadata { max: u64 },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("general.alignment = {0} is invalid (must be a non-zero power of two)")]
    BadAlignment(u64),
    #[error("tensor {name:?}: {n_dims} dimensions (at most {max} supported)")]
    TooManyDims {
        name: String,
        n_dims: u32,
        max: usize,
    },
    #[error("tensor {name:?}: invalid shape {dims:?} ({reason})")]
    BadShape {
        name: String,
        dims: Vec<u64>,
        reason: String,
    },
    #[error("tensor {name:?}: unknown ggml type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error(
        "tensor {name:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {name:?}: data [{start}, {end}) lies outside the file's data section of {data_len} bytes")]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        data_len: u64,
    },
    #[error("writer: {0}")]
    Write(String),
}

/// Result alias for this crate.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
