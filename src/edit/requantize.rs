//! Writes of the float32 view of a quantized payload constant (`xnnpack/values/<id>.f32.npy`,
//! DESIGN.md §3.1): the array is re-quantized the way the datatype defines, and the
//! constant's bytes and its scales are written together, as one commit.
//!
//! Invariants: the value is found again in the payload as it is on disk now (the tree that
//! showed the view may be older); nothing is written unless the whole array re-quantizes;
//! scales shared with another value are never rewritten (the write is refused instead).

use super::source::{Bytes, Source};
use super::validate::{Plan, Write};
use crate::backend::xnnpack::placed::{keeps_scales, locate, Placed};
use crate::backend::xnnpack::{self, ConstantRef, KeyRole, XnnGraph};
use crate::backend::{decode_payload, BackendView};
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::sharing::TensorId;
use crate::format::{npy, Model};

/// The decoded payload of delegate `delegate` of plan `plan`, and where it is.
fn decoded(model: &Model, plan: usize, delegate: usize) -> Result<(XnnGraph, Location)> {
    let gone = || {
        Error::new(
            libc::ESTALE,
            format!("plan {plan} delegate {delegate} is gone"),
        )
    };
    let pte = model.pte().ok_or_else(gone)?;
    let layout = model.pte_layout.as_ref().ok_or_else(gone)?;
    let d = pte
        .program
        .execution_plan
        .as_deref()
        .and_then(|p| p.get(plan))
        .and_then(|p| p.delegates.as_deref())
        .and_then(|d| d.get(delegate))
        .ok_or_else(gone)?;
    let payload = layout
        .plans
        .get(plan)
        .and_then(|p| p.delegates.get(delegate))
        .ok_or_else(gone)?
        .clone()?;
    let bytes = &model.files[payload.file].bytes()[payload.range.as_usize()];
    match decode_payload(d.id.as_deref().unwrap_or(""), bytes) {
        Ok(BackendView::Xnnpack(g)) => Ok((*g, payload)),
        Err(e) => Err(Error::invalid(format!(
            "plan {plan} delegate {delegate}: the payload does not decode: {e}"
        ))),
    }
}

/// Another value (in any decoded payload of the model) that reads named-data key `key`,
/// other than value `id` of delegate (`plan`, `delegate`) reading it as scales.
fn other_reader(model: &Model, key: &str, plan: usize, delegate: usize, id: u32) -> Option<String> {
    let pte = model.pte()?;
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    for (p, pl) in plans.iter().enumerate() {
        for j in 0..pl.delegates.as_ref().map_or(0, Vec::len) {
            let Ok((g, _)) = decoded(model, p, j) else {
                continue;
            };
            for u in g.named_uses() {
                let this = (p, j, u.value, u.role) == (plan, delegate, id, KeyRole::Scale);
                if u.key == key && !this {
                    return Some(format!(
                        "value %{} of plan {p} delegate {j} (as its {})",
                        u.value,
                        u.role.as_str()
                    ));
                }
            }
        }
    }
    None
}

/// The named-data entry a constant's bytes are, when they are named data.
fn key_of(model: &Model, r: Option<&ConstantRef>) -> Option<TensorId> {
    match r? {
        ConstantRef::Named { key, .. } => {
            let (file, k, _) = model.named_blob(key)?;
            Some(TensorId::key(file, k))
        }
        ConstantRef::Payload { .. } => None,
    }
}

/// Reads `n` little-endian float32 values from `source`.
fn floats(source: Source, n: u64) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n as usize).map_err(|_| {
        Error::new(
            libc::ENOMEM,
            format!("cannot hold {n} float32 values to re-quantize"),
        )
    })?;
    let mut buf = Vec::new();
    let mut carry: Vec<u8> = Vec::new();
    source
        .for_each_chunk(&mut buf, |chunk| {
            carry.extend_from_slice(chunk);
            let whole = carry.len() / 4 * 4;
            out.extend(
                carry[..whole]
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
            carry.drain(..whole);
            Ok(())
        })
        .map_err(|e| Error::io("read the staged array", e))?;
    Ok(out)
}

