//! Updates by checkpoint name (docs/writes.md#updates-by-checkpoint-name): a safetensors file
//! whose tensors are named as the checkpoint a name map was learned from becomes the items
//! of one bulk update (`edit::bulk::plan_items`), each checkpoint tensor written at every
//! place the map says it is stored.
//!
//! Invariants: every tensor of the update is checked against the map before any value is
//! read (a name the map does not have, a name it does not name, a dtype without values, a
//! shape other than the checkpoint's, an adapter of another rank), and one problem refuses
//! the whole update, naming every problem (the first `MISMATCHES_SHOWN` spelled out); values
//! are mapped to the stored order by `IndexMap::source` (`stored = T(checkpoint)`), so the
//! stored tensor holds what it held for the checkpoint it was learned from; a value that is
//! not finite, or does not fit the stored type, refuses the update with the tensor's name;
//! one tensor's values are in memory at a time (items are made as the plan takes them).
//!
//! A PEFT adapter's `lora_B` is multiplied by the new adapter's scale over the exported
//! one's when they differ: an export multiplies the update `B·A` by its scale in the graph
//! (docs/names.md#checkpoints), so `B·(new / exported)` gives the new adapter's update.

use std::collections::HashMap;

use super::checkpoint::{Adapter, Kind};
use super::elem::{Elem, ElemRead};
use super::map::{MapName, MapTarget, NameMap, Status};
use super::stored::{stored_tensors, Reading, Stored};
use super::transform::IndexMap;
use crate::backend::float16::{f32_to_bf16, f32_to_f16};
use crate::catalog::Catalog;
use crate::content::{Bytes, Source};
use crate::edit::bulk::{self, Content, FloatTarget, Item, Summary, MISMATCHES_SHOWN};
use crate::edit::Plan;
use crate::error::{Error, Result};
use crate::format::layout::FileIndex;
use crate::format::safetensors::{Header, HeaderBound, TensorInfo};
use crate::format::{npy, Model, WriteTarget};
use crate::quote;

/// The plan for `data` as the new content of a file of the named views (`target`:
/// `names/<name>.npy` or `names.safetensors`, docs/tree.md#named-views), made as `ptefs apply
/// --names` makes it: the same checks, items and planning, then the quantization
/// parameters the new bytes land on (`edit::params`).
pub fn plan_write<'a>(
    catalog: &Catalog, map: &NameMap, target: &WriteTarget, data: Source<'a>,
) -> Result<(Plan<'a>, Summary)> {
    let header = match target {
        WriteTarget::NamesSafetensors => bulk::read_header(data, &header_bound(map))?,
        WriteTarget::NameNpy { name } => npy_as_header(map, *name, data)?,
        _ => return Err(Error::invalid("not a file of the named views")),
    };
    let by = ByName::check(catalog, map, &header, None)?;
    let (plan, summary) = bulk::plan_items(catalog, by.items(catalog, &header, data))?;
    crate::edit::params::check(catalog, &plan)?;
    Ok((plan, summary))
}

/// The plan for `data` as the new content of any writable file of a tree whose named views
/// (if any) come from `map`: files of the named views by name (`plan_write`), every other
/// file as `edit::validate` plans it.
pub fn plan_file<'a>(
    catalog: &Catalog, map: Option<&NameMap>, target: &WriteTarget, data: Source<'a>,
) -> Result<Plan<'a>> {
    match (target, map) {
        (WriteTarget::NameNpy { .. } | WriteTarget::NamesSafetensors, Some(map)) => {
            plan_write(catalog, map, target, data).map(|(plan, _)| plan)
        }
        _ => crate::edit::validate::plan(catalog, target, data),
    }
}

/// How large a safetensors header naming `map`'s names may be.
pub fn header_bound(map: &NameMap) -> HeaderBound {
    HeaderBound::of_names(map.names.iter().map(|n| (n.name.as_str(), n.shape.len())))
}

