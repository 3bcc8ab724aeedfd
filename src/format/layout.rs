//! Where every tensor, delegate payload and named blob of a parsed file keeps its bytes.
//!
//! Resolution never fails as a whole: an item whose indices or ranges are wrong gets a
//! defect message instead of a location, so the rest of the file stays browsable and
//! `ptefs check` can list every defect. Every location returned lies inside its file.

use std::collections::HashMap;
use std::sync::Arc;

use super::generated::{ptd_fb, pte_fb};
use super::ptd::Ptd;
use super::pte::Pte;
use super::range::{checked_range, ByteRange};
use super::scalar_type;
use super::FormatError;
use crate::quote;

/// Which file holds a range: 0 is the model file itself, `k` the k-th attached `.ptd` (1-based).
pub type FileIndex = usize;

/// A named-data entry: its file and its index in that file's `named_data` table.
pub type NamedEntry = (FileIndex, usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    pub file: FileIndex,
    pub range: ByteRange,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    Constant,
    Mutable,
    External,
    None,
}

impl DataKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DataKind::Constant => "constant",
            DataKind::Mutable => "mutable",
            DataKind::External => "external",
            DataKind::None => "none",
        }
    }
}

/// Shape facts of a tensor, shared by PTE tensors and PTD tensor layouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorShape {
    pub scalar_type: i8,
    pub sizes: Vec<i32>,
    pub dim_order: Vec<u8>,
}

impl TensorShape {
    /// product(sizes) × element size, or why it has none.
    pub fn nbytes(&self) -> Result<u64, FormatError> {
        let elem = scalar_type::element_size(self.scalar_type)
            .ok_or_else(|| FormatError::new(format!("unknown scalar type {}", self.scalar_type)))?;
        let mut n: u64 = elem;
        for &s in &self.sizes {
            if s < 0 {
                return Err(FormatError::new(format!(
                    "negative size {s} in sizes {:?}",
                    self.sizes
                )));
            }
            n = n.checked_mul(s as u64).ok_or_else(|| {
                FormatError::new(format!(
                    "byte size of sizes {:?} overflows 64 bits",
                    self.sizes
                ))
            })?;
        }
        Ok(n)
    }

    /// Sizes in memory order (`dim_order`), when `dim_order` is a permutation of the dims.
    pub fn physical_shape(&self) -> Option<Vec<u64>> {
        self.physical_dims().map(Iterator::collect)
    }

    /// The dims of `physical_shape`, without collecting them.
    pub fn physical_dims(&self) -> Option<impl Iterator<Item = u64> + Clone + '_> {
        if self.dim_order.len() != self.sizes.len() || self.sizes.iter().any(|&s| s < 0) {
            return None;
        }
        // Dims are u8, so a permutation names at most 256 of them.
        let mut seen = [false; 256];
        for &d in &self.dim_order {
            let d = d as usize;
            if d >= self.sizes.len() || seen[d] {
                return None;
            }
            seen[d] = true;
        }
        Some(
            self.dim_order
                .iter()
                .map(|&d| self.sizes[d as usize] as u64),
        )
    }

    /// "FLOAT[3,4]".
    pub fn describe(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        format!(
            "{}[{}]",
            scalar_type::display(self.scalar_type),
            sizes.join(",")
        )
    }
}

#[derive(Debug, Clone)]
pub struct TensorData {
    /// Shared with the tree's files of this tensor, which need it for writes.
    pub shape: Arc<TensorShape>,
    pub nbytes: Option<u64>,
    pub kind: DataKind,
    /// Where the bytes are, when the files at hand hold them.
    pub location: Option<Location>,
    /// Why bytes that should be there are not.
    pub defect: Option<String>,
    /// For an EXTERNAL tensor found in an attached `.ptd`: that file and the index of the
    /// named-data entry its `fully_qualified_name` names (the tensor's identity there).
    pub key: Option<NamedEntry>,
}

#[derive(Debug, Clone)]
pub struct PlanLayout {
    /// One entry per value; `None` for values that are not tensors. Boxed: a value costs a
    /// pointer here, not the size of a tensor's facts, so a plan of millions of values that
    /// are no tensors (4 bytes each in a crafted file) costs memory in proportion.
    pub tensors: Vec<Option<Box<TensorData>>>,
    /// Per delegate: its payload's location or the defect.
    pub delegates: Vec<Result<Location, FormatError>>,
}

