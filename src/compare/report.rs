//! The result of a comparison, as a readable summary and as JSON
//! (docs/commands.md#diff, docs/commands.md#diff---json).
//!
//! Invariants: the text is bounded whatever the models hold (at most [`CHANGED_SHOWN`]
//! changed pairs and [`ONLY_SHOWN`] tensors of each side alone are listed, the rest counted);
//! the JSON lists everything; both are deterministic: changed pairs are ordered by the size
//! of their change (NMSE, then differing bytes), ties by A's path; a side alone by its own
//! order. The JSON's fields are documented in docs/commands.md and change only with
//! [`JSON_VERSION`].

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::measure::Metrics;
use super::program::{PayloadCmp, ProgramDiff};
use super::side::Side;
use super::Entry;
use crate::catalog::tensors::Tensor;
use crate::sizes::human;

/// The version of the JSON report's layout.
pub const JSON_VERSION: u64 = 1;
/// Changed pairs listed in the text.
pub const CHANGED_SHOWN: usize = 20;
/// Tensors of each side alone listed in the text.
pub const ONLY_SHOWN: usize = 10;

/// Both sides, every pair and lone tensor, and the program-level comparison.
pub struct Report {
    pub a: Side,
    pub b: Side,
    /// Pairs in A's order, then A's lone tensors, then B's.
    pub entries: Vec<Entry>,
    /// None when a side is a checkpoint (it has no program).
    pub program: Option<ProgramDiff>,
}

/// Counts of the summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub paired: usize,
    pub identical: usize,
    pub changed: usize,
    /// Changed pairs whose dtype, shape, scheme or dimension order changed.
    pub described: usize,
    pub only_a: usize,
    pub only_b: usize,
    /// Bytes compared byte for byte, per side.
    pub bytes_compared: u64,
    pub bytes_differ: u64,
}

