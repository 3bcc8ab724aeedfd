//! `ptefs info`: a summary of a model and its data files that fits one screen, even for an
//! LLM with many methods, delegates, segments and weights.
//!
//! Invariants: the output is bounded whatever the files hold: at most [`PLANS_SHOWN`] plans,
//! [`SIGNATURE_SHOWN`] inputs and outputs per plan, [`DATA_FILES_SHOWN`] data files and
//! [`ROWS_SHOWN`] rows per table are written, and what is left out is counted. It is
//! deterministic (tables are sorted by label, everything else is in file order), and it
//! never indexes a table of the file without checking the index, so a malformed file gets a
//! summary, not a panic. Byte counts are of distinct byte ranges: bytes that several tensors
//! or keys share are counted once.
//!
//! `--json` gives the same facts unabridged, as JSON (docs/commands.md#info---json), and
//! `--sizes` where the bytes go (`crate::sizes`). Text and JSON come from the same counts.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io::Write;

use serde_json::{json, Value};

use crate::backend::{self, BACKENDS};
use crate::catalog::Catalog;
use crate::error::Result;
use crate::format::generated::pte_fb;
use crate::format::layout::{DataKind, FileIndex, Location};
use crate::format::ptd::Ptd;
use crate::format::pte::Pte;
use crate::format::range::ByteRange;
use crate::format::{scalar_type, Kind, Model};
use crate::fs::Fs;
use crate::sizes::Sizes;
use crate::tree::render::{io_value, kernel_type_name, signature_dims};

use super::output;

/// Plans described; a multi-method export rarely has more.
pub const PLANS_SHOWN: usize = 16;
/// Inputs, and outputs, described per plan (`plan.json` describes more).
pub const SIGNATURE_SHOWN: usize = 8;
/// Data files described one a line.
pub const DATA_FILES_SHOWN: usize = 16;
/// Rows of a table; the rest are summed into one row.
pub const ROWS_SHOWN: usize = 12;
/// Backend ids named per plan.
const BACKENDS_SHOWN: usize = 4;

pub use crate::sizes::human;

/// Where an item's bytes are, so that bytes several items share count once.
#[derive(PartialEq, Eq, Hash)]
enum Bytes {
    At(Location),
    /// A named-data key no attached file holds: `size` is what its reader records.
    Missing {
        key: String,
        size: u64,
    },
}

/// Counts and distinct bytes by label.
#[derive(Default)]
struct Table {
    rows: BTreeMap<String, (u64, u64)>,
    seen: HashSet<Bytes>,
}

impl Table {
    /// One more item under `label`; its bytes count when no earlier item had the same.
    fn add(&mut self, label: String, bytes: Option<Bytes>) {
        let row = self.rows.entry(label).or_default();
        row.0 += 1;
        if let Some(b) = bytes {
            let len = match &b {
                Bytes::At(l) => l.range.len(),
                Bytes::Missing { size, .. } => *size,
            };
            if self.seen.insert(b) {
                row.1 = row.1.saturating_add(len);
            }
        }
    }

    /// Every row, as `[{"label", "count", "bytes"}]`.
    fn json(&self) -> Value {
        Value::Array(
            self.rows
                .iter()
                .map(|(label, (n, bytes))| json!({ "label": label, "count": n, "bytes": bytes }))
                .collect(),
        )
    }

    fn write(&self, title: &str, s: &mut String) {
        if self.rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "{title}:");
        let width = self
            .rows
            .keys()
            .take(ROWS_SHOWN)
            .map(|k| k.chars().count())
            .max()
            .unwrap_or(0);
        for (label, (n, bytes)) in self.rows.iter().take(ROWS_SHOWN) {
            let _ = writeln!(s, "  {label:<width$} {n:>6}  {}", human(*bytes));
        }
        if self.rows.len() > ROWS_SHOWN {
            let (n, bytes) = self
                .rows
                .values()
                .skip(ROWS_SHOWN)
                .fold((0, 0), |a, r| (a.0 + r.0, a.1 + r.1));
            let _ = writeln!(
                s,
                "  {} more rows: {n} items, {}",
                self.rows.len() - ROWS_SHOWN,
                human(bytes)
            );
        }
    }
}

