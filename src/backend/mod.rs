//! Backend payloads: what a delegate's processed bytes hold, for the backends ptefs decodes
//! (docs/tree.md#inside-backend-payloads, docs/formats.md#xnnpack-payloads, docs/formats/vulkan.md).
//!
//! Everything above this module (the tree, reads, `check`, `info`, writes) talks to a
//! decoded payload through the [`Payload`] trait and finds a decoder through [`backend`],
//! which looks in [`BACKENDS`]: adding a backend is a module here that implements
//! [`Backend`] and [`Payload`], and one line in that list. Like gimli's `object` crate
//! dispatching file formats, the rest of the crate never names a backend.
//!
//! Invariants:
//! - A decoder returns a payload only when the whole payload is sound: every offset and
//!   size it read lies inside the payload, every id it resolved exists. Decoders never
//!   panic and never read outside the payload, on any input.
//! - Constant bytes are never copied into a decoded payload: a [`BlobRef`] says where they
//!   are (a named-data key, or an offset from the payload's first byte), and the caller
//!   resolves it against the model ([`locate`]).
//! - Renderings depend only on the payload (and the caller's resolver), so equal payloads
//!   render equal bytes.
//! - A float view dequantizes exactly what the runtime computes with, for any window of
//!   elements; a float write re-quantizes so that dequantizing the result reproduces the
//!   stored scales.

pub mod blob;
pub mod float16;
pub mod header;
pub mod plain;
pub mod view;
pub mod vulkan;
pub mod xnnpack;

use std::fmt;

use serde_json::Value;

use crate::content::Source;
use crate::error::Result;
use crate::format::layout::Location;
use crate::format::{FormatError, Model};

pub use blob::{locate, Blob, BlobRef, BlobWrite, KeyRole, ResolvedBytes, Resolver};
pub use view::{float_spacing, Dequantize, FloatFormat, FloatView};

/// Every backend this build decodes, one line each.
pub static BACKENDS: &[&dyn Backend] = &[&xnnpack::Xnnpack, &vulkan::Vulkan];

/// A backend whose delegate payloads ptefs decodes.
pub trait Backend: Sync {
    /// The `BackendDelegate.id` of its delegates (`"XnnpackBackend"`).
    fn id(&self) -> &'static str;
    /// The directory its decoded tree gets under `delegates/<j>/` (`"xnnpack"`).
    fn dir_name(&self) -> &'static str;
    /// Its name in reports (`"XNNPACK"`).
    fn display_name(&self) -> &'static str;
    /// Decodes a payload, or says why it does not decode (what, where, expected, found).
    fn decode(&self, payload: &[u8]) -> std::result::Result<Box<dyn Payload>, FormatError>;
}

/// The decoder of delegates whose `BackendDelegate.id` is `id`.
pub fn backend(id: &str) -> Option<&'static dyn Backend> {
    BACKENDS.iter().copied().find(|b| b.id() == id)
}

/// A constant a payload's value holds: where its bytes are, and how the tree shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constant {
    pub bytes: BlobRef,
    /// The value's datatype and dims, for messages: `"qbint4[64,64]"`.
    pub what: String,
    /// The NumPy dtype and shape of its `.npy`, when NumPy can describe its bytes.
    pub npy: Option<(&'static str, Vec<u64>)>,
}

