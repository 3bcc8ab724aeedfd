//! `ptefs recover`: finishes the commits a crash interrupted, without FUSE, for files loaded
//! straight into the ExecuTorch runtime after a crash.
//!
//! Invariant: it never runs while a daemon has one of the files mounted (it claims them as
//! a mount does, and refuses files the mount table shows mounted by any user), since a
//! journal beside a mounted file may belong to a commit in progress.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::edit::recovery::finish;
use crate::error::{Error, Result};
use crate::host::{claims, mounts};

/// `ptefs recover FILE [--data PTD]...`: finishes the interrupted commits of each file,
/// printing what was done (or that nothing was pending) to `out`. Every file is tried; the
/// refusals (journals that are not trusted) are returned together, one a line, after the
/// others are done.
pub fn recover(file: &Path, data: &[PathBuf], out: &mut dyn Write) -> Result<()> {
    crate::host::refuse_remote(
        "ptefs recover",
        std::iter::once(file).chain(data.iter().map(PathBuf::as_path)),
    )?;
    let paths = std::iter::once(file)
        .chain(data.iter().map(PathBuf::as_path))
        .map(|p| {
            p.canonicalize()
                .map_err(|e| Error::io(p.display().to_string(), e))
        })
        .collect::<Result<Vec<_>>>()?;
    let _claims = paths
        .iter()
        .map(|p| claims::claim_file(p, claims::Holder::Recover))
        .collect::<Result<Vec<_>>>()?;
    for p in &paths {
        mounts::refuse_if_mounted(p)?;
    }
    let _members = super::claim_commit_members(
        &paths.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
        claims::Holder::Recover,
    )?;
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
