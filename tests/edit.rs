//! The write path through the FUSE-free core (`fs::Fs`): same-size edits in place, size
//! changes by re-layout, rejected writes, editor saves, and random edit sequences checked
//! against a simple reference model of the expected bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ptefs::format::{Model, WriteTarget};
use ptefs::fs::{Fs, Options, RenameMode, SetAttr};
use ptefs::tree::{Content, Tree};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// A fixture copied (with its data files) into a temp dir, opened writable.
struct Copy {
    _dir: tempfile::TempDir,
    model: PathBuf,
    data: Vec<PathBuf>,
}

fn manifest(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(Path::new(FIXTURES).join(format!("{name}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn fixtures() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(FIXTURES)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pte") || n.ends_with(".ptd"))
        .collect();
    v.sort();
    v
}

fn copy_fixture(name: &str) -> Copy {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join(name);
    std::fs::copy(Path::new(FIXTURES).join(name), &model).unwrap();
    let mut data = Vec::new();
    for d in manifest(name)["data_files"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let d = d.as_str().unwrap();
        let p = dir.path().join(d);
        std::fs::copy(Path::new(FIXTURES).join(d), &p).unwrap();
        data.push(p);
    }
    Copy {
        _dir: dir,
        model,
        data,
    }
}

fn open(c: &Copy, read_only: bool) -> Fs {
    let model = if read_only {
        Model::open(&c.model, &c.data).unwrap()
    } else {
        Model::open_writable(&c.model, &c.data).unwrap()
    };
    Fs::new(Tree::build(Arc::new(model)), Options { read_only })
}

fn read_all(fs: &Fs, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let d = fs.read(ino, out.len() as u64, 1 << 20).unwrap();
        assert!(!d.bytes().is_empty());
        out.extend_from_slice(d.bytes());
    }
    out
}

