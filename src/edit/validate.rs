//! Validation of new content (docs/writes.md#validation): what each writable file accepts, and
//! the plan for writing it. Messages say what was expected and what was found.

use crate::format::generated::pte_fb;
use crate::format::layout::{FileIndex, Location, TensorShape};
use crate::format::sharing::TensorId;
use crate::format::{npy, Model, WriteTarget};
use crate::format::{scalar_type, Kind};

use super::plan::{Change, Owner, Plan};
use crate::catalog::Catalog;
use crate::content::{Bytes, Source, Write};
use crate::error::{Error, Result};
use crate::format::safetensors::{Entry, TensorInfo};
use crate::format::target::WeightsView;

fn exact_size(location: Location, what: &str, data: Source) -> Result<()> {
    let need = location.range.len();
    if data.len() != need {
        return Err(Error::invalid(format!(
            "needs {need} bytes for {what}, got {}",
            data.len()
        )));
    }
    Ok(())
}

/// Whether a `.npy` of dtype `found` may replace a tensor whose `.npy` has dtype `want`
/// (both as NumPy names a dtype once read, `dtype.str`, so `'=f4'` is `<f4` and `'>u1'` is
/// `|u1`): the same type, or, for a raw 16-bit type (`|V2`: bfloat16 and bits16, which NumPy
/// lacks), little-endian `u2`/`i2`, as NumPy users hold such tensors (`a.view(np.uint16)`).
/// The bytes are taken as they are; the shape is checked as for any other type.
fn descr_accepted(found: &str, want: &str) -> bool {
    found == want || want == "|V2" && (found == "<u2" || found == "<i2")
}

/// The largest inline delegate payload: it is held in memory and copied into the program's
/// flatbuffer, which is rebuilt around it. ExecuTorch itself moves payloads of this size
/// into segments.
const MAX_INLINE: u64 = 64 << 20;

/// What a `.npy` must declare: its dtype (and the type's true name, for messages), its
/// shape, and how many data bytes follow.
struct NpyWant<'w> {
    descr: &'w str,
    what: &'w str,
    shape: &'w [u64],
    nbytes: u64,
}

fn tensor_npy_want(shape: &TensorShape) -> (String, String, Vec<u64>) {
    (
        scalar_type::numpy_descr(shape.scalar_type).unwrap_or_default(),
        shape.describe(),
        shape.physical_shape().unwrap_or_default(),
    )
}

fn check_npy<'a>(want: NpyWant, data: Source<'a>) -> Result<Source<'a>> {
    let header = npy::parse_header(&data.head(npy::MAX_HEADER_LEN)?)?;
    let want_descr = want.descr;
    if !descr_accepted(&header.descr, want_descr) {
        let also = if want_descr == "|V2" {
            " or '<u2'/'<i2'"
        } else {
            ""
        };
        return Err(Error::invalid(format!(
            ".npy dtype differs: expected '{want_descr}'{also} ({}), found '{}'",
            want.what, header.descr
        )));
    }
    let want_shape = want.shape;
    if header.shape != want_shape {
        return Err(Error::invalid(format!(
            ".npy shape differs: expected {want_shape:?}, found {:?}",
            header.shape
        )));
    }
    if !header.is_c_order() {
        return Err(Error::invalid(
            ".npy is in Fortran order: expected C order (save np.ascontiguousarray(a))",
        ));
    }
    let at = header.data_offset as u64;
    let body = data.slice(at, data.len() - at)?;
    if body.len() != want.nbytes {
        return Err(Error::invalid(format!(
            ".npy data is {} bytes: expected {} for {}",
            body.len(),
            want.nbytes,
            want.what
        )));
    }
    Ok(body)
}

fn in_place(location: Location, bytes: Source, of: Option<TensorId>) -> Plan {
    Plan::InPlace {
        writes: vec![Write {
            location,
            bytes: Bytes::Staged(bytes),
            of,
        }],
    }
}

/// Decides how `data` becomes the new content of `target`, or why it cannot: what the file
/// accepts, then the quantization parameters the new bytes land on (`params`).
pub fn plan<'a>(catalog: &Catalog, target: &WriteTarget, data: Source<'a>) -> Result<Plan<'a>> {
    let plan = plan_target(catalog, target, data)?;
    super::params::check(catalog, &plan)?;
    Ok(plan)
}