/// What `ptefs info` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InfoFormat {
    /// Where the bytes go (`--sizes`) instead of the summary.
    pub sizes: bool,
    /// JSON instead of text.
    pub json: bool,
}

/// `ptefs info` of the files of `catalog`, in `format`.
pub fn info_as(catalog: &Catalog, format: InfoFormat, out: &mut dyn Write) -> Result<()> {
    let text = match (format.sizes, format.json) {
        (false, false) => return info_of(catalog, out),
        (false, true) => json_text(&info_json(catalog)),
        (true, json) => {
            let sizes = Sizes::of(catalog)?;
            if json {
                sizes.json_text()
            } else {
                sizes.text()
            }
        }
    };
    out.write_all(text.as_bytes()).map_err(output)
}

fn json_text(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("JSON of plain values");
    s.push('\n');
    s
}

/// A one-screen summary of the files of `fs`.
pub fn info(fs: &Fs, out: &mut dyn Write) -> Result<()> {
    info_of(&fs.tree().catalog, out)
}

/// A one-screen summary of the files of `catalog`: what `info` prints, without building a
/// tree (whose nodes a file of millions of values would make cost far more than the
/// summary).
pub fn info_of(catalog: &Catalog, out: &mut dyn Write) -> Result<()> {
    let model = &catalog.model;
    let mut s = String::new();
    let main = &model.files[0];
    let _ = writeln!(s, "file: {}", main.path.display());
    let _ = writeln!(s, "size: {}", human(main.len()));
    match &main.kind {
        Kind::Pte(pte) => pte_info(catalog, pte, &mut s),
        Kind::Ptd(ptd) => {
            s.push_str("kind: .ptd data file (FT01)\n");
            let h = &ptd.header;
            let _ = writeln!(
                s,
                "header: FH01 length {}, flatbuffer {}+{}, segment_base_offset {}, segment_data_size {}",
                h.length, h.flatbuffer_offset, h.flatbuffer_size, h.segment_base_offset, h.segment_data_size
            );
            let _ = writeln!(s, "named data: {}", ptd_summary(model, 0, ptd));
            named_data_table(catalog, &mut s);
        }
    }
    data_files(catalog, &mut s);
    out.write_all(s.as_bytes()).map_err(output)
}

fn pte_info(catalog: &Catalog, pte: &Pte, s: &mut String) {
    let model = &*catalog.model;
    s.push_str("kind: .pte program (ET12)\n");
    match pte.header.extended {
        Some(e) => {
            let _ = writeln!(
                s,
                "header: eh00 length {}, program_size {}, segment_base_offset {}, segment_data_size {}",
                e.length,
                e.program_size,
                e.segment_base_offset,
                e.segment_data_size.map_or("absent".to_string(), |n| n.to_string())
            );
        }
        None => s.push_str("header: no eh00 extended header (bare flatbuffer)\n"),
    }
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    let _ = writeln!(s, "plans: {}", plans.len());
    for (p, plan) in plans.iter().enumerate().take(PLANS_SHOWN) {
        plan_info(catalog, p, plan, s);
    }
    if plans.len() > PLANS_SHOWN {
        let _ = writeln!(
            s,
            "  … {} more plans (ptefs ls FILE plans)",
            plans.len() - PLANS_SHOWN
        );
    }
    tensor_table(model, s);
    named_data_table(catalog, s);
    for b in BACKENDS {
        payload_table(catalog, *b, s);
    }
    let _ = writeln!(s, "segments: {}", pte_segments(pte));
}

