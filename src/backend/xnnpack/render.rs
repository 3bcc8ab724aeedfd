//! The text of `xnnpack/header.json`, `graph.json`, `graph.txt` and `values/<id>.json`
//! (docs/tree.md#json-files, docs/tree.md#xnnpack-delegates), as `serde_json` values or
//! strings; the tree pretty-prints them.
//!
//! Keys are schema field names in schema order; enums are written by their schema names
//! (numbers when unnamed); unions are objects whose `"type"` is the member's name; byte
//! vectors over 64 bytes are `{"bytes": N}`; non-finite floats are strings. Fields that
//! only the `XN00` schema has (`constant_buffer`, `mem_buffer_sizes`, `dq_datatype`) appear
//! for `XN00` payloads, and for `XN01` ones only when present.

use serde_json::{json, Map, Value};

use super::datatype::Datatype;
use super::graph::{Identifier, QuantParams, ScaleRef, XnnGraph, XnnNode, XnnValue};
use super::nodes::{FieldValue, NO_VALUE};
use crate::backend::blob::{bytes_json, Resolver};

/// Byte vectors longer than this are shown as `{"bytes": N}`.
const INLINE_BYTES_SHOWN: u64 = 64;

/// A float as its shortest decimal form (0.1, not 0.10000000149011612); non-finite ones as
/// strings ("inf", "NaN"), which JSON cannot hold as numbers.
pub fn float_value(v: f32) -> Value {
    let text = v.to_string();
    match text
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
    {
        Some(n) if v.is_finite() => Value::Number(n),
        _ => Value::String(text),
    }
}

fn datatype_schema(d: Datatype) -> Value {
    d.schema_name().map_or_else(|| json!(d.0), |n| json!(n))
}

fn datatype_short(d: Datatype) -> Value {
    d.short_name().map_or_else(|| json!(d.0), |n| json!(n))
}

fn floats(v: &Option<Vec<f32>>) -> Value {
    v.as_ref().map_or(Value::Null, |v| {
        Value::Array(v.iter().map(|&f| float_value(f)).collect())
    })
}

/// `header.json`: the `XH00` fields, or null for a bare flatbuffer.
pub fn header_json(graph: &XnnGraph) -> Value {
    graph.header.map_or(Value::Null, |h| {
        json!({
            "magic": "XH00",
            "header_length": h.header_length,
            "flatbuffer_offset": h.flatbuffer_offset,
            "flatbuffer_size": h.flatbuffer_size,
            "constant_data_offset": h.constant_data_offset,
            "constant_data_size": h.constant_data_size,
        })
    })
}

fn node_union_json(node: &XnnNode) -> Value {
    let mut m = Map::new();
    m.insert(
        "type".into(),
        node.op_name()
            .map_or_else(|| json!(node.union_type), |n| json!(n)),
    );
    for f in &node.fields {
        let v = match &f.value {
            FieldValue::Input(id) | FieldValue::Output(id) | FieldValue::Unused(id) => json!(id),
            FieldValue::Uint(v) => json!(v),
            FieldValue::Float(v) => float_value(*v),
            FieldValue::UintList(v) => json!(v),
        };
        m.insert(f.name.into(), v);
    }
    Value::Object(m)
}

fn node_json(node: &XnnNode) -> Value {
    json!({
        "xnode_union": node_union_json(node),
        "debug_handle": node.debug_handle,
        "output_min_max": node.output_min_max.map_or(Value::Null, |m| json!({
            "output_min": float_value(m.output_min),
            "output_max": float_value(m.output_max),
        })),
    })
}

fn quant_params_json(q: &QuantParams) -> Value {
    match q {
        QuantParams::PerChannel {
            scale,
            channel_dim,
            scale_buffer_idx,
            num_scales,
            ..
        } => json!({
            "type": "PerChannelQuant",
            "scale": floats(scale),
            "channel_dim": channel_dim,
            "scale_buffer_idx": scale_buffer_idx,
            "num_scales": num_scales,
        }),
        QuantParams::PerTensor {
            scale, zero_point, ..
        } => json!({
            "type": "PerTensorQuant",
            "scale": float_value(*scale),
            "zero_point": zero_point,
        }),
        QuantParams::PerTokenDynamic { num_nonbatch_dims } => json!({
            "type": "PerTokenDynamicQuant",
            "num_nonbatch_dims": num_nonbatch_dims,
        }),
        QuantParams::PerChannelGroup {
            scale,
            channel_dim,
            group_size,
            scale_buffer_idx,
            num_scales,
            ..
        } => json!({
            "type": "PerChannelGroupQuant",
            "scale": floats(scale),
            "channel_dim": channel_dim,
            "group_size": group_size,
            "scale_buffer_idx": scale_buffer_idx,
            "num_scales": num_scales,
        }),
        QuantParams::Unknown { type_code } => json!({ "type": type_code }),
    }
}

