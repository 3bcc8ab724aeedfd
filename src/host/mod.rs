//! What ptefs shares with the rest of the machine, below both the daemon and the commands:
//! the records that make a file mounted once and that `ptefs umount` trusts (`claims`, in
//! the runtime directory), and the kernel's mount table and unmounting (`mounts`).

pub mod claims;
pub mod mounts;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

fn canonical(path: &Path) -> Result<PathBuf> {
    path.canonicalize()
        .map_err(|e| Error::io(path.display(), e))
}

/// A model file and its data files as absolute paths without links: the names lock files
/// and the mount table know them by.
pub fn canonical_files(file: &Path, data: &[PathBuf]) -> Result<(PathBuf, Vec<PathBuf>)> {
    let file = canonical(file)?;
    let data = data.iter().map(|d| canonical(d)).collect::<Result<_>>()?;
    Ok((file, data))
}
