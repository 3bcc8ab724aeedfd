//! Named views (docs/tree.md#named-views) and `ptefs diff --names`
//! (docs/commands.md#names-in-a-diff) on the `names_*` fixtures and the checkpoints they were
//! exported from: through real mounts read with NumPy and the `safetensors` package, through
//! `ptefs ls`/`cat`, and through the core; a map that does not fit the files is refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::mount::{py, py_errno, run, text, Mount, BIN};
use common::safetensors::build;
use common::{copy_files, fuse_missing, Copied};
use ptefs::commands::{names, NamesRequest};
use ptefs::format::Model;
use ptefs::names::map::Status;
use ptefs::names::{Checkpoint, NameMap};
use ptefs::tree::Tree;
use serde_json::Value;

fn extra(name: &str) -> PathBuf {
    common::fixtures_dir().join("extra").join(name)
}

fn checkpoints(rel: &str) -> PathBuf {
    extra("checkpoints").join(rel)
}

/// A names_* fixture's files, copied.
fn copied(name: &str) -> Copied {
    let (file, data) = common::fixture_files(&extra(&format!("{name}.pte.json")));
    copy_files(&file, &data)
}

/// The map `ptefs names -o` writes for `c` from `from`, at `<copy>/names.json`.
fn learn_map(c: &Copied, from: &Path) -> (PathBuf, NameMap) {
    let out = c.root.join("names.json");
    let req = NamesRequest {
        file: c.model.clone(),
        data: c.data.clone(),
        from: vec![from.to_path_buf()],
        output: Some(out.clone()),
        ..Default::default()
    };
    let map = names(&req, &mut Vec::new()).unwrap();
    (out, map)
}

/// `ptefs ARGS…`: exit code, stdout bytes, stderr.
fn ptefs(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, Vec<u8>, String) {
    let mut cmd = Command::new(BIN);
    for a in args {
        cmd.arg(a);
    }
    let out = run(&mut cmd);
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        text(&out.stderr),
    )
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The single-file checkpoint of every tensor of `from` (a sharded one, merged).
fn merged(from: &Path, to: &Path) {
    let ck = Checkpoint::open(from).unwrap();
    let tensors: Vec<(String, &str, Vec<u64>, Vec<u8>)> = ck
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dtype,
                t.shape.clone(),
                ck.bytes(t).unwrap().into_owned(),
            )
        })
        .collect();
    let refs: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    std::fs::write(to, build(&refs)).unwrap();
}

/// Changes the lowest byte of the first element of the tensor at tree path `path` of `c`.
fn nudge(c: &Copied, path: &str) {
    let model = Arc::new(Model::open(&c.model, &c.data).unwrap());
    let tree = Tree::build(model);
    let ino = tree.find(path).unwrap();
    let loc = tree.reads(ino)[0];
    let file = tree.model.files[loc.file].path.clone();
    drop(tree);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[loc.range.start() as usize] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
}

const EMBEDDING: &str = "data/names_llama/named_data/tok_embeddings.weight.bin";

