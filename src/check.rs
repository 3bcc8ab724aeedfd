//! Deep validation (`ptefs check`): every byte range, index and required field the ExecuTorch
//! runtime relies on (docs/formats.md#what-the-runtime-checks-at-load), and the data the
//! program needs from `.ptd` files (EXTERNAL tensors, named data that delegate payloads read).
//! Each defect is one line naming its place, what was expected and what was found.
//!
//! Each defect also has a kind, the file it is in and the tree path of the part it is about
//! ([`Defect`]), for `ptefs check --json` (docs/commands.md#check---json).
//!
//! Invariants: `defects` reads only the files at hand; `data_beside` alone looks at other
//! files (the `.ptd` files in the model's directory), only to name them, never to attach
//! them, and opens them without following links or blocking. A defect's kind is one of
//! [`KINDS`], and its path, when given, names a file of the tree (its `.json` when it has
//! one).

use std::collections::HashSet;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::backend::{Blob, BlobRef, KeyRole};
use crate::catalog::{Decoded, Names, Payloads};
use crate::format::generated::pte_fb;
use crate::format::layout::{DataKind, Location};
use crate::format::{scalar_type, Kind, Model, ModelFile};
use crate::quote;

/// The runtime's limit on tensor rank (`kTensorDimensionLimit`).
const MAX_RANK: usize = 16;

/// Every kind of defect, as `check --json` names them (docs/commands.md#check---json).
pub const KINDS: &[&str] = &[
    "unreadable",
    "too_many_nodes",
    "interrupted_commit",
    "tensor_data",
    "delegate_data",
    "named_data",
    "external_unattached",
    "payload",
    "blob_missing",
    "blob_size",
    "data_file",
    "duplicate_key",
    "program_field",
    "plan_field",
    "index",
    "value",
    "tensor_field",
    "shortened_name",
    "stored_value",
];

/// One defect: its kind (one of [`KINDS`]), the file it is in, the tree path of the part it
/// is about, and the line `check` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defect {
    pub kind: &'static str,
    /// The file (its path as opened), when the defect is in one.
    pub file: Option<String>,
    /// The tree path that shows the part (its `.json` when it has one), when one does.
    pub path: Option<String>,
    pub message: String,
}

impl Defect {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Defect {
        debug_assert!(KINDS.contains(&kind), "{kind} is not in KINDS");
        Defect {
            kind,
            file: None,
            path: None,
            message: message.into(),
        }
    }

    /// In file `f` of `model`.
    pub fn in_file(mut self, model: &Model, f: usize) -> Defect {
        self.file = model.files.get(f).map(|f| f.path.display().to_string());
        self
    }

    /// About the part the tree shows at `path`.
    pub fn at(mut self, path: String) -> Defect {
        self.path = Some(path);
        self
    }
}

/// Every defect of the files, one a line.
pub fn defects(model: &Model) -> Vec<String> {
    found(model).into_iter().map(|d| d.message).collect()
}

/// Every defect of the files, with its kind and place.
pub fn found(model: &Model) -> Vec<Defect> {
    found_with(model, &Payloads::decode(model))
}

/// `defects`, with the model's payloads decoded already.
pub fn defects_with(model: &Model, payloads: &Payloads) -> Vec<String> {
    found_with(model, payloads)
        .into_iter()
        .map(|d| d.message)
        .collect()
}

/// The tree paths of the parts defects are about.
struct Places {
    names: Names,
}

impl Places {
    fn plan(&self, p: usize) -> String {
        match self.names.plans.get(p) {
            Some(name) => format!("plans/{name}/plan.json"),
            None => "program.json".to_string(),
        }
    }

    fn value(&self, p: usize, i: usize) -> Option<String> {
        Some(format!(
            "plans/{}/values/{i}.json",
            self.names.plans.get(p)?
        ))
    }

    fn delegate(&self, p: usize, j: usize) -> Option<String> {
        Some(format!(
            "plans/{}/delegates/{j}/delegate.json",
            self.names.plans.get(p)?
        ))
    }

