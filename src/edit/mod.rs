//! Commits: validating new content for a writable file and putting it into the model file,
//! in place (same size, through a journal) or by re-laying the file out (size changes).
//!
//! Invariants: validation happens before any byte is written, so a rejected commit leaves
//! every file as it was; an in-place commit is atomic across crashes (`journal`); a re-layout
//! writes a complete new file, checks it by parsing it back, and only then renames it over
//! the original (`relayout`).

mod beside;
pub mod bulk;
pub mod identity;
pub mod journal;
pub mod relayout;
mod requantize;
pub mod source;
pub mod validate;

use crate::error::Result;
use crate::format::layout::{FileIndex, Location};
use crate::format::{Model, WriteTarget};

pub use source::{Bytes, Source};
pub use validate::{Change, Owner, Plan, Write};

/// What a commit did to the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The bytes of these ranges were replaced; nothing moved.
    InPlace { ranges: Vec<Location> },
    /// File `file` was rewritten with a new layout.
    Relayout { file: FileIndex },
}

/// Checks `data` as the new content of the file behind `target`, without writing anything.
pub fn validate(model: &Model, target: &WriteTarget, data: Source) -> Result<()> {
    validate::plan(model, target, data).map(|_| ())
}

/// How `data` becomes the new content of the file behind `target`: validated, with the
/// tensors it writes kept apart from distinct tensors that share their bytes.
pub fn plan<'a>(model: &Model, target: &WriteTarget, data: Source<'a>) -> Result<Plan<'a>> {
    identity::separate(model, validate::plan(model, target, data)?)
}

/// Validates `data` as the new content of the file behind `target`, then writes it.
/// `exclusive` is held while bytes that readers may be mapping change in place.
pub fn commit<G>(
    model: &Model, target: &WriteTarget, data: Source, exclusive: impl Fn() -> G,
) -> Result<Outcome> {
    commit_plan(model, plan(model, target, data)?, exclusive)
}

/// Writes what a validated `plan` says: in place, one journal per file, or by re-laying a
/// file out.
pub fn commit_plan<G>(model: &Model, plan: Plan, exclusive: impl Fn() -> G) -> Result<Outcome> {
    match plan {
        Plan::InPlace { mut writes } => {
            writes.sort_by_key(|w| (w.location.file, w.location.range.start()));
            let ranges: Vec<Location> = writes.iter().map(|w| w.location).collect();
            // One journal per file: the ranges of one file change together.
            let mut at = 0;
            if writes.is_empty() {
                return Ok(Outcome::InPlace { ranges });
            }
            while at < writes.len() {
                let file = writes[at].location.file;
                let end = at
                    + writes[at..]
                        .iter()
                        .take_while(|w| w.location.file == file)
                        .count();
                let ranges: Vec<journal::RangeWrite> = writes[at..end]
                    .iter()
                    .map(|w| (w.location.range.start(), w.bytes.source()))
                    .collect();
                journal::write_in_place(&model.files[file], &ranges, &exclusive)?;
                at = end;
            }
            Ok(Outcome::InPlace { ranges })
        }
        Plan::Relayout { file, change } => {
            relayout::rewrite(model, file, &change)?;
            Ok(Outcome::Relayout { file })
        }
        Plan::Separate {
            relayouts,
            in_place,
        } => {
            // Each file changes atomically on its own: re-laid-out files by their rename,
            // the others through their journal.
            let first = relayouts.first().map(|(f, _)| *f);
            for (file, change) in &relayouts {
                relayout::rewrite(model, *file, change)?;
            }
            let rest = commit_plan(model, Plan::InPlace { writes: in_place }, exclusive)?;
            Ok(first.map_or(rest, |file| Outcome::Relayout { file }))
        }
    }
}
