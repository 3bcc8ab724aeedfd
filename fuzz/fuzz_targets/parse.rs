//! Any bytes: parsed as a `.pte` or `.ptd`; when they parse, the tree is built, every text
//! rendered, every file read and its xattrs listed, and `check` run, alone and with a fixture
//! of the other kind attached (so EXTERNAL tensors get resolved against fuzzed data).
//!
//! Run from `fuzz/` with the fixtures as seeds:
//! `mkdir -p corpus/parse && cp ../tests/fixtures/*.pt? ../tests/fixtures/extra/*.pt? corpus/parse/`
//! then `cargo +nightly fuzz run parse corpus/parse -- -max_total_time=600`.

#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use ptefs::format::Model;
use ptefs::format::{Kind, ModelFile};
use ptefs::fs::{FileType, Fs, Options};
use ptefs::tree::{Tree, ROOT};

const PTE: &[u8] = include_bytes!("../../tests/fixtures/linear_ext.pte");
const PTD: &[u8] = include_bytes!("../../tests/fixtures/linear_ext.ptd");

fn exercise(files: Vec<ModelFile>) {
    let Ok(model) = Model::from_files(files) else {
        return;
    };
    for d in ptefs::check::defects(&model) {
        assert!(!d.is_empty());
    }
    let fs = Fs::new(Tree::build(Arc::new(model)), Options { read_only: true });
    let mut stack = vec![ROOT];
    while let Some(dir) = stack.pop() {
        for ptefs::fs::DirEntry { name, attr } in
            fs.list(dir).expect("a directory").into_iter().skip(2)
        {
            assert_eq!(fs.lookup(dir, &name).expect("listed").ino, attr.ino);
            if attr.kind == FileType::Directory {
                stack.push(attr.ino);
                continue;
            }
            let mut offset = 0u64;
            while offset < attr.size {
                let data = fs.read(attr.ino, offset, 1 << 20).expect("readable");
                assert!(!data.bytes().is_empty());
                offset += data.bytes().len() as u64;
            }
            assert_eq!(offset, attr.size);
            if name.ends_with(".json") {
                let bytes = fs.read(attr.ino, 0, u32::MAX).expect("readable");
                assert!(bytes.bytes().ends_with(b"\n"));
                serde_json::from_slice::<serde_json::Value>(bytes.bytes()).expect("valid JSON");
            }
            for x in fs.listxattr(attr.ino).expect("listable") {
                fs.getxattr(attr.ino, &x).expect("listed xattr");
            }
        }
    }
    let _ = ptefs::commands::info(&fs, &mut std::io::sink());
}

fuzz_target!(|data: &[u8]| {
    let Ok(kind) = Kind::parse(data) else {
        return;
    };
    let own =
        |name: &str| ModelFile::from_bytes(Path::new(name), data.to_vec()).expect("parsed once");
    match kind {
        Kind::Pte(_) => {
            exercise(vec![own("fuzz.pte")]);
            let ptd = ModelFile::from_bytes(Path::new("linear_ext.ptd"), PTD.to_vec()).unwrap();
            exercise(vec![own("fuzz.pte"), ptd]);
        }
        Kind::Ptd(_) => {
            exercise(vec![own("fuzz.ptd")]);
            let pte = ModelFile::from_bytes(Path::new("linear_ext.pte"), PTE.to_vec()).unwrap();
            exercise(vec![pte, own("fuzz.ptd")]);
        }
    }
});
