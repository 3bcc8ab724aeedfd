//! The `XH00` header that starts an XNNPACK payload (docs/formats.md#the-xh00-header,
//! docs/formats.md#dequantization-rules).
//!
//! Layout (little-endian): 4 unused bytes, `XH00` at offset 4, u16 header length (30), u32
//! flatbuffer offset, u32 flatbuffer size, u32 constant-data offset, u64 constant-data size.
//! A payload without `XH00` at offset 4 is a bare `XNNGraph` flatbuffer (older exports),
//! whose own identifier sits at the same offset.

use crate::format::range::{checked_range, ByteRange};
use crate::format::FormatError;

pub const HEADER_MAGIC: &[u8; 4] = b"XH00";
/// Bytes of the header as ExecuTorch writes it; a longer declared length is accepted.
pub const HEADER_LENGTH: u16 = 30;

/// The `XH00` fields, checked against the payload they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XnnHeader {
    pub header_length: u16,
    pub flatbuffer_offset: u32,
    pub flatbuffer_size: u32,
    pub constant_data_offset: u32,
    pub constant_data_size: u64,
}

impl XnnHeader {
    /// Where the `XNNGraph` flatbuffer is, relative to the payload start.
    pub fn flatbuffer_range(&self) -> ByteRange {
        ByteRange::new(
            u64::from(self.flatbuffer_offset),
            u64::from(self.flatbuffer_size),
        )
        .expect("two u32 values cannot overflow a u64")
    }

