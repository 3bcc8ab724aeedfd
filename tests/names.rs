//! Names learned from checkpoints (docs/names.md): every transform found on real exports
//! (`tests/fixtures/extra/names_*`, exported with `export_llm` from the checkpoints kept in
//! `tests/fixtures/extra/checkpoints/`), and on checkpoints written here from them; every
//! refusal; the map's JSON and its digests; the command line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ptefs::catalog::Catalog;
use ptefs::commands::{names, NamesRequest};
use ptefs::format::Model;
use ptefs::names::map::{MapTarget, Status};
use ptefs::names::matching::sample_positions;
use ptefs::names::{learn, stored_tensors, Checkpoint, Direction, NameMap, Outcome, Transform};

mod common;
use common::load_json;
use common::safetensors::build;

fn extra(name: &str) -> PathBuf {
    common::fixtures_dir().join("extra").join(name)
}

fn checkpoints(rel: &str) -> PathBuf {
    extra("checkpoints").join(rel)
}

/// A names_* fixture: its model and data files.
fn fixture(name: &str) -> (PathBuf, Vec<PathBuf>) {
    common::fixture_files(&extra(&format!("{name}.pte.json")))
}

/// The map `ptefs names` learns for fixture `name` from `from`.
fn learn_map(name: &str, from: &[PathBuf]) -> ptefs::error::Result<NameMap> {
    let (file, data) = fixture(name);
    learn_files(&file, &data, from)
}

fn learn_files(file: &Path, data: &[PathBuf], from: &[PathBuf]) -> ptefs::error::Result<NameMap> {
    let req = NamesRequest {
        file: file.to_path_buf(),
        data: data.to_vec(),
        from: from.to_vec(),
        ..Default::default()
    };
    names(&req, &mut Vec::new())
}

/// The targets of a matched name.
fn targets<'m>(map: &'m NameMap, name: &str) -> &'m [MapTarget] {
    match &map.name(name).unwrap_or_else(|| panic!("no {name}")).status {
        Status::Matched { targets, .. } => targets,
        other => panic!("{name}: {other:?}"),
    }
}

/// The one target of a name stored once.
fn target<'m>(map: &'m NameMap, name: &str) -> &'m MapTarget {
    match targets(map, name) {
        [t] => t,
        more => panic!("{name}: {} targets", more.len()),
    }
}

/// A safetensors checkpoint written in `dir`.
fn write_checkpoint(
    dir: &Path, file: &str, tensors: &[(&str, &str, Vec<u64>, Vec<u8>)],
) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, build(tensors)).unwrap();
    path
}

/// Name, dtype, shape and bytes of every tensor of a checkpoint.
fn tensors_of(path: &Path) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let ck = Checkpoint::open(path).unwrap();
    ck.tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dtype.to_string(),
                t.shape.clone(),
                ck.bytes(t).unwrap().to_vec(),
            )
        })
        .collect()
}

/// The rows of a row-major tensor of `row_bytes`-byte rows, reordered: row `r` of the
/// result is row `from(r)`.
fn reorder_rows(bytes: &[u8], row_bytes: usize, from: impl Fn(usize) -> usize) -> Vec<u8> {
    let rows = bytes.len() / row_bytes;
    (0..rows)
        .flat_map(|r| bytes[from(r) * row_bytes..(from(r) + 1) * row_bytes].to_vec())
        .collect()
}

/// Meta's order of a q or k projection stored in Hugging Face's, `n` heads: the checkpoint
/// conversion `w.view(n, 2, d1 // n // 2, d2).transpose(1, 2)`.
fn hf_to_meta(bytes: &[u8], d1: usize, row_bytes: usize, n: usize) -> Vec<u8> {
    let block = d1 / n;
    let half = block / 2;
    reorder_rows(bytes, row_bytes, |r| {
        let (head, within) = (r / block, r % block);
        let (i, j) = (within / 2, within % 2);
        head * block + j * half + i
    })
}