#[test]
fn the_tree_counts_its_named_nodes_and_json_names_the_stored_tensors() {
    let c = copied("names_llama");
    let (_, map) = learn_map(&c, &checkpoints("names_llama/hf"));
    let model = Arc::new(Model::open(&c.model, &c.data).unwrap());
    let plain = ptefs::tree::node_count(&model);
    let expected = plain + ptefs::tree::build::names_node_count(&map);
    // The limit counts the named nodes: one node short of them is refused.
    let err = Tree::build_named(model.clone(), expected - 1, Some(map.clone()))
        .err()
        .expect("over the limit");
    assert!(err.message().contains("--max-nodes"), "{err}");
    let tree = Tree::build_named(model, expected, Some(map.clone())).unwrap();
    assert_eq!(tree.node_count(), expected);
    // Every name has a .json; every matched float name a .npy and a .hist.svg.
    for n in &map.names {
        let json = tree.find(&format!("names/{}.json", n.name));
        assert!(json.is_some(), "{}", n.name);
        let shown = matches!(n.status, Status::Matched { .. });
        assert_eq!(tree.find(&format!("names/{}.npy", n.name)).is_some(), shown);
        assert_eq!(
            tree.find(&format!("names/{}.hist.svg", n.name)).is_some(),
            shown
        );
    }
    // The payload value a name is stored at says so.
    let q = "model.layers.0.self_attn.q_proj.weight";
    let Status::Matched { targets, .. } = &map.name(q).unwrap().status else {
        panic!("{q} not matched")
    };
    let stored_json = format!("{}.json", targets[0].stored.path);
    let ino = tree.find(&stored_json).unwrap();
    let v: Value = serde_json::from_slice(&tree.text(ino).unwrap()).unwrap();
    assert_eq!(v["checkpoint_name"], q);
    // So does the .ptd key of the embedding, and the plan value that shows it.
    for p in [
        "data/names_llama/named_data/tok_embeddings.weight.json",
        "plans/forward/values/0.json",
    ] {
        let v: Value = serde_json::from_slice(&tree.text(tree.find(p).unwrap()).unwrap()).unwrap();
        assert_eq!(v["checkpoint_name"], "model.embed_tokens.weight", "{p}");
    }
    // Without a map, no names anywhere.
    let model = Arc::new(Model::open(&c.model, &c.data).unwrap());
    let tree = Tree::build(model);
    assert!(tree.find("names").is_none() && tree.find("names.safetensors").is_none());
    let ino = tree.find(&stored_json).unwrap();
    let v: Value = serde_json::from_slice(&tree.text(ino).unwrap()).unwrap();
    assert!(v.get("checkpoint_name").is_none());
}

/// Through a real mount: a rotary-permuted q read back by name equals the Hugging Face
/// checkpoint's tensor within its quantization error, and `names.safetensors` loads with
/// `safetensors.numpy` with the checkpoint's dtypes and shapes.
#[test]
fn a_mount_with_a_map_shows_each_name_in_the_checkpoints_layout() {
    if fuse_missing() {
        return;
    }
    let c = copied("names_llama");
    let hf = checkpoints("names_llama/hf");
    let (map_path, map) = learn_map(&c, &hf);
    let Copied {
        dir, model, data, ..
    } = c;
    let m = Mount::unmounted(dir, model, data, &["--names", arg(&map_path)]);
    let mut m = m;
    m.mount();
    let q = "model.layers.0.self_attn.q_proj.weight";
    let Status::Matched { targets, .. } = &map.name(q).unwrap().status else {
        panic!("{q} not matched")
    };
    let t = &targets[0];
    assert_eq!(t.transform.to_string(), "rotary hf_to_meta, 4 heads");
    let shard = Checkpoint::open(&hf).unwrap();
    let file = &shard.files[shard.tensors.iter().find(|x| x.name == q).unwrap().file];
    let (ok, out, err) = py(
        r#"
import sys, json, numpy as np
from safetensors.numpy import load_file
npy, shard, name, max_error, st, mapped = sys.argv[1:7]
a = np.load(npy)
ck = load_file(shard)[name]
assert a.dtype == ck.dtype and a.shape == ck.shape, (a.dtype, a.shape, ck.dtype, ck.shape)
err = np.abs(a - ck).max()
assert err <= float(max_error) * (1 + 1e-6), (err, max_error)
# Read in stored order, the rows of each head are elsewhere: far from the checkpoint.
stored = np.load(mapped)
assert np.abs(stored - ck).max() > 4 * err, (np.abs(stored - ck).max(), err)
names = json.load(open(sys.argv[7]))["names"]
every = load_file(st)
shown = {n for n, e in names.items() if e["status"] == "matched"}
assert set(every) == shown, set(every) ^ shown
for n in shown:
    assert str(every[n].dtype) == {"F32": "float32"}[names[n]["dtype"]], n
    assert list(every[n].shape) == names[n]["shape"], n
assert np.array_equal(every[name], a)
print(err)
"#,
        &[
            arg(&m.path(&format!("names/{q}.npy"))),
            arg(file),
            q,
            &t.quality.max_error.to_string(),
            arg(&m.path("names.safetensors")),
            arg(&m.path(&format!("{}.f32.npy", t.stored.path))),
            arg(&map_path),
        ],
    );
    assert!(ok, "{out}{err}");
    // The name's .json says what it is stored as.
    let v: Value =
        serde_json::from_slice(&std::fs::read(m.path(&format!("names/{q}.json"))).unwrap())
            .unwrap();
    assert_eq!(v["view"]["read_from"], t.stored.path.as_str());
    assert_eq!(v["view"]["stored"], "XNNPACK qbint4[64,64]");
    assert_eq!(v["view"]["scheme"], "groups of 32, bf16 scales");
    assert_eq!(v["view"]["transform"]["kind"], "rotary");
    assert_eq!(v["targets"][0]["rms_steps"], t.quality.rms_steps);
    let svg = std::fs::read(m.path(&format!("names/{q}.hist.svg"))).unwrap();
    assert_eq!(svg.len(), 24 * 1024);
    assert!(String::from_utf8_lossy(&svg).contains("rotary hf_to_meta"));
    // Named files are writable (docs/tree.md#named-views), their .json is not.
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path(&format!("names/{q}.json")))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
    m.umount();
}

