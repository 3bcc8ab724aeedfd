//! Where a model's bytes go (docs/commands.md#info---sizes): every byte of every file put
//! in one class (weights, program, delegate graphs, padding, unused), by file and segment,
//! by delegate, by dtype and quantization scheme, the largest tensors, bytes stored more
//! than once, and how much of each data file the program reads. `ptefs info --sizes` and a
//! mount's `sizes.txt` and `sizes.json` show it (`render`); `sizes.svg` draws each file's
//! bytes as the blocks of a treemap (`blocks`).
//!
//! Invariants:
//! - The classes partition each file: every byte is counted once, in the first class that
//!   covers it of weights (bytes of a tensor or of its scales), delegate graphs (the rest
//!   of a delegate payload), program (the rest of the headers and flatbuffer), unused (a
//!   segment nothing refers to), padding (everything else: between the flatbuffer and the
//!   segments, between segments, inside a segment around its tensors).
//! - Bytes several tensors share count once wherever bytes are summed; "stored more than
//!   once" is about distinct byte ranges with equal contents, found by comparing a sample
//!   of every range of equal length, then hashing (SHA-256) only the ranges whose samples
//!   agree.
//! - The accounting reads only located ranges of the files at hand, in bounded windows whose
//!   memory is given back (`ModelFile::release`), and only when no file is remote (a
//!   remote model's bytes are fetched only when read); everything else comes from the
//!   tables. What is shown depends on the files' contents, and on whether one is remote.

pub mod blocks;
pub mod render;

use std::collections::{BTreeMap, HashMap, HashSet};

use sha2::{Digest, Sha256};

use crate::catalog::names::Names;
use crate::catalog::tensors::{self, Origin, Tensor};
use crate::catalog::Catalog;
use crate::error::Result;
use crate::format::generated::pte_fb;
use crate::format::layout::{DataKind, FileIndex, Location};
use crate::format::range::ByteRange;
use crate::format::{Kind, Model};

pub use render::human;

/// The classes bytes are put in, in the order a byte is claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    Weights,
    DelegateGraphs,
    Program,
    Unused,
    Padding,
}

impl Class {
    pub const ALL: [Class; 5] = [
        Class::Weights,
        Class::DelegateGraphs,
        Class::Program,
        Class::Unused,
        Class::Padding,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Weights => "weights",
            Class::DelegateGraphs => "delegate_graphs",
            Class::Program => "program",
            Class::Unused => "unused",
            Class::Padding => "padding",
        }
    }

    /// How the text names it.
    pub fn label(self) -> &'static str {
        match self {
            Class::Weights => "weights",
            Class::DelegateGraphs => "delegate graphs",
            Class::Program => "program",
            Class::Unused => "unused segments",
            Class::Padding => "padding",
        }
    }
}

/// Bytes by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByClass([u64; 5]);

impl ByClass {
    pub fn get(&self, c: Class) -> u64 {
        self.0[c as usize]
    }

    fn add(&mut self, c: Class, n: u64) {
        self.0[c as usize] += n;
    }

    fn add_all(&mut self, other: &ByClass) {
        for c in Class::ALL {
            self.add(c, other.get(c));
        }
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// A segment of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSizes {
    pub index: usize,
    pub range: ByteRange,
    /// What refers to it: `constants`, `initial states`, `delegate forward/0`, `named data
    /// "<key>"` (the first key, and how many more), `unreferenced`.
    pub role: String,
    pub bytes: ByClass,
}

/// One file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSizes {
    pub name: String,
    pub size: u64,
    pub bytes: ByClass,
    pub segments: Vec<SegmentSizes>,
}

/// One delegate of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegateSizes {
    pub plan: String,
    pub index: usize,
    pub id: String,
    /// The payload's size, when located.
    pub payload: Option<u64>,
    /// Whether a backend of this build decoded it (else what it reads is unknown).
    pub decoded: bool,
    /// Bytes of its constants (and their scales) inside the payload.
    pub inline_weights: u64,
    /// Its constants, and the distinct bytes they (and their scales) read from named data.
    pub constants: usize,
    pub named_bytes: u64,
}

/// Tensors of one kind (`F32`, `XNNPACK qbint4 (groups of 32, bf16 scales)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindSizes {
    pub label: String,
    pub tensors: usize,
    /// Distinct bytes of their data, and of their scales.
    pub data: u64,
    pub scales: u64,
}

/// A tensor, for the list of the largest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSizes {
    pub path: String,
    pub name: Option<String>,
    pub describe: String,
    pub nbytes: u64,
}

