//! The tensors of an opened model, one entry per tensor a person would count: what each is
//! (dtype, quantization scheme, shape), where its bytes and scales are, and how its values
//! read as float32. `ptefs diff` pairs and compares them, `sizes` accounts for them
//! (docs/commands.md#diff, docs/commands.md#info---sizes). A safetensors checkpoint lists its
//! tensors the same way ([`of_checkpoint`]), so a model and a checkpoint compare alike.
//!
//! Invariants:
//! - Only tensors whose bytes the files at hand hold are listed, and every location lies
//!   inside its file (it came from the model's layout or a decoded payload's references).
//! - A tensor reached several ways is listed once, the first way in program order: a value
//!   several plans read on one constant buffer, an EXTERNAL value and the `.ptd` key it names
//!   (listed as the value). Distinct tensors that happen to share bytes are each listed
//!   (values of one plan on one buffer, payload values reading one key), so that none is
//!   lost when equal bytes were stored once.
//! - A named blob that a decoded payload reads, as a constant or as its scales, belongs to
//!   that payload's value and is not listed on its own.
//! - Order: the values of every plan, then the constants of every decoded payload (plan,
//!   delegate, value order), then the named data no one of those reads, by file and index.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::Catalog;
use crate::backend::plain::{Element, PlainLayout};
use crate::backend::{BlobRef, FloatView, KeyRole};
use crate::format::layout::{DataKind, FileIndex, Location, TensorShape};
use crate::format::range::ByteRange;
use crate::format::safetensors::Header;
use crate::format::sharing::{self, Identity, TensorId};
use crate::format::{scalar_type, Kind};

/// Where a tensor comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Value `index` of plan `plan` (a constant, an initial state, or an EXTERNAL tensor).
    Value {
        plan: usize,
        index: usize,
        kind: DataKind,
    },
    /// Named-data entry `index` of file `file` that no decoded payload reads.
    Key { file: FileIndex, index: usize },
    /// The constant of value `value` (its id) of the decoded payload of delegate
    /// (`plan`, `delegate`).
    Constant {
        plan: usize,
        delegate: usize,
        value: u32,
    },
    /// Tensor `index` of a safetensors checkpoint.
    Checkpoint { index: usize },
}

/// One tensor.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// Its tree path without extension (`plans/forward/values/3`,
    /// `data/model/named_data/lin.weight`, `plans/forward/delegates/0/xnnpack/values/2`); a
    /// checkpoint tensor's name.
    pub path: String,
    /// A name of its own: a value's fully qualified name, a named-data key, a checkpoint
    /// tensor's name.
    pub name: Option<String>,
    pub origin: Origin,
    /// The backend whose payload holds it (`"XNNPACK"`), for payload constants.
    pub backend: Option<&'static str>,
    /// Plain element types by their safetensors names (`F32`, `BF16`, `I64`), whoever stores
    /// them; quantized payload constants by their backend's datatype (`qbint4`); other
    /// scalar types by their ExecuTorch names (`QINT8`); `bytes` for a named blob nothing
    /// describes.
    pub dtype: String,
    /// How stored values map to floats, for quantized constants: `"groups of 32, bf16
    /// scales"`.
    pub scheme: Option<String>,
    /// The sizes (a program tensor's logical sizes; a payload constant's dims).
    pub shape: Vec<u64>,
    /// The order of the dimensions in memory, when it is not `0, 1, …`.
    pub dim_order: Option<Vec<u8>>,
    /// Its stored bytes.
    pub data: Location,
    /// Its scales, when they are bytes of their own.
    pub scales: Option<Location>,
    /// How its values read as float32 (in memory order), when they can.
    pub view: Option<FloatView>,
}

impl Tensor {
    /// Bytes stored for it: data and scales.
    pub fn nbytes(&self) -> u64 {
        self.data.range.len() + self.scales.map_or(0, |s| s.range.len())
    }

    /// `F32[3,4]`, `qbint4[256,64]`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
        format!("{}[{}]", self.dtype, dims.join(","))
    }

    /// `XNNPACK qbint4 (groups of 32, bf16 scales)`, `F32`: what tables of bytes by kind
    /// call it.
    pub fn kind_label(&self) -> String {
        let mut s = String::new();
        if let Some(b) = self.backend {
            s.push_str(b);
            s.push(' ');
        }
        s.push_str(&self.dtype);
        if let Some(scheme) = &self.scheme {
            s.push_str(" (");
            s.push_str(scheme);
            s.push(')');
        }
        s
    }
}

