//! The text of `vulkan/header.json`, `graph.json`, `graph.txt` and `values/<id>.json`, as
//! `serde_json` values or strings; the tree pretty-prints them.
//!
//! Keys are schema field names in schema order; enums are written by their schema names
//! (numbers when unnamed); unions are objects whose `"type"` is the member's name; doubles
//! are their shortest decimal form, non-finite ones strings (`"inf"`, `"NaN"`). The schema
//! has no byte vector, so `{"bytes": N}` never appears.

use serde_json::{json, Map, Value};

use super::datatype::{Datatype, MemoryLayout, StorageType};
use super::graph::{BytesEntry, OperatorCall, ValueKind, VkGraph, VkTensor, VkValue};
use super::quant::{Packing, QuantLayout};
use crate::backend::blob::bytes_json;
pub use crate::backend::blob::{ResolvedBytes, Resolver};

/// A double as its shortest decimal form; non-finite ones as strings ("inf", "NaN").
pub fn double_value(v: f64) -> Value {
    match serde_json::Number::from_f64(v) {
        Some(n) => Value::Number(n),
        None => Value::String(v.to_string()),
    }
}

fn datatype_schema(d: Datatype) -> Value {
    d.schema_name().map_or_else(|| json!(d.0), |n| json!(n))
}

fn datatype_short(d: Datatype) -> Value {
    d.short_name().map_or_else(|| json!(d.0), |n| json!(n))
}

fn storage_json(s: StorageType) -> Value {
    s.schema_name().map_or_else(|| json!(s.0), |n| json!(n))
}

fn layout_json(m: MemoryLayout) -> Value {
    m.schema_name().map_or_else(|| json!(m.0), |n| json!(n))
}

/// `header.json`: the `VH00` fields, or null for a bare flatbuffer.
pub fn header_json(graph: &VkGraph) -> Value {
    graph.header.map_or(Value::Null, |h| {
        json!({
            "magic": "VH00",
            "header_length": h.header_length,
            "flatbuffer_offset": h.flatbuffer_offset,
            "flatbuffer_size": h.flatbuffer_size,
            "bytes_offset": h.bytes_offset,
            "bytes_size": h.bytes_size,
        })
    })
}

/// A tensor's fields, its datatypes written by `datatype` (schema or short names).
fn tensor_fields(t: &VkTensor, datatype: fn(Datatype) -> Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("datatype".into(), datatype(t.datatype));
    m.insert("dims".into(), json!(t.dims));
    m.insert("constant_id".into(), json!(t.constant_id));
    m.insert("mem_obj_id".into(), json!(t.mem_obj_id));
    m.insert("storage_type".into(), storage_json(t.storage_type));
    m.insert("memory_layout".into(), layout_json(t.memory_layout));
    m.insert("staging_datatype".into(), datatype(t.staging_datatype));
    m
}

/// The member's fields by their schema names (`int_val`, `items`, ...), without `"type"`.
fn member_fields(kind: &ValueKind) -> Map<String, Value> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.into(), v);
    };
    match kind {
        ValueKind::Null => {}
        ValueKind::Int(v) => put("int_val", json!(v)),
        ValueKind::Double(v) => put("double_val", double_value(*v)),
        ValueKind::Bool(v) => put("bool_val", json!(v)),
        ValueKind::Tensor(t) => return tensor_fields(t, datatype_schema),
        ValueKind::IntList(v) => put("items", json!(v)),
        ValueKind::DoubleList(v) => put(
            "items",
            Value::Array(v.iter().map(|&d| double_value(d)).collect()),
        ),
        ValueKind::BoolList(v) => put("items", json!(v)),
        ValueKind::ValueList(v) => put("items", json!(v)),
        ValueKind::String(v) => put("string_val", json!(v)),
        ValueKind::SymInt(v) => put("value", json!(v)),
    }
    m
}

fn value_union_json(v: &VkValue) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), json!(v.type_name()));
    m.extend(member_fields(&v.kind));
    Value::Object(m)
}

fn bytes_entries_json(entries: &Option<Vec<BytesEntry>>) -> Value {
    json!(entries.as_ref().map(|e| e
        .iter()
        .map(|c| json!({ "offset": c.offset, "length": c.length, "named_key": c.named_key }))
        .collect::<Vec<_>>()))
}

fn call_json(c: &OperatorCall) -> Value {
    json!({ "node_id": c.node_id, "name": c.name, "args": c.args })
}

