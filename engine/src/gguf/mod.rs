//! GGUF files (llama.cpp's format, versions 2 and 3): a hand-written parser over a
//! memory map, the model's [`ModelConfig`](crate::ModelConfig) from the metadata, tensor names mapped to
//! the engine's Hugging Face names, the tokenizer from `tokenizer.ggml.*`, and the
//! block formats ([`quant`]).
//!
//! Layout of a file (all little-endian):
//!
//! ```text
//! "GGUF" u32 version  u64 tensor_count  u64 kv_count
//! kv_count x (string key, u32 value_type, value)
//! tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml_type, u64 offset)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset (offsets are multiples of the alignment)
//! ```
//!
//! Strings are a u64 length and UTF-8 bytes; arrays are a u32 element type, a u64 count
//! and the elements. `ne[0]` is the fastest dimension: a matrix `[rows, cols]` in the
//! engine's (PyTorch) order is `ne = [cols, rows]` in the file.
//!
//! Every malformed input (truncated, wrong magic, unsupported version, unknown value or
//! tensor type, offsets past the end, shapes not matching the metadata) is an
//! [`EngineError::Gguf`] naming the file and the offset, key or tensor at fault.

pub mod device;
pub mod model;
pub mod quant;
pub mod tokenizer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{EngineError, Result};
pub use quant::GgmlType;

/// The file's first four bytes, `"GGUF"`.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limit on tensor dimensions.
pub const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (one byte, 0 or 1).
    Bool(bool),
    /// Type 8.
    String(String),
    /// Type 9: elements of one type (arrays of arrays are allowed).
    Array(Vec<MetaValue>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl MetaValue {
    /// The GGUF type name of this value, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }

    /// The value as a non-negative integer, if it is an integer type holding one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's entry in the header.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml order (`ne[0]` fastest).
    pub ne: Vec<u64>,
    /// The element or block type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes (from the type's block size).
    pub size: u64,
}

impl TensorInfo {
    /// Dimensions in the engine's (PyTorch) order: slowest first.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// A GGUF file, memory-mapped and its header parsed.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    /// Tensor entries in file order.
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// The data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_start: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A bounds-checked little-endian reader over the header bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, message: String) -> EngineError {
        EngineError::Gguf {
            path: self.path.to_path_buf(),
            message,
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.bytes.len() - self.pos;
        if n > left {
            return Err(self.err(format!(
                "truncated: {what} at byte {} needs {n} bytes, {left} left in the file",
                self.pos
            )));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
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

    /// A count of items each at least `min_size` bytes: bounded by what is left, so a
    /// corrupt count cannot ask for a huge allocation.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_size as u64) > left {
            return Err(self.err(format!(
                "{what} at byte {at} is {n}, more than the {left} bytes left in the file can hold"
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.count(&format!("length of {what}"), 1)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.err(format!("{what} at byte {at} is not UTF-8: {e}")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue> {
        let what = |t: &str| format!("value of `{key}` ({t})");
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(&what("u8"))?[0]),
            1 => MetaValue::I8(self.array::<1>(&what("i8"))?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(&what("u16"))?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(&what("i16"))?)),
            4 => MetaValue::U32(self.u32(&what("u32"))?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(&what("i32"))?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(&what("f32"))?)),
            7 => {
                let at = self.pos;
                match self.array::<1>(&what("bool"))?[0] {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    b => {
                        return Err(self.err(format!(
                            "value of `{key}` at byte {at} is a bool holding {b} (not 0 or 1)"
                        )))
                    }
                }
            }
            8 => MetaValue::String(self.string(&what("string"))?),
            9 => {
                if depth >= 4 {
                    return Err(self.err(format!("value of `{key}` nests arrays more than 4 deep")));
                }
                let at = self.pos;
                let elem = self.u32(&format!("element type of array `{key}`"))?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(self.err(format!(
                        "array `{key}` at byte {at} has unknown element type {other} (known: 0-12)"
                    )))
                    }
                };
                let n = self.count(&format!("length of array `{key}`"), min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64(&what("u64"))?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(&what("i64"))?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(&what("f64"))?)),
            other => {
                return Err(self.err(format!(
                    "metadata `{key}` has unknown value type {other} (known: 0-12)"
                )))
            }
        })
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, then parses its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the map is read-only; like every mmap-based loader we rely on the
        // file not being truncated while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let header = parse_header(&mmap, path)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: header.version,
            metadata: header.metadata,
            meta_index: header.meta_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
            alignment: header.alignment,
            data_start: header.data_start,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An error about this file.
    pub fn error(&self, message: impl Into<String>) -> EngineError {
        EngineError::Gguf {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    /// The metadata value under `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The tensor called `name` (GGUF name), if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of tensor `info` (bounds were checked when the header was parsed).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_start + info.offset) as usize;
        &self.mmap[start..start + info.size as usize]
    }

    /// The metadata value under `key` as an unsigned integer; absent is `None`, any
    /// other type an error naming the key.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                self.error(format!(
                    "metadata `{key}` is {} {v:?}, expected a non-negative integer",
                    v.type_name()
                ))
            }),
        }
    }

    /// The metadata value under `key` as a float (integers accepted).
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                self.error(format!(
                    "metadata `{key}` is {} {v:?}, expected a number",
                    v.type_name()
                ))
            }),
        }
    }

    /// The metadata value under `key` as a string.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                self.error(format!(
                    "metadata `{key}` is {}, expected a string",
                    v.type_name()
                ))
            }),
        }
    }

    /// The metadata value under `key` as a bool.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                self.error(format!(
                    "metadata `{key}` is {}, expected a bool",
                    v.type_name()
                ))
            }),
        }
    }

    /// A required unsigned integer.
    pub fn req_u64(&self, key: &str) -> Result<u64> {
        self.opt_u64(key)?
            .ok_or_else(|| self.error(format!("metadata `{key}` is missing")))
    }
}

