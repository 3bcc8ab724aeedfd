//! The XNNPACK payload decoder against real exports and hostile payloads.
//!
//! The manifests in `tests/fixtures` and `tests/fixtures/extra` carry flatc's decoding of
//! every XNNPACK payload (`plans[p].delegates[j].xnnpack`); the decoder must report exactly
//! the same facts, on payloads of every shape the exports have (inline, two methods,
//! channels-last convolution, every datatype). Synthetic payloads cover the `XN00` schema, bare
//! flatbuffers and constants inside the payload, which no current exporter writes.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

use common::payloads::{bytes_of, delegates_of, manifest_of, named_blobs, pte_files};
use common::{load_json, Rng};
use ptefs::backend::xnnpack::quant::QuantLayout;
use ptefs::backend::xnnpack::render::{graph_json, graph_txt, header_json, value_json};
use ptefs::backend::xnnpack::{
    decode, BlobRef, Datatype, FieldValue, QuantParams, ScaleDtype, ScaleRef, XnnGraph, XnnValue,
    BACKEND_ID,
};
use ptefs::backend::{decode_payload, NotDecoded, ResolvedBytes};
use ptefs::format::generated::xnn_fb;
use ptefs::format::{Kind, ModelFile};

const XNNPACK_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
/// The XNNPACK delegates of the `.pte` at `path`.
fn xnn(path: &Path) -> Vec<common::payloads::Delegate> {
    delegates_of(path, BACKEND_ID)
}

const EXTRA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/extra");

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

fn compare_quant(place: &str, q: &QuantParams, expected_type: &Value, expected: &Value) {
    let (name, fields): (&str, Vec<(&str, Value)>) = match q {
        QuantParams::PerChannel {
            scale,
            channel_dim,
            scale_buffer_idx,
            num_scales,
            ..
        } => (
            "PerChannelQuant",
            vec![
                (
                    "scale",
                    serde_json::json!(scale.clone().unwrap_or_default()),
                ),
                ("channel_dim", (*channel_dim).into()),
                ("scale_buffer_idx", (*scale_buffer_idx).into()),
                ("num_scales", (*num_scales).into()),
            ],
        ),
        QuantParams::PerChannelGroup {
            scale,
            channel_dim,
            group_size,
            scale_buffer_idx,
            num_scales,
            ..
        } => (
            "PerChannelGroupQuant",
            vec![
                (
                    "scale",
                    serde_json::json!(scale.clone().unwrap_or_default()),
                ),
                ("channel_dim", (*channel_dim).into()),
                ("group_size", (*group_size).into()),
                ("scale_buffer_idx", (*scale_buffer_idx).into()),
                ("num_scales", (*num_scales).into()),
            ],
        ),
        QuantParams::PerTensor {
            scale, zero_point, ..
        } => (
            "PerTensorQuant",
            vec![
                ("scale", serde_json::json!(scale)),
                ("zero_point", (*zero_point).into()),
            ],
        ),
        QuantParams::PerTokenDynamic { num_nonbatch_dims } => (
            "PerTokenDynamicQuant",
            vec![("num_nonbatch_dims", (*num_nonbatch_dims).into())],
        ),
        QuantParams::Unknown { type_code } => panic!("{place}: unknown quant type {type_code}"),
    };
    assert_eq!(expected_type, name, "{place}: quant type");
    let expected = expected.as_object().unwrap();
    assert_eq!(
        expected.len(),
        fields.len(),
        "{place}: quant fields {expected:?}"
    );
    for (k, v) in fields {
        assert_eq!(&expected[k], &v, "{place}: quant.{k}");
    }
}

/// Compares a decoded graph with flatc's decoding in the manifest, field by field.
fn compare_with_manifest(place: &str, g: &XnnGraph, m: &Value) {
    let h = g.header.expect("every fixture payload has an XH00 header");
    let mh = &m["header"];
    assert_eq!(
        u64::from(h.header_length),
        u64_of(&mh["header_length"]),
        "{place}"
    );
    assert_eq!(
        u64::from(h.flatbuffer_offset),
        u64_of(&mh["flatbuffer_offset"]),
        "{place}"
    );
    assert_eq!(
        u64::from(h.flatbuffer_size),
        u64_of(&mh["flatbuffer_size"]),
        "{place}"
    );
    assert_eq!(
        u64::from(h.constant_data_offset),
        u64_of(&mh["constant_data_offset"]),
        "{place}"
    );
    assert_eq!(
        h.constant_data_size,
        u64_of(&mh["constant_data_size"]),
        "{place}"
    );
    assert_eq!(
        g.version.as_deref(),
        m["version"].as_str(),
        "{place}: version"
    );
    assert_eq!(
        u64::from(g.num_externs),
        u64_of(&m["num_externs"]),
        "{place}"
    );
    assert_eq!(
        serde_json::json!(g.input_ids),
        m["inputs"],
        "{place}: inputs"
    );
    assert_eq!(
        serde_json::json!(g.output_ids),
        m["outputs"],
        "{place}: outputs"
    );

    let nodes = m["nodes"].as_array().unwrap();
    assert_eq!(g.nodes.len(), nodes.len(), "{place}: node count");
    for (k, (n, mn)) in g.nodes.iter().zip(nodes).enumerate() {
        let at = format!("{place} node {k}");
        assert_eq!(n.op_name(), mn["type"].as_str(), "{at}: type");
        assert_eq!(
            u64::from(n.debug_handle),
            u64_of(&mn["debug_handle"]),
            "{at}"
        );
        let fields = mn["fields"].as_object().unwrap();
        assert_eq!(n.fields.len(), fields.len(), "{at}: fields {fields:?}");
        for f in &n.fields {
            let found = match &f.value {
                FieldValue::Input(v) | FieldValue::Output(v) | FieldValue::Unused(v) => {
                    serde_json::json!(v)
                }
                FieldValue::Uint(v) => serde_json::json!(v),
                FieldValue::Float(v) => serde_json::json!(v),
                FieldValue::UintList(v) => serde_json::json!(v),
            };
            assert_eq!(fields[f.name], found, "{at}: {}", f.name);
        }
    }

    let values = m["values"].as_array().unwrap();
    assert_eq!(g.values.len(), values.len(), "{place}: value count");
    for (v, mv) in g.values.iter().zip(values) {
        let at = format!("{place} value {}", v.id);
        assert_eq!(v.index as u64, u64_of(&mv["id"]), "{at}: position");
        assert_eq!(u64::from(v.id), u64_of(&mv["id_out"]), "{at}");
        assert_eq!(v.type_name(), mv["type"], "{at}");
        assert_eq!(v.datatype.schema_name(), mv["datatype"].as_str(), "{at}");
        assert_eq!(serde_json::json!(v.dims), mv["dims"], "{at}: dims");
        assert_eq!(
            u64::from(v.constant_buffer_idx),
            u64_of(&mv["constant_buffer_idx"]),
            "{at}"
        );
        assert_eq!(u64::from(v.external_id), u64_of(&mv["external_id"]), "{at}");
        assert_eq!(u64::from(v.flags), u64_of(&mv["flags"]), "{at}");
        match &v.quant {
            Some(q) => compare_quant(&at, q, &mv["quant_type"], &mv["quant"]),
            None => assert!(mv.get("quant_type").is_none(), "{at}"),
        }
        // The constant reference follows constant_data[constant_buffer_idx].
        match (&v.constant, v.constant_buffer_idx) {
            (None, 0) => {}
            (Some(BlobRef::Named { key, size }), idx) => {
                let entry = &m["constant_data"][idx as usize];
                assert_eq!(entry["named_key"], key.as_str(), "{at}");
                assert_eq!(u64_of(&entry["size"]), *size, "{at}");
            }
            other => panic!("{at}: unexpected constant {other:?}"),
        }
    }

    let cd = m["constant_data"].as_array().unwrap();
    let entries = g.constant_data.as_ref().unwrap();
    assert_eq!(entries.len(), cd.len(), "{place}: constant_data");
    for (e, mc) in entries.iter().zip(cd) {
        assert_eq!(e.offset, u64_of(&mc["offset"]), "{place}");
        assert_eq!(e.size, u64_of(&mc["size"]), "{place}");
        assert_eq!(e.named_key.as_deref(), mc["named_key"].as_str(), "{place}");
    }
}

