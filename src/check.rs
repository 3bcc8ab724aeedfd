//! Deep validation (`ptefs check`): every byte range, index and required field the ExecuTorch
//! runtime relies on (docs/formats.md#what-the-runtime-checks-at-load), and the data the
//! program needs from `.ptd` files (EXTERNAL tensors, named data that delegate payloads read).
//! Each defect is one line naming its place, what was expected and what was found.
//!
//! Invariants: `defects` reads only the files at hand; `data_beside` alone looks at other
//! files (the `.ptd` files in the model's directory), only to name them, never to attach
//! them, and opens them without following links or blocking.

use std::collections::HashSet;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::backend::{Blob, BlobRef, KeyRole};
use crate::catalog::{Decoded, Payloads};
use crate::format::generated::pte_fb;
use crate::format::layout::{DataKind, Location};
use crate::format::{scalar_type, Kind, Model, ModelFile};
use crate::quote;

/// The runtime's limit on tensor rank (`kTensorDimensionLimit`).
const MAX_RANK: usize = 16;

pub fn defects(model: &Model) -> Vec<String> {
    defects_with(model, &Payloads::decode(model))
}

/// `defects`, with the model's payloads decoded already.
pub fn defects_with(model: &Model, payloads: &Payloads) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(layout) = &model.pte_layout {
        out.extend(layout.defects.iter().cloned());
    }
    out.extend(unattached_external(model));
    out.extend(delegate_defects(model, payloads));
    for (i, f) in model.files.iter().enumerate() {
        let name = f.path.display().to_string();
        match &f.kind {
            Kind::Pte(pte) => check_program(&pte.program, &mut out),
            Kind::Ptd(ptd) => {
                let ft = &ptd.flat_tensor;
                if ft.version != 0 {
                    out.push(format!("{name}: FlatTensor.version: expected 0, found {} (the 1.5.1 runtime refuses newer versions)", ft.version));
                }
                if ft.segments.is_none() {
                    out.push(format!("{name}: FlatTensor.segments: expected a vector (possibly empty), found none"));
                }
                if ft.named_data.is_none() {
                    out.push(format!("{name}: FlatTensor.named_data: expected a vector (possibly empty), found none"));
                }
                let mut keys = HashSet::new();
                for blob in model.ptd_blobs[i].iter().flatten() {
                    if !keys.insert(blob.key.as_str()) {
                        out.push(format!(
                            "{name}: named_data key {} appears more than once",
                            quote::name(&blob.key)
                        ));
                    }
                    if let Err(e) = &blob.location {
                        out.push(format!("{name}: {e}"));
                    }
                    if let Some(t) = &blob.tensor {
                        if t.physical_shape().is_none() {
                            out.push(format!(
                                "{name}: named_data {}: tensor_layout dim_order {:?}: expected a permutation of 0..{} (one entry per size of {:?})",
                                quote::name(&blob.key),
                                t.dim_order,
                                t.sizes.len(),
                                t.sizes
                            ));
                        }
                    }
                }
            }
        }
    }
    out
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
fn delegate_defects(model: &Model, payloads: &Payloads) -> Vec<String> {
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
                out.push(format!("{}: the payload does not decode: {e}", place()));
            }
            if let Some(dec) = payloads.get(p, j) {
                blob_defects(model, &place(), &dec.payload.blobs(), &mut out);
            }
        }
    }
    out
}

