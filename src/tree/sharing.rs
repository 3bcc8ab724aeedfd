//! Which tree paths show the same bytes, and whether each pair is one tensor or two
//! (docs/tree.md#shared-bytes).
//!
//! ExecuTorch stores equal bytes once, so several paths can show one byte range: values of
//! one plan or of several plans pointing at one constant buffer, `.ptd` keys pointing at one
//! segment, an EXTERNAL value and the key it names. The index maps each byte range shown by
//! more than one path to those paths, in tree order, each with its *identity*; the relation
//! between two of them follows from their identities alone ([`relation`]).
//!
//! The paths indexed are the values of every plan (`plans/<p>/values/<i>`), the `.pte`'s
//! named data and the named data of every `.ptd` (`…named_data/<key>`); `segments/<n>` and
//! delegate payloads are views of whole segments and are not listed.
//!
//! Cost: building is one pass over the model's tables (not the tree's nodes, so no lazy
//! directory is built for it) plus a sort of the located tensors (hash-free, `O(n log n)`,
//! 48 bytes per located tensor while it runs); only ranges shown by two or more paths are
//! kept. Listing the first [`LISTED`] others of a path costs `O(LISTED)` whatever the number
//! of sharers; finding a path's own entry is a binary search.

use std::collections::HashMap;

use super::{TextKind, Tree};
use crate::format::layout::Location;
use crate::format::sharing::{all_tensors, locate, TensorId};
pub use crate::format::sharing::{relation, Identity, Relation};

/// How many other paths a `.json` (`aliases`) and the `user.ptefs.shared` xattr list.
pub const LISTED: usize = 16;

/// One path that shows a shared byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharer {
    /// The tensor the path shows (`values/<i>`, `named_data/<key>`; [`Tree::tensor_path`]).
    pub id: TensorId,
    pub identity: Identity,
}

/// The paths showing each byte range shown more than once, in tree order (the plans' values,
/// then the named data of each file: the order of `TensorId`).
#[derive(Debug, Default)]
pub struct SharingIndex {
    groups: HashMap<Location, Box<[Sharer]>>,
}

/// What shares a path's bytes: at most [`LISTED`] other paths with their relation to it, in
/// tree order, and how many other paths there are in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shared {
    pub listed: Vec<(Sharer, Relation)>,
    pub total: usize,
}

impl SharingIndex {
    /// Indexes every value and named-data entry of `tree` that has bytes.
    pub fn build(tree: &Tree) -> SharingIndex {
        let mut all: Vec<(Location, Sharer)> = all_tensors(&tree.model)
            .filter_map(|id| {
                let (location, identity) = locate(&tree.model, id)?;
                Some((location, Sharer { id, identity }))
            })
            .collect();
        // Stable: each range's sharers stay in `TensorId` order, as `all_tensors` gives them.
        all.sort_by_key(|(l, _)| (l.file, l.range.start(), l.range.len()));
        let mut groups = HashMap::new();
        let mut rest = all.as_slice();
        while let Some((first, _)) = rest.first() {
            let n = rest.iter().take_while(|(l, _)| l == first).count();
            if n > 1 {
                groups.insert(*first, rest[..n].iter().map(|(_, s)| *s).collect());
            }
            rest = &rest[n..];
        }
        SharingIndex { groups }
    }

    /// Every path showing `location`, in tree order; empty when at most one path shows it.
    pub fn sharers(&self, location: &Location) -> &[Sharer] {
        self.groups.get(location).map_or(&[], |g| g)
    }

    /// The entry of tensor `id`, among those showing `location`.
    pub fn sharer(&self, location: &Location, id: TensorId) -> Option<Sharer> {
        let group = self.sharers(location);
        group
            .binary_search_by_key(&id, |s| s.id)
            .ok()
            .map(|i| group[i])
    }

    /// The first [`LISTED`] paths other than `id`'s that show `location`, with their
    /// relation to it, and their number. Empty when `id` is not among them.
    pub fn others(&self, location: &Location, id: TensorId) -> Shared {
        let Some(own) = self.sharer(location, id) else {
            return Shared::default();
        };
        let group = self.sharers(location);
        let listed = group
            .iter()
            .filter(|s| s.id != id)
            .take(LISTED)
            .map(|s| (*s, relation(own.identity, s.identity)))
            .collect();
        Shared {
            listed,
            total: group.len() - 1,
        }
    }

    /// Whether a path other than `id`'s shows `location` as a distinct tensor: a write to
    /// `id`'s tensor must then give it bytes of its own. `O(sharers)`.
    pub fn has_distinct_sharer(&self, location: &Location, id: TensorId) -> bool {
        let Some(own) = self.sharer(location, id) else {
            return false;
        };
        self.sharers(location)
            .iter()
            .any(|s| s.id != id && relation(own.identity, s.identity) == Relation::Distinct)
    }
}

/// The tensor whose `.json` is a node of this kind.
pub fn tensor_of(kind: TextKind) -> Option<TensorId> {
    match kind {
        TextKind::ValueJson(p, i) => Some(TensorId::value(p, i)),
        TextKind::NamedDataJson(f, k) => Some(TensorId::key(f, k)),
        _ => None,
    }
}
