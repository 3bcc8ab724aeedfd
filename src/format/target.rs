//! What a write to a part of a model means: the byte range it replaces and the rules its new
//! content must follow (docs/writes.md#writable-files). The tree attaches one to each writable
//! file; the edit layer validates against it and commits.
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
    /// A `weights.safetensors`: a safetensors file naming any subset of its tensors (the
    /// catalog's listing), each with the same dtype and shape, all written in one commit.
    Weights { view: WeightsView },
    /// Its float32 view (`.f32.npy`): re-quantized into the constant's bytes and scales,
    /// which change together. The value is found again in the payload at commit.
    PayloadConstantF32 {
        plan: usize,
        delegate: usize,
        /// The value's id.
        value: u32,
    },
    /// `names/<name>.npy` of name `name` of the named views (docs/tree.md#named-views): a
    /// float `.npy` in the checkpoint's shape, written where the name map says the tensor
    /// is stored, as `ptefs apply --names` writes it.
    NameNpy { name: usize },
    /// `names.safetensors`: a safetensors file naming any subset of the map's names, in
    /// the checkpoint's shapes and float dtypes, all written in one commit.
    NamesSafetensors,
}

/// Which tensors a `weights.safetensors` shows (docs/tree.md#weightssafetensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightsView {
    /// The mount's root: every file's tensors (the program's and every attached data
    /// file's), blobs typed by the decoded payloads that read them.
    Root,
    /// One attached data file, shown exactly as a mount of that file alone shows it: blobs
    /// by their own tensor layout, else raw bytes.
    File(FileIndex),
}

/// The largest size any file can have (`off_t`): what a named blob, a delegate payload or a
/// scratch file may be given unless a mount sets less (`--max-file-size`). The free space
/// of the model's file system bounds them first (docs/writes.md#sizes-and-free-space).
pub const LARGEST_FILE: u64 = i64::MAX as u64;

/// Room allowed for a `.npy` header in front of a tensor's bytes.
const NPY_HEADER_MAX: u64 = 1 << 20;

/// The limit on a file that may take any size: the mount's `--max-file-size`, else the
/// largest size a file can have; `what` names the files, for the message (the refusal
/// gives the number: "N bytes cannot fit: WHAT are limited by --max-file-size on this mount
/// (at most M bytes)").
pub fn resizable_limit(what: &str, max_file_size: Option<u64>) -> (u64, String) {
    match max_file_size {
        Some(max) => (
            max,
            format!("{what} are limited by --max-file-size on this mount"),
        ),
        None => (
            LARGEST_FILE,
            format!("{what} can be no larger than any file"),
        ),
    }
}

impl WriteTarget {
    /// How large new content written to the file at `path` may become, and why;
    /// `current` is the file's size now, `max_file_size` the mount's limit on resizable
    /// files (`--max-file-size`). Larger content can never be valid, so staging refuses it
    /// before holding it.
    pub fn size_limit(
        &self, path: &str, current: u64, max_file_size: Option<u64>,
    ) -> (u64, String) {
        let holds = |len: u64, what: &dyn std::fmt::Display| {
            (len, format!("{path} holds the {len} bytes of {what}"))
        };
        let npy = |len: u64, what: &dyn std::fmt::Display| {
            (
                len + NPY_HEADER_MAX,
                format!("{path} holds a .npy header and the {len} bytes of {what}"),
            )
        };
        match self {
            WriteTarget::TensorBin {
                location, shape, ..
            } => holds(location.range.len(), &shape.describe()),
            WriteTarget::PayloadConstant { location, what, .. } => {
                holds(location.range.len(), what)
            }
            WriteTarget::TensorNpy {
                location, shape, ..
            } => npy(location.range.len(), &shape.describe()),
            WriteTarget::PayloadConstantNpy { location, what, .. } => {
                npy(location.range.len(), what)
            }
            WriteTarget::Segment {
                location, index, ..
            } => (
                location.range.len(),
                format!("segment {index} keeps its size"),
            ),
            WriteTarget::Blob { .. } | WriteTarget::DelegatePayload { .. } => {
                resizable_limit("named data and delegate payloads", max_file_size)
            }
            // The catalog's listing bounds an update more closely
            // (`WeightsFile::update_limit`).
            WriteTarget::Weights { .. } => (
                current.saturating_add(super::safetensors::MAX_HEADER),
                format!("{path} holds its header and the bytes of the tensors it shows"),
            ),
            WriteTarget::PayloadConstantF32 { .. } => (
                current.saturating_add(NPY_HEADER_MAX),
                format!("{path} holds a .npy header and the float32 view it shows"),
            ),
            // The named views bound these more closely (`NamedViews::update_limit`).
            WriteTarget::NameNpy { .. } | WriteTarget::NamesSafetensors => (
                current
                    .saturating_mul(4)
                    .saturating_add(super::safetensors::MAX_HEADER),
                format!("{path} holds a header and the float values of the names it shows"),
            ),
        }
    }

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
            WriteTarget::Weights {
                view: WeightsView::File(file),
            } => vec![*file],
            // Every file's tensors are in it: the caller, who knows the files, lists them.
            WriteTarget::Weights {
                view: WeightsView::Root,
            } => Vec::new(),
            // Wherever the map says the names are stored: the caller lists the files.
            WriteTarget::NameNpy { .. } | WriteTarget::NamesSafetensors => Vec::new(),
        }
    }
}
