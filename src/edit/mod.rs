//! Commits: validating new content for a writable file and putting it into the model file,
//! in place (same size, through a journal) or by re-laying the file out (size changes).
//!
//! Invariants: validation happens before any byte is written, so a rejected commit leaves
//! every file as it was; an in-place commit is atomic across crashes (`journal`); a re-layout
//! writes a complete new file, checks it by parsing it back, and only then renames it over
//! the original (`relayout`).

pub mod journal;
pub mod relayout;
pub mod validate;

use std::path::PathBuf;
use std::sync::Arc;

use crate::format::layout::FileIndex;
use crate::format::range::ByteRange;
use crate::format::FormatError;
use crate::tree::{Model, Tree, WriteTarget};

pub use validate::Plan;

/// What a commit did to the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Bytes `range` of file `file` were replaced; nothing moved.
    InPlace { file: FileIndex, range: ByteRange },
    /// File `file` was rewritten with a new layout.
    Relayout { file: FileIndex },
}

/// Why a commit was refused or failed, as an errno and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditError {
    pub errno: i32,
    pub message: String,
}

impl EditError {
    pub fn invalid(message: impl Into<String>) -> Self {
        EditError {
            errno: libc::EINVAL,
            message: message.into(),
        }
    }

    pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> Self {
        EditError {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            message: format!("{what}: {e}"),
        }
    }
}

impl std::fmt::Display for EditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EditError {}

/// Validates `data` as the new content of the file behind `target`, then writes it.
/// `exclusive` is held while bytes that readers may be mapping change in place.
pub fn commit<G>(
    tree: &Tree,
    target: &WriteTarget,
    data: &[u8],
    exclusive: impl FnOnce() -> G,
) -> Result<Outcome, EditError> {
    let model = &tree.model;
    match validate::plan(model, target, data)? {
        Plan::InPlace { location, bytes } => {
            let file = &model.files[location.file];
            journal::write_in_place(
                &file.path,
                file.bytes().len() as u64,
                location.range.start,
                bytes,
                exclusive,
            )?;
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

/// The paths of the model's files, in their order.
pub fn paths(model: &Model) -> Vec<PathBuf> {
    model.files.iter().map(|f| f.path.clone()).collect()
}

/// Re-opens the files of `tree` after a commit and builds the new tree.
pub fn reload(tree: &Tree) -> Result<Tree, FormatError> {
    let paths = paths(&tree.model);
    let model = Model::open(&paths[0], &paths[1..])?;
    Ok(Tree::build(Arc::new(model)))
}
