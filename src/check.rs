//! Deep validation (`ptefs check`): every byte range, index and required field the ExecuTorch
//! runtime relies on (FORMAT.md §6, §9.4). Each defect is one line naming its place, what was
//! expected and what was found.

use std::collections::HashSet;

use crate::format::generated::pte_fb;
use crate::format::{scalar_type, Kind, Model};
use crate::tree::names::{Names, Part, NAME_MAX};

/// The runtime's limit on tensor rank (`kTensorDimensionLimit`).
const MAX_RANK: usize = 16;

pub fn defects(model: &Model) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(layout) = &model.pte_layout {
        out.extend(layout.defects.iter().cloned());
    }
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
                }
            }
        }
    }
    shortened_names(model, &mut out);
    out
}

/// Names the tree cannot show verbatim (longer than a file name can be): the runtime has no
/// problem with them, but `ls` shows a shortened name, so a script looking for the key by
/// name does not find it.
fn shortened_names(model: &Model, out: &mut Vec<String>) {
    let names = Names::of(model);
    for s in &names.shortened {
        let (what, shown) = match s.part {
            Part::Plan(p) => (format!("plan {p} name"), format!("plans/{}/", s.shown)),
            Part::DataFile(f) => (
                format!("data file {} stem", model.files[f].path.display()),
                format!("data/{}/", s.shown),
            ),
            Part::NamedData(f, k) => (
                format!("{}: named_data[{k}] key", model.files[f].path.display()),
                format!("{}named_data/{}.json", names.file_prefix(f), s.shown),
            ),
        };
        out.push(format!(
            "{what} {} ({} bytes) is longer than a file name can be ({NAME_MAX} bytes with its extension): the tree shows it as {shown}",
            abbreviated(&s.full),
            s.full.len(),
        ));
    }
}

/// A name as a JSON string, its middle left out when it is long.
fn abbreviated(name: &str) -> String {
    const SHOWN: usize = 60;
    if name.len() <= 2 * SHOWN {
        return serde_json::Value::from(name).to_string();
    }
    let mut head = SHOWN;
    while !name.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = name.len() - SHOWN;
    while !name.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}…{}",
        serde_json::Value::from(&name[..head]),
        serde_json::Value::from(&name[tail..])
    )
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
