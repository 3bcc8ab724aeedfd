//! Model files truncated on disk while open: EIO, never SIGBUS.

use std::path::PathBuf;

use crate::cases::fixtures;
use crate::common::{fixture_files, manifests, read_all, walk};
use crate::mutate::{has_eh00, is_ptd, program_of, rebuild_pte, regions};
use ptefs::fs::FileType;

/// A model file truncated on disk after opening: reads of bytes past the new end fail with
/// EIO; the process survives (no SIGBUS).
#[test]
fn truncation_while_open_gives_eio() {
    let mut tried = 0;
    for m in manifests() {
        let (file, data) = fixture_files(&m);
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join(file.file_name().unwrap());
        std::fs::copy(&file, &copy).unwrap();
        let fs = ptefs::commands::open_fs(&copy, &data).unwrap();
        let tree = fs.tree();
        let size = std::fs::metadata(&copy).unwrap().len();
        // Files whose bytes are in the model file, sorted by where they end.
        let mut ranged: Vec<(String, u64, u64)> = walk(&fs)
            .into_iter()
            .filter(|(_, _, k)| *k == FileType::RegularFile)
            .filter_map(|(path, ino, _)| match &tree.node(ino)?.content {
                ptefs::tree::Content::Range(l) | ptefs::tree::Content::Npy { location: l, .. }
                    if l.file == 0 && !l.range.is_empty() =>
                {
                    Some((path, ino, l.range.start()))
                }
                _ => None,
            })
            .collect();
        if ranged.is_empty() {
            continue;
        }
        ranged.sort_by_key(|r| r.2);
        let cut = ranged[0].2;
        let before: Vec<Vec<u8>> = ranged
            .iter()
            .map(|(_, ino, _)| read_all(&fs, *ino, 1 << 20).unwrap())
            .collect();
        assert!(before.iter().all(|b| !b.is_empty()));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_len(cut)
            .unwrap();
        assert!(cut < size);
        for (path, ino, _) in &ranged {
            let attr_size = fs.getattr(*ino).unwrap().size;
            let r = fs.read(*ino, 0, attr_size as u32);
            match r {
                Err(e) => {
                    assert_eq!(e.errno(), libc::EIO, "{}: {path}: {e}", file.display());
                    assert!(!e.message().is_empty());
                }
                // A .npy's first read may be only its generated header.
                Ok(d) if path.ends_with(".npy") && d.bytes().len() < attr_size as usize => {}
                Ok(d) => panic!(
                    "{}: {path}: read {} bytes after truncation",
                    file.display(),
                    d.bytes().len()
                ),
            }
            // Reading the data part of a .npy at its offset fails too.
            if path.ends_with(".npy") {
                let e = fs.read(*ino, attr_size - 1, 1).err().map(|e| e.errno());
                assert_eq!(e, Some(libc::EIO), "{path}");
            }
        }
        // Text files are generated from the parsed tables and stay readable.
        let header = tree.find("header.json").unwrap();
        assert!(!read_all(&fs, header, 1 << 20).unwrap().is_empty());
        // `cat` of a truncated tensor fails with a message, not a crash.
        let mut out = Vec::new();
        let e = ptefs::commands::cat(&fs, &ranged[0].0, &mut out).unwrap_err();
        assert!(!e.message().is_empty());
        tried += 1;
    }
    assert!(tried > 0);
}

/// The same for a file far larger than a page, cut in the middle of a 4 MiB segment, with
/// every page of the mapping touched after the cut.
#[test]
fn truncation_while_open_of_a_large_segment_gives_eio() {
    let f = fixtures()
        .into_iter()
        .find(|f| !is_ptd(&f.bytes) && has_eh00(&f.bytes) && f.data.is_empty())
        .unwrap();
    // Grow the last segment to 4 MiB.
    let mut program = program_of(&f.bytes);
    let segs = program.segments.as_mut().unwrap();
    let last = segs.last_mut().unwrap();
    let old_end = (last.offset + last.size) as usize;
    last.size += 4 << 20;
    let mut b = rebuild_pte(&f.bytes, &program);
    let new_base = regions(&b).1;
    b.truncate(new_base + old_end);
    b.resize(new_base + old_end + (4 << 20), 0x5a);
    let sd = (b.len() - new_base) as u64;
    b[32..40].copy_from_slice(&sd.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.pte");
    std::fs::write(&path, &b).unwrap();
    let fs = ptefs::commands::open_fs(&path, &[] as &[PathBuf]).unwrap();
    let tree = fs.tree();
    let n = tree.children(tree.find("segments").unwrap()).unwrap().len();
    let seg = tree.find(&format!("segments/{}", n - 1)).unwrap();
    let size = fs.getattr(seg).unwrap().size;
    assert!(size > 4 << 20);
    assert_eq!(fs.read(seg, 0, 1 << 20).unwrap().bytes().len(), 1 << 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(b.len() as u64 - (3 << 20))
        .unwrap();
    let mut off = 0;
    while off < size {
        let r = fs.read(seg, off, 1 << 16);
        if let Err(e) = &r {
            assert_eq!(e.errno(), libc::EIO);
        }
        off += 1 << 16;
    }
    assert_eq!(
        fs.read(seg, size - 1, 1).err().map(|e| e.errno()),
        Some(libc::EIO)
    );
    // Touch the lost pages directly, as a racing copy would: survived, then reported.
    let bytes = tree.model.files[0].mapped().unwrap();
    let mut sum = 0u64;
    for i in (0..bytes.len()).step_by(4096) {
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(&bytes[i]) } as u64);
    }
    assert!(tree.model.files[0].poisoned(), "sum {sum}");
    assert_eq!(
        fs.read(seg, 0, 10).err().map(|e| e.errno()),
        Some(libc::EIO)
    );
}