#[test]
fn every_manifest_payload_decodes_as_flatc_decodes_it() {
    let mut compared = 0;
    for path in pte_files(&[XNNPACK_DIR]) {
        let manifest = load_json(&manifest_of(&path));
        for d in xnn(&path) {
            let place = format!("{} plan {} delegate {}", path.display(), d.plan, d.index);
            let m = &manifest["plans"][d.plan]["delegates"][d.index]["xnnpack"];
            assert!(m.is_object(), "{place}: manifest has no xnnpack section");
            let g = decode(&d.payload).unwrap_or_else(|e| panic!("{place}: {e}"));
            compare_with_manifest(&place, &g, m);
            compared += 1;
        }
    }
    assert!(compared >= 17, "only {compared} payloads compared");
}

#[test]
fn tree_lists_name_the_constants_the_decoder_finds() {
    for path in pte_files(&[XNNPACK_DIR]) {
        let mut list = path.as_os_str().to_owned();
        list.push(".tree");
        let tree = std::fs::read_to_string(PathBuf::from(list)).unwrap();
        let model = ModelFile::open(&path).unwrap();
        let Kind::Pte(pte) = &model.kind else {
            panic!()
        };
        for d in xnn(&path) {
            let plan = pte.program.execution_plan.as_ref().unwrap()[d.plan]
                .name
                .clone()
                .unwrap();
            let prefix = format!("plans/{plan}/delegates/{}/xnnpack/values/", d.index);
            let listed: Vec<&str> = tree
                .lines()
                .filter_map(|l| l.strip_prefix(&prefix))
                .filter(|l| !l.is_empty())
                .collect();
            let g = decode(&d.payload).unwrap();
            let mut expected = Vec::new();
            for v in &g.values {
                expected.push(format!("{}.json", v.id));
                if v.constant.is_some() {
                    expected.push(format!("{}.bin", v.id));
                    expected.push(format!("{}.npy", v.id));
                    if QuantLayout::for_f32_view(v).is_some() {
                        expected.push(format!("{}.f32.npy", v.id));
                    }
                    if QuantLayout::for_value(v).is_ok() {
                        expected.push(format!("{}.hist.svg", v.id));
                    }
                }
            }
            let mut listed: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
            listed.sort();
            expected.sort();
            assert_eq!(listed, expected, "{prefix} of {}", path.display());
        }
    }
}

/// The line of graph.txt the manifest's facts imply, built independently of the decoder.
fn expected_line(k: usize, node: &Value, values: &[Value]) -> String {
    let annotate = |id: u64| {
        if id == u64::from(u32::MAX) {
            return "-".to_string();
        }
        let v = values.iter().find(|v| u64_of(&v["id_out"]) == id).unwrap();
        if u64_of(&v["constant_buffer_idx"]) == 0 {
            return format!("%{id}");
        }
        let dt = v["datatype"]
            .as_str()
            .unwrap()
            .trim_start_matches("xnn_datatype_");
        let dims: Vec<String> = v["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.to_string())
            .collect();
        format!("%{id}:{dt}[{}]", dims.join(","))
    };
    let fields = node["fields"].as_object().unwrap();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut attrs = Vec::new();
    for (name, v) in fields {
        if name.starts_with("output") && name.ends_with("_id") {
            outputs.push(annotate(u64_of(v)));
        } else if name.ends_with("_id") {
            inputs.push(annotate(u64_of(v)));
        } else if !(name == "flags" && u64_of(v) == 0) {
            attrs.push(format!("{name}={v}"));
        }
    }
    let mut line = format!("{k}\t{}", node["type"].as_str().unwrap());
    for i in inputs {
        line.push(' ');
        line.push_str(&i);
    }
    line.push_str(" ->");
    for o in outputs.iter().chain(&attrs) {
        line.push(' ');
        line.push_str(o);
    }
    line
}

#[test]
fn graph_txt_of_llama_8da4w_matches_the_manifest_line_by_line() {
    let path = Path::new(XNNPACK_DIR).join("llama_8da4w.pte");
    let manifest = load_json(&manifest_of(&path));
    let m = &manifest["plans"][0]["delegates"][0]["xnnpack"];
    let d = &xnn(&path)[0];
    assert_eq!((d.plan, d.index), (0, 0));
    let text = graph_txt(&decode(&d.payload).unwrap());
    assert!(text.ends_with('\n'));
    let nodes = m["nodes"].as_array().unwrap();
    let values = m["values"].as_array().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), nodes.len());
    for (k, (line, node)) in lines.iter().zip(nodes).enumerate() {
        assert_eq!(*line, expected_line(k, node, values), "line {k}");
    }
    // The 8da4w shape: dynamic quantization, then a linear with a 4-bit blockwise filter.
    assert_eq!(lines[0], "0\tXNNConvert %0 -> %1");
    assert_eq!(lines[3], "3\tXNNFullyConnected %1 %4:qbint4[64,64] - -> %5");
}

#[test]
fn renderings_are_deterministic_json_with_schema_names() {
    for path in pte_files(&[XNNPACK_DIR]) {
        let blobs = named_blobs(&path);
        for d in xnn(&path) {
            let g = decode(&d.payload).unwrap();
            let again = decode(&d.payload).unwrap();
            assert_eq!(g, again);
            let graph = graph_json(&g, &d.payload);
            assert_eq!(graph, graph_json(&again, &d.payload));
            let keys: Vec<&String> = graph.as_object().unwrap().keys().collect();
            assert_eq!(
                keys,
                [
                    "version",
                    "xnodes",
                    "xvalues",
                    "num_externs",
                    "input_ids",
                    "output_ids",
                    "constant_data"
                ]
            );
            let node = &graph["xnodes"][0]["xnode_union"];
            assert!(node["type"].as_str().unwrap().starts_with("XNN"));
            assert_eq!(header_json(&g)["magic"], "XH00");
            let resolve = |r: &BlobRef| {
                let BlobRef::Named { key, .. } = r else {
                    return None;
                };
                blobs.get(key).map(|b| ResolvedBytes {
                    file: "weights.ptd".into(),
                    file_offset: 1000,
                    nbytes: b.len() as u64,
                })
            };
            // Every named key the graph reads is a blob of the files, read as it should be.
            for u in g.named_uses() {
                assert!(blobs.contains_key(u.key), "{}: {}", path.display(), u.key);
                let scale_key = u.key.starts_with("scale_");
                assert_eq!(scale_key, u.role.as_str() == "scale", "{}", u.key);
                assert!(g.value(u.value).is_some());
            }
            for v in &g.values {
                let j = value_json(v, &resolve);
                assert_eq!(j["id"], v.id);
                assert_eq!(j["datatype"], v.datatype.short_name().unwrap());
                match &v.constant {
                    Some(BlobRef::Named { key, size }) => {
                        assert_eq!(j["constant"]["named_key"], key.as_str());
                        assert_eq!(j["constant"]["file"], "weights.ptd");
                        assert_eq!(j["constant"]["nbytes"], *size, "{}", path.display());
                        assert_eq!(v.expected_nbytes(), Ok(*size));
                    }
                    Some(other) => panic!("{other:?}"),
                    None => assert!(j["constant"].is_null()),
                }
                for u in &v.used_by {
                    let node = &g.nodes[u.node];
                    assert!(node.fields.iter().any(|f| f.role() == u.role));
                }
                if let Some(QuantParams::PerChannelGroup { .. }) = &v.quant {
                    let scales = &j["quant"]["scales"];
                    assert_eq!(scales["dtype"], "bf16");
                    assert!(scales["named_key"].as_str().unwrap().starts_with("scale_"));
                    assert_eq!(j["used_by"][0]["role"], "filter");
                }
            }
        }
    }
}

