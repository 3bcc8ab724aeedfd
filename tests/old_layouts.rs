//! Older layouts still read: a 24-byte `eh00` (files before ExecuTorch 1.0), no `eh00` at
//! all (a bare flatbuffer), and the deprecated inline `constant_buffer`.

mod common;

use std::path::Path;
use std::sync::Arc;

use ptefs::format::generated::pte_fb;
use ptefs::format::writer::{pack_program, pte_program_region};
use ptefs::format::Model;
use ptefs::format::{Kind, ModelFile};
use ptefs::tree::Tree;

fn tree_of(bytes: Vec<u8>) -> Tree {
    let file = ModelFile::from_bytes(Path::new("old.pte"), bytes).unwrap();
    Tree::build(Arc::new(Model::from_files(vec![file]).unwrap()))
}

fn file_bytes(tree: &Tree, path: &str) -> Vec<u8> {
    let ino = tree.find(path).unwrap_or_else(|| panic!("{path} missing"));
    match &tree.node(ino).unwrap().content {
        ptefs::tree::Content::Range(l) => tree.model.files[l.file].read(l.range).unwrap().to_vec(),
        _ => tree.text(ino).unwrap().to_vec(),
    }
}

/// The same tensors, found the same way, as in the unmodified fixture.
fn assert_same_tensors(old: &Tree, new: &Tree) {
    for (i, n) in old.nodes().map(|(ino, n)| ((ino - 1) as usize, n)) {
        let path = old.path(i as u64 + 1);
        if path.ends_with(".bin") && path.contains("values/") {
            assert_eq!(file_bytes(old, &path), file_bytes(new, &path), "{path}");
        }
        let _ = n;
    }
}

#[test]
fn reads_a_24_byte_extended_header() {
    let orig = common::fixture_bytes("linear.pte");
    let mut old = orig.clone();
    old[12..16].copy_from_slice(&24u32.to_le_bytes());
    old[32..40].fill(0);
    let t = tree_of(old);
    let header: serde_json::Value = serde_json::from_slice(&file_bytes(&t, "header.json")).unwrap();
    assert_eq!(header["extended_header"]["length"], 24);
    assert!(header["extended_header"]["segment_data_size"].is_null());
    assert_same_tensors(&tree_of(orig), &t);
    assert!(ptefs::check::defects(&t.model).is_empty());
}

/// Rebuilds `linear.pte` the pre-2024-09 way: constants inline in `constant_buffer`, no
/// `constant_segment`, no segments, and so no `eh00`.
#[test]
fn reads_inline_constant_buffers_without_extended_header() {
    let (orig, mut program, segments) = common::unpack_pte("linear.pte");
    let cs = program.constant_segment.take().unwrap();
    let seg = segments[cs.segment_index as usize];
    let offsets = cs.offsets.unwrap();
    let mut buffers = Vec::new();
    for (k, &off) in offsets.iter().enumerate() {
        let end = offsets.get(k + 1).copied().unwrap_or(seg.len());
        let start = (seg.start() + off) as usize;
        let mut b = pte_fb::BufferT::default();
        b.storage = Some(orig[start..seg.start() as usize + end as usize].to_vec());
        buffers.push(b);
    }
    program.constant_buffer = Some(buffers);
    program.segments = Some(vec![]);
    let fb = pack_program(&program, 16);
    let (bare, base) = pte_program_region(&fb, 16, 128, 0, false);
    assert_eq!(base, 0);
    assert_eq!(&bare[4..8], b"ET12");
    assert_ne!(&bare[8..12], b"eh00");
    let t = tree_of(bare);
    let header: serde_json::Value = serde_json::from_slice(&file_bytes(&t, "header.json")).unwrap();
    assert!(header["extended_header"].is_null());
    assert_same_tensors(&tree_of(orig), &t);
    // The 1.5.1 runtime refuses this layout; check says so instead of failing silently.
    let defects = ptefs::check::defects(&t.model);
    assert!(
        defects.iter().any(|d| d.contains("constant_segment")),
        "{defects:?}"
    );
    // Inline constants are aligned as the schema's force_align asks.
    let Kind::Pte(p) = &t.model.files[0].kind else {
        panic!()
    };
    for r in p
        .inline_constants
        .iter()
        .flatten()
        .filter(|r| !r.is_empty())
    {
        assert_eq!(r.start() % 16, 0);
    }
}
