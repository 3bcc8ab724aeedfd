//! `ptefs diff`, run as the binary a user runs, on the fixtures and on copies of them with
//! known changes: identical copies, an edited tensor (bytes, values and the metrics computed
//! here from the arrays), a re-quantized 4-bit weight (metrics checked against NumPy),
//! quantization schemes that changed, a model against a safetensors checkpoint (the export's
//! fidelity in miniature), `.ptd` against `.ptd`, program-level differences, and the exit
//! statuses of trouble.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use common::mount::{run, text, BIN};
use common::safetensors::build as safetensors;
use common::{copy_fixture, fixture_files, fixtures_dir, manifests, open, replace, Copied};

/// `ptefs <args>`: exit status, stdout, stderr.
fn ptefs(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    for a in args {
        cmd.arg(a);
    }
    let out = run(&mut cmd);
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `ptefs diff A B --data-a … --data-b … [extra]`.
fn diff(
    a: &Path, data_a: &[PathBuf], b: &Path, data_b: &[PathBuf], extra: &[&str],
) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("diff").arg(a).arg(b);
    for d in data_a {
        cmd.arg("--data-a").arg(d);
    }
    for d in data_b {
        cmd.arg("--data-b").arg(d);
    }
    cmd.args(extra);
    let out = run(&mut cmd);
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `diff … --json`, parsed.
fn diff_json(a: &Path, data_a: &[PathBuf], b: &Path, data_b: &[PathBuf]) -> (i32, Value) {
    let (code, out, err) = diff(a, data_a, b, data_b, &["--json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!(v["version"], 1);
    (code, v)
}

fn copied_json(a: &Copied, b: &Copied) -> (i32, Value) {
    diff_json(&a.model, &a.data, &b.model, &b.data)
}

/// The tensor entries of a report whose status is `status`.
fn with_status<'v>(v: &'v Value, status: &str) -> Vec<&'v Value> {
    v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == status)
        .collect()
}

/// Little-endian float32 values.
fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// max abs, mean abs, cosine and NMSE (against `b`) of two arrays, in f64.
fn metrics(a: &[f32], b: &[f32]) -> [f64; 4] {
    let (mut max, mut sum, mut dot, mut aa, mut bb, mut sq) = (0f64, 0f64, 0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        max = max.max((x - y).abs());
        sum += (x - y).abs();
        dot += x * y;
        aa += x * x;
        bb += y * y;
        sq += (x - y) * (x - y);
    }
    [
        max,
        sum / a.len() as f64,
        dot / (aa.sqrt() * bb.sqrt()),
        sq / bb,
    ]
}

fn assert_metrics(m: &Value, want: [f64; 4], elements: usize) {
    assert_eq!(m["elements"], elements as u64, "{m}");
    assert_eq!(m["nonfinite"], 0, "{m}");
    for (field, w) in ["max_abs", "mean_abs", "cosine", "nmse"].iter().zip(want) {
        let got = m[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} in {m}"));
        assert!(
            (got - w).abs() <= 1e-9 + 1e-6 * w.abs(),
            "{field}: got {got}, expected {w} ({m})"
        );
    }
}

/// The bytes of `path` in the tree of `c`, read with `ptefs cat`.
fn cat(c: &Copied, path: &str) -> Vec<u8> {
    let mut cmd = Command::new(BIN);
    cmd.arg("cat").arg(&c.model).arg(path);
    for d in &c.data {
        cmd.arg("--data").arg(d);
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "{path}: {}", text(&out.stderr));
    out.stdout
}

/// The float32 values of an `.npy` (a header, then little-endian float32).
fn npy_floats(npy: &[u8]) -> Vec<f32> {
    let hlen = u16::from_le_bytes([npy[8], npy[9]]) as usize;
    floats(&npy[10 + hlen..])
}