#[derive(Debug, Clone)]
pub struct PteLayout {
    pub plans: Vec<PlanLayout>,
    /// Per `Program.named_data` entry.
    pub named_data: Vec<Result<Location, FormatError>>,
    /// Every defect found, each naming its place.
    pub defects: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct NamedBlob {
    pub key: String,
    pub segment_index: u32,
    pub location: Result<Location, FormatError>,
    pub tensor: Option<Arc<TensorShape>>,
}

fn tensor_shape(t: &pte_fb::TensorT) -> Arc<TensorShape> {
    Arc::new(TensorShape {
        scalar_type: t.scalar_type.0,
        sizes: t.sizes.clone().unwrap_or_default(),
        dim_order: t.dim_order.clone().unwrap_or_default(),
    })
}

fn layout_shape(l: &ptd_fb::TensorLayoutT) -> TensorShape {
    TensorShape {
        scalar_type: l.scalar_type.0,
        sizes: l.sizes.clone().unwrap_or_default(),
        dim_order: l.dim_order.clone().unwrap_or_default(),
    }
}

/// Names an item in messages; formatted only when a defect is reported.
struct Place<'a> {
    plan: usize,
    name: &'a str,
    item: &'static str,
    index: usize,
}

impl std::fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plan {} ({}) {} {}",
            self.plan,
            quote::name(self.name),
            self.item,
            self.index
        )
    }
}

/// A sub-range `[offset, offset + len)` of segment `index` of the model file.
fn in_segment(
    pte: &Pte, what: impl Fn() -> String, index: u32, offset: u64, len: u64,
) -> Result<Location, FormatError> {
    let seg = pte.segments.get(index as usize).ok_or_else(|| {
        FormatError::new(format!(
            "{}: segment index {index} out of range (expected < {}, the number of segments)",
            what(),
            pte.segments.len()
        ))
    })?;
    let range = checked_range("", seg.start(), offset, len, seg.end()).map_err(|e| {
        FormatError::new(format!(
            "{}{e} (segment {index} is {} bytes at file offset {})",
            what(),
            seg.len(),
            seg.start()
        ))
    })?;
    Ok(Location { file: 0, range })
}

/// Where each key of the attached `.ptd` files is: (data file, named_data index), in order.
/// Built once, so resolving every EXTERNAL tensor is linear, not tensors × keys.
type KeyIndex<'a> = HashMap<&'a str, Vec<(usize, usize)>>;

fn key_index<'a>(data: &[&'a Ptd]) -> KeyIndex<'a> {
    let mut index: KeyIndex<'a> = HashMap::new();
    for (k, ptd) in data.iter().enumerate() {
        for (n, nd) in ptd.flat_tensor.named_data.iter().flatten().enumerate() {
            if let Some(key) = nd.key.as_deref() {
                index.entry(key).or_default().push((k, n));
            }
        }
    }
    index
}

fn locate_tensor(
    pte: &Pte, data: &[&Ptd], keys: &KeyIndex, place: &dyn std::fmt::Display, t: &pte_fb::TensorT,
) -> TensorData {
    let shape = tensor_shape(t);
    let nbytes = shape.nbytes();
    let external = t
        .extra_tensor_info
        .as_ref()
        .is_some_and(|e| e.location == pte_fb::TensorDataLocation::EXTERNAL);
    let idx = t.data_buffer_idx;
    let kind = if external {
        DataKind::External
    } else if idx > 0 && t.allocation_info.is_none() {
        DataKind::Constant
    } else if idx > 0 {
        DataKind::Mutable
    } else {
        DataKind::None
    };
    let mut out = TensorData {
        shape,
        nbytes: nbytes.clone().ok(),
        kind,
        location: None,
        defect: None,
        key: None,
    };
    if kind == DataKind::None {
        return out;
    }
    let len = match nbytes {
        Ok(n) => n,
        Err(e) => {
            out.defect = Some(format!("{place}: {e}"));
            return out;
        }
    };
    let found = match kind {
        DataKind::Constant => constant_location(pte, place, idx, len),
        DataKind::Mutable => mutable_location(pte, place, idx, len),
        DataKind::External => {
            external_location(data, keys, place, t, &out.shape, len).map(|found| {
                found.map(|(loc, key)| {
                    out.key = Some(key);
                    loc
                })
            })
        }
        DataKind::None => unreachable!(),
    };
    match found {
        Ok(loc) => out.location = loc,
        Err(e) => out.defect = Some(e.to_string()),
    }
    out
}