impl Report {
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for e in &self.entries {
            match (&e.measured, e.a, e.b) {
                (Some(m), _, _) => {
                    c.paired += 1;
                    c.bytes_compared += m.bytes_compared;
                    c.bytes_differ += m.bytes_differ.unwrap_or(0);
                    if m.identical() {
                        c.identical += 1;
                    } else {
                        c.changed += 1;
                        if m.changes.any() {
                            c.described += 1;
                        }
                    }
                }
                (None, Some(_), None) => c.only_a += 1,
                (None, None, Some(_)) => c.only_b += 1,
                _ => {}
            }
        }
        c
    }

    /// Every tensor paired and identical, and the programs the same: what exit status 0
    /// means.
    pub fn identical(&self) -> bool {
        let c = self.counts();
        c.changed == 0
            && c.only_a == 0
            && c.only_b == 0
            && self.program.as_ref().is_none_or(ProgramDiff::same)
    }

    /// The changed pairs, largest change first.
    fn changed(&self) -> Vec<&Entry> {
        let mut out: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.measured.as_ref().is_some_and(|m| !m.identical()))
            .collect();
        let nmse = |e: &Entry| {
            e.measured
                .as_ref()
                .and_then(|m| m.metrics)
                .and_then(|m| m.nmse)
        };
        let bytes = |e: &Entry| e.measured.as_ref().and_then(|m| m.bytes_differ);
        out.sort_by(|x, y| {
            let by_nmse = match (nmse(x), nmse(y)) {
                (Some(p), Some(q)) => q.total_cmp(&p),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => std::cmp::Ordering::Equal,
            };
            by_nmse
                .then_with(|| bytes(y).cmp(&bytes(x)))
                .then_with(|| self.path_a(x).cmp(self.path_a(y)))
        });
        out
    }

    fn path_a(&self, e: &Entry) -> &str {
        e.a.map_or("", |i| self.a.tensors[i].path.as_str())
    }

    /// The readable summary.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for (tag, side) in [("a", &self.a), ("b", &self.b)] {
            let _ = write!(
                s,
                "{tag}: {} ({}, {})",
                side.path.display(),
                side.kind.as_str(),
                human(side.file_sizes().iter().sum())
            );
            if !side.data.is_empty() {
                let data: Vec<String> = side.data.iter().map(|d| d.display().to_string()).collect();
                let _ = write!(s, " with {}", data.join(", "));
            }
            s.push('\n');
        }
        let changed = self.changed();
        if !changed.is_empty() {
            s.push_str("changed, largest change first:\n");
            for e in changed.iter().take(CHANGED_SHOWN) {
                let (ta, tb) = (self.tensor_a(e), self.tensor_b(e));
                let m = e.measured.as_ref().expect("a pair");
                let mut line = format!("  {}", ta.path);
                if tb.path != ta.path {
                    let _ = write!(line, " ~ {}", tb.path);
                }
                match &e.named {
                    Some(n) => {
                        let _ = write!(line, " (by checkpoint name {}", n.name);
                        for (tag, t) in [("a", &n.transform_a), ("b", &n.transform_b)] {
                            if let Some(t) = t.as_ref().filter(|t| *t != "identity") {
                                let _ = write!(line, ", {tag}: {t}");
                            }
                        }
                        line.push(')');
                    }
                    None => {
                        let _ = write!(line, " ({})", e.how.map_or("", |h| h.describe()));
                    }
                }
                if m.changes.any() {
                    let _ = write!(line, ": {} -> {}", describe(ta), describe(tb));
                } else {
                    let _ = write!(line, ": {}", describe(ta));
                }
                if let Some(d) = m.bytes_differ {
                    let _ = write!(line, "; {d} of {} bytes differ", ta.nbytes());
                }
                match &m.metrics {
                    Some(x) => {
                        let _ = write!(line, "; {}", metrics_text(x));
                    }
                    None => {
                        if let Some(n) = &m.note {
                            let _ = write!(line, "; {n}");
                        }
                    }
                }
                s.push_str(&line);
                s.push('\n');
            }
            if changed.len() > CHANGED_SHOWN {
                let _ = writeln!(
                    s,
                    "  … {} more changed (--json lists every one)",
                    changed.len() - CHANGED_SHOWN
                );
            }
        }
        for (tag, side, alone) in [
            ("a", &self.a, self.alone(true)),
            ("b", &self.b, self.alone(false)),
        ] {
            if alone.is_empty() {
                continue;
            }
            let _ = writeln!(s, "only in {tag}:");
            for &i in alone.iter().take(ONLY_SHOWN) {
                let t = &side.tensors[i];
                let _ = writeln!(s, "  {} {}, {}", t.path, describe(t), human(t.nbytes()));
            }
            if alone.len() > ONLY_SHOWN {
                let _ = writeln!(
                    s,
                    "  … {} more (--json lists every one)",
                    alone.len() - ONLY_SHOWN
                );
            }
        }
        if let Some(p) = &self.program {
            program_text(p, &mut s);
        }
        let c = self.counts();
        let mut by: Vec<(super::How, usize)> = Vec::new();
        for e in &self.entries {
            if let Some(h) = e.how {
                match by.iter_mut().find(|(x, _)| *x == h) {
                    Some((_, n)) => *n += 1,
                    None => by.push((h, 1)),
                }
            }
        }
        by.sort();
        let by: Vec<String> = by
            .iter()
            .map(|(h, n)| format!("{} {n}", h.describe().trim_start_matches("by ")))
            .collect();
        let _ = writeln!(
            s,
            "tensors: {} paired{}, {} identical, {} changed ({} in dtype, shape or scheme), {} only in a, {} only in b; {} compared byte for byte, {} bytes differ",
            c.paired,
            if by.is_empty() {
                String::new()
            } else {
                format!(" (by {})", by.join(", by "))
            },
            c.identical,
            c.changed,
            c.described,
            c.only_a,
            c.only_b,
            human(c.bytes_compared),
            c.bytes_differ
        );
        let verdict = if self.identical() {
            "identical"
        } else {
            "different"
        };
        let _ = writeln!(s, "{verdict}");
        s
    }

    fn tensor_a(&self, e: &Entry) -> &Tensor {
        &self.a.tensors[e.a.expect("a pair")]
    }

    fn tensor_b(&self, e: &Entry) -> &Tensor {
        &self.b.tensors[e.b.expect("a pair")]
    }

    /// Tensors of one side alone, in that side's order.
    fn alone(&self, a: bool) -> Vec<usize> {
        self.entries
            .iter()
            .filter(|e| e.measured.is_none())
            .filter_map(|e| if a { e.a } else { e.b })
            .collect()
    }

    /// The JSON report.
    pub fn json(&self) -> Value {
        let c = self.counts();
        let side = |s: &Side| {
            json!({
                "path": s.path.display().to_string(),
                "kind": s.kind.as_str(),
                "data": s.data.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
                "size": s.file_sizes().iter().sum::<u64>(),
                "tensors": s.tensors.len(),
            })
        };
        let tensors: Vec<Value> = self
            .entries
            .iter()
            .map(|e| {
                let ta = e.a.map(|i| &self.a.tensors[i]);
                let tb = e.b.map(|j| &self.b.tensors[j]);
                let status = match &e.measured {
                    Some(m) if m.identical() => "identical",
                    Some(_) => "changed",
                    None if ta.is_some() => "only_in_a",
                    None => "only_in_b",
                };
                let m = e.measured.as_ref();
                json!({
                    "status": status,
                    "paired_by": e.how.map(|h| h.as_str()),
                    "checkpoint_name": e.named.as_ref().map(|n| &n.name),
                    "transform_a": e.named.as_ref().and_then(|n| n.transform_a.as_ref()),
                    "transform_b": e.named.as_ref().and_then(|n| n.transform_b.as_ref()),
                    "a": ta.map(tensor_json),
                    "b": tb.map(tensor_json),
                    "changes": m.map(|m| m.changes.names()),
                    "bytes_differ": m.and_then(|m| m.bytes_differ),
                    "metrics": m.and_then(|m| m.metrics).map(|x| metrics_json(&x)),
                    "note": m.and_then(|m| m.note.clone()),
                })
            })
            .collect();
        json!({
            "version": JSON_VERSION,
            "identical": self.identical(),
            "a": side(&self.a),
            "b": side(&self.b),
            "summary": {
                "paired": c.paired,
                "identical": c.identical,
                "changed": c.changed,
                "changed_description": c.described,
                "only_in_a": c.only_a,
                "only_in_b": c.only_b,
                "bytes_compared": c.bytes_compared,
                "bytes_differ": c.bytes_differ,
            },
            "tensors": tensors,
            "program": self.program.as_ref().map(program_json),
        })
    }
}