/// What `target` accepts, and the plan for writing `data` there.
fn plan_target<'a>(catalog: &Catalog, target: &WriteTarget, data: Source<'a>) -> Result<Plan<'a>> {
    let model = &*catalog.model;
    match target {
        WriteTarget::TensorBin {
            location,
            shape,
            of,
        } => {
            exact_size(*location, &shape.describe(), data)?;
            Ok(in_place(*location, data, Some(*of)))
        }
        WriteTarget::TensorNpy {
            location,
            shape,
            of,
        } => {
            let (descr, what, shape) = tensor_npy_want(shape);
            let want = NpyWant {
                descr: &descr,
                what: &what,
                shape: &shape,
                nbytes: location.range.len(),
            };
            let bytes = check_npy(want, data)?;
            Ok(in_place(*location, bytes, Some(*of)))
        }
        WriteTarget::PayloadConstant { location, what, of } => {
            exact_size(*location, what, data)?;
            Ok(in_place(*location, data, *of))
        }
        WriteTarget::PayloadConstantNpy {
            location,
            descr,
            shape,
            what,
            of,
        } => {
            let want = NpyWant {
                descr,
                what,
                shape,
                nbytes: location.range.len(),
            };
            let bytes = check_npy(want, data)?;
            Ok(in_place(*location, bytes, *of))
        }
        WriteTarget::Weights { view } => {
            let hint = |t: &TensorInfo, mine: Option<&Entry>| weights_hint(catalog, *view, t, mine);
            super::bulk::plan(catalog, &catalog.weights(*view).entries, data, Some(&hint))
                .map(|(p, _)| p)
        }
        WriteTarget::PayloadConstantF32 {
            plan,
            delegate,
            value,
        } => super::float::plan(catalog, *plan, *delegate, *value, data),
        WriteTarget::Segment {
            location, index, ..
        } => {
            if data.len() != location.range.len() {
                return Err(Error::invalid(format!(
                    "segment {index} must keep its size: expected {} bytes, got {} (resize a blob or delegate payload instead)",
                    location.range.len(),
                    data.len()
                )));
            }
            Ok(in_place(*location, data, None))
        }
        WriteTarget::Blob { file, named_index } => {
            let (location, segment) = blob_location(model, *file, *named_index)?;
            if data.len() == location.range.len() {
                return Ok(in_place(
                    location,
                    data,
                    Some(TensorId::key(*file, *named_index)),
                ));
            }
            // Other keys on the same segment are distinct tensors: they keep the old
            // segment, and this key gets a new one of the new size.
            let change = if segment_shared(model, *file, *named_index, segment) {
                Change::OwnBytes {
                    own: vec![(
                        Owner::Key {
                            index: *named_index,
                        },
                        Bytes::Staged(data),
                    )],
                    patches: Vec::new(),
                }
            } else {
                Change::Segment {
                    index: segment,
                    data,
                }
            };
            Ok(Plan::Relayout {
                file: *file,
                change,
            })
        }
        // Planned against the name map (`names::update::plan_write`), which this layer
        // does not hold.
        WriteTarget::NameNpy { .. } | WriteTarget::NamesSafetensors => Err(Error::invalid(
            "a file of the named views is written by name, against the name map",
        )),
        WriteTarget::DelegatePayload { plan, delegate } => {
            let layout = model
                .pte_layout
                .as_ref()
                .ok_or_else(|| Error::invalid("not a .pte"))?;
            let location = layout.plans[*plan].delegates[*delegate].clone()?;
            if data.len() == location.range.len() {
                return Ok(in_place(location, data, None));
            }
            let pte = model.pte().ok_or_else(|| Error::invalid("not a .pte"))?;
            let d = &pte.program.execution_plan.as_deref().unwrap_or_default()[*plan]
                .delegates
                .as_deref()
                .unwrap_or_default()[*delegate];
            let r = d
                .processed
                .as_ref()
                .ok_or_else(|| Error::invalid("delegate has no processed data reference"))?;
            let index = r.index as usize;
            let change = if r.location == pte_fb::DataLocation::SEGMENT {
                Change::Segment { index, data }
            } else {
                if data.len() > MAX_INLINE {
                    return Err(Error::new(
                        libc::EFBIG,
                        format!(
                            "an inline delegate payload may hold at most {MAX_INLINE} bytes (it lives inside the program's flatbuffer, which is rebuilt around it in memory; export with segments for larger ones); got {}",
                            data.len()
                        ),
                    ));
                }
                Change::InlineDelegate {
                    index,
                    data: data.head(data.len())?,
                }
            };
            Ok(Plan::Relayout { file: 0, change })
        }
    }
}

