//! Writes of the float32 view of a quantized payload constant (`xnnpack/values/<id>.f32.npy`,
//! DESIGN.md §3.1): the array is re-quantized the way the datatype defines, and the
//! constant's bytes and its scales are written together, as one commit.
//!
//! Which scales are fresh and which are kept, and when an int32 bias is rescaled with its
//! filter, is [`ScalePlan`]'s rule.
//!
//! Invariants: the value is found again in the payload as it is on disk now (the tree that
//! showed the view may be older); nothing is written unless the whole array re-quantizes;
//! a named-data key (or payload bytes) that another XNNPACK value reads too, as its
//! constant or its scales, is never rewritten (the write is refused instead; a key that
//! merely shares its segment with another key gets bytes of its own, see `identity`);
//! every write of one commit lies in one file, so the weights, their scales and a rescaled
//! bias change together or not at all.

use super::plan::Plan;
use crate::backend::xnnpack::placed::{locate, scale_plan, Placed, ScalePlan};
use crate::backend::xnnpack::{self, ConstantRef, KeyRole, XnnGraph};
use crate::backend::{decode_payload, BackendView};
use crate::content::{Bytes, Source, Write};
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

/// Float32 values a commit converts at a time: the whole array is never held, so writing the
/// view of a filter of any size costs the daemon a few hundred KiB beyond the stored bytes.
const WINDOW: usize = 1 << 16;

/// Calls `f(first, values)` for consecutive windows of `size` little-endian float32 values
/// of `body` (a whole number of them; the last window may be shorter), `first` being the
/// index of the window's first value.
fn for_each_window(
    body: Source, size: usize, mut f: impl FnMut(u64, &[f32]) -> Result<()>,
) -> Result<()> {
    let mut buf = Vec::new();
    let mut window: Vec<f32> = Vec::with_capacity(size);
    // The bytes of a value split between two chunks.
    let mut carry: Vec<u8> = Vec::with_capacity(4);
    let mut first = 0u64;
    let mut failed = None;
    let mut flush = |window: &mut Vec<f32>, first: &mut u64| -> Result<()> {
        f(*first, window)?;
        *first += window.len() as u64;
        window.clear();
        Ok(())
    };
    let read = body.for_each_chunk(&mut buf, |mut chunk| {
        let mut step = || -> Result<()> {
            if !carry.is_empty() {
                let take = (4 - carry.len()).min(chunk.len());
                carry.extend_from_slice(&chunk[..take]);
                chunk = &chunk[take..];
                if carry.len() == 4 {
                    window.push(f32::from_le_bytes([carry[0], carry[1], carry[2], carry[3]]));
                    carry.clear();
                }
            }
            let whole = chunk.len() / 4 * 4;
            for b in chunk[..whole].chunks_exact(4) {
                window.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                if window.len() == size {
                    flush(&mut window, &mut first)?;
                }
            }
            carry.extend_from_slice(&chunk[whole..]);
            Ok(())
        };
        step().map_err(|e| {
            failed = Some(e);
            std::io::Error::other("stopped")
        })
    });
    if let Some(e) = failed {
        return Err(e);
    }
    read.map_err(|e| Error::io("read the staged array", e))?;
    if !window.is_empty() {
        flush(&mut window, &mut first)?;
    }
    Ok(())
}

/// One range a re-quantizing commit writes: new bytes for the constant or the scales
/// (`role`) of value `value`, which `source` names.
struct Update {
    at: Location,
    bytes: Vec<u8>,
    value: u32,
    role: KeyRole,
    source: ConstantRef,
}

impl Update {
    /// The write a plan carries: with the named-data entry it belongs to, so that a key
    /// whose segment another key shares gets bytes of its own.
    fn into_write(self, model: &Model) -> Write<'static> {
        let of = match &self.source {
            ConstantRef::Named { key, .. } => model
                .named_blob(key)
                .map(|(file, k, _)| TensorId::key(file, k)),
            ConstantRef::Payload { .. } => None,
        };
        Write {
            location: self.at,
            bytes: Bytes::Owned(self.bytes),
            of,
        }
    }
}