/// `F32[3,4]`, `XNNPACK qbint4[256,64] (groups of 32, bf16 scales)`.
fn describe(t: &Tensor) -> String {
    let mut s = String::new();
    if let Some(b) = t.backend {
        s.push_str(b);
        s.push(' ');
    }
    s.push_str(&t.describe());
    if let Some(d) = &t.dim_order {
        let d: Vec<String> = d.iter().map(u8::to_string).collect();
        let _ = write!(s, " dim_order [{}]", d.join(","));
    }
    if let Some(scheme) = &t.scheme {
        let _ = write!(s, " ({scheme})");
    }
    s
}

/// A number as the text shows it: 6 significant digits, in scientific notation when small
/// or large.
fn num(x: f64) -> String {
    if x == 0.0 || (1e-3..1e5).contains(&x.abs()) {
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{x:.5e}")
    }
}

fn metrics_text(m: &Metrics) -> String {
    let mut s = format!("max abs {}, mean abs {}", num(m.max_abs), num(m.mean_abs));
    match m.cosine {
        Some(c) => {
            let _ = write!(s, ", cosine {c:.6}");
        }
        None => s.push_str(", cosine n/a (all zeros)"),
    }
    match m.nmse {
        Some(n) => {
            let _ = write!(s, ", NMSE {}", num(n));
        }
        None => s.push_str(", NMSE n/a (b is all zeros)"),
    }
    if m.nonfinite > 0 {
        let _ = write!(s, " ({} non-finite elements left out)", m.nonfinite);
    }
    s
}

fn metrics_json(m: &Metrics) -> Value {
    json!({
        "elements": m.elements,
        "nonfinite": m.nonfinite,
        "max_abs": m.max_abs,
        "mean_abs": m.mean_abs,
        "cosine": m.cosine,
        "nmse": m.nmse,
    })
}

fn tensor_json(t: &Tensor) -> Value {
    json!({
        "path": t.path,
        "name": t.name,
        "backend": t.backend,
        "dtype": t.dtype,
        "scheme": t.scheme,
        "shape": t.shape,
        "dim_order": t.dim_order,
        "nbytes": t.nbytes(),
    })
}

