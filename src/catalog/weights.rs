//! `weights.safetensors` (docs/tree.md#weightssafetensors): every distinct tensor whose bytes
//! are in a model file, as one safetensors file that the Hugging Face / PyTorch tools read
//! directly.
//!
//! Invariants: the listing is made once per opened model, when first asked for (by a
//! lookup of the file, or by an update), and is deterministic (tensors sorted by file
//! offset, then name; `__metadata__` maps each name to its tree path); the data part is the
//! tensors' byte ranges of the model file, back to back, read from the model's bytes, never
//! copied. A tensor shown by several tree files appears once; distinct
//! tensors that share bytes (docs/tree.md#shared-bytes) appear each under its own name.

use std::collections::HashMap;

use super::names::{dedupe, Names};
use super::payloads::Payloads;
use crate::format::layout::{DataKind, FileIndex, Location, TensorShape};
use crate::format::safetensors::{self, dtype_of, Entry, HeaderBound};
use crate::format::sharing::{self, relation, Identity, Relation, TensorId};
use crate::format::{Kind, Model};

/// The `weights.safetensors` of one model file.
#[derive(Debug)]
pub struct WeightsFile {
    pub header: Vec<u8>,
    pub entries: Vec<Entry>,
    /// Where each entry's bytes start in the virtual file (after the header).
    starts: Vec<u64>,
    pub len: u64,
    /// How many more bytes an update may hold than the tensors' own: float32 values for
    /// the quantized constants (docs/writes.md#float-values-for-quantized-constants), at
    /// most 8 bytes for each stored byte (two 4-bit values a byte).
    float_room: u64,
}

/// dtype and shape of a tensor with a layout of its own.
fn tensor_dtype(shape: &TensorShape, nbytes: u64) -> (&'static str, Vec<u64>) {
    let physical = shape.physical_shape();
    match (dtype_of(shape.scalar_type), physical) {
        (Some((dtype, 1)), Some(dims)) => (dtype, dims),
        (Some((dtype, factor)), Some(mut dims)) => {
            dims.push(factor);
            (dtype, dims)
        }
        _ => ("U8", vec![nbytes]),
    }
}

/// dtype and shape of a blob a decoded payload reads: what its backend says (4-bit types
/// as packed `U8`), when that fits its size; else raw bytes.
fn blob_dtype(payloads: Option<&Payloads>, key: &str, nbytes: u64) -> (&'static str, Vec<u64>) {
    let raw = ("U8", vec![nbytes]);
    let Some((dtype, shape)) = payloads
        .and_then(|p| p.uses_of(key).first())
        .and_then(|u| u.blob.safetensors.clone())
    else {
        return raw;
    };
    let size = safetensors::dtype_size(dtype).unwrap_or(1);
    let fits = shape
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d))
        .is_some_and(|n| n == nbytes);
    if fits {
        (dtype, shape)
    } else {
        raw
    }
}

/// Whether a decoded payload reads named-data key `key` as a constant.
fn read_as_constant(payloads: Option<&Payloads>, key: &str) -> bool {
    payloads.is_some_and(|p| {
        p.uses_of(key)
            .iter()
            .any(|u| u.blob.role == crate::backend::KeyRole::Constant)
    })
}

/// A tensor of a file, before naming and sorting.
struct Candidate {
    /// A name of its own: a fully qualified name or a key.
    name: Option<String>,
    /// Its tree path, the name when it has none of its own.
    path: String,
    /// A blob a payload reads as its constant: an update may give its float32 values.
    constant: bool,
    dtype: &'static str,
    shape: Vec<u64>,
    of: TensorId,
    location: Location,
    identity: Identity,
}

/// The tensors of file `file`: blobs typed by `payloads` when given, else raw; paths from
/// the mount's root.
fn candidates(
    model: &Model, names: &Names, payloads: Option<&Payloads>, file: FileIndex,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    let prefix = names.file_prefix(file);
    let mut push = |name, path, (dtype, shape), of, constant| {
        if let Some((location, identity)) = sharing::locate(model, of) {
            out.push(Candidate {
                name,
                path,
                constant,
                dtype,
                shape,
                of,
                location,
                identity,
            });
        }
    };
    match &model.files[file].kind {
        Kind::Pte(pte) => {
            let Some(layout) = &model.pte_layout else {
                return out;
            };
            let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
            for (p, plan) in layout.plans.iter().enumerate() {
                for (i, t) in plan.tensors.iter().enumerate() {
                    let Some(t) = t else { continue };
                    let Some(loc) = t.location.filter(|l| l.file == file) else {
                        continue;
                    };
                    if t.kind == DataKind::External {
                        continue;
                    }
                    let fqn = crate::format::pte::value_fqn(plans, p, i);
                    let path = format!("plans/{}/values/{i}", names.plans[p]);
                    let dtype = tensor_dtype(&t.shape, loc.range.len());
                    push(fqn, path, dtype, TensorId::value(p, i), false);
                }
            }
            for k in 0..layout.named_data.len() {
                let key = pte.program.named_data.as_deref().unwrap_or_default()[k]
                    .key
                    .clone()
                    .unwrap_or_default();
                let Ok(loc) = &layout.named_data[k] else {
                    continue;
                };
                let dtype = blob_dtype(payloads, &key, loc.range.len());
                let path = format!("named_data/{}", names.named_data[file][k]);
                let constant = read_as_constant(payloads, &key);
                push(Some(key), path, dtype, TensorId::key(file, k), constant);
            }
        }
        Kind::Ptd(_) => {
            for (k, blob) in model.ptd_blobs[file].iter().flatten().enumerate() {
                let Ok(loc) = blob.location else { continue };
                let dtype = match &blob.tensor {
                    Some(shape) => tensor_dtype(shape, loc.range.len()),
                    None => blob_dtype(payloads, &blob.key, loc.range.len()),
                };
                let path = format!("{prefix}named_data/{}", names.named_data[file][k]);
                let constant = blob.tensor.is_none() && read_as_constant(payloads, &blob.key);
                push(
                    Some(blob.key.clone()),
                    path,
                    dtype,
                    TensorId::key(file, k),
                    constant,
                );
            }
        }
    }
    out
}

