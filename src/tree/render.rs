//! The generated text files: JSON (DESIGN.md §2.4), `operators.txt`, `instructions.txt` (§2.5).
//!
//! Invariants: output depends only on the files' contents (keys in schema order, no hash
//! maps iterated), so two mounts of equal files render equal bytes; every file ends with a
//! newline. Enum values without a name are written as numbers.

use serde_json::{json, Map, Value};

use super::{TextKind, Tree};
use crate::format::generated::{ptd_fb, pte_fb};
use crate::format::layout::{Location, TensorData};
use crate::format::range::ByteRange;
use crate::format::{scalar_type, Kind, Model};

/// Byte vectors longer than this are shown as `{"bytes": N}`.
const INLINE_BYTES_SHOWN: usize = 64;

pub fn render(tree: &Tree, kind: TextKind) -> Vec<u8> {
    let model = &*tree.model;
    match kind {
        TextKind::HeaderJson(f) => to_text(&header_json(model, f)),
        TextKind::ProgramJson => to_text(&program_json(model)),
        TextKind::FlatTensorJson(f) => to_text(&flat_tensor_json(model, f)),
        TextKind::PlanJson(p) => to_text(&plan_json(model, p)),
        TextKind::ValueJson(p, i) => to_text(&value_json(tree, p, i)),
        TextKind::DelegateJson(p, j) => to_text(&delegate_json(model, p, j)),
        TextKind::NamedDataJson(f, k) => to_text(&named_data_json(model, f, k)),
        TextKind::Operators(p) => operators_txt(model, p).into_bytes(),
        TextKind::Instructions(p) => instructions_txt(model, p).into_bytes(),
    }
}

fn to_text(v: &Value) -> Vec<u8> {
    let mut out = String::new();
    write_pretty(v, 0, &mut out);
    out.push('\n');
    out.into_bytes()
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

/// Two-space indented JSON whose arrays of scalars (sizes, dim orders, offsets) stay on one
/// line, so a tensor's shape reads at a glance.
fn write_pretty(v: &Value, depth: usize, out: &mut String) {
    let pad = |d: usize, out: &mut String| out.extend(std::iter::repeat_n("  ", d));
    match v {
        Value::Array(items) if items.iter().all(is_scalar) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&item.to_string());
            }
            out.push(']');
        }
        Value::Array(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                pad(depth + 1, out);
                write_pretty(item, depth + 1, out);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            pad(depth, out);
            out.push(']');
        }
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Object(map) => {
            out.push_str("{\n");
            for (i, (k, item)) in map.iter().enumerate() {
                pad(depth + 1, out);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_pretty(item, depth + 1, out);
                out.push_str(if i + 1 < map.len() { ",\n" } else { "\n" });
            }
            pad(depth, out);
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn bytes_value(data: &[u8]) -> Value {
    if data.len() > INLINE_BYTES_SHOWN {
        json!({ "bytes": data.len() })
    } else {
        json!(data)
    }
}

fn range_bytes_value(model: &Model, r: &ByteRange) -> Value {
    if r.len() as usize > INLINE_BYTES_SHOWN {
        json!({ "bytes": r.len() })
    } else {
        json!(&model.files[0].bytes()[r.as_usize()])
    }
}

fn double(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        json!(v.to_string())
    }
}

fn enum_name(name: Option<&str>, raw: i64) -> Value {
    name.map_or_else(|| json!(raw), |n| json!(n))
}

fn scalar_type_value(v: i8) -> Value {
    enum_name(scalar_type::name(v), v as i64)
}

fn dynamism(v: pte_fb::TensorShapeDynamism) -> Value {
    enum_name(v.variant_name(), v.0 as i64)
}

fn device_type(v: pte_fb::DeviceType) -> Value {
    enum_name(v.variant_name(), v.0 as i64)
}

fn data_location(v: pte_fb::DataLocation) -> Value {
    enum_name(v.variant_name(), v.0 as i64)
}

