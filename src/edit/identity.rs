//! Writes that keep tensors apart (docs/writes.md#shared-bytes-and-identity): ExecuTorch stores
//! equal bytes once, so two distinct tensors (two values of one plan, two keys of one file) may
//! show one byte range. A write to one of them gives it bytes of its own, through a re-layout
//! of its file, and leaves the other as it was; bytes one tensor shows several ways (one
//! parameter used by two methods, an EXTERNAL value and its key) stay shared and change
//! together.
//!
//! Invariants: only writes of a tensor that shares its bytes with a distinct tensor
//! ([`Relation::Distinct`]) are separated, and only when the sharers end up different: a
//! commit that gives every tensor on a range the same new bytes writes them once, in place,
//! and the range stays shared. The other writes of the commit go with the separated ones
//! (into the same new file when in the same file, in place otherwise), so a commit stays one
//! atomic change per file. Writes of no tensor (segments, delegate payloads) are never
//! separated: they replace whatever the range holds.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::plan::{Change, Owner, Plan};
use crate::content::{Bytes, Source, Write};
use crate::error::Result;
use crate::format::layout::{FileIndex, Location};
use crate::format::range::ByteRange;
use crate::format::sharing::{relation, Identity, Relation, TensorId};
use crate::format::Model;

/// `plan`, with every tensor it writes whose bytes are shared with a distinct tensor given
/// bytes of its own.
pub fn separate<'a>(model: &Model, plan: Plan<'a>) -> Result<Plan<'a>> {
    let Plan::InPlace { writes } = plan else {
        return Ok(plan);
    };
    if writes.iter().all(|w| w.of.is_none()) {
        return Ok(Plan::InPlace { writes });
    }
    let shared = model.shared_bytes();
    let (writes, kept_shared) = same_bytes_once(shared, writes)?;
    let mut ranges: HashMap<Location, Range> = HashMap::new();
    for w in &writes {
        if kept_shared.contains(&w.location) {
            continue;
        }
        if let Some(id) = w.of {
            let group = shared.sharers(&w.location);
            if !group.is_empty() {
                ranges
                    .entry(w.location)
                    .or_insert_with(|| Range::new(group))
                    .written
                    .push(id);
            }
        }
    }
    // When every tensor on a range is written (a bulk update of all of them), the first
    // writer keeps the range: nothing needs the old bytes, and none are left unused.
    let mut owners = Vec::with_capacity(writes.len());
    for w in &writes {
        let owned = match (w.of, ranges.get_mut(&w.location)) {
            (Some(id), Some(range)) => range.owner(id),
            _ => None,
        };
        owners.push(owned);
    }
    if owners.iter().all(Option::is_none) {
        return Ok(Plan::InPlace { writes });
    }
    type Own<'a> = Vec<(Owner, Bytes<'a>)>;
    type Patches<'a> = Vec<(ByteRange, Bytes<'a>)>;
    let mut per_file: BTreeMap<FileIndex, (Own<'a>, Patches<'a>)> = BTreeMap::new();
    for (file, _) in owners.iter().flatten() {
        per_file.entry(*file).or_default();
    }
    let mut in_place = Vec::new();
    for (w, owned) in writes.into_iter().zip(owners) {
        match (owned, per_file.get_mut(&w.location.file)) {
            (Some((file, owner)), _) => per_file
                .get_mut(&file)
                .expect("every owner's file has an entry")
                .0
                .push((owner, w.bytes)),
            (None, Some((_, patches))) => patches.push((w.location.range, w.bytes)),
            (None, None) => in_place.push(w),
        }
    }
    Ok(Plan::Separate {
        relayouts: per_file
            .into_iter()
            .map(|(file, (own, patches))| (file, Change::OwnBytes { own, patches }))
            .collect(),
        in_place,
    })
}

/// `writes` without repeats of a shared range whose sharers all get the same new bytes:
/// every tensor on the range (or the same tensor as one) is written, with equal content, so
/// the range keeps being shared and is written once; the first write stands for them all.
/// Returns the writes and those ranges. Ranges whose sharers get different bytes, or where
/// some sharer is not written, keep all their writes, and `separate` gives the tensors bytes
/// of their own.
fn same_bytes_once<'a>(
    shared: &crate::format::sharing::SharedBytes, writes: Vec<Write<'a>>,
) -> Result<(Vec<Write<'a>>, HashSet<Location>)> {
    let mut by_range: HashMap<Location, Vec<usize>> = HashMap::new();
    for (k, w) in writes.iter().enumerate() {
        if w.of.is_some() && !shared.sharers(&w.location).is_empty() {
            by_range.entry(w.location).or_default().push(k);
        }
    }
    let mut dropped = vec![false; writes.len()];
    let mut kept_shared = HashSet::new();
    let mut buf = (Vec::new(), Vec::new());
    for (location, ks) in &by_range {
        if ks.len() < 2 {
            continue;
        }
        let mut range = Range::new(shared.sharers(location));
        range.written = ks.iter().filter_map(|&k| writes[k].of).collect();
        if !range.all_written() {
            continue;
        }
        let first = writes[ks[0]].bytes.source();
        let mut equal = true;
        for &k in &ks[1..] {
            let same = same_content(first, writes[k].bytes.source(), &mut buf).map_err(|e| {
                crate::error::Error::io("compare the new bytes of shared tensors", e)
            })?;
            if !same {
                equal = false;
                break;
            }
        }
        if equal {
            kept_shared.insert(*location);
            for &k in &ks[1..] {
                dropped[k] = true;
            }
        }
    }
    let writes = writes
        .into_iter()
        .zip(dropped)
        .filter_map(|(w, drop)| (!drop).then_some(w))
        .collect();
    Ok((writes, kept_shared))
}

