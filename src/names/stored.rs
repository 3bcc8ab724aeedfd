//! The tensors a model stores, as names are learned against them and later read and written
//! by name (docs/names.md#stored-tensors): every tensor whose values the files hold, each
//! with the tree path that shows it and its float32 values.
//!
//! - Dense tensors: values of the plans whose bytes are in the files (constants, initial
//!   states, and EXTERNAL values resolved in a `.ptd`) and `.ptd` named data with a tensor
//!   layout, read by their ExecuTorch scalar type, in memory order (the shape of their
//!   `.npy`).
//! - Payload constants of every decoded delegate: through the backend's float32 view
//!   (`Payload::float_view`: quantized and half-precision constants, dequantized) or, for
//!   constants without one (float32), their bytes read by their NumPy dtype.
//!
//! Invariants: one `Stored` per tensor: paths that show one tensor (an EXTERNAL value and
//! the key it names, one buffer used by two plans, one named blob read by two payloads
//! with the same layout) are one entry, the storage's own path first and the others in
//! `also`; distinct tensors that happen to share bytes stay distinct entries. A named blob
//! a payload reads is never listed as dense bytes besides. Every entry's bytes have exactly
//! the size its dtype and shape need (others are left out), so reads never come short.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::elem::{Elem, ElemRead};
use crate::backend::{BlobRef, Dequantize, FloatView};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::layout::{FileIndex, Location, TensorShape};
use crate::format::sharing::{self, relation, Identity, Relation, TensorId};
use crate::format::{Kind, Model};

/// How a stored tensor's float32 values are read.
#[derive(Debug, Clone)]
pub enum Reading {
    /// Bytes of one element type, in row-major order of `Stored::shape`.
    Dense { location: Location, elem: Elem },
    /// A backend's float32 view of a payload constant.
    View(FloatView),
}

/// A tensor the model stores.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The tree path that shows it, without extension (`plans/forward/values/3`,
    /// `data/m/named_data/<key>`, `plans/forward/delegates/0/xnnpack/values/2`).
    pub path: String,
    /// Other tree paths that show the same tensor.
    pub also: Vec<String>,
    /// What is stored: `FLOAT[64]`, `XNNPACK qbint4[64,64]`.
    pub what: String,
    /// The shape of its float32 values.
    pub shape: Vec<u64>,
    /// The model file holding its bytes.
    pub file: FileIndex,
    /// The named-data key its bytes are, when they are one.
    pub key: Option<String>,
    pub reading: Reading,
    /// The tensor a write of its bytes keeps apart from others sharing them (a plan value
    /// or a named-data entry); None for bytes inside a delegate payload.
    pub of: Option<TensorId>,
    /// For a payload constant: its delegate (plan, delegate) and value id.
    pub constant: Option<(usize, usize, u32)>,
}

impl Stored {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Drops the mapping's pages of its bytes (and scales) from the process once they have
    /// been read through.
    pub fn release(&self, model: &Model) {
        let locations: Vec<Location> = match &self.reading {
            Reading::Dense { location, .. } => vec![*location],
            Reading::View(view) => view.sources().collect(),
        };
        for l in locations {
            model.files[l.file].release(l.range);
        }
    }

    /// Its values, ready to read: the bytes borrowed from the model's mapping.
    pub fn values<'m>(&self, model: &'m Model) -> Result<Values<'m>> {
        let read = |l: &Location| -> Result<Cow<'m, [u8]>> {
            let file = &model.files[l.file];
            let bytes = file
                .read_at(l)
                .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
            if file.poisoned() {
                return Err(Error::new(
                    libc::EIO,
                    format!("{}: the file shrank while it was read", file.path.display()),
                ));
            }
            Ok(bytes)
        };
        let kind = match &self.reading {
            Reading::Dense { location, elem } => ValuesKind::Dense {
                bytes: read(location)?,
                elem: *elem,
            },
            Reading::View(view) => {
                let data = read(&view.data)?;
                let scales = match &view.scales {
                    Some(l) => read(l)?,
                    None => Cow::Borrowed(&[][..]),
                };
                if (data.len() as u64) < view.layout.data_nbytes()
                    || (scales.len() as u64) < view.layout.scale_nbytes()
                {
                    return Err(Error::new(
                        libc::EIO,
                        format!(
                            "{}: its bytes no longer fit its datatype and dims",
                            self.path
                        ),
                    ));
                }
                ValuesKind::View {
                    layout: view.layout.clone(),
                    data,
                    scales,
                }
            }
        };
        Ok(Values {
            numel: self.numel(),
            kind,
        })
    }
}

