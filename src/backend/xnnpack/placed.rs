//! A decoded XNNPACK payload placed in a model: its references resolved to byte ranges of
//! the files at hand, and what a dequantized view or a re-quantizing write of a constant
//! needs (DESIGN.md §2.7, §3.1).
//!
//! Invariant: every `Location` returned lies inside its file (it came from the model's
//! layout or from a checked sub-range of the payload's location).

use super::graph::{ConstantRef, QuantParams, XnnGraph, XnnValue};
use super::nodes::FieldValue;
use super::quant::QuantLayout;
use super::Datatype;
use crate::format::layout::Location;
use crate::format::range::checked_range;
use crate::format::Model;

/// Where the bytes a reference names are: a named-data entry of the model (the mounted file
/// first, then the attached files, as the runtime looks), or a range of the payload.
pub fn locate(model: &Model, payload: Location, r: &ConstantRef) -> Option<Location> {
    match r {
        ConstantRef::Named { key, .. } => model.named_blob(key)?.2.ok(),
        ConstantRef::Payload { offset, size } => {
            let range = checked_range(
                "payload constant",
                payload.range.start(),
                *offset,
                *size,
                payload.range.end(),
            )
            .ok()?;
            Some(Location {
                file: payload.file,
                range,
            })
        }
    }
}

/// A constant's bytes and scales, located, with the layout that (de)quantizes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub layout: QuantLayout,
    pub data: Location,
    /// None for float types.
    pub scales: Option<Location>,
}

impl Placed {
    /// The float32 view of constant `value` of a payload at `payload`: quantized, fp16 and
    /// bf16 constants whose bytes and scales are at hand, and (with `sized`) of the sizes
    /// the layout needs.
    pub fn f32_view(
        model: &Model, payload: Location, value: &XnnValue, sized: bool,
    ) -> Option<Placed> {
        let layout = QuantLayout::for_f32_view(value)?;
        let data = locate(model, payload, value.constant.as_ref()?)?;
        if sized && data.range.len() < layout.data_nbytes() {
            return None;
        }
        let scales = match value.quant.as_ref().and_then(|q| q.scale_ref()) {
            None => None,
            Some(s) => {
                let l = locate(model, payload, &s.bytes)?;
                if sized && l.range.len() < layout.scale_nbytes() {
                    return None;
                }
                Some(l)
            }
        };
        if layout.scale_nbytes() > 0 && scales.is_none() {
            return None;
        }
        Some(Placed {
            layout,
            data,
            scales,
        })
    }
}

/// Whether writing new float32 values into `value` must keep its stored scales instead of
/// computing fresh ones: per-tensor types (their scale and zero point are shared with the
/// activations and the bias of the same operation), and filters whose node has an int32
/// bias (the bias is stored in units of input scale × filter scale).
pub fn keeps_scales(graph: &XnnGraph, value: &XnnValue) -> bool {
    if matches!(value.quant, Some(QuantParams::PerTensor { .. })) {
        return true;
    }
    value.used_by.iter().any(|u| {
        graph.nodes.get(u.node).is_some_and(|node| {
            node.fields.iter().any(|f| match f.value {
                FieldValue::Input(id) if f.role() == "bias" => graph.value(id).is_some_and(|b| {
                    b.constant.is_some()
                        && matches!(b.datatype, Datatype::QINT32 | Datatype::QCINT32)
                }),
                _ => false,
            })
        })
    })
}
