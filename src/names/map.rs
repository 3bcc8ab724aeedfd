//! The name map (docs/names.md#the-map): what `ptefs names` learned, as JSON that the mount's
//! named views, writes by name and `ptefs names --map` read back, tied to the exact files it
//! was learned on by their SHA-256.
//!
//! Invariants: a map is written only with the digest of every model file; a parsed map has
//! the format and version this build writes, every target's file index names one of its
//! files, every transform is one `Transform::from_json` accepts, and it is refused past
//! `MAX_MAP` bytes. `check_files` refuses a map whose files are not, byte for byte, the ones
//! at hand.

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::checkpoint::{Adapter, Checkpoint, Kind};
use super::matching::{Learned, Outcome, Quality};
use super::stored::Stored;
use super::transform::Transform;
use crate::error::{Error, Result};
use crate::format::model::ModelFile;
use crate::format::Model;

/// The `format` field of every map.
pub const FORMAT: &str = "ptefs-names";
/// The version this build writes and reads.
pub const VERSION: u64 = 1;
/// The largest map read.
pub const MAX_MAP: u64 = 256 << 20;

/// A model file a map was learned on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapFile {
    /// Its file name (the model first, then the `--data` files in order).
    pub name: String,
    pub size: u64,
    /// Lowercase hex; None until computed (`NameMap::compute_digests`).
    pub sha256: Option<String>,
}

/// A checkpoint the names came from.
#[derive(Debug, Clone, PartialEq)]
pub struct MapCheckpoint {
    /// As given on the command line.
    pub path: String,
    pub kind: Kind,
    pub files: Vec<String>,
    pub tensors: usize,
    pub adapter: Option<Adapter>,
}

/// A stored tensor, as a map names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapStored {
    /// Its tree path, without extension.
    pub path: String,
    pub also: Vec<String>,
    /// `FLOAT[64]`, `XNNPACK qbint4[64,64]`.
    pub what: String,
    /// The shape of its float32 values.
    pub shape: Vec<u64>,
    /// The file holding its bytes (index in `NameMap::files`).
    pub file: usize,
    pub key: Option<String>,
}

/// Where a checkpoint tensor is stored, how, and how closely.
#[derive(Debug, Clone, PartialEq)]
pub struct MapTarget {
    pub stored: MapStored,
    pub transform: Transform,
    pub quality: Quality,
}

/// The closest candidate that did not match, on the sample.
#[derive(Debug, Clone, PartialEq)]
pub struct MapNear {
    pub path: String,
    pub transform: Transform,
    pub quality: Quality,
}

/// What became of a checkpoint tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Matched {
        targets: Vec<MapTarget>,
        runner_up: Option<MapNear>,
    },
    Ambiguous {
        candidates: Vec<MapTarget>,
        with: Vec<String>,
    },
    Folded {
        target: MapStored,
        transform: Transform,
        factors: (f64, f64),
        rms_steps: f64,
    },
    Unmatched {
        closest: Option<MapNear>,
    },
    NotCompared {
        why: String,
    },
}

impl Status {
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Matched { .. } => "matched",
            Status::Ambiguous { .. } => "ambiguous",
            Status::Folded { .. } => "folded",
            Status::Unmatched { .. } => "unmatched",
            Status::NotCompared { .. } => "not_compared",
        }
    }
}

/// A checkpoint tensor and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct MapName {
    pub name: String,
    /// Index in `NameMap::checkpoints`.
    pub checkpoint: usize,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub status: Status,
}

/// A name map.
#[derive(Debug, Clone, PartialEq)]
pub struct NameMap {
    pub files: Vec<MapFile>,
    pub checkpoints: Vec<MapCheckpoint>,
    /// Every checkpoint tensor, in checkpoint order.
    pub names: Vec<MapName>,
    /// Stored tensors no name was found for.
    pub unnamed: Vec<MapStored>,
}

