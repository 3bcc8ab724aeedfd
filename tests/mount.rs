//! Tests that mount for real, through the `ptefs` binary and the tools people use: `ls`,
//! `cat`, `dd`, `cp`, `xxd`, `getfattr`, Python's `open` and NumPy. Every fixture manifest in
//! `tests/fixtures` (and `tests/fixtures/extra`) is mounted; what a mount must show comes
//! from the manifests and `.tree` lists, never from facts written here.
//!
//! They need `/dev/fuse` and the right to mount (root in CI), plus `xxd`, `getfattr` and a
//! `python3` with NumPy (`.ci/run` installs them). A missing `/dev/fuse` or tool is a
//! failure (see `common::fuse_missing`).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::mount::{py, py_errno, run, text, tool, xattr, Mount, BIN};
use common::{
    copy_files, fixture_files, fuse_missing, is_mounted, load_json, mountinfo_line, pattern,
    sha256_hex, Copied,
};

/// One fixture: a model file, its manifest, its `.tree` list and the `.ptd` files it needs.
struct Fixture {
    name: String,
    file: PathBuf,
    manifest: Value,
    data: Vec<PathBuf>,
    tree: Vec<String>,
}

impl Fixture {
    fn load(manifest_path: &Path) -> Fixture {
        let (file, data) = fixture_files(manifest_path);
        let manifest = load_json(manifest_path);
        let tree_path = PathBuf::from(format!("{}.tree", file.display()));
        // The lists name the `vulkan/` directories of decoded Vulkan delegates. While the
        // dispatcher has no Vulkan decoder the mount shows none; once it has one, they count.
        let vulkan_shown = !matches!(
            ptefs::backend::decode_payload(ptefs::backend::vulkan::BACKEND_ID, b"\0\0\0\0VK00"),
            Err(ptefs::backend::NotDecoded::NoDecoder)
        );
        let tree = std::fs::read_to_string(&tree_path)
            .unwrap_or_else(|e| panic!("{}: {e}", tree_path.display()))
            .lines()
            .filter(|l| !l.is_empty() && (vulkan_shown || !l.contains("/vulkan/")))
            .map(str::to_string)
            .collect();
        Fixture {
            name: file.file_name().unwrap().to_string_lossy().into_owned(),
            file,
            manifest,
            data,
            tree,
        }
    }

    /// The fixture whose model file is called `name`.
    fn named(name: &str) -> Fixture {
        all_fixtures()
            .into_iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no fixture {name}"))
    }

    fn data_manifest(&self, ptd: &Path) -> Value {
        load_json(&PathBuf::from(format!("{}.json", ptd.display())))
    }
}

/// Every fixture with a manifest, in `tests/fixtures` and `tests/fixtures/extra`.
fn all_fixtures() -> Vec<Fixture> {
    let manifests = common::manifests();
    assert!(!manifests.is_empty(), "no fixture manifests found");
    manifests.iter().map(|m| Fixture::load(m)).collect()
}

/// Every path below `root` (directories with a trailing `/`), by readdir, as `ls -R` walks.
/// The paths a mount shows: the model's tree (`.tree` lists), and `errors`, the mount's list
/// of refused writes, at the root.
fn mount_paths(tree: &[String]) -> Vec<String> {
    let mut paths = tree.to_vec();
    paths.push(ptefs::fs::ERRORS_NAME.to_string());
    paths
}

fn walk(root: &Path) -> Vec<(String, std::fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                stack.push((e.path(), format!("{prefix}{name}/")));
                out.push((format!("{prefix}{name}/"), meta));
            } else {
                out.push((format!("{prefix}{name}"), meta));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// File names docs/tree.md#names-and-percent-encoding gives plan names and keys: `%` (first, so
/// that the escapes that follow stay as they are), `/` and NUL percent-encoded, `.` and `..`
/// spelled out.
fn encode(name: &str) -> String {
    match name {
        "." => "%2E".into(),
        ".." => "%2E%2E".into(),
        "" => "%".into(),
        _ => name
            .replace('%', "%25")
            .replace('/', "%2F")
            .replace('\0', "%00"),
    }
}

fn plan_dirs(manifest: &Value) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in manifest["plans"].as_array().unwrap() {
        let base = encode(p["name"].as_str().unwrap());
        let mut name = base.clone();
        let mut n = 1;
        while !seen.insert(name.clone()) {
            name = format!("{base}~{n}");
            n += 1;
        }
        out.push(format!("plans/{name}"));
    }
    out
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_i64().unwrap()).collect())
        .unwrap_or_default()
}

/// The physical shape of a `.npy`: sizes in dim order.
fn npy_shape(sizes: &Value, dim_order: &Value) -> Vec<i64> {
    let sizes = ints(sizes);
    let order = ints(dim_order);
    if order.len() == sizes.len() {
        order.iter().map(|&d| sizes[d as usize]).collect()
    } else {
        sizes
    }
}

/// What the manifests say about a mount's files.
#[derive(Default)]
struct Expected {
    /// sha256 of files whose bytes the manifests know.
    sha: BTreeMap<String, String>,
    /// NumPy shape of each `.npy`.
    npy: BTreeMap<String, Vec<i64>>,
    /// Shape of each float32 view (`xnnpack/values/<id>.f32.npy`), and whether it is
    /// writable (quantized constants are; fp16 and bf16 ones are not).
    f32: BTreeMap<String, (Vec<i64>, bool)>,
}

fn expect_ptd(prefix: &str, m: &Value, out: &mut Expected) {
    for nd in m["named_data"].as_array().into_iter().flatten() {
        let key = encode(nd["key"].as_str().unwrap());
        out.sha.insert(
            format!("{prefix}named_data/{key}.bin"),
            nd["sha256"].as_str().unwrap().into(),
        );
        let layout = &nd["tensor_layout"];
        if layout.is_object() {
            out.npy.insert(
                format!("{prefix}named_data/{key}.npy"),
                npy_shape(&layout["sizes"], &layout["dim_order"]),
            );
        }
    }
    for (n, s) in m["segments"].as_array().into_iter().flatten().enumerate() {
        out.sha.insert(
            format!("{prefix}segments/{n}"),
            s["sha256"].as_str().unwrap().into(),
        );
    }
}

fn expected(fx: &Fixture) -> Expected {
    let m = &fx.manifest;
    let mut out = Expected::default();
    if m["kind"] == "ptd" {
        expect_ptd("", m, &mut out);
        return out;
    }
    // Named blobs of the attached .ptd files, by key, for EXTERNAL tensors.
    let mut external = BTreeMap::new();
    for d in &fx.data {
        let dm = fx.data_manifest(d);
        let stem = d.file_stem().unwrap().to_string_lossy().into_owned();
        expect_ptd(&format!("data/{}/", encode(&stem)), &dm, &mut out);
        for nd in dm["named_data"].as_array().into_iter().flatten() {
            external.insert(
                nd["key"].as_str().unwrap().to_string(),
                nd["sha256"].as_str().unwrap().to_string(),
            );
        }
    }
    expect_ptd("", m, &mut out);
    // Named data by key, as the runtime finds it: the program's own first, then the data
    // files'.
    let mut named = external.clone();
    for nd in m["named_data"].as_array().into_iter().flatten() {
        named.insert(
            nd["key"].as_str().unwrap().to_string(),
            nd["sha256"].as_str().unwrap().to_string(),
        );
    }
    for (plan, dir) in m["plans"].as_array().unwrap().iter().zip(plan_dirs(m)) {
        for v in plan["values"].as_array().unwrap() {
            if v["kind"] != "Tensor" {
                continue;
            }
            let i = v["index"].as_i64().unwrap();
            let sha = v["sha256"].as_str().map(str::to_string).or_else(|| {
                v["extra_tensor_info"]["fully_qualified_name"]
                    .as_str()
                    .filter(|_| v["data"] == "external")
                    .and_then(|fqn| external.get(fqn).cloned())
            });
            if let Some(sha) = sha {
                out.sha.insert(format!("{dir}/values/{i}.bin"), sha);
                out.npy.insert(
                    format!("{dir}/values/{i}.npy"),
                    npy_shape(&v["sizes"], &v["dim_order"]),
                );
            }
        }
        for (j, d) in plan["delegates"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            out.sha.insert(
                format!("{dir}/delegates/{j}/processed.bin"),
                d["sha256"].as_str().unwrap().into(),
            );
            expect_xnnpack(
                &format!("{dir}/delegates/{j}/xnnpack"),
                &d["xnnpack"],
                &named,
                &mut out,
            );
            expect_vulkan(
                &format!("{dir}/delegates/{j}/vulkan"),
                &d["vulkan"],
                &named,
                &mut out,
            );
        }
    }
    out
}

