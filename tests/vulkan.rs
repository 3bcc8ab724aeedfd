//! The decoder against real exports and hostile payloads.
//!
//! The manifests of the `vk_*` fixtures (tests/fixtures/extra) carry flatc's decoding of every
//! Vulkan payload (`plans[p].delegates[j].vulkan`) and, for FLOAT16 and 4-bit constants, the
//! sha256 of the float32 values NumPy computes with the documented packing; the decoder and
//! the dequantizer must report exactly the same. Payloads rebuilt from a fixture's graph cover
//! what no exporter writes: bytes in the payload's own region, bare flatbuffers, and every
//! kind of broken reference.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

mod common;

use common::load_json;
use common::payloads::{self, bytes_of, named_blobs, Delegate};
use ptefs::backend::vulkan::graph::{BlobRef, ValueKind, VkGraph};
use ptefs::backend::vulkan::header::payload_with_header;
use ptefs::backend::vulkan::quant::{Packing, QuantLayout};
use ptefs::backend::vulkan::render::{
    graph_json, graph_txt, header_json, value_json, value_json_in, ResolvedBytes,
};
use ptefs::backend::vulkan::{decode, BACKEND_ID};
use ptefs::format::generated::vk_fb;

const DIRS: [&str; 2] = [
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/extra"),
];

/// Every `.pte` fixture.
fn pte_files() -> Vec<PathBuf> {
    payloads::pte_files(&DIRS)
}

/// The Vulkan delegates of the `.pte` at `path`.
fn vulkan_delegates(path: &Path) -> Vec<Delegate> {
    payloads::delegates_of(path, BACKEND_ID)
}

/// The manifest beside a fixture, loaded.
fn manifest_of(pte: &Path) -> Value {
    load_json(&payloads::manifest_of(pte))
}

/// Dequantizes the whole tensor, and again in windows of 7 elements, which must agree.
fn dequantized(layout: &QuantLayout, data: &[u8], scales: &[u8]) -> Vec<f32> {
    let mut all = vec![0f32; layout.numel() as usize];
    layout.dequantize(data, scales, 0, &mut all).unwrap();
    for (k, w) in all.chunks(7).enumerate() {
        let mut part = vec![0f32; w.len()];
        layout
            .dequantize(data, scales, 7 * k as u64, &mut part)
            .unwrap();
        assert_eq!(
            part.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
            w.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
        );
    }
    all
}

fn sha256_of_f32(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|f| f.to_le_bytes()).collect();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The manifest's value entry, rebuilt from the decoded graph's `graph.json` rendering:
/// the union's fields with the value's id and type.
fn rendered_value(g: &Value, id: usize) -> Value {
    let mut m = g["values"][id]["value"].as_object().unwrap().clone();
    let ty = m.shift_remove("type").unwrap();
    let mut out = serde_json::Map::new();
    out.insert("id".into(), json!(id));
    out.insert("type".into(), ty);
    out.extend(m);
    Value::Object(out)
}