/// Tensors of plan `p`: all, constant, with initial state, external.
fn tensor_kinds(model: &Model, p: usize) -> (u64, u64, u64, u64) {
    let layout = model.pte_layout.as_ref().and_then(|l| l.plans.get(p));
    let (mut n, mut consts, mut muts, mut ext) = (0, 0, 0, 0);
    for t in layout.into_iter().flat_map(|l| l.tensors.iter().flatten()) {
        n += 1;
        match t.kind {
            DataKind::Constant => consts += 1,
            DataKind::Mutable => muts += 1,
            DataKind::External => ext += 1,
            DataKind::None => {}
        }
    }
    (n, consts, muts, ext)
}

/// A method that only returns values the program holds (`get_max_seq_len` of an LLM
/// export): its outputs are all it has to say.
fn is_constant_method(plan: &pte_fb::ExecutionPlanT) -> bool {
    let inputs = plan.inputs.as_deref().unwrap_or_default();
    let outputs = plan.outputs.as_deref().unwrap_or_default();
    crate::format::pte::instruction_count(plan) == 0
        && inputs.is_empty()
        && !outputs.is_empty()
        && outputs
            .iter()
            .all(|&i| !matches!(io_value(plan, i), Ok(pte_fb::KernelTypesT::Tensor(_))))
}

/// Instructions in all chains of `plan`.
fn plan_info(catalog: &Catalog, p: usize, plan: &pte_fb::ExecutionPlanT, s: &mut String) {
    let model = &*catalog.model;
    let name = plan.name.as_deref().unwrap_or("");
    let instructions = crate::format::pte::instruction_count(plan);
    let inputs = plan.inputs.as_deref().unwrap_or_default();
    let outputs = plan.outputs.as_deref().unwrap_or_default();
    let constant = is_constant_method(plan);
    if constant {
        let shown: Vec<String> = outputs
            .iter()
            .take(SIGNATURE_SHOWN)
            .enumerate()
            .map(|(k, &i)| format!("output {k}: {}", io_text(plan, i)))
            .collect();
        let more = outputs.len().saturating_sub(SIGNATURE_SHOWN);
        let _ = writeln!(
            s,
            "  {name}: constant method; {}{}",
            shown.join("; "),
            if more > 0 {
                format!("; … {more} more outputs")
            } else {
                String::new()
            }
        );
        return;
    }
    let (n, consts, muts, ext) = tensor_kinds(model, p);
    let delegates = plan.delegates.as_deref().unwrap_or_default();
    let _ = writeln!(
        s,
        "  {name}: {} values, {n} tensors ({consts} constant, {muts} with initial state, {ext} external), {} operators, {instructions} instructions, {} delegates",
        plan.values.as_ref().map_or(0, Vec::len),
        plan.operators.as_ref().map_or(0, Vec::len),
        delegates.len(),
    );
    for (what, list) in [("input", inputs), ("output", outputs)] {
        for (k, &i) in list.iter().enumerate().take(SIGNATURE_SHOWN) {
            let _ = writeln!(s, "    {what} {k}: {}", io_text(plan, i));
        }
        if list.len() > SIGNATURE_SHOWN {
            let _ = writeln!(
                s,
                "    … {} more {what}s (plan.json describes {})",
                list.len() - SIGNATURE_SHOWN,
                list.len().min(crate::tree::render::SIGNATURE_SHOWN)
            );
        }
    }
    if !delegates.is_empty() {
        let _ = writeln!(
            s,
            "    delegates: {}",
            delegate_summary(catalog, p, delegates)
        );
    }
}