fn tensor_value_json(v: &XnnValue, xn00: bool) -> Value {
    let mut m = Map::new();
    m.insert("datatype".into(), datatype_schema(v.datatype));
    m.insert("num_dims".into(), json!(v.num_dims));
    m.insert("dims".into(), json!(v.dims));
    m.insert("constant_buffer_idx".into(), json!(v.constant_buffer_idx));
    m.insert("external_id".into(), json!(v.external_id));
    m.insert("flags".into(), json!(v.flags));
    m.insert("id_out".into(), json!(v.id));
    if xn00 || v.dq_datatype != Datatype::INVALID {
        m.insert("dq_datatype".into(), datatype_schema(v.dq_datatype));
    }
    Value::Object(m)
}

fn xvalue_json(v: &XnnValue, xn00: bool) -> Value {
    let union = match &v.quant {
        None => {
            let mut m = Map::new();
            m.insert("type".into(), json!("XNNTensorValue"));
            if let Value::Object(fields) = tensor_value_json(v, xn00) {
                m.extend(fields);
            }
            Value::Object(m)
        }
        Some(q) => json!({
            "type": "XNNQuantizedTensorValue",
            "tensor_value": tensor_value_json(v, xn00),
            "quant_params": quant_params_json(q),
        }),
    };
    json!({ "xvalue_union": union })
}

fn payload_bytes_value(payload: &[u8], r: Option<crate::format::range::ByteRange>) -> Value {
    match r {
        None => Value::Null,
        Some(r) if r.len() > INLINE_BYTES_SHOWN => json!({ "bytes": r.len() }),
        Some(r) => json!(payload.get(r.as_usize()).unwrap_or_default()),
    }
}

/// `graph.json`: the whole `XNNGraph` table. `payload` supplies the short inline constant
/// buffers of `XN00` payloads.
pub fn graph_json(graph: &XnnGraph, payload: &[u8]) -> Value {
    let xn00 = graph.identifier == Identifier::Xn00;
    let mut m = Map::new();
    m.insert("version".into(), json!(graph.version));
    m.insert(
        "xnodes".into(),
        Value::Array(graph.nodes.iter().map(node_json).collect()),
    );
    m.insert(
        "xvalues".into(),
        Value::Array(graph.values.iter().map(|v| xvalue_json(v, xn00)).collect()),
    );
    m.insert("num_externs".into(), json!(graph.num_externs));
    m.insert("input_ids".into(), json!(graph.input_ids));
    m.insert("output_ids".into(), json!(graph.output_ids));
    if xn00 || graph.constant_buffer.is_some() {
        let buffers = graph.constant_buffer.as_ref().map(|b| {
            b.iter()
                .map(|r| json!({ "storage": payload_bytes_value(payload, *r) }))
                .collect::<Vec<_>>()
        });
        m.insert("constant_buffer".into(), json!(buffers));
    }
    if xn00 || graph.mem_buffer_sizes.is_some() {
        m.insert("mem_buffer_sizes".into(), json!(graph.mem_buffer_sizes));
    }
    let constant_data = graph.constant_data.as_ref().map(|entries| {
        entries
            .iter()
            .map(|c| json!({ "offset": c.offset, "size": c.size, "named_key": c.named_key }))
            .collect::<Vec<_>>()
    });
    m.insert("constant_data".into(), json!(constant_data));
    Value::Object(m)
}

fn operand(graph: &XnnGraph, id: u32) -> String {
    if id == NO_VALUE {
        return "-".to_string();
    }
    match graph.value(id) {
        Some(v) if v.constant.is_some() => format!("%{id}:{}", v.describe()),
        _ => format!("%{id}"),
    }
}