/// What the manifest's decoding of an XNNPACK payload says about `xnnpack/values/`: the
/// bytes of constants kept as named data (their key's sha256 in `named`), the NumPy shapes
/// (4-bit types packed two to a byte), and the float32 views.
fn expect_xnnpack(dir: &str, x: &Value, named: &BTreeMap<String, String>, out: &mut Expected) {
    let Some(values) = x["values"].as_array() else {
        return;
    };
    let constants = x["constant_data"].as_array().cloned().unwrap_or_default();
    for v in values {
        let idx = v["constant_buffer_idx"].as_u64().unwrap_or(0) as usize;
        if idx == 0 {
            continue;
        }
        let Some(key) = constants.get(idx).and_then(|c| c["named_key"].as_str()) else {
            continue;
        };
        let Some(sha) = named.get(key) else {
            continue;
        };
        let id = v["id_out"].as_u64().unwrap();
        let datatype = v["datatype"]
            .as_str()
            .unwrap()
            .trim_start_matches("xnn_datatype_");
        let dims = ints(&v["dims"]);
        out.sha
            .insert(format!("{dir}/values/{id}.bin"), sha.clone());
        let mut npy = dims.clone();
        if datatype.ends_with("int4") {
            match npy.last_mut() {
                Some(last) => *last = (*last + 1) / 2,
                None => npy.push(1),
            }
        }
        out.npy.insert(format!("{dir}/values/{id}.npy"), npy);
        if datatype != "fp32" {
            let quantized = datatype.starts_with('q');
            out.f32
                .insert(format!("{dir}/values/{id}.f32.npy"), (dims, quantized));
        }
    }
}

/// What the manifest's decoding of a Vulkan payload says about `vulkan/values/`: the bytes
/// of constants kept as named data, their NumPy shapes (the tensor's dims), and the float32
/// views the manifest computed (`f32`), which are read-only.
fn expect_vulkan(dir: &str, x: &Value, named: &BTreeMap<String, String>, out: &mut Expected) {
    let Some(values) = x["values"].as_array() else {
        return;
    };
    let constants = x["constants"].as_array().cloned().unwrap_or_default();
    for v in values {
        let Some(cid) = v["constant_id"].as_i64().filter(|&c| c >= 0) else {
            continue;
        };
        let Some(key) = constants
            .get(cid as usize)
            .and_then(|c| c["named_key"].as_str())
        else {
            continue;
        };
        let Some(sha) = named.get(key) else {
            continue;
        };
        let id = v["id"].as_u64().unwrap();
        out.sha
            .insert(format!("{dir}/values/{id}.bin"), sha.clone());
        out.npy
            .insert(format!("{dir}/values/{id}.npy"), ints(&v["dims"]));
        if v["f32"].is_object() {
            out.f32.insert(
                format!("{dir}/values/{id}.f32.npy"),
                (ints(&v["f32"]["shape"]), false),
            );
        }
    }
}

/// Files docs/writes.md#writable-files makes writable (float32 views: as `exp` says).
fn writable(path: &str, exp: &Expected) -> bool {
    if let Some((_, w)) = exp.f32.get(path) {
        return *w;
    }
    if path == "weights.safetensors" || path.ends_with("/weights.safetensors") {
        return true;
    }
    let parts: Vec<&str> = path.split('/').collect();
    let n = parts.len();
    let name = parts[n - 1];
    let parent = if n >= 2 { parts[n - 2] } else { "" };
    let raw = name.ends_with(".bin") || name.ends_with(".npy");
    ((parent == "values" || parent == "named_data") && raw)
        || (parent == "segments" && !name.is_empty())
        || (name == "processed.bin" && n >= 3 && parts[n - 3] == "delegates")
}

fn getxattr(path: &Path, name: &str) -> Option<String> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the given length.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        return None;
    }
    buf.truncate(len as usize);
    Some(String::from_utf8(buf).unwrap())
}

fn paths_of(tree: &[String], pred: impl Fn(&str) -> bool) -> Vec<String> {
    tree.iter().filter(|p| pred(p)).cloned().collect()
}

/// Runs `test` on every fixture; it returns false where the fixture has nothing to test.
/// Fails with `none` unless at least one fixture was tested.
fn for_fixtures(none: &str, mut test: impl FnMut(&Fixture) -> bool) {
    let tested = all_fixtures().iter().filter(|fx| test(fx)).count();
    assert!(tested > 0, "{none}");
}

/// `with_tensor_bin`, mounted; `None` where FUSE is missing and that is expected.
fn mounted_with_tensor_bin() -> Option<(Fixture, String, Mount)> {
    if fuse_missing() {
        return None;
    }
    let (fx, target) = with_tensor_bin();
    let m = Mount::new(&fx.file, &fx.data, &[]);
    Some((fx, target, m))
}

/// The bytes of tensor file `f` of a mount in its model file, where its xattrs say they are.
fn in_model(f: &Path) -> Vec<u8> {
    let offset: usize = getxattr(f, "user.ptefs.offset").unwrap().parse().unwrap();
    let len = std::fs::metadata(f).unwrap().len() as usize;
    std::fs::read(getxattr(f, "user.ptefs.file").unwrap()).unwrap()[offset..offset + len].to_vec()
}

/// The first fixture with a tensor `.bin`, and that file's path.
fn with_tensor_bin() -> (Fixture, String) {
    all_fixtures()
        .into_iter()
        .find_map(|fx| {
            let bin = paths_of(&fx.tree, |p| p.contains("/values/") && p.ends_with(".bin"));
            bin.into_iter().next().map(|b| (fx, b))
        })
        .expect("a fixture with a tensor .bin")
}

// ---------------------------------------------------------------------------------------

