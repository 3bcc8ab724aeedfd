//! Bulk updates through real mounts (docs/tree.md#weightssafetensors,
//! docs/writes.md#bulk-updates-through-weightssafetensors): a safetensors file written onto
//! `weights.safetensors` with `cp`, `dd conv=fsync` or Python's `safetensors` package updates
//! the tensors it names in one commit; an update that does not fit, or is not a valid
//! safetensors file, changes nothing and fails at `close()` with EINVAL, the log naming every
//! mismatch; staged content past 64 MiB spills to an unnamed file that only the daemon holds,
//! in the model's directory (else `$TMPDIR`), whatever was planted there; and a 1 GiB update of
//! a 1 GiB model leaves the daemon's peak memory under 256 MiB. A data file's own
//! `weights.safetensors` is the same whether it is mounted alone or under its program, the
//! program's root lists every file's tensors, and a refusal says which of them takes a
//! tensor that does not fit. An upload written in order that rewrites most of a file is
//! streamed into a new copy renamed over it, checked like any other (a scale XNNPACK refuses
//! changes nothing and leaves nothing); anything else is staged as before.
//!
//! What a tensor is (name, dtype, shape, bytes, where it lives) always comes from the
//! mount's own `weights.safetensors` and `.json` files, never from facts written here.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::mount::{py, py_errno, run, text, xattr, Mount, BIN};
use common::safetensors::{self as st, layer_name, many_tensor_ptd};
use common::{copy_fixture, fuse_missing, get_xattr, pattern, set_xattr, sha256_hex};
use serde_json::Value;

