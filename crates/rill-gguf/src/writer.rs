//! Writing GGUF files: used by tests and tools to build synthetic models, corrupted files, and
//! derived models (e.g. a truncated copy of a real model as a speculative draft).

use std::io::Write;
use std::path::Path;

use crate::{
    GgmlType, GgufError, Metadata, Result, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC,
};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory.
pub struct GgufWriter {
    version: u32,
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// A version-3 file with no metadata and no tensors.
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            metadata: Metadata::new(),
            tensors: Vec::new(),
        }
    }

    /// Writes this version number (2 and 3 share a layout; other values make invalid files on
    /// purpose, for tests).
    pub fn set_version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<&mut Self> {
        let key = key.into();
        check_homogeneous(&value)?;
        if key == "general.alignment" {
            match value.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => {}
                _ => {
                    return Err(GgufError::Write(format!(
                        "general.alignment must be a power-of-two integer, got {value:?}"
                    )))
                }
            }
        }
        self.metadata.insert(key, value)?;
        Ok(self)
    }

    /// Adds a tensor; `data` must be exactly the bytes its type and shape need.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let n: Option<u64> = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let expected = n.and_then(|n| ggml_type.bytes_for(n));
        if expected != Some(data.len() as u64) {
            return Err(GgufError::Write(format!(
                "tensor {name:?} of type {ggml_type} and shape {dims:?} needs {expected:?} bytes, got {}",
                data.len()
            )));
        }
        if dims
            .first()
            .is_some_and(|&row| row % ggml_type.block_size() != 0)
        {
            return Err(GgufError::Write(format!(
                "tensor {name:?}: row length {} is not a multiple of the {ggml_type} block size {}",
                dims[0],
                ggml_type.block_size()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        Ok(self)
    }

    fn alignment(&self) -> u64 {
        // Validated by `add_metadata`.
        self.metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The complete file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let alignment = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            write_string(&mut out, key);
            out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).div_ceil(alignment) * alignment;
        }
        let data_start = out.len().div_ceil(alignment) * alignment;
        out.resize(data_start, 0);
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(&t.data);
        }
        Ok(out)
    }

    /// Writes the file to `path`.
    pub fn write_to_path(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut f = std::fs::File::create(path).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        Ok(())
    }
}

fn check_homogeneous(value: &Value) -> Result<()> {
    if let Value::Array(items) = value {
        if let Some(first) = items.first() {
            let ty = first.value_type();
            if items.iter().any(|v| v.value_type() != ty) {
                return Err(GgufError::Write(
                    "array elements must all have the same type".into(),
                ));
            }
        }
        for item in items {
            check_homogeneous(item)?;
        }
    }
    Ok(())
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.push(*v as u8),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            let elem_type = items
                .first()
                .map(Value::value_type)
                .unwrap_or(ValueType::U8);
            out.extend_from_slice(&(elem_type as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
    }
}
