//! The filesystem without FUSE: every operation the kernel can ask for, answered from the
//! current `Tree`, with errors as errno values. `crate::fuse` only translates.
//!
//! Invariants: a request works on one snapshot (`Arc<Tree>`) from start to end, so a reader
//! sees the old or the new file after a commit, never a mix; nothing the kernel sends can make
//! an operation panic (unknown inodes and handles are `ENOENT`/`EBADF`); reads never touch a
//! mapped byte beyond the backing file's current size.

mod attr;
mod read;
mod write;

pub use attr::{Attr, FileType};
pub use read::ReadData;
pub use write::{is_scratch, Invalidate, SetAttr, SCRATCH_BASE};

use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use crate::tree::{Ino, Tree};

/// An errno with the reason, for the log and for offline commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    pub errno: i32,
    pub message: String,
}

impl FsError {
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        FsError {
            errno,
            message: message.into(),
        }
    }

    pub fn not_found(what: impl std::fmt::Display) -> Self {
        FsError::new(libc::ENOENT, format!("{what}: no such file or directory"))
    }
}

impl std::fmt::Display for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FsError {}

pub type FsResult<T> = Result<T, FsError>;

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub read_only: bool,
}

/// Ownership and times shown for every node: those of the mounted file.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

impl Identity {
    pub fn of(meta: &std::fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        let at = |secs: i64, nanos: i64| {
            let d =
                std::time::Duration::new(secs.unsigned_abs(), nanos.clamp(0, 999_999_999) as u32);
            if secs >= 0 {
                SystemTime::UNIX_EPOCH + d
            } else {
                SystemTime::UNIX_EPOCH - d
            }
        };
        Identity {
            uid: meta.uid(),
            gid: meta.gid(),
            atime: at(meta.atime(), meta.atime_nsec()),
            mtime: at(meta.mtime(), meta.mtime_nsec()),
            ctime: at(meta.ctime(), meta.ctime_nsec()),
        }
    }
}

pub struct Fs {
    tree: RwLock<Arc<Tree>>,
    identity: RwLock<Identity>,
    pub options: Options,
    writes: write::WriteState,
    /// Held for reading while mapped bytes are handed out, for writing while a commit
    /// changes them in place, so no reply mixes old and new bytes.
    gate: RwLock<()>,
}

impl Fs {
    pub fn new(tree: Tree, options: Options) -> Fs {
        let identity = tree.model.files[0]
            .file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map(|m| Identity::of(&m))
            .unwrap_or(Identity {
                uid: 0,
                gid: 0,
                atime: SystemTime::UNIX_EPOCH,
                mtime: SystemTime::UNIX_EPOCH,
                ctime: SystemTime::UNIX_EPOCH,
            });
        Fs {
            tree: RwLock::new(Arc::new(tree)),
            identity: RwLock::new(identity),
            options,
            writes: write::WriteState::default(),
            gate: RwLock::new(()),
        }
    }

    /// The current snapshot.
    pub fn tree(&self) -> Arc<Tree> {
        self.tree.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the snapshot after a commit.
    pub fn replace_tree(&self, tree: Tree) {
        let old = std::mem::replace(
            &mut *self.tree.write().unwrap_or_else(|e| e.into_inner()),
            Arc::new(tree),
        );
        self.refresh_identity();
        // Unmapping a large file frees its page tables, which takes a quarter of a second
        // per GiB: do it off the request path. (Should the thread not start, the closure is
        // dropped here, which unmaps inline.)
        let _ = std::thread::Builder::new()
            .name("ptefs-unmap".into())
            .spawn(move || drop(old));
    }

    /// Takes the model file's times again, after a commit changed them.
    pub(crate) fn refresh_identity(&self) {
        let tree = self.tree();
        if let Some(meta) = tree.model.files[0]
            .file
            .as_ref()
            .and_then(|f| f.metadata().ok())
        {
            *self.identity.write().unwrap_or_else(|e| e.into_inner()) = Identity::of(&meta);
        }
    }

    pub fn identity(&self) -> Identity {
        *self.identity.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> FsResult<Attr> {
        let tree = self.tree();
        if tree.children(parent).is_none() {
            return Err(match tree.node(parent) {
                Some(_) => {
                    FsError::new(libc::ENOTDIR, format!("inode {parent} is not a directory"))
                }
                None => FsError::not_found(format!("inode {parent}")),
            });
        }
        let ino = tree
            .lookup(parent, name)
            .or_else(|| self.scratch_lookup(parent, name))
            .ok_or_else(|| FsError::not_found(format!("{}/{name}", tree.path(parent))))?;
        self.attr_in(&tree, ino)
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.attr_in(&self.tree(), self.resolve(ino))
    }

    /// Directory entries with their attributes, `.` and `..` first.
    pub fn readdir(&self, ino: Ino) -> FsResult<Vec<(String, Attr)>> {
        let tree = self.tree();
        let children = tree.children(ino).ok_or_else(|| match tree.node(ino) {
            Some(_) => FsError::new(
                libc::ENOTDIR,
                format!("{} is not a directory", tree.path(ino)),
            ),
            None => FsError::not_found(format!("inode {ino}")),
        })?;
        let mut out = Vec::with_capacity(children.len() + 2);
        out.push((".".to_string(), self.attr_in(&tree, ino)?));
        let parent = tree.node(ino).map_or(ino, |n| n.parent);
        out.push(("..".to_string(), self.attr_in(&tree, parent)?));
        for &c in children {
            out.push((
                tree.nodes[(c - 1) as usize].name.clone(),
                self.attr_in(&tree, c)?,
            ));
        }
        for (name, s) in self.scratch_entries(ino) {
            if let Ok(a) = self.attr_in(&tree, s) {
                out.push((name, a));
            }
        }
        Ok(out)
    }

    /// A read as an owned value (offline commands, tests). The mount uses `read_with`.
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> FsResult<ReadData> {
        let ino = self.resolve(ino);
        let tree = self.tree();
        if let Some(staged) = self.staged_read(&tree, ino, offset, size) {
            return Ok(staged);
        }
        read::read(tree, ino, offset, size)
    }

    /// Hands `reply` the bytes of a read while no commit can change them.
    pub fn read_with<R>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        reply: impl FnOnce(&[u8]) -> R,
    ) -> FsResult<R> {
        let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let data = self.read(ino, offset, size)?;
        Ok(reply(data.bytes()))
    }

    /// The `user.ptefs.*` attributes of a node; scratch files have none.
    fn xattrs(&self, ino: Ino) -> FsResult<Vec<(String, String)>> {
        let ino = self.resolve(ino);
        if is_scratch(ino) {
            return self.getattr(ino).map(|_| Vec::new());
        }
        let tree = self.tree();
        if tree.node(ino).is_none() {
            return Err(FsError::not_found(format!("inode {ino}")));
        }
        Ok(tree.xattrs(ino))
    }

    pub fn listxattr(&self, ino: Ino) -> FsResult<Vec<String>> {
        Ok(self.xattrs(ino)?.into_iter().map(|(k, _)| k).collect())
    }

    pub fn getxattr(&self, ino: Ino, name: &str) -> FsResult<Vec<u8>> {
        self.xattrs(ino)?
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_bytes())
            .ok_or_else(|| {
                let path = self.tree().path(self.resolve(ino));
                FsError::new(libc::ENODATA, format!("{path}: no attribute {name}"))
            })
    }
}