/// A `.npy` written to `names/<name>.npy` of name `entry`, as the one-tensor safetensors
/// header `ByName` checks: a float type (f2, f4, f8, little-endian), in C order, of the
/// checkpoint's shape (`ByName::check` says when it is not).
fn npy_as_header(map: &NameMap, entry: usize, data: Source) -> Result<Header> {
    let n = map
        .names
        .get(entry)
        .ok_or_else(|| Error::invalid(format!("the map has no name {entry}")))?;
    let h = npy::parse_header(&data.head(npy::MAX_HEADER_LEN.min(data.len()))?)?;
    let dtype = match h.descr.as_str() {
        "<f2" => "F16",
        "<f4" => "F32",
        "<f8" => "F64",
        other => {
            return Err(Error::invalid(format!(
            ".npy dtype {other:?}: expected float values ('<f2', '<f4' or '<f8') for {} ({} {:?})",
            quote::name(&n.name),
            n.dtype,
            n.shape
        )))
        }
    };
    if !h.is_c_order() {
        return Err(Error::invalid(
            ".npy is in Fortran order: expected C order (save np.ascontiguousarray(a))",
        ));
    }
    let size = Elem::of_safetensors(dtype).map_or(4, Elem::size);
    let start = h.data_offset as u64;
    let body = data.len().saturating_sub(start);
    let need = h
        .shape
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::invalid(format!(".npy shape {:?} overflows", h.shape)))?;
    if h.shape == n.shape && body != need {
        return Err(Error::invalid(format!(
            ".npy data is {body} bytes: expected {need} for {} values of {:?}",
            h.descr, h.shape
        )));
    }
    Ok(Header {
        tensors: vec![TensorInfo {
            name: n.name.clone(),
            dtype,
            shape: h.shape,
            begin: 0,
            end: body,
        }],
        data_start: start,
    })
}

/// Records in `map` the sizes and digests of `model`'s files `written` as they are now; the
/// others keep theirs (the caller knows them unchanged since they were last checked).
pub fn record_digests(map: &mut NameMap, model: &Model, written: &[FileIndex]) -> Result<()> {
    for &f in written {
        let (Some(entry), Some(file)) = (map.files.get_mut(f), model.files.get(f)) else {
            continue;
        };
        entry.size = file.len();
        entry.sha256 = Some(super::map::file_digest(file)?);
    }
    Ok(())
}

/// How the tensors of an update by name are to be written.
pub struct ByName<'m> {
    map: &'m NameMap,
    stored: HashMap<String, Stored>,
    /// The factor each PEFT checkpoint's `lora_B` is multiplied by (by checkpoint index).
    lora_factor: Vec<f64>,
    /// What the report says of adapters' scales.
    notes: Vec<String>,
}