/// A plain float32 view of `nbytes` bytes at `data` holding `shape` elements of `element`,
/// when they fit exactly.
fn plain_view(element: Element, shape: Vec<u64>, data: Location) -> Option<FloatView> {
    let layout = PlainLayout::new(element, shape)?;
    use crate::backend::Dequantize;
    (layout.data_nbytes() == data.range.len()).then(|| FloatView {
        layout: Arc::new(layout),
        data,
        scales: None,
    })
}

/// dtype, dims in memory order (when they are a permutation) and view of a tensor with a
/// layout of its own at `data`.
fn shaped(shape: &TensorShape, data: Location) -> (String, Option<Vec<u8>>, Option<FloatView>) {
    let element = Element::of_scalar_type(shape.scalar_type);
    let dtype = element.map_or_else(
        || scalar_type::display(shape.scalar_type),
        |e| e.name().to_string(),
    );
    let identity = shape
        .dim_order
        .iter()
        .enumerate()
        .all(|(i, &d)| i == d as usize);
    let dim_order = (!identity).then(|| shape.dim_order.clone());
    let view = element
        .zip(shape.physical_shape())
        .and_then(|(e, physical)| plain_view(e, physical, data));
    (dtype, dim_order, view)
}

fn sizes_of(shape: &TensorShape) -> Vec<u64> {
    shape.sizes.iter().map(|&s| s.max(0) as u64).collect()
}

