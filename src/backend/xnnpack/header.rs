//! The `XH00` header that starts an XNNPACK payload (docs/formats.md#the-xh00-header,
//! docs/formats.md#dequantization-rules).
//!
//! The layout is `backend::header`'s, with `XH00` as its magic and the data region holding
//! constants. A payload without `XH00` at offset 4 is a bare `XNNGraph` flatbuffer (older
//! exports).

use crate::backend::header::{self, PayloadHeader};
use crate::format::range::{checked_range, ByteRange};
use crate::format::FormatError;

pub use crate::backend::header::HEADER_LENGTH;

pub const HEADER_MAGIC: &[u8; 4] = b"XH00";

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

/// The payload's `XH00` header, `None` for a bare flatbuffer, or why the header is unusable:
/// truncated, a length below 30, or a flatbuffer or constant region that leaves the payload,
/// overlaps the header or overlaps each other.
pub fn parse_header(payload: &[u8]) -> Result<Option<XnnHeader>, FormatError> {
    let Some(h) = PayloadHeader::read(payload, HEADER_MAGIC, "XNNPACK")? else {
        return Ok(None);
    };
    let len = payload.len() as u64;
    let header = XnnHeader {
        header_length: h.header_length,
        flatbuffer_offset: h.flatbuffer_offset,
        flatbuffer_size: h.flatbuffer_size,
        constant_data_offset: h.data_offset,
        constant_data_size: h.data_size,
    };
    let fb = header.flatbuffer_range();
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

/// A payload laid out as ExecuTorch lays one out: the `XH00` header, `flatbuffer` at offset
/// 32, then `constants` (the constant region) at the next multiple of 16; what
/// [`parse_header`] reads back. For tools and tests that build payloads.
pub fn payload_with_header(flatbuffer: &[u8], constants: &[u8]) -> Result<Vec<u8>, FormatError> {
    header::payload_with_header(HEADER_MAGIC, "an XNNPACK", flatbuffer, constants)
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
