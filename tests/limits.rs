//! Sizes and counts a write may take (docs/writes.md#sizes-and-free-space): staged content
//! grows, and a commit starts, only when the model's file system has room for what it needs
//! (ENOSPC otherwise, naming the numbers); `--max-file-size` bounds blobs, payloads and
//! scratch files (EFBIG); scratch files are bounded per user, in number and in bytes
//! (EDQUOT). Through the core, and through real mounts on a small tmpfs.
//!
//! They need root (to mount a small tmpfs, and FUSE) as in CI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::mount::{run, text, Mount, BIN};
use common::{fixtures_dir, fuse_missing, pattern};
use ptefs::format::Model;
use ptefs::fs::{Fs, Options, SetAttr, SizeLimits};
use ptefs::tree::{Ino, Tree};

/// Runs `f` with a tmpfs of `size` mounted at a new directory; unmounts it after.
fn with_small_tmpfs(size: &str, f: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("small");
    std::fs::create_dir(&at).unwrap();
    let out = run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&at));
    assert!(out.status.success(), "mount tmpfs: {}", text(&out.stderr));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&at)));
    let _ = Command::new("umount").arg("-l").arg(&at).status();
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

/// Fills the file system of `dir` with a file `fill` until no block is free.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("fill");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", path.display()))
        .stderr(Stdio::null())
        .status();
    path
}

fn xnnpack() -> PathBuf {
    fixtures_dir().join("linear_xnnpack.pte")
}

fn open(model: &Path) -> Fs {
    let model = Model::open_writable(model, &[] as &[PathBuf]).unwrap();
    Fs::new(Tree::build(Arc::new(model)), Options { read_only: false })
}

/// The first named-data blob of the tree.
fn blob(fs: &Fs) -> (String, Ino) {
    let tree = fs.tree();
    let dir = tree.find("named_data").unwrap();
    let name = fs
        .list(dir)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .find(|n| n.ends_with(".bin"))
        .unwrap();
    let path = format!("named_data/{name}");
    let ino = tree.find(&path).unwrap();
    (path, ino)
}

fn ftruncate(fs: &Fs, ino: Ino, size: u64) -> Result<(), ptefs::error::Error> {
    let fh = fs.open(ino, libc::O_WRONLY).unwrap().fh;
    let change = SetAttr {
        size: Some(size),
        fh: Some(fh),
        ..SetAttr::default()
    };
    let r = fs
        .setattr(ino, change)
        .map(|_| ())
        .and_then(|()| fs.flush(fh));
    fs.release(fh).unwrap();
    r
}

fn no_space(r: Result<(), ptefs::error::Error>, says: &str) {
    let e = r.unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    let m = e.to_string();
    assert!(m.contains(says) && m.contains("bytes free"), "{m}");
}

/// Growing a blob needs room for its re-layout; every commit needs room for its journal or
/// its new file; the refusals name the numbers, and leave the model and its directory as
/// they were.
#[test]
fn free_space_bounds_staged_growth_and_commits() {
    with_small_tmpfs("1m", |small| {
        let model = small.join("linear_xnnpack.pte");
        std::fs::copy(xnnpack(), &model).unwrap();
        let before = std::fs::read(&model).unwrap();
        let fs = open(&model);
        let (path, ino) = blob(&fs);
        let old = common::read_all(&fs, ino, 1 << 20).unwrap();
        // More than the file system holds: refused at the truncate itself.
        no_space(ftruncate(&fs, ino, 4 << 20), "the 4");
        let filler = fill(small);
        // No room for a journal: a same-size write is refused at its commit.
        let same = pattern(old.len(), 3);
        no_space(
            common::replace(&fs, &path, &same),
            "first writes its journal beside it",
        );
        // No room for a new file: a smaller blob (a re-layout) is refused at its commit.
        no_space(
            common::replace(&fs, &path, &old[..old.len() / 2]),
            "writes a new file of the whole model beside it",
        );
        assert_eq!(std::fs::read(&model).unwrap(), before);
        let mut names: Vec<String> = std::fs::read_dir(small)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["fill", "linear_xnnpack.pte"]);
        // With room again, the same writes go through.
        std::fs::remove_file(filler).unwrap();
        common::replace(&fs, &path, &same).unwrap();
        common::replace(&fs, &path, &old[..old.len() / 2]).unwrap();
        assert!(std::fs::metadata(&model).unwrap().len() < before.len() as u64);
    });
}

/// `--max-file-size` bounds blobs, payloads and scratch files (EFBIG, naming the option).
#[test]
fn a_maximum_file_size_bounds_resizable_files() {
    let c = common::copy_files(&xnnpack(), &[]);
    let fs = open(&c.model).with_size_limits(SizeLimits {
        max_file_size: Some(1 << 20),
        ..SizeLimits::default()
    });
    let (_, ino) = blob(&fs);
    let e = ftruncate(&fs, ino, (1 << 20) + 1).unwrap_err();
    assert_eq!(e.errno(), libc::EFBIG, "{e}");
    assert!(
        e.to_string()
            .contains("are limited by --max-file-size on this mount (at most 1048576 bytes)"),
        "{e}"
    );
    let processed = fs
        .tree()
        .find("plans/forward/delegates/0/processed.bin")
        .unwrap();
    let e = ftruncate(&fs, processed, 2 << 20).unwrap_err();
    assert_eq!(e.errno(), libc::EFBIG, "{e}");
    // Up to the limit, a blob may grow.
    ftruncate(&fs, ino, 1 << 20).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().size, 1 << 20);
}

