//! `ptefs diff`'s engine: two models (`.pte` with their data files, or `.ptd`), or a model
//! and a safetensors checkpoint, compared tensor by tensor and program by program
//! (docs/commands.md#diff).
//!
//! The steps: each side lists its tensors (`catalog::tensors`, `side`); tensors are paired
//! in stages (`pair`); each pair's stored bytes are compared directly and, where they
//! differ, its values are dequantized and compared (`measure`); the programs' methods,
//! operators, delegates and layouts are compared (`program`); `report` renders the result
//! as text or JSON.
//!
//! Invariants: each file is read once, in the order of A's bytes, in bounded windows whose
//! memory is given back as the scan moves on (`measure`); nothing is written; the result
//! depends only on the files' contents and names, never on their directories or on timing.

pub mod measure;
pub mod names;
pub mod pair;
pub mod program;
pub mod report;
pub mod side;

use std::path::PathBuf;

use crate::error::{Error, Result};

pub use measure::{Changes, Measured, Metrics};
pub use pair::{How, Pairing};
pub use program::ProgramDiff;
pub use report::Report;
pub use side::{Side, SideKind};

/// What to compare.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub a: PathBuf,
    pub b: PathBuf,
    /// `.ptd` files attached to A and to B (each must then be a `.pte`).
    pub data_a: Vec<PathBuf>,
    pub data_b: Vec<PathBuf>,
    /// `--names MAP|CHECKPOINT`: pair by checkpoint name first (docs/commands.md#names-in-a-diff).
    pub names: Option<PathBuf>,
}

/// One row of the comparison: a pair, or a tensor of one side alone.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The tensor of A and of B (indices into each side's `tensors`).
    pub a: Option<usize>,
    pub b: Option<usize>,
    /// The stage that paired them.
    pub how: Option<How>,
    /// What comparing them found (pairs only).
    pub measured: Option<Measured>,
    /// For a pair by checkpoint name: the name, and each model side's transform
    /// (`stored = T(checkpoint)`).
    pub named: Option<NamedPair>,
}

/// The checkpoint name a pair was made by, and how each model side stores it.
#[derive(Debug, Clone)]
pub struct NamedPair {
    pub name: String,
    pub transform_a: Option<String>,
    pub transform_b: Option<String>,
}

/// Opens both sides and compares them.
pub fn run(req: &Request) -> Result<Report> {
    let a = Side::open(&req.a, &req.data_a)?;
    let b = Side::open(&req.b, &req.data_b)?;
    let (na, nb) = match &req.names {
        Some(path) => names::side_names(path, &a, &b)?,
        None => (Vec::new(), Vec::new()),
    };
    compare_named(a, b, &na, &nb)
}

/// Compares two opened sides.
pub fn compare(a: Side, b: Side) -> Result<Report> {
    compare_named(a, b, &[], &[])
}

/// Compares two opened sides, the tensors of model sides named by `na` and `nb`
/// (`names::side_names`; empty when no names were given).
pub fn compare_named(
    a: Side, b: Side, na: &[Option<names::Named>], nb: &[Option<names::Named>],
) -> Result<Report> {
    let names_a = checkpoint_names(&a, na);
    let names_b = checkpoint_names(&b, nb);
    let pairing = pair::pair(&a.tensors, &b.tensors, &names_a, &names_b);

    // Read in the order of A's bytes, so that each file is scanned once, forward.
    let mut order: Vec<usize> = (0..pairing.pairs.len()).collect();
    order.sort_by_key(|&k| {
        let t = &a.tensors[pairing.pairs[k].0];
        (t.data.file, t.data.range.start())
    });
    let mut measured: Vec<Option<Measured>> = vec![None; pairing.pairs.len()];
    for k in order {
        let (i, j, _) = pairing.pairs[k];
        let (ta, tb) = (&a.tensors[i], &b.tensors[j]);
        let m =
            measure::measure_named(&a, ta, named(na, i), &b, tb, named(nb, j)).map_err(|e| {
                Error::invalid(format!(
                    "comparing {} with {}: {}",
                    ta.path,
                    tb.path,
                    e.message()
                ))
            })?;
        measured[k] = Some(m);
    }
    let program = program::compare(&a, &b)?;
    for side in [&a, &b] {
        if side.poisoned() {
            return Err(Error::invalid(format!(
                "{} changed size while it was read: compare it again",
                side.path.display()
            )));
        }
    }
    let mut entries: Vec<Entry> = pairing
        .pairs
        .iter()
        .zip(measured)
        .map(|(&(i, j, how), m)| Entry {
            a: Some(i),
            b: Some(j),
            how: Some(how),
            measured: m,
            named: (how == How::CheckpointName).then(|| NamedPair {
                name: names_a[i].unwrap_or_default().to_string(),
                transform_a: named(na, i).map(|n| n.transform.to_string()),
                transform_b: named(nb, j).map(|n| n.transform.to_string()),
            }),
        })
        .collect();
    entries.extend(pairing.only_a.iter().map(|&i| Entry {
        a: Some(i),
        b: None,
        how: None,
        measured: None,
        named: None,
    }));
    entries.extend(pairing.only_b.iter().map(|&j| Entry {
        a: None,
        b: Some(j),
        how: None,
        measured: None,
        named: None,
    }));
    Ok(Report {
        a,
        b,
        entries,
        program,
    })
}

/// The name of tensor `i` of a side named by `n`.
fn named(n: &[Option<names::Named>], i: usize) -> Option<&names::Named> {
    n.get(i).and_then(Option::as_ref)
}

/// The checkpoint name of each tensor of a side: a checkpoint's tensors carry their own; a
/// model's get theirs from `--names` (`named`), when it was given.
fn checkpoint_names<'s>(side: &'s Side, named: &'s [Option<names::Named>]) -> Vec<Option<&'s str>> {
    match side.kind {
        SideKind::Checkpoint => side.tensors.iter().map(|t| t.name.as_deref()).collect(),
        SideKind::Pte | SideKind::Ptd => named
            .iter()
            .map(|n| n.as_ref().map(|n| n.name.as_str()))
            .collect(),
    }
}
