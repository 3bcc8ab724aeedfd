//! What readers see when the model changes, through real mounts
//! (docs/writes.md#changes-behind-the-mount, docs/writes.md#readers-during-a-commit):
//!
//! - a change ptefs did not make (`cp` over the file, `dd conv=notrunc` into it, `truncate`,
//!   a rename over it) is never mixed with what was shown: a reader holding a file open
//!   across it gets the old bytes (from its cache) or `ESTALE`, never new bytes; afterwards
//!   the mount shows the file as it is now, or refuses with `ESTALE` naming the change when
//!   it cannot (another file under the name, a file that no longer parses);
//! - a reader holding a file open across a commit of that file gets `ESTALE`, not old bytes
//!   then new ones;
//! - an `O_TRUNC` open does not make the file look empty to anyone else before the commit.

mod common;

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::mount::Mount;
use common::safetensors::{layer_name, many_tensor_ptd};

/// Tensors of the test model: FLOAT[SIDE, SIDE], 4 MiB each, so a reader's later reads go
/// past the kernel's read-ahead to the daemon.
const SIDE: i32 = 1024;
const TENSORS: usize = 3;
const BYTES: usize = (SIDE as usize) * (SIDE as usize) * 4;
/// Where the reader stops before the change: well inside the tensor.
const FIRST: usize = 1 << 20;

/// A `.ptd` of `TENSORS` tensors, every byte of tensor `i` being `fill + i`.
fn write_model(path: &Path, fill: u8) {
    many_tensor_ptd(path, TENSORS, SIDE, |i, chunk| chunk.fill(fill + i as u8));
}

fn tensor_path(i: usize) -> String {
    format!("named_data/{}.bin", layer_name(i))
}

/// Reads the rest of `f` from `at` in 1 MiB requests until the end or an error; returns the
/// chunks read and the error, if any.
fn rest(f: &std::fs::File, mut at: usize) -> (Vec<Vec<u8>>, Option<std::io::Error>) {
    let mut chunks = Vec::new();
    while at < BYTES {
        let mut buf = vec![0u8; (1 << 20).min(BYTES - at)];
        match f.read_exact_at(&mut buf, at as u64) {
            Ok(()) => {
                at += buf.len();
                chunks.push(buf);
            }
            Err(e) => return (chunks, Some(e)),
        }
    }
    (chunks, None)
}

/// A mount of a fresh model with a reader half way into tensor 0; `change` changes the model
/// behind the mount. Checks the reader never gets a byte of the new model, and returns the
/// mount, the model's path and the error the reader got.
fn reader_across(change: impl FnOnce(&Path, &Path)) -> (Mount, PathBuf, Option<std::io::Error>) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.ptd");
    write_model(&src, 0x10);
    let m = Mount::new(&src, &[], &[]);
    let mut f = std::fs::File::open(m.path(&tensor_path(0))).unwrap();
    let mut head = vec![0u8; FIRST];
    f.read_exact(&mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0x10));
    change(&m.model, m.dir.path());
    // Whatever the reader still gets is the old tensor; its daemon reads fail.
    let (chunks, err) = rest(&f, FIRST);
    for (k, c) in chunks.iter().enumerate() {
        assert!(
            c.iter().all(|&b| b == 0x10),
            "chunk {k} after the change holds bytes of the new model"
        );
    }
    let model_path = m.model.clone();
    (m, model_path, err)
}

fn errno_of(e: &Option<std::io::Error>) -> Option<i32> {
    e.as_ref().and_then(std::io::Error::raw_os_error)
}

/// Every tensor of the mount holds `fill + i`, through fresh opens.
fn shows(m: &Mount, fill: u8) {
    for i in 0..TENSORS {
        let bytes = std::fs::read(m.path(&tensor_path(i))).unwrap();
        assert_eq!(bytes.len(), BYTES);
        assert!(bytes.iter().all(|&b| b == fill + i as u8), "tensor {i}");
    }
    let seg = std::fs::read(m.path("segments/1")).unwrap();
    assert!(seg.iter().all(|&b| b == fill + 1));
}

#[test]
fn cp_over_the_model_shows_the_new_one_and_never_a_mix() {
    if common::fuse_missing() {
        return;
    }
    let (m, _, err) = reader_across(|model, dir| {
        let other = dir.join("other.ptd");
        write_model(&other, 0x40);
        // `cp` keeps the inode: truncates, then writes.
        let st = std::process::Command::new("cp")
            .arg(&other)
            .arg(model)
            .status()
            .unwrap();
        assert!(st.success());
    });
    assert!(
        matches!(errno_of(&err), Some(libc::ESTALE) | Some(libc::EIO)),
        "the reader went on reading across the change: {err:?}"
    );
    // Fresh opens show the new model, every file of it.
    shows(&m, 0x40);
}