/// An input or output as `info` shows it: `%11 LONG[1,127] dim_order [0,1] DYNAMIC_BOUND`,
/// `%0 Int 128`, `%3 TensorList`.
fn io_text(plan: &pte_fb::ExecutionPlanT, index: i32) -> String {
    use pte_fb::KernelTypesT as K;
    match io_value(plan, index) {
        Err(defect) => format!("%{index} ({defect})"),
        Ok(K::Tensor(t)) => {
            let dtype = scalar_type::display(t.scalar_type.0);
            let dynamism = t
                .shape_dynamism
                .variant_name()
                .map_or_else(|| t.shape_dynamism.0.to_string(), str::to_string);
            match signature_dims(t) {
                Ok((sizes, order)) => {
                    let sizes: Vec<String> = sizes.iter().map(i32::to_string).collect();
                    let order: Vec<String> = order.iter().map(u8::to_string).collect();
                    format!(
                        "%{index} {dtype}[{}] dim_order [{}] {dynamism}",
                        sizes.join(","),
                        order.join(",")
                    )
                }
                Err(defect) => format!("%{index} {dtype} {dynamism} ({defect})"),
            }
        }
        Ok(K::Int(x)) => format!("%{index} Int {}", x.int_val),
        Ok(K::Bool(x)) => format!("%{index} Bool {}", x.bool_val),
        Ok(K::Double(x)) => format!("%{index} Double {}", x.double_val),
        Ok(other) => format!("%{index} {}", kernel_type_name(other)),
    }
}

/// `XnnpackBackend 5 (5 decoded)`: the delegates of plan `p` by backend id.
fn delegate_summary(catalog: &Catalog, p: usize, delegates: &[pte_fb::BackendDelegateT]) -> String {
    let mut by_id: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (j, d) in delegates.iter().enumerate() {
        let e = by_id.entry(d.id.as_deref().unwrap_or("")).or_default();
        e.0 += 1;
        if catalog.payloads.get(p, j).is_some() {
            e.1 += 1;
        }
    }
    let mut parts: Vec<String> = by_id
        .iter()
        .take(BACKENDS_SHOWN)
        .map(|(id, (n, decoded))| {
            if backend::backend(id).is_some() {
                format!("{id} {n} ({decoded} decoded)")
            } else {
                format!("{id} {n}")
            }
        })
        .collect();
    if by_id.len() > BACKENDS_SHOWN {
        parts.push(format!("{} more backends", by_id.len() - BACKENDS_SHOWN));
    }
    parts.join(", ")
}

/// Tensors whose bytes are in the files, by dtype and where the bytes are; and the EXTERNAL
/// tensors that no attached file holds, with the bytes they need.
fn tensor_counts(model: &Model) -> Option<(Table, u64, u64)> {
    let layout = model.pte_layout.as_ref()?;
    let mut table = Table::default();
    let (mut missing, mut missing_bytes) = (0u64, 0u64);
    for t in layout.plans.iter().flat_map(|p| p.tensors.iter().flatten()) {
        let kind = match t.kind {
            DataKind::Constant => "constant",
            DataKind::Mutable => "initial state",
            DataKind::External => "external",
            DataKind::None => continue,
        };
        match t.location {
            Some(l) => table.add(
                format!("{} {kind}", scalar_type::display(t.shape.scalar_type)),
                Some(Bytes::At(l)),
            ),
            None if t.kind == DataKind::External => {
                missing += 1;
                missing_bytes = missing_bytes.saturating_add(t.nbytes.unwrap_or(0));
            }
            None => {}
        }
    }
    Some((table, missing, missing_bytes))
}

/// Tensors whose bytes are in the files, by dtype and where the bytes are; EXTERNAL tensors
/// that no attached file holds are counted apart.
fn tensor_table(model: &Model, s: &mut String) {
    let Some((table, missing, missing_bytes)) = tensor_counts(model) else {
        return;
    };
    table.write("tensor bytes by dtype (tensors, distinct bytes)", s);
    if missing > 0 {
        let _ = writeln!(
            s,
            "external tensors in no attached data file: {missing} ({} needed; attach the .ptd with --data)",
            human(missing_bytes)
        );
    }
}

