//! Quantization parameters written raw (docs/writes.md#quantization-parameters): scales that
//! XNNPACK refuses (NaN, infinities, zero, negative and subnormal floats) are refused through
//! every file that can write them (`named_data/<key>.bin`, `segments/<n>`,
//! `weights.safetensors`, `ptefs apply`, a delegate payload rewritten whole), naming the
//! value, the scale index and the value found, and nothing is written; `ptefs check` reports
//! such scales stored in a file. And a re-quantizing write keeps a channel's int32 bias and
//! scale byte for byte when that channel's scale need not change.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;

use common::mount::{run, text, BIN};
use common::{copy_files, fixture_files, fixtures_dir, Copied};
use ptefs::format::Model;
use ptefs::fs::{Fs, Options};
use ptefs::tree::Tree;

const FIXTURE: &str = "extra/xnn_qc8_conv";
/// The first convolution's `qcint8[4,3,3,2]` filter, its 4 fp32 scales in named data.
const FILTER: &str = "plans/forward/delegates/0/xnnpack/values/3";
/// Its `qcint32[4]` bias.
const BIAS: &str = "plans/forward/delegates/0/xnnpack/values/5";

fn copy() -> Copied {
    let (model, data) = fixture_files(&fixtures_dir().join(format!("{FIXTURE}.pte.json")));
    copy_files(&model, &data)
}

fn open(c: &Copied) -> Fs {
    let model = Model::open_writable(&c.model, &c.data).unwrap();
    Fs::new(Tree::build(Arc::new(model)), Options { read_only: false })
}

fn read(fs: &Fs, path: &str) -> Vec<u8> {
    let ino = fs.tree().find(path).unwrap_or_else(|| panic!("no {path}"));
    common::read_all(fs, ino, 1 << 20).unwrap()
}

fn json(fs: &Fs, path: &str) -> Value {
    serde_json::from_slice(&read(fs, path)).unwrap()
}

/// Replaces the content of `path` the way `cp` does: O_TRUNC, writes, close.
fn replace(fs: &Fs, path: &str, data: &[u8]) -> Result<(), ptefs::error::Error> {
    let ino = fs.tree().find(path).unwrap_or_else(|| panic!("no {path}"));
    let fh = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC)?.fh;
    let written = fs.write(fh, 0, data).map(|_| ());
    let flushed = written.and_then(|()| fs.flush(fh));
    fs.release(fh)?;
    flushed
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The named key of the filter's scales, its segment, and their bytes now.
fn scale_key(fs: &Fs) -> (String, u64, Vec<u8>) {
    let key = json(fs, &format!("{FILTER}.json"))["quant"]["scales"]["named_key"]
        .as_str()
        .unwrap()
        .to_string();
    let segment = json(fs, &format!("named_data/{key}.json"))["segment_index"]
        .as_u64()
        .unwrap();
    let bytes = read(fs, &format!("named_data/{key}.bin"));
    (key, segment, bytes)
}

/// Scales XNNPACK refuses, each with how the refusal names it.
fn refused_scales() -> Vec<(f32, &'static str)> {
    vec![
        (f32::NAN, "is NaN (not a number)"),
        (f32::INFINITY, "is inf (infinite)"),
        (f32::NEG_INFINITY, "is -inf (infinite)"),
        (0.0, "is 0 (zero)"),
        (-0.0, "is -0 (zero)"),
        (-0.5, "is -0.5 (negative)"),
        (1e-40, "is 1e-40 (a subnormal float)"),
    ]
}

fn assert_refused(e: &ptefs::error::Error, index: usize, said: &str) {
    let m = e.to_string();
    assert_eq!(e.errno(), libc::EINVAL, "{m}");
    for part in [
        format!("{FILTER} (qcint8[4,3,3,2]) reads these bytes as its scales"),
        format!("scale {index} {said}"),
        "XNNPACK accepts only positive normal floats".to_string(),
    ] {
        assert!(m.contains(&part), "{m}\nlacks: {part}");
    }
}

