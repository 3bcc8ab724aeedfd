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
//! Cost: building is one pass over the nodes plus a sort of the located ones (hash-free,
//! `O(n log n)`, 48 bytes per located tensor while it runs); only ranges shown by two or more
//! paths are kept. Listing the first [`LISTED`] others of a path costs `O(LISTED)` whatever
//! the number of sharers; finding a path's own entry is a binary search.

use std::collections::HashMap;

use super::{Content, Ino, TextKind, Tree};
use crate::format::layout::Location;
use crate::format::sharing::{locate, TensorId};
pub use crate::format::sharing::{relation, Identity, Relation};

/// How many other paths a `.json` (`aliases`) and the `user.ptefs.shared` xattr list.
pub const LISTED: usize = 16;

/// One path that shows a shared byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharer {
    /// The path's `.json` node (`values/<i>.json`, `named_data/<key>.json`); the path itself
    /// is that node's path without `.json` ([`Tree::sharer_path`]).
    pub json: Ino,
    pub identity: Identity,
}

/// The paths showing each byte range shown more than once, in tree (inode) order.
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
        let mut all: Vec<(Location, Sharer)> = Vec::new();
        for (json, node) in tree.nodes() {
            let Content::Text { kind, .. } = &node.content else {
                continue;
            };
            if let Some((location, identity)) = located(tree, *kind) {
                all.push((location, Sharer { json, identity }));
            }
        }
        // Stable: each range's sharers stay in inode order.
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

    /// The entry of the path whose `.json` is `json`, among those showing `location`.
    pub fn sharer(&self, location: &Location, json: Ino) -> Option<Sharer> {
        let group = self.sharers(location);
        group
            .binary_search_by_key(&json, |s| s.json)
            .ok()
            .map(|i| group[i])
    }

    /// The first [`LISTED`] paths other than `json`'s that show `location`, with their
    /// relation to it, and their number. Empty when `json` is not among them.
    pub fn others(&self, location: &Location, json: Ino) -> Shared {
        let Some(own) = self.sharer(location, json) else {
            return Shared::default();
        };
        let group = self.sharers(location);
        let listed = group
            .iter()
            .filter(|s| s.json != json)
            .take(LISTED)
            .map(|s| (*s, relation(own.identity, s.identity)))
            .collect();
        Shared {
            listed,
            total: group.len() - 1,
        }
    }

    /// Whether a path other than `json`'s shows `location` as a distinct tensor: a write to
    /// `json`'s tensor must then give it bytes of its own. `O(sharers)`.
    pub fn has_distinct_sharer(&self, location: &Location, json: Ino) -> bool {
        let Some(own) = self.sharer(location, json) else {
            return false;
        };
        self.sharers(location)
            .iter()
            .any(|s| s.json != json && relation(own.identity, s.identity) == Relation::Distinct)
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

/// Where the bytes of a value or named-data entry are, and its identity.
fn located(tree: &Tree, kind: TextKind) -> Option<(Location, Identity)> {
    locate(&tree.model, tensor_of(kind)?)
}
