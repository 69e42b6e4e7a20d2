//! Safetensors checkpoints: a single `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, memory-mapped (files are never read whole
//! into host memory) and looked up by Hugging Face tensor name.
//!
//! bf16 is the engine's weight type: bf16 tensors are borrowed straight from
//! the map when aligned; f16 and f32 tensors are converted at load.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, SafeTensors};

use crate::error::{EngineError, Result};

/// One memory-mapped safetensors file and its parsed header.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8-byte length + JSON header).
    data_start: usize,
    metadata: Metadata,
}

/// The tensors of a checkpoint, possibly spread over several shard files.
pub struct Weights {
    location: PathBuf,
    shards: Vec<Shard>,
    /// Tensor name → index into `shards`.
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("location", &self.location)
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.index.len())
            .finish()
    }
}

impl Weights {
    /// Opens the checkpoint in `dir`: `model.safetensors.index.json` if it
    /// exists (sharded), else `model.safetensors`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let index_path = dir.join("model.safetensors.index.json");
        if index_path.exists() {
            return Self::from_index(&index_path);
        }
        let single = dir.join("model.safetensors");
        if !single.exists() {
            return Err(EngineError::Io {
                path: single,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no model.safetensors or model.safetensors.index.json in this directory",
                ),
            });
        }
        Self::from_files(dir, &[single])
    }

    /// Opens a sharded checkpoint from its `model.safetensors.index.json`.
    pub fn from_index(index_path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(index_path).map_err(|source| EngineError::Io {
            path: index_path.to_path_buf(),
            source,
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| EngineError::Json {
                path: index_path.to_path_buf(),
                source,
            })?;
        let Some(map) = value.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(EngineError::Config {
                path: index_path.to_path_buf(),
                message: "missing object field `weight_map`".into(),
            });
        };
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut files: Vec<PathBuf> = Vec::new();
        for (name, file) in map {
            let Some(file) = file.as_str() else {
                return Err(EngineError::Config {
                    path: index_path.to_path_buf(),
                    message: format!(
                        "weight_map entry for `{name}` is {file}, expected a file name"
                    ),
                });
            };
            let p = dir.join(file);
            if !files.contains(&p) {
                files.push(p);
            }
        }
        files.sort();
        let weights = Self::from_files(dir, &files)?;
        // The index is a promise about the shards: hold it to that.
        for name in map.keys() {
            if !weights.index.contains_key(name) {
                return Err(EngineError::MissingTensor {
                    name: name.clone(),
                    location: PathBuf::from(map[name].as_str().unwrap_or_default()),
                });
            }
        }
        Ok(weights)
    }

    /// Opens and indexes the given safetensors files; `location` names the
    /// checkpoint in errors about missing tensors.
    pub fn from_files(location: &Path, files: &[PathBuf]) -> Result<Self> {
        let mut shards = Vec::with_capacity(files.len());
        let mut index = HashMap::new();
        for path in files {
            let file = File::open(path).map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            // SAFETY: the map is read-only; like every mmap-based loader we
            // rely on the checkpoint not being truncated while it is open.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            let (header_len, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| EngineError::Safetensors {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            for name in metadata.tensors().keys() {
                index.insert(name.clone(), shards.len());
            }
            shards.push(Shard {
                path: path.clone(),
                mmap,
                data_start: 8 + header_len,
                metadata,
            });
        }
        Ok(Weights {
            location: location.to_path_buf(),
            shards,
            index,
        })
    }

    /// Total bytes of the checkpoint's files.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.mmap.len() as u64).sum()
    }

    /// Reads every page of every shard into memory (the page cache), calling
    /// `progress(done, total)` in bytes as it goes (every [`PREFETCH_STEP`] bytes
    /// and at the end), so the slow part of loading a large checkpoint (the disk)
    /// happens here, where it can be reported, rather than inside the upload.
    pub fn prefetch(&self, mut progress: impl FnMut(u64, u64)) {
        const PAGE: usize = 4096;
        let total = self.total_bytes();
        let mut done = 0u64;
        progress(0, total);
        for shard in &self.shards {
            let map: &[u8] = &shard.mmap;
            #[cfg(unix)]
            {
                // A hint for read-ahead; failing it only loses the hint.
                let _ = shard.mmap.advise(memmap2::Advice::WillNeed);
            }
            for chunk in map.chunks(PREFETCH_STEP as usize) {
                let mut touched = 0u8;
                for page in chunk.chunks(PAGE) {
                    // SAFETY: `page` is a non-empty, in-bounds slice of the map; a
                    // volatile read keeps the compiler from dropping the access.
                    touched ^= unsafe { std::ptr::read_volatile(page.as_ptr()) };
                }
                std::hint::black_box(touched);
                done += chunk.len() as u64;
                progress(done, total);
            }
        }
    }

    /// Whether the checkpoint holds a tensor called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.index.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// The shard file holding `name`, for messages.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.index.get(name).map(|&i| self.shards[i].path.as_path())
    }

    /// The shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        let (_, info) = self.lookup(name)?;
        Ok(&info.shape)
    }

    fn lookup(&self, name: &str) -> Result<(&Shard, &safetensors::tensor::TensorInfo)> {
        let missing = || EngineError::MissingTensor {
            name: name.to_string(),
            location: self.location.clone(),
        };
        let &i = self.index.get(name).ok_or_else(missing)?;
        let shard = &self.shards[i];
        let info = shard.metadata.info(name).ok_or_else(missing)?;
        Ok((shard, info))
    }

    /// Tensor `name` as bf16, checked against `expected_shape`.
    ///
    /// bf16 data is borrowed from the memory map when suitably aligned (no
    /// copy); f16 and f32 are converted, with round-to-nearest-even.
    pub fn tensor_bf16(&self, name: &str, expected_shape: &[usize]) -> Result<Cow<'_, [bf16]>> {
        let (shard, info) = self.lookup(name)?;
        if info.shape != expected_shape {
            return Err(EngineError::ShapeMismatch {
                path: shard.path.clone(),
                name: name.to_string(),
                expected: expected_shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        let (start, end) = info.data_offsets;
        // read_metadata validated offsets against the file length.
        let bytes = &shard.mmap[shard.data_start + start..shard.data_start + end];
        match info.dtype {
            Dtype::BF16 => Ok(bf16_from_le_bytes(bytes)),
            Dtype::F16 => Ok(Cow::Owned(
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32()))
                    .collect(),
            )),
            Dtype::F32 => Ok(Cow::Owned(
                bytes
                    .chunks_exact(4)
                    .map(|b| bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect(),
            )),
            other => Err(EngineError::UnsupportedDtype {
                path: shard.path.clone(),
                name: name.to_string(),
                dtype: format!("{other:?}"),
            }),
        }
    }
}