fn header_json(model: &Model, file: usize) -> Value {
    let f = &model.files[file];
    let bytes = f.bytes();
    let identifier = String::from_utf8_lossy(&bytes[4..8]).into_owned();
    match &f.kind {
        Kind::Pte(p) => {
            let h = &p.header;
            let extended = h.extended.map_or(Value::Null, |e| {
                json!({
                    "magic": "eh00",
                    "length": e.length,
                    "program_size": e.program_size,
                    "segment_base_offset": e.segment_base_offset,
                    "segment_data_size": e.segment_data_size,
                })
            });
            json!({
                "identifier": identifier,
                "root_offset": h.root_offset,
                "extended_header": extended,
                "file_size": h.file_size,
            })
        }
        Kind::Ptd(p) => {
            let h = &p.header;
            json!({
                "identifier": identifier,
                "root_offset": h.root_offset,
                "extended_header": {
                    "magic": "FH01",
                    "length": h.length,
                    "flatbuffer_offset": h.flatbuffer_offset,
                    "flatbuffer_size": h.flatbuffer_size,
                    "segment_base_offset": h.segment_base_offset,
                    "segment_data_size": h.segment_data_size,
                },
                "file_size": h.file_size,
            })
        }
    }
}

fn opt<T, F: FnOnce(&T) -> Value>(v: &Option<T>, f: F) -> Value {
    v.as_ref().map_or(Value::Null, f)
}

fn allocation_json(a: &pte_fb::AllocationDetailsT) -> Value {
    json!({
        "memory_id": a.memory_id,
        "memory_offset_low": a.memory_offset_low,
        "memory_offset_high": a.memory_offset_high,
        "memory_offset": ((a.memory_offset_high as u64) << 32) | a.memory_offset_low as u64,
    })
}

fn extra_json(e: &pte_fb::ExtraTensorInfoT) -> Value {
    json!({
        "mutable_data_segments_idx": e.mutable_data_segments_idx,
        "fully_qualified_name": e.fully_qualified_name,
        "location": enum_name(e.location.variant_name(), e.location.0 as i64),
        "device_type": device_type(e.device_type),
        "device_index": e.device_index,
    })
}

/// The schema fields of a Tensor, in schema order.
fn tensor_fields(t: &pte_fb::TensorT) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("scalar_type".into(), scalar_type_value(t.scalar_type.0));
    m.insert("storage_offset".into(), json!(t.storage_offset));
    m.insert("sizes".into(), json!(t.sizes));
    m.insert("dim_order".into(), json!(t.dim_order));
    m.insert("requires_grad".into(), json!(t.requires_grad));
    m.insert("data_buffer_idx".into(), json!(t.data_buffer_idx));
    m.insert(
        "allocation_info".into(),
        opt(&t.allocation_info, |a| allocation_json(a)),
    );
    m.insert("layout".into(), json!(t.layout));
    m.insert("shape_dynamism".into(), dynamism(t.shape_dynamism));
    m.insert(
        "extra_tensor_info".into(),
        opt(&t.extra_tensor_info, |e| extra_json(e)),
    );
    m
}

fn union_object(type_name: &str, fields: Value) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), json!(type_name));
    if let Value::Object(rest) = fields {
        m.extend(rest);
    }
    Value::Object(m)
}

fn kernel_type_name(v: &pte_fb::KernelTypesT) -> &'static str {
    use pte_fb::KernelTypesT as K;
    match v {
        K::NONE => "NONE",
        K::Null(_) => "Null",
        K::Int(_) => "Int",
        K::Bool(_) => "Bool",
        K::Double(_) => "Double",
        K::Tensor(_) => "Tensor",
        K::String(_) => "String",
        K::IntList(_) => "IntList",
        K::DoubleList(_) => "DoubleList",
        K::BoolList(_) => "BoolList",
        K::TensorList(_) => "TensorList",
        K::OptionalTensorList(_) => "OptionalTensorList",
    }
}

/// The union member's fields, as in program.json.
fn kernel_value_fields(v: &pte_fb::KernelTypesT) -> Value {
    use pte_fb::KernelTypesT as K;
    match v {
        K::NONE | K::Null(_) => json!({}),
        K::Int(x) => json!({ "int_val": x.int_val }),
        K::Bool(x) => json!({ "bool_val": x.bool_val }),
        K::Double(x) => json!({ "double_val": double(x.double_val) }),
        K::Tensor(t) => Value::Object(tensor_fields(t)),
        K::String(s) => json!({ "string_val": s.string_val }),
        K::IntList(l) => json!({ "items": l.items }),
        K::DoubleList(l) => {
            json!({ "items": l.items.as_ref().map(|v| v.iter().map(|d| double(*d)).collect::<Vec<_>>()) })
        }
        K::BoolList(l) => json!({ "items": l.items }),
        K::TensorList(l) => json!({ "items": l.items }),
        K::OptionalTensorList(l) => json!({ "items": l.items }),
    }
}

