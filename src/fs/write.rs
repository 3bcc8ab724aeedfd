//! The write operations (DESIGN.md §3): open, create, write, truncate, close, fsync, rename,
//! unlink.
//!
//! Commit points: `flush` comes for every close(2) of a descriptor, duplicates included (a
//! shell's `> file` closes one before the command writes anything; NumPy's `tofile` writes
//! through a `dup` and closes it before the real close), so a flush commits only what its
//! handle wrote or truncated since the last commit, and `release` (the last close) commits
//! whatever is still staged. `fsync` commits whatever is staged. A truncate by path with no
//! writer open commits at once. A refused commit sticks to its handle (see `handles`).
//!
//! Invariant: after every operation that committed, or failed to, the kernel is told what to
//! forget; after a failure that includes the file itself, whose pages may hold rejected bytes
//! written through the kernel's cache.

use std::sync::Arc;

use super::handles::{Handle, Target};
use super::invalidate::Invalidate;
use super::staging::staging_buffer;
use super::{Attr, Fs, Opened};
use crate::error::{Error, Result};
use crate::tree::{Ino, Tree};

/// What `Fs::setattr` may change.
#[derive(Debug, Default, Clone, Copy)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// The handle of an `ftruncate`.
    pub fh: Option<u64>,
}

/// `renameat2` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace the destination if it exists.
    Replace,
    /// `RENAME_NOREPLACE`: fail with EEXIST if the destination exists.
    NoReplace,
    /// `RENAME_EXCHANGE`: swap two names.
    Exchange,
}

fn wants_write(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
}

/// The bytes a writer starts from: the file's current content.
fn current_bytes(tree: &Arc<Tree>, ino: Ino) -> Result<Vec<u8>> {
    let size = tree.size(ino);
    let mut out = staging_buffer(usize::try_from(size).unwrap_or(0));
    while (out.len() as u64) < size {
        let data = super::read::read(tree.clone(), ino, out.len() as u64, u32::MAX)?;
        if data.bytes().is_empty() {
            break;
        }
        out.extend_from_slice(data.bytes());
    }
    if tree.model.files.iter().any(|f| f.poisoned()) {
        return Err(Error::new(
            libc::EIO,
            "the model file shrank while mounted; remount it",
        ));
    }
    Ok(out)
}

impl Fs {
    /// The tree file a scratch inode was renamed onto, else `ino` itself.
    pub fn canonical_ino(&self, ino: Ino) -> Ino {
        self.scratch.canonical_ino(ino)
    }

    fn target(&self, ino: Ino) -> Target {
        let ino = self.canonical_ino(ino);
        if self.scratch.contains(ino) {
            Target::Scratch(ino)
        } else {
            Target::Tree(ino)
        }
    }

    /// Tells the kernel what an operation on `ino` made stale: what a commit changed, or,
    /// after a failure, the file itself.
    fn publish<T>(&self, ino: Ino, result: Result<(T, Invalidate)>) -> Result<T> {
        match result {
            Ok((value, inval)) => {
                inval.send(&*self.invalidator);
                Ok(value)
            }
            Err(e) => {
                self.invalidator.inodes(vec![ino], true);
                Err(e)
            }
        }
    }