/// Distinct byte ranges holding equal bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    /// Bytes of one copy.
    pub nbytes: u64,
    /// The tree paths of the tensors of each copy (a path per copy, the first tensor's).
    pub copies: Vec<String>,
}

/// How much of a data file the program reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataUse {
    pub name: String,
    pub keys: usize,
    /// Distinct bytes of all its keys.
    pub bytes: u64,
    pub used_keys: usize,
    pub used_bytes: u64,
}

/// Where the bytes of a model go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes {
    pub files: Vec<FileSizes>,
    pub total: ByClass,
    pub delegates: Vec<DelegateSizes>,
    /// Delegates whose payload no backend of this build decoded: what they read from named
    /// data is not known, so `data_use` may miss keys they read.
    pub undecoded: usize,
    /// By kind, most bytes first.
    pub kinds: Vec<KindSizes>,
    /// The largest tensors, most bytes first, at most [`LARGEST_LISTED`].
    pub largest: Vec<TensorSizes>,
    pub tensors: usize,
    /// Equal bytes stored more than once, most bytes wasted first.
    pub duplicates: Vec<Duplicate>,
    /// Whether they were looked for: not when a file is remote. Its bytes are fetched only
    /// when something reads them, and sampling every tensor would fetch a block of each.
    pub duplicates_looked_for: bool,
    /// One per data file attached to a program.
    pub data_use: Vec<DataUse>,
}

/// Tensors the largest list keeps.
pub const LARGEST_LISTED: usize = 100;

/// Bytes of a range compared at a time when looking for equal ranges, and sampled.
const WINDOW: u64 = 4 << 20;
const SAMPLE: u64 = 64;

impl Sizes {
    /// Accounts for every byte of the catalog's files.
    pub fn of(catalog: &Catalog) -> Result<Sizes> {
        let model = &*catalog.model;
        let tensors = tensors::of(catalog);
        let local = !model.files.iter().any(|f| f.fetched_on_demand());
        let files = file_sizes(model, &catalog.names, &tensors);
        let mut total = ByClass::default();
        for f in &files {
            total.add_all(&f.bytes);
        }
        let (delegates, undecoded) = delegate_sizes(catalog, &tensors);
        let mut largest: Vec<TensorSizes> = tensors
            .iter()
            .map(|t| TensorSizes {
                path: t.path.clone(),
                name: t.name.clone(),
                describe: describe(t),
                nbytes: t.nbytes(),
            })
            .collect();
        largest.sort_by(|a, b| b.nbytes.cmp(&a.nbytes).then_with(|| a.path.cmp(&b.path)));
        largest.truncate(LARGEST_LISTED);
        Ok(Sizes {
            files,
            total,
            delegates,
            undecoded,
            kinds: kinds(&tensors),
            largest,
            tensors: tensors.len(),
            duplicates: if local {
                duplicates(model, &tensors)?
            } else {
                Vec::new()
            },
            duplicates_looked_for: local,
            data_use: data_use(catalog),
        })
    }

    /// Bytes that one copy of each duplicate would save.
    pub fn duplicate_bytes(&self) -> u64 {
        self.duplicates
            .iter()
            .map(|d| d.nbytes * (d.copies.len() as u64 - 1))
            .sum()
    }
}

/// `XNNPACK qbint4[256,64] (groups of 32, bf16 scales)`.
fn describe(t: &Tensor) -> String {
    let mut s = String::new();
    if let Some(b) = t.backend {
        s.push_str(b);
        s.push(' ');
    }
    s.push_str(&t.describe());
    if let Some(scheme) = &t.scheme {
        s.push_str(" (");
        s.push_str(scheme);
        s.push(')');
    }
    s
}

/// Byte ranges of one file with the class they claim.
struct Claims(Vec<(u64, u64, Class)>);

impl Claims {
    fn add(&mut self, r: ByteRange, c: Class) {
        if !r.is_empty() {
            self.0.push((r.start(), r.end(), c));
        }
    }

