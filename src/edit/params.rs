//! Quantization parameters a commit lands on (docs/writes.md#quantization-parameters): new
//! bytes for a range that a decoded delegate payload reads as scales are checked by the
//! payload's backend (`Payload::check_blob`) before anything is written, whichever file they
//! come through: `named_data/<key>.bin`, a payload value's `.bin` or `.npy`, `segments/<n>`,
//! `weights.safetensors` and `ptefs apply`, or a delegate payload rewritten whole (whose new
//! graph is decoded, and its own scales checked).
//!
//! Invariants: only scales whose bytes the plan changes are checked, so a file whose other
//! scales are already refused (`check` reports them) can still be edited elsewhere; a
//! refusal names the value, the scale index and the value found; of each blob only the bytes
//! its graph needs are read, and a rewritten payload is decoded only up to
//! `MAX_REDECODED` bytes.

use std::borrow::Cow;

use super::plan::{Change, Owner, Plan};
use crate::backend::{Blob, BlobRef, KeyRole, Payload};
use crate::catalog::{Catalog, Decoded};
use crate::content::Source;
use crate::error::{Error, Result};
use crate::format::layout::{FileIndex, Location, NamedEntry};
use crate::format::{Kind, Model};

/// The largest delegate payload whose new bytes are decoded to check the scales they hold.
/// Payloads keep their constants in named data, and real ones are a few MiB at most.
const MAX_REDECODED: u64 = 64 << 20;

/// New bytes for a range of a model file, as a plan writes them.
struct Landing<'a> {
    at: Location,
    data: Source<'a>,
    /// The range takes content of another size (a re-layout): only a blob that is the
    /// whole range can be followed.
    resized: bool,
    /// The content is for this named-data entry alone (it gets a segment of its own), not
    /// for whatever else shares its bytes.
    only: Option<NamedEntry>,
}

fn overlaps(a: &Location, b: &Location) -> bool {
    a.file == b.file && a.range.start() < b.range.end() && b.range.start() < a.range.end()
}

fn segment_of(model: &Model, file: FileIndex, index: usize) -> Option<Location> {
    let range = match &model.files[file].kind {
        Kind::Pte(p) => p.segments.get(index)?,
        Kind::Ptd(p) => p.segments.get(index)?,
    };
    Some(Location {
        file,
        range: *range,
    })
}

fn named_entry_at(model: &Model, file: FileIndex, k: usize) -> Option<Location> {
    match &model.files[file].kind {
        Kind::Pte(_) => model.pte_layout.as_ref()?.named_data.get(k)?.clone().ok(),
        Kind::Ptd(_) => model.ptd_blobs[file]
            .as_ref()?
            .get(k)?
            .location
            .clone()
            .ok(),
    }
}

/// Every range `plan` gives new bytes, with those bytes.
fn landings<'p>(model: &Model, plan: &'p Plan<'_>) -> Vec<Landing<'p>> {
    let same = |at: Location, data: Source<'p>| Landing {
        at,
        data,
        resized: false,
        only: None,
    };
    let mut out = Vec::new();
    let mut change = |file: FileIndex, change: &'p Change<'_>| match change {
        Change::Segment { index, data } => {
            if let Some(at) = segment_of(model, file, *index) {
                out.push(Landing {
                    at,
                    data: *data,
                    resized: true,
                    only: None,
                });
            }
        }
        Change::InlineDelegate { index, data } => {
            let at = model
                .pte()
                .and_then(|p| *p.inline_delegate_data.get(*index)?);
            if let Some(range) = at {
                out.push(Landing {
                    at: Location { file, range },
                    data: Source::Memory(data),
                    resized: true,
                    only: None,
                });
            }
        }
        Change::OwnBytes { own, patches } => {
            for (owner, bytes) in own {
                // Program constants and initial states are read by no delegate payload.
                let Owner::Key { index } = owner else {
                    continue;
                };
                if let Some(at) = named_entry_at(model, file, *index) {
                    out.push(Landing {
                        at,
                        data: bytes.source(),
                        resized: true,
                        only: Some((file, *index)),
                    });
                }
            }
            for (range, bytes) in patches {
                out.push(same(
                    Location {
                        file,
                        range: *range,
                    },
                    bytes.source(),
                ));
            }
        }
    };
    match plan {
        Plan::InPlace { writes } => {
            return writes
                .iter()
                .map(|w| same(w.location, w.bytes.source()))
                .collect()
        }
        Plan::Relayout { file, change: c } => change(*file, c),
        Plan::Separate {
            relayouts,
            in_place,
        } => {
            for (file, c) in relayouts {
                change(*file, c);
            }
            out.extend(in_place.iter().map(|w| same(w.location, w.bytes.source())));
        }
    }
    out
}

