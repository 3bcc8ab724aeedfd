//! Updates by checkpoint name and float values for quantized constants
//! (docs/writes.md#updates-by-checkpoint-name, docs/writes.md#float-values-for-quantized-constants):
//! on the `names_*` fixtures and the checkpoints they were exported from. A write is checked
//! by learning the names again from the checkpoint that was written: every name must land
//! where the map said, under the same transform, within noise, which fails if any inverse
//! transform (rotary rows, axes orders) or any target of a tied tensor were wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ptefs::catalog::Catalog;
use ptefs::commands::{apply, names, ApplyRequest, NamesRequest};
use ptefs::format::Model;
use ptefs::names::map::Status;
use ptefs::names::{stored_tensors, Checkpoint, NameMap};

mod common;
use common::safetensors::build;
use common::{copy_files, Copied};

fn extra(name: &str) -> PathBuf {
    common::fixtures_dir().join("extra").join(name)
}

fn checkpoint(rel: &str) -> PathBuf {
    extra("checkpoints").join(rel)
}

/// A copy of fixture `name` (its model and data files) in a directory of its own.
fn copy(name: &str) -> Copied {
    let (file, data) = common::fixture_files(&extra(&format!("{name}.pte.json")));
    copy_files(&file, &data)
}

/// `ptefs names` of the copy from `from`, writing the map to `out` when given.
fn learn(c: &Copied, from: &[PathBuf], out: Option<&Path>) -> ptefs::error::Result<NameMap> {
    let req = NamesRequest {
        file: c.model.clone(),
        data: c.data.clone(),
        from: from.to_vec(),
        output: out.map(Path::to_path_buf),
        ..Default::default()
    };
    names(&req, &mut Vec::new())
}

/// `ptefs apply` of `update` to the copy, by the names `names` give (none: stored names);
/// the report, or the refusal's message.
fn apply_to(c: &Copied, update: &Path, names: &[PathBuf], dry_run: bool) -> Result<String, String> {
    let req = ApplyRequest {
        file: c.model.clone(),
        data: c.data.clone(),
        update: update.to_path_buf(),
        names: names.to_vec(),
        dry_run,
    };
    let mut out = Vec::new();
    match apply(&req, &mut out) {
        Ok(_) => Ok(String::from_utf8(out).unwrap()),
        Err(e) => Err(e.to_string()),
    }
}

/// Every tensor of a checkpoint: name, dtype, shape, bytes.
fn tensors_of(path: &Path) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let ck = Checkpoint::open(path).unwrap();
    ck.tensors
        .iter()
        .map(|t| {
            let b = ck.bytes(t).unwrap().to_vec();
            (t.name.clone(), t.dtype.to_string(), t.shape.clone(), b)
        })
        .collect()
}

/// Float values of a little-endian tensor, and back.
fn floats(dtype: &str, b: &[u8]) -> Vec<f32> {
    match dtype {
        "F32" => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "BF16" => b
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        other => panic!("{other}"),
    }
}

fn bytes_of(dtype: &str, v: &[f32]) -> Vec<u8> {
    match dtype {
        "F32" => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        // Truncation is fine: the values are what the checkpoint holds.
        "BF16" => v
            .iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        other => panic!("{other}"),
    }
}

/// A fine-tune of `ck`: every float tensor moved by a pattern of about `size` (never zero
/// for every element, different per tensor), in the checkpoint's own dtype; other tensors
/// as they are.
fn fine_tune(ck: &Path, size: f32, seed: u32) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    tensors_of(ck)
        .into_iter()
        .enumerate()
        .map(|(k, (name, dtype, shape, b))| {
            if dtype != "F32" && dtype != "BF16" {
                return (name, dtype, shape, b);
            }
            let v: Vec<f32> = floats(&dtype, &b)
                .iter()
                .enumerate()
                .map(|(i, x)| x + size * ((i as f32 * 0.7 + (k as u32 * 13 + seed) as f32).sin()))
                .collect();
            (name, dtype.clone(), shape, bytes_of(&dtype, &v))
        })
        .collect()
}

