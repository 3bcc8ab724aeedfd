//! Where the bytes go (`ptefs info --sizes`, `sizes.txt` and `sizes.json` at the root of a
//! tree), and the JSON of `info` and `check`: on every fixture, the classes partition each
//! file and the weights are the bytes of the tensors; on copies with known changes, bytes
//! stored twice are found and data files the program does not read are told apart.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;

use common::mount::{run, text, BIN};
use common::safetensors::{build as safetensors, tensor};
use common::{copy_fixture, fixture_files, fixtures_dir, load_json, manifests, read_all};
use ptefs::catalog::Catalog;
use ptefs::format::layout::Location;
use ptefs::format::Model;
use ptefs::fs::{Fs, Options};
use ptefs::sizes::{Class, Sizes};
use ptefs::tree::Tree;

/// `ptefs <args> [--data …]`: exit status, stdout, stderr.
fn ptefs(args: &[&str], file: &Path, data: &[PathBuf]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg(args[0]).arg(file).args(&args[1..]);
    for d in data {
        cmd.arg("--data").arg(d);
    }
    let out = run(&mut cmd);
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

fn json_of(args: &[&str], file: &Path, data: &[PathBuf]) -> (i32, Value) {
    let (code, out, err) = ptefs(args, file, data);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!(v["version"], 1);
    (code, v)
}

/// The number of bytes in the union of `ranges`.
fn union_len(mut ranges: Vec<Location>) -> u64 {
    ranges.sort_by_key(|l| (l.file, l.range.start()));
    let mut total = 0;
    let mut cur: Option<(usize, u64, u64)> = None;
    for l in ranges {
        let (s, e) = (l.range.start(), l.range.end());
        match &mut cur {
            Some((f, _, end)) if *f == l.file && s <= *end => *end = (*end).max(e),
            _ => {
                if let Some((_, a, b)) = cur {
                    total += b - a;
                }
                cur = Some((l.file, s, e));
            }
        }
    }
    total + cur.map_or(0, |(_, a, b)| b - a)
}

#[test]
fn every_byte_of_every_fixture_is_counted_once() {
    for manifest in manifests() {
        let (file, data) = fixture_files(&manifest);
        let name = file.display().to_string();
        let catalog = Catalog::of(Arc::new(Model::open(&file, &data).unwrap()));
        let sizes = Sizes::of(&catalog).unwrap();
        let model = &catalog.model;
        let mut total = 0;
        for (f, file) in sizes.files.iter().zip(&model.files) {
            assert_eq!(f.bytes.total(), file.len(), "{name}: {}", f.name);
            total += file.len();
            for seg in &f.segments {
                assert_eq!(
                    seg.bytes.total(),
                    seg.range.len(),
                    "{name}: segment {}",
                    seg.index
                );
                let unused = seg.bytes.get(Class::Unused) == seg.range.len();
                assert_eq!(
                    unused && !seg.range.is_empty(),
                    seg.role == "unreferenced" && !seg.range.is_empty(),
                    "{name}: {seg:?}"
                );
            }
        }
        assert_eq!(sizes.total.total(), total, "{name}");
        // Weights are the bytes of the tensors and their scales, each byte once.
        let tensors = ptefs::catalog::tensors::of(&catalog);
        let ranges: Vec<Location> = tensors
            .iter()
            .flat_map(|t| std::iter::once(t.data).chain(t.scales))
            .collect();
        assert_eq!(sizes.total.get(Class::Weights), union_len(ranges), "{name}");
        assert_eq!(sizes.tensors, tensors.len(), "{name}");
        let kinds: usize = sizes.kinds.iter().map(|k| k.tensors).sum();
        assert_eq!(kinds, tensors.len(), "{name}");
        for u in &sizes.data_use {
            assert!(
                u.used_keys <= u.keys && u.used_bytes <= u.bytes,
                "{name}: {u:?}"
            );
        }
        assert!(sizes.largest.windows(2).all(|w| w[0].nbytes >= w[1].nbytes));
    }
}

#[test]
fn a_small_model_accounted_by_hand() {
    let (file, data) = fixture_files(&fixtures_dir().join("linear_ext.pte.json"));
    let (code, v) = json_of(&["info", "--sizes", "--json"], &file, &data);
    assert_eq!(code, 0);
    let m = load_json(&fixtures_dir().join("linear_ext.pte.json"));
    let d = load_json(&fixtures_dir().join("linear_ext.ptd.json"));
    // 4 bytes of the scalar constant, 48 + 12 of lin.weight and lin.bias.
    assert_eq!(v["classes"]["weights"], 64);
    let size = m["size"].as_u64().unwrap() + d["size"].as_u64().unwrap();
    assert_eq!(v["total"], size);
    let files = v["files"].as_array().unwrap();
    assert_eq!(files[0]["name"], "linear_ext.pte");
    assert_eq!(
        files[0]["classes"]["program"],
        m["header"]["extended"]["program_size"]
    );
    assert_eq!(files[1]["segments"][0]["role"], "named data \"lin.weight\"");
    assert_eq!(files[1]["segments"][0]["classes"]["weights"], 48);
    assert_eq!(v["data_use"][0]["used_keys"], 2);
    assert_eq!(v["data_use"][0]["used_bytes"], 60);
    assert_eq!(v["duplicates"]["groups"], serde_json::json!([]));
    assert_eq!(v["largest"][0]["path"], "plans/forward/values/0");
    assert_eq!(v["largest"][0]["nbytes"], 48);
}

/// A copy where `rope.freqs_sin` was given the bytes of `rope.freqs_cos`: two keys holding
/// equal bytes, stored twice.
#[test]
fn equal_bytes_in_two_places_are_found() {
    let c = copy_fixture("llama_8da4w.pte");
    let cat = |path: &str| {
        let mut cmd = Command::new(BIN);
        cmd.arg("cat").arg(&c.model).arg(path);
        for d in &c.data {
            cmd.arg("--data").arg(d);
        }
        let out = run(&mut cmd);
        assert!(out.status.success(), "{path}: {}", text(&out.stderr));
        out.stdout
    };
    let weights = cat("data/llama_8da4w/weights.safetensors");
    let cos = tensor(&weights, "rope.freqs_cos").to_vec();
    let update = c.root.join("update.safetensors");
    std::fs::write(
        &update,
        safetensors(&[("rope.freqs_sin", "F32", vec![128, 8], cos.clone())]),
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("apply").arg(&c.model).arg(&update);
    for d in &c.data {
        cmd.arg("--data").arg(d);
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let (_, v) = json_of(&["info", "--sizes", "--json"], &c.model, &c.data);
    let groups = v["duplicates"]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["nbytes"], cos.len() as u64);
    let copies: BTreeSet<&str> = groups[0]["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let json = |i: usize| -> Value {
        serde_json::from_slice(&cat(&format!("plans/forward/values/{i}.json"))).unwrap()
    };
    let by_name: BTreeSet<String> = (0..64)
        .map(json)
        .take_while(|j| !j.is_null())
        .filter(|j| {
            matches!(
                j["fully_qualified_name"].as_str(),
                Some("rope.freqs_cos" | "rope.freqs_sin")
            )
        })
        .map(|j| format!("plans/forward/values/{}", j["index"]))
        .collect();
    assert_eq!(copies, by_name.iter().map(String::as_str).collect());
    assert_eq!(v["duplicates"]["bytes_beyond_one_copy"], cos.len() as u64);
    let (_, out, _) = ptefs(&["info", "--sizes"], &c.model, &c.data);
    assert!(
        out.contains(
            "stored more than once: 1 contents in 2 copies, 4.0 KiB (4096 B) beyond one copy each:"
        ),
        "{out}"
    );
}

/// A data file attached beside the one the program reads: nothing of it is used.
#[test]
fn the_share_of_each_data_file_the_program_reads() {
    let (file, mut data) = fixture_files(&fixtures_dir().join("linear_ext.pte.json"));
    data.push(fixtures_dir().join("extra/zero_biases_ext.ptd"));
    let (_, v) = json_of(&["info", "--sizes", "--json"], &file, &data);
    let uses = v["data_use"].as_array().unwrap();
    assert_eq!(uses.len(), 2);
    assert_eq!(uses[0]["used_keys"], uses[0]["keys"]);
    assert_eq!(uses[1]["name"], "zero_biases_ext.ptd");
    assert_eq!(uses[1]["used_keys"], 0);
    assert_eq!(uses[1]["used_bytes"], 0);
    assert!(uses[1]["keys"].as_u64().unwrap() > 0);
    let (_, out, _) = ptefs(&["info", "--sizes"], &file, &data);
    assert!(out.contains("zero_biases_ext.ptd: 0 of "), "{out}");
    // The LoRA export reads all of both its data files.
    let (file, data) = fixture_files(&fixtures_dir().join("llama_lora.pte.json"));
    let (_, v) = json_of(&["info", "--sizes", "--json"], &file, &data);
    for u in v["data_use"].as_array().unwrap() {
        assert_eq!(u["used_keys"], u["keys"], "{u}");
    }
}

/// `sizes.txt` and `sizes.json` at the root of a tree hold what `info --sizes` prints.
#[test]
fn the_tree_shows_the_same_accounting_at_its_root() {
    for name in [
        "llama_8da4w.pte",
        "linear_ext.ptd",
        "extra/xnnpack_inline.pte",
    ] {
        let (file, data) = fixture_files(&fixtures_dir().join(format!("{name}.json")));
        let fs = Fs::new(
            Tree::build(Arc::new(Model::open(&file, &data).unwrap())),
            Options { read_only: true },
        );
        for (node, args) in [
            ("sizes.txt", vec!["info", "--sizes"]),
            ("sizes.json", vec!["info", "--sizes", "--json"]),
        ] {
            let ino = fs.tree().find(node).unwrap();
            let bytes = read_all(&fs, ino, 1000).unwrap();
            assert_eq!(fs.getattr(ino).unwrap().size, bytes.len() as u64);
            let (code, out, err) = ptefs(&args, &file, &data);
            assert_eq!(code, 0, "{err}");
            assert_eq!(text(&bytes), out, "{name}: {node}");
        }
    }
}

#[test]
fn info_json_has_every_plan_and_file() {
    for manifest in manifests() {
        let (file, data) = fixture_files(&manifest);
        let m = load_json(&manifest);
        let (code, v) = json_of(&["info", "--json"], &file, &data);
        let name = file.display().to_string();
        assert_eq!(code, 0, "{name}");
        assert_eq!(v["size"], m["size"], "{name}");
        if m["kind"] == "ptd" || v["kind"] == "ptd" {
            assert_eq!(v["kind"], "ptd");
            assert_eq!(
                v["holds"]["keys"].as_u64().unwrap() as usize,
                m["named_data"].as_array().unwrap().len(),
                "{name}"
            );
            continue;
        }
        assert_eq!(v["kind"], "pte", "{name}");
        let plans = m["plans"].as_array().unwrap();
        let got = v["plans"].as_array().unwrap();
        assert_eq!(got.len(), plans.len(), "{name}");
        for (g, p) in got.iter().zip(plans) {
            assert_eq!(g["name"], p["name"], "{name}");
            assert_eq!(
                g["values"].as_u64().unwrap() as usize,
                p["values"].as_array().unwrap().len(),
                "{name}"
            );
            assert_eq!(
                g["operators"].as_u64().unwrap() as usize,
                p["operators"].as_array().unwrap().len(),
                "{name}"
            );
            assert_eq!(
                g["inputs"].as_array().unwrap().len(),
                p["inputs"].as_array().unwrap().len(),
                "{name}"
            );
        }
        assert_eq!(
            v["segments"]["count"].as_u64().unwrap() as usize,
            m["segments"].as_array().unwrap().len(),
            "{name}"
        );
        assert_eq!(
            v["data_files"].as_array().unwrap().len(),
            data.len(),
            "{name}"
        );
    }
}

#[test]
fn check_json_names_each_defect_with_its_kind_and_place() {
    let c = copy_fixture("llama_8da4w.pte");
    let (code, v) = json_of(&["check", "--json"], &c.model, &c.data);
    assert_eq!(code, 0);
    assert_eq!(v["ok"], true);
    assert_eq!(v["defects"], serde_json::json!([]));
    // Without its data file: the EXTERNAL tensors, and every blob a delegate reads.
    let (code, v) = json_of(&["check", "--json"], &c.model, &[]);
    assert_eq!(code, 1);
    assert_eq!(v["ok"], false);
    let defects = v["defects"].as_array().unwrap();
    let (_, lines, _) = ptefs(&["check"], &c.model, &[]);
    assert_eq!(
        lines.lines().filter(|l| !l.contains("sits beside")).count(),
        defects.len()
    );
    assert_eq!(defects[0]["kind"], "external_unattached");
    assert_eq!(defects[0]["path"], "plans/forward/plan.json");
    assert_eq!(defects[0]["file"], c.model.display().to_string());
    let blobs: Vec<&Value> = defects
        .iter()
        .filter(|d| d["kind"] == "blob_missing")
        .collect();
    assert_eq!(blobs.len(), 16);
    assert_eq!(
        blobs[0]["path"],
        "plans/forward/delegates/0/xnnpack/values/4.json"
    );
    assert!(v["advice"][0].as_str().unwrap().contains("--data"));
}

/// Through a real mount: `sizes.txt` is what `info --sizes` prints; an in-place write keeps
/// the snapshot and so its accounting (content and size agree), and the next mount shows
/// what the write changed.
#[test]
fn a_mount_serves_the_accounting_of_its_snapshot() {
    if common::fuse_missing() {
        return;
    }
    let c = copy_fixture("llama_8da4w.pte");
    let mut m = common::mount::Mount::unmounted(c.dir, c.model, c.data, &[]);
    m.mount();
    let sizes = m.path("sizes.txt");
    let before = std::fs::read_to_string(&sizes).unwrap();
    let (_, printed, _) = ptefs(&["info", "--sizes"], &m.model, &m.data);
    assert_eq!(before, printed);
    assert!(
        before.contains("stored more than once: nothing"),
        "{before}"
    );
    let json: Value =
        serde_json::from_slice(&std::fs::read(m.path("sizes.json")).unwrap()).unwrap();
    assert_eq!(
        json["total"],
        json["files"][0]["size"].as_u64().unwrap() + json["files"][1]["size"].as_u64().unwrap()
    );

    let nd = "data/llama_8da4w/named_data";
    let cos = std::fs::read(m.path(&format!("{nd}/rope.freqs_cos.bin"))).unwrap();
    std::fs::write(m.path(&format!("{nd}/rope.freqs_sin.bin")), &cos).unwrap();
    let after = std::fs::read_to_string(&sizes).unwrap();
    assert_eq!(after, before);
    assert_eq!(std::fs::metadata(&sizes).unwrap().len(), after.len() as u64);

    m.remount();
    let remounted = std::fs::read_to_string(&sizes).unwrap();
    assert!(
        remounted.contains("stored more than once: 1 contents in 2 copies"),
        "{remounted}"
    );
}