/// A stored tensor's float32 values and steps, by tree path.
fn stored_values(file: &Path, data: &[PathBuf], path: &str) -> (Vec<f32>, Vec<f32>, Vec<u64>) {
    let model = Arc::new(Model::open(file, data).unwrap());
    let catalog = Catalog::of(model.clone());
    let stored = stored_tensors(&catalog);
    let s = stored
        .iter()
        .find(|s| s.path == path)
        .expect("a stored tensor");
    let values = s.values(&model).unwrap();
    let n = s.numel() as usize;
    let (mut v, mut st) = (vec![0f32; n], vec![0f32; n]);
    values.read(0, &mut v).unwrap();
    values.steps(0, &mut st).unwrap();
    (v, st, s.shape.clone())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn hf_llama_q_and_k_are_found_rotary_permuted_with_their_head_counts() {
    let map = learn_map("names_llama", &[checkpoints("names_llama/hf")]).unwrap();
    assert_eq!((map.matched(), map.names.len()), (21, 21));
    let meta = learn_map(
        "names_llama",
        &[checkpoints("names_llama/meta.safetensors")],
    )
    .unwrap();
    assert_eq!(meta.matched(), 21);
    // Every Hugging Face tensor is where export_llm put the Meta tensor it converted it to,
    // with the transform of that conversion; every Meta tensor is stored as it is.
    let conversion = load_json(&checkpoints("names_llama/conversion.json"));
    for (hf, how) in conversion.as_object().unwrap() {
        let [pair] = how.as_array().unwrap().as_slice() else {
            panic!("{hf}: untied, one Meta tensor each")
        };
        let meta_name = pair[0].as_str().unwrap();
        let expected = Transform::from_json(&pair[1]).unwrap();
        let t = target(&map, hf);
        assert_eq!(t.transform, expected, "{hf}");
        let m = target(&meta, meta_name);
        assert_eq!(m.stored.path, t.stored.path, "{hf} and {meta_name}");
        assert_eq!(m.transform, Transform::Identity, "{meta_name}");
        assert!(t.quality.rms_steps <= 0.5, "{hf}: {:?}", t.quality);
    }
    // q has 4 heads, k and v 2: each permutation has its own head count.
    let q = target(&map, "model.layers.1.self_attn.q_proj.weight");
    let k = target(&map, "model.layers.1.self_attn.k_proj.weight");
    assert_eq!(
        (q.transform.clone(), k.transform.clone()),
        (
            Transform::Rotary {
                direction: Direction::HfToMeta,
                heads: 4
            },
            Transform::Rotary {
                direction: Direction::HfToMeta,
                heads: 2
            }
        )
    );
    assert_eq!(q.stored.what, "XNNPACK qbint4[64,64]");
    // The runner-up is reported, far from the match.
    let Status::Matched {
        runner_up: Some(r), ..
    } = &map
        .name("model.layers.1.self_attn.q_proj.weight")
        .unwrap()
        .status
    else {
        panic!("no runner-up")
    };
    assert!(r.quality.rms_steps > 2.0, "{r:?}");
    // What no name matched: the rotary tables and the norms' eps.
    let unnamed: Vec<&str> = map.unnamed.iter().map(|s| s.path.as_str()).collect();
    assert!(unnamed.contains(&"data/names_llama/named_data/rope.freqs_cos"));
    assert_eq!(unnamed.len(), 7, "{unnamed:?}");
}

#[test]
fn hf_rotary_order_is_identity_and_a_tied_embedding_is_stored_twice() {
    let map = learn_map("names_qwen", &[checkpoints("names_qwen/hf")]).unwrap();
    assert_eq!((map.matched(), map.names.len()), (24, 24));
    for n in &map.names {
        for t in targets(&map, &n.name) {
            assert_eq!(t.transform, Transform::Identity, "{}", n.name);
        }
        assert_eq!(n.dtype, "BF16");
    }
    // export_llm's input had output.weight = tok_embeddings.weight: one checkpoint tensor,
    // stored as float32 in the .ptd and as the 4-bit output projection.
    let embed = targets(&map, "model.embed_tokens.weight");
    let whats: Vec<&str> = embed.iter().map(|t| t.stored.what.as_str()).collect();
    assert_eq!(whats, ["FLOAT[256,64]", "XNNPACK qcint4[256,64]"]);
    assert_eq!(embed[0].quality.max_error, 0.0);
    assert!(embed[1].quality.max_error > 0.0 && embed[1].quality.rms_steps <= 0.5);
}

#[test]
fn a_meta_layout_checkpoint_of_an_hf_order_model_is_rotary_meta_to_hf() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = Vec::new();
    for (name, dtype, shape, bytes) in tensors_of(&checkpoints("names_qwen/hf/model.safetensors")) {
        let heads = if name.ends_with("q_proj.weight") {
            Some(4)
        } else if name.ends_with("k_proj.weight") {
            Some(2)
        } else {
            None
        };
        let bytes = match heads {
            Some(n) => hf_to_meta(&bytes, shape[0] as usize, 2 * shape[1] as usize, n),
            None => bytes,
        };
        out.push((name, dtype, shape, bytes));
    }
    let refs: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = out
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    let ck = write_checkpoint(dir.path(), "meta.safetensors", &refs);
    let map = learn_map("names_qwen", &[ck]).unwrap();
    assert_eq!(map.matched(), 24);
    for layer in 0..2 {
        for (proj, heads) in [("q_proj", 4), ("k_proj", 2)] {
            let name = format!("model.layers.{layer}.self_attn.{proj}.weight");
            assert_eq!(
                target(&map, &name).transform,
                Transform::Rotary {
                    direction: Direction::MetaToHf,
                    heads
                },
                "{name}"
            );
        }
    }
}