/// The float32 values and quantization steps of a stored tensor, for any window of elements.
pub struct Values<'m> {
    numel: u64,
    kind: ValuesKind<'m>,
}

enum ValuesKind<'m> {
    Dense {
        bytes: Cow<'m, [u8]>,
        elem: Elem,
    },
    View {
        layout: Arc<dyn Dequantize>,
        data: Cow<'m, [u8]>,
        scales: Cow<'m, [u8]>,
    },
}

impl Values<'_> {
    pub fn numel(&self) -> u64 {
        self.numel
    }

    fn window(&self, first: u64, n: usize) -> Result<()> {
        match first.checked_add(n as u64) {
            Some(end) if end <= self.numel => Ok(()),
            _ => Err(Error::invalid(format!(
                "elements {first}..+{n} asked of a tensor of {}",
                self.numel
            ))),
        }
    }

    /// Elements `first .. first + out.len()` (row-major) as float32.
    pub fn read(&self, first: u64, out: &mut [f32]) -> Result<()> {
        self.fill(first, out, false)
    }

    /// The quantization steps of elements `first .. first + out.len()`
    /// (`Dequantize::steps`; for dense bytes, the spacing of their format).
    pub fn steps(&self, first: u64, out: &mut [f32]) -> Result<()> {
        self.fill(first, out, true)
    }

    /// `read`, or with `steps` the steps of the same elements.
    fn fill(&self, first: u64, out: &mut [f32], steps: bool) -> Result<()> {
        self.window(first, out.len())?;
        match &self.kind {
            ValuesKind::Dense { bytes, elem } => {
                for (k, o) in out.iter_mut().enumerate() {
                    let v = elem.get(bytes, first as usize + k) as f32;
                    *o = if steps { elem.step(v) } else { v };
                }
                Ok(())
            }
            ValuesKind::View {
                layout,
                data,
                scales,
            } => if steps {
                layout.steps(data, scales, first, out)
            } else {
                layout.dequantize(data, scales, first, out)
            }
            .map_err(|e| Error::new(libc::EIO, e.message())),
        }
    }
}

/// A dense tensor of the files, before merging the paths of one tensor.
struct Dense {
    path: String,
    /// Whether the path is its storage's own (a named-data key), which goes first.
    own: bool,
    what: String,
    shape: Vec<u64>,
    elem: Elem,
    location: Location,
    identity: Identity,
    key: Option<String>,
    of: TensorId,
}

/// Element type and memory-order shape of a tensor whose bytes are `nbytes`, when its
/// values can be read.
fn dense_layout(shape: &TensorShape, nbytes: u64) -> Option<(Elem, Vec<u64>)> {
    let elem = Elem::of_scalar_type(shape.scalar_type)?;
    let dims = shape.physical_shape()?;
    let size = dims
        .iter()
        .try_fold(elem.size(), |n, &d| n.checked_mul(d))?;
    (size == nbytes).then_some((elem, dims))
}