#[test]
fn every_fixture_is_identical_to_its_copy() {
    for manifest in manifests() {
        let (model, data) = fixture_files(&manifest);
        let c = common::copy_files(&model, &data);
        let (code, v) = diff_json(&model, &data, &c.model, &c.data);
        let name = model.display();
        assert_eq!(code, 0, "{name}: {v}");
        assert_eq!(v["identical"], true, "{name}");
        let s = &v["summary"];
        assert_eq!(s["changed"], 0, "{name}");
        assert_eq!(s["only_in_a"], 0, "{name}");
        assert_eq!(s["only_in_b"], 0, "{name}");
        assert_eq!(s["paired"], v["a"]["tensors"], "{name}");
        assert_eq!(s["bytes_differ"], 0, "{name}");
        assert_eq!(v["program"]["same"], true, "{name}");
        // Every pair was made by a name or a value index or a position, and says which.
        for t in v["tensors"].as_array().unwrap() {
            assert_eq!(t["status"], "identical", "{name}: {t}");
            assert!(t["paired_by"].is_string(), "{name}: {t}");
        }
    }
}

#[test]
fn the_text_says_identical_and_counts() {
    let c = copy_fixture("linear_ext.pte");
    let (code, out, _) = diff(&c.model, &c.data, &c.model, &c.data, &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("tensors: 3 paired (by name 2, by value index 1), 3 identical, 0 changed"),
        "{out}"
    );
    assert!(out.ends_with("identical\n"), "{out}");
}

/// An edited copy: `lin.weight` changed in three elements, written with `ptefs apply`.
#[test]
fn an_edited_tensor_is_the_one_change_with_its_bytes_and_metrics() {
    let a = copy_fixture("linear_ext.pte");
    let b = copy_fixture("linear_ext.pte");
    let old = floats(&cat(&a, "plans/forward/values/0.bin"));
    let mut new = old.clone();
    new[0] += 0.5;
    new[5] = -new[5];
    new[11] *= 1.25;
    let update = b.root.join("update.safetensors");
    std::fs::write(
        &update,
        safetensors(&[("lin.weight", "F32", vec![3, 4], f32_bytes(&new))]),
    )
    .unwrap();
    let (code, _, err) = ptefs(&[&"apply", &b.model, &update, &"--data", &b.data[0]]);
    assert_eq!(code, 0, "{err}");

    let (code, v) = copied_json(&a, &b);
    assert_eq!(code, 1);
    assert_eq!(v["identical"], false);
    assert_eq!(v["summary"]["changed"], 1);
    assert_eq!(v["summary"]["identical"], 2);
    assert_eq!(v["program"]["same"], true);
    let changed = with_status(&v, "changed");
    let t = changed[0];
    assert_eq!(t["paired_by"], "name");
    assert_eq!(t["a"]["name"], "lin.weight");
    assert_eq!(t["a"]["path"], "plans/forward/values/0");
    assert_eq!(t["changes"], serde_json::json!([]));
    let differ = f32_bytes(&old)
        .iter()
        .zip(f32_bytes(&new))
        .filter(|(x, y)| **x != *y)
        .count();
    assert_eq!(t["bytes_differ"], differ as u64);
    assert_metrics(&t["metrics"], metrics(&old, &new), 12);
    assert_eq!(v["summary"]["bytes_differ"], differ as u64);

    // The text leads with the change.
    let (_, out, _) = diff(&a.model, &a.data, &b.model, &b.data, &[]);
    let first = out.lines().nth(3).unwrap();
    assert!(
        first.starts_with("  plans/forward/values/0 (by name): F32[3,4]; ")
            && first.contains(&format!("{differ} of 48 bytes differ")),
        "{out}"
    );

    // The data files alone: the key changed, paired by name.
    let (code, v) = diff_json(&a.data[0], &[], &b.data[0], &[]);
    assert_eq!(code, 1);
    let changed = with_status(&v, "changed");
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0]["a"]["path"], "named_data/lin.weight");
    assert_metrics(&changed[0]["metrics"], metrics(&old, &new), 12);
    assert!(v["program"]["plans"].as_array().unwrap().is_empty());
}

/// A `python3` with NumPy, unless the tests are told to run without one.
fn numpy() -> Option<&'static str> {
    let found = ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import numpy"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() && std::env::var_os("PTEFS_TESTS_WITHOUT_PYTHON").is_none() {
        panic!("these tests need a python3 with NumPy (or PTEFS_TESTS_WITHOUT_PYTHON=1)");
    }
    found
}

