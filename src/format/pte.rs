//! A parsed `.pte`: its header, the whole `Program` table as owned values, and the absolute
//! file ranges of every segment and inline byte vector.
//!
//! Invariants: the flatbuffer region passed the FlatBuffers verifier; every entry of
//! `segments` lies inside the file. Inline byte vectors (deprecated constant buffers, inline
//! delegate data) are not copied: `program` holds `None` for them and their ranges live in
//! `inline_constants` / `inline_delegate_data`.

use flatbuffers::VerifierOptions;

use super::generated::pte_fb;
use super::header::{parse_pte_header_in, PteHeader};
use super::range::{checked_range, ByteRange};
use super::FormatError;

pub use pte_fb::ProgramT;

#[derive(Debug, Clone)]
pub struct Pte {
    pub header: PteHeader,
    pub program: ProgramT,
    /// Absolute range of `Program.segments[i]`.
    pub segments: Vec<ByteRange>,
    /// Absolute range of `Program.constant_buffer[i].storage` (None when absent).
    pub inline_constants: Vec<Option<ByteRange>>,
    /// Absolute range of `Program.backend_delegate_data[i].data` (None when absent).
    pub inline_delegate_data: Vec<Option<ByteRange>>,
}

/// How many instructions the chains of `plan` hold together.
pub fn instruction_count(plan: &pte_fb::ExecutionPlanT) -> usize {
    plan.chains
        .iter()
        .flatten()
        .map(|c| c.instructions.as_ref().map_or(0, Vec::len))
        .sum()
}

/// Verifier limits sized for real programs (tens of thousands of values) rather than the
/// library's defaults; the 2 GiB bound is FlatBuffers' own offset limit.
pub fn verifier_options() -> VerifierOptions {
    VerifierOptions {
        max_depth: 64,
        max_tables: 1 << 26,
        max_apparent_size: 1 << 32,
        ignore_missing_null_terminator: false,
    }
}

/// `verifier_options` with the verifier's apparent size (bytes verified, counting every visit
/// of a shared table or vector) bounded by a multiple of the buffer's length. Files written by
/// ExecuTorch visit each byte about once (1.1 to 1.7 times on the fixtures, vtables being
/// shared); a crafted file whose vectors point many times at one table would otherwise pass
/// and unpack into gigabytes (a 400 KB file into 350 MB).
pub fn verifier_options_for(len: usize) -> VerifierOptions {
    VerifierOptions {
        max_apparent_size: len.saturating_mul(16).clamp(1 << 20, 1 << 32),
        ..verifier_options()
    }
}

pub fn describe_verifier_error(what: &str, err: &flatbuffers::InvalidFlatbuffer) -> FormatError {
    // The library's message already names the field path and byte position.
    let text = err.to_string().replace('\n', "; ");
    let mut text = text.trim_end_matches("; ").trim().to_string();
    if matches!(err, flatbuffers::InvalidFlatbuffer::ApparentSizeTooLarge) {
        text.push_str(" (tables or vectors referenced so many times that the file would unpack to more than 16 times its size)");
    }
    FormatError::new(format!("{what} fails FlatBuffers verification: {text}"))
}

/// Where a vector the verifier accepted lies inside `base`.
fn vector_range(base: &[u8], data: &[u8]) -> ByteRange {
    let start = (data.as_ptr() as usize - base.as_ptr() as usize) as u64;
    ByteRange::new(start, data.len() as u64).expect("a slice of the file ends inside it")
}

pub fn parse_pte(bytes: &[u8]) -> Result<Pte, FormatError> {
    parse_pte_in(bytes, bytes.len() as u64)
}

/// Parses a `.pte` of `file_size` bytes from `bytes`, its first bytes: at least the header
/// and the flatbuffer (`program_size` of them), or the whole file.
pub fn parse_pte_in(bytes: &[u8], file_size: u64) -> Result<Pte, FormatError> {
    let header = parse_pte_header_in(bytes, file_size)?;
    let flat = bytes
        .get(..header.program_size() as usize)
        .ok_or_else(|| FormatError::new("the flatbuffer was not read whole"))?;
    let root =
        flatbuffers::root_with_opts::<pte_fb::Program>(&verifier_options_for(flat.len()), flat)
            .map_err(|e| describe_verifier_error("Program flatbuffer", &e))?;

    let base = header.segment_base_offset();
    let mut segments = Vec::new();
    let mut segment_tables = None;
    if let Some(segs) = root.segments() {
        for (i, seg) in segs.iter().enumerate() {
            let what = format!(
                "Program.segments[{i}] (offset {}, size {})",
                seg.offset(),
                seg.size()
            );
            segments.push(checked_range(
                &what,
                base,
                seg.offset(),
                seg.size(),
                file_size,
            )?);
        }
        segment_tables = Some(segs.iter().map(|s| s.unpack()).collect());
    }
    if !segments.is_empty() && segments.iter().any(|s| !s.is_empty()) && header.extended.is_none() {
        return Err(FormatError::mismatch(
            "segment data",
            "byte 8",
            "an eh00 extended header giving the segment base (segments hold bytes)",
            "no eh00 header",
        ));
    }

    let mut inline_constants = Vec::new();
    let constant_buffer = root.constant_buffer().map(|bufs| {
        bufs.iter()
            .map(|b| {
                inline_constants.push(b.storage().map(|v| vector_range(bytes, v.bytes())));
                pte_fb::BufferT { storage: None }
            })
            .collect()
    });
    let mut inline_delegate_data = Vec::new();
    let backend_delegate_data = root.backend_delegate_data().map(|items| {
        items
            .iter()
            .map(|d| {
                inline_delegate_data.push(d.data().map(|v| vector_range(bytes, v.bytes())));
                pte_fb::BackendDelegateInlineDataT { data: None }
            })
            .collect()
    });

    let program = ProgramT {
        version: root.version(),
        execution_plan: root
            .execution_plan()
            .map(|plans| plans.iter().map(|p| p.unpack()).collect()),
        constant_buffer,
        backend_delegate_data,
        segments: segment_tables,
        constant_segment: root.constant_segment().map(|c| Box::new(c.unpack())),
        mutable_data_segments: root
            .mutable_data_segments()
            .map(|v| v.iter().map(|m| m.unpack()).collect()),
        named_data: root
            .named_data()
            .map(|v| v.iter().map(|n| n.unpack()).collect()),
    };
    Ok(Pte {
        header,
        program,
        segments,
        inline_constants,
        inline_delegate_data,
    })
}

/// The fully qualified name (`extra_tensor_info.fully_qualified_name`) of value `i` of plan
/// `p`, when it is a tensor that has a non-empty one.
pub fn value_fqn(plans: &[pte_fb::ExecutionPlanT], p: usize, i: usize) -> Option<String> {
    plans
        .get(p)?
        .values
        .as_deref()?
        .get(i)?
        .val
        .as_tensor()?
        .extra_tensor_info
        .as_ref()?
        .fully_qualified_name
        .clone()
        .filter(|n| !n.is_empty())
}