/// A bfloat16 checkpoint, learned at mount: `names.safetensors` keeps BF16 (NumPy has no
/// bfloat16: its bytes are widened by hand here), the `.npy` shows the same values as
/// float32.
#[test]
fn a_mount_learning_from_a_bf16_checkpoint_keeps_its_dtype() {
    if fuse_missing() {
        return;
    }
    let c = copied("names_qwen");
    let ck = checkpoints("names_qwen/hf/model.safetensors");
    let log = c.root.join("log");
    let Copied {
        dir, model, data, ..
    } = c;
    let mut m = Mount::unmounted(
        dir,
        model,
        data,
        &["--names", arg(&ck), "--log-file", arg(&log), "-v"],
    );
    m.mount();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("24 of 24 checkpoint tensors matched"),
        "{logged}"
    );
    let (ok, out, err) = py(
        r#"
import sys, os, json, struct, numpy as np
st, ck, names_dir = sys.argv[1:4]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, e in h.items():
        s, t = e["data_offsets"]
        assert e["dtype"] == "BF16", (k, e["dtype"])
        raw = np.frombuffer(b[8 + n + s:8 + n + t], dtype=np.uint16)
        out[k] = (raw.astype(np.uint32) << 16).view(np.float32).reshape(e["shape"])
    return out
got, want = tensors(st), tensors(ck)
assert set(got) == set(want), set(got) ^ set(want)
worst = 0
for k in want:
    a = np.load(os.path.join(names_dir, k + ".npy"))
    assert a.dtype == np.float32 and a.shape == want[k].shape, k
    assert np.array_equal(a, got[k]), k
    meta = json.load(open(os.path.join(names_dir, k + ".json")))
    bound = min(t["max_error"] for t in meta["targets"])
    err = float(np.abs(a - want[k]).max())
    # Rounded to bfloat16 once more: at most half a bfloat16 step on top.
    assert err <= bound + float(np.abs(want[k]).max()) * 2**-8, (k, err, bound)
    worst = max(worst, err)
print(len(want), worst)
"#,
        &[
            arg(&m.path("names.safetensors")),
            arg(&ck),
            arg(&m.path("names")),
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.starts_with("24 "), "{out}");
    m.umount();
}