/// A re-quantized copy: one 4-bit weight's float view written back scaled, which gives it
/// fresh group scales. The metrics match NumPy's on the two float views.
#[test]
fn a_requantized_weight_is_compared_on_its_dequantized_values() {
    let a = copy_fixture("llama_8da4w.pte");
    let b = copy_fixture("llama_8da4w.pte");
    let view = "plans/forward/delegates/4/xnnpack/values/2.f32.npy";
    let old_npy = cat(&a, view);
    let hlen = 10 + u16::from_le_bytes([old_npy[8], old_npy[9]]) as usize;
    let scaled: Vec<f32> = npy_floats(&old_npy)
        .iter()
        .enumerate()
        .map(|(i, v)| v * if i % 3 == 0 { 1.3 } else { 0.9 })
        .collect();
    let mut npy = old_npy[..hlen].to_vec();
    npy.extend(f32_bytes(&scaled));
    {
        let fs = open(&b, false);
        replace(&fs, view, &npy).unwrap();
    }
    let new_npy = cat(&b, view);
    assert_ne!(new_npy, old_npy);

    let (code, v) = copied_json(&a, &b);
    assert_eq!(code, 1);
    assert_eq!(v["summary"]["changed"], 1, "{}", v["summary"]);
    let t = with_status(&v, "changed")[0];
    assert_eq!(t["a"]["path"], "plans/forward/delegates/4/xnnpack/values/2");
    assert_eq!(t["paired_by"], "name");
    assert_eq!(t["a"]["dtype"], "qbint4");
    assert_eq!(t["a"]["scheme"], "groups of 32, bf16 scales");
    assert_eq!(t["a"]["nbytes"], 8192 + 1024);
    assert!(t["bytes_differ"].as_u64().unwrap() > 0);
    let want = metrics(&npy_floats(&old_npy), &npy_floats(&new_npy));
    assert_metrics(&t["metrics"], want, 256 * 64);

    // NumPy's own figures from the two views.
    let Some(python) = numpy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (dir.path().join("a.npy"), dir.path().join("b.npy"));
    std::fs::write(&pa, &old_npy).unwrap();
    std::fs::write(&pb, &new_npy).unwrap();
    let out = Command::new(python)
        .arg("-c")
        .arg(
            "import sys, json, numpy as np
a = np.load(sys.argv[1]).astype(np.float64).ravel(); b = np.load(sys.argv[2]).astype(np.float64).ravel()
d = a - b
print(json.dumps([float(np.abs(d).max()), float(np.abs(d).mean()),
    float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))), float((d @ d) / (b @ b))]))",
        )
        .arg(&pa)
        .arg(&pb)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let numpy: Vec<f64> = serde_json::from_slice(&out.stdout).unwrap();
    assert_metrics(&t["metrics"], numpy.try_into().unwrap(), 256 * 64);
}