/// Everything a read-only user sees, for one fixture.
fn check_fixture(fx: &Fixture) -> Vec<String> {
    let mut errors = Vec::new();
    let mut err = |e: String| errors.push(format!("{}: {e}", fx.name));
    let mut m = Mount::new(&fx.file, &fx.data, &[]);
    let exp = expected(fx);

    // The tree: exactly the listed paths.
    let seen = walk(&m.mnt);
    let names: Vec<String> = seen.iter().map(|(p, _)| p.clone()).collect();
    let mut want = mount_paths(&fx.tree);
    want.sort();
    if names != want {
        let a: BTreeSet<_> = names.iter().collect();
        let b: BTreeSet<_> = want.iter().collect();
        err(format!(
            "tree differs: extra {:?}, missing {:?}",
            a.difference(&b).collect::<Vec<_>>(),
            b.difference(&a).collect::<Vec<_>>()
        ));
    }
    let ls = run(Command::new("ls").arg("-lR").arg(&m.mnt));
    if !ls.status.success() {
        err(format!("ls -lR failed: {}", text(&ls.stderr)));
    }

    // Modes, owner and times: those of the file whose tree a path is in (an attached
    // file's tree is under data/<stem>/).
    let backing_of = |p: &str| {
        let stem = p
            .strip_prefix("data/")
            .and_then(|rest| rest.split('/').next())
            .filter(|s| !s.is_empty());
        let file = stem
            .and_then(|s| m.data.iter().find(|d| d.file_stem().unwrap() == s))
            .unwrap_or(&m.model);
        std::fs::metadata(file).unwrap()
    };
    for (p, meta) in &seen {
        let backing = backing_of(p);
        let perm = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            if perm != 0o555 && perm != 0o755 {
                err(format!("{p}: directory mode {perm:o}"));
            }
        } else {
            let want = if writable(p, &exp) { 0o644 } else { 0o444 };
            if perm != want {
                err(format!("{p}: mode {perm:o}, expected {want:o}"));
            }
            if meta.blksize() < 1 << 20 {
                err(format!("{p}: st_blksize {}", meta.blksize()));
            }
        }
        if (meta.uid(), meta.gid()) != (backing.uid(), backing.gid()) {
            err(format!("{p}: owner {}:{}", meta.uid(), meta.gid()));
        }
        if (meta.mtime(), meta.mtime_nsec()) != (backing.mtime(), backing.mtime_nsec()) {
            err(format!("{p}: mtime differs from the backing file's"));
        }
    }

    // Every file reads whole, with its stat size (cat).
    for (p, meta) in &seen {
        if meta.is_file() {
            match std::fs::read(m.path(p)) {
                Ok(b) if b.len() as u64 == meta.len() => {}
                Ok(b) => err(format!(
                    "{p}: read {} bytes, stat says {}",
                    b.len(),
                    meta.len()
                )),
                Err(e) => err(format!("{p}: cat: {e}")),
            }
        }
    }

    // Bytes with known hashes, by cat and dd bs=1M.
    for p in &names {
        let raw =
            !p.ends_with('/') && (p.ends_with(".bin") || p.rsplit('/').nth(1) == Some("segments"));
        if raw && !exp.sha.contains_key(p) {
            err(format!("{p}: no manifest hash covers this file"));
        }
    }
    for (p, sha) in &exp.sha {
        if !names.contains(p) {
            err(format!("{p}: expected by the manifest but not in the tree"));
            continue;
        }
        let cat = std::fs::read(m.path(p)).unwrap();
        if &sha256_hex(&cat) != sha {
            err(format!(
                "{p}: cat gives other bytes than the manifest's sha256"
            ));
        }
        let dd = tool(
            Command::new("dd")
                .arg(format!("if={}", m.path(p).display()))
                .args(["bs=1M", "status=none"]),
        );
        if &sha256_hex(&dd) != sha {
            err(format!(
                "{p}: dd bs=1M gives other bytes than the manifest's sha256"
            ));
        }
    }

    // Extended attributes, and xxd of the backing file at user.ptefs.offset.
    let backing_files: Vec<PathBuf> = std::iter::once(m.model.clone())
        .chain(m.data.clone())
        .collect();
    for p in &names {
        let f = m.path(p);
        if p.ends_with(".bin") || p.ends_with(".npy") {
            let dump = text(&tool(
                Command::new("getfattr")
                    .args(["-d", "--absolute-names"])
                    .arg(&f),
            ));
            for a in ["dtype", "shape", "dim_order", "file", "offset"] {
                if !dump.contains(&format!("user.ptefs.{a}=")) {
                    err(format!("{p}: getfattr -d lacks user.ptefs.{a}:\n{dump}"));
                }
            }
        }
        let Some(file) = getxattr(&f, "user.ptefs.file") else {
            continue;
        };
        if !backing_files.iter().any(|b| Path::new(&file) == b) {
            err(format!("{p}: user.ptefs.file is {file}"));
        }
        if p.ends_with(".npy") {
            let base = p.trim_end_matches(".npy").trim_end_matches(".f32");
            let bin = format!("{base}.bin");
            if getxattr(&f, "user.ptefs.offset") != getxattr(&m.path(&bin), "user.ptefs.offset") {
                err(format!("{p}: offset differs from {bin}'s"));
            }
            continue;
        }
        let len = std::fs::metadata(&f).unwrap().len();
        if len == 0 {
            continue;
        }
        let via_offset = tool(
            Command::new("sh")
                .arg("-c")
                .arg(r#"xxd -p -s "$(getfattr --only-values -n user.ptefs.offset "$1")" -l "$2" "$(getfattr --only-values -n user.ptefs.file "$1")""#)
                .arg("sh")
                .arg(&f)
                .arg(len.to_string()),
        );
        let direct = tool(Command::new("xxd").arg("-p").arg(&f));
        if via_offset != direct {
            err(format!(
                "{p}: xxd of the backing file at user.ptefs.offset differs"
            ));
        }
    }

    // NumPy loads every .npy with the physical shape and the .bin's bytes.
    let npys = paths_of(&names, |p| p.ends_with(".npy") && !p.ends_with(".f32.npy"));
    let mut checks = Vec::new();
    for p in &npys {
        let Some(shape) = exp.npy.get(p) else {
            err(format!("{p}: no manifest entry gives its shape"));
            continue;
        };
        checks.push(serde_json::json!({
            "npy": m.path(p),
            "bin": m.path(&format!("{}.bin", p.trim_end_matches(".npy"))),
            "shape": shape,
        }));
    }
    if !checks.is_empty() {
        let list = serde_json::to_string(&checks).unwrap();
        let (ok, stdout, stderr) = py(
            r#"
import json, sys, numpy
bad = []
for c in json.loads(sys.argv[1]):
    try:
        a = numpy.load(c["npy"], allow_pickle=False)
    except Exception as e:
        bad.append(f'{c["npy"]}: numpy.load: {e}')
        continue
    if list(a.shape) != c["shape"]:
        bad.append(f'{c["npy"]}: shape {list(a.shape)}, expected {c["shape"]}')
    if a.tobytes() != open(c["bin"], "rb").read():
        bad.append(f'{c["npy"]}: data differs from the .bin')
print("\n".join(bad))
sys.exit(1 if bad else 0)
"#,
            &[&list],
        );
        if !ok {
            err(format!("numpy: {stdout}{stderr}"));
        }
    }

    // Float32 views load with their shape and finite values.
    let views: Vec<serde_json::Value> = paths_of(&names, |p| p.ends_with(".f32.npy"))
        .iter()
        .map(|p| match exp.f32.get(p) {
            Some((shape, _)) => serde_json::json!({ "npy": m.path(p), "shape": shape }),
            None => {
                err(format!("{p}: no manifest value gives its shape"));
                serde_json::Value::Null
            }
        })
        .filter(|v| !v.is_null())
        .collect();
    if !views.is_empty() {
        let (ok, stdout, stderr) = py(
            r#"
import json, sys, numpy
bad = []
for c in json.loads(sys.argv[1]):
    a = numpy.load(c["npy"], allow_pickle=False)
    if a.dtype != numpy.float32 or list(a.shape) != c["shape"]:
        bad.append(f'{c["npy"]}: {a.dtype}{list(a.shape)}, expected float32{c["shape"]}')
    elif not numpy.isfinite(a).all():
        bad.append(f'{c["npy"]}: values that are not finite')
print("\n".join(bad))
sys.exit(1 if bad else 0)
"#,
            &[&serde_json::to_string(&views).unwrap()],
        );
        if !ok {
            err(format!("float32 views: {stdout}{stderr}"));
        }
    }

    // Every weights.safetensors reads with the safetensors package, and each tensor's bytes
    // are those of the tree file its metadata names.
    for p in paths_of(&names, |p| p.ends_with("weights.safetensors")) {
        let prefix = p.trim_end_matches("weights.safetensors");
        let (ok, stdout, stderr) = py(
            r#"
import json, sys, struct
from safetensors import safe_open
path, root, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header.pop("__metadata__", {})
bad = []
with safe_open(path, "np") as f:
    if sorted(f.keys()) != sorted(header):
        bad.append(f"{path}: safe_open lists other tensors")
    if (f.metadata() or {}) != meta:
        bad.append(f"{path}: safe_open gives other metadata")
for name, t in header.items():
    b, e = t["data_offsets"]
    mine = raw[8 + n + b:8 + n + e]
    shown = open(root + "/" + meta[name] + ".bin", "rb").read()
    if mine != shown:
        bad.append(f"{path}: {name}: bytes differ from {meta[name]}.bin")
print("\n".join(bad))
sys.exit(1 if bad else 0)
"#,
            &[
                m.path(&p).to_str().unwrap(),
                m.mnt.to_str().unwrap(),
                prefix,
            ],
        );
        if !ok {
            err(format!("{p}: {stdout}{stderr}"));
        }
    }

    m.umount();
    errors
}