/// Replaces the whole content of `path` the way `cp` does: O_TRUNC, write, close.
fn replace(fs: &Fs, path: &str, data: &[u8]) -> Result<(), ptefs::error::Error> {
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

/// `truncate(2)` by path.
fn truncate(fs: &Fs, ino: u64, size: u64) -> Result<(), ptefs::error::Error> {
    let change = SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    fs.setattr(ino, change).map(|_| ())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every writable file whose content is a plain range (tensor .bin, blobs, payloads, segments).
fn raw_writable(tree: &Tree) -> Vec<(String, ptefs::format::layout::Location, bool)> {
    let mut out = Vec::new();
    for (i, n) in tree.nodes.iter().enumerate() {
        if let (Some(w), Content::Range(loc)) = (&n.write, &n.content) {
            let resizable = matches!(
                w,
                WriteTarget::Blob { .. } | WriteTarget::DelegatePayload { .. }
            );
            out.push((tree.path(i as u64 + 1), *loc, resizable));
        }
    }
    out
}

#[test]
fn same_size_edit_of_every_writable_file_replaces_exactly_its_range() {
    for name in fixtures() {
        let c = copy_fixture(&name);
        let files: Vec<PathBuf> = std::iter::once(c.model.clone())
            .chain(c.data.clone())
            .collect();
        let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
        let fs = open(&c, false);
        let targets = raw_writable(&fs.tree());
        for (seed, (path, loc, _)) in targets.iter().enumerate() {
            let mut expected: Vec<Vec<u8>> =
                files.iter().map(|f| std::fs::read(f).unwrap()).collect();
            let new = pattern(loc.range.len() as usize, seed as u8 + 1);
            replace(&fs, path, &new).unwrap_or_else(|e| panic!("{name} {path}: {e}"));
            expected[loc.file][loc.range.as_usize()].copy_from_slice(&new);
            for (f, want) in files.iter().zip(&expected) {
                assert!(
                    std::fs::read(f).unwrap() == *want,
                    "{name} {path}: {} differs",
                    f.display()
                );
            }
            let ino = fs.tree().find(path).unwrap();
            assert_eq!(read_all(&fs, ino), new, "{name} {path}: read back");
        }
        // Put everything back and check nothing else ever moved.
        for (f, orig) in files.iter().zip(&originals) {
            assert_eq!(std::fs::read(f).unwrap().len(), orig.len());
        }
        assert!(ptefs::check::defects(&fs.tree().model).is_empty(), "{name}");
    }
}

#[test]
fn npy_edit_writes_only_the_data_part() {
    for name in fixtures() {
        let c = copy_fixture(&name);
        let fs = open(&c, false);
        let tree = fs.tree();
        let npys: Vec<_> = tree
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match &n.content {
                Content::Npy { header, location } => {
                    Some((tree.path(i as u64 + 1), header.clone(), *location))
                }
                _ => None,
            })
            .collect();
        for (path, header, loc) in npys {
            let before = std::fs::read(&c.model).ok();
            let file = if loc.file == 0 {
                c.model.clone()
            } else {
                c.data[loc.file - 1].clone()
            };
            let mut expected = std::fs::read(&file).unwrap();
            let body = pattern(loc.range.len() as usize, 77);
            let mut npy = header.clone();
            npy.extend_from_slice(&body);
            replace(&fs, &path, &npy).unwrap_or_else(|e| panic!("{name} {path}: {e}"));
            expected[loc.range.as_usize()].copy_from_slice(&body);
            assert!(std::fs::read(&file).unwrap() == expected, "{name} {path}");
            drop(before);
        }
    }
}

#[test]
fn rejected_writes_leave_files_unchanged() {
    let c = copy_fixture("linear.pte");
    let before = std::fs::read(&c.model).unwrap();
    let fs = open(&c, false);
    let e = replace(&fs, "plans/forward/values/0.bin", &[0u8; 40]).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(
        e.message()
            .contains("needs 48 bytes for FLOAT[3,4], got 40"),
        "{}",
        e.message()
    );
    let mut npy = ptefs::format::npy::header("<f8", &[3, 4]);
    npy.extend_from_slice(&[0u8; 96]);
    let e = replace(&fs, "plans/forward/values/0.npy", &npy).unwrap_err();
    assert!(e.message().contains("dtype"), "{}", e.message());
    let mut npy = ptefs::format::npy::header("<f4", &[4, 3]);
    npy.extend_from_slice(&[0u8; 48]);
    let e = replace(&fs, "plans/forward/values/0.npy", &npy).unwrap_err();
    assert!(e.message().contains("shape"), "{}", e.message());
    let e = replace(&fs, "plans/forward/values/0.npy", b"not numpy").unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e = replace(&fs, "segments/0", &[1u8; 3]).unwrap_err();
    assert!(e.message().contains("keep its size"), "{}", e.message());
    let json = fs.tree().find("plans/forward/values/0.json").unwrap();
    assert_eq!(
        fs.open(json, libc::O_WRONLY).unwrap_err().errno(),
        libc::EACCES
    );
    let values = fs.tree().find("plans/forward/values").unwrap();
    assert_eq!(fs.unlink(values, "0.bin").unwrap_err().errno(), libc::EPERM);
    assert_eq!(std::fs::read(&c.model).unwrap(), before);

    let ro = open(&c, true);
    let bin = ro.tree().find("plans/forward/values/0.bin").unwrap();
    assert_eq!(
        ro.open(bin, libc::O_WRONLY).unwrap_err().errno(),
        libc::EROFS
    );
    assert_eq!(ro.getattr(bin).unwrap().perm, 0o444);
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

#[test]
fn partial_writes_and_truncate_stage_until_close() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let ino = fs.tree().find("plans/forward/values/0.bin").unwrap();
    let before = std::fs::read(&c.model).unwrap();
    let off = fs
        .tree()
        .xattrs(ino)
        .into_iter()
        .find(|(k, _)| k == "user.ptefs.offset")
        .unwrap()
        .1
        .parse::<usize>()
        .unwrap();
    let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
    fs.write(fh, 4, &[1, 2, 3, 4]).unwrap();
    assert_eq!(
        std::fs::read(&c.model).unwrap(),
        before,
        "nothing before commit"
    );
    // The writer reads what it staged; everyone else the committed bytes.
    let staged = fs.read_with(ino, Some(fh), 4, 4, |b| b.to_vec()).unwrap();
    assert_eq!(staged, [1, 2, 3, 4]);
    assert_eq!(
        fs.read(ino, 4, 4).unwrap().bytes(),
        &before[off + 4..off + 8]
    );
    fs.fsync(fh).unwrap();
    let mut want = before.clone();
    want[off + 4..off + 8].copy_from_slice(&[1, 2, 3, 4]);
    assert_eq!(std::fs::read(&c.model).unwrap(), want);
    // A second writer in turn continues from the committed bytes.
    fs.write(fh, 0, &[9]).unwrap();
    fs.release(fh).unwrap();
    want[off] = 9;
    assert_eq!(std::fs::read(&c.model).unwrap(), want);
    // truncate to 0 then back to size by path: all zeros.
    let e = truncate(&fs, ino, 0).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(std::fs::read(&c.model).unwrap(), want);
}

#[test]
fn editor_save_through_scratch_file_commits_on_rename() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let tree = fs.tree();
    let values = tree.find("plans/forward/values").unwrap();
    let (attr, opened) = fs.create(values, ".0.bin.swp", libc::O_WRONLY).unwrap();
    let fh = opened.fh;
    assert_eq!(attr.size, 0);
    let new = pattern(48, 5);
    fs.write(fh, 0, &new).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh).unwrap();
    let names: Vec<String> = fs
        .list(values)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&".0.bin.swp".to_string()));
    let before = std::fs::read(&c.model).unwrap();
    assert!(fs.lookup(values, ".0.bin.swp").is_ok());
    fs.rename(values, ".0.bin.swp", values, "0.bin", RenameMode::Replace)
        .unwrap();
    assert!(fs.lookup(values, ".0.bin.swp").is_err());
    let after = std::fs::read(&c.model).unwrap();
    assert_ne!(before, after);
    let ino = fs.tree().find("plans/forward/values/0.bin").unwrap();
    assert_eq!(read_all(&fs, ino), new);
    // Whoever still holds the scratch inode (the kernel, for the new name) holds the file.
    assert_eq!(fs.canonical_ino(attr.ino), ino);
    assert_eq!(fs.getattr(attr.ino).unwrap().size, 48);
    assert_eq!(fs.read(attr.ino, 0, 48).unwrap().bytes(), &new[..]);
    // Scratch files can be deleted and never reach the model.
    let fh = fs.create(values, "junk", libc::O_WRONLY).unwrap().1.fh;
    fs.write(fh, 0, b"junk").unwrap();
    fs.release(fh).unwrap();
    fs.unlink(values, "junk").unwrap();
    assert_eq!(std::fs::read(&c.model).unwrap(), after);
    // Tree files cannot be renamed away.
    assert_eq!(
        fs.rename(values, "0.bin", values, "x.bin", RenameMode::Replace)
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
}