fn evalue_json(e: &pte_fb::EValueT) -> Value {
    json!({ "val": union_object(kernel_type_name(&e.val), kernel_value_fields(&e.val)) })
}

fn instruction_json(i: &pte_fb::InstructionT) -> Value {
    use pte_fb::InstructionArgumentsT as A;
    let v = match &i.instr_args {
        A::NONE => json!({ "type": "NONE" }),
        A::KernelCall(k) => union_object(
            "KernelCall",
            json!({ "op_index": k.op_index, "args": k.args }),
        ),
        A::DelegateCall(d) => union_object(
            "DelegateCall",
            json!({ "delegate_index": d.delegate_index, "args": d.args }),
        ),
        A::MoveCall(m) => union_object(
            "MoveCall",
            json!({ "move_from": m.move_from, "move_to": m.move_to }),
        ),
        A::JumpFalseCall(j) => union_object(
            "JumpFalseCall",
            json!({ "cond_value_index": j.cond_value_index, "destination_instruction": j.destination_instruction }),
        ),
        A::FreeCall(f) => union_object("FreeCall", json!({ "value_index": f.value_index })),
    };
    json!({ "instr_args": v })
}

fn frame_json(f: &pte_fb::FrameT) -> Value {
    json!({ "filename": f.filename, "lineno": f.lineno, "name": f.name, "context": f.context })
}

fn chain_json(c: &pte_fb::ChainT) -> Value {
    json!({
        "inputs": c.inputs,
        "outputs": c.outputs,
        "instructions": c.instructions.as_ref().map(|v| v.iter().map(instruction_json).collect::<Vec<_>>()),
        "stacktrace": c.stacktrace.as_ref().map(|v| v.iter().map(|fl| json!({
            "items": fl.items.as_ref().map(|i| i.iter().map(frame_json).collect::<Vec<_>>())
        })).collect::<Vec<_>>()),
    })
}

fn operator_json(o: &pte_fb::OperatorT) -> Value {
    json!({ "name": o.name, "overload": o.overload })
}

fn delegate_ref_json(r: &pte_fb::BackendDelegateDataReferenceT) -> Value {
    json!({ "location": data_location(r.location), "index": r.index })
}

fn compile_specs_json(specs: &Option<Vec<pte_fb::CompileSpecT>>) -> Value {
    opt(specs, |v| {
        json!(v
            .iter()
            .map(|c| json!({ "key": c.key, "value": opt(&c.value, |b| bytes_value(b)) }))
            .collect::<Vec<_>>())
    })
}

fn backend_delegate_json(d: &pte_fb::BackendDelegateT) -> Value {
    json!({
        "id": d.id,
        "processed": opt(&d.processed, |r| delegate_ref_json(r)),
        "compile_specs": compile_specs_json(&d.compile_specs),
    })
}

fn container_json(c: &pte_fb::ContainerMetadataT) -> Value {
    json!({ "encoded_inp_str": c.encoded_inp_str, "encoded_out_str": c.encoded_out_str })
}

fn non_const_device_json(v: &Option<Vec<pte_fb::NonConstBufferDeviceT>>) -> Value {
    opt(v, |v| {
        json!(v
            .iter()
            .map(|d| json!({
                "buffer_idx": d.buffer_idx,
                "device_type": device_type(d.device_type),
                "device_index": d.device_index,
            }))
            .collect::<Vec<_>>())
    })
}

fn plan_table_json(p: &pte_fb::ExecutionPlanT) -> Value {
    json!({
        "name": p.name,
        "container_meta_type": opt(&p.container_meta_type, |c| container_json(c)),
        "values": p.values.as_ref().map(|v| v.iter().map(evalue_json).collect::<Vec<_>>()),
        "inputs": p.inputs,
        "outputs": p.outputs,
        "chains": p.chains.as_ref().map(|v| v.iter().map(chain_json).collect::<Vec<_>>()),
        "operators": p.operators.as_ref().map(|v| v.iter().map(operator_json).collect::<Vec<_>>()),
        "delegates": p.delegates.as_ref().map(|v| v.iter().map(backend_delegate_json).collect::<Vec<_>>()),
        "non_const_buffer_sizes": p.non_const_buffer_sizes,
        "non_const_buffer_device": non_const_device_json(&p.non_const_buffer_device),
    })
}