fn program_text(p: &ProgramDiff, s: &mut String) {
    let mut lines = Vec::new();
    for plan in &p.plans {
        match (&plan.a, &plan.b) {
            (Some(_), None) => lines.push(format!("plan {}: only in a", plan.name)),
            (None, Some(_)) => lines.push(format!("plan {}: only in b", plan.name)),
            (Some(a), Some(b)) => {
                let mut parts = Vec::new();
                if a.values != b.values {
                    parts.push(format!("values {} -> {}", a.values, b.values));
                }
                if a.instructions != b.instructions {
                    parts.push(format!(
                        "instructions {} -> {}",
                        a.instructions, b.instructions
                    ));
                }
                if !plan.operators_added.is_empty() {
                    parts.push(format!(
                        "operators added: {}",
                        plan.operators_added.join(", ")
                    ));
                }
                if !plan.operators_removed.is_empty() {
                    parts.push(format!(
                        "operators removed: {}",
                        plan.operators_removed.join(", ")
                    ));
                }
                if a.operators != b.operators
                    && plan.operators_added.is_empty()
                    && plan.operators_removed.is_empty()
                {
                    parts.push("operators in another order".to_string());
                }
                if !parts.is_empty() {
                    lines.push(format!("plan {}: {}", plan.name, parts.join("; ")));
                }
                for d in plan.delegates.iter().filter(|d| !d.same()) {
                    let size = |x: &Option<super::program::DelegateFacts>| {
                        x.as_ref().map_or("none".to_string(), |d| {
                            let n = d.payload.map_or("not located".to_string(), |l| {
                                format!("{} B", l.range.len())
                            });
                            format!("{} {n}{}", d.id, if d.inline { " inline" } else { "" })
                        })
                    };
                    let what = match d.payload {
                        PayloadCmp::Bytes(n) if n > 0 => format!("; {n} bytes differ"),
                        _ => String::new(),
                    };
                    lines.push(format!(
                        "plan {} delegate {}: {} -> {}{what}",
                        plan.name,
                        d.index,
                        size(&d.a),
                        size(&d.b)
                    ));
                }
            }
            (None, None) => {}
        }
    }
    for (i, f) in p.files.iter().enumerate().filter(|(_, f)| !f.same()) {
        let which = if i == 0 {
            "file".to_string()
        } else {
            format!("data file {i}")
        };
        match (&f.a, &f.b) {
            (Some(a), Some(b)) => {
                let mut parts = vec![format!("{} -> {} bytes", a.size, b.size)];
                if a.program_size != b.program_size {
                    parts.push(format!(
                        "flatbuffer ends at {} -> {}",
                        a.program_size, b.program_size
                    ));
                }
                if (a.segments, a.segment_bytes) != (b.segments, b.segment_bytes) {
                    parts.push(format!(
                        "segments {} ({} B) -> {} ({} B)",
                        a.segments, a.segment_bytes, b.segments, b.segment_bytes
                    ));
                }
                let align = |x: Option<u64>| x.map_or("-".to_string(), |v| v.to_string());
                if a.segment_alignment != b.segment_alignment {
                    parts.push(format!(
                        "segments at multiples of {} -> {}",
                        align(a.segment_alignment),
                        align(b.segment_alignment)
                    ));
                }
                if a.constant_alignment != b.constant_alignment {
                    parts.push(format!(
                        "constants at multiples of {} -> {}",
                        align(a.constant_alignment),
                        align(b.constant_alignment)
                    ));
                }
                lines.push(format!(
                    "{which} {} -> {}: {}",
                    a.name,
                    b.name,
                    parts.join("; ")
                ));
            }
            (Some(a), None) => lines.push(format!("{which} {}: only in a", a.name)),
            (None, Some(b)) => lines.push(format!("{which} {}: only in b", b.name)),
            (None, None) => {}
        }
    }
    if lines.is_empty() {
        return;
    }
    s.push_str("program:\n");
    for l in lines {
        let _ = writeln!(s, "  {l}");
    }
}

fn program_json(p: &ProgramDiff) -> Value {
    let plan_json = |x: &super::program::PlanFacts| {
        json!({
            "values": x.values,
            "instructions": x.instructions,
            "operators": x.operators,
            "delegates": x.delegates.len(),
        })
    };
    let delegate_json = |d: &super::program::DelegateFacts| {
        json!({
            "id": d.id,
            "inline": d.inline,
            "nbytes": d.payload.map(|l| l.range.len()),
        })
    };
    let file_json = |f: &super::program::FileFacts| {
        json!({
            "name": f.name,
            "size": f.size,
            "program_size": f.program_size,
            "segments": f.segments,
            "segment_bytes": f.segment_bytes,
            "segment_alignment": f.segment_alignment,
            "constant_alignment": f.constant_alignment,
        })
    };
    json!({
        "same": p.same(),
        "plans": p.plans.iter().map(|plan| json!({
            "name": plan.name,
            "same": plan.same(),
            "a": plan.a.as_ref().map(plan_json),
            "b": plan.b.as_ref().map(plan_json),
            "operators_added": plan.operators_added,
            "operators_removed": plan.operators_removed,
            "delegates": plan.delegates.iter().map(|d| json!({
                "index": d.index,
                "same": d.same(),
                "a": d.a.as_ref().map(delegate_json),
                "b": d.b.as_ref().map(delegate_json),
                "payload_bytes_differ": match d.payload {
                    PayloadCmp::Bytes(n) => Some(n),
                    PayloadCmp::NotLocated | PayloadCmp::Unlike => None,
                },
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "files": p.files.iter().map(|f| json!({
            "same": f.same(),
            "a": f.a.as_ref().map(file_json),
            "b": f.b.as_ref().map(file_json),
        })).collect::<Vec<_>>(),
    })
}