/// A map is for the files it was learned on: a changed byte refuses the mount (and `ls`)
/// with the names command's message.
#[test]
fn a_stale_map_is_refused() {
    let c = copied("names_llama");
    let (map_path, _) = learn_map(&c, &checkpoints("names_llama/hf"));
    let ptd = &c.data[0];
    nudge(&c, EMBEDDING);
    let (code, _, err) = ptefs(&[&"ls", &c.model, &"--data", ptd, &"--names", &map_path]);
    assert_ne!(code, 0);
    assert!(
        err.contains("changed since the map was learned") && err.contains("ptefs names"),
        "{err}"
    );
    if fuse_missing() {
        return;
    }
    let Copied {
        dir, model, data, ..
    } = c;
    let m = Mount::unmounted(dir, model, data, &["--names", arg(&map_path)]);
    let out = run(&mut m.mount_command());
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("changed since the map was learned"), "{err}");
}

/// A commit of a file other than the named views through a `--names MAP` mount (a `.bin`)
/// also gives the map file the files' new digests, so `ptefs names --map` accepts them
/// (docs/writes.md#writing-through-the-named-views).
#[test]
fn any_commit_through_a_names_mount_keeps_the_map_digests() {
    if fuse_missing() {
        return;
    }
    let c = copied("names_llama");
    let (map_path, _) = learn_map(&c, &checkpoints("names_llama/hf"));
    let Copied {
        dir, model, data, ..
    } = c;
    let mut m = Mount::unmounted(
        dir,
        model.clone(),
        data.clone(),
        &["--names", arg(&map_path)],
    );
    m.mount();
    let before = digests(&model, &data);
    let (ok, out, err) = py(
        "import sys\nb = bytearray(open(sys.argv[1], 'rb').read()); b[0] ^= 1\n\
         with open(sys.argv[1], 'r+b') as f: f.write(b)",
        &[arg(&m.path(EMBEDDING))],
    );
    assert!(ok, "{out}{err}");
    m.umount();
    let after = digests(&model, &data);
    assert_ne!(after, before, "the .bin was committed");
    let recorded: Vec<String> = NameMap::read(&map_path)
        .unwrap()
        .files
        .iter()
        .map(|f| f.sha256.clone().unwrap())
        .collect();
    assert_eq!(recorded, after);
    let ptd = &data[0];
    let (code, _, err) = ptefs(&[&"names", &model, &"--data", ptd, &"--map", &map_path]);
    assert_eq!(code, 0, "{err}");
}

/// `ptefs cat --names CHECKPOINT` learns and serves the same bytes as with the map.
#[test]
fn ls_and_cat_take_names_too() {
    let c = copied("names_llama");
    let hf = checkpoints("names_llama/hf");
    let (map_path, map) = learn_map(&c, &hf);
    let (code, out, err) = ptefs(&[
        &"ls", &c.model, &"names", &"--data", &c.data[0], &"--names", &map_path,
    ]);
    assert_eq!(code, 0, "{err}");
    let listed = String::from_utf8(out).unwrap();
    assert_eq!(listed.lines().count(), 3 * map.matched(), "{listed}");
    let cat = |names: &Path| {
        let (code, out, err) = ptefs(&[
            &"cat",
            &c.model,
            &"names.safetensors",
            &"--data",
            &c.data[0],
            &"--names",
            &names,
        ]);
        assert_eq!(code, 0, "{err}");
        (out, err)
    };
    let (by_map, quiet) = cat(&map_path);
    assert!(quiet.is_empty(), "{quiet}");
    let (learned, report) = cat(&hf);
    assert_eq!(by_map, learned);
    assert!(
        report.contains("21 of 21 checkpoint tensors matched"),
        "{report}"
    );
}

fn diff_json(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, Value, String) {
    let (code, out, err) = ptefs(args);
    let v: Value = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{e}: {}\n{err}", String::from_utf8_lossy(&out)));
    (code, v, err)
}