fn constant_location(
    pte: &Pte, place: &dyn std::fmt::Display, idx: u32, len: u64,
) -> Result<Option<Location>, FormatError> {
    let program = &pte.program;
    if let Some(cs) = program
        .constant_segment
        .as_ref()
        .filter(|c| c.offsets.as_ref().is_some_and(|o| !o.is_empty()))
    {
        let offsets = cs.offsets.as_deref().unwrap_or_default();
        let offset = *offsets.get(idx as usize).ok_or_else(|| {
            FormatError::new(format!(
                "{place}: data_buffer_idx {idx} out of range (expected < {}, the number of constant offsets)",
                offsets.len()
            ))
        })?;
        let what = || {
            format!(
                "{place}: constant {idx} ({len} bytes at offset {offset} of the constant segment)"
            )
        };
        return in_segment(pte, what, cs.segment_index, offset, len).map(Some);
    }
    // Deprecated inline constant buffers.
    let storage = pte.inline_constants.get(idx as usize).ok_or_else(|| {
        FormatError::new(format!(
            "{place}: data_buffer_idx {idx} out of range (expected < {}, the number of constant buffers)",
            pte.inline_constants.len()
        ))
    })?;
    let range = storage.unwrap_or_default();
    if range.len() < len {
        return Err(FormatError::new(format!(
            "{place}: constant buffer {idx} too short: expected at least {len} bytes, found {}",
            range.len()
        )));
    }
    Ok(Some(Location {
        file: 0,
        range: range.prefix(len),
    }))
}

fn mutable_location(
    pte: &Pte, place: &dyn std::fmt::Display, idx: u32, len: u64,
) -> Result<Option<Location>, FormatError> {
    // The runtime always reads mutable_data_segments[0].
    let sub = pte
        .program
        .mutable_data_segments
        .as_ref()
        .and_then(|m| m.first())
        .ok_or_else(|| {
            FormatError::new(format!("{place}: data_buffer_idx {idx} with allocation_info needs Program.mutable_data_segments, which is empty"))
        })?;
    let offsets = sub.offsets.as_deref().unwrap_or_default();
    let offset = *offsets.get(idx as usize).ok_or_else(|| {
        FormatError::new(format!(
            "{place}: data_buffer_idx {idx} out of range (expected < {}, the number of mutable offsets)",
            offsets.len()
        ))
    })?;
    let what = || {
        format!(
            "{place}: initial state {idx} ({len} bytes at offset {offset} of the mutable segment)"
        )
    };
    in_segment(pte, what, sub.segment_index, offset, len).map(Some)
}

fn external_location(
    data: &[&Ptd], keys: &KeyIndex, place: &dyn std::fmt::Display, t: &pte_fb::TensorT,
    shape: &TensorShape, len: u64,
) -> Result<Option<(Location, NamedEntry)>, FormatError> {
    let fqn = t
        .extra_tensor_info
        .as_ref()
        .and_then(|e| e.fully_qualified_name.as_deref())
        .ok_or_else(|| {
            FormatError::new(format!(
                "{place}: EXTERNAL tensor without fully_qualified_name"
            ))
        })?;
    if data.is_empty() {
        return Ok(None);
    }
    let (k, n) = match keys.get(fqn).map(Vec::as_slice) {
        None | Some([]) => {
            return Err(FormatError::new(format!(
                "{place}: EXTERNAL tensor {} not found in the attached data files",
                quote::name(fqn)
            )))
        }
        Some([one]) => *one,
        Some(_) => {
            return Err(FormatError::new(format!(
                "{place}: key {} appears in more than one data file",
                quote::name(fqn)
            )))
        }
    };
    let nd = &data[k]
        .flat_tensor
        .named_data
        .as_deref()
        .unwrap_or_default()[n];
    let layout = nd.tensor_layout.as_ref().ok_or_else(|| {
        FormatError::new(format!(
            "{place}: key {} in data file {} has no tensor_layout (the runtime needs one)",
            quote::name(fqn),
            k + 1
        ))
    })?;
    let theirs = layout_shape(layout);
    if &theirs != shape {
        return Err(FormatError::new(format!(
            "{place}: tensor layout of {} differs: expected {} dim_order {:?}, found {} dim_order {:?}", quote::name(fqn), shape.describe(), shape.dim_order, theirs.describe(), theirs.dim_order)));
    }
    let ptd = data[k];
    let seg = ptd.segments.get(nd.segment_index as usize).ok_or_else(|| {
        FormatError::new(format!(
            "{place}: {} (named_data[{n}]) segment index {} out of range (expected < {})",
            quote::name(fqn),
            nd.segment_index,
            ptd.segments.len()
        ))
    })?;
    if seg.len() < len {
        return Err(FormatError::new(format!(
            "{place}: segment of {} too short: expected at least {len} bytes, found {}",
            quote::name(fqn),
            seg.len()
        )));
    }
    Ok(Some((
        Location {
            file: k + 1,
            range: seg.prefix(len),
        },
        (k + 1, n),
    )))
}