fn subsegment_json(s: &pte_fb::SubsegmentOffsetsT) -> Value {
    json!({ "segment_index": s.segment_index, "offsets": s.offsets })
}

fn program_json(model: &Model) -> Value {
    let pte = model.pte().expect("program.json exists only for a .pte");
    let p = &pte.program;
    json!({
        "version": p.version,
        "execution_plan": p.execution_plan.as_ref().map(|v| v.iter().map(plan_table_json).collect::<Vec<_>>()),
        "constant_buffer": p.constant_buffer.as_ref().map(|_| pte.inline_constants.iter()
            .map(|r| json!({ "storage": opt(r, |r| range_bytes_value(model, r)) }))
            .collect::<Vec<_>>()),
        "backend_delegate_data": p.backend_delegate_data.as_ref().map(|_| pte.inline_delegate_data.iter()
            .map(|r| json!({ "data": opt(r, |r| range_bytes_value(model, r)) }))
            .collect::<Vec<_>>()),
        "segments": p.segments.as_ref().map(|v| v.iter().map(|s| json!({ "offset": s.offset, "size": s.size })).collect::<Vec<_>>()),
        "constant_segment": opt(&p.constant_segment, |c| subsegment_json(c)),
        "mutable_data_segments": p.mutable_data_segments.as_ref().map(|v| v.iter().map(subsegment_json).collect::<Vec<_>>()),
        "named_data": p.named_data.as_ref().map(|v| v.iter().map(|n| json!({ "key": n.key, "segment_index": n.segment_index })).collect::<Vec<_>>()),
    })
}

fn layout_json(l: &ptd_fb::TensorLayoutT) -> Value {
    json!({
        "scalar_type": scalar_type_value(l.scalar_type.0),
        "sizes": l.sizes,
        "dim_order": l.dim_order,
    })
}

fn flat_tensor_json(model: &Model, file: usize) -> Value {
    let ft = &model
        .ptd(file)
        .expect("flat_tensor.json exists only for a .ptd")
        .flat_tensor;
    json!({
        "version": ft.version,
        "segments": ft.segments.as_ref().map(|v| v.iter().map(|s| json!({ "offset": s.offset, "size": s.size })).collect::<Vec<_>>()),
        "named_data": ft.named_data.as_ref().map(|v| v.iter().map(|n| json!({
            "key": n.key,
            "segment_index": n.segment_index,
            "tensor_layout": opt(&n.tensor_layout, |l| layout_json(l)),
        })).collect::<Vec<_>>()),
    })
}

fn plan(model: &Model, p: usize) -> &pte_fb::ExecutionPlanT {
    &model
        .pte()
        .expect("plans exist only in a .pte")
        .program
        .execution_plan
        .as_ref()
        .expect("plan")[p]
}

fn plan_json(model: &Model, p: usize) -> Value {
    let plan = plan(model, p);
    let layout = &model.pte_layout.as_ref().expect("resolved").plans[p];
    let tensors = layout.tensors.iter().flatten().count();
    let with_bytes = layout
        .tensors
        .iter()
        .flatten()
        .filter(|t| t.location.is_some())
        .count();
    let instructions: usize = plan
        .chains
        .iter()
        .flatten()
        .map(|c| c.instructions.as_ref().map_or(0, Vec::len))
        .sum();
    json!({
        "name": plan.name,
        "inputs": plan.inputs,
        "outputs": plan.outputs,
        "non_const_buffer_sizes": plan.non_const_buffer_sizes,
        "non_const_buffer_device": non_const_device_json(&plan.non_const_buffer_device),
        "container_meta_type": opt(&plan.container_meta_type, |c| container_json(c)),
        "counts": {
            "values": plan.values.as_ref().map_or(0, Vec::len),
            "tensors": tensors,
            "tensors_with_bytes": with_bytes,
            "chains": plan.chains.as_ref().map_or(0, Vec::len),
            "instructions": instructions,
            "operators": plan.operators.as_ref().map_or(0, Vec::len),
            "delegates": plan.delegates.as_ref().map_or(0, Vec::len),
        },
    })
}