/// Where a tensor that does not fit the `weights.safetensors` of `view` belongs instead: a
/// data file's own view lists only its tensors, as raw bytes where no layout of its own
/// types them, while the root's lists every file's, typed by the payloads that read them.
fn weights_hint(
    catalog: &Catalog, view: WeightsView, t: &TensorInfo, mine: Option<&Entry>,
) -> Option<String> {
    match view {
        WeightsView::File(_) => {
            let root = &catalog.weights(WeightsView::Root).entries;
            let e = root.iter().find(|e| e.name == t.name)?;
            Some(format!(
                "the root weights.safetensors of the mount takes it, as {}{:?}",
                e.dtype, e.shape
            ))
        }
        WeightsView::Root => {
            let e = mine?;
            let (file, len) = (e.location.file, e.location.range.len());
            let raw_upload = t.dtype == "U8" && t.shape == [len];
            if file > 0 && raw_upload {
                return Some(format!(
                    "{}weights.safetensors takes it as raw bytes, U8[{len}]",
                    catalog.names.file_prefix(file),
                ));
            }
            // A data file mounted alone cannot know how a program reads its blobs.
            let alone = matches!(catalog.model.files[0].kind, Kind::Ptd(_));
            let raw_here = e.dtype == "U8" && e.shape == [len];
            let same_size = t.end.checked_sub(t.begin) == Some(len);
            (alone && raw_here && same_size).then(|| {
                format!(
                    "a data file mounted alone shows its blobs as raw bytes; write it as U8[{len}], or mount the program that reads it with --data to write it as {}{:?}",
                    t.dtype, t.shape
                )
            })
        }
    }
}

/// Whether a named-data entry of file `file` other than `k` uses segment `segment`.
fn segment_shared(model: &Model, file: FileIndex, k: usize, segment: usize) -> bool {
    match &model.files[file].kind {
        Kind::Pte(p) => p
            .program
            .named_data
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
            .any(|(i, n)| i != k && n.segment_index as usize == segment),
        Kind::Ptd(_) => model.ptd_blobs[file]
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
            .any(|(i, b)| i != k && b.segment_index as usize == segment),
    }
}

fn blob_location(model: &Model, file: FileIndex, k: usize) -> Result<(Location, usize)> {
    match &model.files[file].kind {
        Kind::Pte(p) => {
            let layout = model.pte_layout.as_ref().expect("a .pte is resolved");
            let loc = layout.named_data[k].clone()?;
            let seg = p.program.named_data.as_deref().unwrap_or_default()[k].segment_index as usize;
            Ok((loc, seg))
        }
        Kind::Ptd(_) => {
            let blob = &model.ptd_blobs[file].as_deref().unwrap_or_default()[k];
            let loc = blob.location.clone()?;
            Ok((loc, blob.segment_index as usize))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_16_bit_types_accept_little_endian_u2_and_i2() {
        for found in ["<u2", "<i2", "|V2"] {
            assert!(descr_accepted(found, "|V2"), "{found}");
        }
        for found in [">u2", ">i2", "<f2", "|V1", "<u4", "|u1"] {
            assert!(!descr_accepted(found, "|V2"), "{found}");
        }
        // Only raw types widen: a HALF tensor still needs `<f2`, a SHORT `<i2`.
        assert!(!descr_accepted("<u2", "<f2"));
        assert!(!descr_accepted("<u2", "<i2"));
    }
}
