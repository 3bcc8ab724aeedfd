//! Names from model files and uploads in messages and listings (docs/commands.md#names-in-output):
//! a refusal that quotes twenty very long names stays short (each name keeps its start, its
//! end and its length), and `ptefs ls` and `ptefs apply` print names holding newlines or
//! escape sequences escaped, one entry a line.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::mount::{run, text, BIN};
use common::Copied;
use ptefs::format::range::ByteRange;
use ptefs::format::writer::{pack_program, pte_program_region};
use ptefs::format::{Kind, Model, ModelFile};
use ptefs::fs::{Fs, Options};
use ptefs::tree::Tree;

/// `linear_xnnpack.pte` with more named-data keys, each on the segment of its first key.
fn with_keys(keys: &[String]) -> Copied {
    let name = "linear_xnnpack.pte";
    let (orig, mut program, segments) = common::unpack_pte(name);
    let named = program.named_data.as_mut().unwrap();
    for k in keys {
        let mut extra = named[0].clone();
        extra.key = Some(k.clone());
        named.push(extra);
    }
    let file = ModelFile::from_bytes(Path::new(name), orig.clone()).unwrap();
    let Kind::Pte(pte) = &file.kind else {
        panic!("{name} is not a .pte")
    };
    let old_base = pte.header.segment_base_offset() as usize;
    let end = segments.iter().map(ByteRange::end).max().unwrap() as usize;
    let (mut bytes, base) = pte_program_region(
        &pack_program(&program, 16),
        16,
        128,
        (end - old_base) as u64,
        true,
    );
    bytes.resize(base as usize, 0);
    bytes.extend_from_slice(&orig[old_base..end]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let model = root.join(name);
    std::fs::write(&model, bytes).unwrap();
    Copied {
        dir,
        root,
        model,
        data: Vec::new(),
    }
}

fn open(c: &Copied) -> Fs {
    let model = Model::open_writable(&c.model, &c.data).unwrap();
    Fs::new(Tree::build(Arc::new(model)), Options { read_only: false })
}

/// The byte length of the blob of `key`.
fn blob_len(fs: &Fs, key: &str) -> usize {
    let ino = fs.tree().find(&format!("named_data/{key}.bin")).unwrap();
    fs.getattr(ino).unwrap().size as usize
}

const LONG: usize = 1 << 20;

/// Twenty keys of 1 MiB each, named in an update with another dtype: the refusal names
/// all twenty, each by its first and last 60 bytes and its length, in a few KiB, through
/// the core and through `ptefs apply`; nothing is written.
#[test]
fn a_refusal_quoting_twenty_long_names_stays_short() {
    let keys: Vec<String> = (0..20)
        .map(|i| format!("{i:02}{}end{i:02}", "k".repeat(LONG - 7)))
        .collect();
    let c = with_keys(&keys);
    let before = std::fs::read(&c.model).unwrap();
    let update = common::safetensors::build(
        &keys
            .iter()
            .map(|k| (k.as_str(), "F32", vec![1], vec![0u8; 4]))
            .collect::<Vec<_>>(),
    );
    let fs = open(&c);
    let e = common::replace(&fs, "weights.safetensors", &update).unwrap_err();
    let m = e.to_string();
    assert_eq!(e.errno(), libc::EINVAL, "{}", &m[..m.len().min(400)]);
    assert!(m.len() < 8 << 10, "the refusal is {} bytes", m.len());
    assert!(m.contains("20 tensor(s) that do not fit"), "{m}");
    for (i, key) in keys.iter().enumerate() {
        let shown = format!(
            "\"{i:02}{}\"…\"{}end{i:02}\" ({} bytes): expected U8[48], found F32[1]",
            "k".repeat(58),
            "k".repeat(55),
            key.len()
        );
        assert!(m.contains(&shown), "{m}\nlacks {shown}");
    }
    drop(fs);
    let path = c.root.join("update.safetensors");
    std::fs::write(&path, &update).unwrap();
    let out = run(Command::new(BIN).arg("apply").arg(&c.model).arg(&path));
    assert!(!out.status.success());
    assert!(
        out.stderr.len() < 8 << 10,
        "apply wrote {} bytes to stderr",
        out.stderr.len()
    );
    assert!(text(&out.stderr).contains("20 tensor(s) that do not fit"));
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

/// Keys holding a newline and an escape sequence: `ptefs ls` shows each as a JSON string,
/// one a line, and `ptefs apply` reports them the same way.
#[test]
fn ls_and_apply_escape_control_characters_in_names() {
    let keys = ["two\nlines".to_string(), "red\u{1b}[31mtext".to_string()];
    let c = with_keys(&keys);
    let out = run(Command::new(BIN).arg("ls").arg(&c.model).arg("named_data"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    assert!(!listing.contains('\u{1b}'), "{listing:?}");
    let lines: Vec<&str> = listing.lines().collect();
    for want in [
        "\"two\\nlines.bin\"",
        "\"two\\nlines.json\"",
        "\"red\\u001b[31mtext.bin\"",
        "\"red\\u001b[31mtext.json\"",
    ] {
        assert!(lines.contains(&want), "{listing}\nlacks {want}");
    }
    // Names without control characters read as they did.
    assert!(lines
        .iter()
        .any(|l| l.ends_with(".bin") && !l.starts_with('"')));
    let fs = open(&c);
    let len = blob_len(&fs, "two\nlines");
    drop(fs);
    let update = common::safetensors::build(&[
        ("two\nlines", "U8", vec![len as u64], vec![7u8; len]),
        ("red\u{1b}[31mtext", "U8", vec![len as u64], vec![9u8; len]),
    ]);
    let path = c.root.join("update.safetensors");
    std::fs::write(&path, update).unwrap();
    let out = run(Command::new(BIN).arg("apply").arg(&c.model).arg(&path));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(!report.contains('\u{1b}'), "{report:?}");
    for want in [
        "changed\t\"two\\nlines\"",
        "changed\t\"red\\u001b[31mtext\"",
    ] {
        assert!(report.lines().any(|l| l == want), "{report}\nlacks {want}");
    }
}
