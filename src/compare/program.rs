//! What differs between two models beyond their tensors: methods, operators, instruction
//! counts, delegates and their payloads, and how each file lays out its segments
//! (docs/commands.md#diff).
//!
//! Invariants: facts are read from the parsed tables and the layout, never from bytes the
//! layout did not locate; plans pair by name (in A's order, then B's own), delegates by
//! index within a plan, files by position (the model file, then each data file); payload
//! bytes are compared in windows like tensor bytes.

use std::collections::BTreeSet;

use crate::format::generated::pte_fb;
use crate::format::layout::Location;
use crate::format::pte::instruction_count;
use crate::format::range::ByteRange;
use crate::format::{Kind, Model};

use super::measure;
use super::side::Side;

/// Largest alignment reported: a multiple of 64 KiB is "aligned to 64 KiB or more".
const ALIGNMENT_CAP: u64 = 1 << 16;

/// A delegate of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegateFacts {
    pub id: String,
    /// Where its payload is, when the layout located it.
    pub payload: Option<Location>,
    /// Whether the payload is in the flatbuffer (`INLINE`) rather than a segment.
    pub inline: bool,
}

/// A plan (method) of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanFacts {
    pub name: String,
    pub values: usize,
    pub instructions: usize,
    /// `name.overload` of each operator, in table order.
    pub operators: Vec<String>,
    pub delegates: Vec<DelegateFacts>,
}

/// How a file lays out its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFacts {
    pub name: String,
    pub size: u64,
    /// Where the flatbuffer (and the headers before it) ends.
    pub program_size: u64,
    pub segments: usize,
    pub segment_bytes: u64,
    /// The largest power of two (at most 64 KiB) that every segment's file offset is a
    /// multiple of; None without segments (or when they all start at 0).
    pub segment_alignment: Option<u64>,
    /// The same for the offsets of the constants inside a `.pte`'s constant segment; None
    /// when none starts past 0.
    pub constant_alignment: Option<u64>,
}

/// The program-level facts of one side (a model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub plans: Vec<PlanFacts>,
    pub files: Vec<FileFacts>,
}

/// The largest power of two, up to the cap, dividing every value that is not 0 (an offset
/// of 0 says nothing about alignment); None when no value is.
fn alignment(values: impl Iterator<Item = u64>) -> Option<u64> {
    values
        .filter(|&v| v != 0)
        .map(|v| v.trailing_zeros().min(ALIGNMENT_CAP.trailing_zeros()))
        .min()
        .map(|bits| 1u64 << bits)
}

impl Facts {
    pub fn of(model: &Model) -> Facts {
        let mut plans = Vec::new();
        if let Some(pte) = model.pte() {
            let layout = model.pte_layout.as_ref();
            for (p, plan) in pte.program.execution_plan.iter().flatten().enumerate() {
                plans.push(plan_facts(plan, |j| {
                    layout
                        .and_then(|l| l.plans.get(p)?.delegates.get(j)?.as_ref().ok())
                        .copied()
                }));
            }
        }
        let files = model
            .files
            .iter()
            .map(|f| {
                let (segments, constants): (&[ByteRange], Vec<u64>) = match &f.kind {
                    Kind::Pte(pte) => {
                        let offsets = pte
                            .program
                            .constant_segment
                            .as_ref()
                            .and_then(|c| c.offsets.as_deref())
                            .unwrap_or_default();
                        // offsets[0] is the placeholder of data_buffer_idx 0.
                        (&pte.segments, offsets.iter().skip(1).copied().collect())
                    }
                    Kind::Ptd(ptd) => (&ptd.segments, Vec::new()),
                };
                FileFacts {
                    name: f.name.to_string_lossy().into_owned(),
                    size: f.len(),
                    program_size: f.program_end(),
                    segments: segments.len(),
                    segment_bytes: segments.iter().map(ByteRange::len).sum(),
                    segment_alignment: alignment(segments.iter().map(ByteRange::start)),
                    constant_alignment: alignment(constants.into_iter()),
                }
            })
            .collect();
        Facts { plans, files }
    }
}

fn plan_facts(
    plan: &pte_fb::ExecutionPlanT, located: impl Fn(usize) -> Option<Location>,
) -> PlanFacts {
    PlanFacts {
        name: plan.name.clone().unwrap_or_default(),
        values: plan.values.as_ref().map_or(0, Vec::len),
        instructions: instruction_count(plan),
        operators: plan
            .operators
            .iter()
            .flatten()
            .map(|o| {
                let name = o.name.as_deref().unwrap_or("");
                match o.overload.as_deref().filter(|s| !s.is_empty()) {
                    Some(ov) => format!("{name}.{ov}"),
                    None => name.to_string(),
                }
            })
            .collect(),
        delegates: plan
            .delegates
            .iter()
            .flatten()
            .enumerate()
            .map(|(j, d)| DelegateFacts {
                id: d.id.clone().unwrap_or_default(),
                payload: located(j),
                inline: d
                    .processed
                    .as_ref()
                    .is_some_and(|r| r.location == pte_fb::DataLocation::INLINE),
            })
            .collect(),
    }
}

/// How two delegates' payloads compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadCmp {
    /// Both located, same size: how many bytes differ (0: identical).
    Bytes(u64),
    /// Neither is located (the layout could not place either payload).
    NotLocated,
    /// Sizes differ, or only one is located.
    Unlike,
}

