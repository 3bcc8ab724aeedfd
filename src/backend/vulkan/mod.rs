//! The Vulkan delegate payload (`VulkanBackend`): decoding, JSON and text renderings, and
//! the dequantization of its half-precision and 4-bit constants (docs/formats/vulkan.md).
//!
//! Invariants:
//! - [`decode`] returns a [`VkGraph`] only when the whole payload is sound: the `VH00`
//!   header's regions lie inside the payload, in order (header, flatbuffer, bytes region),
//!   the flatbuffer passed the FlatBuffers verifier (apparent size bounded by a multiple of
//!   its length, so a hostile payload cannot unpack into gigabytes), its identifier is
//!   `VK00`, every value holds a known `GraphTypes` member, every value id an operator
//!   argument, `ValueList`, `input_ids` or `output_ids` names exists, every operator has a
//!   name, and every `constant_id >= 0` resolves to named data or to bytes inside the bytes
//!   region (both the recorded `length` and the tensor's own size, which the runtime reads).
//! - Constant bytes are never copied: a [`BlobRef`] says where they are (a named-data key,
//!   or an offset from the payload's first byte). The caller resolves keys.
//! - Every offset and size from the payload goes through checked arithmetic; nothing here
//!   panics on any input.
//! - Renderings depend only on the payload (and the caller's resolver), so equal payloads
//!   render equal bytes.
//! - [`quant`] dequantizes exactly what the exporter's reference arithmetic computes, for any
//!   window of elements, and gives a layout only where the packing is established.

pub mod datatype;
pub mod graph;
pub mod header;
pub mod payload;
pub mod quant;
pub mod render;

pub use datatype::{Datatype, MemoryLayout, StorageType};
pub use graph::{
    decode, BlobRef, BytesEntry, External, NamedUse, OperatorCall, Use, ValueKind, VkGraph,
    VkTensor, VkValue, NAMED_DATA_OFFSET,
};
pub use header::VkHeader;
pub use payload::Vulkan;
pub use quant::{Packing, QuantError, QuantLayout};

/// The `BackendDelegate.id` of Vulkan delegates.
pub const BACKEND_ID: &str = "VulkanBackend";
