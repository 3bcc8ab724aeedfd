//! Tensors that show the same bytes, and whether two of them are one tensor or two
//! (docs/tree.md#shared-bytes).
//!
//! ExecuTorch stores equal bytes once, so several tensors can show one byte range: values of
//! one plan or of several plans pointing at one constant buffer, `.ptd` keys pointing at one
//! segment, an EXTERNAL value and the key it names. Each such tensor has an *identity*, and
//! the relation between two tensors on one range follows from their identities alone
//! ([`relation`]). The tree lists what shares a file's bytes with this rule; commits use it to
//! give a written tensor bytes of its own when a distinct tensor shares them.
//!
//! Invariants: only tensors whose bytes lie in the files at hand are located; a
//! [`SharedBytes`] keeps only ranges shown by two or more tensors, each range's tensors in
//! program order (plans in order, values by index, then named data by file and index).

use std::collections::HashMap;

use super::generated::pte_fb;
use super::layout::{DataKind, FileIndex, Location};
use super::{Kind, Model};

/// A tensor whose bytes a write replaces: a value of a plan (its bytes may be in an attached
/// file) or a named-data entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorId {
    /// Value `index` of plan `plan` of the `.pte`.
    Value { plan: u32, index: u32 },
    /// Named-data entry `index` of file `file` (0 the mounted file, k the k-th `--data` file).
    Key { file: u32, index: u32 },
}

impl TensorId {
    pub fn value(plan: usize, index: usize) -> TensorId {
        TensorId::Value {
            plan: plan as u32,
            index: index as u32,
        }
    }

    pub fn key(file: FileIndex, index: usize) -> TensorId {
        TensorId::Key {
            file: file as u32,
            index: index as u32,
        }
    }
}

/// What a tensor that shows shared bytes *is*, as far as the relation rule needs to know.
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
    /// Named-data entry `index` of file `file`, or an EXTERNAL value whose
    /// `fully_qualified_name` resolved to that entry.
    Key { file: u32, index: u32 },
}

/// Which case of docs/tree.md#shared-bytes two tensors on one byte range are.
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

/// The relation rule, for two tensors showing the same byte range (and only for those).
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

/// Where the bytes of tensor `id` are, and its identity; `None` when the files at hand do
/// not hold them (activations, EXTERNAL values without their `.ptd`, defects).
pub fn locate(model: &Model, id: TensorId) -> Option<(Location, Identity)> {
    match id {
        TensorId::Value { plan, index } => {
            let (p, i) = (plan as usize, index as usize);
            let t = model.value_tensor(p, i)?;
            let location = t.location?;
            let identity = match (t.kind, t.key) {
                (DataKind::External, Some((file, index))) => Identity::Key {
                    file: file as u32,
                    index: index as u32,
                },
                (DataKind::Constant | DataKind::Mutable, _) => Identity::Buffer {
                    plan,
                    mutable: t.kind == DataKind::Mutable,
                    buffer: data_buffer_idx(model, p, i)?,
                },
                _ => return None,
            };
            Some((location, identity))
        }
        TensorId::Key { file, index } => {
            let (f, k) = (file as usize, index as usize);
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
            Some((*location, Identity::Key { file, index }))
        }
    }
}

fn data_buffer_idx(model: &Model, p: usize, i: usize) -> Option<u32> {
    let plans = model.pte()?.program.execution_plan.as_ref()?;
    match &plans.get(p)?.values.as_ref()?.get(i)?.val {
        pte_fb::KernelTypesT::Tensor(t) => Some(t.data_buffer_idx),
        _ => None,
    }
}

/// Every tensor of a model that can have bytes, in program order: the values of every plan,
/// then the named data of every file.
pub fn all_tensors(model: &Model) -> impl Iterator<Item = TensorId> + '_ {
    let plans = model.pte_layout.as_ref().map_or(&[][..], |l| &l.plans[..]);
    let values = plans.iter().enumerate().flat_map(|(p, plan)| {
        plan.tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.as_ref().is_some_and(|t| t.location.is_some()))
            .map(move |(i, _)| TensorId::value(p, i))
    });
    let keys = (0..model.files.len())
        .flat_map(move |f| (0..model.named_data_keys(f).len()).map(move |k| TensorId::key(f, k)));
    values.chain(keys)
}

/// The byte ranges shown by two or more tensors, each with its tensors in program order.
#[derive(Debug, Default)]
pub struct SharedBytes {
    groups: HashMap<Location, Vec<(TensorId, Identity)>>,
}

impl SharedBytes {
    /// Locates every tensor of `model`: `O(tensors)`, a hash entry per located tensor while
    /// it runs.
    pub fn of(model: &Model) -> SharedBytes {
        let mut all: HashMap<Location, Vec<(TensorId, Identity)>> = HashMap::new();
        for id in all_tensors(model) {
            if let Some((location, identity)) = locate(model, id) {
                all.entry(location).or_default().push((id, identity));
            }
        }
        all.retain(|_, v| v.len() > 1);
        SharedBytes { groups: all }
    }

    /// The tensors showing `location`, in program order; empty when at most one shows it.
    pub fn sharers(&self, location: &Location) -> &[(TensorId, Identity)] {
        self.groups.get(location).map_or(&[], |g| g)
    }

    /// The tensors other than `id` showing `location`, with their relation to it.
    pub fn others(
        &self, location: &Location, id: TensorId,
    ) -> impl Iterator<Item = (TensorId, Relation)> + '_ {
        let group = self.sharers(location);
        let own = group.iter().find(|(t, _)| *t == id).map(|(_, i)| *i);
        group
            .iter()
            .filter(move |(t, _)| *t != id)
            .filter_map(move |(t, i)| Some((*t, relation(own?, *i))))
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
