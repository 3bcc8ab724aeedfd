//! A decoded XNNPACK payload placed in a model: its references resolved to byte ranges of
//! the files at hand, and what a dequantized view or a re-quantizing write of a constant
//! needs (docs/tree.md#xnnpack-delegates, docs/writes.md#which-scales-are-fresh-and-which-are-kept).
//!
//! Invariant: every `Location` returned lies inside its file (it came from the model's
//! layout or from a checked sub-range of the payload's location).

use std::sync::Arc;

use super::graph::{QuantParams, XnnGraph, XnnValue};
use super::nodes::FieldValue;
use super::quant::QuantLayout;
use super::Datatype;
use crate::backend::blob::BlobRef;
use crate::backend::view::FloatView;
use crate::error::{Error, Result};
use crate::format::layout::Location;

/// A constant's bytes and scales, located, with the layout that (de)quantizes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub layout: QuantLayout,
    pub data: Location,
    /// None for float types.
    pub scales: Option<Location>,
}

impl Placed {
    /// The float32 view of constant `value`: quantized, fp16 and bf16 constants whose bytes
    /// and scales `locate` finds, and (with `sized`) of the sizes the layout needs.
    pub fn f32_view(
        value: &XnnValue, sized: bool, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<Placed> {
        Self::place(value, QuantLayout::for_f32_view(value)?, sized, locate)
    }

    /// The values constant `value` stands for: its float32 view, or the floats of an `fp32`
    /// constant (docs/tree.md#histograms).
    pub fn values_view(
        value: &XnnValue, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<Placed> {
        value.constant.as_ref()?;
        Self::place(value, QuantLayout::for_value(value).ok()?, false, locate)
    }

    fn place(
        value: &XnnValue, layout: QuantLayout, sized: bool,
        locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<Placed> {
        let data = locate(value.constant.as_ref()?)?;
        if sized && data.range.len() < layout.data_nbytes() {
            return None;
        }
        let scales = match value.quant.as_ref().and_then(|q| q.scale_ref()) {
            None => None,
            Some(s) => {
                let l = locate(&s.bytes)?;
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

impl From<Placed> for FloatView {
    fn from(p: Placed) -> FloatView {
        FloatView {
            layout: Arc::new(p.layout),
            data: p.data,
            scales: p.scales,
        }
    }
}

/// What a re-quantizing write of a value's float32 view does with its scales
/// (docs/writes.md#which-scales-are-fresh-and-which-are-kept). The rule, from how XNNPACK reads
/// each kind of constant:
///
/// - A value whose every use is the `filter` of a node (fully connected, convolutions) gets
///   **fresh scales** computed from the data (per channel, per group, or per tensor). XNNPACK
///   computes such a node's output scale from the input's, the filter's and the output's
///   scales, so new filter scales are all it needs; except for an int32 bias (`qint32`,
///   `qcint32`), which it adds to the integer accumulator as it is: the bias is in units of
///   input scale × filter scale (channel `c` of the bias with filter scale `c`), and the
///   runtime never reads the bias's own stored scale (scripts/xnnpack-rules changes it and
///   the output does not move). Such a bias is listed in `biases`, and the write rescales
///   it: each integer by old filter scale / new filter scale, and its stored scales by the
///   inverse, so both the runtime and the bias's dequantized view see the same float bias.
///   A blockwise filter (`qbint4`) has no per-output scale to do that with; an int32 bias
///   beside one is refused (XNNPACK's blockwise kernels take fp32 biases).
/// - Any other quantized constant **keeps its stored scales** (and zero point): an int32
///   bias, whose unit the runtime derives from its node's input and filter, not from the
///   scale it stores; and the operands of other operators, whose per-tensor parameters the
///   quantizer chose for the range of the tensor they stand for and which XNNPACK requires to
///   equal those of the output for several operators (concatenation, copy, max pooling, …),
///   a link the payload does not record. Values the kept scales cannot represent are
///   refused rather than clamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScalePlan {
    /// Fresh scales; the ids of the int32 biases to rescale with them (each once).
    Fresh { biases: Vec<u32> },
    /// The stored scales are kept, for the reason given.
    Keep { reason: &'static str },
}

/// How a write of `value`'s float32 view treats its scales (see [`ScalePlan`]), or why the
/// write cannot be done soundly.
pub fn scale_plan(graph: &XnnGraph, value: &XnnValue) -> Result<ScalePlan> {
    let what = format!("%{} ({})", value.id, value.describe());
    let int32 = |v: &XnnValue| matches!(v.datatype, Datatype::QINT32 | Datatype::QCINT32);
    if int32(value) && value.used_by.iter().any(|u| u.role == "bias") {
        return Ok(ScalePlan::Keep {
            reason: "an int32 bias is in units of its node's input scale × filter scale",
        });
    }
    if value.used_by.iter().any(|u| u.role != "filter") {
        return Ok(ScalePlan::Keep {
            reason: "an operand other than a filter keeps the quantization parameters of the tensor it stands for",
        });
    }
    let blockwise = matches!(value.quant, Some(QuantParams::PerChannelGroup { .. }));
    let mut biases: Vec<u32> = Vec::new();
    for u in &value.used_by {
        let Some(node) = graph.nodes.get(u.node) else {
            continue;
        };
        let Some(FieldValue::Input(id)) = node.field("bias_id") else {
            continue;
        };
        let Some(bias) = graph
            .value(*id)
            .filter(|b| b.constant.is_some() && int32(b))
        else {
            continue;
        };
        let node_what = format!("node {} ({})", u.node, node.display_op());
        if blockwise {
            return Err(Error::invalid(format!(
                "{what}: the filter of {node_what}, whose bias %{} ({}) is int32 in units of input scale × filter scale; \
                 blockwise scales give no per-output scale to rescale it by",
                bias.id,
                bias.describe()
            )));
        }
        // Every node that adds this bias must use this filter: its unit follows the filter.
        for b in &bias.used_by {
            let other = graph
                .nodes
                .get(b.node)
                .and_then(|n| n.field("filter_id"))
                .is_some_and(|f| *f != FieldValue::Input(value.id));
            if b.role != "bias" || other {
                return Err(Error::invalid(format!(
                    "{what}: its bias %{} ({}) is also the {} of node {}, whose unit does not follow this filter's scales",
                    bias.id,
                    bias.describe(),
                    b.role,
                    b.node
                )));
            }
        }
        if !biases.contains(&bias.id) {
            biases.push(bias.id);
        }
    }
    Ok(ScalePlan::Fresh { biases })
}