/// Every tensor the model stores, dense tensors first (in program order), then payload
/// constants (by plan, delegate and value).
pub fn stored_tensors(catalog: &Catalog) -> Vec<Stored> {
    let model = &*catalog.model;
    let names = &catalog.names;
    let mut dense: Vec<Dense> = Vec::new();
    let read_by_payload = |key: &str| !catalog.payloads.uses_of(key).is_empty();

    // Plan values with bytes in the files.
    if let Some(layout) = &model.pte_layout {
        for (p, plan) in layout.plans.iter().enumerate() {
            for (i, t) in plan.tensors.iter().enumerate() {
                let Some(t) = t else { continue };
                let Some((location, identity)) = sharing::locate(model, TensorId::value(p, i))
                else {
                    continue;
                };
                let Some((elem, shape)) = dense_layout(&t.shape, location.range.len()) else {
                    continue;
                };
                let key = t.key.map(|(f, k)| model.named_data_keys(f)[k].to_string());
                if key.as_deref().is_some_and(read_by_payload) {
                    continue;
                }
                dense.push(Dense {
                    path: format!("plans/{}/values/{i}", names.plans[p]),
                    own: false,
                    what: t.shape.describe(),
                    shape,
                    elem,
                    location,
                    identity,
                    key,
                    of: TensorId::value(p, i),
                });
            }
        }
    }
    // Named data with a tensor layout (a .ptd's).
    for f in 0..model.files.len() {
        let Kind::Ptd(_) = model.files[f].kind else {
            continue;
        };
        let prefix = names.file_prefix(f);
        for (k, blob) in model.ptd_blobs[f].iter().flatten().enumerate() {
            let Some(shape) = &blob.tensor else { continue };
            if read_by_payload(&blob.key) {
                continue;
            }
            let Some((location, identity)) = sharing::locate(model, TensorId::key(f, k)) else {
                continue;
            };
            let Some((elem, dims)) = dense_layout(shape, location.range.len()) else {
                continue;
            };
            dense.push(Dense {
                path: format!("{prefix}named_data/{}", names.named_data[f][k]),
                own: true,
                what: shape.describe(),
                shape: dims,
                elem,
                location,
                identity,
                key: Some(blob.key.clone()),
                of: TensorId::key(f, k),
            });
        }
    }

    // One entry per tensor: paths of one tensor on one range merge, its own path first.
    let mut out: Vec<Stored> = Vec::new();
    let mut kept: Vec<(Identity, usize)> = Vec::new();
    let mut by_range: HashMap<Location, Vec<usize>> = HashMap::new();
    dense.sort_by_key(|d| !d.own);
    for d in dense {
        let on_range = by_range.entry(d.location).or_default();
        let same = on_range.iter().copied().find(|&at| {
            relation(kept[at].0, d.identity) == Relation::SameTensor
                && out[kept[at].1].shape == d.shape
        });
        match same {
            Some(at) => out[kept[at].1].also.push(d.path),
            None => {
                on_range.push(kept.len());
                kept.push((d.identity, out.len()));
                out.push(Stored {
                    path: d.path,
                    also: Vec::new(),
                    what: d.what,
                    shape: d.shape,
                    file: d.location.file,
                    key: d.key,
                    reading: Reading::Dense {
                        location: d.location,
                        elem: d.elem,
                    },
                    of: Some(d.of),
                    constant: None,
                });
            }
        }
    }

    // Payload constants: one entry per (bytes, scales, shape).
    let mut seen: HashMap<(Location, Option<Location>, Vec<u64>), usize> = HashMap::new();
    for (&(p, j), decoded) in catalog.payloads.iter() {
        let payload = &decoded.payload;
        let backend = payload.backend();
        for k in 0..payload.value_count() {
            let Some(constant) = payload.constant(k) else {
                continue;
            };
            let path = format!(
                "plans/{}/delegates/{j}/{}/values/{}",
                names.plans[p],
                backend.dir_name(),
                payload.value_id(k)
            );
            let key = match &constant.bytes {
                BlobRef::Named { key, .. } => Some(key.clone()),
                BlobRef::Payload { .. } => None,
            };
            let (reading, shape, data) = if let Some(view) = decoded.float_view(model, k) {
                let shape = view.layout.shape();
                let data = view.data;
                (Reading::View(view), shape, data)
            } else {
                let Some((descr, shape)) = &constant.npy else {
                    continue;
                };
                let Some(elem) = Elem::of_npy_descr(descr) else {
                    continue;
                };
                let Some(location) = decoded.locate(model, &constant.bytes) else {
                    continue;
                };
                let size = shape.iter().try_fold(elem.size(), |n, &d| n.checked_mul(d));
                if size != Some(location.range.len()) {
                    continue;
                }
                (Reading::Dense { location, elem }, shape.clone(), location)
            };
            let scales = match &reading {
                Reading::View(v) => v.scales,
                Reading::Dense { .. } => None,
            };
            match seen.get(&(data, scales, shape.clone())) {
                Some(&at) => out[at].also.push(path),
                None => {
                    seen.insert((data, scales, shape.clone()), out.len());
                    let of = key
                        .as_deref()
                        .and_then(|k| model.named_blob(k))
                        .map(|(f, index, _)| TensorId::key(f, index));
                    out.push(Stored {
                        path,
                        also: Vec::new(),
                        what: format!("{} {}", backend.display_name(), constant.what),
                        shape,
                        file: data.file,
                        key,
                        reading,
                        of,
                        constant: Some((p, j, payload.value_id(k))),
                    });
                }
            }
        }
    }
    out
}
