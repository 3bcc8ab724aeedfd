//! Finishing interrupted commits: journals are replayed or discarded, and files left by an
//! interrupted re-layout are removed. A mount does this before it serves (each action is
//! logged and, when the daemon will leave the terminal, printed); `ptefs recover` and
//! `ptefs apply` do it without FUSE; `ls`, `info` and `check` only report what is pending.
//!
//! Invariant: the trust rules are those of `journal::recover` whoever calls it (a journal
//! that is not one this file's commits wrote is left in place, and the file is not touched).

use std::path::{Path, PathBuf};

use super::{journal, relayout};
use crate::error::Result;

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
        journal::Recovery::GroupFinished(files) => said.push(format!(
            "{}: finished an interrupted commit of {} files from their journals ({})",
            path.display(),
            files.len(),
            files.join("; ")
        )),
        journal::Recovery::GroupDiscarded(why) => said.push(format!(
            "{}: discarded the journal of an interrupted commit ({why})",
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

/// Journals left beside the files, judged as `ptefs recover` judges them: a whole one means
/// the file may hold a partly written range until it is replayed; a torn one is discarded;
/// one that no commit of this file can have written is refused, and only a person can
/// decide what to do with it.
pub fn interrupted_commits(file: &Path, data: &[PathBuf]) -> Vec<String> {
    use crate::edit::journal::{journal_path, pending, Pending};
    std::iter::once(file)
        .chain(data.iter().map(PathBuf::as_path))
        // A remote object has no journal beside it: ptefs never writes to one.
        .filter(|path| crate::format::model::remote_name(path).is_none())
        .filter_map(|path| {
            let j = journal_path(path).display().to_string();
            let f = path.display();
            Some(match pending(path).transpose()? {
                Ok(Pending::Whole { ranges, bytes, group }) if group.is_empty() => format!(
                    "{j}: an interrupted commit left this journal ({bytes} bytes in {ranges} range(s)), so {f} may hold partly written bytes: run `ptefs recover {f}` (or mount the file once) to finish it"
                ),
                Ok(Pending::Whole { ranges, bytes, group }) => format!(
                    "{j}: an interrupted commit of {} files left this journal ({bytes} bytes in {ranges} range(s)), so {f} and {} may hold partly written bytes: run `ptefs recover {f}` (or mount the file once) to finish or discard the whole commit",
                    group.len() + 1,
                    group.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
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