fn write(dir: &Path, file: &str, tensors: &[(String, String, Vec<u64>, Vec<u8>)]) -> PathBuf {
    let t: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    let path = dir.join(file);
    std::fs::write(&path, build(&t)).unwrap();
    path
}

/// (path, transform) of every target of every matched name.
fn placements(map: &NameMap) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for n in &map.names {
        if let Status::Matched { targets, .. } = &n.status {
            for t in targets {
                out.push((
                    n.name.clone(),
                    t.stored.path.clone(),
                    t.transform.to_string(),
                ));
            }
        }
    }
    out
}

/// Writes the fine-tune of `ck` to the copy of `fixture` by name and learns the names from
/// it again: every name found where the map put it, under the same transform.
fn round_trip(fixture: &str, ck: &Path, size: f32) {
    let c = copy(fixture);
    let map_path = c.root.join("names.json");
    let before = learn(&c, &[ck.to_path_buf()], Some(&map_path)).unwrap();
    let map_text = std::fs::read(&map_path).unwrap();
    let ft = write(&c.root, "ft.safetensors", &fine_tune(ck, size, 1));
    let report = apply_to(&c, &ft, std::slice::from_ref(&map_path), false).unwrap();
    let n = placements(&before).len();
    assert!(
        report.contains(&format!("{n} tensor(s) changed, 0 unchanged")),
        "{report}"
    );
    // The map now describes the files as written: it checks, and its digests changed.
    assert_ne!(std::fs::read(&map_path).unwrap(), map_text);
    let req = NamesRequest {
        file: c.model.clone(),
        data: c.data.clone(),
        map: Some(map_path.clone()),
        ..Default::default()
    };
    names(&req, &mut Vec::new()).unwrap();
    let after = learn(&c, &[ft], None).unwrap();
    assert_eq!(after.matched(), before.matched(), "{fixture}");
    assert_eq!(placements(&after), placements(&before), "{fixture}");
    // And not by chance: the old checkpoint no longer matches what is stored (float32
    // tensors stored as they are would otherwise still match).
    let old = learn(&c, &[ck.to_path_buf()], None);
    assert!(
        old.map_or(true, |m| m.matched() < before.matched()),
        "{fixture}: the old checkpoint still matches"
    );
}

#[test]
fn a_hugging_face_fine_tune_of_a_llama_lands_through_its_rotary_order() {
    round_trip("names_llama", &checkpoint("names_llama/hf"), 0.02);
}

#[test]
fn a_bfloat16_fine_tune_of_a_qwen_lands_at_both_places_of_its_tied_embedding() {
    let ck = checkpoint("names_qwen/hf");
    round_trip("names_qwen", &ck, 0.02);
    // Both places of the embedding are written, with --names learning from the checkpoint.
    let c = copy("names_qwen");
    let ft: Vec<_> = fine_tune(&ck, 0.02, 2)
        .into_iter()
        .filter(|t| t.0 == "model.embed_tokens.weight")
        .collect();
    let update = write(&c.root, "embed.safetensors", &ft);
    let report = apply_to(&c, &update, &[ck], true).unwrap();
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("would change\tmodel.embed_tokens.weight -> "))
        .collect();
    assert_eq!(lines.len(), 2, "{report}");
    assert!(report.contains("2 tensor(s) would change"), "{report}");
}

