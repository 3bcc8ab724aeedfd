//! The corpus through the core in memory, from disk, and through the binary's commands.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cases::corpus;
use crate::common::{read_all, walk};
use ptefs::format::Model;
use ptefs::format::ModelFile;
use ptefs::fs::{FileType, Fs, Options};
use ptefs::tree::Tree;

#[derive(Debug)]
pub enum Outcome {
    Refused(String),
    /// Opened; how many defects `check` found.
    Opened(usize),
}

/// Everything a user can do with an opened file, on files held in memory.
pub fn exercise(files: &[(PathBuf, Vec<u8>)]) -> Outcome {
    let mut parsed = Vec::new();
    for (path, bytes) in files {
        match ModelFile::from_bytes(path, bytes.clone()) {
            Ok(f) => parsed.push(f),
            Err(e) => return Outcome::Refused(e.message().to_string()),
        }
    }
    let model = match Model::from_files(parsed) {
        Ok(m) => m,
        Err(e) => return Outcome::Refused(e.message().to_string()),
    };
    let tree = Tree::build(Arc::new(model));
    Outcome::Opened(use_tree(tree))
}

pub fn use_tree(tree: Tree) -> usize {
    let defects = ptefs::check::defects(&tree.model);
    for d in &defects {
        assert!(!d.trim().is_empty(), "an empty defect line");
    }
    // Every defect has a known kind, and a path only where the tree shows that part.
    let files: Vec<String> = tree
        .model
        .files
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    for d in ptefs::check::found(&tree.model) {
        assert!(ptefs::check::KINDS.contains(&d.kind), "{d:?}");
        if let Some(p) = &d.path {
            assert!(
                tree.find(p).is_some(),
                "{p}: not in the tree ({})",
                d.message
            );
        }
        if let Some(f) = &d.file {
            assert!(
                files.contains(f),
                "{f}: not a file of the model ({})",
                d.message
            );
        }
    }
    // Where the bytes go: every byte of every file counted once.
    if let Ok(sizes) = ptefs::sizes::Sizes::of(&tree.catalog) {
        for (f, file) in sizes.files.iter().zip(&tree.model.files) {
            assert_eq!(f.bytes.total(), file.len(), "{}", f.name);
            for seg in &f.segments {
                assert_eq!(
                    seg.bytes.total(),
                    seg.range.len(),
                    "{} segment {}",
                    f.name,
                    seg.index
                );
            }
        }
        let _ = (sizes.text(), sizes.json_text());
    }
    let fs = Fs::new(tree, Options { read_only: true });
    for (path, ino, kind) in walk(&fs) {
        if kind == FileType::Directory {
            continue;
        }
        let bytes = match read_all(&fs, ino, 1 << 20) {
            Ok(b) => b,
            // A float32 view whose constant's bytes no longer fit its datatype (which check
            // reports) cannot be dequantized, nor can its histogram be drawn.
            Err(e)
                if (path.ends_with(".f32.npy") || path.ends_with(".hist.svg"))
                    && e.errno() == libc::EIO =>
            {
                assert!(!defects.is_empty(), "{path}: {e}, and check found nothing");
                continue;
            }
            Err(e) => panic!("{path}: {e}"),
        };
        assert_eq!(bytes.len() as u64, fs.getattr(ino).unwrap().size, "{path}");
        if path.ends_with(".json") {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .unwrap_or_else(|e| panic!("{path}: not JSON: {e}"));
        }
        // A read straddling the .npy header and the data.
        let _ = fs.read(ino, 60, 100).unwrap();
        for name in fs.listxattr(ino).unwrap() {
            fs.getxattr(ino, &name).unwrap();
        }
    }
    let mut out = Vec::new();
    if let Err(e) = ptefs::commands::info(&fs, &mut out) {
        assert!(!e.message().is_empty());
    }
    ptefs::commands::ls(&fs, "", true, true, &mut Vec::new()).unwrap();
    defects.len()
}

pub fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

#[test]
pub fn corrupted_files_never_panic_and_refusals_name_the_problem() {
    let start = Instant::now();
    let cases = corpus();
    let mut failures = Vec::new();
    let (mut refused, mut opened) = (0, 0);
    let mut slowest = (Duration::ZERO, String::new());
    let verbose = std::env::var_os("PTEFS_CORRUPT_VERBOSE").is_some();
    for case in &cases {
        let t = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| exercise(&case.files)));
        let took = t.elapsed();
        if verbose {
            eprintln!("{:>8} us  {}", took.as_micros(), case.name);
        }
        if took > slowest.0 {
            slowest = (took, case.name.clone());
        }
        match r {
            Err(e) => failures.push(format!("{}: PANIC: {}", case.name, panic_text(&*e))),
            Ok(Outcome::Refused(msg)) => {
                refused += 1;
                if verbose {
                    eprintln!("    refused: {msg}");
                }
                if msg.trim().is_empty() {
                    failures.push(format!("{}: refused with an empty message", case.name));
                }
                if let Some(words) = case.must_refuse {
                    if !words.iter().any(|w| msg.contains(w)) {
                        failures.push(format!(
                            "{}: refusal {msg:?} names none of {words:?}",
                            case.name
                        ));
                    }
                }
            }
            Ok(Outcome::Opened(defects)) => {
                opened += 1;
                if case.must_flag && defects == 0 {
                    failures.push(format!("{}: opened, and check found no defect", case.name));
                }
                if verbose {
                    eprintln!("    opened: {defects} defects");
                }
                if case.must_refuse.is_some() {
                    failures.push(format!("{}: accepted, but must be refused", case.name));
                }
            }
        }
    }
    eprintln!(
        "{} cases ({refused} refused, {opened} opened) in {:?}; slowest {:?}: {}",
        cases.len(),
        start.elapsed(),
        slowest.0,
        slowest.1
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        slowest.0 < Duration::from_secs(5),
        "a case took {:?}: {}",
        slowest.0,
        slowest.1
    );
}

