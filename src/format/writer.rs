//! Serializing files: FlatBuffers from owned tables, the `eh00`/`FH01` headers, and segment
//! placement (docs/formats.md#how-ptefs-writes-a-file,
//! docs/formats.md#what-the-runtime-checks-at-load).
//!
//! Invariants: the flatbuffer is built from the newest schema with every field of the owned
//! tables (absent stays absent, empty vectors stay present); inline byte vectors are aligned
//! to the requested power of two; the spliced header length is a multiple of the largest
//! alignment, so internal alignment survives the splice.

use flatbuffers::{FlatBufferBuilder, Push, PushAlignment, WIPOffset};

use super::generated::{ptd_fb, pte_fb};
use super::header::{PTD_EXTENDED_LEN, PTD_EXTENDED_MAGIC, PTE_EXTENDED_LEN, PTE_EXTENDED_MAGIC};
use super::range::align_up;

/// A byte whose vector starts on an `A`-byte boundary (FlatBuffers' `force_align`).
#[derive(Clone, Copy)]
struct AlignedByte<const A: usize>(u8);

impl<const A: usize> Push for AlignedByte<A> {
    type Output = u8;

    unsafe fn push(&self, dst: &mut [u8], _written_len: usize) {
        dst[0] = self.0;
    }

    fn alignment() -> PushAlignment {
        PushAlignment::new(A)
    }
}

fn aligned_vector_const<'b, const A: usize>(
    fbb: &mut FlatBufferBuilder<'b>, data: &[u8],
) -> WIPOffset<flatbuffers::Vector<'b, u8>> {
    let items: Vec<AlignedByte<A>> = data.iter().map(|&b| AlignedByte(b)).collect();
    fbb.create_vector(&items)
}

/// A `[ubyte]` vector whose first byte is aligned to `alignment` (a power of two ≤ 4096).
fn aligned_vector<'b>(
    fbb: &mut FlatBufferBuilder<'b>, data: &[u8], alignment: u64,
) -> WIPOffset<flatbuffers::Vector<'b, u8>> {
    match alignment {
        0..=16 => aligned_vector_const::<16>(fbb, data),
        17..=32 => aligned_vector_const::<32>(fbb, data),
        33..=64 => aligned_vector_const::<64>(fbb, data),
        65..=128 => aligned_vector_const::<128>(fbb, data),
        129..=256 => aligned_vector_const::<256>(fbb, data),
        257..=512 => aligned_vector_const::<512>(fbb, data),
        513..=1024 => aligned_vector_const::<1024>(fbb, data),
        1025..=2048 => aligned_vector_const::<2048>(fbb, data),
        _ => aligned_vector_const::<4096>(fbb, data),
    }
}

/// Builds the `Program` flatbuffer (identifier `ET12`), inline byte vectors aligned to
/// `inline_alignment`.
pub fn pack_program(p: &pte_fb::ProgramT, inline_alignment: u64) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let execution_plan = p.execution_plan.as_ref().map(|x| {
        let w: Vec<_> = x.iter().map(|t| t.pack(&mut fbb)).collect();
        fbb.create_vector(&w)
    });
    let constant_buffer = p.constant_buffer.as_ref().map(|x| {
        let w: Vec<_> = x
            .iter()
            .map(|b| {
                let storage = b
                    .storage
                    .as_ref()
                    .map(|s| aligned_vector(&mut fbb, s, inline_alignment));
                pte_fb::Buffer::create(&mut fbb, &pte_fb::BufferArgs { storage })
            })
            .collect();
        fbb.create_vector(&w)
    });
    let backend_delegate_data = p.backend_delegate_data.as_ref().map(|x| {
        let w: Vec<_> = x
            .iter()
            .map(|d| {
                let data = d
                    .data
                    .as_ref()
                    .map(|s| aligned_vector(&mut fbb, s, inline_alignment));
                pte_fb::BackendDelegateInlineData::create(
                    &mut fbb,
                    &pte_fb::BackendDelegateInlineDataArgs { data },
                )
            })
            .collect();
        fbb.create_vector(&w)
    });
    let segments = p.segments.as_ref().map(|x| {
        let w: Vec<_> = x.iter().map(|t| t.pack(&mut fbb)).collect();
        fbb.create_vector(&w)
    });
    let constant_segment = p.constant_segment.as_ref().map(|x| x.pack(&mut fbb));
    let mutable_data_segments = p.mutable_data_segments.as_ref().map(|x| {
        let w: Vec<_> = x.iter().map(|t| t.pack(&mut fbb)).collect();
        fbb.create_vector(&w)
    });
    let named_data = p.named_data.as_ref().map(|x| {
        let w: Vec<_> = x.iter().map(|t| t.pack(&mut fbb)).collect();
        fbb.create_vector(&w)
    });
    let root = pte_fb::Program::create(
        &mut fbb,
        &pte_fb::ProgramArgs {
            version: p.version,
            execution_plan,
            constant_buffer,
            backend_delegate_data,
            segments,
            constant_segment,
            mutable_data_segments,
            named_data,
        },
    );
    fbb.finish(root, Some("ET12"));
    fbb.finished_data().to_vec()
}

