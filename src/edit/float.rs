//! Writes of the float32 view of a payload constant (`<backend>/values/<id>.f32.npy`,
//! docs/writes.md#xnnpack-constants): the `.npy` is checked against the view, the backend
//! converts the array into new bytes for the constant and whatever must change with it
//! (scales, a bias in the filter's units), and those go into one commit.
//!
//! Invariants: the value is found in the catalog's payloads, decoded from the same bytes
//! the commit writes over; nothing is written unless the whole array converts; a blob
//! (named-data key, or payload bytes) that another value of any decoded payload reads too,
//! as its constant or its scales, is never rewritten (the write is refused instead; a key
//! that merely shares its segment with another key gets bytes of its own, see `identity`);
//! every write of one commit lies in one file, so the weights, their scales and a rescaled
//! bias change together or not at all.

use super::plan::Plan;
use crate::backend::{BlobRef, BlobWrite};
use crate::catalog::Catalog;
use crate::content::{Bytes, Source, Write};
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::sharing::TensorId;
use crate::format::{npy, Model};

/// The write a plan carries: with the named-data entry it belongs to, so that a key whose
/// segment another key shares gets bytes of its own.
fn into_write(model: &Model, w: BlobWrite) -> Write<'static> {
    let of = match &w.bytes {
        BlobRef::Named { key, .. } => model
            .named_blob(key)
            .map(|(file, k, _)| TensorId::key(file, k)),
        BlobRef::Payload { .. } => None,
    };
    Write {
        location: w.at,
        bytes: Bytes::Owned(w.new),
        of,
    }
}

/// The named-data entry a key names, as the runtime finds keys.
type Entry = Option<(usize, usize)>;

fn entry(model: &Model, b: &BlobRef) -> Entry {
    match b {
        BlobRef::Named { key, .. } => model.named_blob(key).map(|(file, index, _)| (file, index)),
        BlobRef::Payload { .. } => None,
    }
}

