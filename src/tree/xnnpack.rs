//! The trees inside XNNPACK delegates (DESIGN.md §2.7): the payloads decoded once per tree,
//! the named-data keys they read (for `used_by`), their JSON and text files, the float32
//! views of their constants, dequantized per read, and where each constant's bytes are (for
//! `ptefs info`).
//!
//! Invariants: a delegate whose payload does not decode has no entry (its directory shows
//! only `delegate.json` and `processed.bin`); a float32 view reads only the byte ranges its
//! `Placed` names, which lie inside their files.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::backend::xnnpack::placed::{locate, Placed};
use crate::backend::xnnpack::render::ResolvedBytes;
use crate::backend::xnnpack::{self, Datatype, KeyRole, XnnGraph};
use crate::backend::{decode_payload, BackendView};
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::{npy, Model};

/// The `BackendDelegate.id` of the payloads decoded here.
pub use crate::backend::xnnpack::BACKEND_ID;

/// A payload that decoded, and where it is.
pub struct Decoded {
    pub graph: XnnGraph,
    pub payload: Location,
}

/// One read of a named-data key by a decoded payload.
#[derive(Debug, Clone)]
pub struct KeyUse {
    pub plan: usize,
    pub delegate: usize,
    /// The value's id.
    pub value: u32,
    pub role: KeyRole,
    pub datatype: Datatype,
    pub dims: Vec<u32>,
}

impl KeyUse {
    /// What the key holds for this reader: `qbint4`, or `qbint4 scales`.
    pub fn describe(&self) -> String {
        match self.role {
            KeyRole::Constant => self.datatype.display(),
            KeyRole::Scale => format!("{} scales", self.datatype.display()),
        }
    }
}

/// One constant, or one blob of scales, of a decoded payload, and where its bytes are.
pub struct ConstantBytes {
    /// The value's datatype (`qbint4`), or for its scales `qbint4 scales (bf16)`.
    pub what: String,
    /// The bytes; else the named key no attached file holds, with the size the graph
    /// records (None for bytes of the payload itself that do not fit in it).
    pub at: std::result::Result<Location, Option<(String, u64)>>,
}

impl Decoded {
    /// Every constant and every scale blob the graph reads, in `xvalues` order. Scales the
    /// flatbuffer holds inline (a per-tensor scale, the `scale` vectors) are not blobs.
    pub fn constant_bytes(&self, model: &Model) -> Vec<ConstantBytes> {
        let place = |what: String, r: &xnnpack::ConstantRef| ConstantBytes {
            what,
            at: locate(model, self.payload, r).ok_or_else(|| match r {
                xnnpack::ConstantRef::Named { key, size } => Some((key.clone(), *size)),
                xnnpack::ConstantRef::Payload { .. } => None,
            }),
        };
        let mut out = Vec::new();
        for v in &self.graph.values {
            if let Some(c) = &v.constant {
                out.push(place(v.datatype.display(), c));
            }
            let scales = v.quant.as_ref().and_then(|q| q.scale_ref());
            if let Some(s) = scales.filter(|s| !s.inline) {
                let what = format!("{} scales ({})", v.datatype.display(), s.dtype.name());
                out.push(place(what, &s.bytes));
            }
        }
        out
    }
}

/// Every decoded delegate payload of a model, and which values read each named key.
#[derive(Default)]
pub struct Delegates {
    decoded: BTreeMap<(usize, usize), Arc<Decoded>>,
    uses: HashMap<String, Vec<KeyUse>>,
}

impl Delegates {
    /// Decodes every delegate payload of `model` that a backend decoder reads.
    pub fn decode(model: &Model) -> Delegates {
        let mut out = Delegates::default();
        let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
            return out;
        };
        let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
        for (p, plan) in plans.iter().enumerate() {
            for (j, d) in plan.delegates.iter().flatten().enumerate() {
                let Some(Ok(payload)) = layout.plans[p].delegates.get(j) else {
                    continue;
                };
                let bytes = &model.files[payload.file].bytes()[payload.range.as_usize()];
                let Ok(BackendView::Xnnpack(graph)) =
                    decode_payload(d.id.as_deref().unwrap_or(""), bytes)
                else {
                    continue;
                };
                for u in graph.named_uses() {
                    let Some(v) = graph.value(u.value) else {
                        continue;
                    };
                    out.uses.entry(u.key.to_string()).or_default().push(KeyUse {
                        plan: p,
                        delegate: j,
                        value: u.value,
                        role: u.role,
                        datatype: v.datatype,
                        dims: v.dims.clone(),
                    });
                }
                out.decoded.insert(
                    (p, j),
                    Arc::new(Decoded {
                        graph: *graph,
                        payload: *payload,
                    }),
                );
            }
        }
        out
    }

    /// Every decoded payload, by (plan, delegate).
    pub fn iter(&self) -> impl Iterator<Item = (&(usize, usize), &Arc<Decoded>)> {
        self.decoded.iter()
    }

    pub fn get(&self, plan: usize, delegate: usize) -> Option<&Arc<Decoded>> {
        self.decoded.get(&(plan, delegate))
    }

    /// The values that read named-data key `key`, in plan, delegate and value order.
    pub fn uses_of(&self, key: &str) -> &[KeyUse] {
        self.uses.get(key).map_or(&[], Vec::as_slice)
    }
}