#[test]
fn extra_fixture_payloads_decode() {
    let mut decoded = 0;
    for path in pte_files(&[EXTRA_DIR]) {
        let blobs = named_blobs(&path);
        for d in xnn(&path) {
            let place = format!("{} plan {} delegate {}", path.display(), d.plan, d.index);
            let view =
                decode_payload(&d.backend, &d.payload).unwrap_or_else(|e| panic!("{place}: {e}"));
            assert_eq!(view.backend().id(), BACKEND_ID, "{place}");
            let g = ptefs::backend::xnnpack::decode(&d.payload).unwrap();
            assert!(!g.nodes.is_empty(), "{place}");
            // Every constant resolves to a blob of the expected size, and dequantizes.
            for v in g.constants() {
                let data = bytes_of(&d.payload, &blobs, v.constant.as_ref().unwrap());
                assert_eq!(
                    Ok(data.len() as u64),
                    v.expected_nbytes(),
                    "{place} value {}",
                    v.id
                );
                if let Ok(layout) = QuantLayout::for_value(v) {
                    let scales = v
                        .quant
                        .as_ref()
                        .and_then(|q| q.scale_ref())
                        .map_or(&[][..], |s| bytes_of(&d.payload, &blobs, &s.bytes));
                    let mut out = vec![0f32; layout.numel() as usize];
                    layout.dequantize(data, scales, 0, &mut out).unwrap();
                    assert!(out.iter().all(|x| x.is_finite()), "{place} value {}", v.id);
                }
            }
            graph_txt(&g);
            decoded += 1;
        }
    }
    assert!(decoded >= 9, "only {decoded} payloads");
}

#[test]
fn int8_and_channels_last_payloads_show_their_parameters() {
    let q8 = &xnn(&Path::new(EXTRA_DIR).join("xnnpack_q8.pte"))[0];
    let g = decode(&q8.payload).unwrap();
    let kinds: Vec<String> = g
        .values
        .iter()
        .map(|v| {
            format!(
                "{}:{}",
                v.datatype.display(),
                v.quant.as_ref().and_then(|q| q.type_name()).unwrap_or("-")
            )
        })
        .collect();
    assert!(
        kinds.iter().any(|k| k == "qcint8:PerChannelQuant"),
        "{kinds:?}"
    );
    assert!(
        kinds.iter().any(|k| k == "qint8:PerTensorQuant"),
        "{kinds:?}"
    );
    let conv = &xnn(&Path::new(EXTRA_DIR).join("conv_xnnpack_cl.pte"))[0];
    let text = graph_txt(&decode(&conv.payload).unwrap());
    assert!(text.contains("XNNConv2d"), "{text}");
    assert!(text.contains(" kernel=3x3"), "{text}");
    assert!(text.contains(" groups=1"), "{text}");
    assert!(text.contains(" padding="), "{text}");
}

/// The dequantization rule of docs/formats.md#dequantization-rules, written out element by element.
fn qbint4_reference(data: &[u8], scales: &[u8], out: usize, inp: usize, group: usize) -> Vec<f32> {
    let mut w = vec![0f32; out * inp];
    for o in 0..out {
        for i in 0..inp {
            let byte = data[(o * inp + i) / 2];
            let nibble = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
            let s = (o * (inp / group) + i / group) * 2;
            let scale =
                f32::from_bits(u32::from(u16::from_le_bytes([scales[s], scales[s + 1]])) << 16);
            w[o * inp + i] = (f32::from(nibble) - 8.0) * scale;
        }
    }
    w
}

#[test]
fn llama_4bit_filters_dequantize_to_finite_values_of_their_shape() {
    for (file, want) in [
        ("llama_8da4w.pte", Datatype::QBINT4),
        ("llama_qc4.pte", Datatype::QCINT4),
    ] {
        let path = Path::new(XNNPACK_DIR).join(file);
        let blobs = named_blobs(&path);
        let mut filters = 0;
        for d in xnn(&path) {
            let g = decode(&d.payload).unwrap();
            for v in g.constants().filter(|v| v.datatype == want) {
                let layout = QuantLayout::for_value(v).unwrap();
                let data = bytes_of(&d.payload, &blobs, v.constant.as_ref().unwrap());
                let scale_ref = v.quant.as_ref().unwrap().scale_ref().unwrap();
                let scales = bytes_of(&d.payload, &blobs, &scale_ref.bytes);
                assert_eq!(data.len() as u64, layout.data_nbytes());
                assert_eq!(scales.len() as u64, layout.scale_nbytes());
                let (out, inp) = (v.dims[0] as usize, v.dims[1] as usize);
                let mut w = vec![0f32; out * inp];
                layout.dequantize(data, scales, 0, &mut w).unwrap();
                assert!(w.iter().all(|x| x.is_finite()) && w.iter().any(|&x| x != 0.0));
                if let Some(QuantParams::PerChannelGroup { group_size, .. }) = &v.quant {
                    assert_eq!(scale_ref.dtype, ScaleDtype::Bf16);
                    assert_eq!(
                        w,
                        qbint4_reference(data, scales, out, inp, *group_size as usize)
                    );
                } else {
                    assert_eq!(scale_ref.dtype, ScaleDtype::F32);
                    assert_eq!(scales.len(), out * 4);
                }
                // A window gives the same elements as the whole.
                let mut window = vec![0f32; 77];
                layout.dequantize(data, scales, 33, &mut window).unwrap();
                assert_eq!(window, w[33..110]);
                filters += 1;
            }
        }
        assert!(filters >= 7, "{file}: {filters} filters");
    }
}

// ---- synthetic payloads ----

/// `XH00` header + flatbuffer + constant region, laid out as ExecuTorch lays them out.
fn with_header(flatbuffer: &[u8], constants: &[u8]) -> Vec<u8> {
    ptefs::backend::xnnpack::header::payload_with_header(flatbuffer, constants).unwrap()
}

fn pack(graph: &xnn_fb::XNNGraphT, identifier: &str) -> Vec<u8> {
    let mut b = flatbuffers::FlatBufferBuilder::new();
    let root = graph.pack(&mut b);
    b.finish(root, Some(identifier));
    b.finished_data().to_vec()
}