/// The landings of a plan, sorted so that those over a range are found by bisection (a bulk
/// update writes thousands of ranges, and a model has thousands of scale blobs).
struct Landings<'a> {
    /// Landings over ranges, by file and start, with the largest end up to each.
    ranges: Vec<(Landing<'a>, (FileIndex, u64))>,
    /// Landings for one named-data entry alone.
    keyed: Vec<Landing<'a>>,
}

impl<'a> Landings<'a> {
    fn new(all: Vec<Landing<'a>>) -> Landings<'a> {
        let (keyed, mut ranges): (Vec<_>, Vec<_>) = all.into_iter().partition(|l| l.only.is_some());
        ranges.sort_by_key(|l| (l.at.file, l.at.range.start()));
        let mut reach = (0, 0);
        let ranges = ranges
            .into_iter()
            .map(|l| {
                let end = (l.at.file, l.at.range.end());
                reach = if reach.0 == end.0 {
                    (end.0, reach.1.max(end.1))
                } else {
                    end
                };
                (l, reach)
            })
            .collect();
        Landings { ranges, keyed }
    }

    fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.keyed.is_empty()
    }

    /// The landings over ranges that overlap `at`, in order.
    fn over<'s>(&'s self, at: &Location) -> impl Iterator<Item = &'s Landing<'a>> + 's {
        let at = *at;
        let from = self
            .ranges
            .partition_point(|(_, reach)| *reach <= (at.file, at.range.start()));
        let to = self
            .ranges
            .partition_point(|(l, _)| (l.at.file, l.at.range.start()) < (at.file, at.range.end()));
        self.ranges[from..to.max(from)]
            .iter()
            .map(|(l, _)| l)
            .filter(move |l| overlaps(&l.at, &at))
    }
}

fn read_source(data: Source, offset: u64, len: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    data.read_at(offset, &mut buf)
        .map_err(|e| Error::io("read the new content", e))?;
    Ok(buf)
}

/// The bytes of `at` after the plan, up to `want` bytes (the blob's range is `at`, and it is
/// named-data entry `entry` when it is one); None when no landing changes them or none can
/// be followed.
fn after(
    model: &Model, at: Location, want: u64, entry: Option<NamedEntry>, lands: &Landings,
) -> Result<Option<Vec<u8>>> {
    if let Some(l) = lands
        .keyed
        .iter()
        .find(|l| entry.is_some() && l.only == entry)
    {
        return read_source(l.data, 0, want.min(l.data.len())).map(Some);
    }
    let mut out: Option<Vec<u8>> = None;
    for l in lands.over(&at) {
        if l.resized {
            if l.at.range.start() == at.range.start() {
                return read_source(l.data, 0, want.min(l.data.len())).map(Some);
            }
            continue;
        }
        let cut = at.range.prefix(want);
        let buf = match &mut out {
            Some(b) => b,
            None => out.insert(
                model.files[at.file]
                    .read(cut)
                    .map_err(|e| Error::new(libc::EIO, e.to_string()))?
                    .into_owned(),
            ),
        };
        let start = l.at.range.start().max(cut.start());
        let end = l.at.range.end().min(cut.end());
        if start < end {
            let from = start - l.at.range.start();
            let to = (start - cut.start()) as usize;
            l.data
                .read_at(from, &mut buf[to..to + (end - start) as usize])
                .map_err(|e| Error::io("read the new content", e))?;
        }
    }
    Ok(out)
}

/// What `blob` of a payload at `payload` holds now, up to the bytes its graph needs.
fn now<'m>(model: &'m Model, payload: Location, blob: &Blob) -> Option<Cow<'m, [u8]>> {
    let at = crate::backend::locate(model, payload, &blob.bytes)?;
    let range = at.range.prefix(blob.expected?);
    model.files[at.file].read(range).ok()
}

/// The named-data entry a blob reference names, when it names one the files at hand have.
fn entry_of(model: &Model, r: &BlobRef) -> Option<NamedEntry> {
    match r {
        BlobRef::Named { key, .. } => model.named_blob(key).map(|(f, k, _)| (f, k)),
        BlobRef::Payload { .. } => None,
    }
}

/// The refusal of new bytes of value `b`'s scales, in the payload of delegate `(p, j)`.
fn refusal(
    catalog: &Catalog, p: usize, j: usize, payload: &dyn Payload, b: &Blob, why: &str,
) -> Error {
    let plan = catalog.names.plans.get(p).map_or("?", String::as_str);
    Error::invalid(format!(
        "plans/{plan}/delegates/{j}/{}/values/{} ({}) reads these bytes as its scales: {why}",
        payload.backend().dir_name(),
        b.value,
        b.describe
    ))
}

/// The new bytes of the payload `dec`, when the plan changes any (and they are at most
/// `MAX_REDECODED` bytes); None otherwise.
fn new_payload(model: &Model, dec: &Decoded, lands: &Landings) -> Result<Option<Vec<u8>>> {
    let at = dec.location;
    if lands.over(&at).next().is_none() {
        return Ok(None);
    }
    let whole = lands.over(&at).find(|l| l.resized && l.at == at);
    let len = whole.map_or(at.range.len(), |l| l.data.len());
    if len > MAX_REDECODED {
        return Ok(None);
    }
    after(model, at, len, None, lands)
}