/// Scratch files: one user may have 256 at once (EDQUOT after), and their bytes together
/// are bounded; other users are not held back by them.
#[test]
fn scratch_files_are_bounded_per_user() {
    let c = common::copy_files(&xnnpack(), &[]);
    let fs = open(&c.model).with_size_limits(SizeLimits {
        scratch_bytes_per_user: Some(1 << 20),
        ..SizeLimits::default()
    });
    let dir = fs.tree().find("named_data").unwrap();
    let mut handles = Vec::new();
    for i in 0..256 {
        let (_, o) = fs
            .create_by(1000, dir, format!("s{i}"), libc::O_WRONLY)
            .unwrap();
        handles.push(o.fh);
    }
    let e = fs
        .create_by(1000, dir, "one more", libc::O_WRONLY)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    assert!(
        e.to_string()
            .contains("user 1000 has 256 scratch files in this mount, the most one user may have; remove some"),
        "{e}"
    );
    // Another user may still create one; and a removed file makes room.
    let other = fs
        .create_by(1001, dir, "theirs", libc::O_WRONLY)
        .unwrap()
        .1
        .fh;
    fs.unlink(dir, "s0").unwrap();
    fs.create_by(1000, dir, "again", libc::O_WRONLY).unwrap();
    // Bytes: 600 KiB in one file and 600 KiB in another is more than the 1 MiB one user
    // may hold.
    fs.write(handles[1], 0, &vec![1; 600 << 10]).unwrap();
    let e = fs.write(handles[2], 0, &vec![2; 600 << 10]).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    assert!(
        e.to_string()
            .contains("more than the 1048576 one user may have"),
        "{e}"
    );
    let grow = SetAttr {
        size: Some(600 << 10),
        fh: Some(handles[3]),
        ..SetAttr::default()
    };
    let ino = fs.lookup(dir, "s3").unwrap().ino;
    assert_eq!(fs.setattr(ino, grow).unwrap_err().errno(), libc::EDQUOT);
    // The other user's share is their own.
    fs.write(other, 0, &vec![3; 600 << 10]).unwrap();
}

/// Through a real mount on a small tmpfs: `truncate -s` of a blob beyond what the file
/// system can hold fails with ENOSPC and changes nothing, and with `--max-file-size` beyond
/// that size with EFBIG; touching a 257th scratch file fails with EDQUOT.
#[test]
fn truncate_of_a_blob_and_many_scratch_files_through_a_mount() {
    if fuse_missing() {
        return;
    }
    with_small_tmpfs("16m", |small| {
        let model = small.join("linear_xnnpack.pte");
        std::fs::copy(xnnpack(), &model).unwrap();
        let before = std::fs::read(&model).unwrap();
        let mnt = small.parent().unwrap().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let fs = open(&model);
        let (path, _) = blob(&fs);
        drop(fs);
        let mount = |args: &[&str]| {
            let out = run(Command::new(BIN)
                .arg("mount")
                .arg(&model)
                .arg(&mnt)
                .args(args));
            assert!(out.status.success(), "{}", text(&out.stderr));
        };
        let umount = || {
            let out = run(Command::new(BIN).arg("umount").arg(&mnt));
            assert!(out.status.success(), "{}", text(&out.stderr));
        };
        let sh = |script: &str| {
            let out = run(Command::new("sh").arg("-c").arg(script));
            (out.status.success(), text(&out.stderr))
        };
        let target = mnt.join(&path);
        mount(&[]);
        let (ok, err) = sh(&format!("truncate -s 16G '{}'", target.display()));
        assert!(!ok && err.contains("No space left on device"), "{err}");
        assert_eq!(std::fs::read(&model).unwrap(), before);
        let (ok, err) = sh(&format!(
            "cd '{}' && for i in $(seq 257); do touch s$i || exit 1; done",
            mnt.join("named_data").display()
        ));
        assert!(!ok && err.contains("Disk quota exceeded"), "{err}");
        umount();
        mount(&["-o", "max_file_size=1M"]);
        let (ok, err) = sh(&format!("truncate -s 2M '{}'", target.display()));
        assert!(!ok && err.contains("File too large"), "{err}");
        assert_eq!(std::fs::read(&model).unwrap(), before);
        let (ok, err) = sh(&format!("truncate -s 1M '{}'", target.display()));
        assert!(ok, "{err}");
        umount();
        assert!(std::fs::metadata(&model).unwrap().len() > 1 << 20);
    });
    // Mount's own name for it parses sizes with suffixes.
    let m = Mount::new(&xnnpack(), &[], &["--max-file-size", "4K"]);
    let t = m.path("plans/forward/delegates/0/processed.bin");
    let out = run(Command::new("truncate").arg("-s").arg("8K").arg(&t));
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("File too large"));
}
