//! Which tree paths show the same bytes, and whether each pair is one tensor or two
//! (DESIGN.md §2.3).
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
use crate::format::generated::pte_fb;
use crate::format::layout::{DataKind, Location};
use crate::format::Kind;

/// How many other paths a `.json` (`aliases`) and the `user.ptefs.shared` xattr list.
pub const LISTED: usize = 16;

/// What a path that shows shared bytes *is*, as far as the relation rule needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A value of plan `plan` whose bytes come from the program's buffer tables:
    /// `data_buffer_idx` `buffer` of the constant buffers, or of the mutable initial states
    /// when `mutable`.
    Buffer {
        plan: u32,
        mutable: bool,
        buffer: u32,
    },
    /// Named-data entry `index` of file `file` (0 the mounted file, k the k-th `--data`
    /// file), or an EXTERNAL value whose `fully_qualified_name` resolved to that entry.
    Key { file: u32, index: u32 },
}

/// Which case of DESIGN.md §2.3 two paths on one byte range are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// Two tensors that happen to hold equal bytes (ExecuTorch stored them once). A write to
    /// one must give it bytes of its own and leave the other as it was.
    Distinct,
    /// One tensor reached two ways. A write changes both, and the bytes stay shared.
    SameTensor,
}

impl Relation {
    /// The name used in JSON and xattrs: `"distinct"` or `"same_tensor"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Relation::Distinct => "distinct",
            Relation::SameTensor => "same_tensor",
        }
    }
}

/// The relation rule, for two paths showing the same byte range (and only for those).
///
/// `SameTensor` when
/// - both are values of the `.pte` with the same `data_buffer_idx` into the same table
///   (constant or mutable) and they belong to *different* plans: one parameter used by two
///   methods; or
/// - both resolve to the same named-data entry of the same file: an EXTERNAL value and the
///   `.ptd` key its `fully_qualified_name` names, or two EXTERNAL values naming one key
///   (whatever their plans: a key is one tensor however many values name it).
///
/// `Distinct` otherwise: two values of one plan (a plan emits each tensor as one value, so
/// two values are two tensors even when ExecuTorch stored their equal bytes once), two
/// different keys of one file (ExecuTorch stores equal bytes once), an EXTERNAL value and a
/// different key that shares its segment, a constant and a named blob.
pub fn relation(a: Identity, b: Identity) -> Relation {
    use Identity::{Buffer, Key};
    match (a, b) {
        (Key { .. }, Key { .. }) if a == b => Relation::SameTensor,
        (
            Buffer {
                plan: pa,
                mutable: ma,
                buffer: ba,
            },
            Buffer {
                plan: pb,
                mutable: mb,
                buffer: bb,
            },
        ) if pa != pb && ma == mb && ba == bb => Relation::SameTensor,
        _ => Relation::Distinct,
    }
}

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
        for (i, node) in tree.nodes.iter().enumerate() {
            let Content::Text { kind, .. } = &node.content else {
                continue;
            };
            if let Some((location, identity)) = located(tree, *kind) {
                let json = i as Ino + 1;
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

/// Where the bytes of a value or named-data entry are, and its identity.
fn located(tree: &Tree, kind: TextKind) -> Option<(Location, Identity)> {
    let model = &*tree.model;
    match kind {
        TextKind::ValueJson(p, i) => {
            let t = model
                .pte_layout
                .as_ref()?
                .plans
                .get(p)?
                .tensors
                .get(i)?
                .as_ref()?;
            let location = t.location?;
            let identity = match (t.kind, t.key) {
                (DataKind::External, Some((file, index))) => Identity::Key {
                    file: file as u32,
                    index: index as u32,
                },
                (DataKind::Constant | DataKind::Mutable, _) => Identity::Buffer {
                    plan: p as u32,
                    mutable: t.kind == DataKind::Mutable,
                    buffer: data_buffer_idx(tree, p, i)?,
                },
                _ => return None,
            };
            Some((location, identity))
        }
        TextKind::NamedDataJson(f, k) => {
            let location = match &model.files.get(f)?.kind {
                Kind::Pte(_) => model
                    .pte_layout
                    .as_ref()?
                    .named_data
                    .get(k)?
                    .as_ref()
                    .ok()?,
                Kind::Ptd(_) => model
                    .ptd_blobs
                    .get(f)?
                    .as_ref()?
                    .get(k)?
                    .location
                    .as_ref()
                    .ok()?,
            };
            Some((
                *location,
                Identity::Key {
                    file: f as u32,
                    index: k as u32,
                },
            ))
        }
        _ => None,
    }
}

fn data_buffer_idx(tree: &Tree, p: usize, i: usize) -> Option<u32> {
    let plans = tree.model.pte()?.program.execution_plan.as_ref()?;
    match &plans.get(p)?.values.as_ref()?.get(i)?.val {
        pte_fb::KernelTypesT::Tensor(t) => Some(t.data_buffer_idx),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relation_rule() {
        let buf = |plan, buffer| Identity::Buffer {
            plan,
            mutable: false,
            buffer,
        };
        let key = |file, index| Identity::Key { file, index };
        use Relation::*;
        assert_eq!(relation(buf(0, 1), buf(1, 1)), SameTensor);
        assert_eq!(relation(buf(0, 1), buf(0, 1)), Distinct);
        assert_eq!(relation(buf(0, 1), buf(1, 2)), Distinct);
        let mutable = Identity::Buffer {
            plan: 1,
            mutable: true,
            buffer: 1,
        };
        assert_eq!(relation(buf(0, 1), mutable), Distinct);
        assert_eq!(relation(key(1, 0), key(1, 0)), SameTensor);
        assert_eq!(relation(key(1, 0), key(1, 1)), Distinct);
        assert_eq!(relation(key(1, 0), key(2, 0)), Distinct);
        assert_eq!(relation(buf(0, 1), key(0, 1)), Distinct);
        for (a, b) in [(buf(0, 1), buf(1, 1)), (key(1, 0), key(1, 1))] {
            assert_eq!(relation(a, b), relation(b, a));
        }
    }
}