    /// The file `[0, size)` cut into consecutive pieces, each with the first class claiming
    /// it (`Padding` where none does).
    fn partition(mut self, size: u64) -> Vec<(u64, u64, Class)> {
        let mut points: Vec<u64> = vec![0, size];
        for &(s, e, _) in &self.0 {
            points.push(s.min(size));
            points.push(e.min(size));
        }
        points.sort_unstable();
        points.dedup();
        // Sweep: at each point, ranges starting there join, ranges ending there leave.
        self.0.sort_unstable_by_key(|&(s, _, _)| s);
        let mut by_end: Vec<(u64, Class)> = Vec::new();
        let mut active = [0u32; 5];
        let mut next = 0;
        let mut out = Vec::with_capacity(points.len());
        for w in points.windows(2) {
            let (at, to) = (w[0], w[1]);
            by_end.retain(|&(e, c)| {
                if e <= at {
                    active[c as usize] -= 1;
                    false
                } else {
                    true
                }
            });
            while next < self.0.len() && self.0[next].0 <= at {
                let (_, e, c) = self.0[next];
                if e > at {
                    active[c as usize] += 1;
                    by_end.push((e, c));
                }
                next += 1;
            }
            let class = Class::ALL
                .into_iter()
                .find(|&c| active[c as usize] > 0)
                .unwrap_or(Class::Padding);
            match out.last_mut() {
                Some((_, end, c)) if *c == class && *end == at => *end = to,
                _ => out.push((at, to, class)),
            }
        }
        out
    }
}

/// Sums the classes of the pieces of `parts` that fall in `r` (parts sorted, consecutive).
fn classes_in(parts: &[(u64, u64, Class)], r: ByteRange) -> ByClass {
    let mut out = ByClass::default();
    let first = parts.partition_point(|&(_, e, _)| e <= r.start());
    for &(s, e, c) in &parts[first..] {
        if s >= r.end() {
            break;
        }
        out.add(c, e.min(r.end()) - s.max(r.start()));
    }
    out
}

/// What refers to each segment of a `.pte`.
fn pte_roles(pte: &crate::format::pte::Pte, names: &Names) -> Vec<Vec<String>> {
    let program = &pte.program;
    let mut roles: Vec<Vec<String>> = vec![Vec::new(); pte.segments.len()];
    let mut mark = |index: u32, what: String| {
        if let Some(r) = roles.get_mut(index as usize) {
            r.push(what);
        }
    };
    if let Some(c) = &program.constant_segment {
        mark(c.segment_index, "constants".to_string());
    }
    for m in program.mutable_data_segments.iter().flatten() {
        mark(m.segment_index, "initial states".to_string());
    }
    for (p, plan) in program.execution_plan.iter().flatten().enumerate() {
        for (j, d) in plan.delegates.iter().flatten().enumerate() {
            if let Some(r) = d
                .processed
                .as_ref()
                .filter(|r| r.location == pte_fb::DataLocation::SEGMENT)
            {
                mark(r.index, format!("delegate {}/{j}", names.plans[p]));
            }
        }
    }
    for nd in program.named_data.iter().flatten() {
        let key = nd.key.as_deref().unwrap_or("");
        mark(nd.segment_index, format!("named data {key:?}"));
    }
    roles
}

/// A segment's role from what refers to it: the first, and how many more.
fn role_text(refs: &[String]) -> String {
    match refs {
        [] => "unreferenced".to_string(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} and {} more", rest.len()),
    }
}

fn file_sizes(model: &Model, names: &Names, tensors: &[Tensor]) -> Vec<FileSizes> {
    let mut claims: Vec<Claims> = model.files.iter().map(|_| Claims(Vec::new())).collect();
    for t in tensors {
        claims[t.data.file].add(t.data.range, Class::Weights);
        if let Some(s) = t.scales {
            claims[s.file].add(s.range, Class::Weights);
        }
    }
    if let Some(layout) = &model.pte_layout {
        for plan in &layout.plans {
            for d in plan.delegates.iter().flatten() {
                claims[d.file].add(d.range, Class::DelegateGraphs);
            }
        }
    }
    let mut out = Vec::new();
    for (f, file) in model.files.iter().enumerate() {
        let c = &mut claims[f];
        c.add(
            ByteRange::new(0, file.program_end().min(file.len())).unwrap_or_default(),
            Class::Program,
        );
        let (segments, roles): (&[ByteRange], Vec<Vec<String>>) = match &file.kind {
            Kind::Pte(pte) => (&pte.segments, pte_roles(pte, names)),
            Kind::Ptd(ptd) => {
                let mut roles = vec![Vec::new(); ptd.segments.len()];
                for b in model.ptd_blobs[f].iter().flatten() {
                    if let Some(r) = roles.get_mut(b.segment_index as usize) {
                        r.push(format!("named data {:?}", b.key));
                    }
                }
                (&ptd.segments, roles)
            }
        };
        for (seg, refs) in segments.iter().zip(&roles) {
            if refs.is_empty() {
                c.add(*seg, Class::Unused);
            }
        }
        let parts = std::mem::replace(c, Claims(Vec::new())).partition(file.len());
        let bytes = classes_in(&parts, ByteRange::new(0, file.len()).unwrap_or_default());
        let segments = segments
            .iter()
            .zip(&roles)
            .enumerate()
            .map(|(index, (r, refs))| SegmentSizes {
                index,
                range: *r,
                role: role_text(refs),
                bytes: classes_in(&parts, *r),
            })
            .collect();
        out.push(FileSizes {
            name: file.name.to_string_lossy().into_owned(),
            size: file.len(),
            bytes,
            segments,
        });
    }
    out
}