/// What one named-data entry holds: its tensor layout's dtype, else what the decoded XNNPACK
/// payloads read it as, else `(blob)`.
fn named_label(
    catalog: &Catalog, file: FileIndex, k: usize, key: &str, layout: Option<i8>,
) -> String {
    if let Some(st) = layout {
        return scalar_type::display(st);
    }
    // A key found first in another file is read there: its uses are not this entry's.
    let read_here = catalog
        .model
        .named_blob(key)
        .is_some_and(|(f, i, _)| (f, i) == (file, k));
    match catalog.payloads.uses_of(key).first() {
        Some(u) if read_here => u.describe(),
        _ => "(blob)".to_string(),
    }
}

/// Named data of every file (the program's and each data file's), by what it holds.
fn named_data_counts(catalog: &Catalog) -> Table {
    let model = &*catalog.model;
    let mut table = Table::default();
    for (f, file) in model.files.iter().enumerate() {
        match &file.kind {
            Kind::Pte(pte) => {
                let Some(layout) = &model.pte_layout else {
                    continue;
                };
                let entries = pte.program.named_data.as_deref().unwrap_or_default();
                for (k, (nd, loc)) in entries.iter().zip(&layout.named_data).enumerate() {
                    let key = nd.key.as_deref().unwrap_or("");
                    let at = loc.as_ref().ok().map(|l| Bytes::At(*l));
                    table.add(named_label(catalog, f, k, key, None), at);
                }
            }
            Kind::Ptd(_) => {
                for (k, b) in model.ptd_blobs[f].iter().flatten().enumerate() {
                    let layout = b.tensor.as_ref().map(|t| t.scalar_type);
                    let at = b.location.as_ref().ok().map(|l| Bytes::At(*l));
                    table.add(named_label(catalog, f, k, &b.key, layout), at);
                }
            }
        }
    }
    table
}

fn named_data_table(catalog: &Catalog, s: &mut String) {
    let title = if catalog.model.files.len() > 1 {
        "named data by dtype (keys, distinct bytes), in the program and its data files"
    } else {
        "named data by dtype (keys, distinct bytes)"
    };
    named_data_counts(catalog).write(title, s);
}

/// The constants of the decoded payloads of one backend, by datatype.
struct PayloadCounts {
    table: Table,
    /// Delegates of this backend, and how many decoded.
    payloads: usize,
    decoded: usize,
    /// Constants whose bytes no attached file holds.
    unresolved: u64,
}

/// The constants of every decoded payload of `backend` by datatype, and their scale blobs;
/// None when no delegate is of this backend.
fn payload_counts(catalog: &Catalog, backend: &dyn backend::Backend) -> Option<PayloadCounts> {
    let model = &*catalog.model;
    let payloads = model
        .pte()
        .and_then(|p| p.program.execution_plan.as_deref())
        .unwrap_or_default()
        .iter()
        .flat_map(|p| p.delegates.iter().flatten())
        .filter(|d| d.id.as_deref() == Some(backend.id()))
        .count();
    if payloads == 0 {
        return None;
    }
    let mut out = PayloadCounts {
        table: Table::default(),
        payloads,
        decoded: 0,
        unresolved: 0,
    };
    let ours = catalog
        .payloads
        .iter()
        .filter(|(_, d)| d.payload.backend().id() == backend.id());
    for (_, dec) in ours {
        out.decoded += 1;
        // A key no attached file holds is listed apart, with the size the graph records.
        for (blob, at) in dec.placed_blobs(model) {
            if blob.inline {
                continue;
            }
            match at {
                Ok(l) => out.table.add(blob.label, Some(Bytes::At(l))),
                Err(missing) => {
                    out.unresolved += 1;
                    let bytes = missing.map(|(key, size)| Bytes::Missing { key, size });
                    out.table
                        .add(format!("{}, in no attached file", blob.label), bytes);
                }
            }
        }
    }
    Some(out)
}

