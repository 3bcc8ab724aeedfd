//! Writing one tensor never changes another (docs/writes.md#shared-bytes-and-identity):
//! ExecuTorch stores equal bytes once, so distinct tensors can share a constant buffer or a
//! segment. A write gives the written tensor bytes of its own and leaves distinct sharers as
//! they were, while bytes one tensor shows several ways (one parameter in two methods, an
//! EXTERNAL value and its key) change together. Checked through the core on every fixture that
//! shares bytes, on files built here for the cases the exports lack (mutable initial states,
//! inline constant buffers, one parameter in two methods next to a distinct sharer, XNNPACK
//! constants), for bulk updates through `weights.safetensors` and `ptefs apply`, and through a
//! real mount.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use common::mount::{py, Mount};
use common::{copy_files, fuse_missing, manifests, open, pattern, replace, Copied};
use ptefs::format::generated::pte_fb;
use ptefs::format::range::ByteRange;
use ptefs::format::sharing::{locate, Relation, SharedBytes, TensorId};
use ptefs::format::writer::{pack_program, pte_program_region};
use ptefs::format::{Kind, Model, ModelFile, WriteTarget};
use ptefs::fs::Fs;
use ptefs::tree::{Content, Tree};

/// The `.bin` of every tensor of the tree that has one, by tensor.
fn tensor_bins(tree: &Tree) -> BTreeMap<TensorId, String> {
    let mut out = BTreeMap::new();
    for (i, n) in tree.nodes().map(|(ino, n)| ((ino - 1) as usize, n)) {
        let of = match &n.write {
            Some(WriteTarget::TensorBin { of, .. }) => *of,
            Some(WriteTarget::Blob { file, named_index }) => TensorId::key(*file, *named_index),
            _ => continue,
        };
        out.insert(of, tree.path(i as u64 + 1));
    }
    out
}

/// What every tensor of the tree holds now.
fn contents(fs: &Fs, bins: &BTreeMap<TensorId, String>) -> BTreeMap<TensorId, Vec<u8>> {
    bins.iter()
        .map(|(id, path)| {
            let ino = fs
                .tree()
                .find(path)
                .unwrap_or_else(|| panic!("{path} is gone"));
            (*id, common::read_all(fs, ino, 1 << 16).unwrap())
        })
        .collect()
}

/// The tensors a write of `id` must change: itself, and what is the same tensor.
fn same_tensor(model: &Model, id: TensorId) -> BTreeSet<TensorId> {
    let (location, _) = locate(model, id).expect("a located tensor");
    SharedBytes::of(model)
        .others(&location, id)
        .filter(|(_, r)| *r == Relation::SameTensor)
        .map(|(t, _)| t)
        .chain([id])
        .collect()
}

/// The tensors of `model` that share their bytes with another tensor.
fn sharing_tensors(model: &Model) -> Vec<TensorId> {
    let shared = SharedBytes::of(model);
    ptefs::format::sharing::all_tensors(model)
        .filter(|&id| {
            locate(model, id).is_some_and(|(l, _)| shared.others(&l, id).next().is_some())
        })
        .collect()
}

/// What `check` finds wrong with the containers of `model`.
fn defects(model: &Model) -> Vec<String> {
    ptefs::check::defects(model)
}

/// Writes new bytes to the `.bin` of `writer` and checks every tensor of the model, through
/// the core and after opening the files again: the writer and what is the same tensor hold
/// the new bytes, every other tensor its old bytes, and the files are sound.
fn write_one_and_check(c: &Copied, writer: TensorId, seed: u8) {
    let fs = open(c, false);
    let tree = fs.tree();
    let bins = tensor_bins(&tree);
    let Some(path) = bins.get(&writer).cloned() else {
        return;
    };
    let before = contents(&fs, &bins);
    let changes = same_tensor(&tree.model, writer);
    let defects_before = defects(&tree.model);
    drop(tree);
    let new = pattern(before[&writer].len(), seed);
    assert_ne!(new, before[&writer], "{path}: pick other new bytes");
    replace(&fs, &path, &new).unwrap_or_else(|e| panic!("{path}: {e}"));

    let reopened = open(c, true);
    for (what, fs) in [("after the commit", &fs), ("after reopening", &reopened)] {
        let after = contents(fs, &bins);
        for (id, bytes) in &after {
            let want = if changes.contains(id) {
                &new
            } else {
                &before[id]
            };
            assert!(
                bytes == want,
                "{} {what}: writing {path} changed {} wrongly ({})",
                c.model.display(),
                bins[id],
                if changes.contains(id) {
                    "expected the new bytes"
                } else {
                    "expected its old bytes"
                }
            );
        }
        assert_eq!(
            defects(&fs.tree().model),
            defects_before,
            "{path} {what}: check finds other defects"
        );
    }
}

