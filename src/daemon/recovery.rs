//! Finishing interrupted commits: journals are replayed or discarded, and files left by an
//! interrupted re-layout are removed. A mount does this before it serves (each action is
//! logged and, when the daemon will leave the terminal, printed); `ptefs recover` does it
//! without FUSE, for files loaded straight into the ExecuTorch runtime after a crash.
//!
//! Invariants: the trust rules are those of `journal::recover` whoever calls it (a journal
//! that is not one this file's commits wrote is left in place, and the file is not touched);
//! `ptefs recover` never runs while a daemon has one of the files mounted (it claims them as
//! a mount does, and refuses files the mount table shows mounted by any user), since a
//! journal beside a mounted file may belong to a commit in progress.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{lock, mountinfo};
use crate::edit::{journal, relayout};
use crate::error::{Error, Result};

/// Finishes the interrupted commits of `path`; returns what was done, one sentence each
/// (nothing when no commit was interrupted).
pub fn finish(path: &Path) -> Result<Vec<String>> {
    let mut said = Vec::new();
    let shown = path.display().to_string();
    match journal::recover(path).map_err(|e| {
        // A message that starts with the file already says what happened to it (a replay
        // whose journal cannot be removed).
        if e.message().starts_with(&format!("{shown}: ")) {
            e
        } else {
            e.context(format!("{shown}: journal recovery failed"))
        }
    })? {
        journal::Recovery::None => {}
        journal::Recovery::Replayed { ranges, bytes } => said.push(format!(
            "{}: finished an interrupted commit from its journal ({bytes} bytes in {ranges} range(s))",
            path.display()
        )),
        journal::Recovery::Discarded(why) => said.push(format!(
            "{}: discarded the journal of an interrupted commit ({why}); the file is unchanged",
            path.display()
        )),
    }
    said.extend(relayout::remove_stale(path));
    Ok(said)
}

/// `finish`, with each action logged and, when `announce`, printed to stderr.
pub fn recover(path: &Path, announce: bool) -> Result<()> {
    for msg in finish(path)? {
        log::warn!("{msg}");
        if announce {
            eprintln!("ptefs: {msg}");
        }
    }
    Ok(())
}

/// `ptefs recover FILE [--data PTD]...`: finishes the interrupted commits of each file,
/// printing what was done (or that nothing was pending) to `out`. Every file is tried; the
/// refusals (journals that are not trusted) are returned together, one a line, after the
/// others are done.
pub fn recover_files(file: &Path, data: &[PathBuf], out: &mut dyn Write) -> Result<()> {
    let paths = std::iter::once(file)
        .chain(data.iter().map(PathBuf::as_path))
        .map(|p| {
            p.canonicalize()
                .map_err(|e| Error::io(p.display().to_string(), e))
        })
        .collect::<Result<Vec<_>>>()?;
    let _claims = paths
        .iter()
        .map(|p| lock::claim_file(p, lock::Holder::Recover))
        .collect::<Result<Vec<_>>>()?;
    for p in &paths {
        mountinfo::refuse_if_mounted(p)?;
    }
    let io = |e| Error::io("standard output", e);
    let mut failed: Vec<Error> = Vec::new();
    for p in &paths {
        match finish(p) {
            Ok(said) if said.is_empty() => {
                writeln!(out, "{}: no interrupted commit", p.display()).map_err(io)?
            }
            Ok(said) => {
                for s in said {
                    writeln!(out, "{s}").map_err(io)?;
                }
            }
            Err(e) => failed.push(e),
        }
    }
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => Err(Error::new(
            failed[0].errno(),
            failed
                .iter()
                .map(|e| e.message())
                .collect::<Vec<_>>()
                .join("\n"),
        )),
    }
}