/// Every route that writes the scale blob's bytes raw refuses each value XNNPACK refuses, and
/// leaves the files as they were; a positive normal scale goes through.
#[test]
fn scales_xnnpack_refuses_are_refused_through_every_raw_route() {
    let c = copy();
    let before = std::fs::read(&c.model).unwrap();
    let fs = open(&c);
    let (key, segment, old) = scale_key(&fs);
    let scales = f32_le(&old);
    assert_eq!(scales.len(), 4);
    let weights = read(&fs, "weights.safetensors");
    let (header, _) = common::safetensors::split(&weights);
    assert_eq!(header[&key]["dtype"], "F32", "{header:?}");
    for (index, (bad, said)) in refused_scales().into_iter().enumerate() {
        let index = index % 4;
        let mut new = scales.clone();
        new[index] = bad;
        let bytes = f32s(&new);
        let e = replace(&fs, &format!("named_data/{key}.bin"), &bytes).unwrap_err();
        assert_refused(&e, index, said);
        let e = replace(&fs, &format!("segments/{segment}"), &bytes).unwrap_err();
        assert_refused(&e, index, said);
        let update = common::safetensors::build(&[(&key, "F32", vec![4], bytes.clone())]);
        let e = replace(&fs, "weights.safetensors", &update).unwrap_err();
        assert_refused(&e, index, said);
        assert_eq!(std::fs::read(&c.model).unwrap(), before, "{bad}");
    }
    // A blob of another size re-lays the file out: refused the same way.
    let mut longer = f32s(&[1.0, f32::NAN, 1.0, 1.0]);
    longer.extend_from_slice(&[0; 16]);
    let e = replace(&fs, &format!("named_data/{key}.bin"), &longer).unwrap_err();
    assert_refused(&e, 1, "is NaN (not a number)");
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
    // Scales XNNPACK accepts are written.
    let good = f32s(&[0.5, 0.25, f32::MIN_POSITIVE, 3.0e38]);
    replace(&fs, &format!("named_data/{key}.bin"), &good).unwrap();
    assert_eq!(read(&fs, &format!("named_data/{key}.bin")), good);
}

/// A delegate payload rewritten whole is decoded, and the scales its graph holds itself (a
/// per-tensor scale, inline in the flatbuffer) are checked the same way.
#[test]
fn a_rewritten_payload_with_a_refused_inline_scale_is_refused() {
    let (model, data) = fixture_files(&fixtures_dir().join("extra/xnn_qs8_linear.pte.json"));
    let c = copy_files(&model, &data);
    let before = std::fs::read(&c.model).unwrap();
    let fs = open(&c);
    let payload = read(&fs, "plans/forward/delegates/0/processed.bin");
    // The qint8 filter's per-tensor scale: the `scale` field of its PerTensorQuant table.
    let filter = common::walk(&fs)
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| p.contains("/xnnpack/values/") && p.ends_with(".json"))
        .map(|p| (p.clone(), json(&fs, &p)))
        .find(|(_, j)| j["datatype"] == "qint8" && j["constant"].is_object())
        .expect("a qint8 constant");
    let scale = filter.1["quant"]["scale"].as_f64().unwrap() as f32;
    let at: Vec<usize> = payload
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == scale.to_le_bytes())
        .map(|(i, _)| i)
        .collect();
    assert!(!at.is_empty(), "scale {scale} not found in the payload");
    for &i in &at {
        let mut bad = payload.clone();
        bad[i..i + 4].copy_from_slice(&0.0f32.to_le_bytes());
        let e = replace(&fs, "plans/forward/delegates/0/processed.bin", &bad).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("reads these bytes as its scales: scale 0 is 0 (zero)"),
            "{m}"
        );
    }
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

fn check(model: &Path) -> (bool, String) {
    let out = run(Command::new(BIN).arg("check").arg(model));
    (out.status.success(), text(&out.stdout))
}

/// `ptefs check` reports stored scales XNNPACK refuses, with the value and the index.
#[test]
fn check_reports_stored_scales_xnnpack_refuses() {
    let c = copy();
    let fs = open(&c);
    let json = json(&fs, &format!("{FILTER}.json"));
    let at = json["quant"]["scales"]["file_offset"].as_u64().unwrap() as usize;
    drop(fs);
    assert!(check(&c.model).0);
    for (index, (bad, said)) in refused_scales().into_iter().enumerate() {
        let index = index % 4;
        let mut bytes = std::fs::read(&c.model).unwrap();
        let original = bytes.clone();
        bytes[at + 4 * index..at + 4 * index + 4].copy_from_slice(&bad.to_le_bytes());
        std::fs::write(&c.model, &bytes).unwrap();
        let (ok, out) = check(&c.model);
        assert!(!ok, "{out}");
        let line = format!(
            "plan 0 (\"forward\") delegate 0 (XnnpackBackend): value %3 (qcint8[4,3,3,2]) scales: scale {index} {said}: XNNPACK accepts only positive normal floats as scales"
        );
        assert!(out.contains(&line), "{out}\nlacks: {line}");
        std::fs::write(&c.model, &original).unwrap();
    }
}