fn compare_with_manifest(
    name: &str, graph: &VkGraph, payload: &[u8], expected: &Value, blobs: &HashMap<String, Vec<u8>>,
) {
    // The header, as ExecuTorch's VulkanDelegateHeader reads it.
    let h = header_json(graph);
    for k in [
        "header_length",
        "flatbuffer_offset",
        "flatbuffer_size",
        "bytes_offset",
        "bytes_size",
    ] {
        assert_eq!(h[k], expected["header"][k], "{name}: header {k}");
    }
    let g = graph_json(graph, payload);
    assert_eq!(g["version"], expected["version"], "{name}");
    assert_eq!(g["input_ids"], expected["inputs"], "{name}");
    assert_eq!(g["output_ids"], expected["outputs"], "{name}");
    assert_eq!(g["constants"], expected["constants"], "{name}");
    assert_eq!(g["shaders"], expected["shaders"], "{name}");
    assert_eq!(g["chain"], expected["chain"], "{name}");
    for k in ["storage_type_override", "memory_layout_override"] {
        assert_eq!(g[k], expected[k], "{name}: {k}");
    }
    let values = expected["values"].as_array().unwrap();
    assert_eq!(graph.values.len(), values.len(), "{name}");
    for (i, want) in values.iter().enumerate() {
        let mut want = want.clone();
        let f32_view = want.as_object_mut().unwrap().shift_remove("f32");
        assert_eq!(rendered_value(&g, i), want, "{name}: values[{i}]");
        let v = &graph.values[i];
        // Constants resolve to the entry the manifest names, and to bytes at hand.
        if let Some(c) = v.constant() {
            let t = v.tensor().unwrap();
            let entry = &expected["constants"][t.constant_id as usize];
            match c {
                BlobRef::Named { key, size } => {
                    assert_eq!(json!(key), entry["named_key"], "{name}: %{i}");
                    assert_eq!(json!(size), entry["length"], "{name}: %{i}");
                    assert_eq!(blobs[key].len() as u64, *size, "{name}: %{i}");
                }
                BlobRef::Payload { .. } => {
                    panic!("{name}: %{i}: no export uses the bytes region")
                }
            }
            assert_eq!(t.expected_nbytes().unwrap(), c.size(), "{name}: %{i}");
        }
        // The float32 view: the same packing, shape and values as NumPy's.
        let layout = QuantLayout::for_f32_view(graph, v);
        match (&layout, &f32_view) {
            (None, None) => {}
            (Some(l), Some(want)) => {
                assert_eq!(json!(l.packing.name()), want["packing"], "{name}: %{i}");
                assert_eq!(json!(l.shape()), want["shape"], "{name}: %{i}");
                if let Packing::Q4gsw {
                    scales, group_size, ..
                } = l.packing
                {
                    assert_eq!(json!(scales), want["scales"], "{name}: %{i}");
                    assert_eq!(json!(group_size), want["group_size"], "{name}: %{i}");
                }
                let data = bytes_of(payload, blobs, v.constant().unwrap());
                let scales = l
                    .scales()
                    .map(|s| bytes_of(payload, blobs, graph.value(s).unwrap().constant().unwrap()))
                    .unwrap_or_default();
                let values = dequantized(l, data, scales);
                assert_eq!(
                    json!(sha256_of_f32(&values)),
                    want["sha256"],
                    "{name}: %{i}"
                );
            }
            _ => panic!("{name}: %{i}: layout {layout:?}, manifest {f32_view:?}"),
        }
    }
}

