//! Vulkan as a [`Backend`], and its decoded graph as a [`Payload`]: the one place that tells
//! the rest of the crate what a Vulkan payload shows. Its constants are read-only through
//! their float32 views (no re-quantization is established for Vulkan's packings); their
//! `.bin` and `.npy` take same-size writes like any payload constant.

use std::sync::Arc;

use serde_json::Value;

use super::quant::{Packing, QuantError, QuantLayout};
use super::{render, Datatype, VkGraph, BACKEND_ID};
use crate::backend::blob::{Blob, BlobRef, BlobWrite, KeyRole, Resolver};
use crate::backend::view::{Dequantize, FloatView, Grid};
use crate::backend::{Backend, Constant, Payload};
use crate::content::Source;
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::{safetensors, FormatError, Model};

/// The Vulkan backend (`VulkanBackend` delegates).
pub struct Vulkan;

impl Backend for Vulkan {
    fn id(&self) -> &'static str {
        BACKEND_ID
    }

    fn dir_name(&self) -> &'static str {
        "vulkan"
    }

    fn display_name(&self) -> &'static str {
        "Vulkan"
    }

    fn decode(&self, payload: &[u8]) -> std::result::Result<Box<dyn Payload>, FormatError> {
        Ok(Box::new(super::decode(payload)?))
    }
}

impl Dequantize for QuantLayout {
    fn shape(&self) -> Vec<u64> {
        QuantLayout::shape(self).to_vec()
    }

    fn numel(&self) -> u64 {
        QuantLayout::numel(self)
    }

    fn data_nbytes(&self) -> u64 {
        QuantLayout::data_nbytes(self)
    }

    fn scale_nbytes(&self) -> u64 {
        QuantLayout::scale_nbytes(self)
    }

    fn scheme(&self) -> Option<String> {
        match self.packing {
            Packing::Float32 | Packing::Float16 => None,
            Packing::Q4gsw {
                scale_datatype,
                group_size,
                ..
            } => Some(format!(
                "groups of {group_size}, {} scales",
                scale_datatype.display()
            )),
        }
    }

    fn dequantize(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> std::result::Result<(), QuantError> {
        QuantLayout::dequantize(self, data, scales, first, out)
    }

    fn steps(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> std::result::Result<(), QuantError> {
        QuantLayout::steps(self, data, scales, first, out)
    }

    fn grid(&self) -> Option<Grid> {
        match self.packing {
            Packing::Q4gsw {
                groups, scale_cols, ..
            } => Some(Grid {
                levels: Some((-8, 7)),
                zero_point: 8,
                scales: usize::try_from(groups.checked_mul(scale_cols)?).ok()?,
                unit: "group",
            }),
            Packing::Float32 | Packing::Float16 => None,
        }
    }

    fn scale_runs(&self, first: u64, end: u64, f: &mut dyn FnMut(u64, usize, usize)) {
        let Packing::Q4gsw {
            group_size,
            cols,
            scale_cols,
            ..
        } = self.packing
        else {
            return f(first, (end - first) as usize, 0);
        };
        // Element [n][k] uses scale [k / group_size][n]: runs are the groups of a row.
        let mut e = first;
        while e < end {
            let (n, k) = (e / cols, e % cols);
            let len = (group_size - k % group_size).min(end - e);
            f(
                e,
                len as usize,
                ((k / group_size) * scale_cols + n) as usize,
            );
            e += len;
        }
    }

    fn scale(&self, scales: &[u8], index: usize) -> f32 {
        match self.packing {
            Packing::Q4gsw {
                scale_datatype: Datatype::FLOAT16,
                ..
            } => super::quant::f16_to_f32(u16::from_le_bytes([
                scales[2 * index],
                scales[2 * index + 1],
            ])),
            _ => f32::from_le_bytes([
                scales[4 * index],
                scales[4 * index + 1],
                scales[4 * index + 2],
                scales[4 * index + 3],
            ]),
        }
    }
}

impl VkGraph {
    /// A view of value `v`'s constant with `layout`, its bytes (and scales) located.
    fn place(
        &self, v: &super::VkValue, layout: QuantLayout,
        locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<FloatView> {
        let data = locate(v.constant()?)?;
        let scales = match layout.packing {
            Packing::Q4gsw { scales, .. } => Some(locate(self.value(scales)?.constant()?)?),
            Packing::Float32 | Packing::Float16 => None,
        };
        Some(FloatView {
            layout: Arc::new(layout),
            data,
            scales,
        })
    }
}

impl Payload for VkGraph {
    fn backend(&self) -> &'static dyn Backend {
        &Vulkan
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
        self.chain.iter().map(|c| c.name.clone()).collect()
    }

    fn value_count(&self) -> usize {
        self.values.len()
    }

    fn value_id(&self, k: usize) -> u32 {
        self.values[k].id
    }

    fn value_index(&self, id: u32) -> Option<usize> {
        self.values.iter().position(|v| v.id == id)
    }

    fn value_json(&self, k: usize, resolve: Resolver) -> Value {
        self.values
            .get(k)
            .map_or(Value::Null, |v| render::value_json_in(self, v, resolve))
    }

    fn constant(&self, k: usize) -> Option<Constant> {
        let v = self.values.get(k)?;
        let t = v.tensor()?;
        Some(Constant {
            bytes: t.constant.clone()?,
            what: t.describe(),
            npy: t
                .datatype
                .numpy_descr()
                .map(|d| (d, t.datatype.npy_shape(&t.dims))),
        })
    }

    fn float_view(
        &self, k: usize, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<FloatView> {
        let v = self.values.get(k)?;
        self.place(v, QuantLayout::for_f32_view(self, v)?, locate)
    }

    fn value_view(
        &self, k: usize, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<FloatView> {
        let v = self.values.get(k)?;
        self.place(v, QuantLayout::for_values(self, v)?, locate)
    }

    fn float_writable(&self, _k: usize) -> bool {
        false
    }

    fn blobs(&self) -> Vec<Blob> {
        let mut out = Vec::new();
        for v in &self.values {
            let (Some(t), Some(bytes)) = (v.tensor(), v.constant()) else {
                continue;
            };
            let descr = t.datatype.numpy_descr();
            out.push(Blob {
                value: v.id,
                role: KeyRole::Constant,
                datatype: t.datatype.display(),
                dims: t.dims.clone(),
                describe: t.describe(),
                label: t.datatype.display(),
                bytes: bytes.clone(),
                inline: false,
                expected: t.expected_nbytes().ok(),
                safetensors: descr
                    .and_then(safetensors::dtype_of_descr)
                    .map(|d| (d, t.datatype.npy_shape(&t.dims))),
            });
        }
        out
    }

    /// No rule on the bytes of a Vulkan constant is known here: the 4-bit linears' scales are
    /// an ordinary FLOAT32 or FLOAT16 tensor of the graph (docs/formats/vulkan.md), which
    /// ptefs does not know the delegate to check.
    fn check_blob(&self, _blob: &Blob, _new: &[u8]) -> std::result::Result<(), String> {
        Ok(())
    }

    fn plan_float_write(
        &self, _model: &Model, _payload: Location, id: u32, _body: Source,
    ) -> Result<Vec<BlobWrite>> {
        Err(Error::new(
            libc::EACCES,
            format!(
                "%{id}: the float32 view of a Vulkan constant is read-only; write its .bin or .npy"
            ),
        ))
    }
}