/// Whether two references name the same bytes: one named-data entry (`a_entry`, `b_entry`
/// their `entry`, looked up once by the caller), or overlapping bytes of the payloads at
/// `a_payload` and `b_payload`.
fn same_bytes(
    model: &Model, a: &BlobRef, a_entry: Entry, a_payload: Location, b: &BlobRef,
    b_entry: impl FnOnce() -> Entry, b_payload: Location,
) -> bool {
    match (a, b) {
        (BlobRef::Named { key: x, .. }, BlobRef::Named { key: y, .. }) => {
            x == y || a_entry.is_some_and(|e| Some(e) == b_entry())
        }
        (BlobRef::Payload { .. }, BlobRef::Payload { .. }) => {
            let at = |r, p| crate::backend::locate(model, p, r);
            match (at(a, a_payload), at(b, b_payload)) {
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

/// Refuses `writes` when another value of the model (in any decoded payload) reads what
/// they change, as its constant or its scales: new weights or fresh scales would silently
/// change that value too.
fn refuse_shared(
    catalog: &Catalog, plan: usize, delegate: usize, payload: Location, what: &str,
    writes: &[BlobWrite],
) -> Result<()> {
    let model = &*catalog.model;
    // Every blob of the model is compared with these few writes: each key is looked up once.
    let entries: Vec<Entry> = writes.iter().map(|w| entry(model, &w.bytes)).collect();
    for (&(p, j), other) in catalog.payloads.iter() {
        for blob in other.payload.blobs() {
            let blob_entry = std::cell::OnceCell::new();
            let hit = writes.iter().zip(&entries).find(|(w, &e)| {
                (p, j, blob.value, blob.role) != (plan, delegate, w.value, w.role)
                    && same_bytes(
                        model,
                        &w.bytes,
                        e,
                        payload,
                        &blob.bytes,
                        || *blob_entry.get_or_init(|| entry(model, &blob.bytes)),
                        other.location,
                    )
            });
            let hit = hit.map(|(w, _)| w);
            if let Some(w) = hit {
                return Err(Error::invalid(format!(
                    "{what}: value %{} of plan {p} delegate {j} reads the {} of %{} (in {}) too, as its own {}: \
                     re-quantizing would change that value as well; write the raw bytes (.bin or .npy) instead",
                    blob.value,
                    w.role.part(),
                    w.value,
                    model.files[w.at.file].path.display(),
                    blob.role.part(),
                )));
            }
        }
    }
    Ok(())
}

/// Refuses `writes` that span more than one file: a commit is atomic within one file only.
fn refuse_several_files(model: &Model, what: &str, writes: &[BlobWrite]) -> Result<()> {
    let Some(first) = writes.first() else {
        return Ok(());
    };
    if let Some(w) = writes.iter().find(|w| w.at.file != first.at.file) {
        let name = |w: &BlobWrite| model.files[w.at.file].path.display().to_string();
        return Err(Error::invalid(format!(
            "{what}: the {} of %{} are in {} and the {} of %{} in {}; a commit is atomic within one file only, so they cannot change together",
            first.role.part(),
            first.value,
            name(first),
            w.role.part(),
            w.value,
            name(w)
        )));
    }
    Ok(())
}

/// Decides the writes that make `data` (a `.npy` of float32) the new value of constant
/// `value` of delegate (`plan`, `delegate`).
pub fn plan<'a>(
    catalog: &Catalog, plan: usize, delegate: usize, value: u32, data: Source<'a>,
) -> Result<Plan<'a>> {
    let model = &*catalog.model;
    let dec = catalog.payloads.get(plan, delegate).ok_or_else(|| {
        Error::new(
            libc::ESTALE,
            format!("plan {plan} delegate {delegate}: no decoded payload any more"),
        )
    })?;
    let k = dec.payload.value_index(value).ok_or_else(|| {
        Error::new(
            libc::ESTALE,
            format!("plan {plan} delegate {delegate} has no value %{value} any more"),
        )
    })?;
    let what = match dec.payload.constant(k) {
        Some(c) => format!("%{value} ({})", c.what),
        None => format!("%{value}"),
    };
    let view = dec.float_view(model, k).ok_or_else(|| {
        Error::invalid(format!(
            "{what}: its bytes or scales are not at hand, or no longer of the size its datatype and dims need"
        ))
    })?;
    let dims = view.layout.shape();
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
    Ok(Plan::InPlace {
        writes: body_writes(catalog, plan, delegate, value, body)?,
    })
}

/// The writes that make `body` (little-endian float32 values, as many as the float view
/// of constant `value` of delegate (`plan`, `delegate`) has) its new value: what a
/// `.f32.npy` write does with the array it holds, for bulk updates too
/// (docs/writes.md#float-values-for-quantized-constants).
pub fn body_writes(
    catalog: &Catalog, plan: usize, delegate: usize, value: u32, body: Source,
) -> Result<Vec<Write<'static>>> {
    let model = &*catalog.model;
    let dec = catalog.payloads.get(plan, delegate).ok_or_else(|| {
        Error::new(
            libc::ESTALE,
            format!("plan {plan} delegate {delegate}: no decoded payload any more"),
        )
    })?;
    let what = match dec
        .payload
        .value_index(value)
        .and_then(|k| dec.payload.constant(k))
    {
        Some(c) => format!("%{value} ({})", c.what),
        None => format!("%{value}"),
    };
    let writes = dec
        .payload
        .plan_float_write(model, dec.location, value, body)?;
    refuse_shared(catalog, plan, delegate, dec.location, &what, &writes)?;
    refuse_several_files(model, &what, &writes)?;
    Ok(writes.into_iter().map(|w| into_write(model, w)).collect())
}

/// A quantized payload constant whose float32 view a float array can be written to
/// (re-quantized): the delegate (plan, delegate), the value's id, and the shape of its
/// float view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloatTarget {
    pub plan: usize,
    pub delegate: usize,
    pub value: u32,
    pub shape: Vec<u64>,
}

/// The quantized constant that named-data key `key` holds, when a float array written to
/// it is re-quantized: the first value of a decoded payload that reads it as its constant.
pub fn float_target(catalog: &Catalog, key: &str) -> Option<FloatTarget> {
    let model = &*catalog.model;
    let u = catalog
        .payloads
        .uses_of(key)
        .iter()
        .find(|u| u.blob.role == crate::backend::KeyRole::Constant)?;
    let dec = catalog.payloads.get(u.plan, u.delegate)?;
    let k = dec.payload.value_index(u.blob.value)?;
    if !dec.payload.float_writable(k) {
        return None;
    }
    let view = dec.float_view(model, k)?;
    Some(FloatTarget {
        plan: u.plan,
        delegate: u.delegate,
        value: u.blob.value,
        shape: view.layout.shape(),
    })
}