/// `ptefs apply` refuses an update that gives a scale XNNPACK refuses, saying which, and
/// writes nothing.
#[test]
fn apply_refuses_refused_scales() {
    let c = copy();
    let fs = open(&c);
    let (key, _, old) = scale_key(&fs);
    drop(fs);
    let before = std::fs::read(&c.model).unwrap();
    let mut new = f32_le(&old);
    new[2] = f32::NAN;
    let update = c.root.join("update.safetensors");
    std::fs::write(
        &update,
        common::safetensors::build(&[(&key, "F32", vec![4], f32s(&new))]),
    )
    .unwrap();
    let out = run(Command::new(BIN).arg("apply").arg(&c.model).arg(&update));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "{FILTER} (qcint8[4,3,3,2]) reads these bytes as its scales: scale 2 is NaN"
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

/// The `.f32.npy` of `path` as float32 values (a version 1.0 header).
fn npy_f32(bytes: &[u8]) -> Vec<f32> {
    let header = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    f32_le(&bytes[10 + header..])
}

fn f32_npy(dims: &[u64], values: &[f32]) -> Vec<u8> {
    let shape: Vec<String> = dims.iter().map(u64::to_string).collect();
    let mut dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}",
        shape.join(", ")
    );
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(&f32s(values));
    out
}

/// Zeroing one output channel of the qc8 filter (its `.f32.npy` read back, one channel set
/// to zero, written again): no channel's scale needs to change, so every scale and every
/// bias integer stays byte for byte what it was, the zeroed channel's bias included (it
/// once became coarse: 0.0867 → 0.0911), and only the zeroed weights change.
#[test]
fn zeroing_a_channel_keeps_every_bias_and_scale_exact() {
    let c = copy();
    let fs = open(&c);
    let filter = json(&fs, &format!("{FILTER}.json"));
    let bias = json(&fs, &format!("{BIAS}.json"));
    let dims: Vec<u64> = filter["dims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    assert_eq!(dims, [4, 3, 3, 2]);
    let (key, _, scales) = scale_key(&fs);
    let bias_key = bias["constant"]["named_key"].as_str().unwrap().to_string();
    let bias_scale_key = bias["quant"]["scales"]["named_key"]
        .as_str()
        .unwrap()
        .to_string();
    let named = |k: &str| read(&fs, &format!("named_data/{k}.bin"));
    let (bias_bytes, bias_scales) = (named(&bias_key), named(&bias_scale_key));
    let bias_f32 = npy_f32(&read(&fs, &format!("{BIAS}.f32.npy")));
    let weights = read(&fs, &format!("{FILTER}.bin"));
    let mut values = npy_f32(&read(&fs, &format!("{FILTER}.f32.npy")));
    let per_channel = values.len() / 4;
    for zeroed in 0..4 {
        let mut v = values.clone();
        v[zeroed * per_channel..(zeroed + 1) * per_channel].fill(0.0);
        replace(&fs, &format!("{FILTER}.f32.npy"), &f32_npy(&dims, &v)).unwrap();
        assert_eq!(named(&key), scales, "channel {zeroed}: the scales changed");
        assert_eq!(
            named(&bias_key),
            bias_bytes,
            "channel {zeroed}: the bias changed"
        );
        assert_eq!(named(&bias_scale_key), bias_scales, "channel {zeroed}");
        assert_eq!(
            npy_f32(&read(&fs, &format!("{BIAS}.f32.npy"))),
            bias_f32,
            "channel {zeroed}"
        );
        let now = read(&fs, &format!("{FILTER}.bin"));
        for (i, (a, b)) in weights.iter().zip(&now).enumerate() {
            if i / per_channel == zeroed {
                assert_eq!(*b, 0, "channel {zeroed} byte {i}");
            } else {
                assert_eq!(a, b, "channel {zeroed} byte {i}");
            }
        }
        // Put the channel back: the file is as it was.
        replace(&fs, &format!("{FILTER}.f32.npy"), &f32_npy(&dims, &values)).unwrap();
        assert_eq!(read(&fs, &format!("{FILTER}.bin")), weights);
    }
    // A channel whose values need a larger scale gets a fresh one, and its bias follows.
    values[0] *= 4.0;
    values[1..per_channel].fill(0.0);
    replace(&fs, &format!("{FILTER}.f32.npy"), &f32_npy(&dims, &values)).unwrap();
    let now = f32_le(&named(&key));
    let old = f32_le(&scales);
    assert_ne!(now[0], old[0]);
    assert_eq!(now[1..], old[1..]);
    assert_ne!(named(&bias_key)[..4], bias_bytes[..4]);
    assert_eq!(named(&bias_key)[4..], bias_bytes[4..]);
}
