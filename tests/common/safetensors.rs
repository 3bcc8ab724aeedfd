//! safetensors files for the bulk-update tests: built from tensors, split into header and
//! data, one tensor's bytes, and a `.ptd` of many large tensors written without holding it
//! in memory (or written sparse).

use std::io::Write;
use std::path::Path;

use ptefs::format::generated::{flat_tensor, ptd_fb};
use ptefs::format::writer::{pack_flat_tensor, ptd_program_region};
use serde_json::{json, Value};

/// One tensor of an update: name, dtype, shape and bytes.
pub type Tensor<'a> = (&'a str, &'a str, Vec<u64>, Vec<u8>);

/// The 8-byte length and the JSON header (padded with spaces to a multiple of 8, as the
/// format asks) of a safetensors file whose tensors are `(name, dtype, shape, byte length)`,
/// back to back in this order.
pub fn header(tensors: &[(&str, &str, &[u64], u64)]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    let mut at = 0;
    for (name, dtype, shape, len) in tensors {
        map.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let mut h = serde_json::to_vec(&Value::Object(map)).unwrap();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out
}

/// A whole safetensors file of `tensors`.
pub fn build(tensors: &[Tensor]) -> Vec<u8> {
    let sizes: Vec<(&str, &str, &[u64], u64)> = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, *d, s.as_slice(), b.len() as u64))
        .collect();
    let mut out = header(&sizes);
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    out
}

/// The header (without `__metadata__`) and the data part of a safetensors file.
pub fn split(raw: &[u8]) -> (serde_json::Map<String, Value>, &[u8]) {
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> =
        serde_json::from_slice(&raw[8..8 + n]).unwrap();
    header.remove("__metadata__");
    (header, &raw[8 + n..])
}

/// `__metadata__` of a safetensors file: tensor name to tree path.
pub fn metadata(raw: &[u8]) -> serde_json::Map<String, Value> {
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    header["__metadata__"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// One tensor's bytes in a safetensors file.
pub fn tensor<'a>(raw: &'a [u8], name: &str) -> &'a [u8] {
    let (header, data) = split(raw);
    let offsets = &header[name]["data_offsets"];
    let (b, e) = (
        offsets[0].as_u64().unwrap() as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    &data[b..e]
}

/// Every tensor of a safetensors file as (name, dtype, shape, bytes), in header order.
pub fn tensors(raw: &[u8]) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let (header, _) = split(raw);
    header
        .iter()
        .map(|(name, t)| {
            let shape = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (
                name.clone(),
                t["dtype"].as_str().unwrap().to_string(),
                shape,
                tensor(raw, name).to_vec(),
            )
        })
        .collect()
}

/// The name of tensor `i` of a `.ptd` written by `many_tensor_ptd`.
pub fn layer_name(i: usize) -> String {
    format!("layer{i:02}.weight")
}

/// The safetensors header of the `count` FLOAT[side, side] tensors of a `.ptd` written by
/// `many_tensor_ptd`, as F32.
pub fn layers_header(count: usize, side: i32) -> Vec<u8> {
    let names: Vec<String> = (0..count).map(layer_name).collect();
    let shape = [side as u64, side as u64];
    let bytes = shape[0] * shape[1] * 4;
    let tensors: Vec<(&str, &str, &[u64], u64)> = names
        .iter()
        .map(|n| (n.as_str(), "F32", &shape[..], bytes))
        .collect();
    header(&tensors)
}

/// The program region of a `.ptd` of `count` named FLOAT[side, side] tensors, each in its
/// own segment, padded to the segment base; and the bytes of one tensor.
fn ptd_head(count: usize, side: i32) -> (Vec<u8>, u64) {
    let bytes = (side as u64) * (side as u64) * 4;
    let mut ft = ptd_fb::FlatTensorT::default();
    let mut segments = Vec::new();
    let mut named = Vec::new();
    for i in 0..count {
        let mut seg = ptd_fb::DataSegmentT::default();
        seg.offset = i as u64 * bytes;
        seg.size = bytes;
        segments.push(seg);
        let mut layout = ptd_fb::TensorLayoutT::default();
        layout.scalar_type = flat_tensor::executorch_flatbuffer::ScalarType::FLOAT;
        layout.sizes = Some(vec![side, side]);
        layout.dim_order = Some(vec![0, 1]);
        let mut nd = ptd_fb::NamedDataT::default();
        nd.key = Some(layer_name(i));
        nd.segment_index = i as u32;
        nd.tensor_layout = Some(Box::new(layout));
        named.push(nd);
    }
    ft.segments = Some(segments);
    ft.named_data = Some(named);
    let (mut head, base) = ptd_program_region(&pack_flat_tensor(&ft), 128, count as u64 * bytes);
    head.resize(base as usize, 0);
    (head, bytes)
}

/// Writes a `.ptd` of `count` named FLOAT[side, side] tensors, each in its own segment, and
/// the bytes of tensor `i` made by `fill(i, chunk)` in pieces of at most 8 MiB (so a GiB
/// model never sits in the test's memory); returns where the segments start.
pub fn many_tensor_ptd(
    path: &Path, count: usize, side: i32, mut fill: impl FnMut(usize, &mut [u8]),
) -> u64 {
    let (head, bytes) = ptd_head(count, side);
    let base = head.len() as u64;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    out.write_all(&head).unwrap();
    let mut chunk = vec![0u8; bytes.min(8 << 20) as usize];
    for i in 0..count {
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            fill(i, &mut chunk[..n]);
            out.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    }
    out.into_inner().unwrap().sync_all().unwrap();
    base
}

/// The `.ptd` of `many_tensor_ptd` with every tensor zero, written sparse (`set_len`): an
/// 8 GiB model takes a few KiB of disk. Returns where the segments start.
pub fn sparse_many_tensor_ptd(path: &Path, count: usize, side: i32) -> u64 {
    let (head, bytes) = ptd_head(count, side);
    let base = head.len() as u64;
    let mut out = std::fs::File::create(path).unwrap();
    out.write_all(&head).unwrap();
    out.set_len(base + count as u64 * bytes).unwrap();
    base
}