/// `diff --names`: a model against the checkpoint it was exported from pairs every named
/// weight by its checkpoint name, each with its quantization error, the rotary q and k
/// compared in the checkpoint's row order.
#[test]
fn diff_names_pairs_by_checkpoint_name() {
    let c = copied("names_llama");
    let hf = c.root.join("hf.safetensors");
    merged(&checkpoints("names_llama/hf"), &hf);
    let (map_path, map) = learn_map(&c, &checkpoints("names_llama/hf"));
    let args = |names: &Path| -> (i32, Value, String) {
        diff_json(&[
            &"diff",
            &c.model,
            &hf,
            &"--data-a",
            &c.data[0],
            &"--names",
            &names.to_path_buf(),
            &"--json",
        ])
    };
    for names in [&map_path, &hf] {
        let (code, v, err) = args(names);
        assert_eq!(code, 1, "{err}");
        let tensors = v["tensors"].as_array().unwrap();
        let paired: Vec<&Value> = tensors
            .iter()
            .filter(|t| t["paired_by"] == "checkpoint_name")
            .collect();
        assert_eq!(paired.len(), map.matched(), "{}", v["summary"]);
        for n in &map.names {
            let Status::Matched { targets, .. } = &n.status else {
                continue;
            };
            let t = paired
                .iter()
                .find(|t| t["checkpoint_name"] == n.name.as_str())
                .unwrap_or_else(|| panic!("{} not paired", n.name));
            assert_eq!(t["b"]["name"], n.name.as_str());
            let target = targets
                .iter()
                .find(|x| {
                    std::iter::once(&x.stored.path)
                        .chain(&x.stored.also)
                        .any(|p| t["a"]["path"] == p.as_str())
                })
                .expect("paired with one of its targets");
            assert_eq!(t["transform_a"], target.transform.to_string().as_str());
            // The error diff measures is the one the map recorded for every element.
            let max_abs = t["metrics"]["max_abs"].as_f64().unwrap_or(0.0);
            assert!(
                (max_abs - target.quality.max_error).abs() <= 1e-6,
                "{}: {max_abs} vs {}",
                n.name,
                target.quality.max_error
            );
            if target.quality.max_error > 0.0 {
                assert!(t["metrics"]["cosine"].as_f64().unwrap() > 0.99, "{t}");
            }
        }
        let q = paired
            .iter()
            .find(|t| t["checkpoint_name"] == "model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(q["transform_a"], "rotary hf_to_meta, 4 heads");
    }
    // Text: the name and the transform on the line.
    let (_, out, _) = ptefs(&[
        &"diff",
        &c.model,
        &hf,
        &"--data-a",
        &c.data[0],
        &"--names",
        &map_path,
    ]);
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains(
            "(by checkpoint name model.layers.0.self_attn.q_proj.weight, a: rotary hf_to_meta, 4 heads)"
        ),
        "{out}"
    );
}

/// Two models: a map fits only the files it was learned on; a checkpoint is learned on
/// each side.
#[test]
fn diff_names_of_two_models() {
    let a = copied("names_llama");
    let b = copied("names_llama");
    let hf = checkpoints("names_llama/hf");
    let (map_path, map) = learn_map(&a, &hf);
    let run_diff = |b_data: &Path, names: &Path| {
        diff_json(&[
            &"diff",
            &a.model,
            &b.model,
            &"--data-a",
            &a.data[0],
            &"--data-b",
            &b_data.to_path_buf(),
            &"--names",
            &names.to_path_buf(),
            &"--json",
        ])
    };
    // The same files on both sides: every name pairs, all identical.
    let (code, v, err) = run_diff(&b.data[0], &map_path);
    assert_eq!(code, 0, "{err}{}", v["summary"]);
    let by_name = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["paired_by"] == "checkpoint_name")
        .count();
    assert_eq!(by_name, map.matched());
    // B changed: the map no longer fits it.
    nudge(&b, EMBEDDING);
    let (code, _, err) = ptefs(&[
        &"diff",
        &a.model,
        &b.model,
        &"--data-a",
        &a.data[0],
        &"--data-b",
        &b.data[0],
        &"--names",
        &map_path,
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the map was learned on A's files") && err.contains("--names CHECKPOINT"),
        "{err}"
    );
    // A checkpoint: each side learns its names, and the changed tensor shows.
    let (code, v, err) = run_diff(&b.data[0], &hf);
    assert_eq!(code, 1, "{err}");
    let changed: Vec<&Value> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "changed")
        .collect();
    assert_eq!(changed.len(), 1, "{}", v["summary"]);
    assert_eq!(changed[0]["paired_by"], "checkpoint_name");
}