/// The blobs a decoded payload reads that the files at hand do not hold as it needs: a named
/// key no file has, or bytes of another size than its datatype and dims (or scale count)
/// need.
fn blob_defects(model: &Model, place: &str, blobs: &[Blob], out: &mut Vec<String>) {
    let attached = model.files.len() > 1;
    for b in blobs {
        let what = match b.role {
            KeyRole::Constant => format!("value %{} ({})", b.value, b.describe),
            KeyRole::Scale => format!("value %{} ({}) scales", b.value, b.describe),
        };
        match &b.bytes {
            BlobRef::Named { key, .. } => match model.named_blob(key) {
                None => out.push(format!(
                    "{place}: {what} needs named data {}, which {}",
                    quote::name(key),
                    if attached {
                        "no attached file has"
                    } else {
                        "the program does not have (attach its .ptd with --data)"
                    }
                )),
                Some((_, _, Err(e))) => {
                    out.push(format!("{place}: {what}: {}: {e}", quote::name(key)))
                }
                Some((_, _, Ok(loc))) => {
                    if let Some(want) = b.expected.filter(|&w| w != loc.range.len()) {
                        out.push(format!(
                            "{place}: {what}: named data {} is {} bytes, expected {want}",
                            quote::name(key),
                            loc.range.len()
                        ));
                    }
                }
            },
            BlobRef::Payload { size, .. } => {
                if let Some(want) = b.expected.filter(|w| w != size) {
                    out.push(format!(
                        "{place}: {what}: {size} bytes in the payload, expected {want}"
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
pub fn value_defects(model: &Model, payloads: &Payloads) -> Vec<String> {
    let mut out = Vec::new();
    for (&(p, j), dec) in payloads.iter() {
        for b in dec.payload.blobs() {
            if let Some(why) = refused_bytes(model, dec, &b) {
                let what = format!("value %{} ({}) scales", b.value, b.describe);
                out.push(format!("{}: {what}: {why}", delegate_place(model, p, j)));
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
fn unattached_external(model: &Model) -> Vec<String> {
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
        out.push(format!(
            "plan {p} ({}): {} EXTERNAL tensor(s) ({}{}) need a .ptd data file, and none is attached (the runtime cannot load this method without one)",
            quote::name(plans[p].name.as_deref().unwrap_or("")),
            keys.len(),
            quote::name(keys[0]),
            if keys.len() > 1 { ", …" } else { "" }
        ));
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
pub fn missing_keys(model: &Model) -> Vec<String> {
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
    for (_, dec) in Payloads::decode(model).iter() {
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
    let missing = missing_keys(model);
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
        let Some(file) = open_beside(dir, dir_path, name, owner) else {
            continue;
        };
        if file.identity.is_some_and(|id| attached.contains(&id)) {
            continue;
        }
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
/// others cannot write; opened without following a link and without blocking.
fn open_beside(dir: &File, dir_path: &Path, name: &OsStr, owner: u32) -> Option<ModelFile> {
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
    ModelFile::from_file(dir_path.join(name), file, false).ok()
}

fn check_program(p: &pte_fb::ProgramT, out: &mut Vec<String>) {
    let constants = p.constant_buffer.as_ref().is_some_and(|c| !c.is_empty());
    let offsets = p
        .constant_segment
        .as_ref()
        .and_then(|c| c.offsets.as_ref())
        .is_some_and(|o| !o.is_empty());
    if offsets && constants {
        out.push("Program: both constant_segment.offsets and the deprecated constant_buffer are non-empty (the runtime refuses this)".to_string());
    }
    if !offsets {
        out.push("Program.constant_segment: expected offsets with at least the placeholder [0], found none (the 1.5.1 runtime refuses the deprecated constant_buffer path)".to_string());
    }
    if p.named_data.is_some() && p.segments.is_none() {
        out.push(
            "Program: named_data is present but segments is absent (the runtime refuses this)"
                .to_string(),
        );
    }
    if p.mutable_data_segments
        .as_ref()
        .is_some_and(|m| m.len() > 1)
    {
        out.push(format!(
            "Program.mutable_data_segments: expected at most 1 entry, found {} (the runtime reads only the first)",
            p.mutable_data_segments.as_ref().map_or(0, Vec::len)
        ));
    }
    let plans = p.execution_plan.as_deref().unwrap_or_default();
    if p.execution_plan.is_none() {
        out.push("Program.execution_plan: expected a vector, found none".to_string());
    }
    for (i, plan) in plans.iter().enumerate() {
        check_plan(i, plan, out);
    }
}

fn required<T>(out: &mut Vec<String>, place: &str, field: &str, v: &Option<T>) {
    if v.is_none() {
        out.push(format!(
            "{place}.{field}: required by the runtime, found none"
        ));
    }
}

fn check_index(out: &mut Vec<String>, place: &str, what: &str, index: i64, len: usize) {
    if index < 0 || index as u64 >= len as u64 {
        out.push(format!(
            "{place}: {what} {index} out of range (expected 0..{len})"
        ));
    }
}

fn check_plan(p: usize, plan: &pte_fb::ExecutionPlanT, out: &mut Vec<String>) {
    let place = format!(
        "plan {p} ({})",
        quote::name(plan.name.as_deref().unwrap_or(""))
    );
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
        use pte_fb::KernelTypesT as K;
        match &v.val {
            K::NONE => out.push(format!(
                "{vp}: EValue without a value (only Null may be empty)"
            )),
            K::Tensor(t) => check_tensor(&vp, t, out),
            K::TensorList(l) => {
                for &item in l.items.iter().flatten() {
                    if !is_tensor(item as i64) {
                        out.push(format!("{vp}: TensorList item {item}: expected the index of a Tensor value (0..{n})"));
                    }
                }
            }
            K::OptionalTensorList(l) => {
                for &item in l.items.iter().flatten() {
                    if item != -1 && !is_tensor(item as i64) {
                        out.push(format!("{vp}: OptionalTensorList item {item}: expected -1 or the index of a Tensor value (0..{n})"));
                    }
                }
            }
            _ => {}
        }
    }
    let operators = plan.operators.as_deref().unwrap_or_default();
    for (o, op) in operators.iter().enumerate() {
        if op.name.is_none() {
            out.push(format!(
                "{place} operator {o}: name required by the runtime, found none"
            ));
        }
    }
    let delegates = plan.delegates.as_deref().unwrap_or_default();
    for (d, del) in delegates.iter().enumerate() {
        if del.id.is_none() {
            out.push(format!(
                "{place} delegate {d}: id required by the runtime, found none"
            ));
        }
    }
    let chains = plan.chains.as_deref().unwrap_or_default();
    if chains.is_empty() {
        out.push(format!(
            "{place}.chains: expected at least one chain, found none"
        ));
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
                    out.push(format!("{ip}: no arguments (required by the runtime)"));
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

fn check_tensor(place: &str, t: &pte_fb::TensorT, out: &mut Vec<String>) {
    if scalar_type::element_size(t.scalar_type.0).is_none() {
        out.push(format!(
            "{place}: scalar_type: expected a value in 0..30, found {}",
            t.scalar_type.0
        ));
    }
    if t.storage_offset != 0 {
        out.push(format!(
            "{place}: storage_offset: expected 0, found {}",
            t.storage_offset
        ));
    }
    let Some(sizes) = &t.sizes else {
        out.push(format!(
            "{place}: sizes required by the runtime, found none"
        ));
        return;
    };
    if sizes.len() > MAX_RANK {
        out.push(format!(
            "{place}: rank: expected at most {MAX_RANK}, found {}",
            sizes.len()
        ));
    }
    if let Some(&s) = sizes.iter().find(|&&s| s < 0) {
        out.push(format!(
            "{place}: sizes: expected non-negative sizes, found {s}"
        ));
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
            out.push(format!(
                "{place}: sizes {sizes:?}: the element count or byte size overflows 64 bits (the runtime refuses this)"
            ));
        }
    }
    match &t.dim_order {
        None => out.push(format!(
            "{place}: dim_order required by the runtime, found none"
        )),
        Some(d) if d.len() != sizes.len() => out.push(format!(
            "{place}: dim_order: expected {} entries (one per size), found {}",
            sizes.len(),
            d.len()
        )),
        Some(d) => {
            let mut seen = vec![false; d.len()];
            for &x in d {
                if (x as usize) >= d.len() || std::mem::replace(&mut seen[x as usize], true) {
                    out.push(format!(
                        "{place}: dim_order {d:?}: expected a permutation of 0..{}",
                        d.len()
                    ));
                    break;
                }
            }
        }
    }
    if t.shape_dynamism == pte_fb::TensorShapeDynamism::DYNAMIC_UNBOUND {
        out.push(format!(
            "{place}: shape_dynamism DYNAMIC_UNBOUND is not supported by the runtime"
        ));
    }
}
