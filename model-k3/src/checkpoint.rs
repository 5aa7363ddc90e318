//! HF-layout checkpoint reading: `config.json`, `model.safetensors.index.json` (or a single
//! `model.safetensors`), shards memory-mapped with `memmap2` and parsed by the `safetensors`
//! crate. Opening reads headers only: payload pages are touched only when a tensor is used, so
//! the real 96-shard checkpoint can be inspected without reading its 1.5 TB.

use crate::config::K3Config;
use crate::error::{ModelError, Result};
use crate::files::{open_regular, read_text_capped};
use crate::inventory::PREFIX;
use crate::limits::{CONFIG_FILE_MAX, INDEX_FILE_MAX};
use crate::st_header;
use kernel_api::DType;
use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::Dtype as StDtype;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// Maps a safetensors dtype to ours; dtypes the contract does not know are an error naming the tensor.
pub fn dtype_from_st(name: &str, d: StDtype) -> Result<DType> {
    Ok(match d {
        StDtype::BF16 => DType::BF16,
        StDtype::F16 => DType::F16,
        StDtype::F32 => DType::F32,
        StDtype::U8 => DType::U8,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::F8_E4M3 => DType::F8E4M3Fn,
        StDtype::F8_E5M2 => DType::F8E5M2,
        other => return Err(ModelError::tensor(name, format!("dtype {other:?} is not supported"))),
    })
}

pub fn dtype_to_st(d: DType) -> StDtype {
    match d {
        DType::BF16 => StDtype::BF16,
        DType::F16 => StDtype::F16,
        DType::F32 => StDtype::F32,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::F8E4M3Fn => StDtype::F8_E4M3,
        DType::F8E5M2 => StDtype::F8_E5M2,
        _ => StDtype::U8,
    }
}

/// One tensor's place in the checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub shard: usize,
    /// Byte range inside the shard file.
    pub start: usize,
    pub end: usize,
}

/// A memory-mapped shard with its parsed header.
pub struct Shard {
    pub path: PathBuf,
    pub file_name: String,
    mmap: Mmap,
    pub metadata: Metadata,
    pub header_len: usize,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("path", &self.path).field("header_len", &self.header_len).finish()
    }
}

impl Shard {
    /// Maps the file and parses its header (payload pages are not read).
    pub fn open(path: &Path) -> Result<Self> {
        let file = open_regular(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the map is read-only; a checkpoint modified while mapped is outside the contract
        // (the same assumption every safetensors loader makes).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let (n, metadata) = st_header::read_metadata(&mmap).map_err(|why| ModelError::checkpoint(path, why))?;
        let file_name = path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Shard { path: path.to_path_buf(), file_name, mmap, metadata, header_len: n })
    }

    fn data_start(&self) -> usize {
        8 + self.header_len
    }
}

/// An opened checkpoint directory.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: K3Config,
    pub shards: Vec<Shard>,
    /// Full tensor name -> entry.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// `metadata.total_size` of the index, if present.
    pub declared_total_size: Option<u64>,
    /// Index/shard inconsistencies found while opening (inspect reports them; loading refuses).
    pub problems: Vec<String>,
}