/// What a map says a name is, when it cannot be written.
fn not_named(status: &Status) -> Option<String> {
    Some(match status {
        Status::Matched { .. } => return None,
        Status::Ambiguous { with, .. } => format!(
            "ambiguous in the map: stored tensors within noise of it are as close to {}, so it names none",
            with.iter()
                .map(|n| quote::name(n).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Status::Folded { target, .. } => format!(
            "stored scaled per output channel in {} (a folded BatchNorm), so it names no stored tensor",
            target.path
        ),
        Status::Unmatched { .. } => "no stored tensor matched it when the map was learned".into(),
        Status::NotCompared { why } => format!("not compared when the map was learned: {why}"),
    })
}

/// An adapter's scale and what it comes from.
fn describe(a: &Adapter) -> String {
    format!(
        "{} (lora_alpha {} / {}rank {})",
        a.scale(),
        a.alpha,
        if a.rslora { "√" } else { "" },
        a.rank
    )
}

/// Whether `name` is a LoRA tensor of a PEFT adapter (`…lora_A.weight`, `…lora_B.weight`).
fn lora_part(name: &str) -> Option<char> {
    if name.contains("lora_A.") || name.ends_with("lora_A") {
        Some('A')
    } else if name.contains("lora_B.") || name.ends_with("lora_B") {
        Some('B')
    } else {
        None
    }
}

impl<'m> ByName<'m> {
    /// Checks every tensor `header` names against `map` (already checked against the
    /// model's files), refusing the update with every problem; `adapter` is the new
    /// adapter's configuration, when the update is one.
    pub fn check(
        catalog: &Catalog, map: &'m NameMap, header: &Header, adapter: Option<&Adapter>,
    ) -> Result<ByName<'m>> {
        let by_name: HashMap<&str, &MapName> =
            map.names.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut problems = Vec::new();
        let mut n = 0usize;
        let mut refuse = |p: String| {
            n += 1;
            if problems.len() < MISMATCHES_SHOWN {
                problems.push(p);
            }
        };
        let baked = |c: usize| {
            map.checkpoints
                .get(c)
                .filter(|c| c.kind == Kind::Peft)
                .and_then(|c| c.adapter.as_ref())
        };
        if let Some(new) = adapter {
            let exported = map
                .checkpoints
                .iter()
                .filter(|c| c.kind == Kind::Peft)
                .filter_map(|c| c.adapter.as_ref())
                .find(|a| a.rank != new.rank);
            if let Some(a) = exported {
                refuse(format!(
                    "the adapter has rank {}, the export baked rank {} into its graph: export the model again with this adapter",
                    new.rank, a.rank
                ));
            }
        }
        for t in &header.tensors {
            let name = quote::name(&t.name);
            let Some(entry) = by_name.get(t.name.as_str()) else {
                refuse(format!("{name}: not a name of the map's checkpoint(s)"));
                continue;
            };
            if let Some(why) = not_named(&entry.status) {
                refuse(format!("{name}: {why}"));
                continue;
            }
            if matches!(Elem::of_safetensors(t.dtype), None | Some(Elem::Bool)) {
                refuse(format!(
                    "{name}: {} has no numeric values to write",
                    t.dtype
                ));
                continue;
            }
            if t.shape != entry.shape {
                let lora = baked(entry.checkpoint).filter(|_| lora_part(&t.name).is_some());
                match lora {
                    Some(a) => refuse(format!(
                        "{name}: expected {:?} (rank {}, as the export baked it into its graph), found {:?}: a different rank needs a new export",
                        entry.shape, a.rank, t.shape
                    )),
                    None => refuse(format!(
                        "{name}: expected shape {:?} (as the checkpoint has it), found {:?}",
                        entry.shape, t.shape
                    )),
                }
            }
        }
        if n > 0 {
            let mut message = format!(
                "the update names {n} tensor(s) that cannot be written by name, so nothing was written: {}",
                problems.join("; ")
            );
            if n > MISMATCHES_SHOWN {
                message.push_str(&format!("; and {} more", n - MISMATCHES_SHOWN));
            }
            return Err(Error::invalid(message));
        }
        let lora_factor: Vec<f64> = (0..map.checkpoints.len())
            .map(|c| match (baked(c), adapter) {
                (Some(old), Some(new)) => new.scale() / old.scale(),
                _ => 1.0,
            })
            .collect();
        let mut notes = Vec::new();
        for (c, &f) in lora_factor.iter().enumerate() {
            let (Some(old), Some(new)) = (baked(c), adapter) else {
                if let (Some(old), None) = (baked(c), adapter) {
                    notes.push(format!(
                        "adapter: no adapter_config.json beside the update, so its scale is taken to be the exported one ({})",
                        describe(old)
                    ));
                }
                continue;
            };
            if f != 1.0 {
                notes.push(format!(
                    "adapter: lora_B multiplied by {f}: the new adapter's scale is {}, the export baked {}",
                    describe(new),
                    describe(old)
                ));
            }
        }
        let stored = stored_tensors(catalog);
        map.check_targets(&stored)?;
        let stored = stored.into_iter().map(|s| (s.path.clone(), s)).collect();
        Ok(ByName {
            map,
            stored,
            lora_factor,
            notes,
        })
    }

    /// Lines for the report: how adapters' scales were followed.
    pub fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// The items of the update: one per target of each tensor, in update order, each made
    /// when the plan takes it. Call after `check`.
    pub fn items<'a, 's>(
        &'s self, catalog: &'s Catalog, header: &'s Header, update: Source<'a>,
    ) -> impl Iterator<Item = Result<Item<'a>>> + 's
    where
        'a: 's,
    {
        header.tensors.iter().flat_map(move |t| {
            let entry = self.map.name(&t.name);
            let targets: &[MapTarget] = match entry.map(|e| &e.status) {
                Some(Status::Matched { targets, .. }) => targets,
                _ => &[],
            };
            let factor = match (entry, lora_part(&t.name)) {
                (Some(e), Some('B')) => self.lora_factor.get(e.checkpoint).copied(),
                _ => None,
            }
            .unwrap_or(1.0);
            targets
                .iter()
                .map(move |target| self.item(catalog, header, update, t, target, factor))
        })
    }

    fn item<'a>(
        &self, catalog: &Catalog, header: &Header, update: Source<'a>, t: &TensorInfo,
        target: &MapTarget, factor: f64,
    ) -> Result<Item<'a>> {
        let name = format!("{} -> {}", t.name, target.stored.path);
        let quoted = quote::name(&t.name).to_string();
        let stored = self.stored.get(&target.stored.path).ok_or_else(|| {
            Error::invalid(format!(
                "{quoted}: the map names {}, which this model does not show",
                target.stored.path
            ))
        })?;
        let index = IndexMap::new(&target.transform, &t.shape, &stored.shape).ok_or_else(|| {
            Error::invalid(format!(
                "{quoted}: {} does not turn {:?} into {:?}, the shape of {}",
                target.transform, t.shape, stored.shape, stored.path
            ))
        })?;
        let elem = Elem::of_safetensors(t.dtype)
            .ok_or_else(|| Error::invalid(format!("{quoted}: {} is not read", t.dtype)))?;
        let source = update.slice(header.data_start + t.begin, t.end - t.begin)?;

        // Where the values go: re-quantized into a payload constant, or bytes of a type.
        let float = stored.constant.and_then(|(p, j, value)| {
            let dec = catalog.payloads.get(p, j)?;
            let k = dec.payload.value_index(value)?;
            dec.payload.float_writable(k).then(|| FloatTarget {
                plan: p,
                delegate: j,
                value,
                shape: stored.shape.clone(),
            })
        });
        if let Some(target) = float {
            // The checkpoint's float32 bytes are the view's already: nothing to copy.
            let body = if index.is_identity() && factor == 1.0 && elem == Elem::F32 {
                Bytes::Staged(source)
            } else {
                Bytes::Owned(self.values(&quoted, source, elem, &index, factor, Elem::F32)?)
            };
            return Ok(Item {
                name,
                content: Content::Float { target, body },
            });
        }
        let (location, to) = match &stored.reading {
            Reading::Dense { location, elem } => (*location, *elem),
            Reading::View(_) => raw_constant(catalog, stored).ok_or_else(|| {
                Error::invalid(format!(
                    "{quoted}: {} ({}) takes no float values and its bytes are not of a type ptefs writes",
                    stored.path, stored.what
                ))
            })?,
        };
        let need = index
            .numel()
            .checked_mul(to.size())
            .filter(|&n| n == location.range.len())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{quoted}: {} holds {} bytes, not {} values of {}",
                    stored.path,
                    location.range.len(),
                    index.numel(),
                    to.name()
                ))
            })?;
        let bytes = if index.is_identity() && factor == 1.0 && elem == to && is_float(elem) {
            refuse_not_finite(&quoted, source, elem)?;
            Bytes::Staged(source)
        } else {
            let out = self.values(&quoted, source, elem, &index, factor, to)?;
            debug_assert_eq!(out.len() as u64, need);
            Bytes::Owned(out)
        };
        Ok(Item {
            name,
            content: Content::Stored {
                location,
                of: stored.of,
                bytes,
            },
        })
    }

    /// The values of checkpoint tensor `source` (of `elem`) in the stored order `index`
    /// gives, times `factor`, as bytes of `to`.
    fn values(
        &self, name: &str, source: Source, elem: Elem, index: &IndexMap, factor: f64, to: Elem,
    ) -> Result<Vec<u8>> {
        let len = usize::try_from(source.len()).map_err(|_| Error::invalid("too large"))?;
        let mut bytes = vec![0u8; len];
        source
            .read_at(0, &mut bytes)
            .map_err(|e| Error::io("read the update", e))?;
        reorder(name, &bytes, elem, index, factor, to)
    }
}

