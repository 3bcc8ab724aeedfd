//! Checkpoints names are learned from (docs/names.md#checkpoints): a `.safetensors` file, a
//! sharded Hugging Face checkpoint through its `model.safetensors.index.json`, or a PEFT
//! LoRA adapter (`adapter_model.safetensors` with `adapter_config.json`), given as the file
//! or as the directory holding it.
//!
//! Invariants: every file is opened read-only without following a link in its last
//! component, checked to be a regular file, and mapped; its header is parsed by
//! `format::safetensors` (strict, and read only once its declared length is within the
//! format's limit), so every tensor's byte range lies inside its file and holds exactly its
//! dtype and shape. Shards are named by the index as plain file names in the index's
//! directory (no `/`, `.` or `..`). JSON files (index, adapter config) are read only up to
//! a bound. Nothing is read from the tensors' bytes here.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::elem::Elem;
use crate::error::{Error, Result};
use crate::format::safetensors;
use crate::source::{ByteSource, LocalFile};

/// The largest index or adapter config read (a 400-billion-parameter model's index is
/// about 100 KiB).
const MAX_JSON: u64 = 16 << 20;

/// What kind of checkpoint a `--from` named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One `.safetensors` file.
    Safetensors,
    /// Shards listed by a `model.safetensors.index.json`.
    Sharded,
    /// A PEFT LoRA adapter.
    Peft,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Safetensors => "safetensors",
            Kind::Sharded => "sharded",
            Kind::Peft => "peft",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::Safetensors, Kind::Sharded, Kind::Peft]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// A PEFT adapter's `adapter_config.json`, as far as names and writes need it.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    /// `r`: the rank.
    pub rank: u64,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `use_rslora`: the update is scaled by alpha / √r instead of alpha / r.
    pub rslora: bool,
    /// `target_modules`, as listed (a single pattern string is one entry).
    pub target_modules: Vec<String>,
}

impl Adapter {
    /// The factor the adapter's update `B·A` is multiplied by.
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }
}

/// One tensor of a checkpoint.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    /// The safetensors dtype, as the file spells it.
    pub dtype: &'static str,
    /// None for dtypes whose values are not compared.
    pub elem: Option<Elem>,
    pub shape: Vec<u64>,
    /// Which of the checkpoint's files holds it.
    pub file: usize,
    /// Its bytes in that file.
    pub start: u64,
    pub end: u64,
}

impl Tensor {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// `F32[64,64]`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
        format!("{}[{}]", self.dtype, dims.join(","))
    }
}

/// An opened checkpoint: its files mapped, its tensors in the order the checkpoint lists
/// them.
pub struct Checkpoint {
    /// The path the user gave.
    pub source: PathBuf,
    pub kind: Kind,
    pub adapter: Option<Adapter>,
    /// The files holding the tensors (one, or the shards in index order).
    pub files: Vec<PathBuf>,
    sources: Vec<Box<dyn ByteSource>>,
    pub tensors: Vec<Tensor>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("source", &self.source)
            .field("kind", &self.kind)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::invalid(format!("{}: {what}", path.display()))
}

/// Opens `path` read-only, as a regular file, mapped.
fn map_file(path: &Path) -> Result<Box<dyn ByteSource>> {
    let local = LocalFile::open(path, false).map_err(|e| Error::io(path.display(), e))?;
    local.identity().map_err(|e| Error::io(path.display(), e))?;
    local.map().map_err(|e| Error::io(path.display(), e))
}

/// A small JSON file, refused past `MAX_JSON` bytes.
fn read_json(path: &Path) -> Result<Value> {
    let source = map_file(path)?;
    if source.len() > MAX_JSON {
        return Err(err(
            path,
            format!(
                "{} bytes, more than the {MAX_JSON} a checkpoint's JSON may have",
                source.len()
            ),
        ));
    }
    let bytes = source
        .read(0..source.len())
        .map_err(|e| Error::io(path.display(), e))?;
    serde_json::from_slice(&bytes).map_err(|e| err(path, format!("not JSON: {e}")))
}

/// The tensors of the safetensors file `source` (the path for messages), in offset order.
fn safetensors_tensors(path: &Path, source: &dyn ByteSource) -> Result<safetensors::Header> {
    let total = source.len();
    let start = source
        .read(0..total.min(8))
        .map_err(|e| Error::io(path.display(), e))?;
    let hlen = safetensors::header_len(&start, total, None).map_err(|e| err(path, e))?;
    let head = source
        .read(0..hlen)
        .map_err(|e| Error::io(path.display(), e))?;
    safetensors::parse(&head, total).map_err(|e| err(path, e))
}

