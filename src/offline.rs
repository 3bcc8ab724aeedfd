//! The commands that work without FUSE (`ls`, `cat`, `info`, `check`), on the same core as
//! the mount: they walk the same `Tree` and read through the same `fs::Fs`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod info;

pub use info::info;

use crate::catalog::names::{Names, Part, NAME_MAX};
use crate::error::{Error, Result};
use crate::format::Model;
use crate::fs::{Attr, FileType, Fs, Options};
use crate::tree::{Ino, Tree, DEFAULT_MAX_NODES};

/// The tree of `file` (with `data` attached), read-only, within the default node limit.
pub fn open_fs(file: &Path, data: &[PathBuf]) -> Result<Fs> {
    open_fs_limited(file, data, DEFAULT_MAX_NODES)
}

/// The tree of `file`, refused when it would have more than `max_nodes` nodes.
pub fn open_fs_limited(file: &Path, data: &[PathBuf], max_nodes: u64) -> Result<Fs> {
    for warning in interrupted_commits(file, data) {
        log::warn!("{warning}");
        eprintln!("ptefs: warning: {warning}");
    }
    let model = Model::open(file, data)?;
    Ok(Fs::new(
        Tree::build_limited(Arc::new(model), max_nodes)?,
        Options { read_only: true },
    ))
}

fn find(fs: &Fs, path: &str) -> Result<Ino> {
    fs.tree()
        .find(path)
        .ok_or_else(|| Error::not_found(format!("{path} (in the tree)")))
}

/// Output errors (a closed pipe, a full disk) as errors of the command.
fn output(e: std::io::Error) -> Error {
    Error::io("standard output", e)
}

