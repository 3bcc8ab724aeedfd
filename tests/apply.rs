//! `ptefs apply`: bulk updates from a safetensors file without FUSE, run as the binary a
//! user runs. The tensors and their bytes come from the model's own `weights.safetensors`
//! (`ptefs cat`), so every check compares against what the tree shows.

mod common;

use std::path::Path;
use std::process::Command;

use common::mount::{run, text, Mount, BIN};
use common::safetensors::{build as safetensors, split, tensor};
use common::{copy_fixture, fuse_missing, pattern, Copied};

/// `ptefs <args>`: success, stdout, stderr.
fn ptefs(args: &[&str]) -> (bool, String, String) {
    let out = run(Command::new(BIN).args(args));
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The `weights.safetensors` at `path` in the tree of `c`, read with `ptefs cat`.
fn weights(c: &Copied, path: &str) -> Vec<u8> {
    let mut cmd = Command::new(BIN);
    cmd.arg("cat").arg(&c.model).arg(path);
    for d in &c.data {
        cmd.arg("--data").arg(d);
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    out.stdout
}

fn apply_args<'a>(c: &'a Copied, update: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["apply", arg(&c.model), arg(update)];
    for d in &c.data {
        args.push("--data");
        args.push(arg(d));
    }
    args.extend_from_slice(extra);
    args
}

#[test]
fn apply_writes_the_changed_tensors_of_an_attached_file_and_reports_them() {
    let c = copy_fixture("linear_ext.pte");
    let tree_path = "data/linear_ext/weights.safetensors";
    let before = weights(&c, tree_path);
    let pte_before = std::fs::read(&c.model).unwrap();
    let update = c.root.join("update.safetensors");
    let new_weight = pattern(48, 4);
    std::fs::write(
        &update,
        safetensors(&[
            ("lin.weight", "F32", vec![3, 4], new_weight.clone()),
            (
                "lin.bias",
                "F32",
                vec![3],
                tensor(&before, "lin.bias").to_vec(),
            ),
        ]),
    )
    .unwrap();

    // A dry run says what would change and writes nothing.
    let ptd_before = std::fs::read(&c.data[0]).unwrap();
    let (ok, out, err) = ptefs(&apply_args(&c, &update, &["--dry-run"]));
    assert!(ok, "{err}");
    assert!(out.contains("would change\tlin.weight"), "{out}");
    assert!(out.contains("unchanged\tlin.bias"), "{out}");
    assert!(
        out.contains("1 tensor(s) would change, 1 unchanged, 48 bytes would be written"),
        "{out}"
    );
    assert_eq!(std::fs::read(&c.data[0]).unwrap(), ptd_before);

    let (ok, out, err) = ptefs(&apply_args(&c, &update, &[]));
    assert!(ok, "{err}");
    assert!(out.contains("changed\tlin.weight"), "{out}");
    assert!(
        out.contains("1 tensor(s) changed, 1 unchanged, 48 bytes written"),
        "{out}"
    );
    let after = weights(&c, tree_path);
    assert_eq!(tensor(&after, "lin.weight"), &new_weight[..]);
    assert_eq!(tensor(&after, "lin.bias"), tensor(&before, "lin.bias"));
    // Only the weight's bytes changed, in place; the program file is untouched.
    let ptd_after = std::fs::read(&c.data[0]).unwrap();
    assert_eq!(ptd_after.len(), ptd_before.len());
    let differing = ptd_after
        .iter()
        .zip(&ptd_before)
        .filter(|(a, b)| a != b)
        .count();
    assert!(differing > 0 && differing <= 48, "{differing} bytes differ");
    assert_eq!(std::fs::read(&c.model).unwrap(), pte_before);
    let (ok, out, _) = ptefs(&["check", arg(&c.model), "--data", arg(&c.data[0])]);
    assert!(ok, "{out}");

    // The same update again changes nothing.
    let (ok, out, err) = ptefs(&apply_args(&c, &update, &[]));
    assert!(ok, "{err}");
    assert!(
        out.contains("0 tensor(s) changed, 2 unchanged, 0 bytes written"),
        "{out}"
    );
}

#[test]
fn one_tensor_that_does_not_fit_refuses_the_whole_update() {
    let c = copy_fixture("linear_ext.pte");
    let update = c.root.join("update.safetensors");
    std::fs::write(
        &update,
        safetensors(&[
            ("lin.weight", "F32", vec![3, 4], pattern(48, 1)),
            ("lin.bias", "F32", vec![4], pattern(16, 2)),
            ("nope", "F32", vec![1], pattern(4, 3)),
        ]),
    )
    .unwrap();
    let ptd_before = std::fs::read(&c.data[0]).unwrap();
    let (ok, out, err) = ptefs(&apply_args(&c, &update, &[]));
    assert!(!ok, "{out}");
    assert!(
        err.contains("\"lin.bias\": expected F32[3], found F32[4]"),
        "{err}"
    );
    assert!(err.contains("\"nope\": no such tensor"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(std::fs::read(&c.data[0]).unwrap(), ptd_before);

    // Not a safetensors file: refused, naming it.
    std::fs::write(&update, b"not safetensors at all").unwrap();
    let (ok, _, err) = ptefs(&apply_args(&c, &update, &[]));
    assert!(!ok);
    assert!(err.contains("update.safetensors"), "{err}");
    assert_eq!(std::fs::read(&c.data[0]).unwrap(), ptd_before);
}

#[test]
fn the_whole_weights_file_of_a_model_applies_back_as_a_no_op_then_as_new_values() {
    let c = copy_fixture("linear.pte");
    let before = weights(&c, "weights.safetensors");
    let update = c.root.join("all.safetensors");
    std::fs::write(&update, &before).unwrap();
    let (ok, out, err) = ptefs(&apply_args(&c, &update, &[]));
    assert!(ok, "{err}");
    assert!(out.contains(" 0 bytes written"), "{out}");

    // Every tensor new: each one changes, with exactly its bytes.
    let (header, _) = split(&before);
    let mut tensors = Vec::new();
    for (i, (name, t)) in header.iter().enumerate() {
        let shape: Vec<u64> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let len = tensor(&before, name).len();
        tensors.push((
            name.as_str(),
            t["dtype"].as_str().unwrap(),
            shape,
            pattern(len, i as u8 + 7),
        ));
    }
    std::fs::write(&update, safetensors(&tensors)).unwrap();
    let (ok, out, err) = ptefs(&apply_args(&c, &update, &[]));
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("{} tensor(s) changed, 0 unchanged", tensors.len())),
        "{out}"
    );
    let after = weights(&c, "weights.safetensors");
    for (name, _, _, bytes) in &tensors {
        assert_eq!(tensor(&after, name), &bytes[..], "{name}");
    }
}

#[test]
fn apply_refuses_while_the_file_is_mounted_naming_the_mountpoint() {
    if fuse_missing() {
        return;
    }
    let m = Mount::new(&common::fixtures_dir().join("linear.pte"), &[], &[]);
    let before = std::fs::read(&m.model).unwrap();
    let raw = std::fs::read(m.path("weights.safetensors")).unwrap();
    let update = m.dir.path().join("u.safetensors");
    std::fs::write(&update, &raw).unwrap();
    let (ok, _, err) = ptefs(&["apply", arg(&m.model), arg(&update)]);
    assert!(!ok);
    assert!(
        err.contains(&format!("already mounted on {}", m.mnt.display())),
        "{err}"
    );
    assert_eq!(std::fs::read(&m.model).unwrap(), before);
}

/// Runs `ptefs <args>` to its end: success, stderr, and its peak resident memory in bytes
/// (its own, from wait4, not the test's other children's).
// The child is reaped by wait4, which clippy does not see.
#[allow(clippy::zombie_processes)]
fn ptefs_peak(args: &[&str]) -> (bool, String, u64) {
    use std::io::Read;
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for this test's own child, which std has not reaped.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, err, (usage.ru_maxrss as u64) << 10)
}

/// A 97 MB header of 1.68 million empty tensors, for a model of 8: refused from its first
/// 8 bytes, in the user's terms, with `apply` never larger than the model justifies (it
/// took 2.7 GiB and 24 s when a header was bounded by the format's 100 MB alone).
#[test]
fn a_header_larger_than_the_model_can_need_is_refused_before_it_is_read() {
    let c = copy_fixture("dtypes.pte");
    let update = c.root.join("update.safetensors");
    // Written as it is made: the peak wait4 reports includes the test's own at the spawn.
    const COUNT: usize = 1_680_000;
    let entry = |i: usize| format!(r#""{i:07}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}"#);
    let json_len = 2 + COUNT * (entry(0).len() + 1) - 1;
    let padded = json_len.next_multiple_of(8);
    let mut out = std::io::BufWriter::new(std::fs::File::create(&update).unwrap());
    let mut put = |b: &[u8]| std::io::Write::write_all(&mut out, b).unwrap();
    put(&(padded as u64).to_le_bytes());
    put(b"{");
    for i in 0..COUNT {
        if i > 0 {
            put(b",");
        }
        put(entry(i).as_bytes());
    }
    put(b"}");
    put(&vec![b' '; padded - json_len]);
    drop(out);
    let before = std::fs::read(&c.model).unwrap();
    let (ok, err, peak) = ptefs_peak(&apply_args(&c, &update, &[]));
    assert!(!ok);
    assert!(
        err.contains(
            "the header declares 92.9 MiB, more than this model's 8 tensor(s) can need (at most"
        ),
        "{err}"
    );
    eprintln!("apply peak RSS: {} MiB", peak >> 20);
    assert!(peak < 64 << 20, "apply peak RSS {} MiB", peak >> 20);
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

/// docs/writes.md#large-updates-as-a-new-copy: an update of more than half of a file of at
/// least 1 MiB is written as a new copy renamed over the model (a new inode with the mode
/// and owner kept; a hard link keeps the old bytes, as after a re-layout; no journal, nothing
/// left beside it), a small one in place through the journal (the same inode, which the link
/// shares), and a refused one changes nothing and leaves no file.
#[test]
fn an_update_of_most_of_a_file_is_a_new_copy_and_a_small_one_stays_in_place() {
    use common::safetensors::{build, layer_name, many_tensor_ptd};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const COUNT: usize = 8;
    const SIDE: i32 = 256;
    const BYTES: usize = (SIDE * SIDE * 4) as usize;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.ptd");
    let base = many_tensor_ptd(&model, COUNT, SIDE, |i, c| c.fill(i as u8)) as usize;
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.path().join("link.ptd");
    std::fs::hard_link(&model, &link).unwrap();
    let names: Vec<String> = (0..COUNT).map(layer_name).collect();
    let elsewhere = tempfile::tempdir().unwrap();
    let update = elsewhere.path().join("u.safetensors");
    let shape = vec![SIDE as u64, SIDE as u64];
    let tensors_of = |which: &[usize], fill: u8| -> Vec<u8> {
        let t: Vec<common::safetensors::Tensor> = which
            .iter()
            .map(|&i| (names[i].as_str(), "F32", shape.clone(), vec![fill; BYTES]))
            .collect();
        build(&t)
    };
    let tensor = |bytes: &[u8], i: usize| bytes[base + i * BYTES..base + (i + 1) * BYTES].to_vec();
    let beside = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let listing = beside(dir.path());
    let ino = std::fs::metadata(&model).unwrap().ino();

    // One tensor of eight: in place, the link sees it.
    std::fs::write(&update, tensors_of(&[2], 0xA2)).unwrap();
    let (ok, out, err) = ptefs(&["apply", arg(&model), arg(&update)]);
    assert!(ok, "{err}");
    assert!(out.contains("1 tensor(s) changed"), "{out}");
    assert_eq!(std::fs::metadata(&model).unwrap().ino(), ino);
    assert_eq!(tensor(&std::fs::read(&link).unwrap(), 2), vec![0xA2; BYTES]);
    let before_copy = std::fs::read(&model).unwrap();

    // Five of eight (1.25 MiB of 2 MiB): a new copy.
    std::fs::write(&update, tensors_of(&[0, 1, 3, 5, 7], 0xC0)).unwrap();
    let (ok, out, err) = ptefs(&["apply", arg(&model), arg(&update)]);
    assert!(ok, "{err}");
    assert!(out.contains("5 tensor(s) changed"), "{out}");
    let meta = std::fs::metadata(&model).unwrap();
    assert_ne!(meta.ino(), ino, "not a new file");
    assert_eq!(meta.mode() & 0o7777, 0o640);
    let after = std::fs::read(&model).unwrap();
    assert_eq!(after.len(), before_copy.len());
    assert_eq!(
        &after[..base],
        &before_copy[..base],
        "the header and flatbuffer changed"
    );
    for i in 0..COUNT {
        let want = match i {
            0 | 1 | 3 | 5 | 7 => vec![0xC0; BYTES],
            2 => vec![0xA2; BYTES],
            _ => vec![i as u8; BYTES],
        };
        assert_eq!(tensor(&after, i), want, "tensor {i}");
    }
    assert_eq!(
        std::fs::read(&link).unwrap(),
        before_copy,
        "the link changed"
    );
    assert_eq!(beside(dir.path()), listing, "files left beside the model");
    let (ok, out, err) = ptefs(&["check", arg(&model)]);
    assert!(ok, "{out}{err}");

    // Refused (one tensor of another shape): nothing changes, nothing is left.
    let mut t: Vec<common::safetensors::Tensor> = [0, 1, 3, 5]
        .iter()
        .map(|&i| (names[i].as_str(), "F32", shape.clone(), vec![0xEE; BYTES]))
        .collect();
    t.push((
        names[7].as_str(),
        "F32",
        vec![SIDE as u64 * 2, SIDE as u64 / 2 - 1],
        vec![0xEE; BYTES - 2 * SIDE as usize * 4],
    ));
    std::fs::write(&update, build(&t)).unwrap();
    let ino = meta.ino();
    let (ok, _, err) = ptefs(&["apply", arg(&model), arg(&update)]);
    assert!(!ok);
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(std::fs::read(&model).unwrap(), after);
    assert_eq!(std::fs::metadata(&model).unwrap().ino(), ino);
    assert_eq!(beside(dir.path()), listing, "files left beside the model");
}