#[test]
fn decodes_every_fixture_as_its_manifest_says() {
    let mut seen = Vec::new();
    for path in pte_files() {
        let delegates = vulkan_delegates(&path);
        if delegates.is_empty() {
            continue;
        }
        let manifest = manifest_of(&path);
        let blobs = named_blobs(&path);
        for d in delegates {
            let name = format!("{} plan {} delegate {}", path.display(), d.plan, d.index);
            let expected = &manifest["plans"][d.plan]["delegates"][d.index]["vulkan"];
            assert!(
                expected.is_object(),
                "{name}: the manifest has no vulkan entry"
            );
            let graph = decode(&d.payload).unwrap_or_else(|e| panic!("{name}: {e}"));
            compare_with_manifest(&name, &graph, &d.payload, expected, &blobs);
            let mut keys: Vec<&str> = graph.named_uses().iter().map(|u| u.key).collect();
            keys.dedup();
            assert!(keys.iter().all(|k| blobs.contains_key(*k)), "{name}");
            seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    for f in [
        "vk_linear.pte",
        "vk_conv.pte",
        "vk_linear_ext.pte",
        "vk_fp16_linear.pte",
        "vk_q4gsw_linear.pte",
        "vk_q4gsw_pad.pte",
    ] {
        assert!(seen.iter().any(|s| s == f), "{f} not decoded: {seen:?}");
    }
}

fn fixture_payload(name: &str) -> Vec<u8> {
    let path = Path::new(DIRS[1]).join(name);
    vulkan_delegates(&path).remove(0).payload
}

#[test]
fn renders_calls_and_values() {
    let payload = fixture_payload("vk_q4gsw_linear.pte");
    let g = decode(&payload).unwrap();
    assert_eq!(
        graph_txt(&g),
        "0\tet_vk.linear_q4gsw.default %3 %1:uint8[4,32] %2:float32[2,4] 32 %0:float32[4] -> %5\n"
    );
    let resolve = |r: &BlobRef| match r {
        BlobRef::Named { key, size } => Some(ResolvedBytes {
            file: format!("named:{key}"),
            file_offset: 7,
            nbytes: *size,
        }),
        BlobRef::Payload { .. } => None,
    };
    let w = value_json_in(&g, &g.values[1], &resolve);
    assert_eq!(w["type"], "VkTensor");
    assert_eq!(w["datatype"], "uint8");
    assert_eq!(w["dims"], json!([4, 32]));
    assert_eq!(w["constant"]["file_offset"], 7);
    assert_eq!(w["constant"]["nbytes"], 128);
    assert_eq!(w["used_by"], json!([{ "op": 0, "arg": 1 }]));
    assert_eq!(
        w["dequantized"],
        json!({ "packing": "q4gsw", "shape": [4, 64], "scales": 2, "group_size": 32 })
    );
    assert_eq!(
        value_json_in(&g, &g.values[3], &resolve)["external"],
        json!({ "input": 0 })
    );
    assert_eq!(
        value_json_in(&g, &g.values[5], &resolve)["external"],
        json!({ "output": 0 })
    );
    let int = value_json(&g.values[4], &resolve);
    assert_eq!(
        int,
        json!({ "id": 4, "type": "Int", "value": 32, "used_by": [{ "op": 0, "arg": 3 }] })
    );

    let conv = decode(&fixture_payload("vk_conv.pte")).unwrap();
    assert_eq!(
        graph_txt(&conv),
        "0\tet_vk.conv_with_clamp.default %2 %0:float32[4,3,3,3] %1:float32[4] [1,1] [1,1] [1,1] false [0,0] 1 0.0 1.7976931348623157e+308 -> %11\n"
    );
    assert_eq!(
        value_json(&conv.values[3], &resolve)["value"],
        json!([1, 1])
    );
    // Deterministic: equal payloads render equal bytes.
    assert_eq!(
        graph_json(&conv, &[]).to_string(),
        graph_json(&decode(&fixture_payload("vk_conv.pte")).unwrap(), &[]).to_string()
    );
}

/// The fixture's graph as the object API holds it, to rebuild payloads from.
fn graph_t(payload: &[u8]) -> vk_fb::VkGraphT {
    let g = decode(payload).unwrap();
    let fb = &payload[g.flatbuffer.as_usize()];
    flatbuffers::root::<vk_fb::VkGraph>(fb).unwrap().unpack()
}

fn finish(t: &vk_fb::VkGraphT) -> Vec<u8> {
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let root = t.pack(&mut fbb);
    fbb.finish(root, Some(vk_fb::VK_GRAPH_IDENTIFIER));
    fbb.finished_data().to_vec()
}

fn tensor_t(t: &mut vk_fb::VkGraphT, id: usize) -> &mut vk_fb::VkTensorT {
    match &mut t.values.as_mut().unwrap()[id].value {
        vk_fb::GraphTypesT::VkTensor(x) => x,
        _ => panic!("not a tensor"),
    }
}

fn refusal(payload: &[u8]) -> String {
    decode(payload).unwrap_err().message().to_string()
}

#[test]
fn constants_in_the_payload_resolve_inside_its_bytes_region() {
    let original = fixture_payload("vk_linear.pte");
    let mut t = graph_t(&original);
    // Weight [4,8] float32 (128 bytes) and bias [4] at region offsets 0 and 128.
    let region: Vec<u8> = (0..144u8).collect();
    let bytes = |offset, length, named_key| {
        let mut b = vk_fb::VkBytesT::default();
        b.offset = offset;
        b.length = length;
        b.named_key = named_key;
        b
    };
    t.constants = Some(vec![
        bytes(0, 128, Some(String::new())),
        bytes(128, 16, None),
    ]);
    let payload = payload_with_header(&finish(&t), &region).unwrap();
    let g = decode(&payload).unwrap();
    let start = g.bytes_region.unwrap().start();
    assert_eq!(
        g.values[0].constant(),
        Some(&BlobRef::Payload {
            offset: start,
            size: 128
        })
    );
    assert_eq!(
        g.values[1].constant(),
        Some(&BlobRef::Payload {
            offset: start + 128,
            size: 16
        })
    );
    assert!(g.named_uses().is_empty());
    let bias = QuantLayout::for_value(&g, &g.values[1]).unwrap();
    let mut out = [0f32; 4];
    bias.dequantize(&payload[start as usize + 128..], &[], 0, &mut out)
        .unwrap();
    assert_eq!(out[0], f32::from_le_bytes([128, 129, 130, 131]));

    // One byte short of the bias's end.
    let short = payload_with_header(&finish(&t), &region[..143]).unwrap();
    let short = &short[..short.len() - 16 + 15];
    let e = refusal(short);
    assert!(e.contains("constant_id 1 at values[1]"), "{e}");
    assert!(e.contains("reach past the end"), "{e}");
    // A length that covers fewer bytes than the tensor has: the runtime reads them all.
    let mut small = t.clone();
    small.constants.as_mut().unwrap()[1].offset = 136;
    small.constants.as_mut().unwrap()[1].length = 8;
    let e = refusal(&payload_with_header(&finish(&small), &region).unwrap());
    assert!(e.contains("the tensor's 16 bytes"), "{e}");
    // Without a header there is no region.
    let e = refusal(&finish(&t));
    assert!(
        e.contains("constant_id at values[0]: expected named data"),
        "{e}"
    );
}

#[test]
fn bare_flatbuffers_decode() {
    let original = fixture_payload("vk_conv.pte");
    let g = decode(&original).unwrap();
    let bare = &original[g.flatbuffer.as_usize()];
    let b = decode(bare).unwrap();
    assert_eq!(b.header, None);
    assert_eq!(b.bytes_region, None);
    assert_eq!(header_json(&b), Value::Null);
    assert_eq!(b.values, g.values);
    assert_eq!(graph_json(&b, bare), graph_json(&g, &original));
}

#[test]
fn refuses_broken_references_naming_them() {
    let original = fixture_payload("vk_linear.pte");
    let base = graph_t(&original);
    let wrap = |t: &vk_fb::VkGraphT| payload_with_header(&finish(t), &[]).unwrap();
    assert!(decode(&wrap(&base)).is_ok());

    let mut t = base.clone();
    tensor_t(&mut t, 0).constant_id = 5;
    assert_eq!(
        refusal(&wrap(&t)),
        "constant_id at values[0]: expected < 2 (the number of constants), found 5"
    );

    let mut t = base.clone();
    t.chain.as_mut().unwrap()[0].args.as_mut().unwrap()[0] = 99;
    assert_eq!(
        refusal(&wrap(&t)),
        "OperatorCall.args at chain[0] (aten.linear.default) args[0]: expected the id of a value (0..4), found 99"
    );
    t.chain.as_mut().unwrap()[0].args.as_mut().unwrap()[0] = -1;
    assert!(refusal(&wrap(&t)).ends_with("found -1"));

    let mut t = base.clone();
    t.chain.as_mut().unwrap()[0].name = None;
    assert_eq!(
        refusal(&wrap(&t)),
        "OperatorCall.name at chain[0]: expected a string, found none"
    );

    let mut t = base.clone();
    t.output_ids = Some(vec![3, 4]);
    assert_eq!(
        refusal(&wrap(&t)),
        "output_ids at output_ids[1]: expected the id of a value (0..4), found 4"
    );

    let mut t = base.clone();
    t.values.as_mut().unwrap()[2].value = vk_fb::GraphTypesT::NONE;
    let e = refusal(&wrap(&t));
    assert!(
        e.starts_with("VkValue.value type at values[2]: expected a GraphTypes member"),
        "{e}"
    );
    assert!(e.ends_with("found 0"), "{e}");

    let mut t = base.clone();
    let mut list = vk_fb::ValueListT::default();
    list.items = Some(vec![0, 7]);
    let mut value = vk_fb::VkValueT::default();
    value.value = vk_fb::GraphTypesT::ValueList(Box::new(list));
    t.values.as_mut().unwrap().push(value);
    assert_eq!(
        refusal(&wrap(&t)),
        "ValueList.items at values[4].items[1]: expected the id of a value (0..5), found 7"
    );

    // A named key without the marker offset is a range of the (empty) bytes region.
    let mut t = base.clone();
    t.constants.as_mut().unwrap()[0].offset = 0;
    let e = refusal(&wrap(&t));
    assert!(
        e.starts_with(
            "constant_id 0 at values[0]: constants[0] (offset 0, length 128) in the bytes region"
        ),
        "{e}"
    );

    // Another identifier, and a header whose regions leave the payload.
    let mut p = wrap(&base);
    p[32 + 4..32 + 8].copy_from_slice(b"VK01");
    assert_eq!(
        refusal(&p),
        "VkGraph identifier at payload byte 36: expected VK00, found \"VK01\""
    );
    let mut p = wrap(&base);
    let len = p.len() as u32;
    p[14..18].copy_from_slice(&len.to_le_bytes());
    let e = refusal(&p);
    assert!(e.starts_with("VH00 flatbuffer (offset 32, size"), "{e}");
    assert!(e.contains("reach past the end"), "{e}");
}

#[test]
fn refuses_truncated_payloads() {
    let payload = fixture_payload("vk_conv.pte");
    let g = decode(&payload).unwrap();
    let fb_end = g.flatbuffer.end() as usize;
    for n in 0..payload.len() {
        let r = decode(&payload[..n]);
        if n < fb_end {
            let e = r.unwrap_err();
            assert!(!e.message().is_empty());
            if n >= 30 {
                assert!(e.message().starts_with("VH00 flatbuffer"), "{n}: {e}");
            }
        }
    }
    assert_eq!(
        refusal(&payload[..6]),
        "Vulkan payload size at the payload: expected at least 8 bytes (a root offset and an identifier), found 6 bytes"
    );
    assert_eq!(
        refusal(&payload[..20]),
        "VH00 header at payload byte 0: expected 30 bytes, found a payload of 20 bytes"
    );
    // A flatbuffer cut short fails verification.
    let bare = &payload[g.flatbuffer.as_usize()];
    let e = refusal(&bare[..bare.len() - 40]);
    assert!(
        e.starts_with("VkGraph flatbuffer fails FlatBuffers verification"),
        "{e}"
    );
}

/// xorshift64*: a fixed sequence, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Everything a tree would do with a decoded payload.
fn exercise(g: &VkGraph, payload: &[u8]) {
    let resolve = |_: &BlobRef| None;
    let _ = header_json(g).to_string();
    let _ = graph_json(g, payload).to_string();
    let _ = graph_txt(g);
    let _ = g.named_uses();
    for v in &g.values {
        let _ = value_json_in(g, v, &resolve).to_string();
        if let Ok(l) = QuantLayout::for_value(g, v) {
            if l.numel() > 1 << 16 || l.data_nbytes() > 1 << 20 || l.scale_nbytes() > 1 << 20 {
                continue;
            }
            let data: Vec<u8> = payload
                .iter()
                .copied()
                .cycle()
                .take(l.data_nbytes() as usize)
                .collect();
            let scales = vec![0x3c; l.scale_nbytes() as usize];
            let mut out = vec![0f32; l.numel() as usize];
            l.dequantize(&data, &scales, 0, &mut out).unwrap();
            let mut beyond = [0f32; 1];
            assert!(l
                .dequantize(&data, &scales, l.numel(), &mut beyond)
                .is_err());
        }
        if let ValueKind::Tensor(t) = &v.kind {
            let _ = t.expected_nbytes();
            let _ = t.datatype.numpy_descr();
        }
    }
}

#[test]
fn mutated_payloads_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let seeds: Vec<Vec<u8>> = ["vk_conv.pte", "vk_q4gsw_pad.pte", "vk_linear_ext.pte"]
        .iter()
        .map(|n| fixture_payload(n))
        .collect();
    let mut decoded = 0;
    for round in 0..3000 {
        let mut p = seeds[round % seeds.len()].clone();
        match rng.below(8) {
            0 => p.truncate(rng.below(p.len() + 1)),
            1 => {
                let extra = rng.below(64);
                p.extend((0..extra).map(|_| rng.next() as u8));
            }
            _ => {
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(p.len());
                    p[at] = match rng.below(4) {
                        0 => 0,
                        1 => 0xff,
                        2 => p[at] ^ (1 << rng.below(8)),
                        _ => rng.next() as u8,
                    };
                }
            }
        }
        if let Ok(g) = decode(&p) {
            decoded += 1;
            exercise(&g, &p);
        }
    }
    // Many mutations land in padding or in values that stay valid (889 of the 3000 here),
    // so the renderers and dequantizers see decoded hostile graphs too.
    assert!(decoded > 300, "{decoded}");
}