/// Every tensor of every fixture that shares its bytes, written on its own.
#[test]
fn a_write_changes_the_tensor_and_what_is_the_same_tensor_only() {
    let mut written = 0;
    for manifest in manifests() {
        let (model_path, data) = common::fixture_files(&manifest);
        let Ok(model) = Model::open(&model_path, &data) else {
            continue;
        };
        for (k, writer) in sharing_tensors(&model).into_iter().enumerate() {
            let c = copy_files(&model_path, &data);
            write_one_and_check(&c, writer, 101 + k as u8);
            written += 1;
        }
    }
    // The exports hold distinct tensors on one buffer (llama_*), keys on one segment
    // (ext_shared, llama_qc4), and one parameter in two methods (two_methods).
    assert!(
        written >= 20,
        "only {written} shared tensors in the fixtures"
    );
}

/// The named cases, with what ExecuTorch stored: the result is said in the files' own terms.
#[test]
fn distinct_keys_on_one_segment_get_segments_of_their_own() {
    let c = common::copy_fixture("extra/ext_shared.pte");
    let fs = open(&c, false);
    let segments_before = ptd_segments(&fs.tree().model);
    let w1 = "data/ext_shared/named_data/w1.bin";
    let w2 = "data/ext_shared/named_data/w2.bin";
    let old_w2 = read(&fs, w2);
    let new = pattern(old_w2.len(), 9);
    replace(&fs, w1, &new).unwrap();
    assert_eq!(read(&fs, w1), new);
    assert_eq!(read(&fs, w2), old_w2, "w2 is another tensor");
    // The EXTERNAL values naming each key follow their key.
    let json = |p: &str| -> serde_json::Value { serde_json::from_slice(&read(&fs, p)).unwrap() };
    for i in 0..6 {
        let v = json(&format!("plans/forward/values/{i}.json"));
        let fqn = v["fully_qualified_name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if fqn == "w1" || fqn == "w2" {
            let bytes = read(&fs, &format!("plans/forward/values/{i}.bin"));
            assert_eq!(
                bytes,
                read(&fs, &format!("data/ext_shared/named_data/{fqn}.bin"))
            );
        }
    }
    assert_eq!(ptd_segments(&fs.tree().model), segments_before + 1);
    // Nothing lists the two as sharing any more.
    assert!(json("data/ext_shared/named_data/w1.json")["aliases"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| !a["path"].as_str().unwrap().ends_with("w2")));
}

#[test]
fn one_parameter_in_two_methods_stays_shared() {
    let c = common::copy_fixture("two_methods.pte");
    let fs = open(&c, false);
    let size = std::fs::metadata(&c.model).unwrap().len();
    let plans: Vec<String> = fs
        .list(fs.tree().find("plans").unwrap())
        .unwrap()
        .into_iter()
        .skip(2)
        .map(|e| e.name)
        .collect();
    let a = format!("plans/{}/values/0.bin", plans[0]);
    let b = format!("plans/{}/values/0.bin", plans[1]);
    let new = pattern(read(&fs, &a).len(), 3);
    replace(&fs, &a, &new).unwrap();
    assert_eq!(
        read(&fs, &b),
        new,
        "one parameter: both methods see the write"
    );
    assert_eq!(
        std::fs::metadata(&c.model).unwrap().len(),
        size,
        "written in place"
    );
}