/// A copy of fixture `name` mounted with `--log-file`; the log is in the copy's directory.
fn mounted(name: &str) -> (Mount, PathBuf) {
    let c = copy_fixture(name);
    let log = c.root.join("log");
    let mut m = Mount::unmounted(c.dir, c.model, c.data, &["--log-file", arg(&log)]);
    m.mount();
    (m, log)
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every model file of a mount (the model and its `.ptd` files) with its bytes.
fn files_of(m: &Mount) -> BTreeMap<PathBuf, Vec<u8>> {
    std::iter::once(&m.model)
        .chain(&m.data)
        .map(|p| (p.clone(), read(p)))
        .collect()
}

/// Where the bytes of each tensor named in `names` live: (model file, offset, length), from
/// the `.json` beside the tree path `__metadata__` gives for it.
fn locations(m: &Mount, raw: &[u8], names: &[&str]) -> BTreeMap<String, (PathBuf, u64, u64)> {
    let meta = st::metadata(raw);
    names
        .iter()
        .map(|n| {
            let path = meta[*n].as_str().unwrap();
            let j: Value = serde_json::from_slice(&read(&m.path(&format!("{path}.json")))).unwrap();
            let len = j.get("nbytes").or_else(|| j.get("size")).unwrap();
            (
                n.to_string(),
                (
                    // The model file's name, beside the model.
                    m.model.with_file_name(j["file"].as_str().unwrap()),
                    j["file_offset"].as_u64().unwrap(),
                    len.as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Asserts that the model files changed exactly in the ranges of `changed` (each now holding
/// its new bytes) and nowhere else.
fn assert_changed_only(
    before: &BTreeMap<PathBuf, Vec<u8>>, after: &BTreeMap<PathBuf, Vec<u8>>,
    changed: &BTreeMap<String, (PathBuf, u64, u64)>, new: &BTreeMap<String, Vec<u8>>,
) {
    let mut expected = before.clone();
    for (name, (file, offset, len)) in changed {
        let bytes = expected.get_mut(file).unwrap();
        let (s, e) = (*offset as usize, (*offset + *len) as usize);
        bytes[s..e].copy_from_slice(&new[name]);
    }
    for (file, want) in &expected {
        let got = &after[file];
        assert_eq!(got.len(), want.len(), "{}: size changed", file.display());
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!(
                "{}: byte {i} is not what the update makes it",
                file.display()
            );
        }
    }
}

/// `weights.safetensors` read back holds `new` for the tensors it names and `old` for the
/// others.
fn assert_weights(raw: &[u8], old: &[u8], new: &BTreeMap<String, Vec<u8>>) {
    for (name, _, _, bytes) in st::tensors(old) {
        let want = new.get(&name).unwrap_or(&bytes);
        assert_eq!(st::tensor(raw, &name), &want[..], "{name}");
    }
}

fn journal_left(m: &Mount) -> Vec<PathBuf> {
    std::iter::once(&m.model)
        .chain(&m.data)
        .map(|p| ptefs::edit::journal::journal_path(p))
        .filter(|j| std::fs::symlink_metadata(j).is_ok())
        .collect()
}

fn offline_check(m: &Mount) {
    let mut cmd = Command::new(BIN);
    cmd.arg("check").arg(&m.model);
    for d in &m.data {
        cmd.arg("--data").arg(d);
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "ptefs check: {}", text(&out.stdout));
}

/// New bytes for every tensor of `raw` (a `weights.safetensors`), unlike the current ones.
fn new_bytes(raw: &[u8], names: &[&str]) -> BTreeMap<String, Vec<u8>> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let old = st::tensor(raw, n);
            let mut b = pattern(old.len(), 0x40 + i as u8);
            if b == old {
                b.iter_mut().for_each(|x| *x ^= 0xff);
            }
            (n.to_string(), b)
        })
        .collect()
}

/// A safetensors update of the tensors `new` names, with their dtypes and shapes from `raw`.
fn update_of(raw: &[u8], new: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let all = st::tensors(raw);
    let tensors: Vec<st::Tensor> = all
        .iter()
        .filter(|(n, ..)| new.contains_key(n))
        .map(|(n, d, s, _)| (n.as_str(), d.as_str(), s.clone(), new[n].clone()))
        .collect();
    st::build(&tensors)
}

#[test]
fn a_subset_update_with_cp_changes_exactly_the_tensors_it_names() {
    if fuse_missing() {
        return;
    }
    let (mut m, _log) = mounted("dtypes.pte");
    let w = m.path("weights.safetensors");
    let old = read(&w);
    let all = st::tensors(&old);
    assert!(all.len() >= 4, "dtypes.pte has tensors of many dtypes");
    // Two tensors of different dtypes, neither the first nor the last.
    let names = [all[1].0.as_str(), all[all.len() - 2].0.as_str()];
    let new = new_bytes(&old, &names);
    let changed = locations(&m, &old, &names);
    let before = files_of(&m);
    let update = m.dir.path().join("update.safetensors");
    std::fs::write(&update, update_of(&old, &new)).unwrap();

    let out = run(Command::new("cp").arg(&update).arg(&w));
    assert!(out.status.success(), "cp: {}", text(&out.stderr));
    for (name, bytes) in &new {
        let tree_path = st::metadata(&old)[name].as_str().unwrap().to_string();
        assert_eq!(read(&m.path(&format!("{tree_path}.bin"))), *bytes, "{name}");
    }
    assert_committed(&mut m, &w, &old, &before, &changed, &new);
}

/// After an update of `weights.safetensors` at `w` (which was `old`): the model files
/// (`before`) changed exactly in the `changed` ranges, to the `new` bytes; the mount shows
/// them, before and after a remount; no journal is left; `ptefs check` accepts the files.
fn assert_committed(
    m: &mut Mount, w: &Path, old: &[u8], before: &BTreeMap<PathBuf, Vec<u8>>,
    changed: &BTreeMap<String, (PathBuf, u64, u64)>, new: &BTreeMap<String, Vec<u8>>,
) {
    assert_changed_only(before, &files_of(m), changed, new);
    let now = read(w);
    assert_eq!(now.len(), old.len());
    assert_weights(&now, old, new);
    assert!(journal_left(m).is_empty(), "{}", m.model.display());
    m.remount();
    assert_weights(&read(w), old, new);
    m.umount();
    offline_check(m);
}

#[test]
fn a_full_update_with_dd_conv_fsync_replaces_every_tensor_of_each_model_root() {
    if fuse_missing() {
        return;
    }
    // The root of a `.pte`, the tree of a `.ptd` attached with --data (the writes land in the
    // `.ptd`), and a `.ptd` mounted on its own.
    for (fixture, prefix) in [
        ("dtypes.pte", ""),
        ("linear_ext.pte", "data/linear_ext/"),
        ("linear_ext.ptd", ""),
    ] {
        let (mut m, _log) = mounted(fixture);
        let w = m.path(&format!("{prefix}weights.safetensors"));
        let old = read(&w);
        let names: Vec<String> = st::tensors(&old).into_iter().map(|t| t.0).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let new = new_bytes(&old, &names);
        let changed = locations(&m, &old, &names);
        let before = files_of(&m);
        let update = m.dir.path().join("update.safetensors");
        std::fs::write(&update, update_of(&old, &new)).unwrap();

        let out = run(Command::new("dd")
            .arg(format!("if={}", update.display()))
            .arg(format!("of={}", w.display()))
            .args(["bs=1M", "conv=fsync"]));
        assert!(out.status.success(), "{fixture}: dd: {}", text(&out.stderr));
        assert_committed(&mut m, &w, &old, &before, &changed, &new);
    }
}

#[test]
fn python_safetensors_save_file_onto_the_mount_updates_what_numpy_can_hold() {
    if fuse_missing() {
        return;
    }
    let (m, _log) = mounted("dtypes.pte");
    let w = m.path("weights.safetensors");
    let old = read(&w);
    // Read with safetensors, change every tensor NumPy has a dtype for (bfloat16 it has not,
    // so that one is left out: a subset), write back with save_file (which writes a file
    // beside the target and renames it over it), read back with safe_open.
    let (ok, stdout, stderr) = py(
        r#"
import sys, numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
path = sys.argv[1]
new, skipped = {}, []
with safe_open(path, "np") as f:
    for name in f.keys():
        try:
            a = f.get_tensor(name)
        except (TypeError, ValueError):
            skipped.append(name)
            continue
        if a.dtype == np.bool_:
            b = ~a
        elif a.dtype.kind == "f":
            b = a * 3 + 1
        else:
            b = a + 1
        # np.array, not ascontiguousarray, which makes a 0-dim array 1-dim.
        new[name] = np.array(b, dtype=a.dtype).reshape(a.shape)
save_file(new, path)
with safe_open(path, "np") as f:
    for name, a in new.items():
        b = f.get_tensor(name)
        assert b.dtype == a.dtype and b.shape == a.shape and b.tobytes() == a.tobytes(), name
print(",".join(sorted(new)))
print(",".join(skipped))
"#,
        &[arg(&w)],
    );
    assert!(ok, "{stdout}{stderr}");
    let mut lines = stdout.lines();
    let saved: Vec<&str> = lines.next().unwrap().split(',').collect();
    let skipped: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    assert!(saved.len() >= 6, "{stdout}");
    assert!(skipped.iter().all(|s| !s.is_empty()), "{stdout}");
    // Every saved tensor changed, the skipped ones did not; the model file agrees.
    let now = read(&w);
    for name in &saved {
        assert_ne!(st::tensor(&now, name), st::tensor(&old, name), "{name}");
    }
    for name in &skipped {
        assert_eq!(st::tensor(&now, name), st::tensor(&old, name), "{name}");
    }
    let locs = locations(&m, &old, &saved);
    for (name, (file, offset, len)) in &locs {
        let bytes = read(file);
        assert_eq!(
            &bytes[*offset as usize..(*offset + *len) as usize],
            st::tensor(&now, name),
            "{name}"
        );
    }
}

/// Writes `bytes` onto `path` of mount `m` with Python and closes it: the errno close()
/// reports.
fn write_and_close(m: &Mount, path: &Path, bytes: &[u8]) -> String {
    let src = m.dir.path().join("candidate");
    std::fs::write(&src, bytes).unwrap();
    py_errno(
        "f = open(sys.argv[1], 'wb')\nf.write(open(sys.argv[2], 'rb').read())\nf.close()",
        &[arg(path), arg(&src)],
    )
}

#[test]
fn one_tensor_that_does_not_fit_refuses_the_whole_update_at_close() {
    if fuse_missing() {
        return;
    }
    let (m, log) = mounted("dtypes.pte");
    let w = m.path("weights.safetensors");
    let old = read(&w);
    let all = st::tensors(&old);
    let before = files_of(&m);
    let sha: Vec<String> = before.values().map(|b| sha256_hex(b)).collect();

    // Every tensor with new bytes, but one with a wrong shape: nothing is written.
    let (bad, bad_dtype, bad_shape, bad_bytes) = &all[2];
    let mut wrong_shape = bad_shape.clone();
    wrong_shape.insert(0, 1);
    wrong_shape.push(1);
    let tensors: Vec<st::Tensor> = all
        .iter()
        .enumerate()
        .map(|(i, (n, d, s, b))| {
            let shape = if n == bad {
                wrong_shape.clone()
            } else {
                s.clone()
            };
            (n.as_str(), d.as_str(), shape, pattern(b.len(), i as u8 + 1))
        })
        .collect();
    assert_eq!(write_and_close(&m, &w, &st::build(&tensors)), "EINVAL");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains(&format!(
            "\"{bad}\": expected {bad_dtype}{bad_shape:?}, found {bad_dtype}{wrong_shape:?}"
        )),
        "{said}"
    );
    assert!(said.contains("nothing was written"), "{said}");

    // Three mismatches at once, of three kinds: the log names every one.
    let (other, other_dtype, other_shape, other_bytes) = &all[0];
    let wrong_dtype = if other_dtype == "I8" { "U8" } else { "I8" };
    let elems: u64 = other_shape.iter().product::<u64>().max(1);
    let tensors: Vec<st::Tensor> = vec![
        (
            bad,
            bad_dtype,
            wrong_shape.clone(),
            pattern(bad_bytes.len(), 9),
        ),
        (
            other,
            wrong_dtype,
            vec![elems * (other_bytes.len() as u64 / elems)],
            pattern(other_bytes.len(), 8),
        ),
        ("no.such.tensor", "F32", vec![2], pattern(8, 7)),
        (
            &all[3].0,
            &all[3].1,
            all[3].2.clone(),
            pattern(all[3].3.len(), 6),
        ),
    ];
    assert_eq!(write_and_close(&m, &w, &st::build(&tensors)), "EINVAL");
    let said = std::fs::read_to_string(&log).unwrap();
    let last = said
        .lines()
        .rfind(|l| l.contains("weights.safetensors"))
        .unwrap();
    assert!(last.contains("3 tensor(s) that do not fit"), "{last}");
    assert!(last.contains(&format!("\"{bad}\": expected")), "{last}");
    assert!(
        last.contains(&format!("\"{other}\": expected {other_dtype}")),
        "{last}"
    );
    assert!(
        last.contains("\"no.such.tensor\": no such tensor"),
        "{last}"
    );
    assert!(!last.contains(&format!("\"{}\"", all[3].0)), "{last}");

    let after = files_of(&m);
    let sha_after: Vec<String> = after.values().map(|b| sha256_hex(b)).collect();
    assert_eq!(sha, sha_after, "a refused update changed a model file");
    assert_eq!(read(&w), old);
    assert!(journal_left(&m).is_empty());
}

#[test]
fn malformed_safetensors_are_refused_at_close_and_change_nothing() {
    if fuse_missing() {
        return;
    }
    let (m, log) = mounted("linear.pte");
    let w = m.path("weights.safetensors");
    let old = read(&w);
    let before = files_of(&m);
    let all = st::tensors(&old);
    let good: Vec<st::Tensor> = all
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.clone(), pattern(b.len(), 3)))
        .collect();
    let valid = st::build(&good);
    let (first, first_dtype, first_shape, first_bytes) = &all[0];
    let len = first_bytes.len() as u64;

    // The header's declared length reaches past the end of the file.
    let mut too_long = valid.clone();
    too_long[..8].copy_from_slice(&(valid.len() as u64).to_le_bytes());
    // Two tensors whose data offsets overlap by one byte.
    let overlapping = {
        let h = format!(
            "{{\"{first}\":{{\"dtype\":\"{first_dtype}\",\"shape\":{first_shape:?},\"data_offsets\":[0,{len}]}},\"copy\":{{\"dtype\":\"U8\",\"shape\":[{len}],\"data_offsets\":[{},{}]}}}}",
            len - 1,
            2 * len - 1
        );
        let mut v = (h.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(h.as_bytes());
        v.extend_from_slice(&pattern(2 * len as usize - 1, 1));
        v
    };
    // A dtype the format does not have.
    let unknown_dtype = st::build(&[(first, "F33", first_shape.clone(), pattern(len as usize, 2))]);
    // Not JSON, and too short for a header length.
    let mut not_json = (4u64).to_le_bytes().to_vec();
    not_json.extend_from_slice(b"{{{{");

    for (what, bytes, says) in [
        ("header size", too_long, "header length"),
        (
            "overlapping offsets",
            overlapping,
            "must be contiguous and not overlap",
        ),
        ("unknown dtype", unknown_dtype, "unknown dtype \"F33\""),
        ("not JSON", not_json, "not a JSON object"),
        (
            "too short",
            b"abc".to_vec(),
            "too short for the 8-byte header length",
        ),
    ] {
        assert_eq!(write_and_close(&m, &w, &bytes), "EINVAL", "{what}");
        let said = std::fs::read_to_string(&log).unwrap();
        let last = said
            .lines()
            .rfind(|l| l.contains("weights.safetensors"))
            .unwrap();
        assert!(last.contains(says), "{what}: {last}");
        assert_eq!(files_of(&m), before, "{what}: the model changed");
        assert_eq!(read(&w), old, "{what}");
    }
    // The same descriptor's next, valid content still commits: a refusal left the mount usable.
    assert_eq!(write_and_close(&m, &w, &valid), "ok");
    assert_weights(
        &read(&w),
        &old,
        &good
            .iter()
            .map(|(n, _, _, b)| (n.to_string(), b.clone()))
            .collect(),
    );
}

// Spilled staging and memory.

/// Writes a `.ptd` at `path` whose `weights.safetensors` takes more than 65 MiB: an update
/// may be no larger than the tensors it can name and the header they can need, so the
/// tests of spilled staging need a model this large.
fn spilling_model(path: &Path) {
    many_tensor_ptd(path, 2, 3000, |i, c| c.fill(i as u8));
}

/// A `spilling_model` in a new temp dir, mounted there.
fn mounted_spilling_model() -> Mount {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().canonicalize().unwrap().join("spill.ptd");
    spilling_model(&model);
    let mut m = Mount::unmounted(dir, model, vec![], &[]);
    m.mount();
    m
}

/// Writes 65 MiB of zeros through `f`, 1 MiB at a time: past what an open file stages in
/// memory.
fn write_past_memory(f: &mut std::fs::File) {
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..65 {
        f.write_all(&chunk).unwrap();
    }
}

fn open_for_writing(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The pid of the daemon serving `mnt`: the `ptefs` process whose arguments name it.
fn daemon_pid(mnt: &Path) -> u32 {
    use std::os::unix::ffi::OsStrExt;
    let want = mnt.as_os_str().as_bytes();
    let found: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args[0].ends_with(b"ptefs")
                && args.contains(&b"mount".as_slice())
                && args.contains(&want)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "daemons serving {}: {found:?}",
        mnt.display()
    );
    found[0]
}

/// The unnamed files (`O_TMPFILE`) the daemon `pid` holds open: where /proc says they are
/// (`<directory>/#<inode> (deleted)`) and their metadata.
fn unnamed_files(pid: u32) -> Vec<(String, std::fs::Metadata)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            let shown = target.to_string_lossy().into_owned();
            let name = shown.rsplit('/').next()?;
            if !(name.starts_with('#') && shown.ends_with(" (deleted)")) {
                return None;
            }
            Some((shown, std::fs::metadata(e.path()).ok()?))
        })
        .collect()
}

