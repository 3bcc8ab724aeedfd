//! Which tensor of one side is which tensor of the other (docs/commands.md#how-tensors-are-paired).
//!
//! Pairing runs in stages, each on the tensors the stages before it left unpaired, and every
//! pair records the stage that made it:
//!
//! 1. by checkpoint name: the names a checkpoint gives its tensors, on both sides (a
//!    checkpoint's tensors carry their own; a model's tensors would carry the names a map
//!    from `ptefs names` gives them);
//! 2. by name: a value's fully qualified name, a named-data key, a checkpoint tensor's name;
//! 3. by value: the same value index of the plan of the same name;
//! 4. by delegate position: the constant of the same value id in the same delegate of the
//!    same plan and backend, with the same shape.
//!
//! Invariants: a tensor is in at most one pair; within a stage, tensors with equal keys pair
//! in their sides' order (the first with the first), so the result is deterministic; a key
//! a stage cannot give (a tensor without a name) never pairs at that stage.

use std::collections::{HashMap, VecDeque};

use crate::catalog::tensors::{Origin, Tensor};

/// The stage that made a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum How {
    CheckpointName,
    Name,
    Value,
    Position,
}

impl How {
    pub const ALL: [How; 4] = [How::CheckpointName, How::Name, How::Value, How::Position];

    /// The name the JSON report gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            How::CheckpointName => "checkpoint_name",
            How::Name => "name",
            How::Value => "value",
            How::Position => "delegate_position",
        }
    }

    /// How the text report says it.
    pub fn describe(self) -> &'static str {
        match self {
            How::CheckpointName => "by checkpoint name",
            How::Name => "by name",
            How::Value => "by value index",
            How::Position => "by delegate position",
        }
    }
}

/// The pairs, and what is left on each side.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pairing {
    /// (tensor of A, tensor of B, the stage that paired them), in A's order.
    pub pairs: Vec<(usize, usize, How)>,
    pub only_a: Vec<usize>,
    pub only_b: Vec<usize>,
}

/// The key `t` has at stage `how`; `checkpoint` is its checkpoint name, if it has one.
fn key(t: &Tensor, how: How, checkpoint: Option<&str>) -> Option<String> {
    match how {
        How::CheckpointName => checkpoint.map(str::to_string),
        How::Name => t.name.clone(),
        How::Value => match t.origin {
            Origin::Value { .. } => Some(t.path.clone()),
            Origin::Checkpoint { .. } => t.name.clone(),
            _ => None,
        },
        How::Position => match t.origin {
            Origin::Constant { .. } | Origin::Checkpoint { .. } => {
                let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
                Some(format!("{} [{}]", t.path, dims.join(",")))
            }
            _ => None,
        },
    }
}