impl Checkpoint {
    /// Reads config, index and every shard header.
    pub fn open(dir: &Path) -> Result<Self> {
        let config = read_config(dir)?;
        let mut problems = Vec::new();
        let index_path = dir.join(INDEX_FILE);
        let (shard_files, weight_map, declared_total_size) = if index_path.exists() {
            read_index(&index_path)?
        } else if dir.join(SINGLE_FILE).exists() {
            (vec![SINGLE_FILE.to_string()], None, None)
        } else {
            return Err(ModelError::checkpoint(dir, format!("neither {INDEX_FILE} nor {SINGLE_FILE} found")));
        };
        let mut shards = Vec::new();
        for f in &shard_files {
            let p = dir.join(f);
            if !p.exists() {
                return Err(ModelError::checkpoint(&index_path, format!("the index names shard `{f}`, which does not exist")));
            }
            shards.push(Shard::open(&p)?);
        }
        let mut tensors = BTreeMap::new();
        for (si, s) in shards.iter().enumerate() {
            for (name, info) in s.metadata.tensors() {
                let dtype = dtype_from_st(&name, info.dtype)?;
                let (a, b) = info.data_offsets;
                let entry = TensorEntry {
                    name: name.clone(),
                    dtype,
                    shape: info.shape.clone(),
                    shard: si,
                    start: s.data_start() + a,
                    end: s.data_start() + b,
                };
                if let Some(prev) = tensors.insert(name.clone(), entry) {
                    problems.push(format!("`{name}` is stored in both {} and {}", shards[prev.shard].file_name, s.file_name));
                }
            }
        }
        if let Some(map) = &weight_map {
            for (name, file) in map {
                match tensors.get(name) {
                    None => problems.push(format!("index maps `{name}` to {file}, which does not contain it")),
                    Some(e) if &shards[e.shard].file_name != file => problems.push(format!(
                        "index maps `{name}` to {file} but it is stored in {}",
                        shards[e.shard].file_name
                    )),
                    _ => {}
                }
            }
            for name in tensors.keys() {
                if !map.contains_key(name) {
                    problems.push(format!("`{name}` is in a shard but not in the index"));
                }
            }
        }
        if let Some(total) = declared_total_size {
            let actual: u64 = tensors.values().map(|e| (e.end - e.start) as u64).sum();
            if total != actual {
                problems.push(format!("index metadata.total_size is {total} but the tensors hold {actual} bytes"));
            }
        }
        Ok(Checkpoint { dir: dir.to_path_buf(), config, shards, tensors, declared_total_size, problems })
    }

    /// Looks a tensor up by its full name or its name without the `language_model.` prefix.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name).or_else(|| self.tensors.get(&format!("{PREFIX}{name}")))
    }

    /// The raw bytes of a tensor (memory-mapped).
    pub fn bytes(&self, e: &TensorEntry) -> &[u8] {
        &self.shards[e.shard].mmap[e.start..e.end]
    }

    /// Whether routed experts are stored as MXFP4 (`weight_packed`/`weight_scale` present): the
    /// tensors decide, never the config's quantisation ignore list.
    pub fn has_packed_experts(&self) -> bool {
        self.tensors.keys().any(|n| n.ends_with(".weight_packed"))
    }
}

/// Reads and checks `DIR/config.json` (at most [`CONFIG_FILE_MAX`] bytes of a regular file).
pub fn read_config(dir: &Path) -> Result<K3Config> {
    let path = dir.join("config.json");
    let text = read_text_capped(&path, CONFIG_FILE_MAX, "model_k3::limits::CONFIG_FILE_MAX").map_err(|e| ModelError::io(&path, e))?;
    Ok(K3Config::from_json_str(&text)?)
}

type IndexParts = (Vec<String>, Option<HashMap<String, String>>, Option<u64>);

fn read_index(path: &Path) -> Result<IndexParts> {
    let text = read_text_capped(path, INDEX_FILE_MAX, "model_k3::limits::INDEX_FILE_MAX").map_err(|e| ModelError::io(path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::checkpoint(path, format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::checkpoint(path, "no `weight_map` object"))?;
    let mut weight_map = HashMap::new();
    let mut files: Vec<String> = Vec::new();
    for (name, f) in map {
        let f = f.as_str().ok_or_else(|| ModelError::checkpoint(path, format!("weight_map[`{name}`] is not a file name")))?;
        if f.contains('/') || f.contains("..") {
            return Err(ModelError::checkpoint(path, format!("weight_map[`{name}`] = `{f}` leaves the checkpoint directory")));
        }
        if !files.iter().any(|x| x == f) {
            files.push(f.to_string());
        }
        weight_map.insert(name.clone(), f.to_string());
    }
    files.sort();
    let total = v.get("metadata").and_then(|m| m.get("total_size")).and_then(|t| t.as_u64());
    Ok((files, Some(weight_map), total))
}

/// HF shard file name with K3's six-digit total: `model-00001-of-000096.safetensors`.
pub fn shard_file_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:06}.safetensors", i + 1, n)
}