fn delegate_sizes(catalog: &Catalog, tensors: &[Tensor]) -> (Vec<DelegateSizes>, usize) {
    let model = &*catalog.model;
    let mut out = Vec::new();
    let mut undecoded = 0;
    let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
        return (out, 0);
    };
    for (p, plan) in pte.program.execution_plan.iter().flatten().enumerate() {
        for (j, d) in plan.delegates.iter().flatten().enumerate() {
            let at = layout.plans[p]
                .delegates
                .get(j)
                .and_then(|l| l.as_ref().ok());
            let decoded = catalog.payloads.get(p, j).is_some();
            if !decoded {
                undecoded += 1;
            }
            let mut row = DelegateSizes {
                plan: catalog.names.plans[p].clone(),
                index: j,
                id: d.id.clone().unwrap_or_default(),
                payload: at.map(|l| l.range.len()),
                decoded,
                inline_weights: 0,
                constants: 0,
                named_bytes: 0,
            };
            let mut seen = HashSet::new();
            let ours = tensors.iter().filter(|t| {
                matches!(t.origin, Origin::Constant { plan, delegate, .. } if plan == p && delegate == j)
            });
            for t in ours {
                row.constants += 1;
                for l in std::iter::once(t.data).chain(t.scales) {
                    let inside = at.is_some_and(|a| {
                        a.file == l.file
                            && a.range.start() <= l.range.start()
                            && l.range.end() <= a.range.end()
                    });
                    if !seen.insert(l) {
                        continue;
                    }
                    if inside {
                        row.inline_weights += l.range.len();
                    } else {
                        row.named_bytes += l.range.len();
                    }
                }
            }
            out.push(row);
        }
    }
    (out, undecoded)
}

fn kinds(tensors: &[Tensor]) -> Vec<KindSizes> {
    let mut rows: BTreeMap<String, (KindSizes, HashSet<Location>)> = BTreeMap::new();
    for t in tensors {
        let label = t.kind_label();
        let (row, seen) = rows.entry(label.clone()).or_insert_with(|| {
            (
                KindSizes {
                    label,
                    tensors: 0,
                    data: 0,
                    scales: 0,
                },
                HashSet::new(),
            )
        });
        row.tensors += 1;
        if seen.insert(t.data) {
            row.data += t.data.range.len();
        }
        if let Some(s) = t.scales {
            if seen.insert(s) {
                row.scales += s.range.len();
            }
        }
    }
    let mut out: Vec<KindSizes> = rows.into_values().map(|(r, _)| r).collect();
    out.sort_by(|a, b| {
        (b.data + b.scales)
            .cmp(&(a.data + a.scales))
            .then_with(|| a.label.cmp(&b.label))
    });
    out
}

/// Distinct ranges (data and scales of the tensors) holding equal bytes.
fn duplicates(model: &Model, tensors: &[Tensor]) -> Result<Vec<Duplicate>> {
    // Each distinct range once, with the path of the first tensor that stores it.
    let mut ranges: Vec<(Location, String)> = Vec::new();
    let mut seen = HashSet::new();
    for t in tensors {
        for (l, suffix) in std::iter::once((t.data, "")).chain(t.scales.map(|s| (s, " (scales)"))) {
            if !l.range.is_empty() && seen.insert(l) {
                ranges.push((l, format!("{}{suffix}", t.path)));
            }
        }
    }
    // Only ranges of equal length can hold equal bytes.
    let mut by_len: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, (l, _)) in ranges.iter().enumerate() {
        by_len.entry(l.range.len()).or_default().push(i);
    }
    by_len.retain(|_, g| g.len() > 1);
    // A sample of each of those (its first, middle and last bytes), read in file order so
    // that the scan gives back the pages it touched as it moves on.
    let mut order: Vec<usize> = by_len.values().flatten().copied().collect();
    order.sort_by_key(|&i| (ranges[i].0.file, ranges[i].0.range.start()));
    let mut samples: Vec<Vec<u8>> = vec![Vec::new(); ranges.len()];
    for i in order {
        let l = ranges[i].0;
        let len = l.range.len();
        let file = &model.files[l.file];
        let sample = &mut samples[i];
        for at in [
            0,
            len.saturating_sub(SAMPLE) / 2,
            len.saturating_sub(SAMPLE),
        ] {
            let w = l.range.slice_from(at, SAMPLE);
            sample.extend_from_slice(&file.read(w)?);
            file.release(w);
        }
    }
    let mut out = Vec::new();
    let mut lens: Vec<u64> = by_len.keys().copied().collect();
    lens.sort_unstable();
    for len in lens {
        let group = &by_len[&len];
        let mut by_sample: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for &i in group {
            by_sample.entry(&samples[i]).or_default().push(i);
        }
        let mut candidates: Vec<Vec<usize>> =
            by_sample.into_values().filter(|g| g.len() > 1).collect();
        candidates.sort();
        for group in candidates {
            let mut by_hash: BTreeMap<[u8; 32], Vec<usize>> = BTreeMap::new();
            for &i in &group {
                by_hash
                    .entry(hash(model, &ranges[i].0)?)
                    .or_default()
                    .push(i);
            }
            for copies in by_hash.into_values().filter(|g| g.len() > 1) {
                out.push(Duplicate {
                    nbytes: len,
                    copies: copies.iter().map(|&i| ranges[i].1.clone()).collect(),
                });
            }
        }
    }
    out.sort_by(|a, b| {
        let waste = |d: &Duplicate| d.nbytes * (d.copies.len() as u64 - 1);
        waste(b)
            .cmp(&waste(a))
            .then_with(|| a.copies.cmp(&b.copies))
    });
    Ok(out)
}