/// Decides the writes that make `data` (a `.npy` of float32) the new value of constant
/// `value` of delegate (`plan`, `delegate`).
pub fn plan<'a>(
    model: &Model, plan: usize, delegate: usize, value: u32, data: Source<'a>,
) -> Result<Plan<'a>> {
    let (graph, payload) = decoded(model, plan, delegate)?;
    let v = graph.value(value).ok_or_else(|| {
        Error::new(
            libc::ESTALE,
            format!("plan {plan} delegate {delegate} has no value %{value} any more"),
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
    let placed = Placed::f32_view(model, payload, v, true).ok_or_else(|| {
        Error::invalid(format!(
            "{what}: its bytes or scales are not at hand, or no longer of the size its datatype and dims need"
        ))
    })?;
    let layout = &placed.layout;
    let dims: Vec<u64> = v.dims.iter().map(|&d| u64::from(d)).collect();
    let header = npy::parse_header(&data.head(1 << 20)?)?;
    if !matches!(header.descr.as_str(), "<f4" | "=f4" | "f4") {
        return Err(Error::invalid(format!(
            ".npy dtype differs: expected '<f4' (float32, the view of {what}), found '{}'",
            header.descr
        )));
    }
    if header.shape != dims {
        return Err(Error::invalid(format!(
            ".npy shape differs: expected {dims:?}, found {:?}",
            header.shape
        )));
    }
    if header.fortran_order && dims.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(Error::invalid(
            ".npy is in Fortran order: expected C order (save np.ascontiguousarray(a))",
        ));
    }
    let at = header.data_offset as u64;
    let body = data.slice(at, data.len() - at)?;
    let want = layout.numel() * 4;
    if body.len() != want {
        return Err(Error::invalid(format!(
            ".npy data is {} bytes: expected {want} for {} float32 values",
            body.len(),
            layout.numel()
        )));
    }
    let input = floats(body, layout.numel())?;
    let refuse = |e: xnnpack::QuantError| Error::invalid(format!("{what}: {}", e.message()));
    let mut weights = vec![0u8; layout.data_nbytes() as usize];
    let data_at = Location {
        file: placed.data.file,
        range: placed.data.range.prefix(layout.data_nbytes()),
    };
    let scales_at = placed.scales.map(|l| Location {
        file: l.file,
        range: l.range.prefix(layout.scale_nbytes()),
    });
    let bytes_of = |l: &Location| &model.files[l.file].bytes()[l.range.as_usize()];
    if keeps_scales(&graph, v) || scales_at.is_none() {
        let stored = scales_at.as_ref().map_or(&[][..], bytes_of);
        layout
            .requantize_with_scales(&input, &mut weights, stored)
            .map_err(refuse)?;
        return Ok(Plan::InPlace {
            writes: vec![Write {
                location: data_at,
                bytes: Bytes::Owned(weights),
                of: key_of(model, v.constant.as_ref()),
            }],
        });
    }
    let scale_ref = v.quant.as_ref().and_then(|q| q.scale_ref());
    if let Some(ConstantRef::Named { key, .. }) = scale_ref.as_ref().map(|s| &s.bytes) {
        if let Some(other) = other_reader(model, key, plan, delegate, value) {
            return Err(Error::invalid(format!(
                "{what}: its scales (named data \"{key}\") are read by {other} too: fresh scales would change it; write its .bin or .npy instead"
            )));
        }
    }
    let scales_at = scales_at.expect("checked above");
    // The scales are where the graph says; make sure nothing moved since the view was made.
    debug_assert!(scale_ref
        .as_ref()
        .and_then(|s| locate(model, payload, &s.bytes))
        .is_some());
    let mut scales = vec![0u8; layout.scale_nbytes() as usize];
    layout
        .requantize(&input, &mut weights, &mut scales)
        .map_err(refuse)?;
    let writes = vec![
        Write {
            location: data_at,
            bytes: Bytes::Owned(weights),
            of: key_of(model, v.constant.as_ref()),
        },
        Write {
            location: scales_at,
            bytes: Bytes::Owned(scales),
            of: key_of(model, scale_ref.as_ref().map(|s| &s.bytes)),
        },
    ];
    Ok(Plan::InPlace { writes })
}
