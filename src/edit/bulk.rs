//! Bulk updates (DESIGN.md §3.1): a safetensors file naming any subset of a model file's
//! tensors becomes one commit of every range whose bytes change.
//!
//! Invariants: the update is parsed strictly before anything else (`format::safetensors`);
//! every tensor it names must exist with the same dtype and shape, and one mismatch refuses
//! the whole update, naming every mismatch; unchanged tensors are not written; the changed
//! ranges of one file go into one journal and one in-place write (`journal`), so after a
//! crash the file holds entirely the old or entirely the new set.

use std::collections::HashMap;

use super::plan::Plan;
use crate::content::{Bytes, Source, Write};
use crate::error::{Error, Result};
use crate::format::safetensors::{self, Entry, Header};
use crate::format::Model;

/// At most this many mismatches are spelled out in a refusal.
const MISMATCHES_SHOWN: usize = 20;

/// What an update changes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
    pub bytes: u64,
}

/// Reads and strictly parses the safetensors header of `update`.
pub fn read_header(update: Source) -> Result<Header> {
    let hlen = safetensors::header_len(&update.head(8)?, update.len())?;
    Ok(safetensors::parse(&update.head(hlen)?, update.len())?)
}

/// Matches the tensors `header` names against `entries` (a file's `weights.safetensors`);
/// returns, for each tensor of the update, the entry it updates, or every mismatch.
pub fn match_entries<'e>(header: &Header, entries: &'e [Entry]) -> Result<Vec<&'e Entry>> {
    let by_name: HashMap<&str, &Entry> = entries.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut matched = Vec::with_capacity(header.tensors.len());
    let mut problems = Vec::new();
    for t in &header.tensors {
        match by_name.get(t.name.as_str()) {
            None => problems.push(format!("\"{}\": no such tensor in this file", t.name)),
            Some(e) if e.dtype != t.dtype || e.shape != t.shape => problems.push(format!(
                "\"{}\": expected {}{:?}, found {}{:?}",
                t.name, e.dtype, e.shape, t.dtype, t.shape
            )),
            Some(e) => matched.push(*e),
        }
    }
    if problems.is_empty() {
        return Ok(matched);
    }
    let n = problems.len();
    problems.truncate(MISMATCHES_SHOWN);
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
    model: &Model, entries: &[Entry], update: Source<'a>,
) -> Result<(Plan<'a>, Summary)> {
    let header = read_header(update)?;
    let matched = match_entries(&header, entries)?;
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
            .map_err(|err| Error::io(format!("read \"{}\" from the model", e.name), err))?;
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