fn list_text(v: &Option<Vec<u32>>) -> String {
    v.as_ref().map_or_else(
        || "-".to_string(),
        |v| {
            let items: Vec<String> = v.iter().map(u32::to_string).collect();
            format!("[{}]", items.join(","))
        },
    )
}

/// The node's non-value fields as `name=value`: `<p>_height` and `<p>_width` as `p=HxW`,
/// the four paddings as `padding=top,right,bottom,left`, flags only when set.
fn attributes(node: &XnnNode) -> Vec<String> {
    let uint = |name: &str| match node.field(name) {
        Some(FieldValue::Uint(v)) => Some(*v),
        _ => None,
    };
    let mut out = Vec::new();
    for f in &node.fields {
        let name = f.name;
        match &f.value {
            FieldValue::Input(_) | FieldValue::Output(_) | FieldValue::Unused(_) => {}
            FieldValue::Uint(0) if name == "flags" => {}
            // Only transposed convolutions use the adjustment; zero is noise elsewhere.
            FieldValue::Uint(0)
                if name == "adjustment_height" && uint("adjustment_width") == Some(0) => {}
            FieldValue::Uint(v) => {
                if name == "padding_top" {
                    if let (Some(r), Some(b), Some(l)) = (
                        uint("padding_right"),
                        uint("padding_bottom"),
                        uint("padding_left"),
                    ) {
                        out.push(format!("padding={v},{r},{b},{l}"));
                        continue;
                    }
                }
                if matches!(name, "padding_right" | "padding_bottom" | "padding_left")
                    && uint("padding_top").is_some()
                {
                    continue;
                }
                if name == "adjustment_width" && uint("adjustment_height") == Some(0) && *v == 0 {
                    continue;
                }
                if let Some(prefix) = name.strip_suffix("_height") {
                    if let Some(w) = uint(&format!("{prefix}_width")) {
                        out.push(format!("{prefix}={v}x{w}"));
                        continue;
                    }
                }
                if let Some(prefix) = name.strip_suffix("_width") {
                    if uint(&format!("{prefix}_height")).is_some() {
                        continue;
                    }
                }
                out.push(format!("{name}={v}"));
            }
            FieldValue::Float(v) => out.push(format!("{name}={v}")),
            FieldValue::UintList(v) => out.push(format!("{name}={}", list_text(v))),
        }
    }
    if let Some(m) = node.output_min_max {
        out.push(format!("output_min={}", m.output_min));
        out.push(format!("output_max={}", m.output_max));
    }
    out
}

/// One line of `graph.txt`: `<k>\t<Op> <operands> -> <outputs> <name=value>...`, values as
/// `%<id>`, constants with datatype and dims (`%4:qbint4[64,64]`), absent inputs as `-`.
pub fn node_line(graph: &XnnGraph, k: usize, node: &XnnNode) -> String {
    let mut line = format!("{k}\t{}", node.display_op());
    for f in &node.fields {
        if let FieldValue::Input(id) = f.value {
            line.push(' ');
            line.push_str(&operand(graph, id));
        }
    }
    line.push_str(" ->");
    for f in &node.fields {
        if let FieldValue::Output(id) = f.value {
            line.push(' ');
            line.push_str(&operand(graph, id));
        }
    }
    for a in attributes(node) {
        line.push(' ');
        line.push_str(&a);
    }
    line
}

/// `graph.txt`: one line per node, in node order, each ending in a newline.
pub fn graph_txt(graph: &XnnGraph) -> String {
    let mut out = String::new();
    for (k, node) in graph.nodes.iter().enumerate() {
        out.push_str(&node_line(graph, k, node));
        out.push('\n');
    }
    out
}

fn scales_json(s: &Option<ScaleRef>, resolve: Resolver) -> Value {
    let Some(s) = s else {
        return Value::Null;
    };
    let mut m = Map::new();
    m.insert("dtype".into(), json!(s.dtype.name()));
    m.insert("count".into(), json!(s.count));
    m.insert("inline".into(), json!(s.inline));
    m.extend(bytes_json(&s.bytes, resolve));
    Value::Object(m)
}

