//! Reading: a bounds-checked cursor over the file's bytes, then the tensor directory validated
//! against the data section.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::{GgmlType, GgufError, Metadata, Result, Value, ValueType, GGUF_MAGIC};

/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Deeper nesting than this is no real model's metadata, only a way to exhaust the stack.
const MAX_ARRAY_NESTING: usize = 8;
/// Metadata values (array elements included) a file may hold. Each costs a few dozen bytes in
/// memory even when it takes one byte in the file, so this bounds what a crafted file can make
/// us allocate (~0.5 GB); real models hold about a million (a 256k vocabulary's three arrays
/// plus merges).
pub const MAX_METADATA_VALUES: u64 = 16 << 20;

/// One tensor directory entry, validated: its bytes lie inside the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (contiguous) dimension, e.g. a row's length.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Size of the tensor's data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        // Checked at load time not to overflow.
        self.dims.iter().product()
    }

    /// Length of one row (the innermost dimension).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of all outer dimensions).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

enum Backing {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An open GGUF file: metadata and tensor directory parsed, tensor data mapped.
pub struct GgufFile {
    backing: Backing,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_start", &self.data_start)
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates a file, mapping its data into memory (never copied).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let backing = if len == 0 {
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only; like every mmap-based model loader we rely on the
            // file not being truncated by another process while it is open.
            Backing::Mapped(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        GgufFile::parse(backing)
    }

    /// Parses a file held in memory (tests, files written by [`crate::GgufWriter`]).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        GgufFile::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<GgufFile> {
        let bytes = backing.bytes();
        let mut cur = Cursor {
            bytes,
            pos: 0,
            values: 0,
        };
        let magic = cur.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = cur.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = cur.u64("tensor count")?;
        let n_kv = cur.u64("metadata count")?;
        // A key/value pair needs at least 8 (key length) + 4 (type) + 1 bytes.
        cur.check_count("metadata entry", n_kv, 13)?;

        let mut metadata = Metadata::new();
        for _ in 0..n_kv {
            let key = cur.string("metadata key")?;
            let type_id = cur.u32("metadata value type")?;
            let value = cur.value(&key, type_id, 0)?;
            metadata.insert(key, value)?;
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_u64().ok_or_else(|| GgufError::WrongType {
                    key: "general.alignment".into(),
                    expected: "unsigned integer",
                    found: v.type_name(),
                })?;
                if a == 0 || !a.is_power_of_two() {
                    return Err(GgufError::BadAlignment(a));
                }
                a
            }
        };