#[test]
fn a_transposed_checkpoint_tensor_is_found_transposed() {
    let dir = tempfile::tempdir().unwrap();
    let hf = tensors_of(&checkpoints(
        "names_llama/hf/model-00001-of-00002.safetensors",
    ));
    let (_, _, shape, bytes) = hf
        .iter()
        .find(|t| t.0 == "model.layers.0.mlp.down_proj.weight")
        .expect("in the first shard");
    let (rows, cols) = (shape[0] as usize, shape[1] as usize);
    let mut t = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[(c * rows + r) * 4..(c * rows + r) * 4 + 4]
                .copy_from_slice(&bytes[(r * cols + c) * 4..(r * cols + c) * 4 + 4]);
        }
    }
    let ck = write_checkpoint(
        dir.path(),
        "t.safetensors",
        &[("w2_transposed", "F32", vec![cols as u64, rows as u64], t)],
    );
    let map = learn_map("names_llama", &[ck]).unwrap();
    let found = target(&map, "w2_transposed");
    assert_eq!(found.transform, Transform::Axes { order: vec![1, 0] });
    assert_eq!(found.transform.to_string(), "transpose");
    assert_eq!(
        found.stored.path,
        "plans/forward/delegates/9/xnnpack/values/2"
    );
}

#[test]
fn conv_filters_are_found_channels_last_and_a_folded_batchnorm_is_reported() {
    let map = learn_map(
        "names_conv_bn",
        &[checkpoints("names_conv_bn/model.safetensors")],
    )
    .unwrap();
    let dw = target(&map, "dw.weight");
    assert_eq!(
        (dw.transform.to_string(), dw.stored.what.as_str()),
        ("OIHW->IHWO".to_string(), "XNNPACK fp32[1,3,3,8]")
    );
    let pw = target(&map, "pw.weight");
    assert_eq!(pw.transform.to_string(), "OIHW->OHWI");
    assert_eq!(pw.quality.max_error, 0.0);
    // conv.weight was stored times gamma / sqrt(var + eps): reported folded, not named.
    match &map.name("conv.weight").unwrap().status {
        Status::Folded {
            target,
            transform,
            factors,
            rms_steps,
        } => {
            assert_eq!(target.what, "XNNPACK fp32[8,3,3,3]");
            assert_eq!(transform.to_string(), "OIHW->OHWI");
            assert!(factors.0 < 1.0 && factors.1 > 1.0, "{factors:?}");
            assert!(*rms_steps <= 0.5);
        }
        other => panic!("conv.weight: {other:?}"),
    }
    for bn in [
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "conv.bias",
    ] {
        assert_eq!(map.name(bn).unwrap().status.as_str(), "unmatched", "{bn}");
    }
    // The folded bias is stored, and nothing names it.
    assert_eq!(map.unnamed.len(), 1);
    assert_eq!(map.unnamed[0].what, "XNNPACK fp32[8]");
}