/// Waits until the daemon has let go of every unnamed file (the kernel sends the release of
/// a closed file after close() returns).
fn wait_released(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !unnamed_files(pid).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon still holds {:?}",
            unnamed_files(pid)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The one spilled file the daemon holds: in `dir`, nameless, 0600, at least 65 MiB.
fn assert_spilled_into(pid: u32, dir: &Path) {
    let spilled = unnamed_files(pid);
    assert_eq!(spilled.len(), 1, "{spilled:?}");
    let (shown, meta) = &spilled[0];
    let parent = shown.rsplit_once('/').unwrap().0;
    assert_eq!(Path::new(parent), dir, "{shown}");
    assert_eq!(meta.mode() & 0o7777, 0o600, "{shown}");
    assert_eq!(meta.nlink(), 0, "{shown} has a name");
    assert!(meta.len() >= 65 << 20, "{shown}: {} bytes", meta.len());
}

#[test]
fn spilled_staging_is_an_unnamed_0600_file_in_the_models_directory() {
    if fuse_missing() {
        return;
    }
    let m = mounted_spilling_model();
    let dir = m.model.parent().unwrap().to_path_buf();
    let before = files_of(&m);
    let names = names_in(&dir);
    let pid = daemon_pid(&m.mnt);
    let mut f = open_for_writing(&m.path("weights.safetensors"));
    write_past_memory(&mut f);
    assert_spilled_into(pid, &dir);
    assert_eq!(names_in(&dir), names, "a name appeared beside the model");
    // Zeros are no safetensors file: refused, and the spilled file goes with the handle.
    drop(f);
    wait_released(pid);
    assert_eq!(files_of(&m), before);
}

/// Makes a directory immutable (`chattr +i`), which even root cannot create files in, until
/// dropped.
struct Immutable(PathBuf);

impl Immutable {
    fn set(dir: &Path) -> Immutable {
        let out = run(Command::new("chattr").arg("+i").arg(dir));
        assert!(out.status.success(), "chattr +i: {}", text(&out.stderr));
        Immutable(dir.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = run(Command::new("chattr").arg("-i").arg(&self.0));
    }
}

#[test]
fn spilled_staging_goes_to_tmpdir_when_the_models_directory_refuses() {
    if fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let model = root.join("spill.ptd");
    spilling_model(&model);
    let tmpdir = tempfile::tempdir().unwrap();
    let tmpdir = tmpdir.path().canonicalize().unwrap();
    let mut m = Mount::unmounted(dir, model, vec![], &[]);
    let out = run(m.mount_command().env("TMPDIR", &tmpdir));
    assert!(out.status.success(), "{}", text(&out.stderr));
    m.live = true;
    let pid = daemon_pid(&m.mnt);
    let before = files_of(&m);
    let mut f = open_for_writing(&m.path("weights.safetensors"));
    {
        let _refuses = Immutable::set(&root);
        write_past_memory(&mut f);
        assert_spilled_into(pid, &tmpdir);
    }
    assert!(names_in(&tmpdir).is_empty(), "{:?}", names_in(&tmpdir));
    drop(f);
    wait_released(pid);
    assert_eq!(files_of(&m), before);
}

#[test]
fn spilled_staging_follows_no_link_planted_where_the_models_directory_was() {
    if fuse_missing() {
        return;
    }
    // root/models/spill.ptd is mounted; then root/models is moved away and a link to
    // root/elsewhere put in its place. The daemon keeps the directory it opened at mount.
    let top = tempfile::tempdir().unwrap();
    let root = top.path().canonicalize().unwrap();
    let models = root.join("models");
    let elsewhere = root.join("elsewhere");
    std::fs::create_dir(&models).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    let model = models.join("spill.ptd");
    spilling_model(&model);
    let mut m = Mount::unmounted(top, model, vec![], &[]);
    m.mount();
    let pid = daemon_pid(&m.mnt);
    let before = files_of(&m);
    let moved = root.join("models.moved");
    std::fs::rename(&models, &moved).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &models).unwrap();

    let mut f = open_for_writing(&m.path("weights.safetensors"));
    write_past_memory(&mut f);
    assert_spilled_into(pid, &moved);
    assert!(
        names_in(&elsewhere).is_empty(),
        "{:?}",
        names_in(&elsewhere)
    );
    drop(f);
    wait_released(pid);
    std::fs::remove_file(&models).unwrap();
    std::fs::rename(&moved, &models).unwrap();
    assert_eq!(files_of(&m), before);
}

/// Peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

/// The docs/writes.md#bulk-updates-through-weightssafetensors bound on the daemon while it
/// takes a multi-GiB update.
const DAEMON_PEAK: u64 = 256 << 20;

#[test]
fn a_1_gib_update_of_a_1_gib_model_keeps_the_daemon_under_256_mib() {
    if fuse_missing() {
        return;
    }
    // 16 tensors FLOAT[4096, 4096] (64 MiB each), tensor i filled with 0x10 + i; the update
    // fills it with 0x80 + i.
    const COUNT: usize = 16;
    const SIDE: i32 = 4096;
    const BYTES: u64 = (SIDE as u64) * (SIDE as u64) * 4;
    let top = tempfile::tempdir().unwrap();
    let root = top.path().canonicalize().unwrap();
    let model = root.join("big.ptd");
    let base = many_tensor_ptd(&model, COUNT, SIDE, |i, c| c.fill(0x10 + i as u8));
    let mut m = Mount::unmounted(top, model.clone(), vec![], &[]);
    m.mount();
    let pid = daemon_pid(&m.mnt);

    let header = st::layers_header(COUNT, SIDE);
    let mut f = open_for_writing(&m.path("weights.safetensors"));
    f.write_all(&header).unwrap();
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..COUNT {
        chunk.fill(0x80 + i as u8);
        for _ in 0..BYTES / chunk.len() as u64 {
            f.write_all(&chunk).unwrap();
        }
    }
    // fsync commits and reports the outcome.
    f.sync_all().unwrap();
    drop(f);
    let peak = peak_rss(pid);
    eprintln!("daemon peak RSS after a 1 GiB update: {} MiB", peak >> 20);
    assert!(peak < DAEMON_PEAK, "daemon peak RSS {} MiB", peak >> 20);

    // An open without O_TRUNC starts from a copy of the whole file (1 GiB): that copy must
    // not grow the daemon either. Only tensor 3 is rewritten, with 0x33.
    let w = m.path("weights.safetensors");
    let raw = std::fs::File::open(&w).unwrap();
    let mut len = [0u8; 8];
    raw.read_exact_at(&mut len, 0).unwrap();
    let n = u64::from_le_bytes(len);
    let mut header = vec![0u8; n as usize];
    raw.read_exact_at(&mut header, 8).unwrap();
    let header: Value = serde_json::from_slice(&header).unwrap();
    let begin = 8 + n + header[layer_name(3)]["data_offsets"][0].as_u64().unwrap();
    drop(raw);
    let f = std::fs::OpenOptions::new().write(true).open(&w).unwrap();
    chunk.fill(0x33);
    for k in 0..BYTES / chunk.len() as u64 {
        f.write_all_at(&chunk, begin + k * chunk.len() as u64)
            .unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let peak = peak_rss(pid);
    eprintln!(
        "daemon peak RSS after rewriting a tensor of it in place: {} MiB",
        peak >> 20
    );
    assert!(peak < DAEMON_PEAK, "daemon peak RSS {} MiB", peak >> 20);

    // Every tensor holds its new bytes, in the file and through the mount.
    let file = std::fs::File::open(&model).unwrap();
    for i in 0..COUNT {
        let want = if i == 3 { 0x33 } else { 0x80 + i as u8 };
        let mut at = base + i as u64 * BYTES;
        for _ in 0..BYTES / chunk.len() as u64 {
            file.read_exact_at(&mut chunk, at).unwrap();
            assert!(chunk.iter().all(|&b| b == want), "tensor {i} at {at}");
            at += chunk.len() as u64;
        }
    }
    let seen = read(&m.path("named_data/layer07.weight.bin"));
    assert!(seen.iter().all(|&b| b == 0x87));
    assert_eq!(seen.len() as u64, BYTES);
    m.umount();
}

/// Resident memory of process `pid` now (VmRSS), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

/// Writes a safetensors header of about `declared` bytes onto `w`, its 8-byte length first
/// and then `entry(i)` after `entry(i)`, 1 MiB at a time, until the mount refuses a write
/// or the header is whole; returns the errno close() reports.
fn write_header_until_refused(w: &Path, declared: u64, entry: impl Fn(u64) -> String) -> String {
    let mut f = open_for_writing(w);
    f.write_all(&declared.to_le_bytes()).unwrap();
    let (mut written, mut i, mut chunk) = (0u64, 0u64, Vec::with_capacity(1 << 20));
    chunk.push(b'{');
    while written < declared {
        while chunk.len() < 1 << 20 {
            chunk.extend_from_slice(entry(i).as_bytes());
            i += 1;
        }
        let n = (chunk.len() as u64).min(declared - written) as usize;
        match f.write_all(&chunk[..n]) {
            Ok(()) => written += n as u64,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
                break;
            }
        }
        chunk.clear();
    }
    // close(2) itself: dropping a File ignores what it reports.
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: a descriptor this function owns, closed once.
    if unsafe { libc::close(fd) } == 0 {
        "ok".into()
    } else {
        std::io::Error::last_os_error().to_string()
    }
}

/// A header of 1.68 million empty tensors (97 MB), or of 98 MB of metadata alone, written
/// onto the `weights.safetensors` of a model of 8 tensors: refused, with the daemon neither
/// peaking at nor keeping more than a few MiB beyond what it held (it took 2.3 GiB and kept
/// 1.9 GiB of the first when a header was bounded by the format's 100 MB alone).
#[test]
fn a_hostile_header_costs_the_daemon_what_the_model_justifies() {
    if fuse_missing() {
        return;
    }
    const SLACK: u64 = 16 << 20;
    let (m, log) = mounted("dtypes.pte");
    let w = m.path("weights.safetensors");
    let old = read(&w);
    let before = files_of(&m);
    let pid = daemon_pid(&m.mnt);
    let (peak_before, rss_before) = (peak_rss(pid), rss(pid));

    let empty = |i: u64| format!(r#""{i:07}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}},"#);
    let metadata = |i: u64| {
        let pair = format!(r#""m{i:07}":"{}","#, "v".repeat(49));
        if i == 0 {
            format!(r#""__metadata__":{{{pair}"#)
        } else {
            pair
        }
    };
    for (what, declared, entry) in [
        (
            "1.68M empty tensors",
            97_440_008,
            &empty as &dyn Fn(u64) -> String,
        ),
        ("metadata alone", 98_280_024, &metadata),
    ] {
        let closed = write_header_until_refused(&w, declared, entry);
        assert!(closed.contains("Invalid argument"), "{what}: {closed}");
        let said = std::fs::read_to_string(&log).unwrap();
        let last = said
            .lines()
            .rfind(|l| l.contains("weights.safetensors"))
            .unwrap();
        assert!(
            last.contains("more than this model's 8 tensor(s) can need"),
            "{what}: {last}"
        );
        let (peak, kept) = (peak_rss(pid), rss(pid));
        eprintln!(
            "{what}: daemon peak {} MiB (was {}), resident {} MiB (was {})",
            peak >> 20,
            peak_before >> 20,
            kept >> 20,
            rss_before >> 20
        );
        assert!(
            peak < peak_before + SLACK,
            "{what}: peak {} MiB",
            peak >> 20
        );
        assert!(kept < rss_before + SLACK, "{what}: kept {} MiB", kept >> 20);
    }
    assert_eq!(files_of(&m), before);
    assert_eq!(read(&w), old);
}

/// The tensors of a safetensors file by name: (dtype, shape, bytes).
fn by_name(raw: &[u8]) -> BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    st::tensors(raw)
        .into_iter()
        .map(|(n, d, s, b)| (n, (d, s, b)))
        .collect()
}

/// The stem a mount names data file `data` by, under `data/`.
fn stem(data: &Path) -> String {
    data.file_stem().unwrap().to_str().unwrap().to_string()
}

#[test]
fn a_data_file_shows_the_same_tensors_alone_and_under_its_program_and_the_root_shows_all() {
    if fuse_missing() {
        return;
    }
    for fixture in ["linear_xnnpack_ext.pte", "llama_lora.pte"] {
        let (m, _log) = mounted(fixture);
        let root_raw = read(&m.path("weights.safetensors"));
        let root = by_name(&root_raw);
        let root_meta = st::metadata(&root_raw);
        let mut listed = 0;
        let mut typed = 0;
        for data in &m.data {
            let prefix = format!("data/{}/", stem(data));
            let under = read(&m.path(&format!("{prefix}weights.safetensors")));
            let alone_mount = Mount::new(data, &[], &[]);
            let alone = read(&alone_mount.path("weights.safetensors"));
            // The same tensors, dtypes, shapes and bytes; paths from each mount's root.
            assert_eq!(by_name(&under), by_name(&alone), "{fixture}: {prefix}");
            let (meta_under, meta_alone) = (st::metadata(&under), st::metadata(&alone));
            assert_eq!(meta_under.len(), meta_alone.len());
            for (name, path) in &meta_alone {
                let path = path.as_str().unwrap();
                assert_eq!(meta_under[name], format!("{prefix}{path}"), "{name}");
            }
            // The root lists each of them at the same path with the same bytes, typed by
            // the program that reads it where the data file alone cannot know.
            for (name, (dtype, shape, bytes)) in by_name(&under) {
                let (root_dtype, root_shape, root_bytes) = &root[&name];
                assert_eq!(root_bytes, &bytes, "{fixture}: {name}");
                assert_eq!(root_meta[&name], meta_under[&name], "{fixture}: {name}");
                if (root_dtype, root_shape) != (&dtype, &shape) {
                    assert_eq!((dtype.as_str(), shape), ("U8", vec![bytes.len() as u64]));
                    typed += 1;
                }
                listed += 1;
            }
        }
        assert!(listed > 0, "{fixture}: its data files have tensors");
        assert!(
            typed > 0,
            "{fixture}: its program types some data file blob"
        );
        // The rest of the root's tensors are the program's own.
        assert_eq!(
            root.len() - listed,
            root_meta
                .values()
                .filter(|p| !p.as_str().unwrap().starts_with("data/"))
                .count(),
            "{fixture}: the root lists the data files' tensors and the program's"
        );
    }
}

/// Writes `bytes` onto `path` through the mount: "ok" or the errno `close()` (or the write)
/// gave.
fn write_through(path: &Path, bytes: &[u8], dir: &Path) -> String {
    let src = dir.join("update.safetensors");
    std::fs::write(&src, bytes).unwrap();
    py_errno(
        "with open(sys.argv[1], 'wb') as f:\n    f.write(open(sys.argv[2], 'rb').read())",
        &[arg(path), arg(&src)],
    )
}

#[test]
fn an_update_refused_by_one_weights_file_says_which_one_takes_it() {
    if fuse_missing() {
        return;
    }
    let (mut m, _log) = mounted("linear_xnnpack_ext.pte");
    let w = m.path("weights.safetensors");
    let prefix = format!("data/{}/", stem(&m.data[0]));
    let under = m.path(&format!("{prefix}weights.safetensors"));
    let (root_raw, under_raw) = (read(&w), read(&under));
    let root = by_name(&root_raw);
    // A blob of the data file the program types (as F32) and the data file alone cannot.
    let (name, (dtype, shape, old)) = by_name(&under_raw)
        .into_iter()
        .find(|(n, (d, _, _))| root[n].0 != *d)
        .expect("a blob the program types");
    let (root_dtype, root_shape, _) = root[&name].clone();
    let new = pattern(old.len(), 0x5a);
    let typed = st::build(&[(&name, &root_dtype, root_shape.clone(), new.clone())]);
    let raw = st::build(&[(&name, &dtype, shape.clone(), new.clone())]);
    let scratch = m.dir.path().to_path_buf();
    let before = files_of(&m);

    // Typed, onto the data file's own view: refused, pointing at the root.
    assert_eq!(write_through(&under, &typed, &scratch), "EINVAL");
    let reason = xattr(&under, "user.ptefs.error");
    assert!(
        reason.contains(&format!(
            "the root weights.safetensors of the mount takes it, as {root_dtype}{root_shape:?}"
        )),
        "{reason}"
    );
    // Raw, onto the root: refused, pointing at the data file's view.
    assert_eq!(write_through(&w, &raw, &scratch), "EINVAL");
    let reason = xattr(&w, "user.ptefs.error");
    assert!(
        reason.contains(&format!(
            "{prefix}weights.safetensors takes it as raw bytes, U8[{}]",
            old.len()
        )),
        "{reason}"
    );
    assert_eq!(files_of(&m), before, "a refused update changes nothing");

    // Each is taken where it fits, to the same bytes.
    assert_eq!(write_through(&w, &typed, &scratch), "ok");
    assert_eq!(by_name(&read(&under))[&name].2, new);
    let back = pattern(old.len(), 0x77);
    let raw_back = st::build(&[(&name, &dtype, shape.clone(), back.clone())]);
    assert_eq!(write_through(&under, &raw_back, &scratch), "ok");
    assert_eq!(by_name(&read(&w))[&name].2, back);
    m.umount();
    offline_check(&m);

    // The data file mounted alone takes the raw bytes, and says why it cannot take them
    // typed.
    let alone = Mount::new(&m.data[0], &[], &[]);
    let aw = alone.path("weights.safetensors");
    assert_eq!(write_through(&aw, &typed, &scratch), "EINVAL");
    let reason = xattr(&aw, "user.ptefs.error");
    assert!(
        reason.contains("a data file mounted alone shows its blobs as raw bytes")
            && reason.contains("--data"),
        "{reason}"
    );
    assert_eq!(write_through(&aw, &raw, &scratch), "ok");
    assert_eq!(by_name(&read(&aw))[&name].2, new);
}

/// Files in `dir`, sorted by name.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// How many uploads the log says were written straight into a new copy.
fn streamed(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("written straight into a new copy")
        .count()
}

/// docs/writes.md#uploads-written-straight-into-a-new-copy: an upload written in order (as
/// `dd` and `cp` write) that rewrites most of a file goes straight into a new copy renamed
/// over the model; one written out of order is staged and committed as before; one cut
/// short is refused at close and leaves the model byte for byte as it was, with no file
/// beside it.
#[test]
fn an_upload_written_in_order_streams_into_a_new_copy_and_anything_else_is_staged() {
    if fuse_missing() {
        return;
    }
    const COUNT: usize = 8;
    const SIDE: i32 = 256; // FLOAT[256, 256]: 256 KiB a tensor, 2 MiB in all
    const BYTES: usize = (SIDE * SIDE * 4) as usize;
    let top = tempfile::tempdir().unwrap();
    let root = top.path().canonicalize().unwrap();
    let model = root.join("m.ptd");
    let base = many_tensor_ptd(&model, COUNT, SIDE, |i, c| c.fill(i as u8)) as usize;
    let log = root.join("log");
    let mut m = Mount::unmounted(top, model.clone(), vec![], &["--log-file", arg(&log), "-v"]);
    m.mount();
    let w = m.path("weights.safetensors");
    let header = st::layers_header(COUNT, SIDE);
    let upload = |fill: u8| -> Vec<u8> {
        let mut out = header.clone();
        for i in 0..COUNT {
            out.extend(std::iter::repeat_n(fill.wrapping_add(i as u8), BYTES));
        }
        out
    };
    let holds = |fill: u8| {
        let bytes = read(&model);
        (0..COUNT).all(|i| {
            bytes[base + i * BYTES..base + (i + 1) * BYTES]
                .iter()
                .all(|&b| b == fill.wrapping_add(i as u8))
        })
    };
    let names_beside = listing(&root);
    let ino = std::fs::metadata(&model).unwrap().ino();

    // In order, in 1 MiB writes: streamed.
    let new = upload(0x40);
    let mut f = open_for_writing(&w);
    for chunk in new.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        streamed(&log),
        1,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(holds(0x40));
    assert_ne!(std::fs::metadata(&model).unwrap().ino(), ino);
    let shown = read(&w);
    assert!(
        st::split(&shown).1 == &new[header.len()..],
        "the mount does not show the upload"
    );
    assert_eq!(listing(&root), names_beside);
    offline_check(&m);

    // The data first, then the header: staged, committed as before.
    let new = upload(0x80);
    let f = open_for_writing(&w);
    f.write_all_at(&new[header.len()..], header.len() as u64)
        .unwrap();
    f.write_all_at(&header, 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(streamed(&log), 1);
    assert!(holds(0x80));
    let shown = read(&w);
    assert!(st::split(&shown).1 == &new[header.len()..]);

    // Cut short after most of the data: refused at close, nothing changed or left.
    let before = read(&model);
    let ino = std::fs::metadata(&model).unwrap().ino();
    let new = upload(0xC0);
    let errno = write_and_close(&m, &w, &new[..new.len() - BYTES / 2]);
    assert_eq!(errno, "EINVAL");
    assert_eq!(read(&model), before);
    assert_eq!(std::fs::metadata(&model).unwrap().ino(), ino);
    std::fs::remove_file(m.dir.path().join("candidate")).unwrap();
    assert_eq!(listing(&root), names_beside);
    assert_eq!(streamed(&log), 1);

    // Bytes past what the header declares: staged, and refused as before.
    let mut long = upload(0xC0);
    long.extend_from_slice(b"tail");
    assert_eq!(write_and_close(&m, &w, &long), "EINVAL");
    assert_eq!(read(&model), before);
    std::fs::remove_file(m.dir.path().join("candidate")).unwrap();
    assert_eq!(listing(&root), names_beside);
    m.umount();
}

/// The `examples/make_xnnpack_model` binary cargo built beside the tests: a `.pte` whose
/// XNNPACK payload reads a 4-bit filter and its bfloat16 scales from named data.
fn make_xnnpack_model(out: &Path, args: &[&str]) {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples/make_xnnpack_model");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds it (the examples are built with the tests)",
        bin.display()
    );
    let st = Command::new(&bin).arg(out).args(args).status().unwrap();
    assert!(st.success(), "make_xnnpack_model failed");
}

/// docs/writes.md#uploads-written-straight-into-a-new-copy: the scales an upload streamed into
/// a new copy lands on are checked as a staged upload's are. A scale XNNPACK refuses fails the
/// close with the same reason, the model stays byte for byte as it was and nothing is left
/// beside it; the same upload with the scale it had is streamed and committed.
#[test]
fn a_streamed_upload_with_a_scale_xnnpack_refuses_changes_nothing() {
    if fuse_missing() {
        return;
    }
    let top = tempfile::tempdir().unwrap();
    let root = top.path().canonicalize().unwrap();
    let model = root.join("x.pte");
    // A [1024, 2048] qbint4 filter: 1 MiB of nibbles and 128 KiB of scales, nearly all of
    // the file.
    make_xnnpack_model(&model, &["--out-features", "1024", "--in-features", "2048"]);
    let log = root.join("log");
    let mut m = Mount::unmounted(top, model.clone(), vec![], &["--log-file", arg(&log), "-v"]);
    m.mount();
    let w = m.path("weights.safetensors");
    let old = read(&w);
    let (header, data) = st::split(&old);
    let start = old.len() - data.len();
    let range = |name: &str| {
        let o = &header[name]["data_offsets"];
        start + o[0].as_u64().unwrap() as usize..start + o[1].as_u64().unwrap() as usize
    };
    let (weight, scales) = (range("weight"), range("scale_weight"));
    assert_eq!(header["scale_weight"]["dtype"], "BF16");
    let mut update = old.clone();
    for b in &mut update[weight.clone()] {
        *b ^= 0x5a;
    }
    // Scale 0: a bfloat16 NaN.
    update[scales.start..scales.start + 2].copy_from_slice(&0x7fc0u16.to_le_bytes());
    let before = read(&model);
    let names = listing(&root);

    assert_eq!(write_and_close(&m, &w, &update), "EINVAL");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("scale 0 is NaN")
            && said.contains("XNNPACK accepts only positive normal floats"),
        "{said}"
    );
    assert!(read(&model) == before, "the model changed");
    std::fs::remove_file(root.join("candidate")).unwrap();
    assert_eq!(listing(&root), names);
    assert_eq!(streamed(&log), 0);

    update[scales.start..scales.start + 2].copy_from_slice(&old[scales.start..scales.start + 2]);
    assert_eq!(write_and_close(&m, &w, &update), "ok");
    assert_eq!(
        streamed(&log),
        1,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let shown = read(&w);
    assert!(
        shown[weight.clone()] == update[weight],
        "the new filter is not shown"
    );
    std::fs::remove_file(root.join("candidate")).unwrap();
    assert_eq!(listing(&root), names);
    offline_check(&m);
    m.umount();
}

/// How many threads of process `pid` are writing a buffer of a new copy.
fn writing_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "direct-write")
        })
        .count()
}