/// Two exports of the same shapes with other 4-bit schemes: weights pair by their place in
/// the delegate when their keys differ, and say what changed.
#[test]
fn a_changed_quantization_scheme_pairs_by_position_and_is_compared_dequantized() {
    let (a, da) = fixture_files(&fixtures_dir().join("llama_8da4w.pte.json"));
    let (b, db) = fixture_files(&fixtures_dir().join("llama_qc4.pte.json"));
    let (code, v) = diff_json(&a, &da, &b, &db);
    assert_eq!(code, 1);
    let by_position: Vec<&Value> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["paired_by"] == "delegate_position")
        .collect();
    assert!(!by_position.is_empty());
    for t in by_position {
        assert_eq!(t["a"]["shape"], t["b"]["shape"], "{t}");
        assert_eq!(t["changes"], serde_json::json!(["dtype", "scheme"]), "{t}");
        assert_eq!(t["a"]["dtype"], "qbint4");
        assert_eq!(t["b"]["dtype"], "qcint4");
        assert_eq!(t["b"]["scheme"], "per channel, fp32 scales");
        assert!(t["bytes_differ"].is_null(), "{t}");
        let shape: Vec<u64> = serde_json::from_value(t["a"]["shape"].clone()).unwrap();
        assert_eq!(t["metrics"]["elements"], shape.iter().product::<u64>());
        // The two delegates' tensors that are in another order are never guessed at.
        assert_eq!(t["a"]["path"], t["b"]["path"]);
    }
    // Shapes at a position that differ are left alone.
    assert_eq!(v["summary"]["only_in_a"], v["summary"]["only_in_b"]);
    let plans = v["program"]["plans"].as_array().unwrap();
    let forward = plans.iter().find(|p| p["name"] == "forward").unwrap();
    assert!(forward["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["same"] == false));
    // The constant methods are the same in both.
    assert!(plans
        .iter()
        .filter(|p| p["name"] != "forward")
        .all(|p| p["same"] == true));
}

/// A model against a safetensors checkpoint named with the model's own names: each weight
/// compared after dequantizing, the checkpoint as the reference.
#[test]
fn a_model_against_a_checkpoint_shows_the_error_of_every_weight_it_names() {
    let c = copy_fixture("linear_ext.pte");
    let weight = floats(&cat(&c, "plans/forward/values/0.bin"));
    let bias = floats(&cat(&c, "plans/forward/values/1.bin"));
    // The checkpoint: the weight at full precision slightly off, the bias in float16.
    let reference: Vec<f32> = weight.iter().map(|w| w * 1.001 + 0.0001).collect();
    let half: Vec<u8> = bias
        .iter()
        .flat_map(|b| ptefs::backend::float16::f32_to_f16(*b).to_le_bytes())
        .collect();
    let halves: Vec<f32> = half
        .chunks_exact(2)
        .map(|h| ptefs::backend::float16::f16_to_f32(u16::from_le_bytes([h[0], h[1]])))
        .collect();
    let ck = c.root.join("checkpoint.safetensors");
    std::fs::write(
        &ck,
        safetensors(&[
            ("lin.weight", "F32", vec![3, 4], f32_bytes(&reference)),
            ("lin.bias", "F16", vec![3], half),
            ("lin.extra", "F32", vec![2], f32_bytes(&[1.0, 2.0])),
        ]),
    )
    .unwrap();
    let (code, v) = diff_json(&c.model, &c.data, &ck, &[]);
    assert_eq!(code, 1);
    assert_eq!(v["b"]["kind"], "safetensors");
    assert!(v["program"].is_null());
    let changed = with_status(&v, "changed");
    assert_eq!(changed.len(), 2);
    let by_name = |n: &str| *changed.iter().find(|t| t["a"]["name"] == n).unwrap();
    let w = by_name("lin.weight");
    assert_eq!(w["paired_by"], "name");
    assert_metrics(&w["metrics"], metrics(&weight, &reference), 12);
    let b = by_name("lin.bias");
    assert_eq!(b["changes"], serde_json::json!(["dtype"]));
    assert_eq!(b["b"]["dtype"], "F16");
    assert!(b["bytes_differ"].is_null());
    assert_metrics(&b["metrics"], metrics(&bias, &halves), 3);
    let only_b = with_status(&v, "only_in_b");
    assert_eq!(only_b.len(), 1);
    assert_eq!(only_b[0]["b"]["name"], "lin.extra");
    // The scalar constant has no name the checkpoint could use.
    let only_a = with_status(&v, "only_in_a");
    assert_eq!(only_a.len(), 1);
    assert_eq!(only_a[0]["a"]["path"], "plans/forward/values/2");

    // A checkpoint keyed by a 4-bit weight's named-data key, holding float values: the
    // quantized weight's error against it, as a map from `ptefs names` would pair it.
    let q = copy_fixture("llama_8da4w.pte");
    let view = "plans/forward/delegates/1/xnnpack/values/2";
    let stored = npy_floats(&cat(&q, &format!("{view}.f32.npy")));
    let json: Value = serde_json::from_slice(&cat(&q, &format!("{view}.json"))).unwrap();
    let key = json["constant"]["named_key"].as_str().unwrap();
    let float: Vec<f32> = stored
        .iter()
        .enumerate()
        .map(|(i, v)| v + ((i % 7) as f32 - 3.0) * 1e-3)
        .collect();
    let ck = q.root.join("float.safetensors");
    std::fs::write(
        &ck,
        safetensors(&[(key, "F32", vec![64, 64], f32_bytes(&float))]),
    )
    .unwrap();
    let (code, v) = diff_json(&q.model, &q.data, &ck, &[]);
    assert_eq!(code, 1);
    let changed = with_status(&v, "changed");
    assert_eq!(changed.len(), 1, "{}", v["summary"]);
    let t = changed[0];
    assert_eq!(t["a"]["path"], view);
    assert_eq!(t["changes"], serde_json::json!(["dtype", "scheme"]));
    assert_metrics(&t["metrics"], metrics(&stored, &float), 64 * 64);
}

#[test]
fn methods_operators_delegates_and_alignment_are_compared() {
    let dir = fixtures_dir();
    let (code, v) = diff_json(
        &dir.join("add_mul.pte"),
        &[],
        &dir.join("two_methods.pte"),
        &[],
    );
    assert_eq!(code, 1);
    let manifest = |f: &str| common::load_json(&dir.join(format!("{f}.json")));
    let ops = |m: &Value, plan: &str| -> std::collections::BTreeSet<String> {
        m["plans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == plan)
            .map(|p| {
                p["operators"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| {
                        format!(
                            "{}.{}",
                            o["name"].as_str().unwrap(),
                            o["overload"].as_str().unwrap()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (ma, mb) = (manifest("add_mul.pte"), manifest("two_methods.pte"));
    for plan in v["program"]["plans"].as_array().unwrap() {
        let name = plan["name"].as_str().unwrap();
        let (oa, ob) = (ops(&ma, name), ops(&mb, name));
        if plan["a"].is_null() || plan["b"].is_null() {
            assert_eq!(plan["same"], false);
            continue;
        }
        let added: Vec<String> = ob.difference(&oa).cloned().collect();
        let removed: Vec<String> = oa.difference(&ob).cloned().collect();
        assert_eq!(plan["operators_added"], serde_json::json!(added), "{name}");
        assert_eq!(
            plan["operators_removed"],
            serde_json::json!(removed),
            "{name}"
        );
    }
    // Segments at 4096 against ExecuTorch's default alignment.
    let (_, v) = diff_json(
        &dir.join("linear_xnnpack.pte"),
        &[],
        &dir.join("extra/seg4096.pte"),
        &[],
    );
    let f = &v["program"]["files"][0];
    assert_eq!(f["b"]["segment_alignment"], 4096, "{f}");
    assert!(f["a"]["segment_alignment"].as_u64().unwrap() < 4096, "{f}");
    assert_eq!(f["same"], false);
}

#[test]
fn trouble_exits_2_with_a_message() {
    let dir = fixtures_dir();
    let pte = dir.join("linear.pte");
    let (code, _, err) = ptefs(&[&"diff", &pte, &dir.join("no-such.pte")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no-such.pte") && err.contains("cannot open"),
        "{err}"
    );
    let (code, _, err) = ptefs(&[&"diff", &pte, &dir.join("README.md")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("neither an ExecuTorch file") && err.contains("nor a safetensors checkpoint"),
        "{err}"
    );
    let (code, _, err) = ptefs(&[&"diff", &pte, &pte, &"--names", &"no-such-map.json"]);
    assert_eq!(code, 2);
    assert!(err.contains("no-such-map.json"), "{err}");
    let (code, _, err) = ptefs(&[&"diff", &pte, &pte, &"--data-a", &pte]);
    assert_eq!(code, 2);
    assert!(err.contains("a .ptd (identifier FT01)"), "{err}");
}

/// Distinct tensors stored once (three zero biases on one constant buffer) are each
/// compared; a change to one of them in a copy is that tensor's change alone.
#[test]
fn distinct_tensors_on_shared_bytes_are_each_listed() {
    let a = copy_fixture("extra/zero_biases.pte");
    let (_, v) = copied_json(&a, &a);
    let manifest = common::load_json(&fixtures_dir().join("extra/zero_biases.pte.json"));
    let constants = manifest["plans"][0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["data"] == "constant")
        .count();
    assert_eq!(v["summary"]["paired"], constants as u64);
    assert_eq!(v["summary"]["identical"], constants as u64);
}