/// The constants of every decoded payload of `backend` by datatype, and their scale blobs.
fn payload_table(catalog: &Catalog, backend: &dyn backend::Backend, s: &mut String) {
    let Some(c) = payload_counts(catalog, backend) else {
        return;
    };
    let name = backend.display_name();
    c.table.write(
        &format!(
            "{name} constants by datatype (values, distinct bytes), {} of {} payloads decoded",
            c.decoded, c.payloads
        ),
        s,
    );
    if c.decoded < c.payloads {
        let _ = writeln!(
            s,
            "{name} payloads that do not decode: {} (ptefs check says why)",
            c.payloads - c.decoded
        );
    }
    if c.unresolved > 0 {
        let _ = writeln!(
            s,
            "{name} constants whose bytes no attached file holds: {} (attach the .ptd with --data)",
            c.unresolved
        );
    }
}

/// The segments of a program by what the program keeps in them: (segments, bytes) by role.
fn segment_roles(pte: &Pte) -> BTreeMap<&'static str, (u64, u64)> {
    let program = &pte.program;
    let mut role: Vec<Option<&'static str>> = vec![None; pte.segments.len()];
    let mut mark = |index: i64, what: &'static str| {
        if let Some(r) = usize::try_from(index).ok().and_then(|i| role.get_mut(i)) {
            r.get_or_insert(what);
        }
    };
    if let Some(c) = &program.constant_segment {
        mark(i64::from(c.segment_index), "constants");
    }
    for m in program.mutable_data_segments.iter().flatten() {
        mark(i64::from(m.segment_index), "initial states");
    }
    for d in program
        .execution_plan
        .iter()
        .flatten()
        .flat_map(|p| p.delegates.iter().flatten())
    {
        if let Some(r) = d
            .processed
            .as_ref()
            .filter(|r| r.location == pte_fb::DataLocation::SEGMENT)
        {
            mark(i64::from(r.index), "delegate payloads");
        }
    }
    for nd in program.named_data.iter().flatten() {
        mark(i64::from(nd.segment_index), "named data");
    }
    let mut by_role: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (r, range) in role.iter().zip(&pte.segments) {
        let e = by_role.entry(r.unwrap_or("unreferenced")).or_default();
        e.0 += 1;
        e.1 += range.len();
    }
    by_role
}

/// `6, 6.5 KiB (6656 B): constants 1, 4 B; delegate payloads 5, 6.5 KiB (6652 B)`: the
/// segments of a program by what the program keeps in them.
fn pte_segments(pte: &Pte) -> String {
    let by_role = segment_roles(pte);
    let parts: Vec<String> = by_role
        .iter()
        .map(|(what, (n, bytes))| format!("{what} {n}, {}", human(*bytes)))
        .collect();
    let total: u64 = pte.segments.iter().map(ByteRange::len).sum();
    if parts.is_empty() {
        "0".to_string()
    } else {
        format!(
            "{}, {}: {}",
            pte.segments.len(),
            human(total),
            parts.join("; ")
        )
    }
}

/// What a `.ptd` holds: keys, of which tensors, their distinct bytes, segments.
struct PtdCounts {
    keys: usize,
    tensors: usize,
    bytes: u64,
    segments: usize,
}

fn ptd_counts(model: &Model, file: FileIndex, ptd: &Ptd) -> PtdCounts {
    let blobs = model.ptd_blobs[file].as_deref().unwrap_or_default();
    let mut seen = HashSet::new();
    PtdCounts {
        keys: blobs.len(),
        tensors: blobs.iter().filter(|b| b.tensor.is_some()).count(),
        bytes: blobs
            .iter()
            .filter_map(|b| b.location.as_ref().ok())
            .filter(|l| seen.insert(**l))
            .map(|l| l.range.len())
            .sum(),
        segments: ptd.segments.len(),
    }
}

impl PtdCounts {
    fn json(&self) -> Value {
        json!({
            "keys": self.keys,
            "tensors": self.tensors,
            "blobs": self.keys - self.tensors,
            "bytes": self.bytes,
            "segments": self.segments,
        })
    }
}