/// Refuses `plan` when it gives a decoded payload's scales bytes its backend refuses.
pub fn check(catalog: &Catalog, plan: &Plan) -> Result<()> {
    let model = &*catalog.model;
    let lands = Landings::new(landings(model, plan));
    if lands.is_empty() {
        return Ok(());
    }
    for (&(p, j), dec) in catalog.payloads.iter() {
        let old = &*dec.payload;
        let scales = |payload: &dyn Payload| -> Vec<Blob> {
            payload
                .blobs()
                .into_iter()
                .filter(|b| b.role == KeyRole::Scale && b.expected.is_some())
                .collect()
        };
        let rewritten = new_payload(model, dec, &lands)?
            .and_then(|bytes| Some((old.backend().decode(&bytes).ok()?, bytes)));
        match rewritten {
            None => {
                for b in scales(old) {
                    let Some(at) = dec.locate(model, &b.bytes) else {
                        continue;
                    };
                    let want = b.expected.unwrap_or(0);
                    let entry = entry_of(model, &b.bytes);
                    let Some(new) = after(model, at, want, entry, &lands)? else {
                        continue;
                    };
                    if now(model, dec.location, &b).as_deref() == Some(&new[..]) {
                        continue;
                    }
                    old.check_blob(&b, &new)
                        .map_err(|why| refusal(catalog, p, j, old, &b, &why))?;
                }
            }
            Some((payload, bytes)) => {
                let before = old.blobs();
                for b in scales(&*payload) {
                    let want = b.expected.unwrap_or(0);
                    let new = match &b.bytes {
                        BlobRef::Payload { offset, size } => {
                            let end = offset.saturating_add((*size).min(want));
                            match bytes.get(*offset as usize..end.min(bytes.len() as u64) as usize)
                            {
                                Some(s) => s.to_vec(),
                                None => continue,
                            }
                        }
                        BlobRef::Named { .. } => {
                            let Some(at) = crate::backend::locate(model, dec.location, &b.bytes)
                            else {
                                continue;
                            };
                            let entry = entry_of(model, &b.bytes);
                            match after(model, at, want, entry, &lands)? {
                                Some(new) => new,
                                None => match model.files[at.file].read(at.range.prefix(want)) {
                                    Ok(bytes) => bytes.into_owned(),
                                    Err(_) => continue,
                                },
                            }
                        }
                    };
                    let was = before
                        .iter()
                        .find(|o| o.value == b.value && o.role == b.role)
                        .and_then(|o| now(model, dec.location, o));
                    if was.as_deref() == Some(&new[..]) {
                        continue;
                    }
                    payload
                        .check_blob(&b, &new)
                        .map_err(|why| refusal(catalog, p, j, &*payload, &b, &why))?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::range::ByteRange;

    fn at(file: FileIndex, start: u64, len: u64) -> Location {
        Location {
            file,
            range: ByteRange::new(start, len).unwrap(),
        }
    }

    /// `Landings::over` finds exactly the landings a brute-force scan finds, for ranges that
    /// nest, overlap, touch and lie in several files.
    #[test]
    fn landings_over_a_range_are_found_by_bisection() {
        let spans = [
            (0, 0, 100),
            (0, 10, 5),
            (0, 20, 200),
            (0, 300, 10),
            (0, 310, 1),
            (1, 0, 50),
            (1, 60, 10),
            (2, 5, 5),
        ];
        let all = || {
            spans
                .iter()
                .map(|&(f, s, l)| Landing {
                    at: at(f, s, l),
                    data: Source::Memory(&[]),
                    resized: false,
                    only: None,
                })
                .collect::<Vec<_>>()
        };
        let lands = Landings::new(all());
        for f in 0..3 {
            for start in (0..330).step_by(3) {
                for len in [1, 4, 9, 40, 400] {
                    let q = at(f, start, len);
                    let mut got: Vec<Location> = lands.over(&q).map(|l| l.at).collect();
                    let mut want: Vec<Location> = all()
                        .into_iter()
                        .map(|l| l.at)
                        .filter(|a| overlaps(a, &q))
                        .collect();
                    got.sort_by_key(|l| (l.file, l.range.start(), l.range.len()));
                    want.sort_by_key(|l| (l.file, l.range.start(), l.range.len()));
                    assert_eq!(got, want, "{q:?}");
                }
            }
        }
    }

    #[test]
    fn ranges_overlap_only_in_one_file() {
        assert!(overlaps(&at(0, 0, 8), &at(0, 4, 8)));
        assert!(!overlaps(&at(0, 0, 8), &at(0, 8, 8)));
        assert!(!overlaps(&at(0, 0, 8), &at(1, 0, 8)));
    }
}