/// A shard's name from an index: a plain file name.
fn shard_name<'a>(index: &Path, tensor: &str, value: &'a Value) -> Result<&'a str> {
    let name = value.as_str().ok_or_else(|| {
        err(
            index,
            format!("weight_map[{tensor:?}] is {value}, expected a file name"),
        )
    })?;
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(err(
            index,
            format!(
                "weight_map[{tensor:?}] names {name:?}: a shard must be a file beside the index"
            ),
        ));
    }
    Ok(name)
}

impl Checkpoint {
    /// Opens the checkpoint `path` names (docs/names.md#checkpoints).
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path.display(), e))?;
        if meta.is_dir() {
            let adapter = path.join("adapter_config.json");
            let index = path.join("model.safetensors.index.json");
            let single = path.join("model.safetensors");
            if adapter.exists() {
                return Checkpoint::open_peft(path, &path.join("adapter_model.safetensors"));
            }
            if index.exists() {
                return Checkpoint::open_sharded(path, &index);
            }
            if single.exists() {
                return Checkpoint::open_single(path, &single, Kind::Safetensors, None);
            }
            return Err(err(
                path,
                "no checkpoint in this directory: expected model.safetensors, model.safetensors.index.json, or adapter_model.safetensors with adapter_config.json",
            ));
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".index.json") {
            return Checkpoint::open_sharded(path, path);
        }
        if name.ends_with(".safetensors") {
            let config = path.with_file_name("adapter_config.json");
            if name == "adapter_model.safetensors" && config.exists() {
                return Checkpoint::open_peft(path, path);
            }
            return Checkpoint::open_single(path, path, Kind::Safetensors, None);
        }
        Err(err(
            path,
            "not a safetensors checkpoint (a .safetensors file, a model.safetensors.index.json, or a directory holding one); PyTorch .pth/.pt/.bin checkpoints are not read: save them with safetensors first",
        ))
    }

    fn open_single(
        source: &Path, file: &Path, kind: Kind, adapter: Option<Adapter>,
    ) -> Result<Checkpoint> {
        let mapped = map_file(file)?;
        let header = safetensors_tensors(file, &*mapped)?;
        let mut tensors: Vec<Tensor> = header
            .tensors
            .into_iter()
            .map(|t| tensor_of(t, 0, header.data_start))
            .collect();
        // The order the file lists them in is lost by the parser; offset order is the
        // order writers use.
        tensors.sort_by_key(|t| t.start);
        Ok(Checkpoint {
            source: source.to_path_buf(),
            kind,
            adapter,
            files: vec![file.to_path_buf()],
            sources: vec![mapped],
            tensors,
        })
    }

    fn open_sharded(source: &Path, index: &Path) -> Result<Checkpoint> {
        let json = read_json(index)?;
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| err(index, "no \"weight_map\" object"))?;
        if map.is_empty() {
            return Err(err(index, "\"weight_map\" lists no tensor"));
        }
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut files: Vec<PathBuf> = Vec::new();
        let mut sources: Vec<Box<dyn ByteSource>> = Vec::new();
        let mut headers: Vec<HashMap<String, safetensors::TensorInfo>> = Vec::new();
        let mut data_starts = Vec::new();
        let mut shard_of: HashMap<&str, usize> = HashMap::new();
        let mut tensors = Vec::with_capacity(map.len());
        for (name, value) in map {
            let shard = shard_name(index, name, value)?;
            let at = match shard_of.get(shard) {
                Some(&at) => at,
                None => {
                    let path = dir.join(shard);
                    let mapped = map_file(&path)?;
                    let header = safetensors_tensors(&path, &*mapped)?;
                    data_starts.push(header.data_start);
                    headers.push(
                        header
                            .tensors
                            .into_iter()
                            .map(|t| (t.name.clone(), t))
                            .collect(),
                    );
                    files.push(path);
                    sources.push(mapped);
                    shard_of.insert(shard, files.len() - 1);
                    files.len() - 1
                }
            };
            let info = headers[at].remove(name.as_str()).ok_or_else(|| {
                err(
                    index,
                    format!("{name:?} is not a tensor of {shard}, where the weight_map puts it"),
                )
            })?;
            tensors.push(tensor_of(info, at, data_starts[at]));
        }
        Ok(Checkpoint {
            source: source.to_path_buf(),
            kind: Kind::Sharded,
            adapter: None,
            files,
            sources,
            tensors,
        })
    }

    fn open_peft(source: &Path, file: &Path) -> Result<Checkpoint> {
        let config_path = file.with_file_name("adapter_config.json");
        let adapter = adapter_config(&config_path, &read_json(&config_path)?)?;
        Checkpoint::open_single(source, file, Kind::Peft, Some(adapter))
    }

    /// Drops the mapping's pages of `t` from the process once it has been read through.
    pub fn release(&self, t: &Tensor) {
        self.sources[t.file].release(t.start..t.end);
    }

    /// The bytes of `t`, a tensor of this checkpoint (a slice of the mapping).
    pub fn bytes(&self, t: &Tensor) -> Result<Cow<'_, [u8]>> {
        let source = &self.sources[t.file];
        let bytes = source
            .read(t.start..t.end)
            .map_err(|e| Error::io(self.files[t.file].display(), e))?;
        if source.poisoned() {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "{}: the file shrank while it was read",
                    self.files[t.file].display()
                ),
            ));
        }
        Ok(bytes)
    }
}