/// `graph.json`: the whole `VkGraph` table. `payload` is not needed by this schema (it
/// holds no inline bytes); it is taken for the same shape as other backends' renderers.
pub fn graph_json(graph: &VkGraph, _payload: &[u8]) -> Value {
    let mut m = Map::new();
    m.insert("version".into(), json!(graph.version));
    m.insert(
        "chain".into(),
        Value::Array(graph.chain.iter().map(call_json).collect()),
    );
    m.insert(
        "values".into(),
        Value::Array(
            graph
                .values
                .iter()
                .map(|v| json!({ "value": value_union_json(v) }))
                .collect(),
        ),
    );
    m.insert("input_ids".into(), json!(graph.input_ids));
    m.insert("output_ids".into(), json!(graph.output_ids));
    m.insert("constants".into(), bytes_entries_json(&graph.constants));
    m.insert("shaders".into(), bytes_entries_json(&graph.shaders));
    m.insert(
        "storage_type_override".into(),
        storage_json(graph.storage_type_override),
    );
    m.insert(
        "memory_layout_override".into(),
        layout_json(graph.memory_layout_override),
    );
    Value::Object(m)
}

fn list<T>(items: &[T], show: impl Fn(&T) -> String) -> String {
    let items: Vec<String> = items.iter().map(show).collect();
    format!("[{}]", items.join(","))
}

fn double_text(d: f64) -> String {
    double_value(d).to_string().trim_matches('"').to_string()
}

/// How an argument shows in `graph.txt`: tensors as `%<id>` (constants with datatype and
/// dims: `%4:float32[64,64]`), scalars, lists and strings by value (`32`, `[1,1]`, `false`,
/// `"name"`), None as `-`, a symbolic integer as `%<id>:symint`, a value list as the list of
/// its members.
pub fn operand(graph: &VkGraph, id: u32) -> String {
    let Some(v) = graph.value(id) else {
        return format!("%{id}");
    };
    match &v.kind {
        ValueKind::Null => "-".to_string(),
        ValueKind::Int(i) => i.to_string(),
        ValueKind::Double(d) => double_text(*d),
        ValueKind::Bool(b) => b.to_string(),
        ValueKind::Tensor(t) if t.constant.is_some() => format!("%{id}:{}", t.describe()),
        ValueKind::Tensor(_) => format!("%{id}"),
        ValueKind::IntList(items) => list(items, i64::to_string),
        ValueKind::DoubleList(items) => list(items, |d| double_text(*d)),
        ValueKind::BoolList(items) => list(items, bool::to_string),
        // Members are shown by id: a list may hold itself, and printing it would not end.
        ValueKind::ValueList(items) => list(items, |i| format!("%{i}")),
        ValueKind::String(s) => json!(s).to_string(),
        ValueKind::SymInt(_) => format!("%{id}:symint"),
    }
}

/// One line of `graph.txt`: `<k>\t<name> <inputs> -> <output>`; the exporter appends the
/// call's output as its last argument.
pub fn call_line(graph: &VkGraph, k: usize, call: &OperatorCall) -> String {
    let mut line = format!("{k}\t{}", call.name);
    let args = call.args();
    let (inputs, output) = match args.split_last() {
        Some((out, inputs)) => (inputs, Some(*out)),
        None => (args, None),
    };
    for &a in inputs {
        line.push(' ');
        line.push_str(&operand(graph, a));
    }
    line.push_str(" ->");
    if let Some(out) = output {
        line.push(' ');
        line.push_str(&operand(graph, out));
    }
    line
}

/// `graph.txt`: one line per `OperatorCall`, in chain order, each ending in a newline.
pub fn graph_txt(graph: &VkGraph) -> String {
    let mut out = String::new();
    for (k, call) in graph.chain.iter().enumerate() {
        out.push_str(&call_line(graph, k, call));
        out.push('\n');
    }
    out
}

/// The `"dequantized"` entry of a constant with a float32 view: its packing, the view's
/// shape, and for 4-bit weights the scales' value id and the group size.
pub fn dequantized_json(layout: &QuantLayout) -> Value {
    let mut m = Map::new();
    m.insert("packing".into(), json!(layout.packing.name()));
    m.insert("shape".into(), json!(layout.shape()));
    if let Packing::Q4gsw {
        scales, group_size, ..
    } = layout.packing
    {
        m.insert("scales".into(), json!(scales));
        m.insert("group_size".into(), json!(group_size));
    }
    Value::Object(m)
}

/// `values/<id>.json` of one value: `id`, `type`, for tensors `datatype` (lower case), `dims`
/// and the storage and memory layout fields, `constant` (null, or where its bytes are, as
/// `resolve` finds them); for other members `value` (the scalar, list, string, member ids,
/// or a symbolic integer's initial value); `external` (its graph input and output
/// positions, or null); `used_by` (each call argument naming it).
pub fn value_json(value: &VkValue, resolve: Resolver) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(value.id));
    m.insert("type".into(), json!(value.type_name()));
    match &value.kind {
        ValueKind::Tensor(t) => {
            m.extend(tensor_fields(t, datatype_short));
            m.insert(
                "constant".into(),
                t.constant
                    .as_ref()
                    .map_or(Value::Null, |c| Value::Object(bytes_json(c, resolve))),
            );
        }
        ValueKind::Null => {
            m.insert("value".into(), Value::Null);
        }
        other => {
            let fields = member_fields(other);
            m.insert(
                "value".into(),
                fields.into_iter().next().map_or(Value::Null, |(_, v)| v),
            );
        }
    }
    m.insert(
        "used_by".into(),
        json!(value
            .used_by
            .iter()
            .map(|u| json!({ "op": u.op, "arg": u.arg }))
            .collect::<Vec<_>>()),
    );
    Value::Object(m)
}