/// The values of checkpoint tensor `bytes` (of `elem`) in the stored order `index` gives,
/// times `factor`, as bytes of `to`: moved a run of the stored order at a time
/// (`IndexMap::runs`). float32 to float32 unscaled copies each run's bytes once its values
/// are known finite: a float32 made `f64`, times 1 and made float32 again is itself.
fn reorder(
    name: &str, bytes: &[u8], elem: Elem, index: &IndexMap, factor: f64, to: Elem,
) -> Result<Vec<u8>> {
    let numel = index.numel();
    let out_len = usize::try_from(numel * to.size()).map_err(|_| Error::invalid("too large"))?;
    let mut out = Vec::with_capacity(out_len);
    let copy = elem == Elem::F32 && to == Elem::F32 && factor == 1.0;
    let refuse = |c: u64, v: f64, why: String| {
        Error::invalid(format!(
            "{name}: element {c} ({v}) {why}, so nothing was written"
        ))
    };
    index.runs(|first, stride, n| {
        let (first, stride, n) = (first as usize, stride as usize, n as usize);
        if copy && stride == 1 {
            let run = &bytes[first * 4..(first + n) * 4];
            for (k, b) in run.chunks_exact(4).enumerate() {
                let x = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                if !x.is_finite() {
                    let c = (first + k) as u64;
                    return Err(refuse(c, f64::from(x), "is not a finite value".into()));
                }
            }
            out.extend_from_slice(run);
            return Ok(());
        }
        for k in 0..n {
            let c = first + k * stride;
            let v = elem.get(bytes, c) * factor;
            encode(v, to, &mut out).map_err(|why| refuse(c as u64, v, why))?;
        }
        Ok(())
    })?;
    Ok(out)
}