/// Segments of a parsed file, as (absolute start, bytes).
fn segments(path: &Path) -> Vec<(u64, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let m = ptefs::format::ModelFile::from_bytes(path, bytes.clone()).unwrap();
    let ranges = match &m.kind {
        ptefs::format::Kind::Pte(p) => p.segments.clone(),
        ptefs::format::Kind::Ptd(p) => p.segments.clone(),
    };
    ranges
        .iter()
        .map(|r| (r.start(), bytes[r.as_usize()].to_vec()))
        .collect()
}

#[test]
fn size_changes_relayout_and_keep_other_segments() {
    let mut resized = 0;
    for name in fixtures() {
        let c0 = copy_fixture(&name);
        let fs0 = open(&c0, false);
        let resizable: Vec<_> = raw_writable(&fs0.tree())
            .into_iter()
            .filter(|t| t.2)
            .collect();
        drop(fs0);
        for (k, (path, loc, _)) in resizable.into_iter().enumerate() {
            for grow in [-5i64, 0, 37, 300] {
                let c = copy_fixture(&name);
                let fs = open(&c, false);
                let file = if loc.file == 0 {
                    c.model.clone()
                } else {
                    c.data[loc.file - 1].clone()
                };
                let before = segments(&file);
                let table_json = |fs: &Fs| -> serde_json::Value {
                    let t = fs.tree();
                    let prefix = t.names.file_prefix(loc.file);
                    let leaf = if file.extension().is_some_and(|e| e == "ptd") {
                        "flat_tensor.json"
                    } else {
                        "program.json"
                    };
                    let ino = t.find(&format!("{prefix}{leaf}")).unwrap();
                    let mut v: serde_json::Value =
                        serde_json::from_slice(&read_all(fs, ino)).unwrap();
                    v.as_object_mut().unwrap().remove("segments");
                    v
                };
                let table_before = table_json(&fs);
                let mode_before = std::fs::metadata(&file).unwrap();
                let new_len = (loc.range.len() as i64 + grow).max(0) as usize;
                let new = pattern(new_len, k as u8 + 3);
                replace(&fs, &path, &new).unwrap_or_else(|e| panic!("{name} {path} {grow}: {e}"));
                let after = segments(&file);
                assert_eq!(before.len(), after.len(), "{name} {path}");
                let changed: Vec<usize> = (0..before.len())
                    .filter(|&i| before[i].1 != after[i].1)
                    .collect();
                assert!(
                    changed.len() <= 1,
                    "{name} {path}: segments {changed:?} changed"
                );
                let meta = std::fs::metadata(&file).unwrap();
                use std::os::unix::fs::MetadataExt;
                assert_eq!(meta.mode(), mode_before.mode());
                // The fixtures were exported with ExecuTorch's default segment alignment.
                let base_align = 128;
                for (i, (start, data)) in after.iter().enumerate() {
                    if !data.is_empty() {
                        assert_eq!(
                            start % base_align,
                            0,
                            "{name} {path}: segment {i} at {start}"
                        );
                    }
                }
                let ino = fs.tree().find(&path).unwrap();
                assert_eq!(read_all(&fs, ino), new, "{name} {path}");
                if !path.contains("delegates") || grow == 0 {
                    assert_eq!(
                        table_json(&fs),
                        table_before,
                        "{name} {path}: only segments may change"
                    );
                }
                // The new file reopens from disk with the same tree and no defects.
                let reopened = Model::open(&c.model, &c.data).unwrap();
                assert!(
                    ptefs::check::defects(&reopened).is_empty(),
                    "{name} {path}: {:?}",
                    ptefs::check::defects(&reopened)
                );
                let t = Tree::build(Arc::new(reopened));
                assert_eq!(t.nodes.len(), fs.tree().nodes.len());
                assert!(ptefs::edit::relayout::leftovers(&file).is_empty());
                resized += 1;
            }
        }
    }
    assert!(resized >= 8, "only {resized} resizes exercised");
}

