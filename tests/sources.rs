//! Byte sources: a model whose bytes come from ranged reads (as a remote object's would)
//! shows exactly the tree, and exactly the bytes, that the same file mapped shows; and
//! opening it reads only its header and flatbuffer, never a segment.

use std::borrow::Cow;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ptefs::format::{Model, ModelFile};
use ptefs::fs::{FileType, Fs, Options};
use ptefs::source::ByteSource;
use ptefs::tree::Tree;

mod common;

/// A file read by ranges only, counting what was read.
struct Ranged {
    bytes: Vec<u8>,
    read: Arc<AtomicU64>,
}

impl ByteSource for Ranged {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn mapped(&self) -> Option<&[u8]> {
        None
    }

    fn read(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        let bytes = ptefs::source::slice(&self.bytes, range)?;
        self.read.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(Cow::Owned(bytes.to_vec()))
    }
}

/// The model `manifest` describes, opened twice: mapped, and through `Ranged` sources;
/// with the bytes the ranged sources read while opening.
fn both(manifest: &std::path::Path) -> (Fs, Fs, u64, u64) {
    let (model, data) = common::fixture_files(manifest);
    let mapped = Model::open(&model, &data).unwrap();
    let read = Arc::new(AtomicU64::new(0));
    let mut files = Vec::new();
    let mut program_bytes = 0;
    for p in std::iter::once(&model).chain(&data) {
        let source = Ranged {
            bytes: std::fs::read(p).unwrap(),
            read: read.clone(),
        };
        let f = ModelFile::from_source(PathBuf::from(p), Box::new(source)).unwrap();
        program_bytes += f.program_end();
        files.push(f);
    }
    let ranged = Model::from_files(files).unwrap();
    let opened = read.load(Ordering::Relaxed);
    let fs = |m| Fs::new(Tree::build(Arc::new(m)), Options { read_only: true });
    (fs(mapped), fs(ranged), opened, program_bytes)
}

#[test]
fn ranged_sources_show_the_same_tree_and_bytes_as_mapped_files() {
    let mut files = 0;
    for manifest in common::manifests() {
        let (mapped, ranged, opened, program_bytes) = both(&manifest);
        let name = manifest.display();
        // The header, then the flatbuffer (one more read when it is larger than the
        // first read): never more than the flatbuffer and one header read per file.
        let files_opened = 1 + common::fixture_files(&manifest).1.len() as u64;
        assert!(
            opened <= program_bytes + 4096 * files_opened,
            "{name}: opening read {opened} bytes, the flatbuffers are {program_bytes}"
        );
        let a = common::walk(&mapped);
        let b = common::walk(&ranged);
        let paths = |w: &[(String, u64, FileType)]| -> Vec<(String, u64)> {
            w.iter().map(|(p, i, _)| (p.clone(), *i)).collect()
        };
        assert_eq!(paths(&a), paths(&b), "{name}: the trees differ");
        for (path, ino, kind) in &a {
            if *kind != FileType::RegularFile {
                continue;
            }
            assert_eq!(
                mapped.getattr(*ino).unwrap().size,
                ranged.getattr(*ino).unwrap().size,
                "{name}: {path}"
            );
            // Odd-sized reads, so that windows start and end inside headers and tensors.
            let x = common::read_all(&mapped, *ino, 4093).unwrap();
            let y = common::read_all(&ranged, *ino, 4093).unwrap();
            assert!(x == y, "{name}: {path} reads differently");
            files += 1;
        }
    }
    assert!(files > 100, "only {files} files compared");
}