/// `reorder` one element at a time through `IndexMap::source`: what the runs must equal.
#[cfg(test)]
fn reorder_each(
    bytes: &[u8], elem: Elem, index: &IndexMap, factor: f64, to: Elem,
) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for s in 0..index.numel() {
        let c = index.source(s) as usize;
        encode(elem.get(bytes, c) * factor, to, &mut out)?;
    }
    Ok(out)
}

fn is_float(e: Elem) -> bool {
    matches!(e, Elem::F64 | Elem::F32 | Elem::F16 | Elem::BF16)
}

/// Refuses a float tensor with an element that is not finite.
fn refuse_not_finite(name: &str, source: Source, elem: Elem) -> Result<()> {
    let size = elem.size() as usize;
    let mut buf = Vec::new();
    let mut at = 0u64;
    let mut bad = None;
    // safetensors tensors start on element boundaries and chunks are large multiples of 8.
    source
        .for_each_chunk(&mut buf, |chunk| {
            if bad.is_none() {
                for i in 0..chunk.len() / size {
                    let v = elem.get(chunk, i);
                    if !v.is_finite() {
                        bad = Some((at + i as u64, v));
                        break;
                    }
                }
            }
            at += (chunk.len() / size) as u64;
            Ok(())
        })
        .map_err(|e| Error::io("read the update", e))?;
    match bad {
        Some((i, v)) => Err(Error::invalid(format!(
            "{name}: element {i} is {v}, not a finite value, so nothing was written"
        ))),
        None => Ok(()),
    }
}

/// `v` as an element of `to`, appended to `out`; why not when it does not fit.
fn encode(v: f64, to: Elem, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    if !v.is_finite() {
        return Err("is not a finite value".into());
    }
    let int = |lo: f64, hi: f64| {
        if v.fract() != 0.0 || v < lo || v > hi {
            Err(format!("does not fit {}", to.name()))
        } else {
            Ok(v)
        }
    };
    match to {
        Elem::F64 => out.extend_from_slice(&v.to_le_bytes()),
        Elem::F32 | Elem::F16 | Elem::BF16 => {
            let f = v as f32;
            if !f.is_finite() {
                return Err(format!("does not fit {}", to.name()));
            }
            match to {
                Elem::F32 => out.extend_from_slice(&f.to_le_bytes()),
                Elem::F16 => {
                    let h = f32_to_f16(f);
                    if h & 0x7c00 == 0x7c00 {
                        return Err("does not fit F16".into());
                    }
                    out.extend_from_slice(&h.to_le_bytes())
                }
                _ => {
                    let b = f32_to_bf16(f);
                    if b & 0x7f80 == 0x7f80 {
                        return Err("does not fit BF16".into());
                    }
                    out.extend_from_slice(&b.to_le_bytes())
                }
            }
        }
        Elem::I64 => out.extend_from_slice(
            &(int(-9.223372036854776e18, 9.223372036854775e18)? as i64).to_le_bytes(),
        ),
        Elem::I32 => {
            out.extend_from_slice(&(int(i32::MIN.into(), i32::MAX.into())? as i32).to_le_bytes())
        }
        Elem::I16 => {
            out.extend_from_slice(&(int(i16::MIN.into(), i16::MAX.into())? as i16).to_le_bytes())
        }
        Elem::I8 => out.push(int(i8::MIN.into(), i8::MAX.into())? as i8 as u8),
        Elem::U64 => out.extend_from_slice(&(int(0.0, 1.844674407370955e19)? as u64).to_le_bytes()),
        Elem::U32 => out.extend_from_slice(&(int(0.0, u32::MAX.into())? as u32).to_le_bytes()),
        Elem::U16 => out.extend_from_slice(&(int(0.0, u16::MAX.into())? as u16).to_le_bytes()),
        Elem::U8 => out.push(int(0.0, u8::MAX.into())? as u8),
        Elem::Bool => out.push(int(0.0, 1.0)? as u8),
    }
    Ok(())
}