    /// Where the constant-data region is, relative to the payload start.
    pub fn constant_range(&self) -> ByteRange {
        // `parse_header` checked that the range ends inside the payload.
        ByteRange::new(
            u64::from(self.constant_data_offset),
            self.constant_data_size,
        )
        .unwrap_or_default()
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

/// The payload's `XH00` header, `None` for a bare flatbuffer, or why the header is unusable:
/// truncated, a length below 30, or a flatbuffer or constant region that leaves the payload,
/// overlaps the header or overlaps each other.
pub fn parse_header(payload: &[u8]) -> Result<Option<XnnHeader>, FormatError> {
    let len = payload.len() as u64;
    if payload.len() < 8 {
        return Err(FormatError::mismatch(
            "XNNPACK payload size",
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
            "XH00 header",
            "payload byte 0",
            format!("{HEADER_LENGTH} bytes"),
            format!("a payload of {len} bytes"),
        ));
    }
    let header = XnnHeader {
        header_length: u16_at(payload, 8),
        flatbuffer_offset: u32_at(payload, 10),
        flatbuffer_size: u32_at(payload, 14),
        constant_data_offset: u32_at(payload, 18),
        constant_data_size: u64_at(payload, 22),
    };
    if header.header_length < HEADER_LENGTH || u64::from(header.header_length) > len {
        return Err(FormatError::mismatch(
            "XH00 header length",
            "payload byte 8",
            format!("{HEADER_LENGTH}..={len} (the payload size)"),
            header.header_length,
        ));
    }
    let fb = header.flatbuffer_range();
    let what = format!("XH00 flatbuffer (offset {}, size {})", fb.start(), fb.len());
    let fb = checked_range(&what, 0, fb.start(), fb.len(), len)?;
    if fb.start() < u64::from(header.header_length) {
        return Err(FormatError::mismatch(
            "XH00 flatbuffer offset",
            "payload byte 10",
            format!("at least {} (the header length)", header.header_length),
            fb.start(),
        ));
    }
    let (cd_offset, cd_size) = (
        u64::from(header.constant_data_offset),
        header.constant_data_size,
    );
    let what = format!("XH00 constant data (offset {cd_offset}, size {cd_size})");
    let cd = checked_range(&what, 0, cd_offset, cd_size, len)?;
    let overlaps = |a: ByteRange, b: ByteRange| a.start() < b.end() && b.start() < a.end();
    let header_bytes = ByteRange::new(0, u64::from(header.header_length)).expect("a u16 length");
    if !cd.is_empty() && (overlaps(cd, fb) || overlaps(cd, header_bytes)) {
        return Err(FormatError::mismatch(
            "XH00 constant data",
            format!("payload bytes {}..{}", cd.start(), cd.end()),
            format!(
                "a region apart from the header (0..{}) and the flatbuffer ({}..{})",
                header_bytes.end(),
                fb.start(),
                fb.end()
            ),
            "an overlap",
        ));
    }
    Ok(Some(header))
}

/// Where ExecuTorch puts the flatbuffer: right after the 30-byte header, 16-aligned.
const FLATBUFFER_OFFSET: u32 = 32;

/// A payload laid out as ExecuTorch lays one out: the `XH00` header, `flatbuffer` at offset
/// 32, then `constants` (the constant region) at the next multiple of 16; what
/// [`parse_header`] reads back. For tools and tests that build payloads.
pub fn payload_with_header(flatbuffer: &[u8], constants: &[u8]) -> Result<Vec<u8>, FormatError> {
    let too_large = || {
        FormatError::new(format!(
            "an XNNPACK payload of a {}-byte flatbuffer and {} bytes of constants: offsets and sizes must fit the XH00 header's 32 bits",
            flatbuffer.len(),
            constants.len()
        ))
    };
    let fb_size = u32::try_from(flatbuffer.len()).map_err(|_| too_large())?;
    let cd_offset = FLATBUFFER_OFFSET
        .checked_add(fb_size.checked_next_multiple_of(16).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    let mut out = vec![0u8; cd_offset as usize];
    out[4..8].copy_from_slice(HEADER_MAGIC);
    out[8..10].copy_from_slice(&HEADER_LENGTH.to_le_bytes());
    out[10..14].copy_from_slice(&FLATBUFFER_OFFSET.to_le_bytes());
    out[14..18].copy_from_slice(&fb_size.to_le_bytes());
    out[18..22].copy_from_slice(&cd_offset.to_le_bytes());
    out[22..30].copy_from_slice(&(constants.len() as u64).to_le_bytes());
    let fb_at = FLATBUFFER_OFFSET as usize;
    out[fb_at..fb_at + flatbuffer.len()].copy_from_slice(flatbuffer);
    out.extend_from_slice(constants);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fo: u32, fs: u32, co: u32, cs: u64, total: usize) -> Vec<u8> {
        let mut b = vec![0u8; total];
        b[4..8].copy_from_slice(HEADER_MAGIC);
        b[8..10].copy_from_slice(&HEADER_LENGTH.to_le_bytes());
        b[10..14].copy_from_slice(&fo.to_le_bytes());
        b[14..18].copy_from_slice(&fs.to_le_bytes());
        b[18..22].copy_from_slice(&co.to_le_bytes());
        b[22..30].copy_from_slice(&cs.to_le_bytes());
        b
    }

    #[test]
    fn reads_and_bounds_the_regions() {
        let h = parse_header(&header(32, 64, 96, 32, 128)).unwrap().unwrap();
        assert_eq!(h.flatbuffer_range(), ByteRange::new(32, 64).unwrap());
        assert_eq!(h.constant_range(), ByteRange::new(96, 32).unwrap());
        // Empty constant data may sit at the very end.
        assert!(parse_header(&header(32, 64, 96, 0, 96)).unwrap().is_some());
        assert!(parse_header(&[0, 0, 0, 0, b'X', b'N', b'0', b'1'])
            .unwrap()
            .is_none());
    }

    #[test]
    fn payloads_built_here_read_back() {
        let p = payload_with_header(&[7; 45], &[9; 5]).unwrap();
        let h = parse_header(&p).unwrap().unwrap();
        assert_eq!(h.flatbuffer_range(), ByteRange::new(32, 45).unwrap());
        assert_eq!(h.constant_range(), ByteRange::new(80, 5).unwrap());
        assert_eq!(&p[32..77], &[7; 45]);
        assert_eq!(&p[80..], &[9; 5]);
    }

    #[test]
    fn refuses_bad_headers() {
        let bad = [
            header(32, 64, 96, 33, 128),       // constant data past the end
            header(32, 97, 129, 0, 128),       // flatbuffer past the end
            header(16, 64, 96, 0, 128),        // flatbuffer over the header
            header(32, 64, 64, 32, 128),       // constant data over the flatbuffer
            header(32, 64, 96, u64::MAX, 128), // size overflows
        ];
        for b in bad {
            let e = parse_header(&b).unwrap_err();
            assert!(e.message().contains("XH00"), "{e}");
        }
        let mut short_len = header(32, 64, 96, 0, 128);
        short_len[8] = 29;
        assert!(parse_header(&short_len).is_err());
        assert!(parse_header(&header(32, 64, 96, 0, 128)[..29]).is_err());
        assert!(parse_header(&[0; 7]).is_err());
    }
}
