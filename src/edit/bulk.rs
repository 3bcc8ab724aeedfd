//! Bulk updates (docs/writes.md#bulk-updates-through-weightssafetensors): a safetensors file
//! naming any subset of a model file's tensors becomes one commit of every range whose bytes
//! change.
//!
//! Invariants: the update is parsed strictly before anything else (`format::safetensors`),
//! and its header is read only when its declared length is within what the file's tensors
//! can need (`HeaderBound`), so a hostile header costs memory in proportion to the model,
//! not to the upload; every tensor it names must exist with the same dtype and shape, and
//! one mismatch refuses the whole update, naming every mismatch (the first
//! `MISMATCHES_SHOWN` spelled out, the others counted); unchanged tensors are not written;
//! the changed
//! ranges of one file go into one journal and one in-place write (`journal`), so after a
//! crash the file holds entirely the old or entirely the new set.

use std::collections::HashMap;

use super::plan::Plan;
use crate::content::{Bytes, Source, Write};
use crate::error::{Error, Result};
use crate::format::safetensors::{self, Entry, Header, HeaderBound, TensorInfo};
use crate::format::Model;
use crate::quote;

/// At most this many mismatches are spelled out in a refusal.
const MISMATCHES_SHOWN: usize = 20;

/// What an update changes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
    pub bytes: u64,
}

/// Headers at least this large are followed by giving freed memory back to the system.
const TRIM_FROM: u64 = 1 << 20;

/// Reads and strictly parses the safetensors header of `update`, refusing it from its
/// first 8 bytes when it declares more than `bound`.
pub fn read_header(update: Source, bound: &HeaderBound) -> Result<Header> {
    let hlen = safetensors::header_len(&update.head(8)?, update.len(), Some(bound))?;
    let head = update.head(hlen)?;
    let parsed = safetensors::parse(&head, update.len());
    drop(head);
    if parsed.is_err() {
        give_back_memory(hlen);
    }
    Ok(parsed?)
}

/// After a header of `header_len` bytes was dropped: returns the heap's free memory to the
/// system. The allocator keeps what a large header's many small allocations freed, and a
/// daemon that refused an update should not stay that much larger.
fn give_back_memory(header_len: u64) {
    if header_len < TRIM_FROM {
        return;
    }
    // SAFETY: takes only the size to keep; glibc locks its arenas itself.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0)
    };
}

/// Where a tensor an update names that does not fit may be meant to go instead (another
/// `weights.safetensors` of the mount), said after its mismatch: given the tensor and the
/// entry of that name here, if any.
pub type Hint<'h> = &'h dyn Fn(&TensorInfo, Option<&Entry>) -> Option<String>;

/// Matches the tensors `header` names against `entries` (a file's `weights.safetensors`);
/// returns, for each tensor of the update, the entry it updates, or every mismatch (each
/// followed by what `hint` says of it).
pub fn match_entries<'e>(
    header: &Header, entries: &'e [Entry], hint: Option<Hint>,
) -> Result<Vec<&'e Entry>> {
    let by_name: HashMap<&str, &Entry> = entries.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut matched = Vec::with_capacity(header.tensors.len());
    let mut problems = Vec::new();
    let mut n = 0;
    for t in &header.tensors {
        let found = by_name.get(t.name.as_str()).copied();
        let mut problem = match found {
            None => format!("{}: no such tensor in this file", quote::name(&t.name)),
            Some(e) if e.dtype != t.dtype || e.shape != t.shape => format!(
                "{}: expected {}{:?}, found {}{:?}",
                quote::name(&t.name),
                e.dtype,
                e.shape,
                t.dtype,
                t.shape
            ),
            Some(e) => {
                matched.push(e);
                continue;
            }
        };
        if let Some(more) = hint.and_then(|h| h(t, found)) {
            problem.push_str(&format!(" ({more})"));
        }
        n += 1;
        // Only those shown are spelled out: a header of many strangers must not make a
        // message as large as itself.
        if problems.len() < MISMATCHES_SHOWN {
            problems.push(problem);
        }
    }
    if n == 0 {
        return Ok(matched);
    }
    let mut message = format!(
        "the update names {n} tensor(s) that do not fit, so nothing was written: {}",
        problems.join("; ")
    );
    if n > MISMATCHES_SHOWN {
        message.push_str(&format!("; and {} more", n - MISMATCHES_SHOWN));
    }
    Err(Error::invalid(message))
}

/// The writes that make `update` (a whole safetensors file) the new content of the tensors
/// it names, among `entries`, and what it changes.
pub fn plan<'a>(
    model: &Model, entries: &[Entry], update: Source<'a>, hint: Option<Hint>,
) -> Result<(Plan<'a>, Summary)> {
    let header = read_header(update, &HeaderBound::of(entries))?;
    let planned = plan_header(model, entries, &header, update, hint);
    let header_len = header.data_start;
    drop(header);
    give_back_memory(header_len);
    planned
}

/// `plan` for an update whose header was read already.
pub fn plan_header<'a>(
    model: &Model, entries: &[Entry], header: &Header, update: Source<'a>, hint: Option<Hint>,
) -> Result<(Plan<'a>, Summary)> {
    let matched = match_entries(header, entries, hint)?;
    let mut summary = Summary::default();
    let mut writes = Vec::new();
    let mut buf = Vec::new();
    for (t, e) in header.tensors.iter().zip(matched) {
        let new = update.slice(header.data_start + t.begin, t.end - t.begin)?;
        let file = model.files[e.location.file]
            .file
            .as_ref()
            .ok_or_else(|| Error::invalid("the model is not backed by a file"))?;
        // Read through the descriptor, not the mapping: comparing GiBs must not make them
        // resident in the daemon.
        let same = new
            .equals_file_range(file, e.location.range.start(), &mut buf)
            .map_err(|err| {
                Error::io(format!("read {} from the model", quote::name(&e.name)), err)
            })?;
        if same {
            summary.unchanged.push(t.name.clone());
        } else {
            summary.changed.push(t.name.clone());
            summary.bytes += new.len();
            writes.push(Write {
                location: e.location,
                bytes: Bytes::Staged(new),
                of: Some(e.of),
            });
        }
    }
    // Tensors on one range are distinct tensors sharing bytes, which the commit keeps
    // apart (`identity`); ranges that only partly overlap cannot be told apart.
    writes.sort_by_key(|w| (w.location.file, w.location.range.start()));
    for pair in writes.windows(2) {
        let (a, b) = (&pair[0].location, &pair[1].location);
        if a.file == b.file && b.range.start() < a.range.end() && a != b {
            return Err(Error::invalid(
                "the update changes two tensors whose bytes partly overlap in the model file; update one at a time",
            ));
        }
    }
    Ok((Plan::InPlace { writes }, summary))
}