#[test]
fn a_peft_adapter_is_matched_beside_its_base() {
    let map = learn_map(
        "names_lora",
        &[
            checkpoints("names_llama/hf"),
            checkpoints("names_lora/adapter"),
        ],
    )
    .unwrap();
    assert_eq!((map.matched(), map.names.len()), (29, 29));
    let adapter = map.checkpoints[1].adapter.as_ref().expect("a PEFT adapter");
    assert_eq!(
        (adapter.rank, adapter.alpha, adapter.rslora),
        (2, 4.0, false)
    );
    assert_eq!(adapter.target_modules, ["q_proj", "v_proj"]);
    // export_llm stores the adapter as PEFT has it: lora_B of q is not permuted.
    for layer in 0..2 {
        for (proj, ab) in [
            ("q_proj", "A"),
            ("q_proj", "B"),
            ("v_proj", "A"),
            ("v_proj", "B"),
        ] {
            let name =
                format!("base_model.model.model.layers.{layer}.self_attn.{proj}.lora_{ab}.weight");
            let t = target(&map, &name);
            assert_eq!(t.transform, Transform::Identity, "{name}");
            assert_eq!(map.files[t.stored.file].name, "names_lora.lora.ptd");
            assert_eq!(t.quality.max_error, 0.0);
        }
    }
}

#[test]
fn one_weight_used_by_two_methods_is_one_target_with_both_paths() {
    let file = common::fixtures_dir().join("two_methods.pte");
    let (values, _, shape) = stored_values(&file, &[], "plans/forward/values/0");
    let dir = tempfile::tempdir().unwrap();
    let ck = write_checkpoint(
        dir.path(),
        "w.safetensors",
        &[("proj.weight", "F32", shape, f32_bytes(&values))],
    );
    let map = learn_files(&file, &[], &[ck]).unwrap();
    let t = target(&map, "proj.weight");
    assert_eq!(t.stored.path, "plans/forward/values/0");
    assert_eq!(t.stored.also, ["plans/relu_proj/values/0"]);
}

#[test]
fn quantization_noise_within_half_a_step_matches_and_a_step_away_does_not() {
    let (file, data) = fixture("names_llama");
    let path = "plans/forward/delegates/2/xnnpack/values/4";
    let (values, steps, shape) = stored_values(&file, &data, path);
    // Within a step's half, on every element, alternating signs: a source that rounds to
    // exactly the stored values.
    let near: Vec<f32> = values
        .iter()
        .zip(&steps)
        .enumerate()
        .map(|(i, (v, s))| v + if i % 2 == 0 { 0.45 } else { -0.45 } * s)
        .collect();
    // A whole step away: every element rounds to another value.
    let far: Vec<f32> = values.iter().zip(&steps).map(|(v, s)| v + s).collect();
    let dir = tempfile::tempdir().unwrap();
    let ck = write_checkpoint(
        dir.path(),
        "n.safetensors",
        &[
            ("near", "F32", shape.clone(), f32_bytes(&near)),
            ("far", "F32", shape, f32_bytes(&far)),
        ],
    );
    let map = learn_files(&file, &data, &[ck]).unwrap();
    let t = target(&map, "near");
    assert_eq!(t.stored.path, path);
    assert!((t.quality.rms_steps - 0.45).abs() < 0.01, "{:?}", t.quality);
    match &map.name("far").unwrap().status {
        Status::Unmatched { closest: Some(c) } => {
            assert_eq!(c.path, path);
            assert!((c.quality.rms_steps - 1.0).abs() < 0.01, "{:?}", c.quality);
        }
        other => panic!("far: {other:?}"),
    }
}

