//! The fixed headers in front of the FlatBuffers: `ET12` and an optional `eh00` for a `.pte`,
//! `FT01` and `FH01` for a `.ptd` (docs/formats.md#the-eh00-extended-header,
//! docs/formats.md#the-fh01-header). All integers little-endian.
//!
//! Invariant: a parsed header's `program_end` and segment area lie within the file.

use super::range::checked_range;
use super::FormatError;

pub const PTE_IDENTIFIER: &[u8; 4] = b"ET12";
pub const PTD_IDENTIFIER: &[u8; 4] = b"FT01";
pub const PTE_EXTENDED_MAGIC: &[u8; 4] = b"eh00";
pub const PTD_EXTENDED_MAGIC: &[u8; 4] = b"FH01";
/// `eh00` header length the writer emits; 24 is the oldest accepted length.
pub const PTE_EXTENDED_LEN: u32 = 32;
pub const PTE_EXTENDED_MIN_LEN: u32 = 24;
pub const PTD_EXTENDED_LEN: u32 = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Pte,
    Ptd,
}

/// The `eh00` extended header of a `.pte`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PteExtendedHeader {
    pub length: u32,
    pub program_size: u64,
    pub segment_base_offset: u64,
    /// Absent in 24-byte headers (files from before ExecuTorch 1.0).
    pub segment_data_size: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PteHeader {
    pub root_offset: u32,
    pub extended: Option<PteExtendedHeader>,
    pub file_size: u64,
}

impl PteHeader {
    /// End of the flatbuffer region: `program_size`, or the whole file without `eh00`.
    pub fn program_size(&self) -> u64 {
        self.extended.map_or(self.file_size, |e| e.program_size)
    }

    /// Segment offsets are relative to this; 0 without `eh00`.
    pub fn segment_base_offset(&self) -> u64 {
        self.extended.map_or(0, |e| e.segment_base_offset)
    }
}

/// The `FH01` header of a `.ptd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtdHeader {
    pub root_offset: u32,
    pub length: u32,
    pub flatbuffer_offset: u64,
    pub flatbuffer_size: u64,
    pub segment_base_offset: u64,
    pub segment_data_size: u64,
    pub file_size: u64,
}