    /// Opens a file; a write open of a writable file starts (or joins) its staging.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<Opened> {
        let target = self.target(ino);
        let writable = wants_write(flags);
        match target {
            Target::Scratch(ino) => {
                if writable && flags & libc::O_TRUNC != 0 {
                    self.scratch.set_len(ino, 0)?;
                }
            }
            Target::Tree(ino) => {
                let tree = self.tree();
                let node = tree
                    .node(ino)
                    .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
                if node.is_dir() && writable {
                    return Err(Error::new(
                        libc::EISDIR,
                        format!("{} is a directory", tree.path(ino)),
                    ));
                }
                if writable {
                    if self.options.read_only || node.write.is_none() {
                        return Err(self.not_writable(&tree, ino));
                    }
                    // The new content is most likely as long as the old: one allocation.
                    let truncate_to = (flags & libc::O_TRUNC != 0)
                        .then(|| usize::try_from(tree.size(ino)).unwrap_or(0));
                    self.staging.open_writer(ino, truncate_to);
                }
            }
        }
        let fh = self.handles.insert(target, writable);
        Ok(Opened {
            fh,
            // Tree files keep their cached pages across opens: a commit drops them.
            keep_cache: matches!(target, Target::Tree(_)),
            direct_io: false,
            cache_dir: false,
        })
    }

    /// Marks handle `fh` as having written, unless a refused commit stuck to it.
    fn start_write(&self, fh: u64) -> Result<Handle> {
        let before = self.handles.update(fh, |h| h.wrote = h.failed.is_none())?;
        match before.failed {
            Some(e) => Err(e),
            None => Ok(before),
        }
    }

    /// Creates an editor's scratch file in a writable directory.
    pub fn create(&self, parent: Ino, name: &str, flags: i32) -> Result<(Attr, Opened)> {
        if self.options.read_only {
            return Err(Fs::read_only_error());
        }
        let tree = self.tree();
        if tree.children(parent).is_none() {
            return Err(Error::not_found(format!("inode {parent}")));
        }
        if !super::attr::dir_is_writable(&tree, parent) {
            return Err(Error::new(
                libc::EACCES,
                format!(
                    "cannot create {name} in {}: the directory is read-only",
                    tree.path(parent)
                ),
            ));
        }
        if tree.lookup(parent, name).is_some() || self.scratch.lookup(parent, name).is_some() {
            return Err(Error::new(
                libc::EEXIST,
                format!("{}/{name} exists", tree.path(parent)),
            ));
        }
        let ino = self.scratch.create(parent, name);
        let opened = self.open(ino, flags)?;
        Ok((self.getattr(ino)?, opened))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.start_write(fh)?;
        if !h.writable {
            return Err(Error::new(
                libc::EBADF,
                "the file was not opened for writing",
            ));
        }
        match h.target {
            Target::Scratch(ino) => self.scratch.write(ino, offset, data)?,
            Target::Tree(ino) => {
                let tree = self.tree();
                self.staging
                    .write(ino, offset, data, || current_bytes(&tree, ino))?;
            }
        }
        Ok(data.len() as u32)
    }

    /// `chmod`, `chown`, `truncate`, `utimes` and the like. The owner and mode are those of
    /// the model file and cannot change; scratch files accept any (editors copy modes onto
    /// their new file) and keep theirs. Times are ignored, so `touch` and `cp -p` work.
    pub fn setattr(&self, ino: Ino, change: SetAttr) -> Result<Attr> {
        let ino = self.canonical_ino(ino);
        let result = self.setattr_inner(ino, change);
        self.publish(ino, result)
    }

    fn setattr_inner(&self, ino: Ino, change: SetAttr) -> Result<(Attr, Invalidate)> {
        let current = self.getattr(ino)?;
        let target = self.target(ino);
        if let Target::Tree(_) = target {
            let changes_mode = change
                .mode
                .is_some_and(|m| (m & 0o7777) as u16 != current.perm);
            let changes_owner = change.uid.is_some_and(|u| u != current.uid)
                || change.gid.is_some_and(|g| g != current.gid);
            if changes_mode || changes_owner {
                return Err(if self.options.read_only {
                    Fs::read_only_error()
                } else {
                    Error::new(
                        libc::EPERM,
                        format!(
                            "{}: mode and owner are those of the model file",
                            self.tree().path(ino)
                        ),
                    )
                });
            }
        }
        let Some(size) = change.size else {
            return Ok((current, Invalidate::default()));
        };
        if let Some(fh) = change.fh {
            self.start_write(fh)?;
        }
        let inval = match target {
            Target::Scratch(ino) => {
                self.scratch.set_len(ino, size)?;
                Invalidate::default()
            }
            Target::Tree(ino) => self.truncate_tree_file(ino, size)?,
        };
        Ok((self.getattr(ino)?, inval))
    }

    /// Resizes the staged bytes of a tree file; without an open writer, commits at once.
    fn truncate_tree_file(&self, ino: Ino, size: u64) -> Result<Invalidate> {
        let tree = self.tree();
        let node = tree
            .node(ino)
            .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
        if node.is_dir() {
            return Err(Error::new(
                libc::EISDIR,
                format!("{} is a directory", tree.path(ino)),
            ));
        }
        if self.options.read_only || node.write.is_none() {
            return Err(self.not_writable(&tree, ino));
        }
        let writers = self.staging.set_len(ino, size, || {
            if size == 0 {
                Ok(Vec::new())
            } else {
                current_bytes(&tree, ino)
            }
        })?;
        if writers > 0 {
            return Ok(Invalidate::default());
        }
        let result = self.commit_staged(ino);
        self.staging.discard_if_unused(ino);
        result
    }

    /// `close()`: commits the file's staged bytes if this handle changed them.
    pub fn flush(&self, fh: u64) -> Result<()> {
        self.commit_through(fh, false)
    }

    /// `fsync()`: commits the file's staged bytes, whoever changed them.
    pub fn fsync(&self, fh: u64) -> Result<()> {
        self.commit_through(fh, true)
    }

    fn commit_through(&self, fh: u64, always: bool) -> Result<()> {
        let h = self.handles.update(fh, |h| h.wrote = false)?;
        if let Some(e) = h.failed {
            return Err(e);
        }
        let Target::Tree(ino) = h.target else {
            return Ok(());
        };
        if !h.writable || !(h.wrote || always) {
            return Ok(());
        }
        let result = self.commit_staged(ino);
        if let Err(e) = &result {
            let _ = self.handles.update(fh, |h| h.failed = Some(e.clone()));
        }
        self.publish(ino, result.map(|inval| ((), inval)))
    }

    /// Last close of a handle: commits anything still staged, then forgets the handle.
    pub fn release(&self, fh: u64) -> Result<()> {
        let Some(h) = self.handles.remove(fh) else {
            return Ok(());
        };
        let Target::Tree(ino) = h.target else {
            return Ok(());
        };
        if !h.writable {
            return Ok(());
        }
        let result = self.commit_staged(ino);
        self.staging.close_writer(ino);
        self.publish(ino, result.map(|inval| ((), inval)))
    }

    /// Commits everything still staged (before an unmount); returns the failures.
    pub fn commit_all(&self) -> Vec<Error> {
        let mut failures = Vec::new();
        for ino in self.staging.dirty() {
            match self.commit_staged(ino) {
                Ok(inval) => self.invalidator.inodes(inval.inodes, false),
                Err(e) => failures.push(e),
            }
        }
        failures
    }

    /// Renames: a scratch file onto a writable file replaces its content (a commit); scratch
    /// files may be renamed among themselves; tree files cannot move.
    pub fn rename(
        &self, parent: Ino, name: &str, new_parent: Ino, new_name: &str, mode: RenameMode,
    ) -> Result<()> {
        let tree = self.tree();
        let dst = tree.lookup(new_parent, new_name);
        let result = self.rename_inner(&tree, parent, name, new_parent, new_name, mode);
        self.publish(dst.unwrap_or(parent), result.map(|inval| ((), inval)))
    }

    fn rename_inner(
        &self, tree: &Tree, parent: Ino, name: &str, new_parent: Ino, new_name: &str,
        mode: RenameMode,
    ) -> Result<Invalidate> {
        if self.options.read_only {
            return Err(Fs::read_only_error());
        }
        if mode == RenameMode::Exchange {
            return Err(self.unsupported("rename with RENAME_EXCHANGE"));
        }
        let dst = tree.lookup(new_parent, new_name);
        let exists = dst.is_some() || self.scratch.lookup(new_parent, new_name).is_some();
        if mode == RenameMode::NoReplace && exists {
            return Err(Error::new(
                libc::EEXIST,
                format!("{}/{new_name} exists", tree.path(new_parent)),
            ));
        }
        let Some(src) = self.scratch.lookup(parent, name) else {
            return Err(match tree.lookup(parent, name) {
                Some(_) => Error::new(
                    libc::EPERM,
                    format!("{}/{name} cannot be moved or renamed", tree.path(parent)),
                ),
                None => Error::not_found(format!("{}/{name}", tree.path(parent))),
            });
        };
        if let Some(dst) = dst {
            if tree.node(dst).is_none_or(|n| n.write.is_none()) {
                return Err(self.not_writable(tree, dst));
            }
            let data = self.scratch.bytes(src)?;
            let _one_at_a_time = self.commit_lock.lock().unwrap_or_else(|e| e.into_inner());
            let mut inval = self.commit_bytes(dst, &data)?;
            // Whoever holds the scratch inode (the kernel, for the new name) now holds the
            // file; new lookups of the name find the file's own inode.
            self.scratch.became(src, dst);
            inval.inodes.push(src);
            inval.entries.push((new_parent, new_name.to_string()));
            return Ok(inval);
        }
        if tree.children(new_parent).is_none() || !super::attr::dir_is_writable(tree, new_parent) {
            return Err(Error::new(
                libc::EACCES,
                format!("cannot move a scratch file into {}", tree.path(new_parent)),
            ));
        }
        self.scratch.rename(src, new_parent, new_name);
        Ok(Invalidate::default())
    }

    /// Deletes a scratch file; tree files cannot be deleted.
    pub fn unlink(&self, parent: Ino, name: &str) -> Result<()> {
        if self.options.read_only {
            return Err(Fs::read_only_error());
        }
        if let Some(ino) = self.scratch.lookup(parent, name) {
            self.scratch.remove(ino);
            return Ok(());
        }
        let tree = self.tree();
        match tree.lookup(parent, name) {
            Some(_) => Err(Error::new(
                libc::EPERM,
                format!(
                    "{}/{name} is part of the model and cannot be deleted",
                    tree.path(parent)
                ),
            )),
            None => Err(Error::not_found(format!("{}/{name}", tree.path(parent)))),
        }
    }
}
