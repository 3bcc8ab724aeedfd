//! The XNNPACK delegate payload (`XnnpackBackend`): decoding, JSON and text renderings, and the
//! (de)quantization of its constants (docs/tree.md#xnnpack-delegates,
//! docs/formats.md#the-xh00-header, docs/formats.md#named-data-keys,
//! docs/formats.md#dequantization-rules).
//!
//! Invariants:
//! - [`decode`] returns an [`XnnGraph`] only when the whole payload is sound: the `XH00`
//!   header's regions lie inside the payload, the flatbuffer passed the FlatBuffers verifier
//!   (apparent size bounded by a multiple of its length, so a hostile payload cannot unpack
//!   into gigabytes), its identifier is `XN00` or `XN01`, every value id a node, `input_ids`
//!   or `output_ids` names exists, `id_out`s are unique, and every `constant_buffer_idx` and
//!   `scale_buffer_idx` resolves to named data or to bytes inside the payload.
//! - Constant bytes are never copied: a [`BlobRef`] says where they are (a named-data key,
//!   or an offset from the payload's first byte). The caller resolves keys.
//! - Every offset and size from the payload goes through checked arithmetic; nothing here
//!   panics on any input.
//! - Renderings depend only on the payload (and the caller's resolver), so equal payloads
//!   render equal bytes.
//! - [`quant`] dequantizes exactly what the runtime computes with, for any window of
//!   elements, and re-quantizes so that dequantizing the result reproduces the stored scales.

pub mod datatype;
pub mod graph;
pub mod header;
pub mod nodes;
pub mod payload;
pub mod placed;
pub mod quant;
pub mod render;
pub mod write;

pub use crate::backend::blob::{BlobRef, KeyRole};
pub use datatype::Datatype;
pub use graph::{
    decode, ConstantDataEntry, External, Identifier, NamedUse, OutputMinMax, QuantParams,
    ScaleDtype, ScaleRef, Use, XnnGraph, XnnNode, XnnValue,
};
pub use header::XnnHeader;
pub use nodes::{FieldValue, NodeField, NO_VALUE};
pub use payload::Xnnpack;
pub use quant::{QuantError, QuantLayout};

/// The `BackendDelegate.id` of XNNPACK delegates.
pub const BACKEND_ID: &str = "XnnpackBackend";
