//! The `VH00` header that starts a Vulkan payload.
//!
//! The layout is `backend::header`'s (30 bytes used, 32 written), with `VH00` as its magic
//! and the data region (the "bytes region") holding constants stored in the payload. A
//! payload without `VH00` at offset 4 is taken as a bare `VkGraph` flatbuffer, whose own
//! identifier (`VK00`) sits at the same offset; the runtime itself only loads payloads with a
//! header.

use crate::backend::header::{self, PayloadHeader};
use crate::format::range::{checked_range, ByteRange};
use crate::format::FormatError;

pub use crate::backend::header::HEADER_LENGTH;

pub const HEADER_MAGIC: &[u8; 4] = b"VH00";

/// The `VH00` fields, checked against the payload they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VkHeader {
    pub header_length: u16,
    pub flatbuffer_offset: u32,
    pub flatbuffer_size: u32,
    pub bytes_offset: u32,
    pub bytes_size: u64,
}

impl VkHeader {
    /// Where the `VkGraph` flatbuffer is, relative to the payload start.
    pub fn flatbuffer_range(&self) -> ByteRange {
        ByteRange::new(
            u64::from(self.flatbuffer_offset),
            u64::from(self.flatbuffer_size),
        )
        .expect("two u32 values cannot overflow a u64")
    }

    /// The bytes region as the runtime reads it (`VulkanBackend.cpp`, `compileModel`): a
    /// `bytes_size` of 0 stands for everything from `bytes_offset` to the payload's end.
    /// `parse_header` checked that the region lies inside a payload of `payload_len` bytes.
    pub fn bytes_range(&self, payload_len: u64) -> ByteRange {
        let start = u64::from(self.bytes_offset);
        let size = if self.bytes_size == 0 {
            payload_len.saturating_sub(start)
        } else {
            self.bytes_size
        };
        ByteRange::new(start, size).unwrap_or_default()
    }
}

/// The payload's `VH00` header, `None` for a bare flatbuffer, or why the header is unusable.
/// The checks are the runtime's (`VulkanDelegateHeader::is_valid` and `parse`): a length of at
/// least 30 (and here, inside the payload), a non-empty flatbuffer starting at or after the
/// header's end, a bytes region starting at or after the flatbuffer's end, both inside the
/// payload.
pub fn parse_header(payload: &[u8]) -> Result<Option<VkHeader>, FormatError> {
    let Some(h) = PayloadHeader::read(payload, HEADER_MAGIC, "Vulkan")? else {
        return Ok(None);
    };
    let len = payload.len() as u64;
    let header = VkHeader {
        header_length: h.header_length,
        flatbuffer_offset: h.flatbuffer_offset,
        flatbuffer_size: h.flatbuffer_size,
        bytes_offset: h.data_offset,
        bytes_size: h.data_size,
    };
    if header.flatbuffer_size == 0 {
        return Err(FormatError::mismatch(
            "VH00 flatbuffer size",
            "payload byte 14",
            "a non-zero size",
            0,
        ));
    }
    let fb = header.flatbuffer_range();
    let bytes_offset = u64::from(header.bytes_offset);
    if bytes_offset < fb.end() {
        return Err(FormatError::mismatch(
            "VH00 bytes offset",
            "payload byte 18",
            format!("at least {} (the end of the flatbuffer)", fb.end()),
            bytes_offset,
        ));
    }
    let what = format!(
        "VH00 bytes region (offset {bytes_offset}, size {})",
        header.bytes_size
    );
    checked_range(&what, 0, bytes_offset, header.bytes_size, len)?;
    Ok(Some(header))
}

/// A payload laid out as ExecuTorch lays one out (`vulkan_graph_serialize.py`,
/// `serialize_vulkan_graph`): the `VH00` header, `flatbuffer` at offset 32, then `bytes` (the
/// bytes region) at the next multiple of 16, padded to a multiple of 16; what
/// [`parse_header`] reads back. For tools and tests that build payloads.
pub fn payload_with_header(flatbuffer: &[u8], bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
    let mut out = header::payload_with_header(HEADER_MAGIC, "a Vulkan", flatbuffer, bytes)?;
    out.resize(out.len().next_multiple_of(16), 0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fo: u32, fs: u32, bo: u32, bs: u64, total: usize) -> Vec<u8> {
        let mut b = vec![0u8; total];
        b[4..8].copy_from_slice(HEADER_MAGIC);
        b[8..10].copy_from_slice(&HEADER_LENGTH.to_le_bytes());
        b[10..14].copy_from_slice(&fo.to_le_bytes());
        b[14..18].copy_from_slice(&fs.to_le_bytes());
        b[18..22].copy_from_slice(&bo.to_le_bytes());
        b[22..30].copy_from_slice(&bs.to_le_bytes());
        b
    }

    #[test]
    fn reads_and_bounds_the_regions() {
        let h = parse_header(&header(32, 64, 96, 32, 128)).unwrap().unwrap();
        assert_eq!(h.flatbuffer_range(), ByteRange::new(32, 64).unwrap());
        assert_eq!(h.bytes_range(128), ByteRange::new(96, 32).unwrap());
        // An empty region at the very end, and a size of 0 reaching to the payload's end.
        let h = parse_header(&header(32, 64, 96, 0, 96)).unwrap().unwrap();
        assert!(h.bytes_range(96).is_empty());
        let h = parse_header(&header(32, 64, 96, 0, 112)).unwrap().unwrap();
        assert_eq!(h.bytes_range(112), ByteRange::new(96, 16).unwrap());
        assert!(parse_header(b"\0\0\0\0VK00").unwrap().is_none());
    }

    #[test]
    fn payloads_built_here_read_back() {
        let p = payload_with_header(&[7; 45], &[9; 5]).unwrap();
        let h = parse_header(&p).unwrap().unwrap();
        assert_eq!(h.flatbuffer_range(), ByteRange::new(32, 45).unwrap());
        assert_eq!(
            h.bytes_range(p.len() as u64),
            ByteRange::new(80, 5).unwrap()
        );
        assert_eq!(&p[32..77], &[7; 45]);
        assert_eq!(&p[80..85], &[9; 5]);
        assert_eq!(p.len(), 96);
    }

    #[test]
    fn refuses_bad_headers() {
        let bad = [
            (header(32, 64, 96, 33, 128), "bytes region"), // past the end
            (header(32, 97, 129, 0, 128), "flatbuffer"),   // past the end
            (header(16, 64, 96, 0, 128), "flatbuffer offset"), // over the header
            (header(32, 64, 64, 32, 128), "bytes offset"), // over the flatbuffer
            (header(32, 64, 96, u64::MAX, 128), "bytes region"), // overflows
            (header(32, 0, 96, 0, 128), "flatbuffer size"), // empty flatbuffer
        ];
        for (b, what) in bad {
            let e = parse_header(&b).unwrap_err();
            assert!(e.message().contains("VH00"), "{e}");
            assert!(e.message().contains(what), "{what}: {e}");
        }
        let mut short_len = header(32, 64, 96, 0, 128);
        short_len[8] = 29;
        let e = parse_header(&short_len).unwrap_err();
        assert!(e.message().contains("header length"), "{e}");
        assert!(e.message().contains("found 29"), "{e}");
        assert!(parse_header(&header(32, 64, 96, 0, 128)[..29]).is_err());
        assert!(parse_header(&[0; 7]).is_err());
    }
}
