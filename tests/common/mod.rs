//! Helpers shared by the integration tests: fixtures and their copies, reading the core's
//! tree, the seeded generator, and real mounts.

#![allow(dead_code)]

pub mod mount;
pub mod payloads;
pub mod safetensors;
pub mod servers;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use proptest::prelude::Rng as _;
use proptest::test_runner::{RngAlgorithm, TestRng};
use sha2::{Digest, Sha256};

use ptefs::format::generated::pte_fb;
use ptefs::format::range::ByteRange;
use ptefs::format::{Kind, Model, ModelFile, WriteTarget};
use ptefs::fs::{FileType, Fs, Options};
use ptefs::tree::{Ino, Tree};
use std::sync::Arc;

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

/// The model files of the fixtures in `tests/fixtures` itself (not `extra`), sorted.
pub fn top_fixtures() -> Vec<PathBuf> {
    let top = fixtures_dir();
    manifests()
        .into_iter()
        .filter(|m| m.parent() == Some(top.as_path()))
        .map(|m| m.with_extension(""))
        .collect()
}

/// The bytes of `tests/fixtures/<name>`.
pub fn fixture_bytes(name: &str) -> Vec<u8> {
    let path = fixtures_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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

/// A fixture `.pte` with an extended header, parsed: its bytes, its program unpacked for
/// editing, and where its segments are in the file.
pub fn unpack_pte(name: &str) -> (Vec<u8>, pte_fb::ProgramT, Vec<ByteRange>) {
    let bytes = fixture_bytes(name);
    let file = ModelFile::from_bytes(Path::new(name), bytes.clone()).unwrap();
    let Kind::Pte(pte) = &file.kind else {
        panic!("{name} is not a .pte")
    };
    let end = pte.header.program_size() as usize;
    let program = flatbuffers::root::<pte_fb::Program>(&bytes[..end])
        .unwrap()
        .unpack();
    (bytes, program, pte.segments.clone())
}

/// A model file and its `.ptd` files copied into a fresh temp dir, for tests that change or
/// mount them. `root` is the canonical path of `dir`, which the copies are in.
pub struct Copied {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub model: PathBuf,
    pub data: Vec<PathBuf>,
}

pub fn copy_files(model: &Path, data: &[PathBuf]) -> Copied {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let copy = |from: &Path| {
        let to = root.join(from.file_name().unwrap());
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
        to
    };
    Copied {
        model: copy(model),
        data: data.iter().map(|d| copy(d)).collect(),
        dir,
        root,
    }
}

/// The fixture `tests/fixtures/<name>` with the data files its manifest names, copied.
pub fn copy_fixture(name: &str) -> Copied {
    let (model, data) = fixture_files(&fixtures_dir().join(format!("{name}.json")));
    copy_files(&model, &data)
}

/// `len` bytes that vary with the position and with `seed`: new content for a file, unlike
/// the fixtures' own bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(97).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// proptest's ChaCha generator seeded with `seed`: the same values on every machine and
/// proptest version. It drives the seeded generator below and the runners of the named
/// proptest cases, so every random value of the tests comes from proptest.
pub fn seeded_rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// Random numbers for tests that are not properties (a fixed corpus, random delays): the
/// same seed gives the same numbers on every run.
pub struct Rng(TestRng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seeded_rng(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
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
    // A hostile payload's dims can make a float32 view look terabytes long; its reads fail
    // long before that, so its size is no reason to allocate.
    let mut out = Vec::with_capacity(size.min(1 << 26) as usize);
    while (out.len() as u64) < size {
        let data = fs.read(ino, out.len() as u64, chunk)?;
        if data.bytes().is_empty() {
            break;
        }
        out.extend_from_slice(data.bytes());
    }
    Ok(out)
}

/// The copied files opened through the core, writable unless `read_only`.
pub fn open(c: &Copied, read_only: bool) -> Fs {
    let model = if read_only {
        Model::open(&c.model, &c.data).unwrap()
    } else {
        Model::open_writable(&c.model, &c.data).unwrap()
    };
    Fs::new(Tree::build(Arc::new(model)), Options { read_only })
}

/// Replaces the whole content of `path` the way `cp` does: O_TRUNC, write in chunks, close.
pub fn replace(fs: &Fs, path: &str, data: &[u8]) -> Result<(), ptefs::error::Error> {
    let ino = fs.tree().find(path).unwrap_or_else(|| panic!("{path}"));
    let fh = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC)?.fh;
    let mut off = 0;
    for chunk in data.chunks(7 + data.len() / 3) {
        fs.write(fh, off, chunk)?;
        off += chunk.len() as u64;
    }
    let flushed = fs.flush(fh);
    fs.release(fh)?;
    flushed.map(|_| ())
}

/// Whether a write to `target` must give its tensor bytes of its own, because a distinct tensor
/// shares them (docs/writes.md#shared-bytes-and-identity): such a commit re-lays the file out
/// instead of writing in place.
pub fn separates(model: &Model, target: &WriteTarget) -> bool {
    use ptefs::format::sharing::{locate, Relation, SharedBytes, TensorId};
    let of = match target {
        WriteTarget::TensorBin { of, .. } | WriteTarget::TensorNpy { of, .. } => Some(*of),
        WriteTarget::PayloadConstant { of, .. } | WriteTarget::PayloadConstantNpy { of, .. } => *of,
        WriteTarget::Blob { file, named_index } => Some(TensorId::key(*file, *named_index)),
        _ => None,
    };
    let Some((id, (location, _))) = of.and_then(|id| Some((id, locate(model, id)?))) else {
        return false;
    };
    SharedBytes::of(model)
        .others(&location, id)
        .any(|(_, r)| r == Relation::Distinct)
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

/// The `/proc/self/mountinfo` line of the mount at `path`, the last if several are stacked.
pub fn mountinfo_line(path: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    table
        .lines()
        .rfind(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| p.replace("\\040", " ") == want)
        })
        .map(str::to_string)
}

/// Whether `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    mountinfo_line(path).is_some()
}

/// Whether `path` is a ptefs FUSE mount now.
pub fn mounted_as_ptefs(path: &Path) -> bool {
    mountinfo_line(path).is_some_and(|l| l.contains(" - fuse.ptefs "))
}

/// Unmounts `mnt` for a test that is done with it: `ptefs umount`, which waits for pending
/// commits, else `force_unmount`. Errors are ignored: this runs in `Drop`s.
pub fn unmount(mnt: &Path) {
    let ok = Command::new(env!("CARGO_BIN_EXE_ptefs"))
        .arg("umount")
        .arg(mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        force_unmount(mnt);
    }
}

/// Detaches `mnt` lazily without asking its daemon (which may be dead): `fusermount3`,
/// `fusermount`, else `umount -l`, whichever works first.
pub fn force_unmount(mnt: &Path) {
    for (tool, flags) in [
        ("fusermount3", &["-u", "-z"][..]),
        ("fusermount", &["-u", "-z"]),
        ("umount", &["-l"]),
    ] {
        let ok = Command::new(tool)
            .args(flags)
            .arg(mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return;
        }
    }
}

/// The extended attribute `name` of `p`, None when it has none.
pub fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: C strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// Sets the extended attribute `name` of `p`, or fails the test.
pub fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: C strings and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {name}: {}",
        std::io::Error::last_os_error()
    );
}
