//! The pictures of every fixture, checked with real renderers (docs/tree.md#pictures):
//! Graphviz parses every `graph.dot` without a warning, `rsvg-convert` renders every SVG to a
//! PNG that is not blank, and every histogram's counts are `numpy.histogram`'s of the same
//! values with the same edges (`tests/pictures_check.py` does the checking).
//!
//! Needs `dot` (Debian `graphviz`), `rsvg-convert` (`librsvg2-bin`) and a `python3` with
//! NumPy; `.ci/run` installs them, and the test fails without them.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{copy_fixture, fixture_files, manifests, open, read_all, replace, walk};
use ptefs::fs::FileType;
use ptefs::picture::hist::HIST_SVG_LEN;
use ptefs::tree::{Content, TextKind};

/// A `python3` with NumPy.
fn python() -> &'static str {
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .args(["-c", "import numpy"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect("a python3 with NumPy (.ci/run installs one)")
}

#[test]
fn every_picture_renders_and_every_histogram_is_numpys() {
    let out = tempfile::tempdir().unwrap();
    let mut files = 0;
    for manifest in manifests() {
        let (file, data) = fixture_files(&manifest);
        let fs = ptefs::commands::open_fs(&file, &data).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let dir = out.path().join(&name);
        let paths = walk(&fs);
        for (path, ino, kind) in &paths {
            let picture = path.ends_with(".dot") || path.ends_with(".svg");
            if kind != &FileType::RegularFile || !picture {
                continue;
            }
            let dest = dir.join(path);
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            let bytes =
                read_all(&fs, *ino, 1 << 20).unwrap_or_else(|e| panic!("{name}/{path}: {e}"));
            std::fs::write(&dest, bytes).unwrap();
            files += 1;
            // The values a histogram shows, for NumPy.
            if let Some(base) = path.strip_suffix(".hist.svg") {
                for ext in [".f32.npy", ".npy"] {
                    let values = format!("{base}{ext}");
                    if let Some((_, v, _)) = paths.iter().find(|(p, _, _)| *p == values) {
                        std::fs::write(dir.join(&values), read_all(&fs, *v, 1 << 20).unwrap())
                            .unwrap();
                        break;
                    }
                }
            }
        }
    }
    assert!(files > 100, "only {files} pictures");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pictures_check.py");
    let run = Command::new(python())
        .arg(&script)
        .arg(out.path())
        .arg(HIST_SVG_LEN.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run tests/pictures_check.py");
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// `stat` of a histogram reads no value: its size is fixed, and listing a directory of
/// them renders nothing.
#[test]
fn histogram_sizes_are_known_without_reading_values() {
    for manifest in manifests() {
        let (file, data) = fixture_files(&manifest);
        let fs = ptefs::commands::open_fs(&file, &data).unwrap();
        let tree = fs.tree();
        let mut hists = 0;
        for (path, ino, _) in walk(&fs) {
            if path.ends_with(".hist.svg") {
                assert_eq!(fs.getattr(ino).unwrap().size, HIST_SVG_LEN as u64, "{path}");
                hists += 1;
            }
        }
        // walk() lists with attributes: every size was given, no histogram was rendered.
        for (i, node) in tree.nodes().map(|(ino, n)| ((ino - 1) as usize, n)) {
            if let Content::Text {
                kind: TextKind::Hist(_),
                ..
            } = node.content
            {
                assert!(tree.text_cache().get(i as u64 + 1).is_none());
            }
        }
        let _ = hists;
    }
}

/// A histogram follows its tensor: after an in-place write of new values, it shows them.
#[test]
fn a_histogram_shows_values_written_in_place() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let path = walk(&fs)
        .into_iter()
        .map(|(p, _, _)| p)
        .find(|p| p.ends_with(".hist.svg") && p.starts_with("plans/"))
        .expect("a plan tensor with a histogram");
    let read = |fs: &ptefs::fs::Fs| {
        let ino = fs.tree().find(&path).unwrap();
        String::from_utf8(read_all(fs, ino, 1 << 20).unwrap()).unwrap()
    };
    let before = read(&fs);
    let bin = path.replace(".hist.svg", ".bin");
    let ino = fs.tree().find(&bin).unwrap();
    let n = fs.getattr(ino).unwrap().size as usize;
    // Every element becomes 2.0 (a FLOAT tensor): one bin holds them all.
    let twos: Vec<u8> = std::iter::repeat_n(2.0f32.to_le_bytes(), n / 4)
        .flatten()
        .collect();
    replace(&fs, &bin, &twos).unwrap();
    let after = read(&fs);
    assert_ne!(before, after);
    assert_eq!(after.len(), HIST_SVG_LEN);
    assert!(
        after.contains("\"edges\": [1.5e0,"),
        "{}",
        &after[after.find("<metadata").unwrap()..]
    );
    assert!(after.contains(&format!("\"finite\": {}", n / 4)));
}