impl PtdHeader {
    /// End of the flatbuffer region (the runtime uses only this sum).
    pub fn program_size(&self) -> u64 {
        // Checked at parse time.
        self.flatbuffer_offset + self.flatbuffer_size
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Bytes as text a terminal shows safely: ASCII graphic characters as they are, others as `\xNN`.
pub fn printable(tag: &[u8]) -> String {
    tag.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

/// Decides the kind from the identifier at byte 4, never from the file name.
pub fn detect_kind(bytes: &[u8]) -> Result<FileKind, FormatError> {
    if bytes.len() < 8 {
        return Err(FormatError::mismatch(
            "file header",
            "byte 0",
            "at least 8 bytes (root offset and identifier)",
            format!("a file of {} bytes", bytes.len()),
        ));
    }
    let id = &bytes[4..8];
    if id == PTE_IDENTIFIER {
        Ok(FileKind::Pte)
    } else if id == PTD_IDENTIFIER {
        Ok(FileKind::Ptd)
    } else if id == b"BP08" {
        Err(FormatError::mismatch(
            "file identifier",
            "byte 4",
            "\"ET12\" (.pte) or \"FT01\" (.ptd)",
            "\"BP08\", a bundled program: extract the .pte it holds and use that",
        ))
    } else if id.starts_with(b"ET") || id.starts_with(b"FT") {
        Err(FormatError::mismatch(
            "file identifier",
            "byte 4",
            "\"ET12\" (.pte) or \"FT01\" (.ptd); other versions are not supported",
            format!("\"{}\"", printable(id)),
        ))
    } else {
        Err(FormatError::mismatch(
            "file identifier",
            "byte 4",
            "\"ET12\" (.pte) or \"FT01\" (.ptd)",
            format!("\"{}\"", printable(id)),
        ))
    }
}

fn check_root_offset(root_offset: u32, program_size: u64) -> Result<(), FormatError> {
    // The root table needs at least its 4-byte vtable offset inside the flatbuffer region.
    if (root_offset as u64) < 8 || (root_offset as u64).saturating_add(4) > program_size {
        return Err(FormatError::mismatch(
            "root table offset",
            "byte 0",
            format!("a value in 8..{}", program_size.saturating_sub(4)),
            root_offset,
        ));
    }
    Ok(())
}

pub fn parse_pte_header(bytes: &[u8]) -> Result<PteHeader, FormatError> {
    parse_pte_header_in(bytes, bytes.len() as u64)
}

/// The header of a `.pte` of `file_size` bytes, from `bytes`, its first bytes (at least
/// the header's, or the whole file when it is shorter).
pub fn parse_pte_header_in(bytes: &[u8], file_size: u64) -> Result<PteHeader, FormatError> {
    if detect_kind(bytes)? != FileKind::Pte {
        return Err(FormatError::mismatch(
            "file identifier",
            "byte 4",
            "\"ET12\"",
            format!("\"{}\"", printable(&bytes[4..8])),
        ));
    }
    let root_offset = u32_at(bytes, 0);
    let extended = if bytes.len() >= 12 && &bytes[8..12] == PTE_EXTENDED_MAGIC {
        if bytes.len() < 16 {
            return Err(FormatError::mismatch(
                "eh00 extended header",
                "byte 8",
                "its length field at bytes 12..16",
                format!("a file of {file_size} bytes"),
            ));
        }
        let length = u32_at(bytes, 12);
        if length < PTE_EXTENDED_MIN_LEN {
            return Err(FormatError::mismatch(
                "eh00 header length",
                "byte 12",
                format!("at least {PTE_EXTENDED_MIN_LEN}"),
                length,
            ));
        }
        checked_range("eh00 extended header", 8, 0, length as u64, file_size)?;
        let program_size = u64_at(bytes, 16);
        let segment_base_offset = u64_at(bytes, 24);
        let segment_data_size = (length >= 32).then(|| u64_at(bytes, 32));
        if program_size > file_size {
            return Err(FormatError::mismatch(
                "eh00 program_size",
                "byte 16",
                format!("at most the file size {file_size}"),
                program_size,
            ));
        }
        let header_end = 8 + length as u64;
        if program_size < header_end {
            return Err(FormatError::mismatch(
                "eh00 program_size",
                "byte 16",
                format!("at least {header_end} (the end of the extended header)"),
                program_size,
            ));
        }
        if segment_base_offset > 0 && segment_base_offset < program_size {
            return Err(FormatError::mismatch(
                "eh00 segment_base_offset",
                "byte 24",
                format!("0 or at least program_size {program_size}"),
                segment_base_offset,
            ));
        }
        if segment_base_offset > file_size {
            return Err(FormatError::mismatch(
                "eh00 segment_base_offset",
                "byte 24",
                format!("at most the file size {file_size}"),
                segment_base_offset,
            ));
        }
        if let Some(data_size) = segment_data_size {
            checked_range(
                "eh00 segment data (segment_base_offset + segment_data_size)",
                segment_base_offset,
                0,
                data_size,
                file_size,
            )?;
        }
        Some(PteExtendedHeader {
            length,
            program_size,
            segment_base_offset,
            segment_data_size,
        })
    } else {
        None
    };
    let header = PteHeader {
        root_offset,
        extended,
        file_size,
    };
    check_root_offset(root_offset, header.program_size())?;
    Ok(header)
}

pub fn parse_ptd_header(bytes: &[u8]) -> Result<PtdHeader, FormatError> {
    parse_ptd_header_in(bytes, bytes.len() as u64)
}

/// The header of a `.ptd` of `file_size` bytes, from `bytes`, its first bytes (at least
/// the header's, or the whole file when it is shorter).
pub fn parse_ptd_header_in(bytes: &[u8], file_size: u64) -> Result<PtdHeader, FormatError> {
    if detect_kind(bytes)? != FileKind::Ptd {
        return Err(FormatError::mismatch(
            "file identifier",
            "byte 4",
            "\"FT01\"",
            format!("\"{}\"", printable(&bytes[4..8])),
        ));
    }
    if bytes.len() < 8 + PTD_EXTENDED_LEN as usize {
        return Err(FormatError::mismatch(
            "FH01 header",
            "byte 8",
            format!("{PTD_EXTENDED_LEN} header bytes at 8..48"),
            format!("a file of {file_size} bytes"),
        ));
    }
    if &bytes[8..12] != PTD_EXTENDED_MAGIC {
        return Err(FormatError::mismatch(
            "FH01 header magic",
            "byte 8",
            "\"FH01\"",
            format!("\"{}\"", printable(&bytes[8..12])),
        ));
    }
    let length = u32_at(bytes, 12);
    if length < PTD_EXTENDED_LEN {
        return Err(FormatError::mismatch(
            "FH01 header length",
            "byte 12",
            format!("at least {PTD_EXTENDED_LEN}"),
            length,
        ));
    }
    checked_range("FH01 header", 8, 0, length as u64, file_size)?;
    let flatbuffer_offset = u64_at(bytes, 16);
    let flatbuffer_size = u64_at(bytes, 24);
    let segment_base_offset = u64_at(bytes, 32);
    let segment_data_size = u64_at(bytes, 40);
    let flat = checked_range(
        "FH01 flatbuffer region (flatbuffer_offset + flatbuffer_size)",
        flatbuffer_offset,
        0,
        flatbuffer_size,
        file_size,
    )?;
    checked_range(
        "FH01 segment data (segment_base_offset + segment_data_size)",
        segment_base_offset,
        0,
        segment_data_size,
        file_size,
    )?;
    if segment_base_offset < flat.end() && segment_data_size > 0 {
        return Err(FormatError::mismatch(
            "FH01 segment_base_offset",
            "byte 32",
            format!("at least the end of the flatbuffer ({})", flat.end()),
            segment_base_offset,
        ));
    }
    let root_offset = u32_at(bytes, 0);
    check_root_offset(root_offset, flat.end())?;
    Ok(PtdHeader {
        root_offset,
        length,
        flatbuffer_offset,
        flatbuffer_size,
        segment_base_offset,
        segment_data_size,
        file_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_programs_are_named() {
        let mut b = vec![0u8; 64];
        b[4..8].copy_from_slice(b"BP08");
        let e = detect_kind(&b).unwrap_err().to_string();
        assert!(e.contains("bundled program"), "{e}");
    }

    #[test]
    fn unknown_identifier_names_what_was_found() {
        let err = detect_kind(b"\0\0\0\0ET13\0\0\0\0").unwrap_err();
        assert!(err.message().contains("ET13"), "{err}");
        let err = detect_kind(b"\0\0\0\0ABCD").unwrap_err();
        assert!(err.message().contains("ABCD"), "{err}");
        assert!(detect_kind(b"abc").is_err());
    }

    #[test]
    fn short_eh00_is_refused() {
        let mut b = vec![0u8; 64];
        b[0] = 40;
        b[4..8].copy_from_slice(b"ET12");
        b[8..12].copy_from_slice(b"eh00");
        b[12..16].copy_from_slice(&16u32.to_le_bytes());
        let err = parse_pte_header(&b).unwrap_err();
        assert!(err.message().contains("at least 24"), "{err}");
    }
}