/// [`value_json`] with the graph's view of the value added: `external` (positions in
/// `input_ids` / `output_ids`) and, for constants with a float32 view, `dequantized`.
pub fn value_json_in(graph: &VkGraph, value: &VkValue, resolve: Resolver) -> Value {
    let mut v = value_json(value, resolve);
    if let Value::Object(m) = &mut v {
        let ext = graph.external(value.id);
        let external = if ext.input.is_none() && ext.output.is_none() {
            Value::Null
        } else {
            let mut e = Map::new();
            if let Some(k) = ext.input {
                e.insert("input".into(), json!(k));
            }
            if let Some(k) = ext.output {
                e.insert("output".into(), json!(k));
            }
            Value::Object(e)
        };
        m.insert("external".into(), external);
        if value.constant().is_some() {
            m.insert(
                "dequantized".into(),
                QuantLayout::for_f32_view(graph, value)
                    .as_ref()
                    .map_or(Value::Null, dequantized_json),
            );
        }
    }
    v
}

/// `graph.dot` (docs/tree.md#graphs-as-graphviz-files): each operator call a box, tensors as
/// edges from the call that writes them (its last argument) to each call that reads them,
/// constant tensors (datatype and dims), graph inputs and outputs as nodes of their own.
/// Scalars and lists of numbers are in the call's tooltip, not drawn.
pub fn graph_dot(graph: &VkGraph) -> String {
    use crate::picture::dot::{DotGraph, Style};
    use std::collections::HashMap;
    let mut g = DotGraph::new(&format!(
        "Vulkan graph: {} operator calls, {} values",
        graph.chain.len(),
        graph.values.len()
    ));
    // The tensors an argument stands for: itself, or the tensors of a value list.
    let tensors = |id: u32| -> Vec<u32> {
        match graph.value(id).map(|v| &v.kind) {
            Some(ValueKind::Tensor(_)) => vec![id],
            Some(ValueKind::ValueList(items)) => items
                .iter()
                .copied()
                .filter(|&i| graph.value(i).and_then(VkValue::tensor).is_some())
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut source: HashMap<u32, String> = HashMap::new();
    for (k, &id) in graph.input_ids.iter().flatten().enumerate() {
        let node = format!("in{k}");
        let what = graph
            .value(id)
            .and_then(VkValue::tensor)
            .map_or_else(String::new, |t| t.describe());
        g.node(
            &node,
            &format!("input {k}\n%{id} {what}"),
            Style::Input,
            None,
        );
        for t in tensors(id) {
            source.insert(t, node.clone());
        }
    }
    for v in graph.constants() {
        let Some(t) = v.tensor() else { continue };
        let node = format!("v{}", v.id);
        g.node(
            &node,
            &format!("%{}\n{}", v.id, t.describe()),
            Style::Constant,
            None,
        );
        source.insert(v.id, node);
    }
    for (k, call) in graph.chain.iter().enumerate() {
        let node = format!("n{k}");
        let line = call_line(graph, k, call);
        let tip = line.split_once('\t').map_or(line.as_str(), |(_, l)| l);
        g.node(&node, &format!("{k} {}", call.name), Style::Op, Some(tip));
        let args = call.args();
        let (inputs, output) = match args.split_last() {
            Some((out, inputs)) => (inputs, Some(*out)),
            None => (args, None),
        };
        for &a in inputs {
            for t in tensors(a) {
                if let Some(from) = source.get(&t) {
                    g.edge(from, &node, &operand(graph, t));
                }
            }
        }
        if let Some(out) = output {
            for t in tensors(out) {
                source.insert(t, node.clone());
            }
        }
    }
    for (k, &id) in graph.output_ids.iter().flatten().enumerate() {
        let node = format!("out{k}");
        let what = graph
            .value(id)
            .and_then(VkValue::tensor)
            .map_or_else(String::new, |t| t.describe());
        g.node(
            &node,
            &format!("output {k}\n%{id} {what}"),
            Style::Output,
            None,
        );
        for t in tensors(id) {
            if let Some(from) = source.get(&t) {
                g.edge(from, &node, &format!("%{t}"));
            }
        }
    }
    g.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_keep_their_shortest_form() {
        assert_eq!(double_value(0.1).to_string(), "0.1");
        assert_eq!(
            double_value(f64::MAX).to_string(),
            "1.7976931348623157e+308"
        );
        assert_eq!(double_value(f64::INFINITY), json!("inf"));
        assert_eq!(double_value(f64::NAN), json!("NaN"));
        assert_eq!(double_text(0.0), "0.0");
        assert_eq!(double_text(f64::NEG_INFINITY), "-inf");
    }
}
