//! Reading a fixture's regions and tables, and rebuilding a file around edited tables.

use ptefs::format::generated::{ptd_fb, pte_fb};
use ptefs::format::writer::{
    pack_flat_tensor, pack_program, ptd_program_region, pte_program_region,
};

pub const HUGE: u64 = 1 << 62;

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn has_eh00(b: &[u8]) -> bool {
    b.len() >= 16 && &b[8..12] == b"eh00"
}

pub fn is_ptd(b: &[u8]) -> bool {
    &b[4..8] == b"FT01"
}

/// Where the flatbuffer ends and the segment data begins.
pub fn regions(b: &[u8]) -> (usize, usize) {
    if is_ptd(b) {
        (
            (u64_at(b, 16) + u64_at(b, 24)) as usize,
            u64_at(b, 32) as usize,
        )
    } else if has_eh00(b) {
        (u64_at(b, 16) as usize, u64_at(b, 24) as usize)
    } else {
        (b.len(), b.len())
    }
}

/// A `.pte` rebuilt from `program` with the fixture's segment data after it.
pub fn rebuild_pte(orig: &[u8], program: &pte_fb::ProgramT) -> Vec<u8> {
    let (_, base) = regions(orig);
    let data = &orig[base.min(orig.len())..];
    let fb = pack_program(program, 16);
    let (mut out, new_base) = pte_program_region(&fb, 16, 128, data.len() as u64, true);
    out.resize(new_base as usize, 0);
    out.extend_from_slice(data);
    out
}

pub fn rebuild_ptd(orig: &[u8], ft: &ptd_fb::FlatTensorT) -> Vec<u8> {
    let (_, base) = regions(orig);
    let data = &orig[base..];
    let fb = pack_flat_tensor(ft);
    let (mut out, new_base) = ptd_program_region(&fb, 128, data.len() as u64);
    out.resize(new_base as usize, 0);
    out.extend_from_slice(data);
    out
}

pub fn program_of(b: &[u8]) -> pte_fb::ProgramT {
    let (end, _) = regions(b);
    flatbuffers::root::<pte_fb::Program>(&b[..end])
        .unwrap()
        .unpack()
}

pub fn flat_tensor_of(b: &[u8]) -> ptd_fb::FlatTensorT {
    let (end, _) = regions(b);
    flatbuffers::root::<ptd_fb::FlatTensor>(&b[..end])
        .unwrap()
        .unpack()
}

/// A change to an unpacked root table; false when the table has nothing it applies to.
pub type Edit<T> = Box<dyn Fn(&mut T) -> bool>;

pub type PteEdit = Edit<pte_fb::ProgramT>;

pub type PtdEdit = Edit<ptd_fb::FlatTensorT>;

pub fn tensors(p: &mut pte_fb::ProgramT) -> Vec<&mut pte_fb::TensorT> {
    p.execution_plan
        .iter_mut()
        .flatten()
        .flat_map(|plan| plan.values.iter_mut().flatten())
        .filter_map(|v| match &mut v.val {
            pte_fb::KernelTypesT::Tensor(t) => Some(&mut **t),
            _ => None,
        })
        .collect()
}

pub fn plans(p: &mut pte_fb::ProgramT) -> Vec<&mut pte_fb::ExecutionPlanT> {
    p.execution_plan.iter_mut().flatten().collect()
}

/// Applies `f` to the last element of a table's vector; false when there is none.
pub fn on_last<T>(v: &mut Option<Vec<T>>, f: impl FnOnce(&mut T)) -> bool {
    v.as_mut().and_then(|v| v.last_mut()).map(f).is_some()
}

/// Applies `f` to the first tensor that `pick` accepts, or to all of them with `all`.
pub fn on_tensors(
    all: bool, pick: fn(&pte_fb::TensorT) -> bool, f: impl Fn(&mut pte_fb::TensorT) + 'static,
) -> PteEdit {
    Box::new(move |p| {
        let mut any = false;
        for t in tensors(p).into_iter().filter(|t| pick(t)) {
            f(t);
            any = true;
            if !all {
                break;
            }
        }
        any
    })
}

pub fn with_bytes(t: &pte_fb::TensorT) -> bool {
    t.data_buffer_idx > 0
}

pub fn any_tensor(_: &pte_fb::TensorT) -> bool {
    true
}

pub fn instructions(p: &mut pte_fb::ProgramT) -> Vec<&mut pte_fb::InstructionT> {
    p.execution_plan
        .iter_mut()
        .flatten()
        .flat_map(|plan| plan.chains.iter_mut().flatten())
        .flat_map(|c| c.instructions.iter_mut().flatten())
        .collect()
}