impl WeightsFile {
    /// The root's `weights.safetensors`: every file's tensors (the program's first, then
    /// each attached data file's, as the runtime looks up keys), blobs typed by the decoded
    /// payloads that read them, paths from the mount's root. A name two files use is the
    /// first file's; the other gets a `~<n>` suffix.
    pub fn root(model: &Model, names: &Names, payloads: &Payloads) -> WeightsFile {
        let all = (0..model.files.len())
            .flat_map(|f| candidates(model, names, Some(payloads), f))
            .collect();
        WeightsFile::of(all)
    }

    /// The `weights.safetensors` of file `file` with the tensors, names, dtypes and shapes
    /// a mount of that file alone shows: blobs by their own tensor layout, else raw bytes
    /// (`__metadata__` gives each tensor's path in this mount).
    pub fn alone(model: &Model, names: &Names, file: FileIndex) -> WeightsFile {
        WeightsFile::of(candidates(model, names, None, file))
    }

    /// The file that lists `candidates`.
    fn of(candidates: Vec<Candidate>) -> WeightsFile {
        // One entry per tensor: a byte range shown by several paths of one tensor (one
        // parameter used by several plans) appears once, under the first path in tree
        // order, preferring a name of its own (a fully qualified name or a key) over a tree
        // path; distinct tensors that share bytes each have an entry.
        let mut by_range: HashMap<Location, Vec<usize>> = HashMap::new();
        let mut kept: Vec<Candidate> = Vec::new();
        for c in candidates {
            let on_range = by_range.entry(c.location).or_default();
            let same = on_range
                .iter()
                .copied()
                .find(|&at| relation(kept[at].identity, c.identity) == Relation::SameTensor);
            match same {
                Some(at) => {
                    if kept[at].name.is_none() && c.name.is_some() {
                        kept[at].name = c.name;
                    }
                }
                None => {
                    on_range.push(kept.len());
                    kept.push(c);
                }
            }
        }
        kept.sort_by(|a, b| {
            let key = |c: &Candidate| (c.location.file, c.location.range.start());
            (key(a), &a.path).cmp(&(key(b), &b.path))
        });
        let float_room = kept.iter().filter(|c| c.constant).fold(0u64, |n, c| {
            n.saturating_add(c.location.range.len().saturating_mul(7))
        });
        let unique = dedupe(
            kept.iter()
                .map(|c| c.name.clone().unwrap_or_else(|| c.path.clone())),
        );
        let entries: Vec<Entry> = kept
            .into_iter()
            .zip(unique)
            .map(|(c, name)| Entry {
                name,
                dtype: c.dtype,
                shape: c.shape,
                location: c.location,
                path: c.path,
                of: c.of,
            })
            .collect();
        let tensors: Vec<(String, &str, Vec<u64>, u64)> = entries
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    e.dtype,
                    e.shape.clone(),
                    e.location.range.len(),
                )
            })
            .collect();
        let metadata: Vec<(String, String)> = entries
            .iter()
            .map(|e| (e.name.clone(), e.path.clone()))
            .collect();
        let header = safetensors::header(&tensors, &metadata);
        let mut starts = Vec::with_capacity(entries.len());
        let mut at = header.len() as u64;
        for e in &entries {
            starts.push(at);
            at = at.saturating_add(e.location.range.len());
        }
        WeightsFile {
            header,
            entries,
            starts,
            len: at,
            float_room,
        }
    }

    /// How large an update written to this file (at `path`) may be, and why: an update
    /// names each tensor at most once, and its header is refused beyond what they can need,
    /// so past both no write can be part of a valid update.
    pub fn update_limit(&self, path: &str) -> (u64, String) {
        let bound = HeaderBound::of(&self.entries);
        let data = self.entries.iter().fold(self.float_room, |n, e| {
            n.saturating_add(e.location.range.len())
        });
        (
            data.saturating_add(8 + bound.bytes),
            format!(
                "{path} takes a header of at most {} bytes for its {} tensor(s) and {data} bytes of values (their bytes, or float32 values of quantized constants)",
                bound.bytes, bound.tensors
            ),
        )
    }

    /// The pieces that bytes `[offset, offset + size)` of the virtual file are made of: the
    /// header's, then ranges of the model files, in order.
    pub fn pieces(&self, offset: u64, size: u32) -> Vec<Piece<'_>> {
        let end = offset.saturating_add(u64::from(size)).min(self.len);
        let mut at = offset.min(end);
        let mut out = Vec::new();
        let h = self.header.len() as u64;
        if at < h {
            let stop = end.min(h);
            out.push(Piece::Header(&self.header[at as usize..stop as usize]));
            at = stop;
        }
        if at >= end {
            return out;
        }
        // The entry holding `at`: the last start at or before it.
        let mut k = self.starts.partition_point(|&s| s <= at).saturating_sub(1);
        while at < end && k < self.entries.len() {
            let e = &self.entries[k];
            let start = self.starts[k];
            let within = at - start;
            let n = (e.location.range.len() - within).min(end - at);
            if n > 0 {
                out.push(Piece::Range(Location {
                    file: e.location.file,
                    range: e.location.range.slice_from(within, n),
                }));
            }
            at += n;
            k += 1;
        }
        out
    }
}

/// Part of a read of `weights.safetensors`.
pub enum Piece<'a> {
    Header(&'a [u8]),
    Range(Location),
}