    fn key(&self, f: usize, k: usize) -> Option<String> {
        let name = self.names.named_data.get(f)?.get(k)?;
        let prefix = if f == 0 {
            String::new()
        } else {
            format!("data/{}/", self.names.data.get(f - 1)?)
        };
        Some(format!("{prefix}named_data/{name}.json"))
    }

    fn file(&self, f: usize, table: &str) -> String {
        match f.checked_sub(1).and_then(|d| self.names.data.get(d)) {
            Some(stem) => format!("data/{stem}/{table}"),
            None => table.to_string(),
        }
    }
}

/// `found`, with the model's payloads decoded already.
pub fn found_with(model: &Model, payloads: &Payloads) -> Vec<Defect> {
    let places = Places {
        names: Names::of(model),
    };
    let mut out = Vec::new();
    if let Some(layout) = &model.pte_layout {
        layout_defects(model, layout, &places, &mut out);
    }
    out.extend(unattached_external(model, &places));
    out.extend(delegate_defects(model, payloads, &places));
    for (i, f) in model.files.iter().enumerate() {
        let name = f.path.display().to_string();
        let here = |kind, message: String| Defect::new(kind, message).in_file(model, i);
        match &f.kind {
            Kind::Pte(pte) => {
                let mut found = Vec::new();
                check_program(&pte.program, &places, &mut found);
                out.extend(found.into_iter().map(|d| d.in_file(model, i)));
            }
            Kind::Ptd(ptd) => {
                let table = places.file(i, "flat_tensor.json");
                let ft = &ptd.flat_tensor;
                if ft.version != 0 {
                    out.push(here("data_file", format!("{name}: FlatTensor.version: expected 0, found {} (the 1.5.1 runtime refuses newer versions)", ft.version)).at(table.clone()));
                }
                if ft.segments.is_none() {
                    out.push(here("data_file", format!("{name}: FlatTensor.segments: expected a vector (possibly empty), found none")).at(table.clone()));
                }
                if ft.named_data.is_none() {
                    out.push(here("data_file", format!("{name}: FlatTensor.named_data: expected a vector (possibly empty), found none")).at(table.clone()));
                }
                let mut keys = HashSet::new();
                for (k, blob) in model.ptd_blobs[i].iter().flatten().enumerate() {
                    let at = |d: Defect| match places.key(i, k) {
                        Some(p) => d.at(p),
                        None => d,
                    };
                    if !keys.insert(blob.key.as_str()) {
                        out.push(at(here(
                            "duplicate_key",
                            format!(
                                "{name}: named_data key {} appears more than once",
                                quote::name(&blob.key)
                            ),
                        )));
                    }
                    if let Err(e) = &blob.location {
                        out.push(at(here("named_data", format!("{name}: {e}"))));
                    }
                    if let Some(t) = &blob.tensor {
                        if t.physical_shape().is_none() {
                            out.push(at(here("tensor_field", format!(
                                "{name}: named_data {}: tensor_layout dim_order {:?}: expected a permutation of 0..{} (one entry per size of {:?})",
                                quote::name(&blob.key),
                                t.dim_order,
                                t.sizes.len(),
                                t.sizes
                            ))));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The defects the layout found, each with the part it is about: a value's bytes, a
/// delegate's payload, a named-data entry of the program.
fn layout_defects(
    model: &Model, layout: &crate::format::layout::PteLayout, places: &Places,
    out: &mut Vec<Defect>,
) {
    let with = |d: Defect, path: Option<String>| match path {
        Some(p) => d.at(p),
        None => d,
    };
    for (p, plan) in layout.plans.iter().enumerate() {
        for (i, t) in plan.tensors.iter().enumerate() {
            if let Some(d) = t.as_ref().and_then(|t| t.defect.as_ref()) {
                // An EXTERNAL tensor's bytes are in a data file.
                let file = t.as_ref().and_then(|t| t.key).map_or(0, |(f, _)| f);
                let defect = Defect::new("tensor_data", d.clone()).in_file(model, file);
                out.push(with(defect, places.value(p, i)));
            }
        }
        for (j, d) in plan.delegates.iter().enumerate() {
            if let Err(e) = d {
                let defect = Defect::new("delegate_data", e.to_string()).in_file(model, 0);
                out.push(with(defect, places.delegate(p, j)));
            }
        }
    }
    for (k, l) in layout.named_data.iter().enumerate() {
        if let Err(e) = l {
            let defect = Defect::new("named_data", e.to_string()).in_file(model, 0);
            out.push(with(defect, places.key(0, k)));
        }
    }
}

/// Where delegate `j` of plan `p` is, for messages: `plan 0 ("forward") delegate 1
/// (XnnpackBackend)`.
fn delegate_place(model: &Model, p: usize, j: usize) -> String {
    let plan = model
        .pte()
        .and_then(|pte| pte.program.execution_plan.as_deref()?.get(p));
    let name = plan.and_then(|pl| pl.name.as_deref()).unwrap_or("");
    let id = plan
        .and_then(|pl| pl.delegates.as_deref()?.get(j)?.id.as_deref())
        .unwrap_or("");
    format!("plan {p} ({}) delegate {j} ({id})", quote::name(name))
}

/// Delegate payloads a decoder cannot read, and references from a decoded payload that do
/// not resolve: a named key missing from every file at hand, or bytes whose size disagrees
/// with what the value's datatype and dims (or its scale count) need. The runtime fails to
/// load such a method.
fn delegate_defects(model: &Model, payloads: &Payloads, places: &Places) -> Vec<Defect> {
    let mut out = Vec::new();
    let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
        return out;
    };
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    for (p, plan) in plans.iter().enumerate() {
        for j in 0..plan.delegates.as_ref().map_or(0, Vec::len) {
            if !matches!(
                layout.plans.get(p).and_then(|l| l.delegates.get(j)),
                Some(Ok(_))
            ) {
                continue;
            }
            let place = || delegate_place(model, p, j);
            if let Some(e) = payloads.refusal(p, j) {
                let d = Defect::new(
                    "payload",
                    format!("{}: the payload does not decode: {e}", place()),
                )
                .in_file(model, 0);
                out.push(match places.delegate(p, j) {
                    Some(path) => d.at(path),
                    None => d,
                });
            }
            if let Some(dec) = payloads.get(p, j) {
                let values = places.delegate(p, j).map(|d| {
                    let dir = d.trim_end_matches("delegate.json").to_string();
                    (dir, dec.payload.backend().dir_name())
                });
                let before = out.len();
                blob_defects(model, &place(), &dec.payload.blobs(), &mut out);
                for d in &mut out[before..] {
                    if let (Some((dir, backend)), Some(id)) = (&values, d.path.take()) {
                        d.path = Some(format!("{dir}{backend}/values/{id}.json"));
                    }
                }
            }
        }
    }
    out
}

/// The blobs a decoded payload reads that the files at hand do not hold as it needs: a named
/// key no file has, or bytes of another size than its datatype and dims (or scale count)
/// need. Each defect's path is, for now, the id of the value that reads the blob (the caller makes it
/// a tree path).
fn blob_defects(model: &Model, place: &str, blobs: &[Blob], out: &mut Vec<Defect>) {
    let attached = model.files.len() > 1;
    for b in blobs {
        let what = match b.role {
            KeyRole::Constant => format!("value %{} ({})", b.value, b.describe),
            KeyRole::Scale => format!("value %{} ({}) scales", b.value, b.describe),
        };
        let defect = |kind, message: String, file| {
            Defect::new(kind, message)
                .in_file(model, file)
                .at(b.value.to_string())
        };
        match &b.bytes {
            BlobRef::Named { key, .. } => match model.named_blob(key) {
                None => out.push(defect(
                    "blob_missing",
                    format!(
                        "{place}: {what} needs named data {}, which {}",
                        quote::name(key),
                        if attached {
                            "no attached file has"
                        } else {
                            "the program does not have (attach its .ptd with --data)"
                        }
                    ),
                    0,
                )),
                Some((f, _, Err(e))) => out.push(defect(
                    "blob_size",
                    format!("{place}: {what}: {}: {e}", quote::name(key)),
                    f,
                )),
                Some((f, _, Ok(loc))) => {
                    if let Some(want) = b.expected.filter(|&w| w != loc.range.len()) {
                        out.push(defect(
                            "blob_size",
                            format!(
                                "{place}: {what}: named data {} is {} bytes, expected {want}",
                                quote::name(key),
                                loc.range.len()
                            ),
                            f,
                        ));
                    }
                }
            },
            BlobRef::Payload { size, .. } => {
                if let Some(want) = b.expected.filter(|w| w != size) {
                    out.push(defect(
                        "blob_size",
                        format!("{place}: {what}: {size} bytes in the payload, expected {want}"),
                        0,
                    ));
                }
            }
        }
    }
}

/// Values stored in the blobs of decoded payloads that their backends refuse: scales that are
/// not positive normal floats (XNNPACK), one line per blob naming the value, the scale's
/// index and what it holds. Unlike `defects`, this reads every scale blob's bytes (a tenth
/// of a 4-bit model's), so `ptefs check` asks for it and a mount's warnings do not.
pub fn value_defects(model: &Model, payloads: &Payloads) -> Vec<Defect> {
    let places = Places {
        names: Names::of(model),
    };
    let mut out = Vec::new();
    for (&(p, j), dec) in payloads.iter() {
        for b in dec.payload.blobs() {
            if let Some(why) = refused_bytes(model, dec, &b) {
                let what = format!("value %{} ({}) scales", b.value, b.describe);
                let d = Defect::new(
                    "stored_value",
                    format!("{}: {what}: {why}", delegate_place(model, p, j)),
                )
                .in_file(model, 0);
                out.push(match places.delegate(p, j) {
                    Some(path) => d.at(format!(
                        "{}{}/values/{}.json",
                        path.trim_end_matches("delegate.json"),
                        dec.payload.backend().dir_name(),
                        b.value
                    )),
                    None => d,
                });
            }
        }
    }
    out
}

/// Why the backend refuses what blob `b` of `dec` holds now, when its bytes are at hand.
/// Only the bytes the graph needs are read (a blob may be larger than that).
fn refused_bytes(model: &Model, dec: &Decoded, b: &Blob) -> Option<String> {
    if b.role != KeyRole::Scale {
        return None;
    }
    let at = dec.locate(model, &b.bytes)?;
    let at = Location {
        file: at.file,
        range: at.range.prefix(b.expected?.min(at.range.len())),
    };
    let bytes = model.files[at.file].read_at(&at).ok()?;
    dec.payload.check_blob(b, &bytes).err()
}

/// EXTERNAL tensors of a program mounted without any data file: the runtime cannot load
/// the method. One line per plan (`data_beside` names files that hold the keys).
fn unattached_external(model: &Model, places: &Places) -> Vec<Defect> {
    let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
        return Vec::new();
    };
    if model.files.len() > 1 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    for (p, plan) in layout.plans.iter().enumerate() {
        let keys: Vec<&str> = plan
            .tensors
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let t = t.as_ref()?;
                (t.kind == DataKind::External).then_some(i)
            })
            .filter_map(|i| external_key(&plans[p], i))
            .collect();
        if keys.is_empty() {
            continue;
        }
        out.push(
            Defect::new("external_unattached", format!(
                "plan {p} ({}): {} EXTERNAL tensor(s) ({}{}) need a .ptd data file, and none is attached (the runtime cannot load this method without one)",
                quote::name(plans[p].name.as_deref().unwrap_or("")),
                keys.len(),
                quote::name(keys[0]),
                if keys.len() > 1 { ", …" } else { "" }
            ))
            .in_file(model, 0)
            .at(places.plan(p)),
        );
    }
    out
}

/// The `fully_qualified_name` of value `i` of `plan`, if it is an EXTERNAL tensor.
fn external_key(plan: &pte_fb::ExecutionPlanT, i: usize) -> Option<&str> {
    let pte_fb::KernelTypesT::Tensor(t) = &plan.values.as_deref()?.get(i)?.val else {
        return None;
    };
    t.extra_tensor_info
        .as_ref()?
        .fully_qualified_name
        .as_deref()
}

/// Keys the program reads from data files that no file at hand has: the names of EXTERNAL
/// tensors not found, then the named data decoded delegate payloads read, each once, in
/// program order.
pub fn missing_keys(model: &Model, payloads: &Payloads) -> Vec<String> {
    let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
        return Vec::new();
    };
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut add = |key: &str| {
        if seen.insert(key.to_string()) {
            out.push(key.to_string());
        }
    };
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    for (p, plan) in layout.plans.iter().enumerate() {
        for (i, t) in plan.tensors.iter().enumerate() {
            let unresolved = t
                .as_ref()
                .is_some_and(|t| t.kind == DataKind::External && t.key.is_none());
            let key = plans.get(p).and_then(|plan| external_key(plan, i));
            if let (true, Some(key)) = (unresolved, key) {
                add(key);
            }
        }
    }
    for (_, dec) in payloads.iter() {
        for b in dec.payload.blobs() {
            if let BlobRef::Named { key, .. } = &b.bytes {
                if model.named_blob(key).is_none() {
                    add(key);
                }
            }
        }
    }
    out
}

/// At most this many `.ptd` files beside a model are opened to look for missing keys.
const BESIDE_LOOKED_AT: usize = 16;

/// The `.ptd` files in the model's directory that hold keys the program lacks
/// (`missing_keys`), as advice naming the `--data` options to use; `None` when nothing is
/// missing or no file there has any of it.
///
/// They are only named, never attached: a root daemon must not serve, and commit into,
/// files beside the model that the user did not name. Only regular files of the model's
/// owner that others cannot write are considered (a file planted by another user in a
/// shared directory is not recommended), opened relative to the model's directory without
/// following links and without blocking (a FIFO cannot hang the caller). Files whose name
/// starts with the model's stem (`model.ptd`, `model.lora.ptd`) are looked at first, then
/// the others by name, at most `BESIDE_LOOKED_AT` of them; a file is named when it has a key
/// that the files named before it lack.
pub fn data_beside(model: &Model) -> Option<String> {
    data_beside_with(model, &Payloads::decode(model))
}

/// `data_beside` with the payloads already decoded.
pub fn data_beside_with(model: &Model, payloads: &Payloads) -> Option<String> {
    let missing = missing_keys(model, payloads);
    if missing.is_empty() {
        return None;
    }
    let main = &model.files[0];
    let dir = main.dir.as_ref()?;
    let dir_path = main.path.parent()?;
    let owner = main.file.as_ref()?.metadata().ok()?.uid();
    let prefix = format!("{}.", main.path.file_stem()?.to_string_lossy());
    let attached: HashSet<(u64, u64)> = model.files.iter().filter_map(|f| f.identity).collect();
    let mut names: Vec<OsString> = std::fs::read_dir(dir_path)
        .ok()?
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.as_bytes().ends_with(b".ptd"))
        .collect();
    names.sort_by_key(|n| (!n.as_bytes().starts_with(prefix.as_bytes()), n.clone()));
    let mut remaining: HashSet<&str> = missing.iter().map(String::as_str).collect();
    let mut chosen = Vec::new();
    for name in names.iter().take(BESIDE_LOOKED_AT) {
        if remaining.is_empty() {
            break;
        }
        let Some(file) = open_beside(dir, dir_path, name, owner, &attached) else {
            continue;
        };
        let Kind::Ptd(ptd) = &file.kind else {
            continue;
        };
        let before = remaining.len();
        for key in ptd.flat_tensor.named_data.iter().flatten() {
            if let Some(k) = key.key.as_deref() {
                remaining.remove(k);
            }
        }
        if remaining.len() < before {
            chosen.push(file.path.display().to_string());
        }
    }
    if chosen.is_empty() {
        return None;
    }
    let options: Vec<String> = chosen.iter().map(|p| format!("--data {p}")).collect();
    let (files, verb, them) = match chosen.as_slice() {
        [one] => (one.clone(), "sits", "it"),
        [init @ .., last] => (format!("{} and {last}", init.join(", ")), "sit", "them"),
        [] => unreachable!("checked above"),
    };
    let found = missing.len() - remaining.len();
    let what = if remaining.is_empty() {
        format!("the {found} missing key(s)")
    } else {
        let example = missing
            .iter()
            .find(|k| remaining.contains(k.as_str()))
            .expect("a key remains");
        format!(
            "{found} of the {} missing keys (no .ptd beside it has the other {}, such as {})",
            missing.len(),
            remaining.len(),
            quote::name(example)
        )
    };
    Some(format!(
        "{files} {verb} beside the model and {} {what}: attach {them} with {}",
        if chosen.len() == 1 { "has" } else { "have" },
        options.join(" ")
    ))
}

/// `name` in `dir` (known as `dir_path`), parsed, if it is a regular file of `owner` that
/// others cannot write and not one of the files `attached` (by device and inode; skipped
/// before it is parsed); opened without following a link and without blocking.
fn open_beside(
    dir: &File, dir_path: &Path, name: &OsStr, owner: u32, attached: &HashSet<(u64, u64)>,
) -> Option<ModelFile> {
    let c = CString::new(name.as_bytes()).ok()?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: a valid directory descriptor and C string.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just opened and owned here alone.
    let file = unsafe { File::from_raw_fd(fd) };
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != owner || meta.mode() & 0o002 != 0 {
        return None;
    }
    if attached.contains(&(meta.dev(), meta.ino())) {
        return None;
    }
    ModelFile::from_file(dir_path.join(name), file, false).ok()
}

fn check_program(p: &pte_fb::ProgramT, places: &Places, out: &mut Vec<Defect>) {
    let mut program = |message: String| {
        out.push(Defect::new("program_field", message).at("program.json".to_string()))
    };
    let constants = p.constant_buffer.as_ref().is_some_and(|c| !c.is_empty());
    let offsets = p
        .constant_segment
        .as_ref()
        .and_then(|c| c.offsets.as_ref())
        .is_some_and(|o| !o.is_empty());
    if offsets && constants {
        program("Program: both constant_segment.offsets and the deprecated constant_buffer are non-empty (the runtime refuses this)".to_string());
    }
    if !offsets {
        program("Program.constant_segment: expected offsets with at least the placeholder [0], found none (the 1.5.1 runtime refuses the deprecated constant_buffer path)".to_string());
    }
    if p.named_data.is_some() && p.segments.is_none() {
        program(
            "Program: named_data is present but segments is absent (the runtime refuses this)"
                .to_string(),
        );
    }
    if p.mutable_data_segments
        .as_ref()
        .is_some_and(|m| m.len() > 1)
    {
        program(format!(
            "Program.mutable_data_segments: expected at most 1 entry, found {} (the runtime reads only the first)",
            p.mutable_data_segments.as_ref().map_or(0, Vec::len)
        ));
    }
    let plans = p.execution_plan.as_deref().unwrap_or_default();
    if p.execution_plan.is_none() {
        program("Program.execution_plan: expected a vector, found none".to_string());
    }
    for (i, plan) in plans.iter().enumerate() {
        check_plan(i, plan, places, out);
    }
}

/// Where defects of one part go: their list, and the path and kind they get.
struct Sink<'a> {
    out: &'a mut Vec<Defect>,
    path: &'a str,
}