fn map_stored(s: &Stored) -> MapStored {
    MapStored {
        path: s.path.clone(),
        also: s.also.clone(),
        what: s.what.clone(),
        shape: s.shape.clone(),
        file: s.file,
        key: s.key.clone(),
    }
}

/// The lowercase hex SHA-256 of a model file's bytes, read in windows (through its
/// descriptor when it has one, so the mapping's pages are not all touched).
pub fn file_digest(file: &ModelFile) -> Result<String> {
    const CHUNK: u64 = 1 << 20;
    let mut hash = Sha256::new();
    let len = file.len();
    let mut at = 0u64;
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    while at < len {
        let n = (len - at).min(CHUNK) as usize;
        match &file.file {
            Some(f) => {
                f.read_exact_at(&mut buf[..n], at)
                    .map_err(|e| Error::io(file.path.display(), e))?;
                hash.update(&buf[..n]);
            }
            None => {
                let range = crate::format::range::ByteRange::new(at, n as u64)
                    .ok_or_else(|| Error::invalid("file range overflows"))?;
                hash.update(&file.read(range)?);
            }
        }
        at += n as u64;
    }
    Ok(hex(&hash.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn file_name(file: &ModelFile) -> String {
    file.name.to_string_lossy().into_owned()
}

impl NameMap {
    /// The map of what `learned` found in `model` from `checkpoints` (without digests).
    pub fn from_learned(learned: &Learned, model: &Model, checkpoints: &[Checkpoint]) -> NameMap {
        let target = |m: &super::matching::Match| MapTarget {
            stored: map_stored(&learned.stored[m.stored]),
            transform: m.transform.clone(),
            quality: m.quality,
        };
        let near = |n: &super::matching::Near| MapNear {
            path: learned.stored[n.stored].path.clone(),
            transform: n.transform.clone(),
            quality: n.quality,
        };
        let names = learned
            .names
            .iter()
            .map(|n| MapName {
                name: n.tensor.name.clone(),
                checkpoint: n.checkpoint,
                dtype: n.tensor.dtype.to_string(),
                shape: n.tensor.shape.clone(),
                status: match &n.outcome {
                    Outcome::Matched { targets, runner_up } => Status::Matched {
                        targets: targets.iter().map(target).collect(),
                        runner_up: runner_up.as_ref().map(near),
                    },
                    Outcome::Ambiguous { candidates, with } => Status::Ambiguous {
                        candidates: candidates.iter().map(target).collect(),
                        with: with.clone(),
                    },
                    Outcome::Folded {
                        stored,
                        transform,
                        factors,
                        quality,
                    } => Status::Folded {
                        target: map_stored(&learned.stored[*stored]),
                        transform: transform.clone(),
                        factors: *factors,
                        rms_steps: quality.rms_steps,
                    },
                    Outcome::Unmatched { closest } => Status::Unmatched {
                        closest: closest.as_ref().map(near),
                    },
                    Outcome::NotCompared { why } => Status::NotCompared { why: why.clone() },
                },
            })
            .collect();
        NameMap {
            files: model
                .files
                .iter()
                .map(|f| MapFile {
                    name: file_name(f),
                    size: f.len(),
                    sha256: None,
                })
                .collect(),
            checkpoints: checkpoints
                .iter()
                .map(|c| MapCheckpoint {
                    // Absolute: the map outlives the directory it was made in.
                    path: c
                        .source
                        .canonicalize()
                        .unwrap_or_else(|_| c.source.clone())
                        .display()
                        .to_string(),
                    kind: c.kind,
                    files: c
                        .files
                        .iter()
                        .map(|f| {
                            f.canonicalize()
                                .unwrap_or_else(|_| f.clone())
                                .display()
                                .to_string()
                        })
                        .collect(),
                    tensors: c.tensors.len(),
                    adapter: c.adapter.clone(),
                })
                .collect(),
            names,
            unnamed: learned
                .unnamed
                .iter()
                .map(|&s| map_stored(&learned.stored[s]))
                .collect(),
        }
    }

    /// Computes the SHA-256 of every model file.
    pub fn compute_digests(&mut self, model: &Model) -> Result<()> {
        for (f, file) in self.files.iter_mut().zip(&model.files) {
            f.sha256 = Some(file_digest(file)?);
        }
        Ok(())
    }

    /// How many checkpoint tensors were named.
    pub fn matched(&self) -> usize {
        self.names
            .iter()
            .filter(|n| matches!(n.status, Status::Matched { .. }))
            .count()
    }

    /// The entry of checkpoint tensor `name`.
    pub fn name(&self, name: &str) -> Option<&MapName> {
        self.names.iter().find(|n| n.name == name)
    }

    /// Refuses `model` unless its files are, in order and byte for byte, those the map was
    /// learned on.
    pub fn check_files(&self, model: &Model) -> Result<()> {
        let list = |names: Vec<String>| names.join(", ");
        if self.files.len() != model.files.len() {
            return Err(Error::invalid(format!(
                "the map was learned on {} file(s) ({}), given {} ({}): give the same model and --data files",
                self.files.len(),
                list(self.files.iter().map(|f| f.name.clone()).collect()),
                model.files.len(),
                list(model.files.iter().map(file_name).collect()),
            )));
        }
        for (k, (f, file)) in self.files.iter().zip(&model.files).enumerate() {
            let given = file_name(file);
            if f.name != given {
                return Err(Error::invalid(format!(
                    "file {} of the map is {}, given {given}: give the same files in the same order",
                    k + 1,
                    f.name
                )));
            }
            let Some(recorded) = &f.sha256 else {
                return Err(Error::invalid(format!(
                    "the map has no sha256 for {}",
                    f.name
                )));
            };
            let now = file_digest(file)?;
            if *recorded != now {
                return Err(Error::invalid(format!(
                    "{} changed since the map was learned (sha256 {} then, {} now): learn the names again with ptefs names",
                    file.path.display(),
                    &recorded[..recorded.len().min(16)],
                    &now[..16]
                )));
            }
        }
        Ok(())
    }

    /// Refuses a map whose targets are not stored tensors of `stored` (the model's, as
    /// `stored_tensors` lists them) with the shape and type recorded.
    pub fn check_targets(&self, stored: &[Stored]) -> Result<()> {
        for n in &self.names {
            let Status::Matched { targets, .. } = &n.status else {
                continue;
            };
            for (k, t) in targets.iter().enumerate() {
                if targets[..k].iter().any(|u| u.stored.path == t.stored.path) {
                    return Err(Error::invalid(format!(
                        "{}: the map names the target {} twice",
                        crate::quote::name(&n.name),
                        t.stored.path
                    )));
                }
                let found = stored.iter().find(|s| s.path == t.stored.path);
                match found {
                    Some(s) if s.shape == t.stored.shape && s.what == t.stored.what => {}
                    Some(s) => {
                        return Err(Error::invalid(format!(
                            "{}: the map says {} holds it as {} with values of shape {:?}, the model stores {} there with values of shape {:?}",
                            crate::quote::name(&n.name),
                            t.stored.path,
                            t.stored.what,
                            t.stored.shape,
                            s.what,
                            s.shape
                        )))
                    }
                    None => {
                        return Err(Error::invalid(format!(
                            "{}: the map names {}, which this model does not show",
                            n.name, t.stored.path
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// The map as JSON (docs/names.md#the-map); every file needs its digest.
    pub fn to_json(&self) -> Result<Value> {
        let mut files = Vec::new();
        for f in &self.files {
            let sha = f.sha256.as_ref().ok_or_else(|| {
                Error::invalid(format!(
                    "no sha256 computed for {} (compute_digests)",
                    f.name
                ))
            })?;
            files.push(json!({ "name": f.name, "size": f.size, "sha256": sha }));
        }
        let checkpoints: Vec<Value> = self
            .checkpoints
            .iter()
            .map(|c| {
                let mut o = json!({
                    "path": c.path,
                    "kind": c.kind.as_str(),
                    "files": c.files,
                    "tensors": c.tensors,
                });
                if let Some(a) = &c.adapter {
                    o["adapter"] = json!({
                        "r": a.rank,
                        "lora_alpha": a.alpha,
                        "use_rslora": a.rslora,
                        "target_modules": a.target_modules,
                    });
                }
                o
            })
            .collect();
        let mut names = Map::new();
        for n in &self.names {
            names.insert(n.name.clone(), name_json(n));
        }
        Ok(json!({
            "format": FORMAT,
            "version": VERSION,
            "files": files,
            "checkpoints": checkpoints,
            "names": names,
            "unnamed": self.unnamed.iter().map(stored_json).collect::<Vec<_>>(),
        }))
    }

    /// Reads a map from `path` (at most `MAX_MAP` bytes).
    pub fn read(path: &std::path::Path) -> Result<NameMap> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path.display(), e))?;
        let mut bytes = Vec::new();
        file.take(MAX_MAP + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(path.display(), e))?;
        if bytes.len() as u64 > MAX_MAP {
            return Err(Error::invalid(format!(
                "{}: more than {MAX_MAP} bytes, larger than a name map",
                path.display()
            )));
        }
        NameMap::parse(&bytes).map_err(|e| e.context(path.display()))
    }

    /// Parses a map's JSON.
    pub fn parse(bytes: &[u8]) -> Result<NameMap> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid(format!("not a name map: not JSON: {e}")))?;
        let bad = |what: String| Error::invalid(format!("not a valid name map: {what}"));
        if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(bad(format!("\"format\" is not {FORMAT:?}")));
        }
        match v.get("version").and_then(Value::as_u64) {
            Some(VERSION) => {}
            other => {
                return Err(bad(format!(
                    "version {}, this ptefs reads version {VERSION}",
                    other.map_or("missing".into(), |v| v.to_string())
                )))
            }
        }
        let files = array(&v, "files")
            .map_err(bad)?
            .iter()
            .enumerate()
            .map(|(k, f)| {
                let sha = string(f, "sha256")?;
                if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("files[{k}].sha256 is not a SHA-256 in hex"));
                }
                Ok(MapFile {
                    name: string(f, "name")?,
                    size: uint(f, "size")?,
                    sha256: Some(sha.to_ascii_lowercase()),
                })
            })
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(bad)?;
        if files.is_empty() {
            return Err(bad("it names no model file".into()));
        }
        let checkpoints = array(&v, "checkpoints")
            .map_err(bad)?
            .iter()
            .map(parse_checkpoint)
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(bad)?;
        let nfiles = files.len();
        let names_obj = v
            .get("names")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no \"names\" object".into()))?;
        let mut names = Vec::with_capacity(names_obj.len());
        for (name, o) in names_obj {
            let entry = parse_name(name, o, nfiles, checkpoints.len())
                .map_err(|e| bad(format!("{name:?}: {e}")))?;
            names.push(entry);
        }
        let unnamed = array(&v, "unnamed")
            .map_err(bad)?
            .iter()
            .map(|s| parse_stored(s, nfiles))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(|e| bad(format!("unnamed: {e}")))?;
        Ok(NameMap {
            files,
            checkpoints,
            names,
            unnamed,
        })
    }
}

/// One name's entry of the map's `names` object (docs/names.md#the-map).
pub fn name_json(n: &MapName) -> Value {
    let mut o = json!({
        "checkpoint": n.checkpoint,
        "dtype": n.dtype,
        "shape": n.shape,
        "status": n.status.as_str(),
    });
    match &n.status {
        Status::Matched { targets, runner_up } => {
            o["targets"] = targets.iter().map(target_json).collect();
            o["runner_up"] = runner_up.as_ref().map_or(Value::Null, near_json);
        }
        Status::Ambiguous { candidates, with } => {
            o["candidates"] = candidates.iter().map(target_json).collect();
            o["with"] = json!(with);
        }
        Status::Folded {
            target,
            transform,
            factors,
            rms_steps,
        } => {
            o["target"] = stored_json(target);
            o["transform"] = transform.to_json();
            o["factors"] = json!([number(factors.0), number(factors.1)]);
            o["rms_steps"] = number(*rms_steps);
        }
        Status::Unmatched { closest } => {
            o["closest"] = closest.as_ref().map_or(Value::Null, near_json);
        }
        Status::NotCompared { why } => o["why"] = json!(why),
    }
    o
}

/// A finite number, or null (an error that overflowed, a NaN in a checkpoint).
fn number(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

fn quality_into(o: &mut Value, q: &Quality) {
    o["max_error"] = number(q.max_error);
    o["rms_steps"] = number(q.rms_steps);
    o["max_steps"] = number(q.max_steps);
    o["elements"] = json!(q.elements);
}

fn stored_json(s: &MapStored) -> Value {
    let mut o = json!({
        "path": s.path,
        "stored": s.what,
        "shape": s.shape,
        "file": s.file,
    });
    if !s.also.is_empty() {
        o["also"] = json!(s.also);
    }
    if let Some(k) = &s.key {
        o["key"] = json!(k);
    }
    o
}

fn target_json(t: &MapTarget) -> Value {
    let mut o = stored_json(&t.stored);
    o["transform"] = t.transform.to_json();
    quality_into(&mut o, &t.quality);
    o
}

fn near_json(n: &MapNear) -> Value {
    let mut o = json!({ "path": n.path, "transform": n.transform.to_json() });
    quality_into(&mut o, &n.quality);
    o
}

type Parsed<T> = std::result::Result<T, String>;

fn array<'v>(v: &'v Value, key: &str) -> Parsed<&'v Vec<Value>> {
    v.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no {key:?} list"))
}

