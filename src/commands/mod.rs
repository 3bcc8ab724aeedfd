//! The commands of the command line, one module each: `mount` and `umount`, the commands
//! that work without FUSE on the same core as a mount (`ls`, `cat`, `info`, `check`), and
//! those that change or repair files (`apply`, `recover`), and `names`, which learns what
//! the tensors are called. What several commands share
//! lives below them: file claims and the mount table in `crate::host`, journal recovery in
//! `crate::edit::recovery`.
//!
//! Invariant: a command never reads a model otherwise than a mount would: the offline ones
//! walk the same `Tree` and read through the same `fs::Fs` (`info` summarizes the same
//! `Catalog`, without the tree).

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod apply;
pub mod cat;
pub mod check;
pub mod diff;
pub mod info;
pub mod ls;
pub mod mount;
pub mod names;
pub mod recover;
pub mod umount;

pub use apply::{apply, ApplyRequest};
pub use cat::cat;
pub use check::{check, check_limited, check_report, shortened_names, CheckReport};
pub use diff::{diff, DiffRequest};
pub use info::info;
pub use ls::ls;
pub use mount::{mount, MountRequest};
pub use names::{names, NamesRequest};
pub use recover::recover;
pub use umount::umount;

use crate::catalog::{Catalog, Payloads};
use crate::edit::recovery::interrupted_commits;
use crate::error::{Error, Result};
use crate::format::Model;
use crate::fs::{Fs, Options};
use crate::tree::{Ino, Tree, DEFAULT_MAX_NODES};

/// Claims, for `holder`, the files of interrupted commits of several files that `paths`
/// belong to but that are not among `paths`, and refuses those mounted: recovering one file
/// finishes its whole commit, which may write each of them
/// (docs/writes.md#commits-of-several-files). The claims are for the recovery only.
pub fn claim_commit_members(
    paths: &[&Path], holder: crate::host::claims::Holder,
) -> Result<Vec<crate::host::claims::FileClaim>> {
    use crate::edit::journal::{pending, Pending};
    let mut claimed: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
    let mut claims = Vec::new();
    for path in paths {
        // An unreadable journal is judged, and refused, by the recovery itself.
        let Ok(Some(Pending::Whole { group, .. })) = pending(path) else {
            continue;
        };
        for member in group {
            let member = member.canonicalize().unwrap_or(member);
            if claimed.contains(&member) || !member.exists() {
                continue;
            }
            claims.push(crate::host::claims::claim_file(&member, holder)?);
            crate::host::mounts::refuse_if_mounted(&member)?;
            claimed.push(member);
        }
    }
    Ok(claims)
}

/// The tree of `file` (with `data` attached), read-only, within the default node limit.
pub fn open_fs(file: &Path, data: &[PathBuf]) -> Result<Fs> {
    open_fs_limited(file, data, DEFAULT_MAX_NODES)
}

/// The tree of `file`, refused when it would have more than `max_nodes` nodes.
pub fn open_fs_limited(file: &Path, data: &[PathBuf], max_nodes: u64) -> Result<Fs> {
    open_fs_named(file, data, max_nodes, None)
}

/// The tree of `file` with the named views `--names` gives (a map, or a checkpoint learned
/// from, its report on standard error), refused when it would have more than `max_nodes`
/// nodes.
pub fn open_fs_named(
    file: &Path, data: &[PathBuf], max_nodes: u64, names: Option<&Path>,
) -> Result<Fs> {
    for warning in interrupted_commits(file, data) {
        log::warn!("{warning}");
        eprintln!("ptefs: warning: {warning}");
    }
    let model = Model::open(file, data)?;
    let tree = Tree::build_with(Arc::new(model), max_nodes, |catalog| {
        names
            .map(|p| crate::names::given::map_for(p, catalog, &mut |line| eprintln!("{line}")))
            .transpose()
    })?;
    Ok(Fs::new(tree, Options { read_only: true }))
}

/// The catalog of `file` (with `data` attached), without its tree, refused when the tree
/// would have more than `max_nodes` nodes (as `open_fs_limited` refuses it): what `info`
/// summarizes.
pub fn open_catalog_limited(file: &Path, data: &[PathBuf], max_nodes: u64) -> Result<Catalog> {
    for warning in interrupted_commits(file, data) {
        log::warn!("{warning}");
        eprintln!("ptefs: warning: {warning}");
    }
    let model = Model::open(file, data)?;
    let payloads = Payloads::decode(&model);
    let nodes = crate::tree::build::node_count_with(&model, &payloads);
    if nodes > max_nodes {
        return Err(crate::tree::build::too_many_nodes(&model, nodes, max_nodes));
    }
    Ok(Catalog::with_payloads(Arc::new(model), payloads))
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