        // name (8) + n_dims (4) + type (4) + offset (8), before any dimension.
        cur.check_count("tensor", n_tensors, 24)?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::new();
        for _ in 0..n_tensors {
            let name = cur.string("tensor name")?;
            let n_dims = cur.u32("tensor dimension count")?;
            if n_dims as usize > MAX_DIMS {
                return Err(GgufError::TooManyDims {
                    name,
                    n_dims,
                    max: MAX_DIMS,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(cur.u64("tensor dimension")?);
            }
            let type_id = cur.u32("tensor type")?;
            let offset = cur.u64("tensor offset")?;
            let ggml_type =
                GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
                    name: name.clone(),
                    type_id,
                })?;
            let size = tensor_size(&name, &dims, ggml_type)?;
            if offset % alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    name,
                    offset,
                    alignment,
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(name));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                size,
            });
        }

        let file_len = bytes.len() as u64;
        let data_start = align_up(cur.pos as u64, alignment).ok_or(GgufError::Truncated {
            what: "data section".into(),
            offset: cur.pos as u64,
            needed: alignment,
            file_len,
        })?;
        let data_len = file_len.saturating_sub(data_start);
        if !tensors.is_empty() && data_start > file_len {
            return Err(GgufError::Truncated {
                what: "data section".into(),
                offset: data_start,
                needed: 0,
                file_len,
            });
        }
        for t in &tensors {
            let end = t.offset.checked_add(t.size);
            match end {
                Some(end) if end <= data_len => {}
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        start: t.offset,
                        end: end.unwrap_or(u64::MAX),
                        data_len,
                    })
                }
            }
        }

        Ok(GgufFile {
            backing,
            version,
            metadata,
            tensors,
            tensor_index,
            alignment,
            data_start,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Total size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The whole file as loaded (header, metadata, tensor infos and data): what a hash of the
    /// model file is computed over.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// The whole data section (every tensor's bytes), a view into the mapped file.
    pub fn data_section(&self) -> &[u8] {
        self.backing
            .bytes()
            .get(self.data_start as usize..)
            .unwrap_or(&[])
    }

    /// Lets the OS drop the mapped pages under `data_section()[start..start + len]` from this
    /// process's resident memory, for data the caller has copied elsewhere (the pages are read
    /// back from the file if touched again, so every view stays valid). A hint: a no-op for an
    /// in-memory file, or where the OS declines.
    pub fn release_resident(&self, start: usize, len: usize) {
        #[cfg(unix)]
        if let Backing::Mapped(map) = &self.backing {
            let begin = self.data_start as usize + start;
            let end = (begin + len).min(map.len());
            // madvise wants a page-aligned start: take the pages wholly inside the range. (4 KiB
            // pages assumed: with larger ones the OS declines a misaligned range and the pages
            // simply stay resident.)
            let page = 4096;
            let (first, last) = (begin.next_multiple_of(page), end / page * page);
            if first < last {
                // SAFETY: the map is a read-only shared mapping of the file: dropped pages are
                // re-read from the file on the next access, so no borrowed byte changes.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        first,
                        last - first,
                    )
                };
            }
        }
        let _ = (start, len);
    }

    /// The tensor's bytes, a view into the mapped file. Bounds were checked at load time.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_start + info.offset) as usize;
        let end = start + info.size as usize;
        self.backing.bytes().get(start..end).unwrap_or(&[])
    }
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

fn tensor_size(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64> {
    let bad = |reason: &str| GgufError::BadShape {
        name: name.to_string(),
        dims: dims.to_vec(),
        reason: reason.to_string(),
    };
    if dims.contains(&0) {
        return Err(bad("a dimension is zero"));
    }
    let mut n: u64 = 1;
    for &d in dims {
        n = n
            .checked_mul(d)
            .ok_or_else(|| bad("element count overflows"))?;
    }
    let row = dims.first().copied().unwrap_or(1);
    if row % ty.block_size() != 0 {
        return Err(bad(&format!(
            "row length is not a multiple of the {} block size {}",
            ty,
            ty.block_size()
        )));
    }
    ty.bytes_for(n).ok_or_else(|| bad("byte size overflows"))
}

/// A cursor that never reads past the end: every read names what it was reading for the error.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Metadata values read so far, against [`MAX_METADATA_VALUES`].
    values: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.bytes.len() as u64,
            });
        }
        let n = n as usize;
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Rejects a count whose elements could not fit in the rest of the file, so that no
    /// allocation is ever sized by an unchecked number.
    fn check_count(&self, what: &str, count: u64, min_size: u64) -> Result<()> {
        match count.checked_mul(min_size) {
            Some(total) if total <= self.remaining() => Ok(()),
            _ => Err(GgufError::ImpossibleCount {
                what: what.to_string(),
                count,
                remaining: self.remaining(),
            }),
        }
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
            what: what.to_string(),
        })
    }

    fn value(&mut self, key: &str, type_id: u32, depth: usize) -> Result<Value> {
        self.values += 1;
        if self.values > MAX_METADATA_VALUES {
            return Err(GgufError::TooMuchMetadata {
                max: MAX_METADATA_VALUES,
            });
        }
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            type_id,
        })?;
        let what = key;
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(GgufError::NestingTooDeep {
                        key: key.to_string(),
                        max: MAX_ARRAY_NESTING,
                    });
                }
                let elem_type_id = self.u32(what)?;
                let elem_type = ValueType::from_id(elem_type_id).ok_or_else(|| {
                    GgufError::UnknownValueType {
                        key: key.to_string(),
                        type_id: elem_type_id,
                    }
                })?;
                let count = self.u64(what)?;
                self.check_count(
                    &format!("array {key:?} element"),
                    count,
                    elem_type.min_encoded_size(),
                )?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(key, elem_type_id, depth + 1)?);
                }
                Value::Array(items)
            }
        })
    }
}