/// A `.pte` rebuilt from a fixture after `edit` changed its program, with the same segment
/// bytes at the same offsets from the segment base.
fn rebuilt(name: &str, edit: impl FnOnce(&mut pte_fb::ProgramT)) -> Vec<u8> {
    let (orig, mut program, segments) = common::unpack_pte(name);
    edit(&mut program);
    let file = ModelFile::from_bytes(Path::new(name), orig.clone()).unwrap();
    let Kind::Pte(pte) = &file.kind else {
        panic!("{name} is not a .pte")
    };
    let old_base = pte.header.segment_base_offset() as usize;
    let end = segments.iter().map(ByteRange::end).max().unwrap_or(0) as usize;
    let fb = pack_program(&program, 16);
    let (mut bytes, base) = pte_program_region(&fb, 16, 128, (end - old_base) as u64, true);
    bytes.resize(base as usize, 0);
    bytes.extend_from_slice(&orig[old_base..end]);
    bytes
}

/// Appends to plan `plan` a copy of its tensor value `value` (same buffer, so a distinct
/// tensor sharing its bytes); returns the new value's index.
fn duplicate_value(program: &mut pte_fb::ProgramT, plan: usize, value: usize) -> usize {
    let values = program.execution_plan.as_mut().unwrap()[plan]
        .values
        .as_mut()
        .unwrap();
    let copy = values[value].clone();
    values.push(copy);
    values.len() - 1
}

fn write_built(name: &str, bytes: Vec<u8>) -> Copied {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let model = root.join(name);
    std::fs::write(&model, bytes).unwrap();
    Copied {
        dir,
        root,
        model,
        data: Vec::new(),
    }
}

/// The first value of plan 0 whose tensor is of `kind` ("constant", "mutable").
fn first_value(c: &Copied, kind: &str) -> usize {
    let fs = open(c, true);
    (0..)
        .find(|i| {
            let Some(ino) = fs.tree().find(&format!("plans/forward/values/{i}.json")) else {
                panic!("no {kind} value in {}", c.model.display())
            };
            let v: serde_json::Value =
                serde_json::from_slice(&common::read_all(&fs, ino, 1 << 16).unwrap()).unwrap();
            v["data"] == kind
        })
        .unwrap()
}

#[test]
fn distinct_mutable_buffers_get_initial_states_of_their_own() {
    let c = common::copy_fixture("counter.pte");
    let value = first_value(&c, "mutable");
    let mut copy = 0;
    let built = rebuilt("counter.pte", |p| copy = duplicate_value(p, 0, value));
    let c = write_built("counter_twice.pte", built);
    let writer = TensorId::value(0, value);
    assert!(sharing_tensors(&open(&c, true).tree().model).contains(&writer));
    write_one_and_check(&c, writer, 7);
    // The runtime reads initial states from the first mutable data segment only.
    let fs = open(&c, true);
    let Kind::Pte(pte) = &fs.tree().model.files[0].kind else {
        panic!()
    };
    let table = &pte.program.mutable_data_segments.as_ref().unwrap()[0];
    let idx = |v: usize| match &pte.program.execution_plan.as_ref().unwrap()[0]
        .values
        .as_ref()
        .unwrap()[v]
        .val
    {
        pte_fb::KernelTypesT::Tensor(t) => t.data_buffer_idx as usize,
        _ => panic!("a tensor"),
    };
    assert_ne!(idx(value), idx(copy));
    assert!(idx(value) < table.offsets.as_ref().unwrap().len());
}

#[test]
fn distinct_constants_sharing_an_inline_buffer_are_separated() {
    // linear.pte the pre-2024-09 way: constants inline in `constant_buffer`.
    let (orig, _, _) = common::unpack_pte("linear.pte");
    let (_, mut program, segments) = common::unpack_pte("linear.pte");
    let cs = program.constant_segment.take().unwrap();
    let seg = segments[cs.segment_index as usize];
    let offsets = cs.offsets.unwrap();
    let buffers = offsets
        .iter()
        .enumerate()
        .map(|(k, &off)| {
            let end = offsets.get(k + 1).copied().unwrap_or(seg.len());
            let mut b = pte_fb::BufferT::default();
            b.storage =
                Some(orig[(seg.start() + off) as usize..(seg.start() + end) as usize].to_vec());
            b
        })
        .collect();
    program.constant_buffer = Some(buffers);
    program.segments = Some(vec![]);
    let c0 = common::copy_fixture("linear.pte");
    let value = first_value(&c0, "constant");
    duplicate_value(&mut program, 0, value);
    let fb = pack_program(&program, 16);
    let (bytes, _) = pte_program_region(&fb, 16, 128, 0, false);
    let c = write_built("linear_inline.pte", bytes);
    write_one_and_check(&c, TensorId::value(0, value), 5);
}

