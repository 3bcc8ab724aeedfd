//! XNNPACK as a [`Backend`], and its decoded graph as a [`Payload`]: the one place that
//! tells the rest of the crate what an XNNPACK payload shows and accepts.

use serde_json::Value;

use super::graph::{ScaleDtype, XnnGraph};
use super::placed::Placed;
use super::{quant, render, write, Datatype, BACKEND_ID};
use crate::backend::blob::{Blob, BlobRef, BlobWrite, KeyRole, Resolver};
use crate::backend::view::FloatView;
use crate::backend::{Backend, Constant, Payload};
use crate::content::Source;
use crate::error::Result;
use crate::format::layout::Location;
use crate::format::{safetensors, FormatError, Model};

/// The XNNPACK backend (`XnnpackBackend` delegates).
pub struct Xnnpack;

impl Backend for Xnnpack {
    fn id(&self) -> &'static str {
        BACKEND_ID
    }

    fn dir_name(&self) -> &'static str {
        "xnnpack"
    }

    fn display_name(&self) -> &'static str {
        "XNNPACK"
    }

    fn decode(&self, payload: &[u8]) -> std::result::Result<Box<dyn Payload>, FormatError> {
        Ok(Box::new(super::decode(payload)?))
    }
}

/// How `weights.safetensors` types a constant of datatype `dt`: its `.npy` element type
/// under a safetensors name (`|V2` is bfloat16 here), and the `.npy`'s shape (4-bit types
/// as packed `U8`).
fn constant_dtype(dt: Datatype, dims: &[u32]) -> Option<(&'static str, Vec<u64>)> {
    let dtype = match dt.numpy_descr()? {
        "|V2" => "BF16",
        descr => safetensors::dtype_of_descr(descr)?,
    };
    Some((dtype, dt.npy_shape(dims)))
}

impl Payload for XnnGraph {
    fn backend(&self) -> &'static dyn Backend {
        &Xnnpack
    }

    fn header_json(&self) -> Value {
        render::header_json(self)
    }

    fn graph_json(&self, payload: &[u8]) -> Value {
        render::graph_json(self, payload)
    }

    fn graph_txt(&self) -> String {
        render::graph_txt(self)
    }

    fn graph_dot(&self) -> String {
        render::graph_dot(self)
    }

    fn op_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.display_op()).collect()
    }

    fn value_count(&self) -> usize {
        self.values.len()
    }

    fn value_id(&self, k: usize) -> u32 {
        self.values[k].id
    }

    fn value_index(&self, id: u32) -> Option<usize> {
        self.index_of(id)
    }

    fn value_json(&self, k: usize, resolve: Resolver) -> Value {
        self.values
            .get(k)
            .map_or(Value::Null, |v| render::value_json(v, resolve))
    }

    fn constant(&self, k: usize) -> Option<Constant> {
        let v = self.values.get(k)?;
        Some(Constant {
            bytes: v.constant.clone()?,
            what: v.describe(),
            // Whether a constant has a `.npy` depends on its datatype only, not on the size
            // its bytes have now: a commit that resizes them leaves the tree's shape alone.
            npy: v
                .datatype
                .numpy_descr()
                .map(|d| (d, v.datatype.npy_shape(&v.dims))),
        })
    }

    fn float_view(
        &self, k: usize, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<FloatView> {
        Placed::f32_view(self.values.get(k)?, false, locate).map(FloatView::from)
    }

    fn value_view(
        &self, k: usize, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<FloatView> {
        Placed::values_view(self.values.get(k)?, locate).map(FloatView::from)
    }

    fn float_writable(&self, k: usize) -> bool {
        self.values.get(k).is_some_and(|v| v.quant.is_some())
    }

    fn blobs(&self) -> Vec<Blob> {
        let mut out = Vec::new();
        for v in &self.values {
            let blob = |role, label, bytes, inline, expected, safetensors| Blob {
                value: v.id,
                role,
                datatype: v.datatype.display(),
                dims: v.dims.clone(),
                describe: v.describe(),
                label,
                bytes,
                inline,
                expected,
                safetensors,
            };
            if let Some(c) = &v.constant {
                out.push(blob(
                    KeyRole::Constant,
                    v.datatype.display(),
                    c.clone(),
                    false,
                    v.expected_nbytes().ok(),
                    constant_dtype(v.datatype, &v.dims),
                ));
            }
            // Scales the flatbuffer holds inline (a per-tensor scale, the `scale` vectors)
            // are listed as `inline`: a write of them must not change another value.
            if let Some(s) = v.quant.as_ref().and_then(|q| q.scale_ref()) {
                let dtype = match s.dtype {
                    ScaleDtype::Bf16 => "BF16",
                    ScaleDtype::F32 | ScaleDtype::F32RoundedToBf16 => "F32",
                };
                out.push(blob(
                    KeyRole::Scale,
                    format!("{} scales ({})", v.datatype.display(), s.dtype.name()),
                    s.bytes,
                    s.inline,
                    s.count.checked_mul(s.dtype.size()),
                    Some((dtype, vec![s.count])),
                ));
            }
        }
        out
    }

    fn check_blob(&self, blob: &Blob, new: &[u8]) -> std::result::Result<(), String> {
        if blob.role != KeyRole::Scale {
            return Ok(());
        }
        let Some(s) = self
            .value(blob.value)
            .and_then(|v| v.quant.as_ref())
            .and_then(|q| q.scale_ref())
        else {
            return Ok(());
        };
        match quant::first_refused_scale(s.dtype, new, s.count) {
            None => Ok(()),
            Some(why) => Err(format!(
                "{why}: XNNPACK accepts only positive normal floats as scales"
            )),
        }
    }

    fn plan_float_write(
        &self, model: &Model, payload: Location, id: u32, body: Source,
    ) -> Result<Vec<BlobWrite>> {
        write::plan_float_write(self, model, payload, id, body)
    }
}