#[test]
fn filters_land_through_their_axes_and_a_folded_one_is_refused() {
    let ck = checkpoint("names_conv_bn/model.safetensors");
    let c = copy("names_conv_bn");
    let map_path = c.root.join("names.json");
    let before = learn(&c, std::slice::from_ref(&ck), Some(&map_path)).unwrap();
    let ft = fine_tune(&ck, 0.05, 3);
    let named: Vec<_> = ft
        .iter()
        .filter(|t| t.0.starts_with("dw.") || t.0.starts_with("pw."))
        .cloned()
        .collect();
    let update = write(&c.root, "ft.safetensors", &named);
    let report = apply_to(&c, &update, std::slice::from_ref(&map_path), false).unwrap();
    assert!(report.contains("4 tensor(s) changed"), "{report}");
    let after = learn(&c, &[update], None).unwrap();
    assert_eq!(placements(&after), placements(&before));
    assert!(placements(&after)
        .iter()
        .any(|(n, _, t)| n == "dw.weight" && t == "OIHW->IHWO"));

    // The folded filter and the BatchNorm's tensors name nothing: refused, each saying why.
    let err = apply_to(
        &c,
        &write(&c.root, "all.safetensors", &ft),
        &[map_path],
        false,
    )
    .unwrap_err();
    assert!(
        err.contains("\"conv.weight\": stored scaled per output channel"),
        "{err}"
    );
    assert!(
        err.contains("\"bn.running_var\": no stored tensor matched it"),
        "{err}"
    );
    assert!(
        err.contains("7 tensor(s) that cannot be written by name"),
        "{err}"
    );
}

