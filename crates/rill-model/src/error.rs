use crate::kv_cache::KvError;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] rill_gguf::GgufError),
    #[error("unsupported architecture {0:?} (supported: {supported})", supported = crate::Architecture::supported_names())]
    UnsupportedArchitecture(String),
    #[error("metadata key {0:?} is missing")]
    MissingMetadata(String),
    #[error("metadata key {key:?} is invalid: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tensor {name:?} has type {ty}, which rill cannot compute with")]
    UnsupportedTensorType { name: String, ty: String },
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("batch row {row}: {reason}")]
    BadBatch { row: usize, reason: String },
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("the KV cache has {cache} but the model needs {model}")]
    KvShape {
        cache: Box<crate::KvLayout>,
        model: Box<crate::KvLayout>,
    },
    #[error("the KV cache's recurrent state does not fit the model ({0}): make the cache with Model::new_kv_cache or KvCache::for_model")]
    StateShape(String),
    #[error("{0} threads requested; at most {max} are allowed", max = crate::model::MAX_THREADS)]
    TooManyThreads(usize),
    #[error("could not get {bytes} bytes of memory for a repacked weight")]
    OutOfMemory { bytes: usize },
    #[error(transparent)]
    Kernel(#[from] rill_kernels::KernelError),
}