impl Sink<'_> {
    fn push(&mut self, kind: &'static str, message: String) {
        self.out
            .push(Defect::new(kind, message).at(self.path.to_string()));
    }
}

fn required<T>(out: &mut Sink, place: &str, field: &str, v: &Option<T>) {
    if v.is_none() {
        out.push(
            "plan_field",
            format!("{place}.{field}: required by the runtime, found none"),
        );
    }
}

fn check_index(out: &mut Sink, place: &str, what: &str, index: i64, len: usize) {
    if index < 0 || index as u64 >= len as u64 {
        out.push(
            "index",
            format!("{place}: {what} {index} out of range (expected 0..{len})"),
        );
    }
}

fn check_plan(p: usize, plan: &pte_fb::ExecutionPlanT, places: &Places, all: &mut Vec<Defect>) {
    let place = format!(
        "plan {p} ({})",
        quote::name(plan.name.as_deref().unwrap_or(""))
    );
    let plan_path = places.plan(p);
    let out = &mut Sink {
        out: all,
        path: &plan_path,
    };
    required(out, &place, "name", &plan.name);
    required(out, &place, "values", &plan.values);
    required(out, &place, "inputs", &plan.inputs);
    required(out, &place, "outputs", &plan.outputs);
    required(
        out,
        &place,
        "non_const_buffer_sizes",
        &plan.non_const_buffer_sizes,
    );
    required(out, &place, "delegates", &plan.delegates);
    let values = plan.values.as_deref().unwrap_or_default();
    let n = values.len();
    let is_tensor = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| values.get(i))
            .is_some_and(|v| matches!(v.val, pte_fb::KernelTypesT::Tensor(_)))
    };
    for &i in plan.inputs.iter().flatten() {
        check_index(out, &place, "input value index", i as i64, n);
    }
    for &i in plan.outputs.iter().flatten() {
        check_index(out, &place, "output value index", i as i64, n);
    }
    for (i, v) in values.iter().enumerate() {
        let vp = format!("{place} value {i}");
        let value_path = places.value(p, i).unwrap_or_else(|| plan_path.clone());
        let out = &mut Sink {
            out: &mut *out.out,
            path: &value_path,
        };
        use pte_fb::KernelTypesT as K;
        match &v.val {
            K::NONE => out.push(
                "value",
                format!("{vp}: EValue without a value (only Null may be empty)"),
            ),
            K::Tensor(t) => check_tensor(&vp, t, out),
            K::TensorList(l) => {
                for &item in l.items.iter().flatten() {
                    if !is_tensor(item as i64) {
                        out.push("index", format!("{vp}: TensorList item {item}: expected the index of a Tensor value (0..{n})"));
                    }
                }
            }
            K::OptionalTensorList(l) => {
                for &item in l.items.iter().flatten() {
                    if item != -1 && !is_tensor(item as i64) {
                        out.push("index", format!("{vp}: OptionalTensorList item {item}: expected -1 or the index of a Tensor value (0..{n})"));
                    }
                }
            }
            _ => {}
        }
    }
    let operators = plan.operators.as_deref().unwrap_or_default();
    for (o, op) in operators.iter().enumerate() {
        if op.name.is_none() {
            out.push(
                "plan_field",
                format!("{place} operator {o}: name required by the runtime, found none"),
            );
        }
    }
    let delegates = plan.delegates.as_deref().unwrap_or_default();
    for (d, del) in delegates.iter().enumerate() {
        if del.id.is_none() {
            let path = places.delegate(p, d).unwrap_or_else(|| plan_path.clone());
            Sink {
                out: &mut *out.out,
                path: &path,
            }
            .push(
                "plan_field",
                format!("{place} delegate {d}: id required by the runtime, found none"),
            );
        }
    }
    let chains = plan.chains.as_deref().unwrap_or_default();
    if chains.is_empty() {
        out.push(
            "plan_field",
            format!("{place}.chains: expected at least one chain, found none"),
        );
    }
    for (c, chain) in chains.iter().enumerate() {
        let cp = format!("{place} chain {c}");
        required(out, &cp, "instructions", &chain.instructions);
        let count = chain.instructions.as_ref().map_or(0, Vec::len);
        for (pc, ins) in chain.instructions.iter().flatten().enumerate() {
            let ip = format!("{cp} instruction {pc}");
            use pte_fb::InstructionArgumentsT as A;
            let args: &[i32] = match &ins.instr_args {
                A::NONE => {
                    out.push(
                        "plan_field",
                        format!("{ip}: no arguments (required by the runtime)"),
                    );
                    &[]
                }
                A::KernelCall(k) => {
                    check_index(
                        out,
                        &ip,
                        "operator index",
                        k.op_index as i64,
                        operators.len(),
                    );
                    k.args.as_deref().unwrap_or_default()
                }
                A::DelegateCall(d) => {
                    check_index(
                        out,
                        &ip,
                        "delegate index",
                        d.delegate_index as i64,
                        delegates.len(),
                    );
                    d.args.as_deref().unwrap_or_default()
                }
                A::MoveCall(m) => {
                    check_index(out, &ip, "move source value", m.move_from as i64, n);
                    check_index(out, &ip, "move destination value", m.move_to as i64, n);
                    &[]
                }
                A::JumpFalseCall(j) => {
                    check_index(out, &ip, "condition value", j.cond_value_index as i64, n);
                    check_index(
                        out,
                        &ip,
                        "jump destination",
                        j.destination_instruction as i64,
                        count,
                    );
                    &[]
                }
                A::FreeCall(f) => {
                    check_index(out, &ip, "freed value", f.value_index as i64, n);
                    &[]
                }
            };
            for &a in args {
                check_index(out, &ip, "argument value", a as i64, n);
            }
        }
    }
}