fn xvalue(union: xnn_fb::XValueUnionT) -> xnn_fb::XValueT {
    let mut v = xnn_fb::XValueT::default();
    v.xvalue_union = union;
    v
}

fn tensor(id: u32, datatype: xnn_fb::XNNDatatype, dims: &[u32], constant: u32) -> xnn_fb::XValueT {
    xvalue(xnn_fb::XValueUnionT::XNNTensorValue(Box::new(tensor_t(
        id, datatype, dims, constant,
    ))))
}

fn tensor_t(
    id: u32, datatype: xnn_fb::XNNDatatype, dims: &[u32], constant: u32,
) -> xnn_fb::XNNTensorValueT {
    let mut t = xnn_fb::XNNTensorValueT::default();
    t.datatype = datatype;
    t.num_dims = dims.len() as u32;
    t.dims = Some(dims.to_vec());
    t.constant_buffer_idx = constant;
    t.external_id = u32::MAX;
    t.id_out = id;
    t
}

fn constant_entry(offset: u64, size: u64, named_key: Option<&str>) -> xnn_fb::ConstantDataOffsetT {
    let mut c = xnn_fb::ConstantDataOffsetT::default();
    c.offset = offset;
    c.size = size;
    c.named_key = named_key.map(str::to_string);
    c
}

fn buffer(storage: Option<Vec<u8>>) -> xnn_fb::BufferT {
    let mut b = xnn_fb::BufferT::default();
    b.storage = storage;
    b
}

