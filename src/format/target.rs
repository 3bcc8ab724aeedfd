//! What a write to a part of a model means: the byte range it replaces and the rules its new
//! content must follow (DESIGN.md §3). The tree attaches one to each writable file; the edit
//! layer validates against it and commits.
//!
//! Invariant: every `Location` here came from `layout`, so it lies inside its file.

use std::sync::Arc;

use super::layout::{FileIndex, Location, TensorShape};
use super::sharing::TensorId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteTarget {
    /// Raw tensor bytes: exactly `nbytes`, written at `location`.
    TensorBin {
        location: Location,
        shape: Arc<TensorShape>,
        of: TensorId,
    },
    /// A `.npy` of a tensor: same dtype and shape; the data part goes to `location`.
    TensorNpy {
        location: Location,
        shape: Arc<TensorShape>,
        of: TensorId,
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
    /// The bytes of a constant of a decoded delegate payload (`<backend>/values/<id>.bin`):
    /// exactly as many, written where they live (named data, or inside the payload).
    PayloadConstant {
        location: Location,
        /// The constant, for messages: `"qbint4[64,64]"`.
        what: Arc<str>,
        /// The named-data entry holding the bytes, when they are named data.
        of: Option<TensorId>,
    },
    /// Its `.npy`: the same dtype (`descr`) and shape.
    PayloadConstantNpy {
        location: Location,
        descr: &'static str,
        shape: Arc<[u64]>,
        what: Arc<str>,
        of: Option<TensorId>,
    },
    /// `weights.safetensors` of model file `file`: a safetensors file naming any subset of
    /// its tensors (the catalog's listing), each with the same dtype and shape, all written
    /// in one commit.
    Weights { file: FileIndex },
    /// Its float32 view (`.f32.npy`): re-quantized into the constant's bytes and scales,
    /// which change together. The value is found again in the payload at commit.
    PayloadConstantF32 {
        plan: usize,
        delegate: usize,
        /// The value's id.
        value: u32,
    },
}

impl WriteTarget {
    /// The files a commit of this target may change (besides those whose bytes the node
    /// shows, which it may change too).
    pub fn files(&self) -> Vec<FileIndex> {
        match self {
            WriteTarget::TensorBin { location, .. }
            | WriteTarget::TensorNpy { location, .. }
            | WriteTarget::Segment { location, .. }
            | WriteTarget::PayloadConstant { location, .. }
            | WriteTarget::PayloadConstantNpy { location, .. } => vec![location.file],
            WriteTarget::Blob { file, .. } => vec![*file],
            // Delegate payloads and the values re-quantized in them live in the program.
            WriteTarget::DelegatePayload { .. } | WriteTarget::PayloadConstantF32 { .. } => {
                vec![0]
            }
            // Its tensors are the ones whose bytes are in that file.
            WriteTarget::Weights { file, .. } => vec![*file],
        }
    }
}