/// Builds the `FlatTensor` flatbuffer (identifier `FT01`).
pub fn pack_flat_tensor(ft: &ptd_fb::FlatTensorT) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let root = ft.pack(&mut fbb);
    fbb.finish(root, Some("FT01"));
    fbb.finished_data().to_vec()
}

/// Inserts `header` (already padded) after the 8-byte preamble and moves the root offset.
fn splice(fb: &[u8], header: &[u8]) -> Vec<u8> {
    let root = u32::from_le_bytes(fb[..4].try_into().expect("4 bytes"));
    let mut out = Vec::with_capacity(fb.len() + header.len());
    out.extend_from_slice(&(root + header.len() as u32).to_le_bytes());
    out.extend_from_slice(&fb[4..8]);
    out.extend_from_slice(header);
    out.extend_from_slice(&fb[8..]);
    out
}

/// The program region of a `.pte` (flatbuffer with `eh00` spliced in) and its
/// `segment_base_offset`. Without segment bytes and `with_header == false`, the bare
/// flatbuffer, as ExecuTorch writes it.
pub fn pte_program_region(
    fb: &[u8], max_alignment: u64, segment_alignment: u64, segment_data_size: u64,
    with_header: bool,
) -> (Vec<u8>, u64) {
    if !with_header && segment_data_size == 0 {
        return (fb.to_vec(), 0);
    }
    let padded = align_up(PTE_EXTENDED_LEN as u64, max_alignment.max(16)).expect("small");
    let program_size = padded + fb.len() as u64;
    let base = align_up(program_size, segment_alignment).expect("flatbuffers are under 2 GiB");
    let mut h = vec![0u8; padded as usize];
    h[..4].copy_from_slice(PTE_EXTENDED_MAGIC);
    h[4..8].copy_from_slice(&PTE_EXTENDED_LEN.to_le_bytes());
    h[8..16].copy_from_slice(&program_size.to_le_bytes());
    h[16..24].copy_from_slice(&base.to_le_bytes());
    h[24..32].copy_from_slice(&segment_data_size.to_le_bytes());
    (splice(fb, &h), base)
}

/// The flatbuffer region of a `.ptd` (with `FH01` spliced in) and its `segment_base_offset`.
pub fn ptd_program_region(
    fb: &[u8], segment_alignment: u64, segment_data_size: u64,
) -> (Vec<u8>, u64) {
    let padded = align_up(PTD_EXTENDED_LEN as u64, 16).expect("small");
    let end = padded + fb.len() as u64;
    let base = align_up(end, segment_alignment).expect("flatbuffers are under 2 GiB");
    let mut h = vec![0u8; padded as usize];
    h[..4].copy_from_slice(PTD_EXTENDED_MAGIC);
    h[4..8].copy_from_slice(&PTD_EXTENDED_LEN.to_le_bytes());
    h[8..16].copy_from_slice(&padded.to_le_bytes());
    h[16..24].copy_from_slice(&(fb.len() as u64).to_le_bytes());
    h[24..32].copy_from_slice(&base.to_le_bytes());
    h[32..40].copy_from_slice(&segment_data_size.to_le_bytes());
    (splice(fb, &h), base)
}

/// Largest power of two dividing `v` (0 for 0).
pub fn power_of_two_of(v: u64) -> u64 {
    if v == 0 {
        0
    } else {
        1 << v.trailing_zeros()
    }
}

/// Segment offsets (relative to the base) for segments of `sizes`, placed in `order`, each
/// aligned to `alignment`; the first placed segment starts at 0.
pub fn place_segments(sizes: &[u64], order: &[usize], alignment: u64) -> Option<Vec<u64>> {
    let mut offsets = vec![0u64; sizes.len()];
    let mut cursor = 0u64;
    for &i in order {
        let off = align_up(cursor, alignment)?;
        offsets[i] = off;
        cursor = off.checked_add(sizes[i])?;
    }
    Some(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_segments_in_order_with_alignment() {
        let offsets = place_segments(&[4, 928, 48, 12], &[0, 1, 2, 3], 128).unwrap();
        assert_eq!(offsets, vec![0, 128, 1152, 1280]);
        let offsets = place_segments(&[0, 10], &[0, 1], 128).unwrap();
        assert_eq!(offsets, vec![0, 0]);
    }

    #[test]
    fn inline_vectors_are_aligned() {
        for align in [16u64, 64, 256] {
            let p = pte_fb::ProgramT {
                backend_delegate_data: Some(vec![pte_fb::BackendDelegateInlineDataT {
                    data: Some(vec![1, 2, 3]),
                }]),
                ..Default::default()
            };
            let fb = pack_program(&p, align);
            let (region, _) = pte_program_region(&fb, align, 128, 0, true);
            let root = flatbuffers::root::<pte_fb::Program>(&region).unwrap();
            let data = root.backend_delegate_data().unwrap().get(0).data().unwrap();
            let at = data.bytes().as_ptr() as usize - region.as_ptr() as usize;
            assert_eq!(at as u64 % align, 0, "alignment {align}");
            assert_eq!(data.bytes(), &[1, 2, 3]);
        }
    }
}