fn location_fields(model: &Model, m: &mut Map<String, Value>, loc: Option<Location>) {
    match loc {
        Some(l) => {
            m.insert(
                "file".into(),
                json!(model.files[l.file].path.display().to_string()),
            );
            m.insert("file_offset".into(), json!(l.range.start()));
        }
        None => {
            m.insert("file".into(), Value::Null);
            m.insert("file_offset".into(), Value::Null);
        }
    }
}

fn aliases_value(tree: &Tree, loc: Option<Location>, own: &str) -> Value {
    let list: Vec<&String> = loc
        .and_then(|l| tree.aliases().get(&l))
        .map(|v| v.iter().filter(|p| p.as_str() != own).collect())
        .unwrap_or_default();
    json!(list)
}

fn tensor_value_json(
    tree: &Tree, p: usize, i: usize, t: &pte_fb::TensorT, d: &TensorData,
) -> Value {
    let mut m = Map::new();
    m.insert("index".into(), json!(i));
    m.insert("type".into(), json!("Tensor"));
    m.insert("scalar_type".into(), scalar_type_value(t.scalar_type.0));
    m.insert("sizes".into(), json!(t.sizes));
    m.insert("dim_order".into(), json!(t.dim_order));
    m.insert("shape_dynamism".into(), dynamism(t.shape_dynamism));
    m.insert("nbytes".into(), json!(d.nbytes));
    m.insert("data".into(), json!(d.kind.as_str()));
    m.insert("data_buffer_idx".into(), json!(t.data_buffer_idx));
    m.insert(
        "allocation_info".into(),
        opt(&t.allocation_info, |a| allocation_json(a)),
    );
    m.insert(
        "fully_qualified_name".into(),
        json!(t
            .extra_tensor_info
            .as_ref()
            .and_then(|e| e.fully_qualified_name.clone())),
    );
    location_fields(&tree.model, &mut m, d.location);
    let own = format!("plans/{}/values/{i}", tree.names.plans[p]);
    m.insert("aliases".into(), aliases_value(tree, d.location, &own));
    m.insert("storage_offset".into(), json!(t.storage_offset));
    m.insert("requires_grad".into(), json!(t.requires_grad));
    m.insert("layout".into(), json!(t.layout));
    m.insert(
        "extra_tensor_info".into(),
        opt(&t.extra_tensor_info, |e| extra_json(e)),
    );
    if let Some(defect) = &d.defect {
        m.insert("defect".into(), json!(defect));
    }
    Value::Object(m)
}

fn value_json(tree: &Tree, p: usize, i: usize) -> Value {
    use pte_fb::KernelTypesT as K;
    let model = &*tree.model;
    let plan = plan(model, p);
    let value = &plan.values.as_ref().expect("values")[i];
    if let (K::Tensor(t), Some(d)) = (
        &value.val,
        &model.pte_layout.as_ref().expect("resolved").plans[p].tensors[i],
    ) {
        return tensor_value_json(tree, p, i, t, d);
    }
    let mut m = Map::new();
    m.insert("index".into(), json!(i));
    m.insert("type".into(), json!(kernel_type_name(&value.val)));
    match &value.val {
        K::NONE | K::Null(_) | K::Tensor(_) => {}
        K::Int(x) => {
            m.insert("value".into(), json!(x.int_val));
        }
        K::Bool(x) => {
            m.insert("value".into(), json!(x.bool_val));
        }
        K::Double(x) => {
            m.insert("value".into(), double(x.double_val));
        }
        K::String(s) => {
            m.insert("value".into(), json!(s.string_val));
        }
        other => {
            if let Value::Object(fields) = kernel_value_fields(other) {
                m.extend(fields);
            }
        }
    }
    Value::Object(m)
}

fn delegate_json(model: &Model, p: usize, j: usize) -> Value {
    let d = &plan(model, p).delegates.as_ref().expect("delegates")[j];
    let loc = &model.pte_layout.as_ref().expect("resolved").plans[p].delegates[j];
    let mut m = Map::new();
    m.insert("index".into(), json!(j));
    m.insert("id".into(), json!(d.id));
    m.insert(
        "processed".into(),
        opt(&d.processed, |r| delegate_ref_json(r)),
    );
    match loc {
        Ok(l) => {
            m.insert("nbytes".into(), json!(l.range.len()));
            location_fields(model, &mut m, Some(*l));
        }
        Err(e) => {
            m.insert("nbytes".into(), Value::Null);
            location_fields(model, &mut m, None);
            m.insert("defect".into(), json!(e.to_string()));
        }
    }
    m.insert("compile_specs".into(), compile_specs_json(&d.compile_specs));
    Value::Object(m)
}