fn string(v: &Value, key: &str) -> Parsed<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("{key:?} is not a string"))
}

fn uint(v: &Value, key: &str) -> Parsed<u64> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("{key:?} is not a non-negative integer"))
}

fn dims(v: &Value, key: &str) -> Parsed<Vec<u64>> {
    v.get(key)
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| format!("{key:?} is not a list of dims"))
}

fn strings(v: &Value, key: &str) -> Parsed<Vec<String>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(a) => a
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|s| s.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| format!("{key:?} is not a list of strings")),
    }
}

/// A number written by `number`: null reads as infinity.
fn float(v: &Value, key: &str) -> Parsed<f64> {
    match v.get(key) {
        Some(Value::Null) => Ok(f64::INFINITY),
        Some(n) => n.as_f64().ok_or_else(|| format!("{key:?} is not a number")),
        None => Err(format!("no {key:?}")),
    }
}

fn parse_quality(v: &Value) -> Parsed<Quality> {
    Ok(Quality {
        max_error: float(v, "max_error")?,
        rms_steps: float(v, "rms_steps")?,
        max_steps: float(v, "max_steps")?,
        elements: uint(v, "elements")?,
    })
}

fn parse_transform(v: &Value) -> Parsed<Transform> {
    Transform::from_json(v.get("transform").unwrap_or(&Value::Null))
}