#[test]
fn refusals_name_every_problem_and_write_nothing() {
    let ck = checkpoint("names_llama/hf");
    let c = copy("names_llama");
    let map_path = c.root.join("names.json");
    learn(&c, std::slice::from_ref(&ck), Some(&map_path)).unwrap();
    let files = |c: &Copied| -> Vec<Vec<u8>> {
        std::iter::once(&c.model)
            .chain(&c.data)
            .map(|p| std::fs::read(p).unwrap())
            .collect()
    };
    let before = files(&c);
    let map = std::slice::from_ref(&map_path);

    // Unknown names: all counted, the first 20 spelled out.
    let strangers: Vec<_> = (0..25)
        .map(|i| {
            (
                format!("stranger.{i}"),
                "F32".to_string(),
                vec![2],
                vec![0u8; 8],
            )
        })
        .collect();
    let err = apply_to(&c, &write(&c.root, "s.safetensors", &strangers), map, false).unwrap_err();
    assert!(err.contains("names 25 tensor(s)"), "{err}");
    assert!(
        err.contains("\"stranger.0\": not a name of the map's checkpoint(s)"),
        "{err}"
    );
    assert!(err.contains("; and 5 more"), "{err}");

    // A shape other than the checkpoint's.
    let mut ft = fine_tune(&ck, 0.01, 4);
    let norm = ft.iter().position(|t| t.0 == "model.norm.weight").unwrap();
    let mut short = ft[norm].clone();
    short.2 = vec![32];
    short.3.truncate(128);
    let err = apply_to(&c, &write(&c.root, "b.safetensors", &[short]), map, false).unwrap_err();
    assert!(
        err.contains("expected shape [64] (as the checkpoint has it), found [32]"),
        "{err}"
    );

    // A value that is not finite, in a float32 tensor and in one that is re-quantized.
    for name in [
        "model.norm.weight",
        "model.layers.0.self_attn.q_proj.weight",
    ] {
        let at = ft.iter().position(|t| t.0 == name).unwrap();
        ft[at].3[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        let err = apply_to(&c, &write(&c.root, "n.safetensors", &ft), map, false).unwrap_err();
        assert!(err.contains(&format!("\"{name}\"")), "{err}");
        assert!(err.to_lowercase().contains("nan"), "{err}");
        ft[at].3[4..8].copy_from_slice(&0.5f32.to_le_bytes());
    }

    // Names two stored places are as close to: ambiguous, never guessed.
    let norms: Vec<_> = tensors_of(&ck)
        .into_iter()
        .filter(|t| t.0 == "model.norm.weight")
        .collect();
    let mut twice = norms.clone();
    twice.push((
        "copy.of.norm".into(),
        norms[0].1.clone(),
        norms[0].2.clone(),
        norms[0].3.clone(),
    ));
    let twice_ck = write(&c.root, "twice.safetensors", &twice);
    let err = apply_to(&c, &twice_ck, std::slice::from_ref(&twice_ck), false).unwrap_err();
    assert!(
        err.contains("\"copy.of.norm\": ambiguous in the map"),
        "{err}"
    );
    assert_eq!(files(&c), before);

    // A map whose digests are not the files': refused before anything is read.
    let changed = c.root.join("other.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&map_path).unwrap()).unwrap();
    json["files"][1]["sha256"] = serde_json::Value::String("0".repeat(64));
    std::fs::write(&changed, serde_json::to_vec(&json).unwrap()).unwrap();
    let ok = write(&c.root, "ok.safetensors", &ft[..1]);
    let err = apply_to(&c, &ok, &[changed], false).unwrap_err();
    assert!(err.contains("changed since the map was learned"), "{err}");
    assert_eq!(files(&c), before);

    // A dry run names each checkpoint name and target, and writes nothing, not the map.
    let map_before = std::fs::read(&map_path).unwrap();
    let report = apply_to(&c, &ok, map, true).unwrap();
    assert!(
        report.contains(&format!("would change\t{} -> ", ft[0].0)),
        "{report}"
    );
    assert_eq!(files(&c), before);
    assert_eq!(std::fs::read(&map_path).unwrap(), map_before);
}

/// The float32 values of the stored tensor at `path` of the copy.
fn stored_values(c: &Copied, path: &str) -> Vec<f32> {
    let model = Arc::new(Model::open(&c.model, &c.data).unwrap());
    let catalog = Catalog::of(model.clone());
    let s = stored_tensors(&catalog)
        .into_iter()
        .find(|s| s.path == path)
        .unwrap();
    let mut out = vec![0f32; s.numel() as usize];
    s.values(&model).unwrap().read(0, &mut out).unwrap();
    out
}

#[test]
fn float_values_for_a_4_bit_constant_through_apply_are_requantized() {
    let (file, data) =
        common::fixture_files(&common::fixtures_dir().join("extra/xnn_qb4_linear.pte.json"));
    let c = copy_files(&file, &data);
    let key = "bfb45e9e1bbc597e48ab249c4ce670290c70d146c73dfd0c6093f31a747aea8c";
    let scales = "scale_ef7676ceeeeb953e33b626f45a3794dbb8776cd29abf6ea0d99cdfad81661b0e";
    let values: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin() * 0.5).collect();
    for (dtype, bytes) in [
        ("F32", bytes_of("F32", &values)),
        ("BF16", bytes_of("BF16", &values)),
    ] {
        let update = write(
            &c.root,
            "q.safetensors",
            &[(key.into(), dtype.into(), vec![4, 64], bytes.clone())],
        );
        let report = apply_to(&c, &update, &[], false).unwrap();
        assert!(report.contains(&format!("changed\t{key}")), "{report}");
        let got = stored_values(&c, "plans/forward/delegates/0/xnnpack/values/2");
        // Fresh scales: a group's largest magnitude over 7 (or 8), so at most half of that
        // away, and the bfloat16 scale's own rounding.
        let want = floats(dtype, &bytes);
        for (g, (a, b)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
            let step = b.iter().fold(0f32, |m, x| m.max(x.abs())) / 7.0;
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 0.5 * step * 1.02 + 1e-6,
                    "group {g}: {x} for {y}"
                );
            }
        }
    }
    // The wrong float shape says what it takes; a NaN is refused with the tensor's name; an
    // update that also writes the scales the float values make is refused.
    let bad = write(
        &c.root,
        "bad.safetensors",
        &[(
            key.into(),
            "F32".into(),
            vec![64, 4],
            bytes_of("F32", &values),
        )],
    );
    let err = apply_to(&c, &bad, &[], false).unwrap_err();
    assert!(
        err.contains("expected U8[4, 32] (or float values of shape [4, 64]), found F32[64, 4]"),
        "{err}"
    );
    let mut nan = values.clone();
    nan[70] = f32::NAN;
    let bad = write(
        &c.root,
        "nan.safetensors",
        &[(key.into(), "F32".into(), vec![4, 64], bytes_of("F32", &nan))],
    );
    let err = apply_to(&c, &bad, &[], false).unwrap_err();
    assert!(err.contains(key), "{err}");
    let twice = write(
        &c.root,
        "twice.safetensors",
        &[
            (
                key.into(),
                "F32".into(),
                vec![4, 64],
                bytes_of("F32", &values.iter().map(|v| v * 2.0).collect::<Vec<_>>()),
            ),
            (
                scales.into(),
                "BF16".into(),
                vec![8],
                bytes_of("BF16", &[0.25; 8]),
            ),
        ],
    );
    let err = apply_to(&c, &twice, &[], false).unwrap_err();
    assert!(err.contains("writes the same bytes twice"), "{err}");
}