/// What a value reads with `role`, for messages.
fn part(role: KeyRole) -> &'static str {
    match role {
        KeyRole::Scale => "scales",
        KeyRole::Constant => "bytes",
    }
}

/// A located range cut to the `len` bytes a layout reads.
fn cut(l: Location, len: u64) -> Location {
    Location {
        file: l.file,
        range: l.range.prefix(len),
    }
}

/// Whether two references name the same bytes: one named-data entry (as the runtime finds
/// keys), or overlapping bytes of the payload at `payload`.
fn same_bytes(
    model: &Model, a: &ConstantRef, a_payload: Location, b: &ConstantRef, b_payload: Location,
) -> bool {
    match (a, b) {
        (ConstantRef::Named { key: x, .. }, ConstantRef::Named { key: y, .. }) => {
            let entry = |k: &str| model.named_blob(k).map(|(file, index, _)| (file, index));
            x == y || entry(x).is_some_and(|e| Some(e) == entry(y))
        }
        (ConstantRef::Payload { .. }, ConstantRef::Payload { .. }) => {
            match (locate(model, a_payload, a), locate(model, b_payload, b)) {
                (Some(l), Some(m)) => {
                    l.file == m.file
                        && l.range.start() < m.range.end()
                        && m.range.start() < l.range.end()
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// Refuses `updates` when another XNNPACK value of the model (in any decoded payload) reads
/// what they change, as its constant or its scales: new weights or fresh scales would
/// silently change that value too.
fn refuse_shared(
    model: &Model, plan: usize, delegate: usize, payload: Location, what: &str, updates: &[Update],
) -> Result<()> {
    let Some(pte) = model.pte() else {
        return Ok(());
    };
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    for (p, pl) in plans.iter().enumerate() {
        for j in 0..pl.delegates.as_ref().map_or(0, Vec::len) {
            let Ok((g, other_payload)) = decoded(model, p, j) else {
                continue;
            };
            for v in &g.values {
                let scales = v
                    .quant
                    .as_ref()
                    .and_then(|q| q.scale_ref())
                    .map(|s| s.bytes);
                let reads = [
                    (KeyRole::Constant, v.constant.clone()),
                    (KeyRole::Scale, scales),
                ];
                for (role, r) in reads {
                    let Some(r) = r else { continue };
                    let hit = updates.iter().find(|u| {
                        (p, j, v.id, role) != (plan, delegate, u.value, u.role)
                            && same_bytes(model, &u.source, payload, &r, other_payload)
                    });
                    if let Some(u) = hit {
                        return Err(Error::invalid(format!(
                            "{what}: value %{} of plan {p} delegate {j} reads the {} of %{} (in {}) too, as its own {}: \
                             re-quantizing would change that value as well; write the raw bytes (.bin or .npy) instead",
                            v.id,
                            part(u.role),
                            u.value,
                            model.files[u.at.file].path.display(),
                            part(role),
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Refuses `updates` that span more than one file: a commit is atomic within one file only.
fn refuse_several_files(model: &Model, what: &str, updates: &[Update]) -> Result<()> {
    let Some(first) = updates.first() else {
        return Ok(());
    };
    if let Some(w) = updates.iter().find(|w| w.at.file != first.at.file) {
        let name = |w: &Update| model.files[w.at.file].path.display().to_string();
        return Err(Error::invalid(format!(
            "{what}: the {} of %{} are in {} and the {} of %{} in {}; a commit is atomic within one file only, so they cannot change together",
            part(first.role),
            first.value,
            name(first),
            part(w.role),
            w.value,
            name(w)
        )));
    }
    Ok(())
}

/// The writes that rescale int32 bias `id` after its filter's scales went from `old` to
/// `new` (one per channel, or one for the whole filter): each integer times old / new, its
/// stored scales times new / old (see [`ScalePlan`]).
fn rescale_bias(
    model: &Model, payload: Location, graph: &XnnGraph, filter: &str, id: u32, old: &[f32],
    new: &[f32],
) -> Result<[Update; 2]> {
    let b = graph
        .value(id)
        .ok_or_else(|| Error::new(libc::ESTALE, format!("{filter}: its bias %{id} is gone")))?;
    let what = format!("{filter}: its int32 bias %{id} ({})", b.describe());
    let placed = Placed::f32_view(model, payload, b, true).ok_or_else(|| {
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
    let bytes = |l: &Location| &model.files[l.file].bytes()[l.range.as_usize()];
    // Quantizer messages start with the datatype and dims themselves.
    let refuse = |e: xnnpack::QuantError| {
        Error::invalid(format!("{filter}: its int32 bias %{id}: {}", e.message()))
    };
    let stored = layout.scale_values(bytes(&scales_at)).map_err(refuse)?;
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
        .rescale_int32(bytes(&data_at), &ratios, &mut data)
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
        Update {
            at: data_at,
            bytes: data,
            value: id,
            role: KeyRole::Constant,
            source,
        },
        Update {
            at: scales_at,
            bytes: scale_bytes,
            value: id,
            role: KeyRole::Scale,
            source: scale_source,
        },
    ])
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
    // Quantizer messages start with the datatype and dims themselves.
    let refuse = |e: xnnpack::QuantError| Error::invalid(format!("%{value}: {}", e.message()));
    let data_at = cut(placed.data, layout.data_nbytes());
    let scales_at = placed.scales.map(|l| cut(l, layout.scale_nbytes()));
    let source = v
        .constant
        .clone()
        .ok_or_else(|| Error::new(libc::ESTALE, format!("{what}: no longer a constant")))?;
    let scale_source = v
        .quant
        .as_ref()
        .and_then(|q| q.scale_ref())
        .map(|s| s.bytes);
    let bytes_of = |l: &Location| &model.files[l.file].bytes()[l.range.as_usize()];
    let stored = scales_at.as_ref().map_or(&[][..], bytes_of);
    // As many bytes as the constant has in the file (Placed checked), like the scales below.
    let mut weights = layout.blank_data();
    let mut writes = Vec::new();
    match scale_plan(&graph, v)? {
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
            let mut scales = vec![0u8; layout.scale_nbytes() as usize];
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
            writes.push(Update {
                at: scales_at,
                bytes: scales,
                value,
                role: KeyRole::Scale,
                source: scale_source,
            });
            for b in biases {
                writes.extend(rescale_bias(model, payload, &graph, &what, b, &old, &new)?);
            }
        }
    }
    writes.insert(
        0,
        Update {
            at: data_at,
            bytes: weights,
            value,
            role: KeyRole::Constant,
            source,
        },
    );
    refuse_shared(model, plan, delegate, payload, &what, &writes)?;
    refuse_several_files(model, &what, &writes)?;
    Ok(Plan::InPlace {
        writes: writes.into_iter().map(|u| u.into_write(model)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Windows come out in order and whole, however the values straddle the source's
    /// chunks (8 MiB reads of a file, here from an offset that is not a multiple of 4).
    #[test]
    fn windows_cover_every_value_across_chunks() {
        let n = (crate::content::CHUNK / 4) * 2 + WINDOW + 5;
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let memory: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[9, 9, 9]).unwrap();
        file.write_all(&memory).unwrap();
        let source = Source::File {
            file: &file,
            offset: 3,
            len: 4 * n as u64,
        };
        for source in [source, Source::Memory(&memory)] {
            let mut seen = Vec::new();
            for_each_window(source, WINDOW, |first, w| {
                assert_eq!(first, seen.len() as u64);
                assert!(w.len() <= WINDOW);
                seen.extend_from_slice(w);
                Ok(())
            })
            .unwrap();
            assert_eq!(seen, values);
        }
        // An error from a window stops the walk and is returned as it is.
        let e = for_each_window(Source::Memory(&memory), WINDOW, |first, _| {
            if first > 0 {
                return Err(Error::invalid("stop here"));
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(e.message(), "stop here");
    }
}