fn named_data_json(model: &Model, file: usize, k: usize) -> Value {
    let mut m = Map::new();
    let (key, segment_index, loc, layout) = match &model.files[file].kind {
        Kind::Pte(p) => {
            let nd = &p.program.named_data.as_ref().expect("named_data")[k];
            let loc = model.pte_layout.as_ref().expect("resolved").named_data[k].clone();
            (nd.key.clone(), nd.segment_index, loc, Value::Null)
        }
        Kind::Ptd(_) => {
            let blob = &model.ptd_blobs[file].as_ref().expect("blobs")[k];
            let nd = &model
                .ptd(file)
                .expect("ptd")
                .flat_tensor
                .named_data
                .as_ref()
                .expect("named_data")[k];
            (
                Some(blob.key.clone()),
                blob.segment_index,
                blob.location.clone(),
                opt(&nd.tensor_layout, |l| layout_json(l)),
            )
        }
    };
    m.insert("key".into(), json!(key));
    m.insert("segment_index".into(), json!(segment_index));
    match &loc {
        Ok(l) => {
            m.insert("size".into(), json!(l.range.len()));
            location_fields(model, &mut m, Some(*l));
        }
        Err(e) => {
            m.insert("size".into(), Value::Null);
            location_fields(model, &mut m, None);
            m.insert("defect".into(), json!(e.to_string()));
        }
    }
    if matches!(model.files[file].kind, Kind::Ptd(_)) {
        m.insert("tensor_layout".into(), layout);
    }
    Value::Object(m)
}

fn operator_name(o: &pte_fb::OperatorT) -> String {
    let name = o.name.as_deref().unwrap_or("");
    match o.overload.as_deref() {
        Some(ov) if !ov.is_empty() => format!("{name}.{ov}"),
        _ => name.to_string(),
    }
}

fn operators_txt(model: &Model, p: usize) -> String {
    let mut out = String::new();
    for (i, o) in plan(model, p).operators.iter().flatten().enumerate() {
        out.push_str(&format!("{i}\t{}\n", operator_name(o)));
    }
    out
}

fn args_text(args: &Option<Vec<i32>>) -> String {
    args.iter()
        .flatten()
        .map(|a| format!("%{a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn instructions_txt(model: &Model, p: usize) -> String {
    use pte_fb::InstructionArgumentsT as A;
    let plan = plan(model, p);
    let operators = plan.operators.as_deref().unwrap_or_default();
    let delegates = plan.delegates.as_deref().unwrap_or_default();
    let mut out = String::new();
    for (c, chain) in plan.chains.iter().flatten().enumerate() {
        for (pc, ins) in chain.instructions.iter().flatten().enumerate() {
            let text = match &ins.instr_args {
                A::NONE => "none".to_string(),
                A::KernelCall(k) => {
                    let op = usize::try_from(k.op_index)
                        .ok()
                        .and_then(|i| operators.get(i))
                        .map_or_else(
                            || format!("<operator {} out of range>", k.op_index),
                            operator_name,
                        );
                    format!("kernel {op}({})", args_text(&k.args))
                }
                A::DelegateCall(d) => {
                    let id = usize::try_from(d.delegate_index)
                        .ok()
                        .and_then(|i| delegates.get(i))
                        .map_or_else(
                            || "<out of range>".to_string(),
                            |d| d.id.clone().unwrap_or_default(),
                        );
                    format!("delegate {} {id}({})", d.delegate_index, args_text(&d.args))
                }
                A::MoveCall(m) => format!("move %{} -> %{}", m.move_from, m.move_to),
                A::JumpFalseCall(j) => format!(
                    "jump_false %{} -> {c}:{}",
                    j.cond_value_index, j.destination_instruction
                ),
                A::FreeCall(f) => format!("free %{}", f.value_index),
            };
            out.push_str(&format!("{c}:{pc}\t{text}\n"));
        }
    }
    out
}