/// A linear `%0 × %1 + %2 -> %3` whose filter is constant 1 and bias constant 2.
fn linear_graph() -> xnn_fb::XNNGraphT {
    let fp32 = xnn_fb::XNNDatatype::xnn_datatype_fp32;
    let mut input = tensor_t(0, fp32, &[1, 2], 0);
    input.flags = 1;
    input.external_id = 0;
    let mut output = tensor_t(3, fp32, &[1, 3], 0);
    output.flags = 2;
    output.external_id = 1;
    let mut fc = xnn_fb::XNNFullyConnectedT::default();
    (fc.input1_id, fc.filter_id, fc.bias_id, fc.output_id) = (0, 1, 2, 3);
    let mut clamp = xnn_fb::OutputMinMaxT::default();
    (clamp.output_min, clamp.output_max) = (0.0, f32::INFINITY);
    let mut node = xnn_fb::XNodeT::default();
    node.xnode_union = xnn_fb::XNodeUnionT::XNNFullyConnected(Box::new(fc));
    node.debug_handle = 7;
    node.output_min_max = Some(Box::new(clamp));
    let mut g = xnn_fb::XNNGraphT::default();
    g.version = Some("0".into());
    g.xnodes = Some(vec![node]);
    g.xvalues = Some(vec![
        xvalue(xnn_fb::XValueUnionT::XNNTensorValue(Box::new(input))),
        tensor(1, fp32, &[3, 2], 1),
        tensor(2, fp32, &[3], 2),
        xvalue(xnn_fb::XValueUnionT::XNNTensorValue(Box::new(output))),
    ]);
    g.num_externs = 2;
    g.input_ids = Some(vec![0]);
    g.output_ids = Some(vec![3]);
    g
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const FILTER: [f32; 6] = [1.0, -2.0, 3.5, 0.25, -0.5, 8.0];
const BIAS: [f32; 3] = [0.1, 0.2, -0.3];

#[test]
fn xn00_bare_payload_reads_its_inline_constant_buffers() {
    let mut g = linear_graph();
    g.constant_buffer = Some(vec![
        buffer(None),
        buffer(Some(f32_bytes(&FILTER))),
        buffer(Some(f32_bytes(&BIAS))),
    ]);
    g.mem_buffer_sizes = Some(vec![]);
    let payload = pack(&g, "XN00");
    let decoded = decode(&payload).unwrap();
    assert!(decoded.header.is_none());
    assert_eq!(decoded.identifier.as_str(), "XN00");
    let filter = decoded.value(1).unwrap();
    let Some(BlobRef::Payload { offset, size }) = filter.constant else {
        panic!("{filter:?}")
    };
    assert_eq!(
        &payload[offset as usize..(offset + size) as usize],
        &f32_bytes(&FILTER)[..]
    );
    let mut w = [0f32; 6];
    QuantLayout::for_value(filter)
        .unwrap()
        .dequantize(&payload[offset as usize..], &[], 0, &mut w)
        .unwrap();
    assert_eq!(w, FILTER);
    // XN00's extra fields show up in graph.json; inline bytes of at most 64 are listed.
    let j = graph_json(&decoded, &payload);
    assert_eq!(
        j["constant_buffer"][1]["storage"].as_array().unwrap().len(),
        24
    );
    assert!(j["constant_buffer"][0]["storage"].is_null());
    assert_eq!(
        j["xvalues"][0]["xvalue_union"]["dq_datatype"],
        "xnn_datatype_invalid"
    );
    assert_eq!(j["xnodes"][0]["output_min_max"]["output_max"], "inf");
    assert_eq!(
        graph_txt(&decoded),
        "0\tXNNFullyConnected %0 %1:fp32[3,2] %2:fp32[3] -> %3 output_min=0 output_max=inf\n"
    );
    // The external arguments.
    let ext = decoded.value(3).unwrap().external();
    assert_eq!((ext.input, ext.output), (None, Some(1)));
}

#[test]
fn constants_in_the_payload_region_resolve_inside_it() {
    let mut g = linear_graph();
    let mut region = f32_bytes(&FILTER);
    region.extend(f32_bytes(&BIAS));
    g.constant_data = Some(vec![
        constant_entry(0, 0, None),
        constant_entry(0, 24, None),
        constant_entry(24, 12, None),
    ]);
    let payload = with_header(&pack(&g, "XN01"), &region);
    let decoded = decode(&payload).unwrap();
    let start = decoded.header.unwrap().constant_data_offset as u64;
    assert_eq!(
        decoded.value(2).unwrap().constant,
        Some(BlobRef::Payload {
            offset: start + 24,
            size: 12
        })
    );
    let j = value_json(decoded.value(1).unwrap(), &|r| match r {
        BlobRef::Payload { offset, size } => Some(ResolvedBytes {
            file: "model.pte".into(),
            file_offset: 4096 + offset,
            nbytes: *size,
        }),
        BlobRef::Named { .. } => None,
    });
    assert_eq!(j["constant"]["payload_offset"], start);
    assert_eq!(j["constant"]["file_offset"], 4096 + start);
    assert_eq!(
        j["used_by"],
        serde_json::json!([{"node": 0, "role": "filter"}])
    );

    // An entry reaching past the region is refused, naming the entry.
    g.constant_data.as_mut().unwrap()[2].size = 13;
    let e = decode(&with_header(&pack(&g, "XN01"), &region)).unwrap_err();
    assert!(e.message().contains("constant_data[2]"), "{e}");
    g.constant_data.as_mut().unwrap()[2].offset = u64::MAX;
    assert!(decode(&with_header(&pack(&g, "XN01"), &region)).is_err());
}

#[test]
fn a_bare_flatbuffer_with_named_constants_has_no_constant_buffer() {
    let path = Path::new(XNNPACK_DIR).join("linear_xnnpack.pte");
    let d = &xnn(&path)[0];
    let g = decode(&d.payload).unwrap();
    // Without its header the runtime looks for inline buffers, which this payload lacks.
    let bare = &d.payload[g.flatbuffer.as_usize()];
    let e = decode(bare).unwrap_err();
    assert!(e.message().contains("constant_buffer"), "{e}");
}

/// `linear_graph` with a quantized filter and bias (each a named constant with named
/// scales), and optionally a second linear that adds the same bias to another filter.
fn quantized_linear(
    filter: xnn_fb::XNNDatatype, filter_quant: xnn_fb::XNNQuantParamsT, bias: xnn_fb::XNNDatatype,
    second_node: bool,
) -> XnnGraph {
    let quantized = |id, datatype, dims: &[u32], constant, quant| {
        let mut q = xnn_fb::XNNQuantizedTensorValueT::default();
        q.tensor_value = Some(Box::new(tensor_t(id, datatype, dims, constant)));
        q.quant_params = quant;
        xvalue(xnn_fb::XValueUnionT::XNNQuantizedTensorValue(Box::new(q)))
    };
    let per_channel = |scale_buffer_idx| {
        let mut q = xnn_fb::PerChannelQuantT::default();
        (q.scale_buffer_idx, q.num_scales) = (scale_buffer_idx, 3);
        xnn_fb::XNNQuantParamsT::PerChannelQuant(Box::new(q))
    };
    let mut g = linear_graph();
    let values = g.xvalues.as_mut().unwrap();
    values[1] = quantized(1, filter, &[3, 64], 1, filter_quant);
    values[2] = match bias {
        xnn_fb::XNNDatatype::xnn_datatype_fp32 => tensor(2, bias, &[3], 3),
        _ => quantized(2, bias, &[3], 3, per_channel(4)),
    };
    if second_node {
        values.push(quantized(4, filter, &[3, 64], 5, per_channel(2)));
        let mut fc = xnn_fb::XNNFullyConnectedT::default();
        (fc.input1_id, fc.filter_id, fc.bias_id, fc.output_id) = (0, 4, 2, 3);
        let mut node = xnn_fb::XNodeT::default();
        node.xnode_union = xnn_fb::XNodeUnionT::XNNFullyConnected(Box::new(fc));
        g.xnodes.as_mut().unwrap().push(node);
    }
    g.constant_data = Some(
        ["", "w", "ws", "b", "bs", "w2"]
            .iter()
            .map(|k| constant_entry(u64::MAX, 16, (!k.is_empty()).then_some(*k)))
            .collect(),
    );
    decode(&with_header(&pack(&g, "XN01"), &[])).unwrap()
}

/// Which writes get fresh scales and which int32 biases follow them (`ScalePlan`).
#[test]
fn scale_plans_follow_how_the_runtime_reads_each_constant() {
    use ptefs::backend::xnnpack::placed::{scale_plan, ScalePlan};
    use xnn_fb::XNNDatatype as D;
    let per_channel = || {
        let mut q = xnn_fb::PerChannelQuantT::default();
        (q.scale_buffer_idx, q.num_scales) = (2, 3);
        xnn_fb::XNNQuantParamsT::PerChannelQuant(Box::new(q))
    };
    let blockwise = || {
        let mut q = xnn_fb::PerChannelGroupQuantT::default();
        (q.scale_buffer_idx, q.num_scales, q.group_size) = (2, 6, 32);
        xnn_fb::XNNQuantParamsT::PerChannelGroupQuant(Box::new(q))
    };
    let (qcint8, qcint4, qbint4) = (
        D::xnn_datatype_qcint8,
        D::xnn_datatype_qcint4,
        D::xnn_datatype_qbint4,
    );
    let (qcint32, fp32) = (D::xnn_datatype_qcint32, D::xnn_datatype_fp32);
    let fresh = |biases: Vec<u32>| Ok(ScalePlan::Fresh { biases });
    // (filter, its quantization, bias, a second node adding the bias, the filter's plan)
    let cases = [
        // An int32 bias follows its filter's fresh scales.
        (qcint8, per_channel(), qcint32, false, fresh(vec![2])),
        // A float bias has nothing to follow.
        (qcint4, per_channel(), fp32, false, fresh(vec![])),
        (qbint4, blockwise(), fp32, false, fresh(vec![])),
        // Blockwise scales cannot carry an int32 bias's unit.
        (
            qbint4,
            blockwise(),
            qcint32,
            false,
            Err("blockwise scales give no per-output scale"),
        ),
        // A bias added to two filters follows neither alone.
        (
            qcint8,
            per_channel(),
            qcint32,
            true,
            Err("its bias %2 (qcint32[3]) is also the bias of node 1"),
        ),
    ];
    for (filter, quant, bias, second, want) in cases {
        let g = quantized_linear(filter, quant, bias, second);
        let got = scale_plan(&g, g.value(1).unwrap());
        match (got, want) {
            (Ok(plan), Ok(want)) => assert_eq!(plan, want, "{filter:?} with a {bias:?} bias"),
            (Err(e), Err(words)) => {
                assert_eq!(e.errno(), libc::EINVAL);
                assert!(e.message().contains(words), "{e}");
            }
            (got, want) => panic!("{filter:?} with a {bias:?} bias: {got:?}, expected {want:?}"),
        }
        if bias == qcint32 && !second {
            // The bias itself keeps its scales: the runtime reads it in its node's units.
            let kept = scale_plan(&g, g.value(2).unwrap()).unwrap();
            assert!(matches!(kept, ScalePlan::Keep { .. }), "{kept:?}");
        }
    }
}

fn expect_error(graph: &xnn_fb::XNNGraphT, needle: &str) {
    let payload = with_header(&pack(graph, "XN01"), &[]);
    match decode(&payload) {
        Ok(_) => panic!("decoded despite {needle}"),
        Err(e) => assert!(e.message().contains(needle), "{needle}: {e}"),
    }
}

#[test]
fn indexes_out_of_range_are_named() {
    let base = || {
        let mut g = linear_graph();
        g.constant_data = Some(vec![
            constant_entry(0, 0, Some("")),
            constant_entry(u64::MAX, 24, Some("w")),
            constant_entry(u64::MAX, 12, Some("b")),
        ]);
        g
    };
    assert!(decode(&with_header(&pack(&base(), "XN01"), &[])).is_ok());

    let mut g = base();
    if let xnn_fb::XValueUnionT::XNNTensorValue(t) =
        &mut g.xvalues.as_mut().unwrap()[1].xvalue_union
    {
        t.constant_buffer_idx = 9;
    }
    expect_error(&g, "constant_buffer_idx at xvalues[1]: expected < 3");

    let mut g = base();
    if let xnn_fb::XNodeUnionT::XNNFullyConnected(n) =
        &mut g.xnodes.as_mut().unwrap()[0].xnode_union
    {
        n.filter_id = 44;
    }
    expect_error(
        &g,
        "filter_id at xnodes[0] (XNNFullyConnected): expected the id_out of a value, found 44",
    );

    let mut g = base();
    if let xnn_fb::XNodeUnionT::XNNFullyConnected(n) =
        &mut g.xnodes.as_mut().unwrap()[0].xnode_union
    {
        n.output_id = u32::MAX;
    }
    expect_error(&g, "output_id");

    let mut g = base();
    g.output_ids = Some(vec![3, 17]);
    expect_error(&g, "output_ids[1]");

    let mut g = base();
    if let xnn_fb::XValueUnionT::XNNTensorValue(t) =
        &mut g.xvalues.as_mut().unwrap()[2].xvalue_union
    {
        t.id_out = 1;
    }
    expect_error(&g, "id_out at xvalues[2]");

    let mut g = base();
    g.num_externs = 1;
    expect_error(&g, "external_id at xvalues[3]");

    let mut g = base();
    let filter = &mut g.xvalues.as_mut().unwrap()[1];
    let xnn_fb::XValueUnionT::XNNTensorValue(t) = &filter.xvalue_union else {
        panic!()
    };
    let mut t = t.clone();
    t.datatype = xnn_fb::XNNDatatype::xnn_datatype_qcint8;
    let mut params = xnn_fb::PerChannelQuantT::default();
    (params.scale_buffer_idx, params.num_scales) = (3, 3);
    let mut quantized = xnn_fb::XNNQuantizedTensorValueT::default();
    quantized.tensor_value = Some(t);
    quantized.quant_params = xnn_fb::XNNQuantParamsT::PerChannelQuant(Box::new(params));
    filter.xvalue_union = xnn_fb::XValueUnionT::XNNQuantizedTensorValue(Box::new(quantized));
    expect_error(&g, "scale_buffer_idx at xvalues[1]");

    let mut g = base();
    g.xvalues.as_mut().unwrap()[2].xvalue_union = xnn_fb::XValueUnionT::NONE;
    expect_error(&g, "xvalue_union type at xvalues[2]");

    let mut g = base();
    g.xnodes.as_mut().unwrap()[0].xnode_union = xnn_fb::XNodeUnionT::NONE;
    // A node the schema does not name keeps no fields; the graph still decodes.
    let decoded = decode(&with_header(&pack(&g, "XN01"), &[])).unwrap();
    assert_eq!(
        graph_txt(&decoded),
        "0\tNONE -> output_min=0 output_max=inf\n"
    );

    let payload = pack(&base(), "XN02");
    let e = decode(&with_header(&payload, &[])).unwrap_err();
    assert!(e.message().contains("XN00 or XN01"), "{e}");
}

#[test]
fn absurd_counts_and_shared_tables_are_refused() {
    // A vector length far beyond the payload.
    let path = Path::new(XNNPACK_DIR).join("linear_xnnpack.pte");
    let d = &xnn(&path)[0];
    let g = decode(&d.payload).unwrap();
    let fb = g.flatbuffer.start() as usize;
    let graph = flatbuffers::root::<xnn_fb::XNNGraph>(&d.payload[fb..]).unwrap();
    let xvalues = graph.xvalues().unwrap();
    let count_at = xvalues.bytes().as_ptr() as usize - d.payload.as_ptr() as usize - 4;
    let mut bad = d.payload.clone();
    bad[count_at..count_at + 4].copy_from_slice(&0x3fff_ffffu32.to_le_bytes());
    let e = decode(&bad).unwrap_err();
    assert!(e.message().contains("verification"), "{e}");

    // One value with a long dims vector, referenced many times: small on disk, huge unpacked.
    let mut b = flatbuffers::FlatBufferBuilder::new();
    let dims = b.create_vector(&vec![1u32; 4096]);
    let tv = xnn_fb::XNNTensorValue::create(
        &mut b,
        &xnn_fb::XNNTensorValueArgs {
            datatype: xnn_fb::XNNDatatype::xnn_datatype_fp32,
            dims: Some(dims),
            ..Default::default()
        },
    );
    let value = xnn_fb::XValue::create(
        &mut b,
        &xnn_fb::XValueArgs {
            xvalue_union_type: xnn_fb::XValueUnion::XNNTensorValue,
            xvalue_union: Some(tv.as_union_value()),
        },
    );
    let values = b.create_vector(&vec![value; 2000]);
    let root = xnn_fb::XNNGraph::create(
        &mut b,
        &xnn_fb::XNNGraphArgs {
            xvalues: Some(values),
            ..Default::default()
        },
    );
    b.finish(root, Some("XN01"));
    let payload = with_header(b.finished_data(), &[]);
    let e = decode(&payload).unwrap_err();
    assert!(e.message().contains("16 times"), "{e}");
}

/// Decodes, renders and dequantizes whatever decodes; must never panic.
fn exercise(payload: &[u8]) -> bool {
    let Ok(g) = decode(payload) else { return false };
    let _ = graph_json(&g, payload);
    let _ = header_json(&g);
    let _ = graph_txt(&g);
    for v in &g.values {
        let _ = value_json(v, &|_| None);
        if let Ok(layout) = QuantLayout::for_value(v) {
            if layout.numel() <= 1 << 16 {
                let data = vec![0x5au8; layout.data_nbytes() as usize];
                let scales = vec![0x3fu8; layout.scale_nbytes() as usize];
                let mut out = vec![0f32; layout.numel() as usize];
                layout.dequantize(&data, &scales, 0, &mut out).unwrap();
            }
        }
    }
    true
}

#[test]
fn truncations_and_bit_flips_are_errors_not_panics() {
    let path = Path::new(XNNPACK_DIR).join("llama_8da4w.pte");
    let d = &xnn(&path)[0];
    let payload = &d.payload;
    assert!(exercise(payload));
    for len in 0..payload.len() {
        // The flatbuffer is verified as a whole: any cut before its end is an error.
        let cut = &payload[..len];
        assert!(!exercise(cut), "truncated to {len} bytes, still decodes");
    }
    let header_len = 32;
    let mut decoded_after_flip = 0;
    for at in (0..payload.len()).filter(|&i| i < header_len || i % 5 == 0) {
        for bit in 0..8 {
            let mut p = payload.clone();
            p[at] ^= 1 << bit;
            decoded_after_flip += usize::from(exercise(&p));
        }
    }
    // Flips in numbers (ids, dims, debug handles) may still decode; many must not.
    assert!(decoded_after_flip > 0);
}

// ---- quantization round trips ----

/// A float in [-1, 1) from the test's seeded generator.
fn unit(rng: &mut Rng) -> f32 {
    ((rng.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

fn value(datatype: Datatype, dims: &[u32], quant: Option<QuantParams>) -> XnnValue {
    XnnValue {
        id: 0,
        index: 0,
        quantized: quant.is_some(),
        datatype,
        num_dims: dims.len() as u32,
        dims: dims.to_vec(),
        constant_buffer_idx: 1,
        external_id: u32::MAX,
        flags: 0,
        dq_datatype: Datatype::INVALID,
        quant,
        constant: Some(BlobRef::Named {
            key: "w".into(),
            size: 0,
        }),
        used_by: Vec::new(),
    }
}

fn scale_ref(dtype: ScaleDtype, count: u64, inline: bool) -> Option<ScaleRef> {
    Some(ScaleRef {
        bytes: BlobRef::Named {
            key: "s".into(),
            size: count * dtype.size(),
        },
        dtype,
        count,
        inline,
    })
}

fn per_channel(channel_dim: i32, count: u64) -> Option<QuantParams> {
    Some(QuantParams::PerChannel {
        scale: None,
        channel_dim,
        scale_buffer_idx: 2,
        num_scales: count as u32,
        scales: scale_ref(ScaleDtype::F32, count, false),
    })
}

fn blockwise(group: i32, count: u64, dtype: ScaleDtype) -> Option<QuantParams> {
    Some(QuantParams::PerChannelGroup {
        scale: None,
        channel_dim: 0,
        group_size: group,
        scale_buffer_idx: 2,
        num_scales: count as u32,
        scales: scale_ref(dtype, count, dtype != ScaleDtype::Bf16),
    })
}

fn per_tensor(scale: f32, zero_point: i32) -> Option<QuantParams> {
    Some(QuantParams::PerTensor {
        scale,
        zero_point,
        scale_field: Some(BlobRef::Payload { offset: 0, size: 4 }),
    })
}

/// Positive normal scales in the layout's dtype.
fn random_scales(layout: &QuantLayout, rng: &mut Rng) -> Vec<u8> {
    let n = (layout.scale_nbytes() / layout.scale_dtype().map_or(1, |d| d.size())) as usize;
    let values: Vec<f32> = (0..n).map(|_| 0.01 + unit(rng).abs()).collect();
    match layout.scale_dtype() {
        None => Vec::new(),
        Some(ScaleDtype::Bf16) => values
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        Some(_) => f32_bytes(&values),
    }
}

/// Stored bytes that are valid for the type (finite halves, nibbles, any integer).
fn random_data(v: &XnnValue, n: usize, rng: &mut Rng) -> Vec<u8> {
    match v.datatype {
        Datatype::FP32 => f32_bytes(&(0..n / 4).map(|_| unit(rng) * 100.0).collect::<Vec<_>>()),
        Datatype::FP16 | Datatype::BF16 => (0..n / 2)
            .flat_map(|_| {
                let x = unit(rng) * 100.0;
                let h = if v.datatype == Datatype::BF16 {
                    (x.to_bits() >> 16) as u16
                } else {
                    half_bits(x)
                };
                h.to_le_bytes()
            })
            .collect(),
        _ => random_bytes(rng, n),
    }
}

fn half_bits(x: f32) -> u16 {
    ptefs::backend::float16::f32_to_f16(x)
}

/// dequantize → requantize (fresh scales) → dequantize stays within half a new scale step,
/// and requantizing with the scales kept reproduces the first dequantization exactly.
fn round_trip(v: &XnnValue, seed: u64) {
    let what = format!("{:?} {:?}", v.datatype, v.dims);
    let layout = QuantLayout::for_value(v).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut rng = Rng::new(seed);
    let data = random_data(v, layout.data_nbytes() as usize, &mut rng);
    let mut scales = random_scales(&layout, &mut rng);
    if let Some(QuantParams::PerTensor { scale, .. }) = &v.quant {
        scales = scale.to_le_bytes().to_vec();
    }
    let n = layout.numel() as usize;
    let mut first = vec![0f32; n];
    layout.dequantize(&data, &scales, 0, &mut first).unwrap();
    assert!(first.iter().all(|x| x.is_finite()), "{what}");

    // Windows agree with the whole.
    for (start, len) in [(0, n), (1, n - 1), (n / 3, n / 3), (n - 1, 1), (n / 2, 0)] {
        let mut w = vec![0f32; len];
        layout
            .dequantize(&data, &scales, start as u64, &mut w)
            .unwrap();
        assert_eq!(w, first[start..start + len], "{what} window {start}+{len}");
    }

    let mut again = vec![0u8; data.len()];
    layout
        .requantize_with_scales(&first, &mut again, &scales)
        .unwrap();
    let mut kept = vec![0f32; n];
    layout.dequantize(&again, &scales, 0, &mut kept).unwrap();
    assert_eq!(kept, first, "{what}: same scales");

    let mut fresh = vec![0u8; data.len()];
    let mut fresh_scales = vec![0u8; scales.len()];
    layout
        .requantize(&first, &mut fresh, &mut fresh_scales)
        .unwrap();
    let mut second = vec![0f32; n];
    layout
        .dequantize(&fresh, &fresh_scales, 0, &mut second)
        .unwrap();
    let steps = scale_steps(&layout, v, &fresh_scales);
    for i in 0..n {
        let tolerance = 0.5 * steps[i] * (1.0 + 1e-5) + first[i].abs() * 1e-6;
        assert!(
            (second[i] - first[i]).abs() <= tolerance,
            "{what}: element {i}: {} -> {} (step {})",
            first[i],
            second[i],
            steps[i]
        );
    }
    windows_match_the_whole(
        &layout,
        &what,
        &first,
        &fresh,
        &fresh_scales,
        &again,
        &scales,
    );
}

/// Re-quantizing window by window (as a commit streams the written array) stores the same
/// bytes as the whole at once: with fresh scales in two passes, in one pass for layouts
/// whose scales each cover one run, and with the stored scales.
fn windows_match_the_whole(
    layout: &QuantLayout, what: &str, input: &[f32], fresh: &[u8], fresh_scales: &[u8],
    kept: &[u8], scales: &[u8],
) {
    let n = input.len();
    let count = layout.scale_values(fresh_scales).unwrap().len();
    for size in [1, 7, 64, n] {
        let mut largest = vec![0u32; count];
        for (k, w) in input.chunks(size).enumerate() {
            let first = (k * size) as u64;
            layout.largest_in_window(first, w, &mut largest).unwrap();
        }
        let mut s = vec![0u8; fresh_scales.len()];
        layout.store_fresh_scales(&largest, &mut s).unwrap();
        assert_eq!(s, fresh_scales, "{what}: scales from windows of {size}");
        let (mut d, mut k) = (layout.blank_data(), layout.blank_data());
        for (j, w) in input.chunks(size).enumerate() {
            let first = (j * size) as u64;
            layout.encode_window(first, w, &mut d, &s).unwrap();
            layout.check_window(first, w, scales).unwrap();
            layout.encode_window(first, w, &mut k, scales).unwrap();
        }
        assert_eq!(d, fresh, "{what}: fresh, windows of {size}");
        assert_eq!(k, kept, "{what}: stored scales, windows of {size}");
    }
    if let Some(span) = layout.scale_span() {
        let size = span as usize * 2;
        let (mut d, mut s) = (layout.blank_data(), vec![0u8; fresh_scales.len()]);
        for (j, w) in input.chunks(size).enumerate() {
            layout
                .requantize_window((j * size) as u64, w, &mut d, &mut s)
                .unwrap();
        }
        assert_eq!(
            (d, s),
            (fresh.to_vec(), fresh_scales.to_vec()),
            "{what}: one pass"
        );
        if span == 1 {
            return;
        }
        let mut s = vec![0u8; fresh_scales.len()];
        let e = layout
            .requantize_window(1, &input[1..], &mut layout.blank_data(), &mut s)
            .unwrap_err();
        assert!(e.message().contains("not whole runs"), "{e}");
    }
}

/// The scale each element uses: the difference between dequantizing "zero point + 1" and
/// "zero point" stored everywhere. Zero for float types.
fn scale_steps(layout: &QuantLayout, v: &XnnValue, scales: &[u8]) -> Vec<f32> {
    let n = layout.numel() as usize;
    if layout.scale_dtype().is_none() {
        return vec![0.0; n];
    }
    let zero = match &v.quant {
        Some(QuantParams::PerTensor { zero_point, .. }) => *zero_point,
        _ => 0,
    };
    let stored = |q: i32| -> Vec<u8> {
        let len = layout.data_nbytes() as usize;
        match v.datatype.bits() {
            Some(4) => vec![((q + 8) as u8) * 0x11; len],
            Some(32) => q.to_le_bytes().repeat(len / 4),
            _ => vec![q as u8; len],
        }
    };
    let mut base = vec![0f32; n];
    let mut plus = vec![0f32; n];
    layout
        .dequantize(&stored(zero), scales, 0, &mut base)
        .unwrap();
    layout
        .dequantize(&stored(zero + 1), scales, 0, &mut plus)
        .unwrap();
    plus.iter().zip(&base).map(|(a, b)| a - b).collect()
}

#[test]
fn every_quantized_type_round_trips_within_half_a_step() {
    let q = Datatype::QCINT4;
    let cases = vec![
        value(Datatype::QINT8, &[4, 5], per_tensor(0.05, -3)),
        value(Datatype::QUINT8, &[7], per_tensor(0.02, 128)),
        value(Datatype::QUINT8, &[6], per_tensor(0.02, 0)),
        value(Datatype::QINT32, &[9], per_tensor(1e-4, 0)),
        value(Datatype::QCINT8, &[3, 8], per_channel(0, 3)),
        value(Datatype::QCINT8, &[2, 3, 4], per_channel(1, 3)),
        value(Datatype::QCINT32, &[5], per_channel(0, 5)),
        value(q, &[4, 6], per_channel(0, 4)),
        value(q, &[3, 5], per_channel(0, 3)),
        value(q, &[2, 7], per_channel(1, 7)),
        value(
            Datatype::QBINT4,
            &[4, 64],
            blockwise(32, 8, ScaleDtype::Bf16),
        ),
        value(
            Datatype::QBINT4,
            &[3, 96],
            blockwise(32, 9, ScaleDtype::F32RoundedToBf16),
        ),
        value(Datatype::FP16, &[3, 3], None),
        value(Datatype::BF16, &[10], None),
        value(Datatype::FP32, &[2, 2], None),
    ];
    for (seed, v) in cases.iter().enumerate() {
        round_trip(v, 0x9e37_79b9 + seed as u64);
    }
}

#[test]
fn fresh_scales_are_positive_normal_and_inputs_finite() {
    let v = value(
        Datatype::QBINT4,
        &[2, 64],
        blockwise(32, 4, ScaleDtype::Bf16),
    );
    let layout = QuantLayout::for_value(&v).unwrap();
    let mut input = vec![0f32; 128];
    input[32] = 1e-42; // subnormal group
    input[64] = 7.0;
    input[100] = -3.0;
    let mut data = vec![0u8; 64];
    let mut scales = vec![0u8; 8];
    layout.requantize(&input, &mut data, &mut scales).unwrap();
    let s: Vec<f32> = scales
        .chunks_exact(2)
        .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
        .collect();
    assert_eq!(s[0], 1.0, "an all-zero group");
    assert!(s.iter().all(|x| x.is_normal() && *x > 0.0), "{s:?}");
    assert_eq!(s[2], 1.0, "7 / 7");
    let mut back = vec![0f32; 128];
    layout.dequantize(&data, &scales, 0, &mut back).unwrap();
    assert_eq!(back[64], 7.0);
    assert_eq!(back[0], 0.0);

    // Scales rounded up near f32::MAX must not dequantize the largest values to infinity.
    let huge = [f32::MAX, -f32::MAX, f32::MAX / 3.0, 1.0];
    let big = [
        value(Datatype::QCINT8, &[1, 4], per_channel(0, 1)),
        value(Datatype::QCINT4, &[1, 4], per_channel(0, 1)),
        value(
            Datatype::QBINT4,
            &[1, 32],
            blockwise(32, 1, ScaleDtype::Bf16),
        ),
        value(
            Datatype::QBINT4,
            &[1, 32],
            blockwise(32, 1, ScaleDtype::F32RoundedToBf16),
        ),
    ];
    for v in big {
        let l = QuantLayout::for_value(&v).unwrap();
        let input: Vec<f32> = huge
            .iter()
            .copied()
            .cycle()
            .take(l.numel() as usize)
            .collect();
        let mut data = vec![0u8; l.data_nbytes() as usize];
        let mut scales = vec![0u8; l.scale_nbytes() as usize];
        l.requantize(&input, &mut data, &mut scales).unwrap();
        let mut back = vec![0f32; input.len()];
        l.dequantize(&data, &scales, 0, &mut back).unwrap();
        for (a, b) in input.iter().zip(&back) {
            assert!(
                b.is_finite() && (a - b).abs() <= f32::MAX / 7.0 * 0.51,
                "{v:?}: {a} -> {b}"
            );
        }
    }

    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut input = vec![0.5f32; 128];
        input[77] = bad;
        let e = layout
            .requantize(&input, &mut data, &mut scales)
            .unwrap_err();
        assert!(e.message().contains("element 77"), "{e}");
    }
    let e = layout
        .requantize(&input[..127], &mut data, &mut scales)
        .unwrap_err();
    assert!(e.message().contains("127 values"), "{e}");
    let e = layout
        .dequantize(&data, &scales, 100, &mut [0f32; 29])
        .unwrap_err();
    assert!(e.message().contains("100..129"), "{e}");
    let e = layout
        .dequantize(&data[..63], &scales, 0, &mut [0f32; 1])
        .unwrap_err();
    assert!(e.message().contains("data has 63 bytes"), "{e}");
}

#[test]
fn combinations_the_runtime_refuses_are_named() {
    let cases = [
        (
            value(
                Datatype::QBINT4,
                &[4, 64],
                blockwise(32, 7, ScaleDtype::Bf16),
            ),
            "8",
        ),
        (
            value(
                Datatype::QBINT4,
                &[4, 60],
                blockwise(32, 8, ScaleDtype::Bf16),
            ),
            "group_size 32",
        ),
        (
            value(
                Datatype::QBINT4,
                &[4, 4, 64],
                blockwise(32, 8, ScaleDtype::Bf16),
            ),
            "[out, in]",
        ),
        (
            value(Datatype::QCINT8, &[3, 8], per_channel(2, 3)),
            "channel_dim 2",
        ),
        // Billions of scales for no element: refused before anyone allocates them.
        (
            value(Datatype::QCINT4, &[0, 1 << 31], per_channel(1, 64)),
            "no elements",
        ),
        (
            value(
                Datatype::QBINT4,
                &[1 << 31, 0],
                blockwise(32, 0, ScaleDtype::Bf16),
            ),
            "no elements",
        ),
        (
            value(Datatype::QINT32, &[3], per_tensor(0.5, 1)),
            "zero point 1",
        ),
        (value(Datatype::QINT8, &[3], per_tensor(0.0, 0)), "scale 0"),
        (
            value(
                Datatype::QDINT8,
                &[3],
                Some(QuantParams::PerTokenDynamic {
                    num_nonbatch_dims: 1,
                }),
            ),
            "dynamically",
        ),
        (
            value(Datatype::QCINT8, &[3], None),
            "no quantization parameters",
        ),
        (value(Datatype::INT32, &[3], None), "int32"),
    ];
    for (v, needle) in cases {
        let e = QuantLayout::for_value(&v).unwrap_err();
        assert!(e.message().contains(needle), "{needle}: {e}");
    }
}

#[test]
fn the_decoder_is_reached_through_the_backend_interface() {
    let path = Path::new(XNNPACK_DIR).join("linear_xnnpack.pte");
    let d = &xnn(&path)[0];
    assert!(decode_payload(BACKEND_ID, &d.payload).is_ok_and(|p| p.backend().id() == BACKEND_ID));
    assert!(matches!(
        decode_payload("CoreMLBackend", &d.payload),
        Err(NotDecoded::NoDecoder)
    ));
    let Err(NotDecoded::Invalid(e)) = decode_payload(BACKEND_ID, &d.payload[..100]) else {
        panic!()
    };
    assert!(!e.message().is_empty());
}