#[test]
fn a_candidate_close_on_the_sample_is_confirmed_on_every_element() {
    let (file, data) = fixture("names_llama");
    let path = "plans/forward/delegates/2/xnnpack/values/4";
    let (values, steps, shape) = stored_values(&file, &data, path);
    // Equal on the sampled elements, ten steps off everywhere else.
    let sampled = sample_positions(values.len() as u64);
    let changed: Vec<f32> = values
        .iter()
        .zip(&steps)
        .enumerate()
        .map(|(i, (v, s))| {
            if sampled.contains(&(i as u64)) {
                *v
            } else {
                v + 10.0 * s
            }
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let ck = write_checkpoint(
        dir.path(),
        "c.safetensors",
        &[("w", "F32", shape, f32_bytes(&changed))],
    );
    let map = learn_files(&file, &data, &[ck]);
    let e = map.unwrap_err();
    assert!(
        e.message().contains("0 of 1 checkpoint tensors matched"),
        "{e}"
    );
    // Through the engine: the sample alone would have named it.
    let model = Arc::new(Model::open(&file, &data).unwrap());
    let catalog = Catalog::of(model);
    let ck = Checkpoint::open(&dir.path().join("c.safetensors")).unwrap();
    let learned = learn(&catalog, &[ck]).unwrap();
    match &learned.names[0].outcome {
        Outcome::Unmatched { closest: Some(c) } => {
            assert_eq!(learned.stored[c.stored].path, path);
            assert_eq!(c.quality.rms_steps, 0.0, "the sample agrees");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn two_names_as_close_to_one_stored_tensor_are_ambiguous() {
    let hf = tensors_of(&checkpoints(
        "names_llama/hf/model-00001-of-00002.safetensors",
    ));
    let (_, dtype, shape, bytes) = hf
        .iter()
        .find(|t| t.0 == "model.layers.0.self_attn.v_proj.weight")
        .expect("in the first shard");
    let dir = tempfile::tempdir().unwrap();
    let ck = write_checkpoint(
        dir.path(),
        "dup.safetensors",
        &[
            ("first", dtype, shape.clone(), bytes.clone()),
            ("second", dtype, shape.clone(), bytes.clone()),
        ],
    );
    let e = learn_map("names_llama", std::slice::from_ref(&ck)).unwrap_err();
    assert!(
        e.message().contains("0 of 2 checkpoint tensors matched"),
        "{e}"
    );
    let (file, data) = fixture("names_llama");
    let model = Arc::new(Model::open(&file, &data).unwrap());
    let learned = learn(
        &Catalog::of(model.clone()),
        &[Checkpoint::open(&ck).unwrap()],
    )
    .unwrap();
    let map = NameMap::from_learned(&learned, &model, &[Checkpoint::open(&ck).unwrap()]);
    for (name, other) in [("first", "second"), ("second", "first")] {
        match &map.name(name).unwrap().status {
            Status::Ambiguous { candidates, with } => {
                assert_eq!(with, &[other.to_string()]);
                assert_eq!(candidates.len(), 1);
                assert_eq!(
                    candidates[0].stored.path,
                    "plans/forward/delegates/2/xnnpack/values/8"
                );
            }
            status => panic!("{name}: {status:?}"),
        }
    }
    // The stored tensor is contested, not unnamed.
    assert!(map
        .unnamed
        .iter()
        .all(|s| s.path != "plans/forward/delegates/2/xnnpack/values/8"));
}

#[test]
fn one_name_under_two_transforms_is_ambiguous() {
    // zero_biases.pte stores three distinct zero biases of 4 elements; zeros are the same
    // whichever way rows are ordered, so a zero tensor matches each under every transform.
    let file = extra("zero_biases.pte");
    let dir = tempfile::tempdir().unwrap();
    let ck = write_checkpoint(
        dir.path(),
        "z.safetensors",
        &[("bias", "F32", vec![4], vec![0; 16])],
    );
    let model = Arc::new(Model::open(&file, &[] as &[PathBuf]).unwrap());
    let checkpoint = Checkpoint::open(&ck).unwrap();
    let learned = learn(&Catalog::of(model.clone()), &[checkpoint]).unwrap();
    let map = NameMap::from_learned(&learned, &model, &[Checkpoint::open(&ck).unwrap()]);
    match &map.name("bias").unwrap().status {
        Status::Ambiguous { candidates, with } => {
            assert!(with.is_empty(), "no other name: {with:?}");
            let mut paths: Vec<&str> = candidates.iter().map(|c| c.stored.path.as_str()).collect();
            paths.sort_unstable();
            paths.dedup();
            assert_eq!(paths.len(), 3, "{paths:?}");
            assert!(candidates
                .iter()
                .any(|c| c.transform == Transform::Identity));
            assert!(candidates
                .iter()
                .any(|c| matches!(c.transform, Transform::Rotary { .. })));
        }
        other => panic!("{other:?}"),
    }
    let report = ptefs::names::report::render(&map);
    assert!(
        report.contains(
            "several transforms match one stored tensor: which layout it has is not known"
        ),
        "{report}"
    );
}

#[test]
fn another_models_checkpoint_matches_nothing() {
    let e = learn_map("names_qwen", &[checkpoints("names_llama/hf")]).unwrap_err();
    assert_eq!(
        e.message(),
        format!(
            "0 of 21 checkpoint tensors matched: {} does not hold the weights of {}",
            checkpoints("names_llama/hf").display(),
            fixture("names_qwen").0.display()
        )
    );
    // The existing LLM fixtures were exported from other random weights of the same
    // architecture: nothing of them is in names_llama's checkpoint either.
    let file = common::fixtures_dir().join("llama_8da4w.pte");
    let data = [common::fixtures_dir().join("llama_8da4w.ptd")];
    let e = learn_files(&file, &data, &[checkpoints("names_llama/hf")]).unwrap_err();
    assert!(e.message().starts_with("0 of 21"), "{e}");
}

#[test]
fn a_map_is_refused_for_changed_files() {
    let (file, data) = fixture("names_llama");
    let copied = common::copy_files(&file, &data);
    let map_path = copied.root.join("names.json");
    let req = NamesRequest {
        file: copied.model.clone(),
        data: copied.data.clone(),
        from: vec![checkpoints("names_llama/hf")],
        output: Some(map_path.clone()),
        map: None,
    };
    let learned = names(&req, &mut Vec::new()).unwrap();
    let map = NameMap::read(&map_path).unwrap();
    let check = |data: &[PathBuf]| {
        let model = Model::open(&copied.model, data).unwrap();
        map.check_files(&model)
    };
    check(&copied.data).unwrap();
    assert_eq!(
        map.files
            .iter()
            .map(|f| f.sha256.clone())
            .collect::<Vec<_>>(),
        vec![
            Some(common::sha256_hex(&std::fs::read(&copied.model).unwrap())),
            Some(common::sha256_hex(&std::fs::read(&copied.data[0]).unwrap()))
        ]
    );
    // The map as written reads back as it was learned.
    let mut with_digests = learned.clone();
    with_digests.files = map.files.clone();
    assert_eq!(map, with_digests);
    // Without its data file, and with one byte of a weight changed.
    let e = check(&[]).unwrap_err();
    assert!(e.message().contains("learned on 2 file(s)"), "{e}");
    let mut bytes = std::fs::read(&copied.data[0]).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 1;
    std::fs::write(&copied.data[0], &bytes).unwrap();
    let e = check(&copied.data).unwrap_err();
    assert!(
        e.message()
            .contains("names_llama.ptd changed since the map was learned"),
        "{e}"
    );
    let req = NamesRequest {
        file: copied.model.clone(),
        data: copied.data.clone(),
        map: Some(map_path),
        ..Default::default()
    };
    let e = names(&req, &mut Vec::new()).unwrap_err();
    assert!(e.message().contains("changed since"), "{e}");
}

#[test]
fn map_json_is_checked_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let (file, data) = fixture("names_conv_bn");
    let path = dir.path().join("m.json");
    let req = NamesRequest {
        file,
        data,
        from: vec![checkpoints("names_conv_bn/model.safetensors")],
        output: Some(path.clone()),
        map: None,
    };
    names(&req, &mut Vec::new()).unwrap();
    let good: serde_json::Value = load_json(&path);
    NameMap::parse(&serde_json::to_vec(&good).unwrap()).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit, &str); 6] = [
        ("version", |v| v["version"] = 2.into(), "version 2"),
        ("format", |v| v["format"] = "x".into(), "\"format\""),
        (
            "file index",
            |v| v["names"]["dw.weight"]["targets"][0]["file"] = 7.into(),
            "\"file\" 7",
        ),
        (
            "transform",
            |v| {
                v["names"]["dw.weight"]["targets"][0]["transform"]["order"] =
                    serde_json::json!([0, 0, 1, 2])
            },
            "not a permutation",
        ),
        (
            "digest",
            |v| v["files"][0]["sha256"] = "abc".into(),
            "SHA-256",
        ),
        (
            "status",
            |v| v["names"]["dw.weight"]["status"] = "maybe".into(),
            "unknown status",
        ),
    ];
    for (what, edit, says) in edits {
        let mut v = good.clone();
        edit(&mut v);
        let e = NameMap::parse(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(e.message().contains(says), "{what}: {e}");
    }
    // Maps that parse but do not fit the model: a target named twice, and a shape the
    // model's tensor does not have, said with both shapes.
    let (file, data) = fixture("names_conv_bn");
    let stored = stored_tensors(&Catalog::of(Arc::new(Model::open(&file, &data).unwrap())));
    let fits = |v: &serde_json::Value| {
        NameMap::parse(&serde_json::to_vec(v).unwrap())
            .unwrap()
            .check_targets(&stored)
    };
    fits(&good).unwrap();
    let mut twice = good.clone();
    let first = twice["names"]["dw.weight"]["targets"][0].clone();
    twice["names"]["dw.weight"]["targets"]
        .as_array_mut()
        .unwrap()
        .push(first);
    let e = fits(&twice).unwrap_err();
    assert!(e.message().contains("names the target"), "{e}");
    assert!(e.message().contains("twice"), "{e}");
    let mut shaped = good.clone();
    shaped["names"]["dw.weight"]["targets"][0]["shape"] = serde_json::json!([1u64 << 40, 3]);
    let e = fits(&shaped).unwrap_err();
    assert!(e.message().contains("[1099511627776, 3]"), "{e}");
}

#[test]
fn checkpoints_are_read_in_every_form_and_refused_clearly() {
    // A shard's index, named directly; an adapter's file, named directly.
    let index =
        Checkpoint::open(&checkpoints("names_llama/hf/model.safetensors.index.json")).unwrap();
    assert_eq!((index.tensors.len(), index.files.len()), (21, 2));
    let adapter =
        Checkpoint::open(&checkpoints("names_lora/adapter/adapter_model.safetensors")).unwrap();
    assert_eq!(adapter.adapter.as_ref().map(|a| a.rank), Some(2));
    let dir = tempfile::tempdir().unwrap();
    let refused = |path: &Path, says: &str| {
        let e = Checkpoint::open(path).unwrap_err();
        assert!(e.message().contains(says), "{}: {e}", path.display());
    };
    refused(dir.path(), "no checkpoint in this directory");
    let pth = dir.path().join("consolidated.00.pth");
    std::fs::write(&pth, b"PK").unwrap();
    refused(&pth, "PyTorch .pth/.pt/.bin checkpoints are not read");
    // An index that puts a tensor in a shard without it, or outside its directory.
    let shard = write_checkpoint(
        dir.path(),
        "a.safetensors",
        &[("x", "F32", vec![1], vec![0; 4])],
    );
    let _ = shard;
    let idx = dir.path().join("model.safetensors.index.json");
    std::fs::write(&idx, r#"{"weight_map": {"y": "a.safetensors"}}"#).unwrap();
    refused(&idx, "\"y\" is not a tensor of a.safetensors");
    std::fs::write(&idx, r#"{"weight_map": {"x": "../a.safetensors"}}"#).unwrap();
    refused(&idx, "a shard must be a file beside the index");
    // A name given by two checkpoints.
    let again = write_checkpoint(
        dir.path(),
        "b.safetensors",
        &[("x", "F32", vec![1], vec![0; 4])],
    );
    let e = learn_map("names_conv_bn", &[dir.path().join("a.safetensors"), again]).unwrap_err();
    assert!(e.message().contains("\"x\" is a tensor of both"), "{e}");
}

/// `ptefs names` through the binary: the report, `-o`, `--map`, and the exit status.
#[test]
fn the_command_line_reports_writes_and_checks_maps() {
    let bin = env!("CARGO_BIN_EXE_ptefs");
    let (file, data) = fixture("names_qwen");
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("qwen.json");
    let out = Command::new(bin)
        .arg("names")
        .arg(&file)
        .arg("--data")
        .arg(&data[0])
        .arg("--from")
        .arg(checkpoints("names_qwen/hf"))
        .arg("-o")
        .arg(&map)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains("24 of 24 checkpoint tensors matched (1 stored more than once)"),
        "{report}"
    );
    assert!(report.contains("    = plans/forward/delegates/27/xnnpack/values/2  XNNPACK qcint4[256,64]  identity  max error"), "{report}");
    // --map prints the same report from the map.
    let again = Command::new(bin)
        .arg("names")
        .arg(&file)
        .arg("--data")
        .arg(&data[0])
        .arg("--map")
        .arg(&map)
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stdout), report);
    // Another model's checkpoint: the report, then a failure.
    let wrong = Command::new(bin)
        .arg("names")
        .arg(&file)
        .arg("--data")
        .arg(&data[0])
        .arg("--from")
        .arg(checkpoints("names_conv_bn/model.safetensors"))
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stdout).contains("0 of 11 checkpoint tensors matched"));
    assert!(String::from_utf8_lossy(&wrong.stderr)
        .contains("ptefs: 0 of 11 checkpoint tensors matched"));
    // -o never replaces a file it reads.
    let clobber = Command::new(bin)
        .arg("names")
        .arg(&file)
        .arg("--data")
        .arg(&data[0])
        .arg("--from")
        .arg(checkpoints("names_qwen/hf"))
        .arg("-o")
        .arg(&data[0])
        .output()
        .unwrap();
    assert_eq!(clobber.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&clobber.stderr).contains("which this command reads"));
}