/// A tiny deterministic generator, so failures replay from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Each file that shows mapped bytes: its path, where its data starts in its content
/// (after an .npy header), and the range it shows.
fn mapped_files(tree: &Tree) -> Vec<(String, usize, ptefs::format::layout::Location)> {
    tree.nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match &n.content {
            Content::Range(l) => Some((tree.path(i as u64 + 1), 0, *l)),
            Content::Npy { header, location } => {
                Some((tree.path(i as u64 + 1), header.len(), *location))
            }
            _ => None,
        })
        .collect()
}

fn overlap(
    a: &ptefs::format::layout::Location, b: &ptefs::format::layout::Location,
) -> Option<(u64, u64)> {
    if a.file != b.file {
        return None;
    }
    let start = a.range.start().max(b.range.start());
    let end = a.range.end().min(b.range.end());
    (start < end).then_some((start, end))
}

/// Random sequences of writes, truncates, scratch renames and remounts, checked after every
/// step against a reference model of each file's expected bytes.
#[test]
fn random_edit_sequences_match_reference_model() {
    for (name, seed) in [
        ("linear_xnnpack.pte", 0x9e37_79b9_7f4a_7c15u64),
        ("linear_ext.pte", 0x1234_5678_9abc_def1),
        ("counter.pte", 0xdead_beef_cafe_f00d),
    ] {
        let c = copy_fixture(name);
        let mut fs = open(&c, false);
        let mut rng = Rng(seed);
        let mut expected: std::collections::HashMap<String, Vec<u8>> = mapped_files(&fs.tree())
            .into_iter()
            .map(|(p, _, _)| {
                let ino = fs.tree().find(&p).unwrap();
                (p, read_all(&fs, ino))
            })
            .collect();
        for step in 0..250 {
            let tree = fs.tree();
            let files = mapped_files(&tree);
            let writable: Vec<_> = files
                .iter()
                .filter(|(p, _, _)| tree.node(tree.find(p).unwrap()).unwrap().write.is_some())
                .cloned()
                .collect();
            let (path, hdr, loc) = writable[rng.below(writable.len() as u64) as usize].clone();
            let ino = tree.find(&path).unwrap();
            let resizable = matches!(
                tree.node(ino).unwrap().write,
                Some(WriteTarget::Blob { .. } | WriteTarget::DelegatePayload { .. })
            );
            let old = expected[&path].clone();
            let op = rng.below(5);
            // The content the file should have if the commit is accepted.
            let mut proposed = old.clone();
            let result = match op {
                0 | 1 => {
                    // Patch some bytes through an O_RDWR handle (sometimes past the end).
                    let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
                    // An .npy's header stays intact; its data part is what is edited.
                    let off = hdr as u64 + rng.below((old.len() - hdr) as u64 + 2);
                    let len = 1 + rng.below(8) as usize;
                    let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    let end = off as usize + len;
                    if proposed.len() < end {
                        proposed.resize(end, 0);
                    }
                    proposed[off as usize..end].copy_from_slice(&data);
                    match fs.write(fh, off, &data) {
                        // Past what the file can ever hold: refused at the write.
                        Err(e) => {
                            assert_eq!(e.errno(), libc::EFBIG, "{e}");
                            fs.release(fh).unwrap();
                            Err(e)
                        }
                        Ok(_) => {
                            let r = fs.flush(fh).map(|_| ());
                            // The last close does not try refused content again.
                            fs.release(fh).unwrap();
                            r
                        }
                    }
                }
                2 => {
                    let size = if rng.below(2) == 0 {
                        old.len() as u64
                    } else {
                        rng.below(old.len() as u64 * 2 + 3)
                    };
                    proposed.resize(size as usize, 0);
                    truncate(&fs, ino, size).map(|_| ())
                }
                3 => {
                    let len = if rng.below(3) == 0 {
                        rng.below(old.len() as u64 + 50) as usize
                    } else {
                        old.len()
                    };
                    let mut data = pattern(len, rng.next() as u8);
                    if hdr > 0 && len >= hdr {
                        data[..hdr].copy_from_slice(&old[..hdr]);
                    }
                    proposed = data.clone();
                    replace(&fs, &path, &data)
                }
                _ => {
                    let parent = tree.node(ino).unwrap().parent;
                    let fh = fs
                        .create(parent, &format!(".scratch{step}"), libc::O_WRONLY)
                        .unwrap()
                        .1
                        .fh;
                    let data = pattern(old.len(), rng.next() as u8);
                    let mut data = data;
                    if hdr > 0 {
                        data[..hdr].copy_from_slice(&old[..hdr]);
                    }
                    fs.write(fh, 0, &data).unwrap();
                    fs.release(fh).unwrap();
                    proposed = data;
                    let leaf = path.rsplit('/').next().unwrap();
                    let r = fs
                        .rename(
                            parent,
                            &format!(".scratch{step}"),
                            parent,
                            leaf,
                            RenameMode::Replace,
                        )
                        .map(|_| ());
                    if r.is_err() {
                        fs.unlink(parent, &format!(".scratch{step}")).unwrap();
                    }
                    r
                }
            };
            let same_size = proposed.len() == old.len();
            let should_accept = same_size || resizable;
            match &result {
                Ok(()) => assert!(
                    should_accept,
                    "seed {seed:#x} step {step}: {path} accepted a size change"
                ),
                Err(e) => assert!(
                    !should_accept,
                    "seed {seed:#x} step {step}: {path} op {op}: {e}"
                ),
            }
            if result.is_ok() {
                if same_size {
                    // Patch every file whose range overlaps, aliases included.
                    let data = &proposed[hdr..];
                    for (q, qhdr, qloc) in &files {
                        if let Some((s, e)) = overlap(&loc, qloc) {
                            let src = &data[(s - loc.range.start()) as usize
                                ..(e - loc.range.start()) as usize];
                            let dst = expected.get_mut(q).unwrap();
                            let at = qhdr + (s - qloc.range.start()) as usize;
                            dst[at..at + src.len()].copy_from_slice(src);
                        }
                    }
                } else {
                    for (q, _, qloc) in &files {
                        if qloc == &loc {
                            expected.insert(q.clone(), proposed.clone());
                        }
                    }
                }
            }
            if rng.below(20) == 0 {
                drop(fs);
                fs = open(&c, false);
            }
            let tree = fs.tree();
            for (q, _, _) in mapped_files(&tree) {
                let got = read_all(&fs, tree.find(&q).unwrap());
                assert!(
                    got == expected[&q],
                    "seed {seed:#x} step {step} op {op} on {path}: {q} differs"
                );
            }
        }
        assert!(ptefs::check::defects(&fs.tree().model).is_empty());
    }
}

