//! Open file handles: what each one reads and writes, and a writer's own staged content.
//!
//! Invariants: a handle's target is resolved once, at open: a tree file (a renamed scratch
//! file's inode resolves to the file it replaced) or a scratch file. A writer of a tree file
//! stages its own copy (per handle: another writer's bytes, or a refusal of them, never mix
//! with it); until it is committed, other opens read the committed bytes. Each handle has its
//! own lock, so handles do not wait for each other's copies or commits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::staging::Staged;
use crate::error::{Error, Result};
use crate::tree::Ino;

/// What an open handle reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// A file of the tree: writes are staged, then committed into the model file.
    Tree(Ino),
    /// An editor's scratch file, held by the daemon.
    Scratch(Ino),
}

pub(super) struct Handle {
    pub target: Target,
    pub writable: bool,
    /// A writer's copy of a tree file: None until its first write or truncate (opening
    /// alone copies nothing), then the content it will commit.
    pub staged: Option<Staged>,
    /// The staged content changed since the last commit (an `O_TRUNC` open counts).
    pub dirty: bool,
    /// Opened with `O_TRUNC` and neither written nor resized since: a `close` of a
    /// duplicate now (`cmd > file`: the shell closes one before `cmd` writes) must not
    /// commit the empty content ahead of what comes next.
    pub truncated_only: bool,
    /// A commit of the content as it is now was refused or failed, and reported: the last
    /// close must not try it again behind the user's back.
    pub refused: bool,
    /// The generation of the files' changes at the open (see `external`): a read through the
    /// handle after the bytes it shows changed fails instead of mixing versions.
    pub opened_at: u64,
    /// The thread that opened it, when known (0 otherwise): the truncation of an `O_TRUNC`
    /// open arrives after the open, from the same thread.
    pub opener: u32,
}

impl Handle {
    /// EBADF unless the handle was opened for writing.
    pub fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(Error::new(
                libc::EBADF,
                "the file was not opened for writing",
            ))
        }
    }
}

pub(super) type Shared = Arc<Mutex<Handle>>;

pub(super) fn lock(h: &Shared) -> MutexGuard<'_, Handle> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
pub(super) struct Handles {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Shared>>,
}

impl Handles {
    fn open(&self) -> MutexGuard<'_, HashMap<u64, Shared>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.open().insert(fh, Arc::new(Mutex::new(handle)));
        fh
    }

    pub fn get(&self, fh: u64) -> Result<Shared> {
        self.open()
            .get(&fh)
            .cloned()
            .ok_or_else(|| Error::new(libc::EBADF, format!("unknown file handle {fh}")))
    }

    pub fn remove(&self, fh: u64) -> Option<Shared> {
        self.open().remove(&fh)
    }

    pub fn all(&self) -> Vec<Shared> {
        self.open().values().cloned().collect()
    }
}