/// Whether two contents are equal, compared a chunk at a time.
fn same_content(a: Source, b: Source, (x, y): &mut (Vec<u8>, Vec<u8>)) -> std::io::Result<bool> {
    if a.len() != b.len() {
        return Ok(false);
    }
    let mut at = 0;
    while at < a.len() {
        let n = (a.len() - at).min(crate::content::CHUNK as u64) as usize;
        x.resize(n, 0);
        y.resize(n, 0);
        a.read_at(at, x)?;
        b.read_at(at, y)?;
        if x != y {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// A byte range several tensors show, and the tensors a commit writes there. Built once per
/// range a commit touches, so deciding for every write costs time linear in the ranges'
/// tensors, however many writes share one range.
struct Range {
    /// The tensors of each identity on the range.
    by_identity: HashMap<Identity, Vec<TensorId>>,
    identity_of: HashMap<TensorId, Identity>,
    written: Vec<TensorId>,
    /// Whether a writer keeps the range: `None` until the first writer asks.
    one_keeps: Option<bool>,
}

impl Range {
    fn new(group: &[(TensorId, Identity)]) -> Range {
        let mut by_identity: HashMap<Identity, Vec<TensorId>> = HashMap::new();
        for (t, i) in group {
            by_identity.entry(*i).or_default().push(*t);
        }
        Range {
            by_identity,
            identity_of: group.iter().copied().collect(),
            written: Vec::new(),
            one_keeps: None,
        }
    }

    /// The tensors of identities that are the same tensor as `me` (`me`'s own included).
    fn same_tensor(&self, me: Identity) -> impl Iterator<Item = TensorId> + '_ {
        self.by_identity
            .iter()
            .filter(move |(i, _)| relation(me, **i) == Relation::SameTensor)
            .flat_map(|(_, ts)| ts.iter().copied())
    }

    /// Whether a tensor on the range is distinct from tensor `id` of identity `me`.
    fn has_distinct(&self, id: TensorId, me: Identity) -> bool {
        let same = self.same_tensor(me).filter(|t| *t != id).count();
        let all: usize = self.by_identity.values().map(Vec::len).sum();
        all - 1 > same
    }

    /// Whether every tensor on the range is written, itself or as the same tensor as one
    /// that is.
    fn all_written(&self) -> bool {
        let mut covered: HashSet<TensorId> = self.written.iter().copied().collect();
        let identities: HashSet<Identity> = self
            .written
            .iter()
            .filter_map(|t| self.identity_of.get(t).copied())
            .collect();
        for i in identities {
            covered.extend(self.same_tensor(i));
        }
        self.identity_of.keys().all(|t| covered.contains(t))
    }

    /// Who must get bytes of their own, and in which file, for the write of tensor `id`;
    /// `None` when it stays on the range.
    fn owner(&mut self, id: TensorId) -> Option<(FileIndex, Owner)> {
        let me = *self.identity_of.get(&id)?;
        if !self.has_distinct(id, me) {
            return None;
        }
        if self.one_keeps.is_none() {
            let keeps = self.all_written();
            self.one_keeps = Some(keeps);
            if keeps {
                return None;
            }
        }
        match me {
            Identity::Key { file, index } => Some((
                file as FileIndex,
                Owner::Key {
                    index: index as usize,
                },
            )),
            Identity::Buffer { mutable, .. } => {
                // The value and the values of other plans that are the same parameter move
                // to the new buffer together.
                // (Values of one plan on one buffer are distinct, so `same_tensor` of a buffer
                // value lists other plans' values only.)
                let values = std::iter::once(id)
                    .chain(self.same_tensor(me))
                    .filter_map(|t| match t {
                        TensorId::Value { plan, index } => Some((plan as usize, index as usize)),
                        TensorId::Key { .. } => None,
                    })
                    .collect();
                Some((0, Owner::Buffer { mutable, values }))
            }
        }
    }
}
