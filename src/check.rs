//! Deep validation (`ptefs check`): every byte range, index and required field the ExecuTorch
//! runtime relies on (FORMAT.md §6, §9.4). Each defect is one line naming its place, what was
//! expected and what was found.

use std::collections::HashSet;
use std::path::PathBuf;

use crate::backend::{self, xnnpack, BackendView, NotDecoded};
use crate::format::generated::pte_fb;
use crate::format::layout::DataKind;
use crate::format::{scalar_type, Kind, Model, ModelFile};

/// The runtime's limit on tensor rank (`kTensorDimensionLimit`).
const MAX_RANK: usize = 16;

pub fn defects(model: &Model) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(layout) = &model.pte_layout {
        out.extend(layout.defects.iter().cloned());
    }
    out.extend(unattached_external(model));
    out.extend(delegate_defects(model));
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
                            "{name}: named_data key \"{}\" appears more than once",
                            blob.key
                        ));
                    }
                    if let Err(e) = &blob.location {
                        out.push(format!("{name}: {e}"));
                    }
                    if let Some(t) = &blob.tensor {
                        if t.physical_shape().is_none() {
                            out.push(format!(
                                "{name}: named_data \"{}\": tensor_layout dim_order {:?}: expected a permutation of 0..{} (one entry per size of {:?})",
                                blob.key,
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

/// Delegate payloads a decoder cannot read, and references from a decoded payload that do
/// not resolve: a named key missing from every file at hand, or bytes whose size disagrees
/// with the value's datatype and dims. The runtime fails to load such a method.
fn delegate_defects(model: &Model) -> Vec<String> {
    let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    for (p, plan) in plans.iter().enumerate() {
        let name = plan.name.as_deref().unwrap_or("");
        for (j, d) in plan.delegates.iter().flatten().enumerate() {
            let Some(Ok(loc)) = layout.plans.get(p).and_then(|l| l.delegates.get(j)) else {
                continue;
            };
            let id = d.id.as_deref().unwrap_or("");
            let place = format!("plan {p} (\"{name}\") delegate {j} ({id})");
            let payload = &model.files[loc.file].bytes()[loc.range.as_usize()];
            match backend::decode_payload(id, payload) {
                Err(NotDecoded::NoDecoder) => {}
                Err(NotDecoded::Invalid(e)) => {
                    out.push(format!("{place}: the payload does not decode: {e}"))
                }
                Ok(BackendView::Xnnpack(graph)) => {
                    xnnpack_references(model, &place, &graph, &mut out)
                }
            }
        }
    }
    out
}

fn xnnpack_references(
    model: &Model, place: &str, graph: &xnnpack::XnnGraph, out: &mut Vec<String>,
) {
    let attached = model.files.len() > 1;
    let check_key = |out: &mut Vec<String>, what: String, key: &str, want: Option<u64>| match model
        .named_blob(key)
    {
        None => out.push(format!(
            "{place}: {what} needs named data \"{key}\", which {}",
            if attached {
                "no attached file has"
            } else {
                "the program does not have (attach its .ptd with --data)"
            }
        )),
        Some((_, _, Err(e))) => out.push(format!("{place}: {what}: \"{key}\": {e}")),
        Some((_, _, Ok(loc))) => {
            if let Some(want) = want.filter(|&w| w != loc.range.len()) {
                out.push(format!(
                    "{place}: {what}: named data \"{key}\" is {} bytes, expected {want}",
                    loc.range.len()
                ));
            }
        }
    };
    for v in graph.constants() {
        let what = format!("value %{} ({})", v.id, v.describe());
        let want = v.expected_nbytes().ok();
        match &v.constant {
            Some(xnnpack::ConstantRef::Named { key, .. }) => {
                check_key(out, what.clone(), key, want)
            }
            Some(xnnpack::ConstantRef::Payload { size, .. }) => {
                if let Some(want) = want.filter(|w| w != size) {
                    out.push(format!(
                        "{place}: {what}: {size} bytes in the payload, expected {want}"
                    ));
                }
            }
            None => {}
        }
        let scales = v.quant.as_ref().and_then(|q| q.scale_ref());
        if let Some(xnnpack::ScaleRef {
            bytes: xnnpack::ConstantRef::Named { key, .. },
            dtype,
            count,
            ..
        }) = scales
        {
            check_key(
                out,
                format!("{what} scales"),
                &key,
                Some(count * dtype.size()),
            );
        }
    }
}

/// EXTERNAL tensors of a program mounted without any data file: the runtime cannot load
/// the method. One line per plan, naming a `.ptd` beside the model that holds the keys.
fn unattached_external(model: &Model) -> Vec<String> {
    let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
        return Vec::new();
    };
    if model.files.len() > 1 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
    let mut all_keys = Vec::new();
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
            "plan {p} (\"{}\"): {} EXTERNAL tensor(s) (\"{}\"{}) need a .ptd data file, and none is attached (the runtime cannot load this method without one)",
            plans[p].name.as_deref().unwrap_or(""),
            keys.len(),
            keys[0],
            if keys.len() > 1 { ", …" } else { "" }
        ));
        all_keys.extend(keys);
    }
    if all_keys.is_empty() {
        return out;
    }
    if let Some(found) = data_file_beside(model, &all_keys) {
        out.push(format!(
            "{} sits beside the model and holds these keys: attach it with --data {}",
            found.display(),
            found.display()
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

/// A `.ptd` in the model's directory that has every key of `keys` (a few are looked at).
fn data_file_beside(model: &Model, keys: &[&str]) -> Option<PathBuf> {
    const LOOKED_AT: usize = 16;
    let dir = model.files[0].path.parent()?;
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "ptd"))
        .collect();
    candidates.sort();
    candidates.into_iter().take(LOOKED_AT).find(|p| {
        let Ok(f) = ModelFile::open(p) else {
            return false;
        };
        let Kind::Ptd(ptd) = &f.kind else {
            return false;
        };
        let have: HashSet<&str> = ptd
            .flat_tensor
            .named_data
            .iter()
            .flatten()
            .filter_map(|n| n.key.as_deref())
            .collect();
        keys.iter().all(|k| have.contains(k))
    })
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
    let place = format!("plan {p} (\"{}\")", plan.name.as_deref().unwrap_or(""));
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