/// Pairs the tensors of `a` with those of `b`; `names_a` and `names_b` are the checkpoint
/// names of their tensors, by position (None, or no entry, for a tensor without one).
pub fn pair(
    a: &[Tensor], b: &[Tensor], names_a: &[Option<&str>], names_b: &[Option<&str>],
) -> Pairing {
    let names_a = |i: usize| names_a.get(i).copied().flatten();
    let names_b = |j: usize| names_b.get(j).copied().flatten();
    let mut paired_a: Vec<Option<(usize, How)>> = vec![None; a.len()];
    let mut paired_b = vec![false; b.len()];
    for how in How::ALL {
        let mut waiting: HashMap<String, VecDeque<usize>> = HashMap::new();
        for (j, t) in b.iter().enumerate() {
            if paired_b[j] {
                continue;
            }
            if let Some(k) = key(t, how, names_b(j)) {
                waiting.entry(k).or_default().push_back(j);
            }
        }
        if waiting.is_empty() {
            continue;
        }
        for (i, t) in a.iter().enumerate() {
            if paired_a[i].is_some() {
                continue;
            }
            let Some(k) = key(t, how, names_a(i)) else {
                continue;
            };
            if let Some(j) = waiting.get_mut(&k).and_then(VecDeque::pop_front) {
                paired_a[i] = Some((j, how));
                paired_b[j] = true;
            }
        }
    }
    let mut out = Pairing::default();
    for (i, p) in paired_a.into_iter().enumerate() {
        match p {
            Some((j, how)) => out.pairs.push((i, j, how)),
            None => out.only_a.push(i),
        }
    }
    out.only_b = (0..b.len()).filter(|&j| !paired_b[j]).collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::layout::{DataKind, Location};

    fn tensor(path: &str, name: Option<&str>, origin: Origin, shape: &[u64]) -> Tensor {
        Tensor {
            path: path.to_string(),
            name: name.map(str::to_string),
            origin,
            backend: None,
            dtype: "F32".to_string(),
            scheme: None,
            shape: shape.to_vec(),
            dim_order: None,
            data: Location {
                file: 0,
                range: Default::default(),
            },
            scales: None,
            view: None,
        }
    }

    fn value(plan: usize, index: usize, name: Option<&str>) -> Tensor {
        let path = format!("plans/p{plan}/values/{index}");
        let origin = Origin::Value {
            plan,
            index,
            kind: DataKind::Constant,
        };
        tensor(&path, name, origin, &[4])
    }

    fn constant(value: u32, shape: &[u64], key: &str) -> Tensor {
        let path = format!("plans/forward/delegates/0/xnnpack/values/{value}");
        let origin = Origin::Constant {
            plan: 0,
            delegate: 0,
            value,
        };
        tensor(&path, Some(key), origin, shape)
    }

    const NONE: &[Option<&str>] = &[];

    #[test]
    fn stages_run_in_order_on_what_is_left() {
        let a = vec![
            value(0, 1, Some("w")),
            value(0, 2, None),
            constant(5, &[4, 8], "k1"),
            constant(6, &[4, 8], "same"),
            constant(7, &[2], "k3"),
            value(0, 9, None),
        ];
        let b = vec![
            constant(6, &[4, 8], "same"),
            value(0, 2, None),
            value(0, 1, Some("w")),
            constant(5, &[4, 8], "k1-changed"),
            constant(7, &[4], "k3-changed"),
            value(1, 9, None),
        ];
        let p = pair(&a, &b, NONE, NONE);
        assert_eq!(
            p.pairs,
            vec![
                (0, 2, How::Name),
                (1, 1, How::Value),
                (2, 3, How::Position),
                (3, 0, How::Name),
            ]
        );
        // The same position with another shape, and a value of another plan, never pair.
        assert_eq!(p.only_a, vec![4, 5]);
        assert_eq!(p.only_b, vec![4, 5]);
    }

    #[test]
    fn equal_keys_pair_in_order_and_checkpoint_names_come_first() {
        // Two payload values reading one key (equal bytes stored once) on each side.
        let a = vec![constant(1, &[4], "k"), constant(2, &[4], "k")];
        let b = vec![
            constant(3, &[4], "k"),
            constant(4, &[4], "k"),
            constant(9, &[4], "k"),
        ];
        let p = pair(&a, &b, NONE, NONE);
        assert_eq!(p.pairs, vec![(0, 0, How::Name), (1, 1, How::Name)]);
        assert_eq!(p.only_b, vec![2]);

        // A checkpoint name beats a model's own name.
        let names_a = [Some("model.w"), None];
        let names_b = [None, None, Some("model.w")];
        let p = pair(&a, &b, &names_a, &names_b);
        assert_eq!(
            p.pairs,
            vec![(0, 2, How::CheckpointName), (1, 0, How::Name)]
        );
        assert_eq!(p.only_b, vec![1]);
    }

    #[test]
    fn a_checkpoint_pairs_by_its_names_then_by_tree_paths() {
        let a = vec![
            value(0, 1, Some("lin.weight")),
            value(0, 3, None),
            constant(2, &[4, 8], "sha"),
        ];
        let ck = |name: &str, index, shape: &[u64]| {
            tensor(name, Some(name), Origin::Checkpoint { index }, shape)
        };
        let b = vec![
            ck("plans/p0/values/3", 0, &[4]),
            ck("lin.weight", 1, &[4]),
            ck("plans/forward/delegates/0/xnnpack/values/2", 2, &[4, 8]),
        ];
        let names_b: Vec<Option<&str>> = b.iter().map(|t| t.name.as_deref()).collect();
        let p = pair(&a, &b, NONE, &names_b);
        assert_eq!(
            p.pairs,
            vec![(0, 1, How::Name), (1, 0, How::Value), (2, 2, How::Position)]
        );
    }
}