#[test]
fn dd_into_the_model_shows_the_new_bytes_and_never_a_mix() {
    if common::fuse_missing() {
        return;
    }
    let (m, model, err) = reader_across(|model, dir| {
        // Overwrite tensor 0's bytes in place, without truncating.
        let other = dir.join("other.ptd");
        write_model(&other, 0x40);
        let st = std::process::Command::new("dd")
            .arg(format!("if={}", other.display()))
            .arg(format!("of={}", model.display()))
            .args(["bs=1M", "conv=notrunc", "status=none"])
            .status()
            .unwrap();
        assert!(st.success());
    });
    assert!(
        matches!(errno_of(&err), Some(libc::ESTALE) | Some(libc::EIO)),
        "{err:?}"
    );
    shows(&m, 0x40);
    assert!(model.exists());
}

#[test]
fn truncate_and_rename_over_are_refused_until_remounted() {
    if common::fuse_missing() {
        return;
    }
    // Truncated below its segments: the file no longer parses.
    let (m, _, err) = reader_across(|model, _| {
        let f = std::fs::OpenOptions::new().write(true).open(model).unwrap();
        f.set_len((BYTES / 2) as u64).unwrap();
    });
    assert!(
        matches!(errno_of(&err), Some(libc::ESTALE) | Some(libc::EIO)),
        "{err:?}"
    );
    let e = std::fs::read(m.path(&tensor_path(1))).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    drop(m);

    // Another file renamed over the name.
    let (m, model, err) = reader_across(|model, dir| {
        let other = dir.join("other.ptd");
        write_model(&other, 0x40);
        std::fs::rename(&other, model).unwrap();
    });
    assert!(
        matches!(errno_of(&err), Some(libc::ESTALE) | Some(libc::EIO)),
        "{err:?}"
    );
    let e = std::fs::read(m.path(&tensor_path(1))).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    let log = std::fs::read_to_string(m.path("header.json")).unwrap_err();
    assert_eq!(log.raw_os_error(), Some(libc::ESTALE));
    // Nothing was written to the file that took the name.
    let now = std::fs::read(&model).unwrap();
    assert!(now[now.len() - 1] == 0x40 + TENSORS as u8 - 1);
}

#[test]
fn a_reader_across_a_commit_gets_estale_not_old_then_new() {
    if common::fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.ptd");
    write_model(&src, 0x10);
    let m = Mount::new(&src, &[], &[]);
    let t = m.path(&tensor_path(0));
    let mut f = std::fs::File::open(&t).unwrap();
    let mut head = vec![0u8; FIRST];
    f.read_exact(&mut head).unwrap();
    // Another process commits new bytes into the same tensor, in place.
    std::fs::write(&t, vec![0x77u8; BYTES]).unwrap();
    let (chunks, err) = rest(&f, FIRST);
    for c in &chunks {
        assert!(c.iter().all(|&b| b == 0x10), "old then new bytes");
    }
    assert_eq!(errno_of(&err), Some(libc::ESTALE), "{err:?}");
    // A fresh open reads the new bytes; the other tensors never changed.
    assert!(std::fs::read(&t).unwrap().iter().all(|&b| b == 0x77));
    let other = std::fs::read(m.path(&tensor_path(1))).unwrap();
    assert!(other.iter().all(|&b| b == 0x11));
}

#[test]
fn an_o_trunc_open_does_not_empty_the_file_for_others() {
    if common::fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.ptd");
    write_model(&src, 0x10);
    let m = Mount::new(&src, &[], &[]);
    let t = m.path(&tensor_path(0));
    let reader = std::fs::File::open(&t).unwrap();
    let mut first = vec![0u8; 4096];
    reader.read_exact_at(&mut first, 0).unwrap();
    // A writer truncates at open and writes part of the new content.
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&t)
        .unwrap();
    writer.write_all_at(&[0x55u8; 4096], 0).unwrap();
    // The writer asks for its file's size through its handle (`lseek(SEEK_END)` does: the
    // kernel then asks the daemon with the handle).
    let mut w = &writer;
    let _ = std::io::Seek::seek(&mut w, std::io::SeekFrom::End(0)).unwrap();
    let _ = writer.metadata().unwrap();
    // Others see the committed bytes and size meanwhile, through their open and a new one
    // (reads first: a read does not ask the daemon for the size the kernel holds).
    let mut buf = vec![0u8; 4096];
    reader
        .read_exact_at(&mut buf, (BYTES - 4096) as u64)
        .expect("the reader's file looked shorter");
    assert!(buf.iter().all(|&b| b == 0x10));
    let mut fresh = Vec::new();
    std::fs::File::open(&t)
        .unwrap()
        .read_to_end(&mut fresh)
        .unwrap();
    assert_eq!(fresh.len(), BYTES);
    assert!(fresh.iter().all(|&b| b == 0x10));
    assert_eq!(std::fs::metadata(&t).unwrap().len() as usize, BYTES);
    assert_eq!(reader.metadata().unwrap().len() as usize, BYTES);
    // The writer completes its content; the commit at close makes it everyone's.
    let block = vec![0x55u8; 1 << 20];
    let mut at = 4096usize;
    while at < BYTES {
        let n = (BYTES - at).min(block.len());
        writer.write_all_at(&block[..n], at as u64).unwrap();
        at += n;
    }
    drop(writer);
    assert!(std::fs::read(&t).unwrap().iter().all(|&b| b == 0x55));
}