#[test]
fn every_fixture_mounts_with_its_tree_bytes_xattrs_and_npy_shapes() {
    if fuse_missing() {
        return;
    }
    let fixtures = all_fixtures();
    let errors: Vec<String> = std::thread::scope(|s| {
        let chunks: Vec<&[Fixture]> = fixtures.chunks(fixtures.len().div_ceil(4)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|c| s.spawn(move || c.iter().flat_map(check_fixture).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(errors.is_empty(), "\n{}", errors.join("\n"));
    eprintln!("checked {} fixtures", fixtures.len());
}

#[test]
fn read_only_mounts_show_0444_and_refuse_writes_with_erofs() {
    if fuse_missing() {
        return;
    }
    for fx in all_fixtures() {
        let m = Mount::new(&fx.file, &fx.data, &["--read-only"]);
        for (p, meta) in walk(&m.mnt) {
            let perm = meta.permissions().mode() & 0o7777;
            let want = if meta.is_dir() { 0o555 } else { 0o444 };
            assert_eq!(perm, want, "{}: {p} has mode {perm:o}", fx.name);
        }
        let exp = expected(&fx);
        let targets = paths_of(&fx.tree, |p| writable(p, &exp));
        let Some(target) = targets.first() else {
            continue;
        };
        let f = m.path(target);
        let f = f.to_str().unwrap();
        assert_eq!(py_errno("open(sys.argv[1], 'r+b')", &[f]), "EROFS");
        assert_eq!(py_errno("open(sys.argv[1], 'wb')", &[f]), "EROFS");
        assert_eq!(py_errno("os.truncate(sys.argv[1], 0)", &[f]), "EROFS");
        assert_eq!(py_errno("os.unlink(sys.argv[1])", &[f]), "EROFS");
        let scratch = format!("{f}.swp");
        assert_eq!(py_errno("open(sys.argv[1], 'wb')", &[&scratch]), "EROFS");
        assert_eq!(
            py_errno("os.setxattr(sys.argv[1], 'user.x', b'1')", &[f]),
            "EROFS"
        );
        let before = std::fs::read(&m.model).unwrap();
        drop(m);
        assert_eq!(before, std::fs::read(fx.file).unwrap(), "{}", fx.name);
    }
}

/// `cp` of a raw tensor over its `.bin`: the backing file is the original with exactly that
/// range replaced, and every view of the bytes (the `.npy`) shows the new ones.
#[test]
fn cp_of_a_same_size_tensor_replaces_exactly_its_range() {
    if fuse_missing() {
        return;
    }
    for_fixtures("no fixture has a tensor .bin", |fx| {
        let exp = expected(fx);
        let bins = paths_of(&fx.tree, |p| {
            writable(p, &exp) && p.ends_with(".bin") && p.contains("/values/")
        });
        if bins.is_empty() {
            return false;
        }
        let m = Mount::new(&fx.file, &fx.data, &[]);
        // A tensor sharing its bytes with a distinct tensor gets bytes of its own instead
        // (tests/identity.rs).
        let Some(target) = bins.iter().find(|p| !shares_with_distinct(&m.path(p))) else {
            return false;
        };
        let f = m.path(target);
        let len = std::fs::metadata(&f).unwrap().len() as usize;
        let offset: usize = getxattr(&f, "user.ptefs.offset").unwrap().parse().unwrap();
        let backing = PathBuf::from(getxattr(&f, "user.ptefs.file").unwrap());
        let npy = m.path(&format!("{}.npy", target.trim_end_matches(".bin")));
        let npy_before = std::fs::read(&npy).unwrap();
        let original = std::fs::read(&backing).unwrap();
        let others: Vec<(PathBuf, Vec<u8>)> = std::iter::once(&m.model)
            .chain(&m.data)
            .filter(|p| **p != backing)
            .map(|p| (p.clone(), std::fs::read(p).unwrap()))
            .collect();

        let new = pattern(len, 0x5a);
        let src = m.dir.path().join("new.bin");
        std::fs::write(&src, &new).unwrap();
        let out = run(Command::new("cp").arg(&src).arg(&f));
        assert!(
            out.status.success(),
            "{}: cp: {}",
            fx.name,
            text(&out.stderr)
        );

        let mut expected = original.clone();
        expected[offset..offset + len].copy_from_slice(&new);
        let after = std::fs::read(&backing).unwrap();
        assert_eq!(after.len(), original.len(), "{}: size changed", fx.name);
        assert!(
            after == expected,
            "{}: {target}: the backing file is not the original with exactly {offset}..{} replaced",
            fx.name,
            offset + len
        );
        for (p, bytes) in others {
            assert_eq!(
                std::fs::read(&p).unwrap(),
                bytes,
                "{}: {}",
                fx.name,
                p.display()
            );
        }
        assert_eq!(std::fs::read(&f).unwrap(), new, "{}: {target}", fx.name);
        let npy_after = std::fs::read(&npy).unwrap();
        let header = npy_before.len() - len;
        assert_eq!(&npy_after[..header], &npy_before[..header]);
        assert_eq!(&npy_after[header..], &new[..], "{}: stale .npy", fx.name);
        true
    });
}

/// Whether a tree file's bytes are shared with a distinct tensor (`user.ptefs.shared`).
fn shares_with_distinct(path: &Path) -> bool {
    getxattr(path, "user.ptefs.shared").is_some_and(|s| s.contains("distinct:"))
}

#[test]
fn numpy_save_onto_an_npy_commits_and_a_wrong_shape_is_einval() {
    if fuse_missing() {
        return;
    }
    for_fixtures("no fixture has a FLOAT .npy", |fx| {
        let npys = paths_of(&fx.tree, |p| p.ends_with(".npy") && p.contains("/values/"));
        let m = Mount::new(&fx.file, &fx.data, &[]);
        let Some(target) = npys.iter().find(|p| {
            let dtype = getxattr(&m.path(p), "user.ptefs.dtype");
            dtype.as_deref() == Some("FLOAT")
                && std::fs::metadata(m.path(p)).unwrap().len() > 128
                && !shares_with_distinct(&m.path(p))
        }) else {
            return false;
        };
        let f = m.path(target);
        let bin = m.path(&format!("{}.bin", target.trim_end_matches(".npy")));
        let offset: usize = getxattr(&f, "user.ptefs.offset").unwrap().parse().unwrap();
        let backing = PathBuf::from(getxattr(&f, "user.ptefs.file").unwrap());
        let (ok, out, errs) = py(
            r#"
import sys, numpy
p = sys.argv[1]
a = numpy.load(p)
b = (numpy.arange(a.size, dtype=a.dtype).reshape(a.shape) * 0.25 + 1.5).astype(a.dtype)
numpy.save(p, b)
c = numpy.load(p)
assert c.shape == a.shape and c.dtype == a.dtype and (c == b).all(), "not saved"
sys.stdout.write(b.tobytes().hex())
"#,
            &[f.to_str().unwrap()],
        );
        assert!(ok, "{}: numpy.save: {errs}", fx.name);
        let new: Vec<u8> = (0..out.len() / 2)
            .map(|i| u8::from_str_radix(&out[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(
            std::fs::read(&bin).unwrap(),
            new,
            "{}: .bin after save",
            fx.name
        );
        let file = std::fs::read(&backing).unwrap();
        assert_eq!(&file[offset..offset + new.len()], &new[..], "{}", fx.name);

        let before = std::fs::read(&backing).unwrap();
        let errno = py_errno(
            "import numpy\na = numpy.load(sys.argv[1])\nnumpy.save(sys.argv[1], a.reshape((1,) + a.shape))",
            &[f.to_str().unwrap()],
        );
        assert_eq!(errno, "EINVAL", "{}: wrong-shape save", fx.name);
        assert_eq!(std::fs::read(&backing).unwrap(), before, "{}", fx.name);
        let (ok, _, errs) = py(
            "import sys, numpy\nassert numpy.load(sys.argv[1]).tobytes() == open(sys.argv[2], 'rb').read()",
            &[f.to_str().unwrap(), bin.to_str().unwrap()],
        );
        assert!(ok, "{}: after a refused save: {errs}", fx.name);
        true
    });
}

#[test]
fn wrong_size_writes_fail_at_close_with_einval_and_change_nothing() {
    if fuse_missing() {
        return;
    }
    for_fixtures("no fixture has a tensor .bin", |fx| {
        let bins = paths_of(&fx.tree, |p| p.contains("/values/") && p.ends_with(".bin"));
        if bins.is_empty() {
            return false;
        }
        let m = Mount::new(&fx.file, &fx.data, &[]);
        // A tensor sharing its bytes with a distinct tensor gets bytes of its own instead
        // (tests/identity.rs).
        let Some(target) = bins.iter().find(|p| !shares_with_distinct(&m.path(p))) else {
            return false;
        };
        let f = m.path(target);
        let original = std::fs::read(&f).unwrap();
        let backing = PathBuf::from(getxattr(&f, "user.ptefs.file").unwrap());
        let sha = sha256_hex(&std::fs::read(&backing).unwrap());
        let fs = f.to_str().unwrap();
        // (A plain truncation closed without writes is committed at the last close, where
        // no error can be returned: see the fuse module.)
        let mut sizes = vec![original.len() + 4];
        if original.len() > 1 {
            sizes.push(original.len() - 1);
        }
        for n in sizes {
            let got = py_errno(
                "f = open(sys.argv[1], 'wb')\nf.write(b'\\x07' * int(sys.argv[2]))\nf.close()",
                &[fs, &n.to_string()],
            );
            assert_eq!(got, "EINVAL", "{}: {n} bytes into {target}", fx.name);
            assert_eq!(
                sha256_hex(&std::fs::read(&backing).unwrap()),
                sha,
                "{}: a rejected write changed the file",
                fx.name
            );
            assert_eq!(std::fs::read(&f).unwrap(), original, "{}", fx.name);
            assert_eq!(std::fs::metadata(&f).unwrap().len(), original.len() as u64);
        }
        // A shell redirection duplicates and closes the descriptor before writing.
        let sh = run(Command::new("sh")
            .arg("-c")
            .arg(format!("head -c {} /dev/zero > '{fs}'", original.len() + 1)));
        assert!(
            !sh.status.success(),
            "{}: sh redirection succeeded",
            fx.name
        );
        assert_eq!(sha256_hex(&std::fs::read(&backing).unwrap()), sha);
        true
    });
}

#[test]
fn read_only_files_are_eacces_and_the_tree_cannot_be_reshaped() {
    let Some((fx, target, m)) = mounted_with_tensor_bin() else {
        return;
    };
    let before = std::fs::read(&m.model).unwrap();
    let json = paths_of(&fx.tree, |p| p.ends_with(".json"));
    for p in json.iter().take(5) {
        let f = m.path(p);
        let f = f.to_str().unwrap();
        assert_eq!(py_errno("open(sys.argv[1], 'r+b')", &[f]), "EACCES", "{p}");
        assert_eq!(py_errno("open(sys.argv[1], 'wb')", &[f]), "EACCES", "{p}");
    }
    for p in json.iter().take(2) {
        let f = m.path(p);
        assert_eq!(
            py_errno("os.unlink(sys.argv[1])", &[f.to_str().unwrap()]),
            "EPERM"
        );
        assert!(f.exists());
    }
    let f = m.path(&target);
    let fs = f.to_str().unwrap();
    let dir = f.parent().unwrap().to_str().unwrap().to_string();
    assert_eq!(py_errno("os.mkdir(sys.argv[1] + '/x')", &[&dir]), "EPERM");
    assert_eq!(py_errno("os.rmdir(sys.argv[1])", &[&dir]), "EPERM");
    assert_eq!(
        py_errno("os.symlink('x', sys.argv[1] + '/l')", &[&dir]),
        "EPERM"
    );
    assert_eq!(
        py_errno("os.link(sys.argv[1], sys.argv[1] + '.2')", &[fs]),
        "EPERM"
    );
    assert_eq!(
        py_errno("os.rename(sys.argv[1], sys.argv[1] + '.moved')", &[fs]),
        "EPERM"
    );
    assert_eq!(
        py_errno("os.setxattr(sys.argv[1], 'user.ptefs.dtype', b'x')", &[fs]),
        "EPERM"
    );
    assert_eq!(py_errno("os.chmod(sys.argv[1], 0o600)", &[fs]), "EPERM");
    // A directory without writable files (a plan's) takes no new files.
    let plans = m.path("plans");
    let plan = std::fs::read_dir(&plans)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(
        py_errno(
            "open(sys.argv[1] + '/new.txt', 'wb')",
            &[plan.to_str().unwrap()]
        ),
        "EACCES"
    );
    assert_eq!(std::fs::read(&m.model).unwrap(), before);
}

/// `mv` from another filesystem, `install` and `cp --remove-destination` replace a file by
/// unlinking it, then creating and writing it again: each replaces a writable file, checked
/// like any write. An unlink alone (`rm`) deletes nothing: the name is back once the process
/// that unlinked it has exited.
#[test]
fn mv_and_install_replace_a_writable_file_and_rm_deletes_nothing() {
    let Some((_, target, m)) = mounted_with_tensor_bin() else {
        return;
    };
    let f = m.path(&target);
    let len = in_model(&f).len();
    let model_file = || std::fs::read(getxattr(&f, "user.ptefs.file").unwrap()).unwrap();
    // The temp dir holding the model is another filesystem than the mount.
    let src = m.dir.path().join("new.bin");
    let tools: [&[&str]; 4] = [
        &["mv"],
        &["install", "-m", "644"],
        &["install", "-T", "-m", "644"],
        &["cp", "--remove-destination"],
    ];
    for (round, tool) in tools.into_iter().enumerate() {
        let new = pattern(len, 0x31 + round as u8);
        std::fs::write(&src, &new).unwrap();
        let out = run(Command::new(tool[0]).args(&tool[1..]).arg(&src).arg(&f));
        assert!(out.status.success(), "{tool:?}: {}", text(&out.stderr));
        assert_eq!(in_model(&f), new, "{tool:?}");
        assert_eq!(std::fs::read(&f).unwrap(), new, "{tool:?}: read back");
        assert_eq!(src.exists(), tool[0] != "mv", "{tool:?}: the source");
    }
    let committed = in_model(&f);
    let whole = model_file();

    // A replacement of the wrong size is refused at close; the file stays as it was.
    std::fs::write(&src, pattern(len + 1, 7)).unwrap();
    let out = run(Command::new("mv").arg(&src).arg(&f));
    assert!(!out.status.success(), "mv of a wrong size succeeded");
    assert!(
        text(&out.stderr).contains("Invalid argument"),
        "{}",
        text(&out.stderr)
    );
    assert!(src.exists(), "a failed mv keeps its source");
    assert_eq!(model_file(), whole);
    assert_eq!(std::fs::read(&f).unwrap(), committed);
    // A backup needs the file renamed, which the tree refuses before anything changes.
    let out = run(Command::new("install")
        .args(["--backup=numbered", "-m", "644"])
        .arg(&src)
        .arg(&f));
    assert!(
        text(&out.stderr).contains("Operation not permitted"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(model_file(), whole);

    // `rm` succeeds and deletes nothing: the name is back once rm has exited.
    let rm = run(Command::new("rm").arg(&f));
    assert!(rm.status.success(), "rm: {}", text(&rm.stderr));
    assert_eq!(std::fs::read(&f).unwrap(), committed);
    let dir = f.parent().unwrap();
    let leaf = f.file_name().unwrap().to_str().unwrap();
    assert!(std::fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().file_name() == leaf));
    // Until then, the process that unlinked it sees it gone, as any unlink promises.
    let (ok, out, errs) = py(
        r#"
import os, sys
f = sys.argv[1]
os.unlink(f)
print(os.path.exists(f), os.path.basename(f) in os.listdir(os.path.dirname(f)))
"#,
        &[f.to_str().unwrap()],
    );
    assert!(ok, "{errs}");
    assert_eq!(out.trim(), "False False");
    assert!(f.exists());
    assert_eq!(model_file(), whole);
}

/// Save like an editor: write a new file beside the target, then rename it over the target.
#[test]
fn editor_save_through_a_scratch_file_and_rename_commits() {
    let Some((_, target, mut m)) = mounted_with_tensor_bin() else {
        return;
    };
    let f = m.path(&target);
    let len = std::fs::metadata(&f).unwrap().len() as usize;
    let offset: usize = getxattr(&f, "user.ptefs.offset").unwrap().parse().unwrap();
    let backing = PathBuf::from(getxattr(&f, "user.ptefs.file").unwrap());
    for round in 0..2u8 {
        let new = pattern(len, 0x11 + round);
        let new_hex: String = new.iter().map(|b| format!("{b:02x}")).collect();
        let (ok, out, errs) = py(
            r#"
import os, sys
target, data = sys.argv[1], bytes.fromhex(sys.argv[2])
d, name = os.path.split(target)
tmp = os.path.join(d, "." + name + ".swp")
with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
assert "." + name + ".swp" in os.listdir(d), "scratch file not listed"
os.rename(tmp, target)
assert "." + name + ".swp" not in os.listdir(d), "scratch file still listed"
st = os.stat(target)
with open(target, "rb") as f:
    got = f.read()
print(st.st_size, got == data)
"#,
            &[f.to_str().unwrap(), &new_hex],
        );
        assert!(ok, "round {round}: {errs}");
        assert_eq!(out.trim(), format!("{len} True"), "round {round}");
        let file = std::fs::read(&backing).unwrap();
        assert_eq!(&file[offset..offset + len], &new[..], "round {round}");
    }
    let last = std::fs::read(&f).unwrap();
    m.remount();
    assert_eq!(std::fs::read(m.path(&target)).unwrap(), last);
}

/// Reads every `segments/<n>` of a mount.
fn segments(m: &Mount, tree: &[String]) -> BTreeMap<String, Vec<u8>> {
    paths_of(tree, |p| {
        p.starts_with("segments/") && p.len() > "segments/".len()
    })
    .into_iter()
    .map(|p| {
        let b = std::fs::read(m.path(&p)).unwrap();
        (p, b)
    })
    .collect()
}

/// `ptefs check` of the mounted files: sound, or (`expect`) reporting exactly one defect
/// that contains `expect`.
fn offline_check(m: &Mount, expect: Option<&str>) {
    let mut cmd = Command::new(BIN);
    cmd.arg("check").arg(&m.model);
    for d in &m.data {
        cmd.arg("--data").arg(d);
    }
    let out = run(&mut cmd);
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    match expect {
        None => assert!(
            out.status.success(),
            "ptefs check after a re-layout: {report}"
        ),
        Some(want) => {
            assert!(!out.status.success(), "ptefs check missed {want}");
            let stdout = text(&out.stdout);
            let lines: Vec<&str> = stdout.lines().map(str::trim).collect();
            assert!(
                lines.len() == 1 && lines[0].contains(want),
                "ptefs check: expected one defect with {want}: {report}"
            );
        }
    }
}

/// Replaces `path` with `new` (of another size) and checks that exactly one segment changed,
/// and what `ptefs check` says then (`expect`: see `offline_check`).
fn resize_and_check(m: &Mount, tree: &[String], path: &str, new: &[u8], expect: Option<&str>) {
    let before = segments(m, tree);
    let file_before = std::fs::metadata(&m.model).unwrap().len();
    let f = m.path(path);
    let got = py_errno(
        "f = open(sys.argv[1], 'wb')\nf.write(bytes.fromhex(sys.argv[2]))\nf.close()",
        &[
            f.to_str().unwrap(),
            &new.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        ],
    );
    assert_eq!(got, "ok", "resizing {path}");
    assert_eq!(
        std::fs::metadata(&f).unwrap().len(),
        new.len() as u64,
        "{path}"
    );
    assert_eq!(std::fs::read(&f).unwrap(), new, "{path}");
    let after = segments(m, tree);
    assert_eq!(before.len(), after.len());
    let changed: Vec<&String> = before.keys().filter(|k| before[*k] != after[*k]).collect();
    assert_eq!(changed.len(), 1, "{path}: segments changed: {changed:?}");
    assert_eq!(after[changed[0]], new, "{path}: the changed segment");
    let file_after = std::fs::metadata(&m.model).unwrap().len();
    assert_ne!(
        file_before, file_after,
        "{path}: the file was not re-laid out"
    );
    offline_check(m, expect);
}

#[test]
fn size_changing_writes_to_a_delegate_blob_and_named_data_relayout_the_file() {
    if fuse_missing() {
        return;
    }
    let fx = Fixture::named("linear_xnnpack.pte");
    let mut m = Mount::new(&fx.file, &fx.data, &[]);
    let processed = paths_of(&fx.tree, |p| p.ends_with("/processed.bin"))[0].clone();
    let blob = paths_of(&fx.tree, |p| {
        p.starts_with("named_data/") && p.ends_with(".bin")
    })[0]
        .clone();

    let mut grown = std::fs::read(m.path(&processed)).unwrap();
    grown.extend(pattern(1000, 3));
    resize_and_check(&m, &fx.tree, &processed, &grown, None);

    let old_blob = std::fs::read(m.path(&blob)).unwrap();
    let shrunk = pattern(old_blob.len() / 2 + 1, 9);
    // The XNNPACK graph reads the blob as a tensor: check says its size no longer fits.
    let key = blob
        .trim_start_matches("named_data/")
        .trim_end_matches(".bin");
    let mismatch = format!(
        "\"{key}\" is {} bytes, expected {}",
        shrunk.len(),
        old_blob.len()
    );
    resize_and_check(&m, &fx.tree, &blob, &shrunk, Some(&mismatch));

    // A remount sees the same sizes and bytes.
    m.remount();
    for (p, want) in [(&processed, &grown), (&blob, &shrunk)] {
        let f = m.path(p);
        assert_eq!(
            std::fs::metadata(&f).unwrap().len(),
            want.len() as u64,
            "{p}"
        );
        assert_eq!(&std::fs::read(&f).unwrap(), want, "{p}");
    }
    // The XNNPACK value that reads the shrunk blob keeps its .json and .bin; its .npy and
    // .hist.svg, whose shape the bytes no longer hold, are not listed
    // (docs/tree.md#xnnpack-delegates).
    let reads_blob = |view: &str| {
        let stem = view.trim_end_matches(".npy").trim_end_matches(".hist.svg");
        let json = m.path(&format!("{stem}.json"));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
        v["constant"]["named_key"] == key
    };
    let seen: Vec<String> = walk(&m.mnt).into_iter().map(|(p, _)| p).collect();
    let mut want: Vec<String> = mount_paths(&fx.tree)
        .into_iter()
        .filter(|p| {
            !(p.contains("/xnnpack/values/")
                && (p.ends_with(".npy") || p.ends_with(".hist.svg"))
                && reads_blob(p))
        })
        .collect();
    assert_eq!(
        want.len() + 1,
        fx.tree.len(),
        "two views go, the errors file comes"
    );
    want.sort();
    assert_eq!(seen, want, "the tree after re-layouts");
}

#[test]
fn mount_options_pass_through_and_name_the_file() {
    if fuse_missing() {
        return;
    }
    let fx = all_fixtures().remove(0);
    let m = Mount::new(
        &fx.file,
        &fx.data,
        &["-o", "default_permissions,allow_other", "-o", "noexec"],
    );
    let line = mountinfo_line(&m.mnt).expect("mounted");
    assert!(line.contains(" - fuse.ptefs "), "{line}");
    assert!(
        line.contains(&format!("ptefs:{}", m.model.display())),
        "{line}"
    );
    for opt in ["default_permissions", "allow_other", "noexec"] {
        assert!(line.contains(opt), "{opt} missing: {line}");
    }
}

/// Every error found before the mount is live gives a message and a non-zero exit.
#[test]
fn errors_before_the_mount_is_live_exit_non_zero_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let fx = all_fixtures().remove(0);
    let good = root.join(&fx.name);
    std::fs::copy(&fx.file, &good).unwrap();
    let random = root.join("random.pte");
    let mut bytes = pattern(4096, 77);
    bytes[4..8].copy_from_slice(b"ZZ99");
    std::fs::write(&random, &bytes).unwrap();
    let not_dir = root.join("plain-file");
    std::fs::write(&not_dir, b"x").unwrap();

    let cases: Vec<(&str, Vec<PathBuf>, &str)> = vec![
        (
            "missing file",
            vec![root.join("nope.pte"), mnt.clone()],
            "nope.pte",
        ),
        ("bad header", vec![random.clone(), mnt.clone()], "ZZ99"),
        (
            "mountpoint is a file",
            vec![good.clone(), not_dir.clone()],
            "not a directory",
        ),
        (
            "missing mountpoint",
            vec![good.clone(), root.join("absent")],
            "absent",
        ),
    ];
    for (what, args, needle) in cases {
        let start = Instant::now();
        let out = run(Command::new(BIN).arg("mount").args(&args));
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{what}: exit status 0");
        // Without /dev/fuse, that is the message for what is checked after it.
        let fuse = Path::new("/dev/fuse").exists();
        assert!(
            stderr.starts_with("ptefs:")
                && (stderr.contains(needle) || (!fuse && stderr.contains("/dev/fuse"))),
            "{what}: message {stderr:?} should mention {needle:?}"
        );
        assert!(!is_mounted(&mnt), "{what}: something got mounted");
        assert!(start.elapsed() < Duration::from_secs(10));
    }
    let out = run(Command::new(BIN)
        .args(["mount", "--data"])
        .arg(root.join("missing.ptd"))
        .arg(&good)
        .arg(&mnt));
    assert!(!out.status.success() && text(&out.stderr).contains("missing.ptd"));

    let out = run(Command::new(BIN).arg("umount").arg(&mnt));
    assert!(
        !out.status.success(),
        "umount of a plain directory succeeded"
    );
    assert!(
        text(&out.stderr).contains("not mounted"),
        "{}",
        text(&out.stderr)
    );
}

/// SIGTERM to a foreground daemon commits what an open file staged, then unmounts.
#[test]
fn sigterm_in_the_foreground_commits_and_unmounts() {
    if fuse_missing() {
        return;
    }
    let (fx, target) = with_tensor_bin();
    let Copied {
        dir: _dir,
        root,
        model,
        data,
    } = copy_files(&fx.file, &fx.data);
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("mount").arg("--foreground").arg(&model).arg(&mnt);
    for d in &data {
        cmd.arg("--data").arg(d);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_mounted(&mnt) {
        assert!(
            Instant::now() < deadline,
            "the foreground mount did not come up"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let f = mnt.join(&target);
    let len = std::fs::metadata(&f).unwrap().len() as usize;
    let offset: usize = getxattr(&f, "user.ptefs.offset").unwrap().parse().unwrap();
    let backing = PathBuf::from(getxattr(&f, "user.ptefs.file").unwrap());
    let new = pattern(len, 0x42);

    // Write through an open descriptor, signal the daemon, and only then close.
    let mut file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.write_all(&new).unwrap();
    // SAFETY: signals a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let committed = Instant::now() + Duration::from_secs(10);
    loop {
        let bytes = std::fs::read(&backing).unwrap();
        if bytes[offset..offset + len] == new[..] {
            break;
        }
        assert!(
            Instant::now() < committed,
            "SIGTERM did not commit the staged write"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(file);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "exit status {status}: {stderr}");
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
}

#[test]
fn a_file_is_mounted_once_and_a_mount_is_not_mounted_over() {
    if fuse_missing() {
        return;
    }
    let fx = Fixture::named("linear.pte");
    let mut m = Mount::new(&fx.file, &fx.data, &[]);
    // The same file on a second mountpoint.
    let second = m.dir.path().join("second");
    std::fs::create_dir(&second).unwrap();
    let out = run(Command::new(BIN).arg("mount").arg(&m.model).arg(&second));
    assert!(!out.status.success(), "mounted twice");
    let err = text(&out.stderr);
    assert!(err.contains("already mounted on"), "{err}");
    assert!(err.contains(m.mnt.to_str().unwrap()), "{err}");
    assert!(!is_mounted(&second));
    // Another file on top of the mount.
    let other = m.dir.path().join("other.pte");
    std::fs::copy(&fx.file, &other).unwrap();
    let out = run(Command::new(BIN).arg("mount").arg(&other).arg(&m.mnt));
    assert!(!out.status.success(), "mounted over a mount");
    assert!(
        text(&out.stderr).contains("already a ptefs mount"),
        "{}",
        text(&out.stderr)
    );
    // Once unmounted, the file mounts again, anywhere.
    m.umount();
    let out = run(Command::new(BIN).arg("mount").arg(&m.model).arg(&second));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(Command::new(BIN).arg("umount").arg(&second));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn mount_warns_about_what_check_reports_and_names_the_data_file_beside() {
    if fuse_missing() {
        return;
    }
    let fx = Fixture::named("linear_ext.pte");
    // Mounted without its .ptd, which sits beside it.
    let m = Mount::new(&fx.file, &[], &[]);
    let mut cmd = Command::new(BIN);
    let out = run(cmd.arg("check").arg(&m.model));
    assert!(
        !out.status.success(),
        "check accepted unattached EXTERNAL tensors"
    );
    let report = text(&out.stdout);
    assert!(report.contains("EXTERNAL"), "{report}");
    drop(m);
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("linear_ext.pte");
    std::fs::copy(&fx.file, &model).unwrap();
    std::fs::copy(&fx.data[0], dir.path().join("linear_ext.ptd")).unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = run(Command::new(BIN).arg("mount").arg(&model).arg(&mnt));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let _ = run(Command::new(BIN).arg("umount").arg(&mnt));
    assert!(
        err.contains("warning:") && err.contains("EXTERNAL"),
        "{err}"
    );
    assert!(err.contains("--data"), "{err}");
    assert!(err.contains("linear_ext.ptd"), "{err}");
}

/// `diff -r` of two mounts of equal copies in different directories finds nothing: no
/// generated file names the directory. `file` in the JSON is the file's name, which with
/// `file_offset` is what `xxd -s` reads from the model's directory; `user.ptefs.file` keeps
/// each copy's absolute path.
#[test]
fn diff_r_of_mounts_of_copies_in_different_directories_is_empty() {
    if fuse_missing() {
        return;
    }
    for name in ["linear_ext.pte", "llama_8da4w.pte", "xnn_qb4_linear.pte"] {
        let fx = Fixture::named(name);
        let a = Mount::new(&fx.file, &fx.data, &[]);
        let b = Mount::new(&fx.file, &fx.data, &[]);
        let diff = run(Command::new("diff").arg("-r").arg(&a.mnt).arg(&b.mnt));
        assert!(
            diff.status.success() && diff.stdout.is_empty(),
            "{name}: diff -r {} {}:\n{}{}",
            a.mnt.display(),
            b.mnt.display(),
            text(&diff.stdout),
            text(&diff.stderr)
        );
        // What diff compared: every file, including a value `.json` with a location.
        let value = paths_of(&fx.tree, |p| {
            p.ends_with(".json") && (p.contains("/values/") || p.contains("named_data/"))
        })
        .into_iter()
        .find(|p| {
            let j: Value = serde_json::from_slice(&std::fs::read(a.path(p)).unwrap()).unwrap();
            j["file"].is_string()
        })
        .unwrap_or_else(|| panic!("{name}: no .json with a file"));
        for m in [&a, &b] {
            let j: Value = serde_json::from_slice(&std::fs::read(m.path(&value)).unwrap()).unwrap();
            let file = j["file"].as_str().unwrap();
            let dir = m.model.parent().unwrap();
            assert!(
                m.model.file_name().unwrap() == file
                    || m.data.iter().any(|d| d.file_name().unwrap() == file),
                "{name}: {value} file {file:?}"
            );
            let bin = m.path(&format!("{}.bin", value.trim_end_matches(".json")));
            let len = std::fs::metadata(&bin).unwrap().len().to_string();
            let offset = j["file_offset"].as_u64().unwrap().to_string();
            let via_json = tool(
                Command::new("xxd")
                    .args(["-p", "-s", &offset, "-l", &len, file])
                    .current_dir(dir),
            );
            assert_eq!(
                via_json,
                tool(Command::new("xxd").arg("-p").arg(&bin)),
                "{name}: {value}"
            );
            let xattr = getxattr(&bin, "user.ptefs.file").unwrap();
            assert_eq!(Path::new(&xattr), dir.join(file), "{name}: {value}");
        }
    }
}

/// A bfloat16 tensor's `.npy` (`|V2`, which NumPy lacks) also takes the `uint16` and `int16`
/// arrays NumPy users hold such tensors in, of the same shape; other shapes and big-endian
/// arrays are refused with EINVAL, leaving the file as it was.
#[test]
fn uint16_and_int16_arrays_replace_a_bfloat16_npy_of_the_same_shape() {
    if fuse_missing() {
        return;
    }
    for (name, npy) in [
        ("bf16_linear.pte", "plans/forward/values/0.npy"),
        (
            "xnn_bf16_linear.pte",
            "plans/forward/delegates/0/xnnpack/values/1.npy",
        ),
    ] {
        let fx = Fixture::named(name);
        let m = Mount::new(&fx.file, &fx.data, &[]);
        let f = m.path(npy);
        let dtype = getxattr(&f, "user.ptefs.dtype").unwrap();
        assert!(
            dtype == "BFLOAT16" || dtype == "bf16",
            "{name}: {npy} is {dtype}"
        );
        let offset: usize = getxattr(&f, "user.ptefs.offset").unwrap().parse().unwrap();
        let backing = PathBuf::from(getxattr(&f, "user.ptefs.file").unwrap());
        for view in ["uint16", "int16"] {
            let (ok, out, errs) = py(
                r#"
import sys, numpy
p, view = sys.argv[1], sys.argv[2]
a = numpy.load(p)
assert a.dtype.str == '|V2', a.dtype.str
b = a.view(view) ^ numpy.array(1, dtype=view)
numpy.save(p, b)
c = numpy.load(p)
assert c.dtype.str == '|V2' and c.shape == a.shape and c.tobytes() == b.tobytes(), "not saved"
sys.stdout.write(b.tobytes().hex())
"#,
                &[f.to_str().unwrap(), view],
            );
            assert!(ok, "{name}: numpy.save of a {view} view: {errs}");
            let new: Vec<u8> = (0..out.len() / 2)
                .map(|i| u8::from_str_radix(&out[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let file = std::fs::read(&backing).unwrap();
            assert_eq!(
                &file[offset..offset + new.len()],
                &new[..],
                "{name}: {view}"
            );
        }
        let before = std::fs::read(&backing).unwrap();
        for bad in [
            "a.view('uint16').reshape((1,) + a.shape)",
            "a.view('uint16').astype('>u2')",
            "a.view('uint16').astype('uint32')",
        ] {
            let errno = py_errno(
                &format!(
                    "import numpy\na = numpy.load(sys.argv[1])\nnumpy.save(sys.argv[1], {bad})"
                ),
                &[f.to_str().unwrap()],
            );
            assert_eq!(errno, "EINVAL", "{name}: {bad}");
        }
        assert_eq!(std::fs::read(&backing).unwrap(), before, "{name}");
    }
}

/// A refused write tells its reason where the user works: the file's `user.ptefs.error`
/// attribute holds it until the file commits, and the root's `errors` file lists every
/// refusal with its time and path; `errors` itself cannot be written.
#[test]
fn refusals_are_readable_beside_the_file_and_in_errors() {
    if fuse_missing() {
        return;
    }
    let fx = Fixture::named("linear.pte");
    let m = Mount::new(&fx.file, &fx.data, &[]);
    let bin = m.path("plans/forward/values/0.bin");
    let errors = m.path("errors");
    assert_eq!(std::fs::read(&errors).unwrap(), b"", "no refusal yet");
    let good = std::fs::read(&bin).unwrap();
    // Too short: close() fails, with EINVAL only.
    let bin_s = bin.to_str().unwrap();
    assert_eq!(
        py_errno(
            "with open(sys.argv[1], 'wb') as f:\n    f.write(b'x' * 40)",
            &[bin_s]
        ),
        "EINVAL"
    );
    let reason = xattr(&bin, "user.ptefs.error");
    assert!(
        reason.contains("needs 48 bytes for FLOAT[3,4], got 40"),
        "{reason}"
    );
    let log = String::from_utf8(std::fs::read(&errors).unwrap()).unwrap();
    let line = log.lines().last().expect("a line for the refusal");
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields.len(), 3, "{line}");
    assert!(fields[0].ends_with('Z') && fields[0].len() == 20, "{line}");
    assert_eq!(fields[1], "plans/forward/values/0.bin");
    assert!(fields[2].contains("got 40"), "{line}");
    assert_eq!(
        std::fs::metadata(&errors).unwrap().len(),
        log.len() as u64,
        "stat gives the size the content has"
    );
    // The model is as it was; a good write commits and clears the file's attribute, while
    // `errors` keeps the history.
    assert_eq!(std::fs::read(&bin).unwrap(), good);
    std::fs::write(&bin, &good).unwrap();
    assert_eq!(xattr(&bin, "user.ptefs.error"), "");
    assert_eq!(std::fs::read(&errors).unwrap(), log.as_bytes());
    // `errors` is read-only.
    let errors_s = errors.to_str().unwrap();
    assert_eq!(py_errno("open(sys.argv[1], 'ab')", &[errors_s]), "EACCES");
    let meta = std::fs::metadata(&errors).unwrap();
    assert_eq!(meta.permissions().mode() & 0o222, 0);
}