#[test]
fn a_new_adapter_replaces_the_lora_weights_and_follows_its_scale() {
    let base = checkpoint("names_llama/hf");
    let adapter = checkpoint("names_lora/adapter");
    let c = copy("names_lora");
    let map_path = c.root.join("names.json");
    learn(&c, &[base, adapter.clone()], Some(&map_path)).unwrap();
    let dir = c.root.join("new_adapter");
    std::fs::create_dir(&dir).unwrap();
    let ft = fine_tune(&adapter.join("adapter_model.safetensors"), 0.05, 5);
    write(&dir, "adapter_model.safetensors", &ft);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(adapter.join("adapter_config.json")).unwrap())
            .unwrap();
    // The export baked 4 / 2; this adapter is scaled by 8 / 2.
    config["lora_alpha"] = 8.into();
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let report = apply_to(&c, &dir, std::slice::from_ref(&map_path), false).unwrap();
    assert!(report.contains("lora_B multiplied by 2"), "{report}");
    assert!(report.contains("8 tensor(s) changed"), "{report}");
    let map = NameMap::read(&map_path).unwrap();
    for (name, dtype, _, bytes) in &ft {
        let factor = if name.contains("lora_B") { 2.0 } else { 1.0 };
        let Status::Matched { targets, .. } = &map.name(name).unwrap().status else {
            panic!("{name}")
        };
        let got = stored_values(&c, &targets[0].stored.path);
        let want: Vec<f32> = floats(dtype, bytes).iter().map(|v| v * factor).collect();
        assert_eq!(got, want, "{name}");
    }

    // Another rank is refused, naming the rank the export baked.
    config["r"] = 4.into();
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let err = apply_to(&c, &dir, &[map_path], false).unwrap_err();
    assert!(
        err.contains("the adapter has rank 4, the export baked rank 2"),
        "{err}"
    );
}

#[test]
fn a_mount_takes_float_values_for_a_4_bit_constant_through_weights_safetensors() {
    let (file, data) =
        common::fixture_files(&common::fixtures_dir().join("extra/xnn_qb4_linear.pte.json"));
    let c = copy_files(&file, &data);
    let key = "bfb45e9e1bbc597e48ab249c4ce670290c70d146c73dfd0c6093f31a747aea8c";
    // Eight times the constant's stored bytes: past the limit of its stored form alone.
    let values: Vec<f32> = (0..256).map(|i| (i as f32 * 0.21).cos() * 0.3).collect();
    let update = build(&[(key, "F32", vec![4, 64], bytes_of("F32", &values))]);
    let fs = common::open(&c, false);
    common::replace(&fs, "weights.safetensors", &update).unwrap();
    drop(fs);
    let got = stored_values(&c, "plans/forward/delegates/0/xnnpack/values/2");
    for (a, b) in got.chunks(32).zip(values.chunks(32)) {
        let step = b.iter().fold(0f32, |m, x| m.max(x.abs())) / 7.0;
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 0.5 * step * 1.02 + 1e-6, "{x} for {y}");
        }
    }
}