fn parse_stored(v: &Value, nfiles: usize) -> Parsed<MapStored> {
    let file = uint(v, "file")? as usize;
    if file >= nfiles {
        return Err(format!(
            "\"file\" {file} is not one of the {nfiles} file(s)"
        ));
    }
    let path = string(v, "path")?;
    if path.is_empty() {
        return Err("an empty \"path\"".into());
    }
    Ok(MapStored {
        path,
        also: strings(v, "also")?,
        what: string(v, "stored")?,
        shape: dims(v, "shape")?,
        file,
        key: match v.get("key") {
            None | Some(Value::Null) => None,
            Some(_) => Some(string(v, "key")?),
        },
    })
}

fn parse_target(v: &Value, nfiles: usize) -> Parsed<MapTarget> {
    Ok(MapTarget {
        stored: parse_stored(v, nfiles)?,
        transform: parse_transform(v)?,
        quality: parse_quality(v)?,
    })
}

fn parse_near(v: &Value) -> Parsed<Option<MapNear>> {
    if v.is_null() {
        return Ok(None);
    }
    Ok(Some(MapNear {
        path: string(v, "path")?,
        transform: parse_transform(v)?,
        quality: parse_quality(v)?,
    }))
}

fn parse_checkpoint(v: &Value) -> Parsed<MapCheckpoint> {
    let kind = string(v, "kind")?;
    let kind = Kind::parse(&kind).ok_or_else(|| format!("unknown checkpoint kind {kind:?}"))?;
    let adapter = match v.get("adapter") {
        None | Some(Value::Null) => None,
        Some(a) => Some(Adapter {
            rank: uint(a, "r")?,
            alpha: float(a, "lora_alpha")?,
            rslora: a
                .get("use_rslora")
                .and_then(Value::as_bool)
                .ok_or("\"use_rslora\" is not true or false")?,
            target_modules: strings(a, "target_modules")?,
        }),
    };
    Ok(MapCheckpoint {
        path: string(v, "path")?,
        kind,
        files: strings(v, "files")?,
        tensors: uint(v, "tensors")? as usize,
        adapter,
    })
}

