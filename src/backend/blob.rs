//! Where a payload's constants and scales are, and what each blob it reads must hold.
//!
//! Invariant: [`locate`] returns only ranges inside their file: a named-data entry's range
//! from the model's layout, or a checked sub-range of the payload's own location.

use crate::format::layout::Location;
use crate::format::range::checked_range;
use crate::format::Model;

/// Where a constant's (or a scale blob's) bytes are. Nothing is copied: the caller reads
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BlobRef {
    /// A named-data entry of the `.pte` or of an attached `.ptd`, found by key; `size` is
    /// what the graph records.
    Named { key: String, size: u64 },
    /// Bytes inside the payload, `offset` from the payload's first byte.
    Payload { offset: u64, size: u64 },
}

impl BlobRef {
    pub fn size(&self) -> u64 {
        match self {
            BlobRef::Named { size, .. } | BlobRef::Payload { size, .. } => *size,
        }
    }
}

/// Where the bytes `r` names are, for a payload at `payload`: a named-data entry of the
/// model (the mounted file first, then the attached files, as the runtime looks), or a
/// range of the payload. None when no file at hand holds them.
pub fn locate(model: &Model, payload: Location, r: &BlobRef) -> Option<Location> {
    match r {
        BlobRef::Named { key, .. } => model.named_blob(key)?.2.ok(),
        BlobRef::Payload { offset, size } => {
            let range = checked_range(
                "payload constant",
                payload.range.start(),
                *offset,
                *size,
                payload.range.end(),
            )
            .ok()?;
            Some(Location {
                file: payload.file,
                range,
            })
        }
    }
}

/// How a value reads a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyRole {
    Constant,
    Scale,
}

impl KeyRole {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRole::Constant => "constant",
            KeyRole::Scale => "scale",
        }
    }

    /// What a value reads in this role, for messages: its "bytes" or its "scales".
    pub fn part(self) -> &'static str {
        match self {
            KeyRole::Constant => "bytes",
            KeyRole::Scale => "scales",
        }
    }
}

/// One blob a payload reads: a value's constant bytes or its scales.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// The id of the value that reads it.
    pub value: u32,
    pub role: KeyRole,
    /// The value's datatype (`"qbint4"`).
    pub datatype: String,
    pub dims: Vec<u32>,
    /// The value's datatype and dims, for messages: `"qbint4[64,64]"`.
    pub describe: String,
    /// What the blob holds, for tables of bytes by kind: `"qbint4"`, `"qbint4 scales (bf16)"`.
    pub label: String,
    pub bytes: BlobRef,
    /// The bytes are part of the graph's own table (an inline vector of scales), not a
    /// blob of their own: tables of bytes by kind leave them out.
    pub inline: bool,
    /// Bytes the graph needs there (what its datatype and dims, or its scale count, imply);
    /// None when that cannot be computed (the graph is inconsistent: `check` says so).
    pub expected: Option<u64>,
    /// How `weights.safetensors` types the blob when it is named data: a safetensors dtype
    /// and shape (4-bit types as packed `U8`); None for raw bytes.
    pub safetensors: Option<(&'static str, Vec<u64>)>,
}

/// Bytes of a tensor of `dims` whose elements take `size` bytes each (`row_bytes`, when
/// given, replaces the last dimension's bytes: a packed row), for the datatype named `name`;
/// a datatype without a fixed size, or a product that overflows, is refused by name.
pub fn tensor_nbytes(
    name: &str, size: Option<u64>, dims: &[u32], row_bytes: Option<fn(u64) -> u64>,
) -> crate::error::Result<u64> {
    use crate::error::Error;
    let size =
        size.ok_or_else(|| Error::invalid(format!("datatype {name} has no fixed element size")))?;
    let overflow = || Error::invalid(format!("byte size of {name} {dims:?} overflows 64 bits"));
    let (first, rest) = match (row_bytes, dims.split_last()) {
        (Some(row), Some((&last, rows))) => (row(u64::from(last)), rows),
        (Some(row), None) => (row(1), dims),
        (None, _) => (size, dims),
    };
    rest.iter()
        .try_fold(first, |n, &d| n.checked_mul(u64::from(d)))
        .ok_or_else(overflow)
}

/// New bytes a float write gives one blob of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobWrite {
    /// The value whose blob it is, and which of its blobs.
    pub value: u32,
    pub role: KeyRole,
    /// The blob, as the graph names it.
    pub bytes: BlobRef,
    /// Where it is (cut to the bytes the value reads).
    pub at: Location,
    pub new: Vec<u8>,
}

/// Where a referenced blob is, for a value's `.json`: the file's name, the absolute offset
/// of its first byte in it, and the byte count there (a named-data entry's own size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedBytes {
    pub file: String,
    pub file_offset: u64,
    pub nbytes: u64,
}

/// Maps a reference to the file that holds it; None when the caller cannot (a key in no
/// attached file).
pub type Resolver<'a> = &'a dyn Fn(&BlobRef) -> Option<ResolvedBytes>;

/// `{"named_key"|"payload_offset", "file", "file_offset", "nbytes"}` of a reference, as a
/// value's `.json` shows where its bytes are: the file and offset `resolve` finds, else
/// nulls and the size the graph records.
pub fn bytes_json(r: &BlobRef, resolve: Resolver) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::json;
    let mut m = serde_json::Map::new();
    match r {
        BlobRef::Named { key, .. } => m.insert("named_key".into(), json!(key)),
        BlobRef::Payload { offset, .. } => m.insert("payload_offset".into(), json!(offset)),
    };
    let found = resolve(r);
    m.insert("file".into(), json!(found.as_ref().map(|f| &f.file)));
    m.insert(
        "file_offset".into(),
        json!(found.as_ref().map(|f| f.file_offset)),
    );
    m.insert("nbytes".into(), json!(found.map_or(r.size(), |f| f.nbytes)));
    m
}