/// The same corruption read from disk: the refusal starts with the file's path.
#[test]
pub fn refusals_from_disk_start_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let cases = corpus();
    let mut failures = Vec::new();
    for (n, case) in cases.iter().enumerate().filter(|(n, _)| n % 23 == 0) {
        let paths = case.write_to(dir.path(), &format!("{n}-"));
        let r = catch_unwind(|| match Model::open(&paths[0], &paths[1..]) {
            Ok(m) => {
                use_tree(Tree::build(Arc::new(m)));
                None
            }
            Err(e) => Some(e.message().to_string()),
        });
        match r {
            Err(e) => failures.push(format!("{}: PANIC: {}", case.name, panic_text(&*e))),
            Ok(Some(msg)) => {
                if !paths
                    .iter()
                    .any(|p| msg.starts_with(&p.display().to_string()))
                {
                    failures.push(format!(
                        "{}: {msg:?} does not start with the path",
                        case.name
                    ));
                }
            }
            Ok(None) => {}
        }
        let defects = ptefs::commands::check(&paths[0], &paths[1..]);
        if defects.iter().any(|d| d.trim().is_empty()) {
            failures.push(format!("{}: an empty defect", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The binary on a sample of the corpus: exit status 0 or 1 (never a signal), and a message
/// on stderr whenever it fails.
#[test]
pub fn the_binary_exits_cleanly_on_corrupted_files() {
    let dir = tempfile::tempdir().unwrap();
    let cases = corpus();
    let exe = env!("CARGO_BIN_EXE_ptefs");
    let mut failures = Vec::new();
    let mut runs = 0;
    let step = (cases.len() / 40).max(1);
    for (n, case) in cases.iter().enumerate().filter(|(n, _)| n % step == 0) {
        let paths = case.write_to(dir.path(), &format!("{n}-"));
        let data: Vec<String> = paths[1..]
            .iter()
            .flat_map(|p| ["--data".to_string(), p.display().to_string()])
            .collect();
        let file = paths[0].display().to_string();
        let commands: [Vec<&str>; 9] = [
            vec!["info"],
            vec!["info", "--json"],
            vec!["info", "--sizes", "--json"],
            vec!["check"],
            vec!["check", "--json"],
            vec!["ls", "-R", "-l"],
            vec!["cat", "", "header.json"],
            vec!["cat", "", "plans/forward/values/0.bin"],
            vec!["diff", "", &file],
        ];
        for cmd in commands {
            let mut args: Vec<String> = vec![cmd[0].to_string(), file.clone()];
            args.extend(
                cmd[1..]
                    .iter()
                    .filter(|a| !a.is_empty())
                    .map(|a| a.to_string()),
            );
            if cmd[0] == "diff" {
                // The file against itself: identical (0), or trouble reading it (2).
                for d in &paths[1..] {
                    for side in ["--data-a", "--data-b"] {
                        args.push(side.to_string());
                        args.push(d.display().to_string());
                    }
                }
                let out = Command::new(exe).args(&args).output().unwrap();
                runs += 1;
                let what = format!("{}: ptefs {}", case.name, args.join(" "));
                match out.status.code() {
                    Some(0) => {}
                    Some(2) if !String::from_utf8_lossy(&out.stderr).trim().is_empty() => {}
                    other => failures.push(format!(
                        "{what}: exit {other:?}, stdout {}, stderr {}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    )),
                }
                continue;
            }
            args.extend(data.iter().cloned());
            let out = Command::new(exe).args(&args).output().unwrap();
            runs += 1;
            let what = format!("{}: ptefs {}", case.name, args.join(" "));
            match out.status.code() {
                Some(0) => {}
                Some(1) => {
                    if String::from_utf8_lossy(&out.stderr).trim().is_empty() {
                        failures.push(format!("{what}: failed without a message on stderr"));
                    }
                }
                other => failures.push(format!(
                    "{what}: exit {other:?} ({}), stderr {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )),
            }
        }
    }
    eprintln!("{runs} runs of the binary");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