/// The header of a `.npy` of float32 values shaped like `dims`.
pub fn f32_npy_header(dims: &[u32]) -> Vec<u8> {
    npy::header_from_dims("<f4", dims.iter().map(|&d| u64::from(d)))
}

/// Bytes `[offset, offset + size)` of a float32 view: its `.npy` header, then the
/// dequantized values, computed only for the elements the window covers.
pub fn read_f32(
    model: &Model, view: &Placed, header: &[u8], offset: u64, size: u32,
) -> Result<Vec<u8>> {
    let total = header.len() as u64 + view.layout.numel() * 4;
    let start = offset.min(total);
    let end = offset.saturating_add(u64::from(size)).min(total);
    // A window that starts inside a float is dequantized from that float's first byte.
    let mut out = Vec::with_capacity((end - start) as usize + 8);
    let h = header.len() as u64;
    if start < h {
        out.extend_from_slice(&header[start as usize..end.min(h) as usize]);
    }
    if end > h {
        let (a, b) = (start.max(h) - h, end - h);
        let (first, last) = (a / 4, b.div_ceil(4));
        let bytes = |l: &Location| &model.files[l.file].bytes()[l.range.as_usize()];
        if view.data.range.len() < view.layout.data_nbytes()
            || view.scales.map_or(0, |l| l.range.len()) < view.layout.scale_nbytes()
        {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "the bytes of this {}-element view no longer fit its datatype and dims (ptefs check says more)",
                    view.layout.numel()
                ),
            ));
        }
        let data = bytes(&view.data);
        let scales = view.scales.as_ref().map_or(&[][..], bytes);
        let mut values = vec![0f32; (last - first) as usize];
        view.layout
            .dequantize(data, scales, first, &mut values)
            .map_err(|e| Error::new(libc::EIO, e.message().to_string()))?;
        // Whole floats straight into the reply; a window that starts or ends inside a float
        // drops the bytes outside it.
        let at = out.len();
        out.resize(at + 4 * values.len(), 0);
        for (o, v) in out[at..].chunks_exact_mut(4).zip(&values) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        let skip = (a - first * 4) as usize;
        out.truncate(at + skip + (b - a) as usize);
        if skip > 0 {
            out.drain(at..at + skip);
        }
    }
    Ok(out)
}

/// How `value_json` names where a reference's bytes are.
fn resolver<'a>(
    model: &'a Model, dec: &'a Decoded,
) -> impl Fn(&xnnpack::ConstantRef) -> Option<ResolvedBytes> + 'a {
    move |r| {
        let l = locate(model, dec.payload, r)?;
        Some(ResolvedBytes {
            file: super::render::file_name(model, l.file),
            file_offset: l.range.start(),
            nbytes: l.range.len(),
        })
    }
}

pub fn header_json(dec: &Decoded) -> Value {
    xnnpack::render::header_json(&dec.graph)
}

pub fn graph_json(model: &Model, dec: &Decoded) -> Value {
    let payload = &model.files[dec.payload.file].bytes()[dec.payload.range.as_usize()];
    xnnpack::render::graph_json(&dec.graph, payload)
}

pub fn graph_txt(dec: &Decoded) -> String {
    xnnpack::render::graph_txt(&dec.graph)
}

pub fn value_json(model: &Model, dec: &Decoded, index: usize) -> Value {
    let Some(v) = dec.graph.values.get(index) else {
        return Value::Null;
    };
    xnnpack::render::value_json(v, &resolver(model, dec))
}

/// `used_by` of `named_data/<key>.json`: the values that read the key, with the tree path
/// of each (`plan_dirs` names the plans' directories).
pub fn used_by_json(uses: &[KeyUse], plan_dirs: &[String]) -> Value {
    Value::Array(
        uses.iter()
            .map(|u| {
                json!({
                    "path": format!(
                        "plans/{}/delegates/{}/xnnpack/values/{}",
                        plan_dirs[u.plan], u.delegate, u.value
                    ),
                    "role": u.role.as_str(),
                    "datatype": u.datatype.short_name().unwrap_or("invalid"),
                    "dims": u.dims,
                })
            })
            .collect(),
    )
}
