//! Commits: validating new content for a writable file and putting it into the model file,
//! in place (same size, through a journal) or by re-laying the file out (size changes).
//!
//! Invariants: validation happens before any byte is written, so a rejected commit leaves
//! every file as it was; an in-place commit is atomic across crashes (`journal`); a re-layout
//! writes a complete new file, checks it by parsing it back, and only then renames it over
//! the original (`relayout`).

mod attributes;
mod beside;
pub mod bulk;
pub mod copy;
mod direct;
pub mod float;
pub mod group;
pub mod identity;
pub mod journal;
pub mod params;
pub mod plan;
pub mod recovery;
pub mod relayout;
mod trust;
pub mod validate;
mod window;

use std::path::Path;

use crate::catalog::Catalog;
use crate::error::Result;
use crate::format::layout::{FileIndex, Location};
use crate::format::range::ByteRange;
use crate::format::{Model, WriteTarget};

pub use crate::content::{Bytes, Source, Write};
pub use beside::{free_space, need_room};
pub use plan::{Change, Owner, Plan};
pub use trust::describe as describe_file;

/// What a commit did to the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Bytes inside these ranges were replaced, and no others; nothing moved. Ranges of one
    /// file that a commit wrote with at most `JOIN_GAP` bytes between them are given as one
    /// (see `joined`).
    InPlace { ranges: Vec<Location> },
    /// File `file` was rewritten with a new layout.
    Relayout { file: FileIndex },
}

/// Ranges closer than this are reported as one: the padding ExecuTorch puts between
/// tensors (16 bytes by default, up to a segment alignment of 4096 in exports we read).
const JOIN_GAP: u64 = 4096;

/// `ranges` (sorted by file and start) with those of one file that are at most `JOIN_GAP`
/// apart joined. A bulk update writes thousands of ranges that mostly follow each other;
/// whoever works out what they changed (every tree file whose bytes overlap one) then does
/// it against a handful. A joined range covers a few unwritten bytes too, so it may name a
/// file as changed that was not: never the reverse.
fn joined(ranges: impl Iterator<Item = Location>) -> Vec<Location> {
    let mut out: Vec<Location> = Vec::new();
    for l in ranges {
        if let Some(last) = out.last_mut() {
            let end = last.range.end();
            if last.file == l.file && l.range.start() <= end.saturating_add(JOIN_GAP) {
                let new_end = end.max(l.range.end());
                last.range = ByteRange::new(last.range.start(), new_end - last.range.start())
                    .expect("inside the file");
                continue;
            }
        }
        out.push(l);
    }
    out
}

/// Checks `data` as the new content of the file behind `target`, without writing anything.
pub fn validate(catalog: &Catalog, target: &WriteTarget, data: Source) -> Result<()> {
    validate::plan(catalog, target, data).map(|_| ())
}

/// How `data` becomes the new content of the file behind `target`: validated, with the
/// tensors it writes kept apart from distinct tensors that share their bytes.
pub fn plan<'a>(catalog: &Catalog, target: &WriteTarget, data: Source<'a>) -> Result<Plan<'a>> {
    identity::separate(&catalog.model, validate::plan(catalog, target, data)?)
}

/// Whoever holds a claim on the model files (one mount per file) is told of their identity.
pub trait FileWatcher: Send + Sync {
    /// A re-layout is about to rename the new file `new` describes over model file `path`:
    /// an error abandons the commit, and the model stays as it was.
    fn replacing(&self, path: &Path, new: &std::fs::Metadata) -> Result<()>;

    /// The model files are now `model`'s; the previous ones are still open.
    fn now_open(&self, model: &Model);
}

/// For commits nobody watches (tests, tools that hold no claim).
pub struct Unwatched;

impl FileWatcher for Unwatched {
    fn replacing(&self, _path: &Path, _new: &std::fs::Metadata) -> Result<()> {
        Ok(())
    }

    fn now_open(&self, _model: &Model) {}
}

/// Validates `data` as the new content of the file behind `target`, then writes it.
/// `exclusive` is held while bytes that readers may be mapping change in place; `watcher`
/// is told before a re-layout renames a new file over the model.
pub fn commit<G>(
    catalog: &Catalog, target: &WriteTarget, data: Source, exclusive: impl Fn() -> G,
    watcher: &dyn FileWatcher,
) -> Result<Outcome> {
    commit_plan(
        &catalog.model,
        plan(catalog, target, data)?,
        exclusive,
        watcher,
    )
}

