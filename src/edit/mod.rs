//! Commits: validating new content for a writable file and putting it into the model file,
//! in place (same size, through a journal) or by re-laying the file out (size changes).
//!
//! Invariants: validation happens before any byte is written, so a rejected commit leaves
//! every file as it was; an in-place commit is atomic across crashes (`journal`); a re-layout
//! writes a complete new file, checks it by parsing it back, and only then renames it over
//! the original (`relayout`).

mod beside;
pub mod journal;
pub mod relayout;
pub mod source;
pub mod validate;

use crate::error::Result;
use crate::format::layout::FileIndex;
use crate::format::range::ByteRange;
use crate::format::{Model, WriteTarget};

pub use source::Source;
pub use validate::Plan;

/// What a commit did to the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Bytes `range` of file `file` were replaced; nothing moved.
    InPlace { file: FileIndex, range: ByteRange },
    /// File `file` was rewritten with a new layout.
    Relayout { file: FileIndex },
}

/// Checks `data` as the new content of the file behind `target`, without writing anything.
pub fn validate(model: &Model, target: &WriteTarget, data: Source) -> Result<()> {
    validate::plan(model, target, data).map(|_| ())
}

/// Validates `data` as the new content of the file behind `target`, then writes it.
/// `exclusive` is held while bytes that readers may be mapping change in place.
pub fn commit<G>(
    model: &Model, target: &WriteTarget, data: Source, exclusive: impl FnOnce() -> G,
) -> Result<Outcome> {
    match validate::plan(model, target, data)? {
        Plan::InPlace { location, bytes } => {
            let file = &model.files[location.file];
            journal::write_in_place(file, &[(location.range.start(), bytes)], exclusive)?;
            Ok(Outcome::InPlace {
                file: location.file,
                range: location.range,
            })
        }
        Plan::Relayout { file, change } => {
            relayout::rewrite(model, file, &change)?;
            Ok(Outcome::Relayout { file })
        }
    }
}
