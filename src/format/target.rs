//! What a write to a part of a model means: the byte range it replaces and the rules its new
//! content must follow (DESIGN.md §3). The tree attaches one to each writable file; the edit
//! layer validates against it and commits.
//!
//! Invariant: every `Location` here came from `layout`, so it lies inside its file.

use std::sync::Arc;

use super::layout::{FileIndex, Location, TensorShape};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteTarget {
    /// Raw tensor bytes: exactly `nbytes`, written at `location`.
    TensorBin {
        location: Location,
        shape: Arc<TensorShape>,
    },
    /// A `.npy` of a tensor: same dtype and shape; the data part goes to `location`.
    TensorNpy {
        location: Location,
        shape: Arc<TensorShape>,
    },
    /// A named blob without tensor layout: any size.
    Blob { file: FileIndex, named_index: usize },
    /// A delegate payload: any size.
    DelegatePayload { plan: usize, delegate: usize },
    /// `segments/<n>`: same size, in place.
    Segment {
        file: FileIndex,
        index: usize,
        location: Location,
    },
}