fn parse_name(name: &str, v: &Value, nfiles: usize, ncheckpoints: usize) -> Parsed<MapName> {
    let checkpoint = uint(v, "checkpoint")? as usize;
    if checkpoint >= ncheckpoints {
        return Err(format!("checkpoint {checkpoint} is not listed"));
    }
    let targets = |key: &str| -> Parsed<Vec<MapTarget>> {
        array(v, key)?
            .iter()
            .map(|t| parse_target(t, nfiles))
            .collect()
    };
    let status = match string(v, "status")?.as_str() {
        "matched" => {
            let targets = targets("targets")?;
            if targets.is_empty() {
                return Err("matched, but no targets".into());
            }
            Status::Matched {
                targets,
                runner_up: parse_near(v.get("runner_up").unwrap_or(&Value::Null))?,
            }
        }
        "ambiguous" => Status::Ambiguous {
            candidates: targets("candidates")?,
            with: strings(v, "with")?,
        },
        "folded" => {
            let f = array(v, "factors")?;
            let factor = |i: usize| -> Parsed<f64> {
                f.get(i)
                    .map(|x| x.as_f64().unwrap_or(f64::INFINITY))
                    .ok_or_else(|| "\"factors\" is not [smallest, largest]".to_string())
            };
            Status::Folded {
                target: parse_stored(v.get("target").unwrap_or(&Value::Null), nfiles)?,
                transform: parse_transform(v)?,
                factors: (factor(0)?, factor(1)?),
                rms_steps: float(v, "rms_steps")?,
            }
        }
        "unmatched" => Status::Unmatched {
            closest: parse_near(v.get("closest").unwrap_or(&Value::Null))?,
        },
        "not_compared" => Status::NotCompared {
            why: string(v, "why")?,
        },
        other => return Err(format!("unknown status {other:?}")),
    };
    Ok(MapName {
        name: name.to_string(),
        checkpoint,
        dtype: string(v, "dtype")?,
        shape: dims(v, "shape")?,
        status,
    })
}

