//! The header XNNPACK (`XH00`) and Vulkan (`VH00`) put in front of their payload's
//! flatbuffer: the same 30 bytes, each backend with its own magic and its own name for the
//! data region that follows (constants stored in the payload).
//!
//! Layout (little-endian): 4 unused bytes, the magic at offset 4, u16 header length (30),
//! u32 flatbuffer offset, u32 flatbuffer size, u32 data-region offset, u64 data-region size.
//! A payload without the magic at offset 4 is a bare flatbuffer, whose own identifier sits
//! at the same offset.
//!
//! Invariant: a header returned by [`PayloadHeader::read`] has a length of at least 30 that
//! fits the payload, and a flatbuffer inside the payload, starting at or after the header's
//! end; each backend checks its data region by its own runtime's rules.

use crate::format::range::{checked_range, ByteRange};
use crate::format::FormatError;

/// Bytes of the header as ExecuTorch writes it; a longer declared length is accepted.
pub const HEADER_LENGTH: u16 = 30;

/// Where ExecuTorch puts the flatbuffer: right after the 30-byte header, 16-aligned.
const FLATBUFFER_OFFSET: u32 = 32;

/// The header's fields, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadHeader {
    pub header_length: u16,
    pub flatbuffer_offset: u32,
    pub flatbuffer_size: u32,
    pub data_offset: u32,
    pub data_size: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

impl PayloadHeader {
    /// Where the flatbuffer is, relative to the payload start.
    pub fn flatbuffer_range(&self) -> ByteRange {
        ByteRange::new(
            u64::from(self.flatbuffer_offset),
            u64::from(self.flatbuffer_size),
        )
        .expect("two u32 values cannot overflow a u64")
    }

    /// The header tagged `magic` at the start of `payload`, `None` for a bare flatbuffer, or
    /// why it is unusable: truncated, a length below 30 or beyond the payload, or a
    /// flatbuffer that leaves the payload or starts inside the header. `backend` names the
    /// payload in messages (`"XNNPACK"`).
    pub fn read(
        payload: &[u8], magic: &[u8; 4], backend: &str,
    ) -> Result<Option<PayloadHeader>, FormatError> {
        let len = payload.len() as u64;
        let tag = String::from_utf8_lossy(magic);
        if payload.len() < 8 {
            return Err(FormatError::mismatch(
                &format!("{backend} payload size"),
                "the payload",
                "at least 8 bytes (a root offset and an identifier)",
                format!("{len} bytes"),
            ));
        }
        if &payload[4..8] != magic {
            return Ok(None);
        }
        if payload.len() < usize::from(HEADER_LENGTH) {
            return Err(FormatError::mismatch(
                &format!("{tag} header"),
                "payload byte 0",
                format!("{HEADER_LENGTH} bytes"),
                format!("a payload of {len} bytes"),
            ));
        }
        let header = PayloadHeader {
            header_length: u16_at(payload, 8),
            flatbuffer_offset: u32_at(payload, 10),
            flatbuffer_size: u32_at(payload, 14),
            data_offset: u32_at(payload, 18),
            data_size: u64_at(payload, 22),
        };
        if header.header_length < HEADER_LENGTH || u64::from(header.header_length) > len {
            return Err(FormatError::mismatch(
                &format!("{tag} header length"),
                "payload byte 8",
                format!("{HEADER_LENGTH}..={len} (the payload size)"),
                header.header_length,
            ));
        }
        let fb = header.flatbuffer_range();
        let what = format!(
            "{tag} flatbuffer (offset {}, size {})",
            fb.start(),
            fb.len()
        );
        let fb = checked_range(&what, 0, fb.start(), fb.len(), len)?;
        if fb.start() < u64::from(header.header_length) {
            return Err(FormatError::mismatch(
                &format!("{tag} flatbuffer offset"),
                "payload byte 10",
                format!("at least {} (the header length)", header.header_length),
                fb.start(),
            ));
        }
        Ok(Some(header))
    }
}

/// A payload laid out as ExecuTorch lays one out: the header tagged `magic`, `flatbuffer` at
/// offset 32, then `data` (the data region) at the next multiple of 16; what
/// [`PayloadHeader::read`] reads back. For tools and tests that build payloads; `backend`
/// names the payload in the refusal of one too large for the header's 32-bit fields.
pub fn payload_with_header(
    magic: &[u8; 4], backend: &str, flatbuffer: &[u8], data: &[u8],
) -> Result<Vec<u8>, FormatError> {
    let too_large = || {
        FormatError::new(format!(
            "{backend} payload of a {}-byte flatbuffer and {} bytes of constants: offsets and sizes must fit the {}'s 32 bits",
            flatbuffer.len(),
            data.len(),
            String::from_utf8_lossy(magic)
        ))
    };
    let fb_size = u32::try_from(flatbuffer.len()).map_err(|_| too_large())?;
    let data_offset = FLATBUFFER_OFFSET
        .checked_add(fb_size.checked_next_multiple_of(16).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    let mut out = vec![0u8; data_offset as usize];
    out[4..8].copy_from_slice(magic);
    out[8..10].copy_from_slice(&HEADER_LENGTH.to_le_bytes());
    out[10..14].copy_from_slice(&FLATBUFFER_OFFSET.to_le_bytes());
    out[14..18].copy_from_slice(&fb_size.to_le_bytes());
    out[18..22].copy_from_slice(&data_offset.to_le_bytes());
    out[22..30].copy_from_slice(&(data.len() as u64).to_le_bytes());
    let fb_at = FLATBUFFER_OFFSET as usize;
    out[fb_at..fb_at + flatbuffer.len()].copy_from_slice(flatbuffer);
    out.extend_from_slice(data);
    Ok(out)
}
