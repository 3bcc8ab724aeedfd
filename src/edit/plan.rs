//! What a validated commit will do: same-size writes of ranges, or a re-layout of a file
//! (a size change, or tensors given bytes of their own), decided before anything is written.

use crate::content::{Bytes, Source, Write};
use crate::format::layout::FileIndex;
use crate::format::range::ByteRange;

/// A size-changing edit of one file.
#[derive(Debug)]
pub enum Change<'a> {
    /// New bytes for segment `index`.
    Segment { index: usize, data: Source<'a> },
    /// New bytes for `Program.backend_delegate_data[index]`.
    InlineDelegate { index: usize, data: Vec<u8> },
    /// Tensors given bytes of their own, because the bytes they shared belong to distinct
    /// tensors too (docs/writes.md#shared-bytes-and-identity), with same-size writes of other
    /// ranges of the file.
    OwnBytes {
        own: Vec<(Owner, Bytes<'a>)>,
        /// Same-size replacements of ranges inside the file's segments.
        patches: Vec<(ByteRange, Bytes<'a>)>,
    },
}

/// A tensor given bytes of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Named-data entry `index` of the file: it gets a segment of its own.
    Key { index: usize },
    /// Values of the program, as (plan, value), that are one tensor (one parameter used by
    /// several methods): they get one new buffer of the constant segment, or of the mutable
    /// initial states when `mutable`.
    Buffer {
        mutable: bool,
        values: Vec<(usize, usize)>,
    },
}

#[derive(Debug)]
pub enum Plan<'a> {
    /// Same-size replacements of these ranges.
    InPlace {
        writes: Vec<Write<'a>>,
    },
    Relayout {
        file: FileIndex,
        change: Change<'a>,
    },
    /// Files re-laid out (tensors given bytes of their own), and same-size writes into
    /// the other files.
    Separate {
        relayouts: Vec<(FileIndex, Change<'a>)>,
        in_place: Vec<Write<'a>>,
    },
}

impl Plan<'_> {
    /// The files this plan changes, in order, each once.
    pub fn files(&self) -> Vec<FileIndex> {
        let mut files: Vec<FileIndex> = match self {
            Plan::InPlace { writes } => writes.iter().map(|w| w.location.file).collect(),
            Plan::Relayout { file, .. } => vec![*file],
            Plan::Separate {
                relayouts,
                in_place,
            } => relayouts
                .iter()
                .map(|(f, _)| *f)
                .chain(in_place.iter().map(|w| w.location.file))
                .collect(),
        };
        files.sort_unstable();
        files.dedup();
        files
    }
}