fn check_tensor(place: &str, t: &pte_fb::TensorT, out: &mut Sink) {
    if scalar_type::element_size(t.scalar_type.0).is_none() {
        out.push(
            "tensor_field",
            format!(
                "{place}: scalar_type: expected a value in 0..30, found {}",
                t.scalar_type.0
            ),
        );
    }
    if t.storage_offset != 0 {
        out.push(
            "tensor_field",
            format!(
                "{place}: storage_offset: expected 0, found {}",
                t.storage_offset
            ),
        );
    }
    let Some(sizes) = &t.sizes else {
        out.push(
            "tensor_field",
            format!("{place}: sizes required by the runtime, found none"),
        );
        return;
    };
    if sizes.len() > MAX_RANK {
        out.push(
            "tensor_field",
            format!(
                "{place}: rank: expected at most {MAX_RANK}, found {}",
                sizes.len()
            ),
        );
    }
    if let Some(&s) = sizes.iter().find(|&&s| s < 0) {
        out.push(
            "tensor_field",
            format!("{place}: sizes: expected non-negative sizes, found {s}"),
        );
    } else {
        // The runtime's validate_program refuses an element count or byte size that
        // overflows. Tensors with bytes in a file get this defect from the layout already.
        let numel = sizes
            .iter()
            .try_fold(1i64, |n, &s| n.checked_mul(i64::from(s)));
        let elem = scalar_type::element_size(t.scalar_type.0).unwrap_or(1);
        let overflows = numel.is_none_or(|n| (n as u64).checked_mul(elem).is_none());
        let external = t
            .extra_tensor_info
            .as_ref()
            .is_some_and(|e| e.location == pte_fb::TensorDataLocation::EXTERNAL);
        if overflows && t.data_buffer_idx == 0 && !external {
            out.push("tensor_field", format!(
                "{place}: sizes {sizes:?}: the element count or byte size overflows 64 bits (the runtime refuses this)"
            ));
        }
    }
    match &t.dim_order {
        None => out.push(
            "tensor_field",
            format!("{place}: dim_order required by the runtime, found none"),
        ),
        Some(d) if d.len() != sizes.len() => out.push(
            "tensor_field",
            format!(
                "{place}: dim_order: expected {} entries (one per size), found {}",
                sizes.len(),
                d.len()
            ),
        ),
        Some(d) => {
            let mut seen = vec![false; d.len()];
            for &x in d {
                if (x as usize) >= d.len() || std::mem::replace(&mut seen[x as usize], true) {
                    out.push(
                        "tensor_field",
                        format!(
                            "{place}: dim_order {d:?}: expected a permutation of 0..{}",
                            d.len()
                        ),
                    );
                    break;
                }
            }
        }
    }
    if t.shape_dynamism == pte_fb::TensorShapeDynamism::DYNAMIC_UNBOUND {
        out.push(
            "tensor_field",
            format!("{place}: shape_dynamism DYNAMIC_UNBOUND is not supported by the runtime"),
        );
    }
}