/// Bytes [`Weights::prefetch`] reads between two progress reports.
pub const PREFETCH_STEP: u64 = 256 << 20;

/// A progress printer for [`Weights::prefetch`]: one stderr line, rewritten in place
/// (`loading weights: 12.3 / 64.0 GiB (19%)`), ended with a newline when done.
pub fn stderr_progress(label: &str) -> impl FnMut(u64, u64) + '_ {
    move |done, total| {
        use std::io::Write;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let pct = if total == 0 {
            100.0
        } else {
            100.0 * done as f64 / total as f64
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{label}: {:.1} / {:.1} GiB ({pct:.0}%)",
            gib(done),
            gib(total)
        );
        if done >= total {
            let _ = writeln!(err);
        }
        let _ = err.flush();
    }
}

/// Reinterprets little-endian bf16 bytes, borrowing when the layout allows.
fn bf16_from_le_bytes(bytes: &[u8]) -> Cow<'_, [bf16]> {
    let aligned = bytes.as_ptr().align_offset(std::mem::align_of::<bf16>()) == 0;
    if cfg!(target_endian = "little") && aligned {
        // SAFETY: bf16 is a transparent u16 with no invalid bit patterns; the
        // pointer is 2-aligned, the length is whole elements (safetensors
        // checked that the byte range matches shape × dtype size), and the
        // bytes are little-endian like the target.
        let s =
            unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<bf16>(), bytes.len() / 2) };
        Cow::Borrowed(s)
    } else {
        Cow::Owned(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
        )
    }
}