/// SHA-256 of every file of `c` and the map beside it.
fn digests(c_model: &Path, c_data: &[PathBuf]) -> Vec<String> {
    std::iter::once(c_model)
        .chain(c_data.iter().map(PathBuf::as_path))
        .map(|p| {
            let out = run(Command::new("sha256sum").arg(p));
            text(&out.stdout)
                .split_whitespace()
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Writes by name through a real mount (docs/writes.md#writing-through-the-named-views):
/// refusals (a name the map lacks, a shape other than the checkpoint's, a NaN) change
/// nothing and say why in `errors`; a rotary-permuted 4-bit q written as a `.npy` and a
/// BF16 k written into `names.safetensors` read back by name within re-quantization, the
/// map's digests follow the files, and the files are byte for byte what `ptefs apply
/// --names` makes of the same values on a copy.
#[test]
fn writes_by_name_through_a_mount_commit_as_apply_names_does() {
    if fuse_missing() {
        return;
    }
    let hf = checkpoints("names_llama/hf");
    let c = copied("names_llama");
    let twin = copied("names_llama");
    let (map_path, map) = learn_map(&c, &hf);
    let (twin_map, _) = learn_map(&twin, &hf);
    let q = "model.layers.0.self_attn.q_proj.weight";
    let k = "model.layers.0.self_attn.k_proj.weight";
    for n in [q, k] {
        assert!(
            matches!(map.name(n).unwrap().status, Status::Matched { .. }),
            "{n}"
        );
    }
    let work = c.root.join("work");
    std::fs::create_dir(&work).unwrap();
    // New values: the checkpoint's, moved by noise; refusals' files beside them.
    let (ok, out, err) = py(
        r#"
import sys, os, json, struct, numpy as np
from safetensors.numpy import load_file
hf, work, q, k = sys.argv[1:5]
index = json.load(open(os.path.join(hf, "model.safetensors.index.json")))["weight_map"]
ck = lambda n: load_file(os.path.join(hf, index[n]))[n]
rng = np.random.default_rng(7)
qn = (ck(q) + 0.5 * ck(q).std() * rng.standard_normal(ck(q).shape)).astype(np.float32)
kn = (ck(k) + 0.5 * ck(k).std() * rng.standard_normal(ck(k).shape)).astype(np.float32)
kb = (kn.view(np.uint32) >> 16).astype(np.uint16)
np.save(os.path.join(work, "q.npy"), qn)
np.save(os.path.join(work, "k_bf16_as_f32.npy"), (kb.astype(np.uint32) << 16).view(np.float32))
np.save(os.path.join(work, "wide.npy"), np.zeros((qn.shape[0], qn.shape[1] // 2), np.float32))
bad = qn.copy(); bad[3, 5] = np.nan
np.save(os.path.join(work, "nan.npy"), bad)
def st(path, tensors):
    h, off, body = {}, 0, b""
    for name, dtype, arr in tensors:
        b = arr.tobytes()
        h[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); body += b
    j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + body)
st(os.path.join(work, "k.safetensors"), [(k, "BF16", kb)])
st(os.path.join(work, "both.safetensors"), [(q, "F32", qn), (k, "BF16", kb)])
st(os.path.join(work, "stranger.safetensors"), [(k, "BF16", kb), ("model.nope.weight", "F32", qn)])
"#,
        &[arg(&hf), arg(&work), q, k],
    );
    assert!(ok, "{out}{err}");
    let Copied {
        dir, model, data, ..
    } = c;
    let mut m = Mount::unmounted(
        dir,
        model.clone(),
        data.clone(),
        &["--names", arg(&map_path)],
    );
    m.mount();
    let before = digests(&model, &data);
    let map_before = std::fs::read(&map_path).unwrap();
    let write = |from: &str, to: &str| {
        py_errno(
            "with open(sys.argv[2], 'wb') as f: f.write(open(sys.argv[1], 'rb').read())",
            &[arg(&work.join(from)), arg(&m.path(to))],
        )
    };
    let q_npy = format!("names/{q}.npy");
    for (from, to, why) in [
        (
            "stranger.safetensors",
            "names.safetensors",
            "\"model.nope.weight\": not a name of the map",
        ),
        ("wide.npy", q_npy.as_str(), "expected shape [64, 64]"),
        (
            "nan.npy",
            q_npy.as_str(),
            "element 197 (NaN) is not a finite value",
        ),
    ] {
        assert_eq!(write(from, to), "EINVAL", "{from}");
        let errors = std::fs::read_to_string(m.path("errors")).unwrap();
        assert!(errors.contains(why), "{from}: {errors}");
    }
    assert_eq!(digests(&model, &data), before);
    assert_eq!(std::fs::read(&map_path).unwrap(), map_before);

    // The q, then the k, each through its own file.
    let out = run(Command::new("cp")
        .arg(work.join("q.npy"))
        .arg(m.path(&q_npy)));
    assert!(out.status.success(), "cp: {}", text(&out.stderr));
    let out = run(Command::new("cp")
        .arg(work.join("k.safetensors"))
        .arg(m.path("names.safetensors")));
    assert!(out.status.success(), "cp: {}", text(&out.stderr));
    let (ok, out, err) = py(
        r#"
import sys, numpy as np
from safetensors.numpy import load_file
work, q_npy, k_npy, st, q, k = sys.argv[1:7]
for new, back in [(np.load(work + "/q.npy"), np.load(q_npy)),
                  (np.load(work + "/k_bf16_as_f32.npy"), np.load(k_npy))]:
    # 4-bit groups with bfloat16 scales: within a step of the whole range (range / 15),
    # while the noise moved values by half their spread.
    err = np.abs(back - new).max()
    assert err <= (new.max() - new.min()) / 15, (err, new.max() - new.min())
every = load_file(st)
assert np.array_equal(every[q], np.load(q_npy))
assert np.array_equal(every[k], np.load(k_npy))
"#,
        &[
            arg(&work),
            arg(&m.path(&q_npy)),
            arg(&m.path(&format!("names/{k}.npy"))),
            arg(&m.path("names.safetensors")),
            q,
            k,
        ],
    );
    assert!(ok, "{out}{err}");
    m.umount();
    let after = digests(&model, &data);
    assert_ne!(after, before);
    // The map file now holds the files' new digests.
    let now = NameMap::read(&map_path).unwrap();
    let recorded: Vec<String> = now
        .files
        .iter()
        .map(|f| f.sha256.clone().unwrap())
        .collect();
    assert_eq!(recorded, after);

    // `ptefs apply --names` of the same values on the copy: the same bytes, the same map.
    let req = ptefs::commands::ApplyRequest {
        file: twin.model.clone(),
        data: twin.data.clone(),
        update: work.join("both.safetensors"),
        names: vec![twin_map.clone()],
        dry_run: false,
    };
    ptefs::commands::apply(&req, &mut Vec::new()).unwrap();
    for (a, b) in std::iter::once(&model)
        .chain(&data)
        .zip(std::iter::once(&twin.model).chain(&twin.data))
    {
        assert!(
            std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
            "{}",
            a.display()
        );
    }
    assert_eq!(
        std::fs::read_to_string(&map_path).unwrap(),
        std::fs::read_to_string(&twin_map).unwrap()
    );
}
