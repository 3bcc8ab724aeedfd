//! Open file handles: what each one writes to, and what happened through it.
//!
//! Invariant: a handle's target is resolved once, at open: a tree file (a renamed scratch
//! file's inode resolves to the file it replaced) or a scratch file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::tree::Ino;

/// What an open handle reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// A file of the tree: writes are staged, then committed into the model file.
    Tree(Ino),
    /// An editor's scratch file, held in memory.
    Scratch(Ino),
}

#[derive(Debug, Clone)]
pub(super) struct Handle {
    pub target: Target,
    pub writable: bool,
    /// Wrote or truncated since its last commit.
    pub wrote: bool,
    /// The refusal of a commit through this handle: every later write, truncate, flush and
    /// fsync through it fails the same way, so the final close reports it and no later write
    /// combines with bytes the refusal discarded.
    pub failed: Option<Error>,
}

#[derive(Default)]
pub(super) struct Handles {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Handle>>,
}

impl Handles {
    fn open(&self) -> MutexGuard<'_, HashMap<u64, Handle>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, target: Target, writable: bool) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.open().insert(
            fh,
            Handle {
                target,
                writable,
                wrote: false,
                failed: None,
            },
        );
        fh
    }

    /// Applies `update` to handle `fh` and returns what it was before.
    pub fn update(&self, fh: u64, update: impl FnOnce(&mut Handle)) -> Result<Handle> {
        let mut open = self.open();
        let h = open
            .get_mut(&fh)
            .ok_or_else(|| Error::new(libc::EBADF, format!("unknown file handle {fh}")))?;
        let before = h.clone();
        update(h);
        Ok(before)
    }

    pub fn remove(&self, fh: u64) -> Option<Handle> {
        self.open().remove(&fh)
    }
}