#[test]
fn a_parameter_of_two_methods_moves_with_its_other_method_away_from_a_distinct_sharer() {
    let c0 = common::copy_fixture("two_methods.pte");
    let built = rebuilt("two_methods.pte", |p| {
        duplicate_value(p, 0, 0);
    });
    let c = write_built("two_methods_shared.pte", built);
    let model = open(&c, true).tree().model.clone();
    let writer = TensorId::value(0, 0);
    let same = same_tensor(&model, writer);
    assert!(same.contains(&TensorId::value(1, 0)), "{same:?}");
    write_one_and_check(&c, writer, 11);
    drop(c0);
}

/// An XNNPACK constant whose named-data key shares its segment with another key.
#[test]
fn an_xnnpack_constant_gets_a_segment_of_its_own() {
    let mut key = String::new();
    let built = rebuilt("extra/xnn_qs8_linear.pte", |p| {
        let named = p.named_data.as_mut().unwrap();
        let mut extra = named[0].clone();
        key = named[0].key.clone().unwrap();
        extra.key = Some("another tensor with equal bytes".to_string());
        named.push(extra);
    });
    let c = write_built("xnn_shared.pte", built);
    let fs = open(&c, false);
    let tree = fs.tree();
    let (value_bin, len) = tree
        .nodes()
        .map(|(ino, n)| ((ino - 1) as usize, n))
        .find_map(|(i, n)| match &n.write {
            Some(WriteTarget::PayloadConstant {
                of: Some(TensorId::Key { index: 0, .. }),
                location,
                ..
            }) => Some((tree.path(i as u64 + 1), location.range.len())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no XNNPACK value reads \"{key}\""));
    drop(tree);
    let other = "named_data/another tensor with equal bytes.bin";
    let old = read(&fs, other);
    let new = pattern(len as usize, 21);
    replace(&fs, &value_bin, &new).unwrap();
    assert_eq!(read(&fs, &value_bin), new);
    assert_eq!(read(&fs, other), old);
    assert_eq!(read(&fs, &format!("named_data/{key}.bin")), new);
    assert!(
        defects(&fs.tree().model).is_empty(),
        "{:?}",
        defects(&fs.tree().model)
    );
}

/// A blob resized while another key shares its segment: the other key keeps its bytes and
/// its size.
#[test]
fn resizing_a_blob_leaves_the_key_it_shared_a_segment_with() {
    let built = rebuilt("extra/xnnpack_q8.pte", |p| {
        let named = p.named_data.as_mut().unwrap();
        let mut extra = named[1].clone();
        extra.key = Some("same bytes".to_string());
        named.push(extra);
    });
    let c = write_built("q8_shared.pte", built);
    let fs = open(&c, false);
    let key = fs.tree().model.named_data_keys(0)[1].to_string();
    let other = "named_data/same bytes.bin";
    let old = read(&fs, other);
    // The key holds a filter's scales: new ones XNNPACK accepts (positive normal floats).
    let grown: Vec<u8> = (0..(old.len() + 100) / 4)
        .flat_map(|i| (0.25 + i as f32).to_le_bytes())
        .collect();
    replace(&fs, &format!("named_data/{key}.bin"), &grown).unwrap();
    assert_eq!(read(&fs, &format!("named_data/{key}.bin")), grown);
    assert_eq!(read(&fs, other), old);
    let reopened = open(&c, true);
    assert_eq!(read(&reopened, other), old);
    assert_eq!(read(&reopened, &format!("named_data/{key}.bin")), grown);
}

/// `weights.safetensors` lists each distinct tensor, and a bulk update that names one of two
/// tensors sharing bytes changes that one only; `ptefs apply` does the same.
#[test]
fn bulk_updates_keep_distinct_tensors_apart() {
    let name = "llama_8da4w.pte";
    let c = common::copy_fixture(name);
    let fs = open(&c, false);
    let tree = fs.tree();
    let entries = match &tree
        .node(tree.find("weights.safetensors").unwrap())
        .unwrap()
        .content
    {
        Content::Weights { view } => tree.weights(*view).entries.clone(),
        _ => panic!("weights.safetensors is a weights file"),
    };
    // Values 8, 9 and 10 of forward are three tensors on one constant buffer.
    let shared: Vec<_> = entries
        .iter()
        .filter(|e| [8, 9, 10].iter().any(|i| e.of == TensorId::value(0, *i)))
        .cloned()
        .collect();
    assert_eq!(shared.len(), 3, "each distinct tensor has its entry");
    drop(tree);
    let target = &shared[1];
    let new = pattern(target.location.range.len() as usize, 77);
    let update = safetensors(&[(
        target.name.clone(),
        target.dtype,
        target.shape.clone(),
        new.clone(),
    )]);
    let before: Vec<Vec<u8>> = shared
        .iter()
        .map(|e| read(&fs, &format!("{}.bin", e.path)))
        .collect();
    replace(&fs, "weights.safetensors", &update).unwrap();
    for (e, old) in shared.iter().zip(&before) {
        let now = read(&fs, &format!("{}.bin", e.path));
        if e.name == target.name {
            assert_eq!(now, new);
        } else {
            assert_eq!(&now, old, "{} is another tensor", e.path);
        }
    }

    // Every tensor on the buffer written at once: each gets its bytes, and the buffer stays
    // in use (one of them keeps it), so the file gains two buffers, not three.
    let c = common::copy_fixture(name);
    let fs = open(&c, false);
    let buffers = |fs: &Fs| constant_buffers(&fs.tree().model);
    let before_count = buffers(&fs);
    let all: Vec<(String, &str, Vec<u64>, Vec<u8>)> = shared
        .iter()
        .enumerate()
        .map(|(k, e)| {
            let bytes = pattern(e.location.range.len() as usize, 120 + k as u8);
            (e.name.clone(), e.dtype, e.shape.clone(), bytes)
        })
        .collect();
    replace(&fs, "weights.safetensors", &safetensors(&all)).unwrap();
    for (e, (_, _, _, bytes)) in shared.iter().zip(&all) {
        assert_eq!(&read(&fs, &format!("{}.bin", e.path)), bytes, "{}", e.path);
    }
    assert_eq!(buffers(&fs), before_count + 2);

    // The first update through `ptefs apply`, on a fresh copy.
    let c = common::copy_fixture(name);
    let upd = c.root.join("update.safetensors");
    std::fs::write(&upd, &update).unwrap();
    let mut cmd = std::process::Command::new(common::mount::BIN);
    cmd.arg("apply").arg(&c.model).arg(&upd);
    for d in &c.data {
        cmd.arg("--data").arg(d);
    }
    let out = common::mount::run(&mut cmd);
    assert!(out.status.success(), "{}", common::mount::text(&out.stderr));
    let fs = open(&c, true);
    for (e, old) in shared.iter().zip(&before) {
        let now = read(&fs, &format!("{}.bin", e.path));
        assert_eq!(
            &now,
            if e.name == target.name { &new } else { old },
            "{}",
            e.path
        );
    }
}

/// Through a real mount, as a user does it: `numpy.save` onto one of two keys on one segment.
#[test]
fn numpy_save_through_a_mount_keeps_the_other_key() {
    if fuse_missing() {
        return;
    }
    let (model, data) =
        common::fixture_files(&common::fixtures_dir().join("extra/ext_shared.pte.json"));
    let mut m = Mount::new(&model, &data, &[]);
    let (ok, out, err) = py(
        r#"
import sys, numpy as np
root = sys.argv[1]
d = root + "/data/ext_shared/named_data/"
w1, w2 = np.load(d + "w1.npy"), np.load(d + "w2.npy")
np.save(d + "w1.npy", w1 * 2 + 1)
assert (np.load(d + "w1.npy") == w1 * 2 + 1).all(), "w1 was written"
assert (np.load(d + "w2.npy") == w2).all(), "w2 changed with w1"
print("ok")
"#,
        &[m.mnt.to_str().unwrap()],
    );
    assert!(ok && out.trim() == "ok", "{out}{err}");
    m.umount();
    // On disk too: the copy's w2 is the fixture's.
    let original = open(&copy_files(&model, &data), true);
    let edited = Copied {
        dir: tempfile::tempdir().unwrap(),
        root: m.mnt.clone(),
        model: m.model.clone(),
        data: m.data.clone(),
    };
    let edited = open(&edited, true);
    let w2 = "data/ext_shared/named_data/w2.bin";
    assert_eq!(read(&edited, w2), read(&original, w2));
    assert_ne!(
        read(&edited, "data/ext_shared/named_data/w1.bin"),
        read(&original, "data/ext_shared/named_data/w1.bin")
    );
}

fn read(fs: &Fs, path: &str) -> Vec<u8> {
    let ino = fs.tree().find(path).unwrap_or_else(|| panic!("{path}"));
    common::read_all(fs, ino, 1 << 16).unwrap()
}

/// How many buffers the constant segment of the `.pte` has.
fn constant_buffers(model: &Arc<Model>) -> usize {
    match &model.files[0].kind {
        Kind::Pte(p) => p
            .program
            .constant_segment
            .as_ref()
            .and_then(|c| c.offsets.as_ref())
            .map_or(0, Vec::len),
        Kind::Ptd(_) => panic!("file 0 is a .pte"),
    }
}

fn ptd_segments(model: &Arc<Model>) -> usize {
    match &model.files[1].kind {
        Kind::Ptd(p) => p.segments.len(),
        Kind::Pte(_) => panic!("file 1 is a .ptd"),
    }
}

/// A safetensors file of (name, dtype, shape, bytes).
fn safetensors(tensors: &[(String, &str, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let described: Vec<(String, &str, Vec<u64>, u64)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), *d, s.clone(), b.len() as u64))
        .collect();
    let mut out = ptefs::format::safetensors::header(&described, &[]);
    for (_, _, _, b) in tensors {
        out.extend_from_slice(b);
    }
    out
}

