//! A parsed `.ptd`: the `FH01` header, the `FlatTensor` table as owned values, and the
//! absolute file range of every segment.
//!
//! Invariants: the flatbuffer region passed the FlatBuffers verifier; every entry of
//! `segments` lies inside the file.

use super::generated::ptd_fb;
use super::header::{parse_ptd_header, PtdHeader};
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
    let header = parse_ptd_header(bytes)?;
    let flat = &bytes[..header.program_size() as usize];
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
