//! Writes that keep tensors apart (DESIGN.md §2.3): ExecuTorch stores equal bytes once, so
//! two distinct tensors (two values of one plan, two keys of one file) may show one byte
//! range. A write to one of them gives it bytes of its own, through a re-layout of its file,
//! and leaves the other as it was; bytes one tensor shows several ways (one parameter used by
//! two methods, an EXTERNAL value and its key) stay shared and change together.
//!
//! Invariants: only writes of a tensor that shares its bytes with a distinct tensor
//! ([`Relation::Distinct`]) are separated; the other writes of the commit go with them (into
//! the same new file when in the same file, in place otherwise), so a commit stays one
//! atomic change per file. Writes of no tensor (segments, delegate payloads) are never
//! separated: they replace whatever the range holds.

use std::collections::BTreeMap;

use super::validate::{Change, Owner, Plan};
use super::Bytes;
use crate::error::Result;
use crate::format::layout::{FileIndex, Location};
use crate::format::range::ByteRange;
use crate::format::sharing::{relation, Identity, Relation, SharedBytes, TensorId};
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
    let shared = SharedBytes::of(model);
    let owners: Vec<Option<(FileIndex, Owner)>> = writes
        .iter()
        .map(|w| w.of.and_then(|id| owner(&shared, &w.location, id)))
        .collect();
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

/// Who must get bytes of their own, and in which file, for a write of tensor `id` at
/// `location`; `None` when no distinct tensor shares the bytes.
fn owner(shared: &SharedBytes, location: &Location, id: TensorId) -> Option<(FileIndex, Owner)> {
    let group = shared.sharers(location);
    let &(_, me) = group.iter().find(|(t, _)| *t == id)?;
    if !shared
        .others(location, id)
        .any(|(_, r)| r == Relation::Distinct)
    {
        return None;
    }
    match me {
        Identity::Key { file, index } => Some((
            file as FileIndex,
            Owner::Key {
                index: index as usize,
            },
        )),
        Identity::Buffer { mutable, .. } => {
            // The value and the values of other plans that are the same parameter move to
            // the new buffer together.
            let values = group
                .iter()
                .filter(|(t, i)| *t == id || relation(me, *i) == Relation::SameTensor)
                .filter_map(|(t, _)| match *t {
                    TensorId::Value { plan, index } => Some((plan as usize, index as usize)),
                    TensorId::Key { .. } => None,
                })
                .collect();
            Some((0, Owner::Buffer { mutable, values }))
        }
    }
}