/// A bulk update that gives every tensor on a shared range the same new bytes keeps them
/// shared and writes the range once, in place: the file is not re-laid out (its inode and
/// its number of constant buffers stay), and every sharer reads the new bytes.
#[test]
fn equal_new_bytes_for_every_sharer_stay_shared_and_in_place() {
    let name = "llama_8da4w.pte";
    let c = common::copy_fixture(name);
    let fs = open(&c, false);
    let tree = fs.tree();
    let entries = match &tree
        .node(tree.find("weights.safetensors").unwrap())
        .unwrap()
        .content
    {
        Content::Weights { view } => tree.weights(*view).entries.clone(),
        _ => panic!("weights.safetensors is a weights file"),
    };
    drop(tree);
    // Values 8, 9 and 10 of forward are three tensors on one constant buffer.
    let shared: Vec<_> = entries
        .iter()
        .filter(|e| [8, 9, 10].iter().any(|i| e.of == TensorId::value(0, *i)))
        .cloned()
        .collect();
    assert_eq!(shared.len(), 3);
    let new = pattern(shared[0].location.range.len() as usize, 201);
    let all: Vec<(String, &str, Vec<u64>, Vec<u8>)> = shared
        .iter()
        .map(|e| (e.name.clone(), e.dtype, e.shape.clone(), new.clone()))
        .collect();
    let buffers_before = constant_buffers(&fs.tree().model);
    let inode =
        |p: &std::path::Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let ino_before = inode(&c.model);
    replace(&fs, "weights.safetensors", &safetensors(&all)).unwrap();
    for e in &shared {
        assert_eq!(read(&fs, &format!("{}.bin", e.path)), new, "{}", e.path);
    }
    assert_eq!(
        constant_buffers(&fs.tree().model),
        buffers_before,
        "still one buffer"
    );
    assert_eq!(
        inode(&c.model),
        ino_before,
        "written in place, not re-laid out"
    );
    assert!(defects(&fs.tree().model).is_empty());

    // Different bytes for the sharers still give each its own (the first keeps the range).
    let differ: Vec<(String, &str, Vec<u64>, Vec<u8>)> = shared
        .iter()
        .enumerate()
        .map(|(k, e)| {
            (
                e.name.clone(),
                e.dtype,
                e.shape.clone(),
                pattern(new.len(), 90 + k as u8),
            )
        })
        .collect();
    replace(&fs, "weights.safetensors", &safetensors(&differ)).unwrap();
    assert_eq!(constant_buffers(&fs.tree().model), buffers_before + 2);
}