/// `22 keys (6 tensors, 16 blobs) holding 108.8 KiB (111360 B), in 22 segments`.
fn ptd_summary(model: &Model, file: FileIndex, ptd: &Ptd) -> String {
    let c = ptd_counts(model, file, ptd);
    format!(
        "{} keys ({} tensors, {} blobs) holding {}, in {} segments",
        c.keys,
        c.tensors,
        c.keys - c.tensors,
        human(c.bytes),
        c.segments
    )
}

/// One line per attached data file: its name, where the catalog shows it, its size and what it
/// holds.
fn data_files(catalog: &Catalog, s: &mut String) {
    let model = &*catalog.model;
    let data = &model.files[1..];
    if data.is_empty() {
        return;
    }
    let _ = writeln!(s, "data files: {}", data.len());
    for (f, file) in data.iter().enumerate().take(DATA_FILES_SHOWN) {
        let f = f + 1;
        let holds = match &file.kind {
            Kind::Ptd(ptd) => ptd_summary(model, f, ptd),
            Kind::Pte(_) => "a program, not a data file".to_string(),
        };
        let _ = writeln!(
            s,
            "  {} ({}): {}, {holds}",
            crate::catalog::payloads::file_name(model, f),
            catalog.names.file_prefix(f),
            human(file.len()),
        );
    }
    if data.len() > DATA_FILES_SHOWN {
        let _ = writeln!(s, "  … {} more data files", data.len() - DATA_FILES_SHOWN);
    }
}

/// The version of `info --json`'s layout.
pub const JSON_VERSION: u64 = 1;

/// `ptefs info --json`: the facts of the summary, unabridged (docs/commands.md#info---json).
pub fn info_json(catalog: &Catalog) -> Value {
    let model = &*catalog.model;
    let main = &model.files[0];
    let mut out = serde_json::Map::new();
    out.insert("version".into(), json!(JSON_VERSION));
    out.insert("path".into(), json!(main.path.display().to_string()));
    out.insert("size".into(), json!(main.len()));
    match &main.kind {
        Kind::Pte(pte) => {
            out.insert("kind".into(), json!("pte"));
            out.insert(
                "header".into(),
                match pte.header.extended {
                    Some(e) => json!({
                        "extended": true,
                        "length": e.length,
                        "program_size": e.program_size,
                        "segment_base_offset": e.segment_base_offset,
                        "segment_data_size": e.segment_data_size,
                    }),
                    None => json!({ "extended": false }),
                },
            );
            let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
            let plans: Vec<Value> = plans
                .iter()
                .enumerate()
                .map(|(p, plan)| plan_json(catalog, p, plan))
                .collect();
            out.insert("plans".into(), Value::Array(plans));
            let (table, missing, missing_bytes) =
                tensor_counts(model).unwrap_or((Table::default(), 0, 0));
            out.insert("tensor_bytes".into(), table.json());
            out.insert(
                "external_missing".into(),
                json!({ "tensors": missing, "bytes": missing_bytes }),
            );
            out.insert("named_data".into(), named_data_counts(catalog).json());
            let backends: Vec<Value> = BACKENDS
                .iter()
                .filter_map(|b| {
                    let c = payload_counts(catalog, *b)?;
                    Some(json!({
                        "backend": b.display_name(),
                        "id": b.id(),
                        "payloads": c.payloads,
                        "decoded": c.decoded,
                        "constants": c.table.json(),
                        "unresolved": c.unresolved,
                    }))
                })
                .collect();
            out.insert("backends".into(), Value::Array(backends));
            let roles: Vec<Value> = segment_roles(pte)
                .iter()
                .map(|(role, (n, bytes))| json!({ "role": role, "segments": n, "bytes": bytes }))
                .collect();
            out.insert(
                "segments".into(),
                json!({
                    "count": pte.segments.len(),
                    "bytes": pte.segments.iter().map(ByteRange::len).sum::<u64>(),
                    "by_role": roles,
                }),
            );
        }
        Kind::Ptd(ptd) => {
            out.insert("kind".into(), json!("ptd"));
            let h = &ptd.header;
            out.insert(
                "header".into(),
                json!({
                    "length": h.length,
                    "flatbuffer_offset": h.flatbuffer_offset,
                    "flatbuffer_size": h.flatbuffer_size,
                    "segment_base_offset": h.segment_base_offset,
                    "segment_data_size": h.segment_data_size,
                }),
            );
            out.insert("holds".into(), ptd_counts(model, 0, ptd).json());
            out.insert("named_data".into(), named_data_counts(catalog).json());
        }
    }
    let data: Vec<Value> = model.files[1..]
        .iter()
        .enumerate()
        .map(|(f, file)| {
            let f = f + 1;
            json!({
                "path": file.path.display().to_string(),
                "tree": catalog.names.file_prefix(f),
                "size": file.len(),
                "holds": match &file.kind {
                    Kind::Ptd(ptd) => ptd_counts(model, f, ptd).json(),
                    Kind::Pte(_) => Value::Null,
                },
            })
        })
        .collect();
    out.insert("data_files".into(), Value::Array(data));
    Value::Object(out)
}