fn delegate_location(
    pte: &Pte, place: &dyn std::fmt::Display, d: &pte_fb::BackendDelegateT,
) -> Result<Location, FormatError> {
    let r = d.processed.as_ref().ok_or_else(|| {
        FormatError::new(format!("{place}: delegate has no processed data reference"))
    })?;
    match r.location {
        pte_fb::DataLocation::INLINE => {
            let range = pte
                .inline_delegate_data
                .get(r.index as usize)
                .ok_or_else(|| {
                    FormatError::new(format!(
                        "{place}: inline data index {} out of range (expected < {}, the number of backend_delegate_data entries)",
                        r.index,
                        pte.inline_delegate_data.len()
                    ))
                })?
                .unwrap_or_default();
            Ok(Location { file: 0, range })
        }
        pte_fb::DataLocation::SEGMENT => {
            let seg = pte.segments.get(r.index as usize).ok_or_else(|| {
                FormatError::new(format!(
                    "{place}: segment index {} out of range (expected < {}, the number of segments)",
                    r.index,
                    pte.segments.len()
                ))
            })?;
            Ok(Location {
                file: 0,
                range: *seg,
            })
        }
        other => Err(FormatError::new(format!(
            "{place}: data location {} is neither INLINE (0) nor SEGMENT (1)",
            other.0
        ))),
    }
}

/// Resolves every byte range of a `.pte`, with the `.ptd` files attached to it.
pub fn locate_pte(pte: &Pte, data: &[&Ptd]) -> PteLayout {
    let mut defects = Vec::new();
    let mut plans = Vec::new();
    let keys = key_index(data);
    for (p, plan) in pte.program.execution_plan.iter().flatten().enumerate() {
        let name = plan.name.as_deref().unwrap_or("");
        let mut tensors = Vec::with_capacity(plan.values.as_ref().map_or(0, Vec::len));
        for (i, value) in plan.values.iter().flatten().enumerate() {
            let t = value.val.as_tensor().map(|t| {
                let place = Place {
                    plan: p,
                    name,
                    item: "value",
                    index: i,
                };
                Box::new(locate_tensor(pte, data, &keys, &place, t))
            });
            if let Some(d) = t.as_ref().and_then(|t| t.defect.clone()) {
                defects.push(d);
            }
            tensors.push(t);
        }
        let mut delegates = Vec::new();
        for (j, d) in plan.delegates.iter().flatten().enumerate() {
            let place = Place {
                plan: p,
                name,
                item: "delegate",
                index: j,
            };
            let loc = delegate_location(pte, &place, d);
            if let Err(e) = &loc {
                defects.push(e.to_string());
            }
            delegates.push(loc);
        }
        plans.push(PlanLayout { tensors, delegates });
    }
    let mut named_data = Vec::new();
    for (k, nd) in pte.program.named_data.iter().flatten().enumerate() {
        let key = nd.key.as_deref().unwrap_or("");
        let loc = pte
            .segments
            .get(nd.segment_index as usize)
            .map(|r| Location { file: 0, range: *r })
            .ok_or_else(|| {
                FormatError::new(format!(
                    "named_data[{k}] ({}): segment index {} out of range (expected < {})",
                    quote::name(key),
                    nd.segment_index,
                    pte.segments.len()
                ))
            });
        if let Err(e) = &loc {
            defects.push(e.to_string());
        }
        named_data.push(loc);
    }
    PteLayout {
        plans,
        named_data,
        defects,
    }
}

/// Resolves the named blobs of a `.ptd` whose ranges are in file `file`.
pub fn locate_ptd(ptd: &Ptd, file: FileIndex) -> Vec<NamedBlob> {
    let mut out = Vec::new();
    for (k, nd) in ptd.flat_tensor.named_data.iter().flatten().enumerate() {
        let key = nd.key.clone().unwrap_or_default();
        let tensor = nd
            .tensor_layout
            .as_deref()
            .map(|l| Arc::new(layout_shape(l)));
        let location = ptd
            .segments
            .get(nd.segment_index as usize)
            .ok_or_else(|| {
                FormatError::new(format!(
                    "named_data[{k}] ({}): segment index {} out of range (expected < {})", quote::name(&key), nd.segment_index, ptd.segments.len()))
            })
            .and_then(|seg| match &tensor {
                None => Ok(Location { file, range: *seg }),
                Some(shape) => {
                    let n = shape
                        .nbytes()
                        .map_err(|e| FormatError::new(format!("named_data[{k}] ({}): {e}", quote::name(&key))))?;
                    if seg.len() < n {
                        return Err(FormatError::new(format!(
                            "named_data[{k}] ({}): segment {} too short for {}: expected at least {n} bytes, found {}", quote::name(&key), nd.segment_index, shape.describe(), seg.len())));
                    }
                    Ok(Location {
                        file,
                        range: seg.prefix(n),
                    })
                }
            });
        out.push(NamedBlob {
            key,
            segment_index: nd.segment_index,
            location,
            tensor,
        });
    }
    out
}