/// A decoded delegate payload: its graph, values and constants.
///
/// Values are addressed by position (`k`, `0..value_count()`) and named by id (the file
/// name under `values/`, and what writes name).
pub trait Payload: Send + Sync + fmt::Debug {
    /// The backend that decoded it.
    fn backend(&self) -> &'static dyn Backend;
    /// `header.json`: the fields of the payload's own header, or null.
    fn header_json(&self) -> Value;
    /// `graph.json`: the whole graph table. `payload` is the bytes the payload was decoded
    /// from.
    fn graph_json(&self, payload: &[u8]) -> Value;
    /// `graph.txt`: one line per node or operator call.
    fn graph_txt(&self) -> String;
    /// `graph.dot`: the graph for Graphviz, nodes and calls as boxes, values as edges,
    /// constants, inputs and outputs as nodes of their own
    /// (docs/tree.md#graphs-as-graphviz-files).
    fn graph_dot(&self) -> String;
    /// The operator of each node or operator call, in graph order.
    fn op_names(&self) -> Vec<String>;
    /// How many values the graph has.
    fn value_count(&self) -> usize;
    /// The id of value `k`.
    fn value_id(&self, k: usize) -> u32;
    /// The position of the value whose id is `id`.
    fn value_index(&self, id: u32) -> Option<usize>;
    /// `values/<id>.json` of value `k`; `resolve` says where referenced bytes are.
    fn value_json(&self, k: usize, resolve: Resolver) -> Value;
    /// The constant value `k` holds; None for activations, inputs and outputs.
    fn constant(&self, k: usize) -> Option<Constant>;
    /// How value `k` dequantizes to float32 (`values/<id>.f32.npy`): half-precision and
    /// quantized constants whose layout the backend knows. `locate` resolves references.
    fn float_view(
        &self, k: usize, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<FloatView>;
    /// The float32 values constant `k` stands for, for statistics (`values/<id>.hist.svg`,
    /// docs/tree.md#histograms): the float view of a quantized or half-precision constant,
    /// and a float32 constant as it is; None for constants of other types.
    fn value_view(
        &self, k: usize, locate: &dyn Fn(&BlobRef) -> Option<Location>,
    ) -> Option<FloatView>;
    /// Whether a float32 array written to value `k`'s float view can be converted back
    /// (re-quantized) into its bytes.
    fn float_writable(&self, k: usize) -> bool;
    /// Every blob the graph reads (constants and scale blobs), in value order, with what
    /// each must hold.
    fn blobs(&self) -> Vec<Blob>;
    /// Why the runtime would refuse `new` as the bytes of `blob` (one of `blobs()`), naming
    /// the first value at fault and its index ("scale 2 is 0 (zero)"); Ok for bytes it takes
    /// as they are (weights). Writes that land on a blob are checked with this before
    /// anything is written, and `check` reports stored blobs it refuses
    /// (docs/writes.md#quantization-parameters).
    fn check_blob(&self, blob: &Blob, new: &[u8]) -> std::result::Result<(), String>;
    /// The new bytes that make `body` (`numel` little-endian float32 values, the float
    /// view's shape) the value of value `id`: the constant's bytes and whatever must change
    /// with them (scales, a bias in the filter's units). Nothing is written here; the caller
    /// refuses writes that other values read too, and commits them together.
    fn plan_float_write(
        &self, model: &Model, payload: Location, id: u32, body: Source,
    ) -> Result<Vec<BlobWrite>>;
}

/// Why a delegate payload has no decoded view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotDecoded {
    /// No decoder for this backend id; the payload stays an opaque blob.
    NoDecoder,
    /// The backend has a decoder, and the payload does not decode.
    Invalid(FormatError),
}

impl fmt::Display for NotDecoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotDecoded::NoDecoder => f.write_str("no decoder for this backend"),
            NotDecoded::Invalid(e) => write!(f, "{e}"),
        }
    }
}

/// Decodes the payload of a delegate whose `BackendDelegate.id` is `backend_id`.
pub fn decode_payload(
    backend_id: &str, payload: &[u8],
) -> std::result::Result<Box<dyn Payload>, NotDecoded> {
    let backend = backend(backend_id).ok_or(NotDecoded::NoDecoder)?;
    backend.decode(payload).map_err(NotDecoded::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatches_on_the_backend_id() {
        assert!(matches!(
            decode_payload("NoSuchBackend", b"anything"),
            Err(NotDecoded::NoDecoder)
        ));
        match decode_payload(xnnpack::BACKEND_ID, b"\0\0\0\0ZZ99") {
            Err(NotDecoded::Invalid(e)) => assert!(e.message().contains("XN00 or XN01"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn backends_have_distinct_ids_and_directories() {
        for (i, a) in BACKENDS.iter().enumerate() {
            for b in &BACKENDS[i + 1..] {
                assert_ne!(a.id(), b.id());
                assert_ne!(a.dir_name(), b.dir_name());
            }
        }
    }
}
