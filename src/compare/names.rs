//! Checkpoint names for the model sides of a comparison (`ptefs diff --names`,
//! docs/commands.md#names-in-a-diff): from a name map made by `ptefs names`, which fits only
//! the files whose digests it records, or learned from a checkpoint on each model side.
//!
//! Invariants: a map is applied only to a side whose files it was learned on, byte for byte;
//! a model side it does not fit is refused (with a CHECKPOINT, each side learns its own); a
//! tensor gets a name only from a `matched` entry, with the index map that reads its values
//! in the checkpoint's order.

use std::collections::HashMap;
use std::path::Path;

use super::side::{Side, SideKind};
use crate::error::{Error, Result};
use crate::names::given::{is_map, map_for};
use crate::names::map::Status;
use crate::names::{IndexMap, NameMap, Transform};

/// The checkpoint name of a model tensor, and how to read its values in the checkpoint's
/// order.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    /// The checkpoint's shape.
    pub shape: Vec<u64>,
    pub transform: Transform,
    /// Checkpoint element → stored element (of the tensor's float view, in memory order).
    pub map: IndexMap,
}

/// Per tensor of a side, its name (None for tensors the map does not name).
pub type SideNames = Vec<Option<Named>>;

/// The names of each side's tensors that `--names PATH` gives (empty for a checkpoint side:
/// its tensors carry their own).
pub fn side_names(path: &Path, a: &Side, b: &Side) -> Result<(SideNames, SideNames)> {
    let models: Vec<&Side> = [a, b]
        .into_iter()
        .filter(|s| s.kind != SideKind::Checkpoint)
        .collect();
    if models.is_empty() {
        return Err(Error::invalid(format!(
            "--names {}: both sides are checkpoints, whose tensors carry their names already",
            path.display()
        )));
    }
    let per_side = |side: &Side, map: &NameMap| -> SideNames {
        if side.kind == SideKind::Checkpoint {
            Vec::new()
        } else {
            apply(side, map)
        }
    };
    if is_map(path) {
        let map = NameMap::read(path)?;
        let fits = |side: &Side| match side.catalog() {
            Some(c) => map.check_files(&c.model),
            None => Ok(()),
        };
        let shown = path.display();
        return match (fits(a), fits(b)) {
            (Ok(()), Ok(())) => Ok((per_side(a, &map), per_side(b, &map))),
            (Err(e), _) | (_, Err(e)) if models.len() == 1 => {
                Err(e.context(format!("--names {shown}")))
            }
            (Ok(()), Err(e)) => Err(one_side(&shown.to_string(), "A", "B", &e)),
            (Err(e), Ok(())) => Err(one_side(&shown.to_string(), "B", "A", &e)),
            (Err(e), Err(_)) => {
                Err(e.context(format!("--names {shown}: the map fits neither side")))
            }
        };
    }
    let mut learned = Vec::new();
    for side in [a, b] {
        match side.catalog() {
            Some(c) => {
                let map = map_for(path, c, &mut |line| log::info!("names: {line}"))
                    .map_err(|e| e.context(side.path.display()))?;
                learned.push(apply(side, &map));
            }
            None => learned.push(Vec::new()),
        }
    }
    let b_names = learned.pop().expect("two sides");
    let a_names = learned.pop().expect("two sides");
    Ok((a_names, b_names))
}

/// The refusal of a map that fits one model side only.
fn one_side(path: &str, fit: &str, other: &str, why: &Error) -> Error {
    Error::invalid(format!(
        "--names {path}: the map was learned on {fit}'s files, and a map fits only the files it was learned on ({other}: {}); give --names CHECKPOINT to learn the names of each side",
        why.message()
    ))
}

/// The names `map` gives the tensors of `side` (a model it fits), by tree path.
fn apply(side: &Side, map: &NameMap) -> SideNames {
    let mut by_path: HashMap<&str, (usize, usize)> = HashMap::new();
    for (e, n) in map.names.iter().enumerate() {
        let Status::Matched { targets, .. } = &n.status else {
            continue;
        };
        for (k, t) in targets.iter().enumerate() {
            for p in std::iter::once(&t.stored.path).chain(&t.stored.also) {
                by_path.entry(p.as_str()).or_insert((e, k));
            }
        }
    }
    side.tensors
        .iter()
        .map(|t| {
            let &(e, k) = by_path.get(t.path.as_str())?;
            let n = &map.names[e];
            let Status::Matched { targets, .. } = &n.status else {
                return None;
            };
            let target = &targets[k];
            let map = IndexMap::new(&target.transform, &n.shape, &target.stored.shape)?;
            Some(Named {
                name: n.name.clone(),
                shape: n.shape.clone(),
                transform: target.transform.clone(),
                map,
            })
        })
        .collect()
}