fn tensor_of(t: safetensors::TensorInfo, file: usize, data_start: u64) -> Tensor {
    Tensor {
        elem: Elem::of_safetensors(t.dtype),
        dtype: t.dtype,
        shape: t.shape,
        file,
        // The parser checked both offsets against the file's length.
        start: data_start + t.begin,
        end: data_start + t.end,
        name: t.name,
    }
}

/// The adapter an `adapter_config.json` at `path` describes.
pub fn read_adapter_config(path: &Path) -> Result<Adapter> {
    adapter_config(path, &read_json(path)?)
}

/// The fields of `adapter_config.json` that names and writes need.
fn adapter_config(path: &Path, json: &Value) -> Result<Adapter> {
    let rank = json
        .get("r")
        .and_then(Value::as_u64)
        .filter(|&r| r > 0)
        .ok_or_else(|| {
            err(
                path,
                format!(
                    "\"r\" is {}, expected the adapter's rank (a positive integer)",
                    json.get("r").map_or("missing".into(), Value::to_string)
                ),
            )
        })?;
    let alpha = match json.get("lora_alpha") {
        None | Some(Value::Null) => {
            return Err(err(
                path,
                "no \"lora_alpha\": the adapter's scale is unknown",
            ))
        }
        Some(v) => v
            .as_f64()
            .filter(|a| a.is_finite())
            .ok_or_else(|| err(path, format!("\"lora_alpha\" is {v}, expected a number")))?,
    };
    let rslora = match json.get("use_rslora") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(err(
                path,
                format!("\"use_rslora\" is {v}, expected true or false"),
            ))
        }
    };
    let target_modules = match json.get("target_modules") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|m| {
                m.as_str().map(str::to_string).ok_or_else(|| {
                    err(
                        path,
                        format!("\"target_modules\" holds {m}, expected names"),
                    )
                })
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(err(
                path,
                format!("\"target_modules\" is {v}, expected a list of names"),
            ))
        }
    };
    Ok(Adapter {
        rank,
        alpha,
        rslora,
        target_modules,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn adapter_scale_follows_rslora() {
        let path = Path::new("adapter_config.json");
        let a = adapter_config(path, &json!({"r": 4, "lora_alpha": 8})).unwrap();
        assert_eq!((a.rank, a.alpha, a.rslora), (4, 8.0, false));
        assert_eq!(a.scale(), 2.0);
        let a = adapter_config(
            path,
            &json!({"r": 4, "lora_alpha": 8, "use_rslora": true, "target_modules": "q_proj"}),
        )
        .unwrap();
        assert_eq!(a.scale(), 4.0);
        assert_eq!(a.target_modules, ["q_proj"]);
        for (bad, says) in [
            (json!({"lora_alpha": 8}), "\"r\" is missing"),
            (json!({"r": 0, "lora_alpha": 8}), "\"r\" is 0"),
            (json!({"r": 2}), "no \"lora_alpha\""),
            (
                json!({"r": 2, "lora_alpha": "x"}),
                "\"lora_alpha\" is \"x\"",
            ),
            (
                json!({"r": 2, "lora_alpha": 1, "use_rslora": 1}),
                "\"use_rslora\" is 1",
            ),
        ] {
            let e = adapter_config(path, &bad).unwrap_err();
            assert!(e.message().contains(says), "{e}");
        }
    }

    #[test]
    fn shards_are_files_beside_the_index() {
        let index = Path::new("/ck/model.safetensors.index.json");
        assert_eq!(
            shard_name(index, "w", &json!("model-1.safetensors")).unwrap(),
            "model-1.safetensors"
        );
        for bad in [
            json!("../x.safetensors"),
            json!("/etc/passwd"),
            json!(".."),
            json!(3),
        ] {
            assert!(shard_name(index, "w", &bad).is_err(), "{bad}");
        }
    }
}