/// `writes` split into the files they rewrite most of, each with its writes as the patches
/// of a new copy (`copy::worth_copying`), and the writes of the other files.
fn as_copies<'a>(
    model: &Model, writes: Vec<Write<'a>>,
) -> (Vec<(FileIndex, Change<'a>)>, Vec<Write<'a>>) {
    let mut written = vec![0u64; model.files.len()];
    for w in &writes {
        if let Some(n) = written.get_mut(w.location.file) {
            *n = n.saturating_add(w.location.range.len());
        }
    }
    let copied: Vec<bool> = written
        .iter()
        .zip(&model.files)
        .map(|(&n, f)| copy::worth_copying(n, f.len()) && copy::may_copy(f))
        .collect();
    if !copied.contains(&true) {
        return (Vec::new(), writes);
    }
    let mut patches: Vec<Vec<(ByteRange, Bytes<'a>)>> =
        (0..model.files.len()).map(|_| Vec::new()).collect();
    let mut rest = Vec::new();
    for w in writes {
        match patches.get_mut(w.location.file) {
            Some(p) if copied[w.location.file] => p.push((w.location.range, w.bytes)),
            _ => rest.push(w),
        }
    }
    let copies = patches
        .into_iter()
        .enumerate()
        .filter(|(file, _)| copied[*file])
        .map(|(file, patches)| {
            (
                file,
                Change::OwnBytes {
                    own: Vec::new(),
                    patches,
                },
            )
        })
        .collect();
    (copies, rest)
}

/// Writes what a validated `plan` says: in place through a journal, or by re-laying a file
/// out; a plan that changes several files commits them as one (`group`).
pub fn commit_plan<G>(
    model: &Model, plan: Plan, exclusive: impl Fn() -> G, watcher: &dyn FileWatcher,
) -> Result<Outcome> {
    match plan {
        Plan::InPlace { writes } => {
            let (copies, mut writes) = as_copies(model, writes);
            if !copies.is_empty() {
                return commit_plan(
                    model,
                    Plan::Separate {
                        relayouts: copies,
                        in_place: writes,
                    },
                    exclusive,
                    watcher,
                );
            }
            writes.sort_by_key(|w| (w.location.file, w.location.range.start()));
            let ranges = joined(writes.iter().map(|w| w.location));
            // Several files: one commit, all old or all new across them
            // (docs/writes.md#commits-of-several-files).
            if writes
                .first()
                .is_some_and(|w| writes.iter().any(|o| o.location.file != w.location.file))
            {
                group::commit(model, &[], &writes, &exclusive, watcher)?;
                return Ok(Outcome::InPlace { ranges });
            }
            // One file: its journal.
            if let Some(first) = writes.first() {
                let ranges: Vec<journal::RangeWrite> = writes
                    .iter()
                    .map(|w| (w.location.range.start(), w.bytes.source()))
                    .collect();
                journal::write_in_place(&model.files[first.location.file], &ranges, &exclusive)?;
            }
            Ok(Outcome::InPlace { ranges })
        }
        Plan::Relayout { file, change } => {
            relayout::rewrite(model, file, &change, watcher)?;
            Ok(Outcome::Relayout { file })
        }
        Plan::Separate {
            mut relayouts,
            in_place,
        } => {
            let (copies, mut writes) = as_copies(model, in_place);
            relayouts.extend(copies);
            let first = relayouts.first().map(|(f, _)| *f);
            writes.sort_by_key(|w| (w.location.file, w.location.range.start()));
            let several = relayouts.len() > 1
                || (!relayouts.is_empty() && !writes.is_empty())
                || writes
                    .first()
                    .is_some_and(|w| writes.iter().any(|o| o.location.file != w.location.file));
            if several {
                group::commit(model, &relayouts, &writes, &exclusive, watcher)?;
                let ranges = joined(writes.iter().map(|w| w.location));
                return Ok(
                    first.map_or(Outcome::InPlace { ranges }, |file| Outcome::Relayout {
                        file,
                    }),
                );
            }
            // One file: re-laid out by its rename, or written through its journal.
            for (file, change) in &relayouts {
                relayout::rewrite(model, *file, change, watcher)?;
            }
            let in_place = writes;
            let rest = commit_plan(
                model,
                Plan::InPlace { writes: in_place },
                exclusive,
                watcher,
            )?;
            Ok(first.map_or(rest, |file| Outcome::Relayout { file }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: FileIndex, start: u64, len: u64) -> Location {
        Location {
            file,
            range: ByteRange::new(start, len).unwrap(),
        }
    }

    #[test]
    fn ranges_a_little_apart_are_joined_per_file() {
        let got = joined(
            [
                at(0, 0, 48),
                at(0, 64, 12),
                at(0, 76, 4),
                at(0, 80 + JOIN_GAP + 1, 8),
                at(1, 100, 4),
                at(1, 104, 4),
            ]
            .into_iter(),
        );
        assert_eq!(
            got,
            vec![at(0, 0, 80), at(0, 80 + JOIN_GAP + 1, 8), at(1, 100, 8)]
        );
        assert!(joined(std::iter::empty()).is_empty());
    }
}