#[test]
fn a_refused_flush_keeps_the_handle_usable() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let before = std::fs::read(&c.model).unwrap();
    let ino = fs.tree().find("plans/forward/values/0.bin").unwrap();
    let fh = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap().fh;
    fs.write(fh, 0, &pattern(40, 1)).unwrap();
    let refused = fs.flush(fh).unwrap_err();
    assert_eq!(refused.errno(), libc::EINVAL);
    assert!(refused.message().contains("48"), "{}", refused.message());
    // fsync of content that is not a valid whole yet writes nothing and succeeds.
    fs.fsync(fh).unwrap();
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
    // The staged bytes were kept: the rest of the tensor completes them.
    fs.write(fh, 40, &pattern(8, 2)).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh).unwrap();
    let mut want = pattern(40, 1);
    want.extend(pattern(8, 2));
    assert_eq!(read_all(&fs, ino), want);
    // An empty write fails at close, and at the last close too; nothing changes.
    let on_disk = std::fs::read(&c.model).unwrap();
    let fh = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap().fh;
    assert_eq!(fs.flush(fh).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(fs.flush(fh).unwrap_err().errno(), libc::EINVAL);
    fs.release(fh).unwrap();
    assert_eq!(std::fs::read(&c.model).unwrap(), on_disk);
}