/// What [`parse_header`] finds.
struct Header {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

/// Parses the header of a GGUF file held in `bytes` and checks every tensor's data
/// range against the file's length; `path` is only used in errors.
fn parse_header(bytes: &[u8], path: &Path) -> Result<Header> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        path,
    };
    let magic = c.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(c.err(format!(
            "not a GGUF file: starts with {magic:02x?}, expected \"GGUF\" (47 47 55 46)"
        )));
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(c.err(format!(
            "unsupported GGUF version {version} (supported: 2, 3)"
        )));
    }
    // A tensor entry is at least a name length, n_dims, type and offset (24 bytes); a
    // key-value pair at least a key length and a value type (12).
    let n_tensors = c.count("tensor count", 24)?;
    let n_kv = c.count("metadata count", 12)?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut meta_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.string(&format!("key of metadata entry {i}"))?;
        let ty = c.u32(&format!("value type of `{key}`"))?;
        let value = c.value(ty, &key, 0)?;
        if meta_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(c.err(format!("metadata key `{key}` appears twice")));
        }
        metadata.push((key, value));
    }
    let alignment = match meta_index.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => match &metadata[i].1 {
            MetaValue::U32(a) if a.is_power_of_two() => u64::from(*a),
            other => {
                return Err(c.err(format!(
                    "general.alignment is {} {other:?}, expected a u32 power of two",
                    other.type_name()
                )))
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&format!("name of tensor {i}"))?;
        let at = c.pos;
        let n_dims = c.u32(&format!("dimension count of tensor `{name}`"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.err(format!(
                "tensor `{name}` has {n_dims} dimensions at byte {at} (1 to {MAX_DIMS} supported)"
            )));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            ne.push(c.u64(&format!("dimension {d} of tensor `{name}`"))?);
        }
        let raw_type = c.u32(&format!("type of tensor `{name}`"))?;
        let offset = c.u64(&format!("data offset of tensor `{name}`"))?;
        let ggml_type = GgmlType(raw_type);
        let size =
            tensor_size(ggml_type, &ne).map_err(|m| c.err(format!("tensor `{name}`: {m}")))?;
        if offset % alignment != 0 {
            return Err(c.err(format!(
                "tensor `{name}` has data offset {offset}, not a multiple of the alignment {alignment}"
            )));
        }
        if tensor_index.insert(name.clone(), tensors.len()).is_some() {
            return Err(c.err(format!("tensor `{name}` appears twice")));
        }
        tensors.push(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
            size,
        });
    }
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    for t in &tensors {
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(c.err(format!(
                    "tensor `{}` ({} bytes at data offset {}) runs past the end of the file \
                     ({file_len} bytes, data from byte {data_start}): truncated?",
                    t.name, t.size, t.offset
                )))
            }
        }
    }
    Ok(Header {
        version,
        metadata,
        meta_index,
        tensors,
        tensor_index,
        alignment,
        data_start,
    })
}

/// Bytes of a tensor of type `ty` and dims `ne`, or why it cannot be sized. Unknown
/// types are accepted here when ggml knows their block size, so that a file with one
/// unsupported tensor still opens and the error names the tensor when it is used.
fn tensor_size(ty: GgmlType, ne: &[u64]) -> std::result::Result<u64, String> {
    let Some((block, block_bytes)) = ty.block() else {
        return Err(format!("unknown ggml type {}", ty.0));
    };
    let numel = ne
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("dimensions {ne:?} overflow"))?;
    if ne[0] % block != 0 {
        return Err(format!(
            "type {} needs rows (ne[0] = {}) to be a multiple of its block of {block}",
            ty.name(),
            ne[0]
        ));
    }
    (numel / block)
        .checked_mul(block_bytes)
        .ok_or_else(|| format!("dimensions {ne:?} overflow"))
}

/// A GGUF header parsed from bytes in memory ([`parse_bytes`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, MetaValue)>,
    /// Tensor entries in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute byte offset of the data section.
    pub data_start: u64,
}

/// Parses a GGUF header from bytes in memory and checks every tensor's data range
/// against their length (no tensor data is read); for tests and tools. `path` names
/// the source in errors.
pub fn parse_bytes(bytes: &[u8], path: &Path) -> Result<ParsedHeader> {
    let h = parse_header(bytes, path)?;
    Ok(ParsedHeader {
        version: h.version,
        metadata: h.metadata,
        tensors: h.tensors,
        data_start: h.data_start,
    })
}
