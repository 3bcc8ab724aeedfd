//! Mounting: checks before the mount, the background server, clean unmounts.
//!
//! `mount` checks everything it can while it still has the terminal (the file, the
//! mountpoint, `/dev/fuse`) and finishes interrupted commits. Then, unless in the foreground,
//! it forks (`background`): the child detaches, parses the model, mounts and serves
//! (`serve`); the parent returns once the mount is live or failed. Each job has its own
//! module: `logging`, `mountinfo` (the kernel's mount table), `lock` (what `ptefs umount`
//! waits on), `unmount`, `options` (`-o`), `recovery` (interrupted commits).

mod background;
pub(crate) mod lock;
mod logging;
mod mountinfo;
mod options;
pub(crate) mod recovery;
mod serve;
mod unmount;

pub use unmount::umount;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::Model;
use crate::tree::{Tree, DEFAULT_MAX_NODES};

use background::{Ready, Side};

/// What `ptefs mount` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct MountRequest {
    pub file: PathBuf,
    pub mountpoint: PathBuf,
    /// `.ptd` files to attach.
    pub data: Vec<PathBuf>,
    pub read_only: bool,
    /// Stay attached and log to stderr.
    pub foreground: bool,
    /// `-o` lists, each comma-separated.
    pub options: Vec<String>,
    /// `-v` count.
    pub verbose: u8,
    /// In the background, log here instead of syslog.
    pub log_file: Option<PathBuf>,
    /// Refuse files whose tree would have more nodes (`--max-nodes`); `None`: `-o max_nodes=`
    /// if given, else `DEFAULT_MAX_NODES`.
    pub max_nodes: Option<u64>,
}

fn canonical(path: &Path) -> Result<PathBuf> {
    path.canonicalize()
        .map_err(|e| Error::io(path.display(), e))
}

fn mountpoint_dir(path: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path.display(), e))?;
    if !meta.is_dir() {
        return Err(Error::new(
            libc::ENOTDIR,
            format!("{}: the mountpoint is not a directory", path.display()),
        ));
    }
    canonical(path)
}

/// At most this many defects are printed at mount; `ptefs check` lists them all.
const WARNINGS_SHOWN: usize = 10;

/// What the mount says about a model the runtime would refuse or fail on: the defects
/// `ptefs check` reports.
fn warnings(tree: &Tree) -> Vec<String> {
    let mut defects = crate::check::defects(&tree.model);
    if defects.len() > WARNINGS_SHOWN {
        let more = defects.len() - WARNINGS_SHOWN;
        defects.truncate(WARNINGS_SHOWN);
        defects.push(format!("… and {more} more: `ptefs check` lists them all"));
    }
    defects
}

/// Parses the model and its data files and builds the tree that the mount shows, unless it
/// would have more than `max_nodes` nodes.
fn open_tree(file: &Path, data: &[PathBuf], read_only: bool, max_nodes: u64) -> Result<Tree> {
    let model = if read_only {
        Model::open(file, data)?
    } else {
        Model::open_writable(file, data)?
    };
    Tree::build_limited(Arc::new(model), max_nodes)
}

/// Takes ptefs's own `-o` options (`max_nodes=N`) out of the list given to FUSE.
fn own_options(options: &[String]) -> Result<(Vec<String>, Option<u64>)> {
    let mut max_nodes = None;
    let mut rest = Vec::new();
    for opt in options.iter().flat_map(|o| o.split(',')) {
        match opt.trim().strip_prefix("max_nodes=") {
            Some(n) => {
                max_nodes = Some(n.parse::<u64>().map_err(|e| {
                    Error::invalid(format!(
                        "-o max_nodes={n}: expected a number of nodes ({e})"
                    ))
                })?);
            }
            None => rest.push(opt.to_string()),
        }
    }
    Ok((rest, max_nodes))
}

/// `ptefs mount`: returns once the mount is live (in the background) or once it is
/// unmounted (in the foreground). In the background this returns in both processes: the
/// parent with the mount's outcome, the daemon after its session ended.
pub fn mount(req: &MountRequest) -> Result<()> {
    let log_target = match (&req.log_file, req.foreground) {
        (_, true) => logging::LogTarget::Stderr,
        (Some(path), false) => logging::LogTarget::File(path),
        (None, false) => logging::LogTarget::Syslog,
    };
    logging::init(req.verbose, log_target)?;
    // Everything that can be checked is checked while the terminal is still ours.
    let file = canonical(&req.file)?;
    let data = req
        .data
        .iter()
        .map(|d| canonical(d))
        .collect::<Result<Vec<_>>>()?;
    let mountpoint = mountpoint_dir(&req.mountpoint)?;
    if !Path::new("/dev/fuse").exists() {
        return Err(Error::new(
            libc::ENODEV,
            "/dev/fuse is missing: load the fuse module (modprobe fuse) or run where FUSE is available",
        ));
    }
    if let Some(entry) = mountinfo::find_mount(&mountpoint).filter(|e| e.is_ptefs()) {
        return Err(Error::new(
            libc::EBUSY,
            format!(
                "{} is already a ptefs mount (of {}); unmount it first",
                mountpoint.display(),
                entry.source.trim_start_matches("ptefs:")
            ),
        ));
    }
    // Each file is mounted once; the claims are held for the daemon's whole life.
    let mut claims = std::iter::once(&file)
        .chain(&data)
        .map(|p| lock::claim_file(p, lock::Holder::Mount(&mountpoint)))
        .collect::<Result<Vec<_>>>()?;
    let (fuse_options, o_max_nodes) = own_options(&req.options)?;
    let max_nodes = req.max_nodes.or(o_max_nodes).unwrap_or(DEFAULT_MAX_NODES);
    let (config, read_only) = options::fuse_config(&fuse_options, req.read_only, &file);
    for p in std::iter::once(&file).chain(&data) {
        if let Err(e) = recovery::recover(p, !req.foreground) {
            if !read_only {
                return Err(e);
            }
            log::warn!("{e}");
        }
    }
    if req.foreground {
        let tree = open_tree(&file, &data, read_only, max_nodes)?;
        let warnings = warnings(&tree);
        return serve::serve(
            tree,
            read_only,
            &config,
            &mountpoint,
            Ready::Foreground,
            &warnings,
            claims,
        );
    }
    match background::fork()? {
        Side::Parent(outcome) => {
            // The daemon holds the claims now (the locks belong to the descriptors it
            // inherited); they are its to release.
            std::mem::forget(claims);
            outcome
        }
        Side::Child(ready) => {
            // From here on, what this process prints goes nowhere: the parent prints what
            // the child reports.
            background::detach();
            for c in &mut claims {
                c.record_daemon(&mountpoint);
            }
            let tree = match open_tree(&file, &data, read_only, max_nodes) {
                Ok(t) => t,
                Err(e) => {
                    let failed = Err(e);
                    ready.report(&failed, &[]);
                    return failed;
                }
            };
            let warnings = warnings(&tree);
            serve::serve(
                tree,
                read_only,
                &config,
                &mountpoint,
                ready,
                &warnings,
                claims,
            )
        }
    }
}