/// One plan of `info --json`.
fn plan_json(catalog: &Catalog, p: usize, plan: &pte_fb::ExecutionPlanT) -> Value {
    let model = &*catalog.model;
    let (n, consts, muts, ext) = tensor_kinds(model, p);
    let mut by_id: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (j, d) in plan.delegates.iter().flatten().enumerate() {
        let e = by_id.entry(d.id.as_deref().unwrap_or("")).or_default();
        e.0 += 1;
        if catalog.payloads.get(p, j).is_some() {
            e.1 += 1;
        }
    }
    let io = |list: &Option<Vec<i32>>| -> Vec<Value> {
        list.iter().flatten().map(|&i| io_json(plan, i)).collect()
    };
    json!({
        "name": plan.name.as_deref().unwrap_or(""),
        "constant_method": is_constant_method(plan),
        "values": plan.values.as_ref().map_or(0, Vec::len),
        "tensors": n,
        "constant_tensors": consts,
        "initial_state_tensors": muts,
        "external_tensors": ext,
        "operators": plan.operators.as_ref().map_or(0, Vec::len),
        "instructions": crate::format::pte::instruction_count(plan),
        "delegates": by_id.iter().map(|(id, (count, decoded))| json!({
            "id": id,
            "count": count,
            "decoded": backend::backend(id).map(|_| decoded),
        })).collect::<Vec<_>>(),
        "inputs": io(&plan.inputs),
        "outputs": io(&plan.outputs),
    })
}

/// An input or output of `info --json`: its value index and type, and for a tensor its
/// dtype, sizes, dim order and dynamism, for a scalar its value.
fn io_json(plan: &pte_fb::ExecutionPlanT, index: i32) -> Value {
    use pte_fb::KernelTypesT as K;
    match io_value(plan, index) {
        Err(defect) => json!({ "index": index, "defect": defect }),
        Ok(K::Tensor(t)) => json!({
            "index": index,
            "type": "Tensor",
            "dtype": scalar_type::display(t.scalar_type.0),
            "sizes": t.sizes.as_deref().unwrap_or_default(),
            "dim_order": t.dim_order.as_deref().unwrap_or_default(),
            "dynamism": t.shape_dynamism.variant_name().map_or_else(|| json!(t.shape_dynamism.0), |n| json!(n)),
        }),
        Ok(K::Int(x)) => json!({ "index": index, "type": "Int", "value": x.int_val }),
        Ok(K::Bool(x)) => json!({ "index": index, "type": "Bool", "value": x.bool_val }),
        Ok(K::Double(x)) => json!({ "index": index, "type": "Double", "value": x.double_val }),
        Ok(other) => json!({ "index": index, "type": kernel_type_name(other) }),
    }
}
