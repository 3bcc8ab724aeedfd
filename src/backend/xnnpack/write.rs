//! Writes of the float32 view of a quantized XNNPACK constant (`values/<id>.f32.npy`,
//! docs/writes.md#xnnpack-constants): the array is re-quantized the way the datatype
//! defines, and the new bytes of the constant, of its scales, and of an int32 bias that
//! follows the filter's scales are returned together for one commit.
//!
//! Which scales are fresh and which are kept, and when an int32 bias is rescaled with its
//! filter, is [`ScalePlan`]'s rule.
//!
//! Invariants: nothing is returned unless the whole array re-quantizes; the array is read
//! in windows of [`WINDOW`] values, never whole; every returned range is cut to the bytes
//! the layout reads, inside the blob's location.

use super::placed::{scale_plan, Placed, ScalePlan};
use super::{QuantError, XnnGraph};
use crate::backend::blob::{locate, BlobRef, BlobWrite, KeyRole};
use crate::backend::view::{for_each_window, WINDOW};
use crate::content::Source;
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::Model;

/// A located range cut to the `len` bytes a layout reads.
fn cut(l: Location, len: u64) -> Location {
    Location {
        file: l.file,
        range: l.range.prefix(len),
    }
}

/// The writes that rescale int32 bias `id` after its filter's scales went from `old` to
/// `new` (one per channel, or one for the whole filter): each integer times old / new, its
/// stored scales times new / old (see [`ScalePlan`]).
fn rescale_bias(
    model: &Model, payload: Location, graph: &XnnGraph, filter: &str, id: u32, old: &[f32],
    new: &[f32],
) -> Result<[BlobWrite; 2]> {
    let b = graph
        .value(id)
        .ok_or_else(|| Error::new(libc::ESTALE, format!("{filter}: its bias %{id} is gone")))?;
    let what = format!("{filter}: its int32 bias %{id} ({})", b.describe());
    let placed = Placed::f32_view(b, true, &|r| locate(model, payload, r)).ok_or_else(|| {
        Error::invalid(format!(
            "{what}: its bytes or scales are not at hand, or not of the size its datatype and dims need"
        ))
    })?;
    let layout = &placed.layout;
    let scales_at = placed
        .scales
        .map(|l| cut(l, layout.scale_nbytes()))
        .ok_or_else(|| Error::invalid(format!("{what}: its scales are not at hand")))?;
    let data_at = cut(placed.data, layout.data_nbytes());
    let bytes = |l: &Location| model.files[l.file].read_at(l);
    // Quantizer messages start with the datatype and dims themselves.
    let refuse =
        |e: QuantError| Error::invalid(format!("{filter}: its int32 bias %{id}: {}", e.message()));
    let stored = layout.scale_values(&bytes(&scales_at)?).map_err(refuse)?;
    let mut ratios = Vec::with_capacity(stored.len());
    let mut scales = Vec::with_capacity(stored.len());
    for (c, &s) in stored.iter().enumerate() {
        let f = match (old.len(), stored.len()) {
            (n, m) if n == m => c,
            (1, _) => 0,
            (n, m) => {
                return Err(Error::invalid(format!(
                    "{what}: it has {m} scales and the filter {n}; each bias channel must follow one filter channel"
                )))
            }
        };
        if !(old[f].is_normal() && old[f] > 0.0) {
            return Err(Error::invalid(format!(
                "{what}: the filter's stored scale {f} is {}, not a positive normal float, so the bias's unit is unknown",
                old[f]
            )));
        }
        let ratio = f64::from(old[f]) / f64::from(new[f]);
        let scale = (f64::from(s) / ratio) as f32;
        if !(scale.is_normal() && scale > 0.0) {
            return Err(Error::invalid(format!(
                "{what}: its scale {c} ({s}) would become {scale}, which XNNPACK refuses"
            )));
        }
        ratios.push(ratio);
        scales.push(scale);
    }
    let mut data = vec![0u8; layout.data_nbytes() as usize];
    layout
        .rescale_int32(&bytes(&data_at)?, &ratios, &mut data)
        .map_err(refuse)?;
    let mut scale_bytes = vec![0u8; layout.scale_nbytes() as usize];
    layout
        .store_scale_values(&scales, &mut scale_bytes)
        .map_err(refuse)?;
    let (Some(source), Some(scale_source)) = (
        b.constant.clone(),
        b.quant
            .as_ref()
            .and_then(|q| q.scale_ref())
            .map(|s| s.bytes),
    ) else {
        return Err(Error::invalid(format!(
            "{what}: its bytes or scales are not at hand"
        )));
    };
    Ok([
        BlobWrite {
            value: id,
            role: KeyRole::Constant,
            bytes: source,
            at: data_at,
            new: data,
        },
        BlobWrite {
            value: id,
            role: KeyRole::Scale,
            bytes: scale_source,
            at: scales_at,
            new: scale_bytes,
        },
    ])
}