/// Writes `bytes` to `path` through a new file beside it, renamed over it. Everything is
/// done relative to one descriptor of the directory, so a directory swapped for a link
/// meanwhile cannot send the file elsewhere; an existing `path` is replaced only when it is
/// a regular file of this process's user (never through a symbolic link, never another
/// user's file: ptefs may run as root beside shared directories).
pub fn write_replacing(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format!("{}: not a file name", path.display())))?;
    let c =
        |b: &[u8]| std::ffi::CString::new(b).map_err(|_| Error::invalid("a NUL in a file name"));
    let dir_c = c(dir.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let dfd = unsafe {
        libc::open(
            dir_c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dfd < 0 {
        return Err(Error::io(dir.display(), std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    let dfd = unsafe { OwnedFd::from_raw_fd(dfd) };
    let name_c = c(name.as_bytes())?;
    // SAFETY: plain structs filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name and a stat buffer.
    let found = unsafe {
        libc::fstatat(
            dfd.as_raw_fd(),
            name_c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } == 0;
    if found {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::invalid(format!(
                "{}: not replaced: it is not a regular file (a symbolic link?)",
                path.display()
            )));
        }
        if st.st_uid != me {
            return Err(Error::new(
                libc::EACCES,
                format!(
                    "{}: not replaced: it belongs to uid {}, and ptefs runs as uid {me}",
                    path.display(),
                    st.st_uid
                ),
            ));
        }
    }
    let mut bits = [0u8; 8];
    // SAFETY: a buffer of the given length.
    if unsafe { libc::getrandom(bits.as_mut_ptr().cast(), bits.len(), 0) } != 8 {
        return Err(Error::io("getrandom", std::io::Error::last_os_error()));
    }
    let mut tmp_name = b".".to_vec();
    tmp_name.extend_from_slice(name.as_bytes());
    tmp_name.extend_from_slice(format!(".{:016x}", u64::from_ne_bytes(bits)).as_bytes());
    let tmp_c = c(&tmp_name)?;
    let tmp = dir.join(std::ffi::OsStr::from_bytes(&tmp_name));
    // SAFETY: valid descriptor and NUL-terminated name; the new descriptor is owned below.
    let fd = unsafe {
        libc::openat(
            dfd.as_raw_fd(),
            tmp_c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(Error::io(tmp.display(), std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            // SAFETY: valid descriptor and NUL-terminated names.
            let r = unsafe {
                libc::renameat(
                    dfd.as_raw_fd(),
                    tmp_c.as_ptr(),
                    dfd.as_raw_fd(),
                    name_c.as_ptr(),
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    if let Err(e) = written {
        // SAFETY: valid descriptor and NUL-terminated name.
        unsafe { libc::unlinkat(dfd.as_raw_fd(), tmp_c.as_ptr(), 0) };
        return Err(Error::io(path.display(), e));
    }
    Ok(())
}

/// Replaces the map file at `path` with `map` (a new file beside it, renamed over it),
/// refusing when `path` is one of `model`'s files: a map given for a model is never one.
pub fn save_replacing(path: &Path, map: &NameMap, model: &Model) -> Result<()> {
    if let Ok(target) = path.canonicalize() {
        let same = |f: &ModelFile| f.path.canonicalize().is_ok_and(|p| p == target);
        if model.files.iter().any(same) {
            return Err(Error::invalid(format!(
                "{}: that is a model file, not a name map",
                path.display()
            )));
        }
    }
    let mut text = serde_json::to_vec_pretty(&map.to_json()?).expect("JSON of strings and numbers");
    text.push(b'\n');
    write_replacing(path, &text)
}

#[cfg(test)]
mod tests {
    use super::write_replacing;

    #[test]
    fn a_map_is_replaced_only_as_a_regular_file_of_its_user_never_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let map = d.path().join("names.json");
        write_replacing(&map, b"one").unwrap();
        write_replacing(&map, b"two").unwrap();
        assert_eq!(std::fs::read(&map).unwrap(), b"two");
        // A link where the map was named: neither the link nor its target changes.
        let target = d.path().join("precious");
        std::fs::write(&target, b"precious").unwrap();
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write_replacing(&link, b"three").unwrap_err();
        assert!(e.message().contains("not a regular file"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        // Nothing else was left in the directory.
        let mut names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["link.json", "names.json", "precious"]);
        // Another user's map is not replaced (as root, a file given away can be made).
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&map, Some(12345), None).unwrap();
            let e = write_replacing(&map, b"four").unwrap_err();
            assert!(e.message().contains("belongs to uid 12345"), "{e}");
            assert_eq!(std::fs::read(&map).unwrap(), b"two");
        }
    }
}