/// The SHA-256 of the bytes at `l`, read in windows.
fn hash(model: &Model, l: &Location) -> Result<[u8; 32]> {
    let file = &model.files[l.file];
    let mut h = Sha256::new();
    let mut at = 0;
    while at < l.range.len() {
        let r = l.range.slice_from(at, WINDOW);
        h.update(&*file.read(r)?);
        file.release(r);
        at += r.len();
    }
    Ok(h.finalize().into())
}

fn data_use(catalog: &Catalog) -> Vec<DataUse> {
    let model = &*catalog.model;
    let Some(layout) = &model.pte_layout else {
        return Vec::new();
    };
    let mut used: HashSet<(FileIndex, usize)> = HashSet::new();
    for plan in &layout.plans {
        for t in plan.tensors.iter().flatten() {
            if let (DataKind::External, Some(key)) = (t.kind, t.key) {
                used.insert(key);
            }
        }
    }
    for (_, dec) in catalog.payloads.iter() {
        for b in dec.payload.blobs() {
            if let crate::backend::BlobRef::Named { key, .. } = &b.bytes {
                if let Some((f, k, _)) = model.named_blob(key) {
                    used.insert((f, k));
                }
            }
        }
    }
    let mut out = Vec::new();
    for (f, file) in model.files.iter().enumerate().skip(1) {
        let blobs = model.ptd_blobs[f].as_deref().unwrap_or_default();
        let (mut all, mut mine) = (HashSet::new(), HashSet::new());
        let mut used_keys = 0;
        for (k, b) in blobs.iter().enumerate() {
            let Ok(l) = &b.location else { continue };
            all.insert(*l);
            if used.contains(&(f, k)) {
                used_keys += 1;
                mine.insert(*l);
            }
        }
        let sum = |s: &HashSet<Location>| s.iter().map(|l| l.range.len()).sum();
        out.push(DataUse {
            name: file.name.to_string_lossy().into_owned(),
            keys: blobs.len(),
            bytes: sum(&all),
            used_keys,
            used_bytes: sum(&mine),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_partition_a_file_in_claim_order() {
        let r = |s, n| ByteRange::new(s, n).unwrap();
        let mut c = Claims(Vec::new());
        c.add(r(0, 100), Class::Program);
        c.add(r(40, 20), Class::DelegateGraphs);
        c.add(r(50, 30), Class::Weights);
        c.add(r(200, 50), Class::Unused);
        c.add(r(220, 10), Class::Weights);
        let parts = c.partition(300);
        assert_eq!(
            parts,
            vec![
                (0, 40, Class::Program),
                (40, 50, Class::DelegateGraphs),
                (50, 80, Class::Weights),
                (80, 100, Class::Program),
                (100, 200, Class::Padding),
                (200, 220, Class::Unused),
                (220, 230, Class::Weights),
                (230, 250, Class::Unused),
                (250, 300, Class::Padding),
            ]
        );
        let all = classes_in(&parts, r(0, 300));
        assert_eq!(all.total(), 300);
        assert_eq!(all.get(Class::Weights), 40);
        let some = classes_in(&parts, r(45, 180));
        assert_eq!(some.total(), 180);
        assert_eq!(some.get(Class::Padding), 100);
        assert_eq!(some.get(Class::Unused), 20);
    }
}