/// The new bytes that make `body` (float32 values, as many as value `value` has elements)
/// its value: re-quantized weights, and with fresh scales the scales and any int32 bias
/// rescaled to follow them. The constant's own bytes come first.
pub fn plan_float_write(
    graph: &XnnGraph, model: &Model, payload: Location, value: u32, body: Source,
) -> Result<Vec<BlobWrite>> {
    let v = graph.value(value).ok_or_else(|| {
        Error::new(
            libc::ESTALE,
            format!("the payload has no value %{value} any more"),
        )
    })?;
    let what = format!("%{value} ({})", v.describe());
    if v.quant.is_none() {
        return Err(Error::new(
            libc::EACCES,
            format!(
                "{what}: the float32 view of an unquantized constant is read-only; write its .npy"
            ),
        ));
    }
    let placed = Placed::f32_view(v, true, &|r| locate(model, payload, r)).ok_or_else(|| {
        Error::invalid(format!(
            "{what}: its bytes or scales are not at hand, or no longer of the size its datatype and dims need"
        ))
    })?;
    let layout = &placed.layout;
    let want = layout.numel() * 4;
    if body.len() != want {
        return Err(Error::invalid(format!(
            ".npy data is {} bytes: expected {want} for {} float32 values",
            body.len(),
            layout.numel()
        )));
    }
    // Quantizer messages start with the datatype and dims themselves.
    let refuse = |e: QuantError| Error::invalid(format!("%{value}: {}", e.message()));
    let data_at = cut(placed.data, layout.data_nbytes());
    let scales_at = placed.scales.map(|l| cut(l, layout.scale_nbytes()));
    let source: BlobRef = v
        .constant
        .clone()
        .ok_or_else(|| Error::new(libc::ESTALE, format!("{what}: no longer a constant")))?;
    let scale_source = v
        .quant
        .as_ref()
        .and_then(|q| q.scale_ref())
        .map(|s| s.bytes);
    let stored = match &scales_at {
        Some(l) => model.files[l.file].read_at(l)?,
        None => std::borrow::Cow::Borrowed(&[][..]),
    };
    let stored = &*stored;
    // As many bytes as the constant has in the file (Placed checked), like the scales below.
    let mut weights = layout.blank_data();
    let mut writes = Vec::new();
    match scale_plan(graph, v)? {
        ScalePlan::Keep { reason } => {
            for_each_window(body, WINDOW, |first, w| {
                layout
                    .check_window(first, w, stored)
                    .and_then(|()| layout.encode_window(first, w, &mut weights, stored))
                    .map_err(|e| {
                        Error::invalid(format!(
                            "%{value}: {} (its stored scales are kept: {reason})",
                            e.message()
                        ))
                    })
            })?;
        }
        ScalePlan::Fresh { biases } => {
            let (Some(scales_at), Some(scale_source)) = (scales_at, scale_source) else {
                return Err(Error::invalid(format!(
                    "{what}: its scales are not at hand to be replaced"
                )));
            };
            let old = layout.scale_values(stored).map_err(refuse)?;
            // The stored scales, for those that need not change (an all-zero channel keeps
            // its scale, so its bias keeps its bytes).
            let mut scales = stored[..layout.scale_nbytes() as usize].to_vec();
            // Whole scales per window: one pass. Else the largest magnitudes first, then the
            // values, in a second pass.
            let span = layout.scale_span().filter(|&s| s <= WINDOW as u64);
            if let Some(span) = span {
                let size = WINDOW / span as usize * span as usize;
                for_each_window(body, size, |first, w| {
                    layout
                        .requantize_window(first, w, &mut weights, &mut scales)
                        .map_err(refuse)
                })?;
            } else {
                let mut largest = vec![0u32; old.len()];
                for_each_window(body, WINDOW, |first, w| {
                    layout
                        .largest_in_window(first, w, &mut largest)
                        .map_err(refuse)
                })?;
                layout
                    .store_fresh_scales(&largest, &mut scales)
                    .map_err(refuse)?;
                for_each_window(body, WINDOW, |first, w| {
                    layout
                        .encode_window(first, w, &mut weights, &scales)
                        .map_err(refuse)
                })?;
            }
            let new = layout.scale_values(&scales).map_err(refuse)?;
            writes.push(BlobWrite {
                value,
                role: KeyRole::Scale,
                bytes: scale_source,
                at: scales_at,
                new: scales,
            });
            for b in biases {
                writes.extend(rescale_bias(model, payload, graph, &what, b, &old, &new)?);
            }
        }
    }
    writes.insert(
        0,
        BlobWrite {
            value,
            role: KeyRole::Constant,
            bytes: source,
            at: data_at,
            new: weights,
        },
    );
    Ok(writes)
}
