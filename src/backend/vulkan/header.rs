//! The `VH00` header that starts a Vulkan payload.
//!
//! Layout (little-endian, 30 bytes used, 32 written): 4 zero bytes, `VH00` at offset 4, u16
//! header length (30), u32 flatbuffer offset, u32 flatbuffer size, u32 offset of the bytes
//! region (constants stored in the payload), u64 size of that region. A payload without
//! `VH00` at offset 4 is taken as a bare `VkGraph` flatbuffer, whose own identifier (`VK00`)
//! sits at the same offset; the runtime itself only loads payloads with a header.

use crate::format::range::{checked_range, ByteRange};
use crate::format::FormatError;

pub const HEADER_MAGIC: &[u8; 4] = b"VH00";
/// Bytes of the header as ExecuTorch writes it; the runtime accepts a longer declared length.
pub const HEADER_LENGTH: u16 = 30;

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

/// The payload's `VH00` header, `None` for a bare flatbuffer, or why the header is unusable.
/// The checks are the runtime's (`VulkanDelegateHeader::is_valid` and `parse`): a length of at
/// least 30 (and here, inside the payload), a non-empty flatbuffer starting at or after the
/// header's end, a bytes region starting at or after the flatbuffer's end, both inside the
/// payload.
pub fn parse_header(payload: &[u8]) -> Result<Option<VkHeader>, FormatError> {
    let len = payload.len() as u64;
    if payload.len() < 8 {
        return Err(FormatError::mismatch(
            "Vulkan payload size",
            "the payload",
            "at least 8 bytes (a root offset and an identifier)",
            format!("{len} bytes"),
        ));
    }
    if &payload[4..8] != HEADER_MAGIC {
        return Ok(None);
    }
    if payload.len() < usize::from(HEADER_LENGTH) {
        return Err(FormatError::mismatch(
            "VH00 header",
            "payload byte 0",
            format!("{HEADER_LENGTH} bytes"),
            format!("a payload of {len} bytes"),
        ));
    }
    let header = VkHeader {
        header_length: u16_at(payload, 8),
        flatbuffer_offset: u32_at(payload, 10),
        flatbuffer_size: u32_at(payload, 14),
        bytes_offset: u32_at(payload, 18),
        bytes_size: u64_at(payload, 22),
    };
    if header.header_length < HEADER_LENGTH || u64::from(header.header_length) > len {
        return Err(FormatError::mismatch(
            "VH00 header length",
            "payload byte 8",
            format!("{HEADER_LENGTH}..={len} (the payload size)"),
            header.header_length,
        ));
    }
    if header.flatbuffer_size == 0 {
        return Err(FormatError::mismatch(
            "VH00 flatbuffer size",
            "payload byte 14",
            "a non-zero size",
            0,
        ));
    }
    let fb = header.flatbuffer_range();
    let what = format!("VH00 flatbuffer (offset {}, size {})", fb.start(), fb.len());
    let fb = checked_range(&what, 0, fb.start(), fb.len(), len)?;
    if fb.start() < u64::from(header.header_length) {
        return Err(FormatError::mismatch(
            "VH00 flatbuffer offset",
            "payload byte 10",
            format!("at least {} (the header length)", header.header_length),
            fb.start(),
        ));
    }
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

/// Where ExecuTorch puts the flatbuffer: right after the 30-byte header, 16-aligned.
const FLATBUFFER_OFFSET: u32 = 32;

/// A payload laid out as ExecuTorch lays one out (`vulkan_graph_serialize.py`,
/// `serialize_vulkan_graph`): the `VH00` header, `flatbuffer` at offset 32, then `bytes` (the
/// bytes region) at the next multiple of 16, padded to a multiple of 16; what
/// [`parse_header`] reads back. For tools and tests that build payloads.
pub fn payload_with_header(flatbuffer: &[u8], bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
    let too_large = || {
        FormatError::new(format!(
            "a Vulkan payload of a {}-byte flatbuffer and {} bytes of constants: offsets and sizes must fit the VH00 header's 32 bits",
            flatbuffer.len(),
            bytes.len()
        ))
    };
    let fb_size = u32::try_from(flatbuffer.len()).map_err(|_| too_large())?;
    let bytes_offset = FLATBUFFER_OFFSET
        .checked_add(fb_size.checked_next_multiple_of(16).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    let mut out = vec![0u8; bytes_offset as usize];
    out[4..8].copy_from_slice(HEADER_MAGIC);
    out[8..10].copy_from_slice(&HEADER_LENGTH.to_le_bytes());
    out[10..14].copy_from_slice(&FLATBUFFER_OFFSET.to_le_bytes());
    out[14..18].copy_from_slice(&fb_size.to_le_bytes());
    out[18..22].copy_from_slice(&bytes_offset.to_le_bytes());
    out[22..30].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    let fb_at = FLATBUFFER_OFFSET as usize;
    out[fb_at..fb_at + flatbuffer.len()].copy_from_slice(flatbuffer);
    out.extend_from_slice(bytes);
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