/// A delegate on either side, by index within its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegateDiff {
    pub index: usize,
    pub a: Option<DelegateFacts>,
    pub b: Option<DelegateFacts>,
    pub payload: PayloadCmp,
}

impl DelegateDiff {
    pub fn same(&self) -> bool {
        match (&self.a, &self.b) {
            (Some(a), Some(b)) => {
                a.id == b.id
                    && a.inline == b.inline
                    && matches!(self.payload, PayloadCmp::Bytes(0) | PayloadCmp::NotLocated)
            }
            _ => false,
        }
    }
}

/// A plan on either side, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanDiff {
    pub name: String,
    pub a: Option<PlanFacts>,
    pub b: Option<PlanFacts>,
    /// Operators B has and A lacks, and the reverse.
    pub operators_added: Vec<String>,
    pub operators_removed: Vec<String>,
    pub delegates: Vec<DelegateDiff>,
}

impl PlanDiff {
    pub fn same(&self) -> bool {
        match (&self.a, &self.b) {
            (Some(a), Some(b)) => {
                a.values == b.values
                    && a.instructions == b.instructions
                    && a.operators == b.operators
                    && self.delegates.iter().all(DelegateDiff::same)
            }
            _ => false,
        }
    }
}

/// A file on either side, by position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDiff {
    pub a: Option<FileFacts>,
    pub b: Option<FileFacts>,
}

impl FileDiff {
    /// Same layout: sizes, segments and alignments (names may differ).
    pub fn same(&self) -> bool {
        match (&self.a, &self.b) {
            (Some(a), Some(b)) => {
                a.size == b.size
                    && a.program_size == b.program_size
                    && a.segments == b.segments
                    && a.segment_bytes == b.segment_bytes
                    && a.segment_alignment == b.segment_alignment
                    && a.constant_alignment == b.constant_alignment
            }
            _ => false,
        }
    }
}

/// Everything program-level that was compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramDiff {
    pub plans: Vec<PlanDiff>,
    pub files: Vec<FileDiff>,
}

impl ProgramDiff {
    pub fn same(&self) -> bool {
        self.plans.iter().all(PlanDiff::same) && self.files.iter().all(FileDiff::same)
    }
}

/// Compares the programs of two model sides; None when either is a checkpoint.
pub fn compare(sa: &Side, sb: &Side) -> crate::error::Result<Option<ProgramDiff>> {
    let (Some(ca), Some(cb)) = (sa.catalog(), sb.catalog()) else {
        return Ok(None);
    };
    let (fa, fb) = (Facts::of(&ca.model), Facts::of(&cb.model));
    let mut plans = Vec::new();
    let mut names: Vec<&str> = fa.plans.iter().map(|p| p.name.as_str()).collect();
    let seen: BTreeSet<&str> = names.iter().copied().collect();
    names.extend(
        fb.plans
            .iter()
            .map(|p| p.name.as_str())
            .filter(|n| !seen.contains(n)),
    );
    for name in names {
        let a = fa.plans.iter().find(|p| p.name == name).cloned();
        let b = fb.plans.iter().find(|p| p.name == name).cloned();
        let ops = |p: &Option<PlanFacts>| -> BTreeSet<String> {
            p.iter().flat_map(|p| p.operators.iter().cloned()).collect()
        };
        let (oa, ob) = (ops(&a), ops(&b));
        let (added, removed) = if a.is_some() && b.is_some() {
            (
                ob.difference(&oa).cloned().collect(),
                oa.difference(&ob).cloned().collect(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let count = |p: &Option<PlanFacts>| p.as_ref().map_or(0, |p| p.delegates.len());
        let mut delegates = Vec::new();
        for j in 0..count(&a).max(count(&b)) {
            let da = a.as_ref().and_then(|p| p.delegates.get(j)).cloned();
            let db = b.as_ref().and_then(|p| p.delegates.get(j)).cloned();
            let payload = match (
                da.as_ref().and_then(|d| d.payload),
                db.as_ref().and_then(|d| d.payload),
            ) {
                (Some(x), Some(y)) if x.range.len() == y.range.len() => {
                    PayloadCmp::Bytes(measure::count_differing(sa, &x, sb, &y)?)
                }
                (None, None) => PayloadCmp::NotLocated,
                _ => PayloadCmp::Unlike,
            };
            delegates.push(DelegateDiff {
                index: j,
                a: da,
                b: db,
                payload,
            });
        }
        plans.push(PlanDiff {
            name: name.to_string(),
            a,
            b,
            operators_added: added,
            operators_removed: removed,
            delegates,
        });
    }
    let files = (0..fa.files.len().max(fb.files.len()))
        .map(|i| FileDiff {
            a: fa.files.get(i).cloned(),
            b: fb.files.get(i).cloned(),
        })
        .collect();
    Ok(Some(ProgramDiff { plans, files }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_dividing_every_offset() {
        assert_eq!(alignment([].into_iter()), None);
        assert_eq!(alignment([0, 0].into_iter()), None);
        assert_eq!(alignment([4096, 8192, 0].into_iter()), Some(4096));
        assert_eq!(alignment([18176, 18304].into_iter()), Some(128));
        assert_eq!(alignment([1 << 20].into_iter()), Some(ALIGNMENT_CAP));
        assert_eq!(alignment([48, 16].into_iter()), Some(16));
    }
}
