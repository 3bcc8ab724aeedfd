//! Decoders for the payloads that backends keep inside delegates (DESIGN.md §2.7).
//!
//! One module per backend, each with a `BACKEND_ID` (the `BackendDelegate.id` it decodes)
//! and a `decode(payload)` that returns the backend's own view of the payload or a
//! [`FormatError`] naming the defect. [`decode_payload`] dispatches on the backend id; a new
//! backend (Vulkan `VK00`, CoreML, QNN) adds a module, a [`BackendView`] variant and a match
//! arm. Decoders never panic, never read outside the payload, and depend only on `format`
//! and the crate's error type.

pub mod vulkan;
pub mod xnnpack;

use std::fmt;

use crate::format::FormatError;

/// A decoded delegate payload.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendView {
    Xnnpack(Box<xnnpack::XnnGraph>),
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
pub fn decode_payload(backend_id: &str, payload: &[u8]) -> Result<BackendView, NotDecoded> {
    match backend_id {
        xnnpack::BACKEND_ID => xnnpack::decode(payload)
            .map(|g| BackendView::Xnnpack(Box::new(g)))
            .map_err(NotDecoded::Invalid),
        _ => Err(NotDecoded::NoDecoder),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatches_on_the_backend_id() {
        assert_eq!(
            decode_payload("VulkanBackend", b"anything"),
            Err(NotDecoded::NoDecoder)
        );
        match decode_payload(xnnpack::BACKEND_ID, b"\0\0\0\0ZZ99") {
            Err(NotDecoded::Invalid(e)) => assert!(e.message().contains("XN00 or XN01"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