/// Every tensor of the catalog's model whose bytes the files at hand hold, in the order of
/// the module's invariants.
pub fn of(catalog: &Catalog) -> Vec<Tensor> {
    let model = &*catalog.model;
    let names = &catalog.names;
    let mut out = Vec::new();
    // Named-data entries that a listed tensor stands for (an EXTERNAL value's key) or that
    // a payload constant reads (its bytes or its scales).
    let mut claimed: HashSet<(FileIndex, usize)> = HashSet::new();
    let plans = model
        .pte()
        .and_then(|p| p.program.execution_plan.as_deref())
        .unwrap_or_default();

    if let Some(layout) = &model.pte_layout {
        // The plan of the first listed value on each program buffer.
        let mut buffers: HashMap<(bool, u32), Vec<usize>> = HashMap::new();
        for (p, plan) in layout.plans.iter().enumerate() {
            for (i, t) in plan.tensors.iter().enumerate() {
                let Some(t) = t else { continue };
                let Some((data, identity)) = sharing::locate(model, TensorId::value(p, i)) else {
                    continue;
                };
                match identity {
                    Identity::Key { file, index } => {
                        if !claimed.insert((file as usize, index as usize)) {
                            continue;
                        }
                    }
                    Identity::Buffer {
                        mutable, buffer, ..
                    } => {
                        let seen = buffers.entry((mutable, buffer)).or_default();
                        if seen.iter().any(|&q| q != p) {
                            continue;
                        }
                        seen.push(p);
                    }
                }
                let fqn = crate::format::pte::value_fqn(plans, p, i);
                let (dtype, dim_order, view) = shaped(&t.shape, data);
                out.push(Tensor {
                    path: format!("plans/{}/values/{i}", names.plans[p]),
                    name: fqn,
                    origin: Origin::Value {
                        plan: p,
                        index: i,
                        kind: t.kind,
                    },
                    backend: None,
                    dtype,
                    scheme: None,
                    shape: sizes_of(&t.shape),
                    dim_order,
                    data,
                    scales: None,
                    view,
                });
            }
        }
    }

    // The keys EXTERNAL values stand for.
    let of_values = claimed.clone();
    for (&(p, j), dec) in catalog.payloads.iter() {
        let payload = &*dec.payload;
        let backend = payload.backend();
        let blobs = payload.blobs();
        for blob in blobs.iter().filter(|b| b.role == KeyRole::Scale) {
            if let BlobRef::Named { key, .. } = &blob.bytes {
                if let Some((f, k, _)) = model.named_blob(key) {
                    claimed.insert((f, k));
                }
            }
        }
        for blob in blobs.iter().filter(|b| b.role == KeyRole::Constant) {
            let Some(data) = dec.locate(model, &blob.bytes) else {
                continue;
            };
            // A key an EXTERNAL value stands for stays that value's.
            let key_entry = match &blob.bytes {
                BlobRef::Named { key, .. } => model.named_blob(key).map(|(f, k, _)| (f, k)),
                BlobRef::Payload { .. } => None,
            };
            if key_entry.is_some_and(|e| of_values.contains(&e)) {
                continue;
            }
            if let Some(e) = key_entry {
                claimed.insert(e);
            }
            let k = payload.value_index(blob.value);
            let view = k.and_then(|k| dec.float_view(model, k));
            let scheme = view.as_ref().and_then(|v| v.layout.scheme());
            let dims: Vec<u64> = blob.dims.iter().map(|&d| u64::from(d)).collect();
            let element = blob
                .safetensors
                .as_ref()
                .and_then(|(st, _)| Element::of_safetensors(st));
            // A float constant is named as a plain tensor of its element type; a quantized
            // one by its backend's datatype.
            let dtype = match (&scheme, element) {
                (None, Some(e)) if is_float(e) => e.name().to_string(),
                _ => blob.datatype.clone(),
            };
            let view = view.or_else(|| element.and_then(|e| plain_view(e, dims.clone(), data)));
            let scales = match &view {
                Some(v) => v.scales,
                None => blobs
                    .iter()
                    .find(|b| b.value == blob.value && b.role == KeyRole::Scale && !b.inline)
                    .and_then(|b| dec.locate(model, &b.bytes)),
            };
            out.push(Tensor {
                path: format!(
                    "plans/{}/delegates/{j}/{}/values/{}",
                    names.plans[p],
                    backend.dir_name(),
                    blob.value
                ),
                name: match &blob.bytes {
                    BlobRef::Named { key, .. } => Some(key.clone()),
                    BlobRef::Payload { .. } => None,
                },
                origin: Origin::Constant {
                    plan: p,
                    delegate: j,
                    value: blob.value,
                },
                backend: Some(backend.display_name()),
                dtype,
                scheme,
                shape: view.as_ref().map_or(dims, |v| v.layout.shape()),
                dim_order: None,
                data,
                scales,
                view,
            });
        }
    }

    for (f, file) in model.files.iter().enumerate() {
        let prefix = names.file_prefix(f);
        let keys = model.named_data_keys(f);
        for (k, key) in keys.iter().enumerate() {
            if claimed.contains(&(f, k)) {
                continue;
            }
            let (data, shape) = match &file.kind {
                Kind::Pte(_) => {
                    let Some(Ok(l)) = model.pte_layout.as_ref().and_then(|l| l.named_data.get(k))
                    else {
                        continue;
                    };
                    (*l, None)
                }
                Kind::Ptd(_) => {
                    let Some(b) = model.ptd_blobs[f].as_ref().and_then(|b| b.get(k)) else {
                        continue;
                    };
                    let Ok(l) = &b.location else { continue };
                    (*l, b.tensor.clone())
                }
            };
            let path = format!("{prefix}named_data/{}", names.named_data[f][k]);
            let tensor = match shape {
                Some(shape) => {
                    let (dtype, dim_order, view) = shaped(&shape, data);
                    Tensor {
                        path,
                        name: Some(key.to_string()),
                        origin: Origin::Key { file: f, index: k },
                        backend: None,
                        dtype,
                        scheme: None,
                        shape: sizes_of(&shape),
                        dim_order,
                        data,
                        scales: None,
                        view,
                    }
                }
                None => Tensor {
                    path,
                    name: Some(key.to_string()),
                    origin: Origin::Key { file: f, index: k },
                    backend: None,
                    dtype: "bytes".to_string(),
                    scheme: None,
                    shape: vec![data.range.len()],
                    dim_order: None,
                    data,
                    scales: None,
                    view: None,
                },
            };
            out.push(tensor);
        }
    }
    out
}

fn is_float(e: Element) -> bool {
    matches!(
        e,
        Element::F64 | Element::F32 | Element::F16 | Element::BF16
    )
}

/// The tensors of a safetensors checkpoint whose header is `header`, its bytes in file 0:
/// each under its own name, in the order of their bytes.
pub fn of_checkpoint(header: &Header) -> Vec<Tensor> {
    let mut out = Vec::with_capacity(header.tensors.len());
    for (index, t) in header.tensors.iter().enumerate() {
        // The parser checked that the data offsets are ordered and inside the file.
        let Some(range) = header
            .data_start
            .checked_add(t.begin)
            .and_then(|start| ByteRange::new(start, t.end.checked_sub(t.begin)?))
        else {
            continue;
        };
        let data = Location { file: 0, range };
        let element = Element::of_safetensors(t.dtype);
        let view = element.and_then(|e| plain_view(e, t.shape.clone(), data));
        out.push(Tensor {
            path: t.name.clone(),
            name: Some(t.name.clone()),
            origin: Origin::Checkpoint { index },
            backend: None,
            dtype: t.dtype.to_string(),
            scheme: None,
            shape: t.shape.clone(),
            dim_order: None,
            data,
            scales: None,
            view,
        });
    }
    out
}