/// A tmpfs of `size` mounted on `dir` (created), unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t tmpfs failed");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with a file `name` until it refuses more, then leaves
/// `spare` bytes free.
fn fill_up(dir: &Path, name: &str, spare: u64) -> PathBuf {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    let chunk = vec![0u8; 1 << 20];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                break;
            }
        }
    }
    f.set_len(f.metadata().unwrap().len().saturating_sub(spare))
        .unwrap();
    p
}

/// docs/writes.md#uploads-written-straight-into-a-new-copy: bytes a streamed upload was
/// given reach the model, or the upload is refused; never bytes it was not given. Here the
/// model's file system is full for a moment (another user's file) while the copy's second
/// 8 MiB buffer goes to the disk, and the writer's process runs a command in between (its
/// `exec` closes a duplicate of the descriptor: a commit attempt the writer never hears of).
/// The upload goes on once there is room again and its close() succeeds: the model must then
/// hold every byte the upload wrote (it held 12 MiB of zeros where the lost buffer was).
#[test]
fn a_streamed_upload_that_met_a_full_disk_never_commits_bytes_it_was_not_given() {
    if fuse_missing() {
        return;
    }
    const COUNT: usize = 8;
    const SIDE: i32 = 1024; // FLOAT[1024, 1024]: 4 MiB a tensor, 32 MiB in all
    const BYTES: usize = (SIDE * SIDE * 4) as usize;
    let top = tempfile::tempdir().unwrap();
    let root = top.path().canonicalize().unwrap();
    // The model (32 MiB), its new copy (32 MiB) and some room.
    let small = Tmpfs::mount(&root.join("small"), "80M");
    let model = small.0.join("m.ptd");
    let base = many_tensor_ptd(&model, COUNT, SIDE, |i, c| c.fill(i as u8)) as usize;
    let log = root.join("log");
    let mut m = Mount::unmounted(top, model.clone(), vec![], &["--log-file", arg(&log), "-v"]);
    m.mount();
    let w = m.path("weights.safetensors");
    let mut upload = st::layers_header(COUNT, SIDE);
    let data_start = upload.len();
    upload.extend((0..COUNT * BYTES).map(|i| (i % 251) as u8 | 1));
    let before = read(&model);

    let f = open_for_writing(&w);
    let mut at = 0;
    let mut write_to = |end: usize| -> std::io::Result<()> {
        while at < end {
            let n = (end - at).min(1 << 20);
            f.write_all_at(&upload[at..at + n], at as u64)?;
            at += n;
        }
        Ok(())
    };
    let mut refused = write_to(12 << 20).err();
    // The copy's first 8 MiB are on the disk before it fills up.
    let pid = daemon_pid(&m.mnt);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while refused.is_none()
        && !unnamed_files(pid)
            .iter()
            .any(|(_, meta)| meta.len() >= 8 << 20)
    {
        assert!(std::time::Instant::now() < deadline, "no copy of 8 MiB");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let filler = fill_up(&small.0, "filler", 0);
    if refused.is_none() {
        // The copy's second buffer (its bytes 8..16 MiB) is written while the disk is full.
        refused = write_to(17 << 20).err();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while writing_threads(pid) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the copy is still written"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    // Some room again: enough for small files, not for the lost 8 MiB.
    let len = std::fs::metadata(&filler).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .and_then(|f| f.set_len(len.saturating_sub(1 << 20)))
        .unwrap();
    if refused.is_none() {
        // What a writer's `subprocess.run` does to its open descriptors: a flush.
        // SAFETY: a descriptor this test owns, duplicated and the duplicate closed once.
        unsafe { libc::close(libc::dup(std::os::fd::AsRawFd::as_raw_fd(&f))) };
    }
    std::fs::remove_file(&filler).unwrap();
    if refused.is_none() {
        refused = write_to(upload.len()).err();
    }
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: a descriptor this test owns, closed once.
    let closed = unsafe { libc::close(fd) } == 0;
    let now = read(&model);
    if refused.is_none() && closed {
        let bad: Vec<usize> = (0..COUNT * BYTES / (1 << 20))
            .filter(|&mib| {
                let r = mib << 20..(mib + 1) << 20;
                now[base + r.start..base + r.end]
                    != upload[data_start + r.start..data_start + r.end]
            })
            .collect();
        assert!(
            bad.is_empty(),
            "close() succeeded, but MiB {bad:?} of the tensors do not hold what the upload wrote\n{}",
            std::fs::read_to_string(&log).unwrap()
        );
    } else {
        assert!(now == before, "a refused upload changed the model");
    }
    assert_eq!(listing(&small.0), ["m.ptd"]);
    m.umount();
}

/// docs/writes.md#large-updates-as-a-new-copy: a model with extended attributes is never
/// replaced by a copy, which would not carry them. A model whose access is set by an ACL (its
/// owner's group may only read it, one other user may read and write it) and that carries an
/// attribute of its own takes an upload of every tensor in place: same inode, the ACL (not
/// its mask taken as the group's bits) and the attribute kept, the new bytes in.
#[test]
fn an_update_of_most_of_a_model_with_an_acl_stays_in_place_and_keeps_it() {
    if fuse_missing() {
        return;
    }
    const COUNT: usize = 8;
    const SIDE: i32 = 256; // 2 MiB in all
    const BYTES: usize = (SIDE * SIDE * 4) as usize;
    let top = tempfile::tempdir().unwrap();
    let root = top.path().canonicalize().unwrap();
    let model = root.join("m.ptd");
    many_tensor_ptd(&model, COUNT, SIDE, |i, c| c.fill(i as u8));
    std::os::unix::fs::chown(&model, Some(54321), Some(54322)).unwrap();
    // user::rw- user:4321:rw- group::r-- mask::rw- other::---
    let entry = |tag: u16, perm: u16, id: u32| {
        let mut e = tag.to_le_bytes().to_vec();
        e.extend_from_slice(&perm.to_le_bytes());
        e.extend_from_slice(&id.to_le_bytes());
        e
    };
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01, 6, u32::MAX),
        (0x02, 6, 4321),
        (0x04, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend(entry(tag, perm, id));
    }
    set_xattr(&model, "system.posix_acl_access", &acl);
    set_xattr(&model, "user.origin", b"fine-tune 7");
    let acl_before = get_xattr(&model, "system.posix_acl_access");
    let meta = std::fs::metadata(&model).unwrap();
    let log = root.join("log");
    let mut m = Mount::unmounted(top, model.clone(), vec![], &["--log-file", arg(&log), "-v"]);
    m.mount();
    let mut upload = st::layers_header(COUNT, SIDE);
    upload.extend(std::iter::repeat_n(0x5a, COUNT * BYTES));
    assert_eq!(
        write_and_close(&m, &m.path("weights.safetensors"), &upload),
        "ok"
    );
    assert_eq!(
        streamed(&log),
        0,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let after = std::fs::metadata(&model).unwrap();
    assert_eq!(after.ino(), meta.ino(), "written as a new copy");
    let read = std::fs::read(m.path("weights.safetensors")).unwrap();
    let data = COUNT * BYTES;
    assert!(
        read.len() >= data && read[read.len() - data..] == upload[upload.len() - data..],
        "the upload's tensors are not what the mount shows"
    );
    assert_eq!((after.uid(), after.gid()), (54321, 54322));
    assert_eq!(after.mode() & 0o7777, meta.mode() & 0o7777);
    assert_eq!(
        get_xattr(&model, "system.posix_acl_access"),
        acl_before,
        "the model's ACL is not the one it had: its group may now write it (mode {:o}), user 4321 lost its access",
        after.mode() & 0o7777
    );
    assert_eq!(
        get_xattr(&model, "user.origin").as_deref(),
        Some(&b"fine-tune 7"[..])
    );
    m.umount();
}
