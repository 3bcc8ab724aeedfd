//! Helpers shared by the integration tests.

#![allow(dead_code)]

pub mod mount;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use ptefs::fs::{FileType, Fs};
use ptefs::tree::Ino;

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every fixture manifest (`<file>.json` beside an existing `<file>`), in `tests/fixtures`
/// and `tests/fixtures/extra`, sorted.
pub fn manifests() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [fixtures_dir(), fixtures_dir().join("extra")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") && p.with_extension("").is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

pub fn load_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The model file a manifest describes, and the `.ptd` files its `data_files` attach.
pub fn fixture_files(manifest: &Path) -> (PathBuf, Vec<PathBuf>) {
    let m = load_json(manifest);
    let dir = manifest.parent().expect("a directory");
    let data = m["data_files"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| dir.join(d.as_str().expect("data_files holds names")))
                .collect()
        })
        .unwrap_or_default();
    (manifest.with_extension(""), data)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A whole file of the tree, read through `Fs::read` in `chunk`-byte requests.
pub fn read_all(fs: &Fs, ino: Ino, chunk: u32) -> Result<Vec<u8>, ptefs::error::Error> {
    let size = fs.getattr(ino)?.size;
    let mut out = Vec::with_capacity(size as usize);
    while (out.len() as u64) < size {
        let data = fs.read(ino, out.len() as u64, chunk)?;
        if data.bytes().is_empty() {
            break;
        }
        out.extend_from_slice(data.bytes());
    }
    Ok(out)
}

/// Every path below the root, directories with a trailing `/`, with its inode, by readdir.
pub fn walk(fs: &Fs) -> Vec<(String, Ino, FileType)> {
    let mut out = Vec::new();
    let mut stack = vec![(ptefs::tree::ROOT, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let entries = fs.list(dir).expect("a listing of a directory");
        assert_eq!(entries[0].name, ".");
        assert_eq!(entries[1].name, "..");
        for ptefs::fs::DirEntry { name, attr: a } in entries.into_iter().skip(2) {
            let path = format!("{prefix}{name}");
            if a.kind == FileType::Directory {
                stack.push((a.ino, format!("{path}/")));
                out.push((format!("{path}/"), a.ino, a.kind));
            } else {
                out.push((path, a.ino, a.kind));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// True (with a message) when this machine cannot mount FUSE and the run says that is
/// expected; otherwise a missing `/dev/fuse` fails the test, so a CI machine without FUSE
/// cannot pass by skipping every real mount.
pub fn fuse_missing() -> bool {
    if Path::new("/dev/fuse").exists() {
        return false;
    }
    if std::env::var_os("PTEFS_TESTS_WITHOUT_FUSE").is_some() {
        eprintln!("skipped: /dev/fuse is missing and PTEFS_TESTS_WITHOUT_FUSE is set");
        return true;
    }
    panic!("/dev/fuse is missing: these tests mount for real (set PTEFS_TESTS_WITHOUT_FUSE=1 to skip them)");
}