fn mode_string(a: &Attr) -> String {
    let mut s = String::with_capacity(10);
    s.push(if a.kind == FileType::Directory {
        'd'
    } else {
        '-'
    });
    for shift in [6, 3, 0] {
        let bits = (a.perm >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn entry_line(name: &str, a: &Attr, long: bool) -> String {
    let shown = if a.kind == FileType::Directory {
        format!("{name}/")
    } else {
        name.to_string()
    };
    if long {
        format!("{} {:>12} {shown}", mode_string(a), a.size)
    } else {
        shown
    }
}

/// Lists a directory (or names a file), like `ls -1`/`ls -l`; `recursive` lists every path
/// below, one a line, as the fixtures' `.tree` files do.
pub fn ls(fs: &Fs, path: &str, long: bool, recursive: bool, out: &mut dyn Write) -> Result<()> {
    let ino = find(fs, path)?;
    let attr = fs.getattr(ino)?;
    let io = output;
    if attr.kind != FileType::Directory {
        writeln!(out, "{}", entry_line(path.trim_matches('/'), &attr, long)).map_err(io)?;
        return Ok(());
    }
    if recursive {
        let mut stack = vec![(ino, String::new())];
        let mut lines = Vec::new();
        while let Some((dir, prefix)) = stack.pop() {
            for e in fs.list(dir)?.into_iter().skip(2) {
                let rel = format!("{prefix}{}", e.name);
                lines.push(entry_line(&rel, &e.attr, long));
                if e.attr.kind == FileType::Directory {
                    stack.push((e.attr.ino, format!("{rel}/")));
                }
            }
        }
        lines.sort();
        for l in lines {
            writeln!(out, "{l}").map_err(io)?;
        }
    } else {
        for e in fs.list(ino)?.into_iter().skip(2) {
            writeln!(out, "{}", entry_line(&e.name, &e.attr, long)).map_err(io)?;
        }
    }
    Ok(())
}

/// Writes a file's bytes, read in requests of the block size, as through the mount.
pub fn cat(fs: &Fs, path: &str, out: &mut dyn Write) -> Result<()> {
    let ino = find(fs, path)?;
    let attr = fs.getattr(ino)?;
    if attr.kind == FileType::Directory {
        return Err(Error::new(libc::EISDIR, format!("{path}: is a directory")));
    }
    let mut offset = 0u64;
    while offset < attr.size {
        let data = fs.read(ino, offset, crate::fs::BLOCK_SIZE)?;
        let bytes = data.bytes();
        if bytes.is_empty() {
            break;
        }
        out.write_all(bytes).map_err(output)?;
        offset += bytes.len() as u64;
    }
    out.flush().map_err(output)
}

/// Every defect of the files, one a line; empty when the files are sound.
pub fn check(file: &Path, data: &[PathBuf]) -> Vec<String> {
    check_limited(file, data, DEFAULT_MAX_NODES)
}

/// `check`, refusing (with one line saying so) files whose tree would have more than
/// `max_nodes` nodes, as `ls`, `cat`, `info` and `mount` do.
pub fn check_limited(file: &Path, data: &[PathBuf], max_nodes: u64) -> Vec<String> {
    check_report(file, data, max_nodes).defects
}

/// What `ptefs check` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// One a line; empty when the files are sound.
    pub defects: Vec<String>,
    /// How to fix some of them, one a line: `.ptd` files beside the model that hold keys
    /// it lacks (`check::data_beside`).
    pub advice: Vec<String>,
}

/// The defects of the files, and advice, as `check_limited` finds them.
pub fn check_report(file: &Path, data: &[PathBuf], max_nodes: u64) -> CheckReport {
    let mut report = CheckReport {
        defects: interrupted_commits(file, data),
        advice: Vec::new(),
    };
    let out = &mut report.defects;
    match Model::open(file, data) {
        Err(e) => out.push(e.to_string()),
        Ok(model) => {
            let nodes = crate::tree::node_count(&model);
            if nodes > max_nodes {
                let refusal = crate::tree::build::too_many_nodes(&model, nodes, max_nodes);
                out.push(refusal.to_string());
            } else {
                out.extend(crate::check::defects(&model));
                shortened_names(&model, out);
                report.advice.extend(crate::check::data_beside(&model));
            }
        }
    }
    report
}

/// Journals left beside the files, judged as `ptefs recover` judges them: a whole one means
/// the file may hold a partly written range until it is replayed; a torn one is discarded;
/// one that no commit of this file can have written is refused, and only a person can
/// decide what to do with it.
pub fn interrupted_commits(file: &Path, data: &[PathBuf]) -> Vec<String> {
    use crate::edit::journal::{journal_path, pending, Pending};
    std::iter::once(file)
        .chain(data.iter().map(PathBuf::as_path))
        .filter_map(|path| {
            let j = journal_path(path).display().to_string();
            let f = path.display();
            Some(match pending(path).transpose()? {
                Ok(Pending::Whole { ranges, bytes }) => format!(
                    "{j}: an interrupted commit left this journal ({bytes} bytes in {ranges} range(s)), so {f} may hold partly written bytes: run `ptefs recover {f}` (or mount the file once) to finish it"
                ),
                Ok(Pending::Torn(why)) => format!(
                    "{j}: {why}; the commit that wrote it did not start changing {f}: `ptefs recover {f}` (or a mount) removes it"
                ),
                Err(refusal) => format!(
                    "{refusal}; `ptefs recover` and mounts refuse {f} until it is gone"
                ),
            })
        })
        .collect()
}

/// Adds to `out` the names the tree cannot show verbatim (longer than a file name can be): the runtime has no
/// problem with them, but `ls` shows a shortened name, so a script looking for the key by
/// name does not find it.
pub fn shortened_names(model: &Model, out: &mut Vec<String>) {
    let names = Names::of(model);
    for s in &names.shortened {
        let (what, shown) = match s.part {
            Part::Plan(p) => (format!("plan {p} name"), format!("plans/{}/", s.shown)),
            Part::DataFile(f) => (
                format!("data file {} stem", model.files[f].path.display()),
                format!("data/{}/", s.shown),
            ),
            Part::NamedData(f, k) => (
                format!("{}: named_data[{k}] key", model.files[f].path.display()),
                format!("{}named_data/{}.json", names.file_prefix(f), s.shown),
            ),
        };
        out.push(format!(
            "{what} {} ({} bytes) is longer than a file name can be ({NAME_MAX} bytes with its extension): the tree shows it as {shown}",
            abbreviated(&s.full),
            s.full.len(),
        ));
    }
}

/// A name as a JSON string, its middle left out when it is long.
fn abbreviated(name: &str) -> String {
    const SHOWN: usize = 60;
    if name.len() <= 2 * SHOWN {
        return serde_json::Value::from(name).to_string();
    }
    let mut head = SHOWN;
    while !name.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = name.len() - SHOWN;
    while !name.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}…{}",
        serde_json::Value::from(&name[..head]),
        serde_json::Value::from(&name[tail..])
    )
}