#[test]
fn each_handle_stages_and_commits_its_own_bytes() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let before = std::fs::read(&c.model).unwrap();
    let ino = fs.tree().find("plans/forward/values/0.bin").unwrap();
    // A shell's `cmd > file`: open with O_TRUNC, close a duplicate before anything is
    // written (refused: nothing valid yet), then write through the other descriptor.
    let fh = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap().fh;
    assert_eq!(fs.flush(fh).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
    fs.write(fh, 0, &pattern(48, 4)).unwrap();
    fs.flush(fh).unwrap();
    assert_ne!(std::fs::read(&c.model).unwrap(), before);
    fs.release(fh).unwrap();
    assert_eq!(read_all(&fs, ino), pattern(48, 4));
    // Another handle neither sees nor commits a writer's staged bytes.
    let writer = fs.open(ino, libc::O_RDWR).unwrap().fh;
    let other = fs.open(ino, libc::O_RDWR).unwrap().fh;
    fs.write(writer, 0, &[7]).unwrap();
    assert_eq!(
        read_all(&fs, ino),
        pattern(48, 4),
        "readers see committed bytes"
    );
    let on_disk = std::fs::read(&c.model).unwrap();
    fs.fsync(other).unwrap();
    fs.flush(other).unwrap();
    assert_eq!(std::fs::read(&c.model).unwrap(), on_disk);
    // A refused writer does not disturb another's good commit.
    let bad = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap().fh;
    fs.write(bad, 0, &[1; 40]).unwrap();
    assert!(fs.flush(bad).is_err());
    fs.fsync(writer).unwrap();
    let mut want = pattern(48, 4);
    want[0] = 7;
    assert_eq!(read_all(&fs, ino), want);
    fs.release(bad).unwrap();
    fs.release(writer).unwrap();
    fs.release(other).unwrap();
    assert_eq!(read_all(&fs, ino), want);
}

#[test]
fn sizes_a_file_can_never_have_are_refused_at_the_request() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let before = std::fs::read(&c.model).unwrap();
    let ino = fs.tree().find("plans/forward/values/0.bin").unwrap();
    let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
    assert_eq!(
        fs.write(fh, 1 << 40, b"x").unwrap_err().errno(),
        libc::EFBIG
    );
    assert_eq!(fs.write(fh, 48, b"x").unwrap_err().errno(), libc::EFBIG);
    let grow = SetAttr {
        size: Some(1 << 40),
        fh: Some(fh),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(ino, grow).unwrap_err().errno(), libc::EFBIG);
    fs.release(fh).unwrap();
    assert_eq!(
        truncate(&fs, ino, 1 << 40).unwrap_err().errno(),
        libc::EFBIG
    );
    // A scratch file has a documented limit too.
    let values = fs.tree().find("plans/forward/values").unwrap();
    let s = fs.create(values, "big", libc::O_WRONLY).unwrap().1.fh;
    assert_eq!(fs.write(s, 1 << 40, b"x").unwrap_err().errno(), libc::EFBIG);
    fs.release(s).unwrap();
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

#[test]
fn mode_and_owner_cannot_change() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let ino = fs.tree().find("plans/forward/values/0.bin").unwrap();
    let a = fs.getattr(ino).unwrap();
    let chmod = |mode| SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    // Setting what is already there is fine (cp -p, rsync).
    fs.setattr(ino, chmod(u32::from(a.perm))).unwrap();
    assert_eq!(
        fs.setattr(ino, chmod(0o600)).unwrap_err().errno(),
        libc::EPERM
    );
    let chown = SetAttr {
        uid: Some(a.uid + 1),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(ino, chown).unwrap_err().errno(), libc::EPERM);
    let ro = open(&c, true);
    assert_eq!(
        ro.setattr(ino, chmod(0o600)).unwrap_err().errno(),
        libc::EROFS
    );
}