/// A payload constant whose float view takes no writes (half-precision constants): its
/// bytes and their type, when they are exactly as many as its elements need.
fn raw_constant(
    catalog: &Catalog, stored: &Stored,
) -> Option<(crate::format::layout::Location, Elem)> {
    let (p, j, value) = stored.constant?;
    let dec = catalog.payloads.get(p, j)?;
    let k = dec.payload.value_index(value)?;
    let constant = dec.payload.constant(k)?;
    let (descr, shape) = constant.npy.as_ref()?;
    let elem = Elem::of_npy_descr(descr)?;
    let location = dec.locate(&catalog.model, &constant.bytes)?;
    let numel: u64 = shape.iter().product();
    (numel == stored.numel() && numel * elem.size() == location.range.len())
        .then_some((location, elem))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::transform::{Direction, Transform};

    /// The runs give the bytes the per-element mapping gives, for every kind of transform,
    /// unscaled (float32 runs copied) and scaled, to float32 and half precision.
    #[test]
    fn runs_equal_the_per_element_mapping() {
        let cases: [(Transform, &[u64], &[u64]); 4] = [
            (Transform::Identity, &[6, 8], &[1, 6, 8]),
            (
                Transform::Rotary {
                    direction: Direction::HfToMeta,
                    heads: 2,
                },
                &[8, 6],
                &[8, 6],
            ),
            (
                Transform::Rotary {
                    direction: Direction::MetaToHf,
                    heads: 1,
                },
                &[12, 4],
                &[12, 4],
            ),
            (
                Transform::Axes {
                    order: vec![0, 2, 3, 1],
                },
                &[2, 4, 3, 2],
                &[2, 3, 2, 4],
            ),
        ];
        for (t, ckpt, stored) in cases {
            let index = IndexMap::new(&t, ckpt, stored).expect("shapes fit");
            let values: Vec<f32> = (0..index.numel())
                .map(|i| (i as f32 - 20.0) * 0.37 + if i == 3 { -0.0 } else { 1e-40 })
                .collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            for (factor, to) in [(1.0, Elem::F32), (0.5, Elem::F32), (1.0, Elem::F16)] {
                let runs = reorder("w", &bytes, Elem::F32, &index, factor, to).unwrap();
                let each = reorder_each(&bytes, Elem::F32, &index, factor, to).unwrap();
                assert_eq!(runs, each, "{t}, x{factor}, {to:?}");
            }
        }
        // A value that is not finite is refused by its checkpoint index, as before.
        let index = IndexMap::new(
            &Transform::Rotary {
                direction: Direction::HfToMeta,
                heads: 1,
            },
            &[4, 2],
            &[4, 2],
        )
        .unwrap();
        let mut values = [1f32; 8];
        values[5] = f32::INFINITY;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let e = reorder("w", &bytes, Elem::F32, &index, 1.0, Elem::F32).unwrap_err();
        assert!(
            e.to_string()
                .contains("element 5 (inf) is not a finite value"),
            "{e}"
        );
    }
}
