//! A parsed `.ptd`: the `FH01` header, the `FlatTensor` table as owned values, and the
//! absolute file range of every segment.
//!
//! Invariants: the flatbuffer region passed the FlatBuffers verifier; every entry of
//! `segments` lies inside the file.

use super::generated::ptd_fb;
use super::header::{parse_ptd_header_in, PtdHeader};
use super::pte::{describe_verifier_error, verifier_options_for};
use super::range::{checked_range, ByteRange};
use super::FormatError;

pub use ptd_fb::FlatTensorT;

#[derive(Debug, Clone)]
pub struct Ptd {
    pub header: PtdHeader,
    pub flat_tensor: FlatTensorT,
    /// Absolute range of `FlatTensor.segments[i]`.
    pub segments: Vec<ByteRange>,
}

pub fn parse_ptd(bytes: &[u8]) -> Result<Ptd, FormatError> {
    parse_ptd_in(bytes, bytes.len() as u64)
}

/// Parses a `.ptd` of `file_size` bytes from `bytes`, its first bytes: at least the header
/// and the flatbuffer, or the whole file.
pub fn parse_ptd_in(bytes: &[u8], file_size: u64) -> Result<Ptd, FormatError> {
    let header = parse_ptd_header_in(bytes, file_size)?;
    let flat = bytes
        .get(..header.program_size() as usize)
        .ok_or_else(|| FormatError::new("the flatbuffer was not read whole"))?;
    let root =
        flatbuffers::root_with_opts::<ptd_fb::FlatTensor>(&verifier_options_for(flat.len()), flat)
            .map_err(|e| describe_verifier_error("FlatTensor flatbuffer", &e))?;
    let flat_tensor = root.unpack();
    let mut segments = Vec::new();
    for (i, seg) in flat_tensor.segments.iter().flatten().enumerate() {
        let what = format!(
            "FlatTensor.segments[{i}] (offset {}, size {})",
            seg.offset, seg.size
        );
        segments.push(checked_range(
            &what,
            header.segment_base_offset,
            seg.offset,
            seg.size,
            header.file_size,
        )?);
    }
    Ok(Ptd {
        header,
        flat_tensor,
        segments,
    })
}
