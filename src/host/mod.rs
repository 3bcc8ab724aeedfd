//! What ptefs shares with the rest of the machine, below both the daemon and the commands:
//! the records that make a file mounted once and that `ptefs umount` trusts (`claims`, in
//! the runtime directory), and the kernel's mount table and unmounting (`mounts`).

pub mod claims;
pub mod mounts;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::model::remote_name;

fn canonical(path: &Path) -> Result<PathBuf> {
    path.canonicalize()
        .map_err(|e| Error::io(path.display(), e))
}

/// A model file and its data files as absolute paths without links: the names lock files
/// and the mount table know them by. A URL of a remote object stays as it is.
pub fn canonical_files(file: &Path, data: &[PathBuf]) -> Result<(PathBuf, Vec<PathBuf>)> {
    let canonical = |p: &Path| match remote_name(p) {
        Some(_) => Ok(p.to_path_buf()),
        None => canonical(p),
    };
    let file = canonical(file)?;
    let data = data.iter().map(|d| canonical(d)).collect::<Result<_>>()?;
    Ok((file, data))
}

/// Refuses `what` (a command that writes files) when any of `files` is a remote object:
/// ptefs never writes to one.
pub fn refuse_remote<'a>(what: &str, files: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    for f in files {
        if remote_name(f).is_some() {
            return Err(Error::new(
                libc::EROFS,
                format!(
                    "{}: a remote model is read-only: {what} needs a local copy of the file",
                    f.display()
                ),
            ));
        }
    }
    Ok(())
}