fn value_quant_json(q: &QuantParams, resolve: Resolver) -> Value {
    let mut fields = match quant_params_json(q) {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    match q {
        QuantParams::PerChannel { scales, .. } | QuantParams::PerChannelGroup { scales, .. } => {
            // The inline vector is in "scales"; repeating it here would double long lists.
            fields.shift_remove("scale");
            fields.insert("scales".into(), scales_json(scales, resolve));
        }
        QuantParams::PerTensor { .. } => {
            fields.insert("scales".into(), scales_json(&q.scale_ref(), resolve));
        }
        QuantParams::PerTokenDynamic { .. } | QuantParams::Unknown { .. } => {}
    }
    Value::Object(fields)
}

/// `values/<id>.json` of one value. `resolve` supplies the file and absolute offset of the
/// constant's and the scales' bytes.
pub fn value_json(value: &XnnValue, resolve: Resolver) -> Value {
    let ext = value.external();
    let external = if ext.input.is_none() && ext.output.is_none() {
        Value::Null
    } else {
        let mut m = Map::new();
        if let Some(k) = ext.input {
            m.insert("input".into(), json!(k));
        }
        if let Some(k) = ext.output {
            m.insert("output".into(), json!(k));
        }
        Value::Object(m)
    };
    json!({
        "id": value.id,
        "type": value.type_name(),
        "datatype": datatype_short(value.datatype),
        "dims": value.dims,
        "flags": value.flags,
        "external": external,
        "quant": value.quant.as_ref().map_or(Value::Null, |q| value_quant_json(q, resolve)),
        "constant": value.constant.as_ref().map_or(Value::Null, |c| Value::Object(bytes_json(c, resolve))),
        "used_by": value.used_by.iter().map(|u| json!({ "node": u.node, "role": u.role })).collect::<Vec<_>>(),
    })
}

/// `graph.dot` (docs/tree.md#graphs-as-graphviz-files): each node a box with its operator
/// and attributes, values as edges from the node that writes them to each node that reads
/// them, constants (datatype and dims), external inputs and outputs as nodes of their own.
pub fn graph_dot(graph: &XnnGraph) -> String {
    use crate::picture::dot::{DotGraph, Style};
    use std::collections::HashMap;
    let mut g = DotGraph::new(&format!(
        "XNNPACK graph: {} nodes, {} values",
        graph.nodes.len(),
        graph.values.len()
    ));
    // Where each value comes from: its own node (input, constant) or the node writing it.
    let mut source: HashMap<u32, String> = HashMap::new();
    for v in &graph.values {
        if let Some(k) = v.external().input {
            let id = format!("v{}", v.id);
            g.node(
                &id,
                &format!("input {k}\n%{} {}", v.id, v.describe()),
                Style::Input,
                None,
            );
            source.insert(v.id, id);
        } else if v.constant.is_some() {
            let id = format!("v{}", v.id);
            g.node(
                &id,
                &format!("%{}\n{}", v.id, v.describe()),
                Style::Constant,
                None,
            );
            source.insert(v.id, id);
        }
    }
    for (k, node) in graph.nodes.iter().enumerate() {
        let id = format!("n{k}");
        let attrs = attributes(node);
        let mut label = format!("{k} {}", node.display_op());
        if !attrs.is_empty() {
            label.push('\n');
            label.push_str(&attrs.join("\n"));
        }
        g.node(&id, &label, Style::Op, None);
        for f in &node.fields {
            if let FieldValue::Input(v) = f.value {
                if let Some(from) = source.get(&v) {
                    g.edge(from, &id, &operand(graph, v));
                }
            }
        }
        for f in &node.fields {
            if let FieldValue::Output(v) = f.value {
                source.insert(v, id.clone());
            }
        }
    }
    for v in &graph.values {
        if let Some(k) = v.external().output {
            let id = format!("out{}", v.id);
            g.node(
                &id,
                &format!("output {k}\n%{} {}", v.id, v.describe()),
                Style::Output,
                None,
            );
            if let Some(from) = source.get(&v.id) {
                g.edge(from, &id, &format!("%{}", v.id));
            }
        }
    }
    g.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_keep_their_shortest_form() {
        assert_eq!(float_value(0.1).to_string(), "0.1");
        assert_eq!(float_value(-2.5), json!(-2.5));
        assert_eq!(float_value(f32::INFINITY), json!("inf"));
        assert_eq!(float_value(f32::NAN), json!("NaN"));
    }
}
