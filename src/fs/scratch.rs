//! Editors' scratch files: new files created in a writable directory, held by the daemon
//! (in memory, spilling to an unnamed temporary file when large). They never reach the model
//! file except by being renamed onto a writable file (a commit of their bytes as that file's
//! content); from then on the scratch inode stands for that file, since the kernel knows the
//! new name by it.
//!
//! Invariant: scratch inode numbers start at `SCRATCH_BASE`, far above any tree node, and are
//! never reused; names are unique per directory among scratch files and tree files alike
//! (the caller checks the tree). Each scratch file belongs to the user who created it, and
//! one user holds at most `SizeLimits::scratch_files_per_user` of them (their bytes
//! together are bounded by the caller, `Fs::scratch_room`), so no user can fill the
//! daemon's memory or the disk with them (docs/writes.md#editors-scratch-files-and-deletes).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::staging::Staged;
use crate::error::{Error, Result};
use crate::quote;
use crate::tree::Ino;

/// Scratch files get inode numbers far above any tree node.
const SCRATCH_BASE: Ino = 1 << 48;

pub(super) type Content = Arc<Mutex<Staged>>;

pub(super) fn lock(c: &Content) -> MutexGuard<'_, Staged> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

struct Scratch {
    parent: Ino,
    name: String,
    /// The user who created it.
    owner: u32,
    content: Content,
}

#[derive(Default)]
pub(super) struct ScratchFiles {
    files: Mutex<HashMap<Ino, Scratch>>,
    next: AtomicU64,
    /// Scratch inodes renamed onto a tree file, and that file.
    renamed: RwLock<HashMap<Ino, Ino>>,
}

impl ScratchFiles {
    fn files(&self) -> MutexGuard<'_, HashMap<Ino, Scratch>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new scratch file of user `owner`, unless that user has `max_files` already (EDQUOT,
    /// saying so).
    pub fn create(
        &self, parent: Ino, name: &str, owner: u32, max_files: usize, content: Staged,
    ) -> Result<Ino> {
        let mut files = self.files();
        let held = files.values().filter(|s| s.owner == owner).count();
        if held >= max_files {
            return Err(Error::new(
                libc::EDQUOT,
                format!(
                    "cannot create {}: user {owner} has {held} scratch files in this mount, the most one user may have; remove some, or rename them onto the files they stand for",
                    quote::name(name)
                ),
            ));
        }
        let ino = SCRATCH_BASE + self.next.fetch_add(1, Ordering::Relaxed);
        files.insert(
            ino,
            Scratch {
                parent,
                name: name.to_string(),
                owner,
                content: Arc::new(Mutex::new(content)),
            },
        );
        Ok(ino)
    }

    /// The user a scratch file belongs to.
    pub fn owner(&self, ino: Ino) -> Option<u32> {
        self.files().get(&ino).map(|s| s.owner)
    }

    /// How many scratch files user `owner` has, and their bytes together, leaving out
    /// `except`.
    pub fn usage(&self, owner: u32, except: Ino) -> (usize, u64) {
        let contents: Vec<Content> = self
            .files()
            .iter()
            .filter(|(&ino, s)| s.owner == owner && ino != except)
            .map(|(_, s)| s.content.clone())
            .collect();
        let bytes = contents.iter().map(|c| lock(c).len()).sum();
        (contents.len(), bytes)
    }

    /// The directory a scratch file is in.
    pub fn parent(&self, ino: Ino) -> Option<Ino> {
        self.files().get(&ino).map(|s| s.parent)
    }

    pub fn contains(&self, ino: Ino) -> bool {
        ino >= SCRATCH_BASE && self.files().contains_key(&ino)
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Option<Ino> {
        self.files()
            .iter()
            .find(|(_, s)| s.parent == parent && s.name == name)
            .map(|(&ino, _)| ino)
    }

    /// Scratch files of a directory, for listings, in name order.
    pub fn entries(&self, parent: Ino) -> Vec<(String, Ino)> {
        let mut v: Vec<_> = self
            .files()
            .iter()
            .filter(|(_, s)| s.parent == parent)
            .map(|(&ino, s)| (s.name.clone(), ino))
            .collect();
        v.sort();
        v
    }

    /// The content of scratch file `ino`, if it is one.
    pub fn content(&self, ino: Ino) -> Option<Content> {
        if ino < SCRATCH_BASE {
            return None;
        }
        self.files().get(&ino).map(|s| s.content.clone())
    }

    pub fn size(&self, ino: Ino) -> Option<u64> {
        self.content(ino).map(|c| lock(&c).len())
    }

    pub fn remove(&self, ino: Ino) {
        self.files().remove(&ino);
    }

    /// Moves scratch file `ino` to `new_parent/new_name`, replacing a scratch file there.
    pub fn rename(&self, ino: Ino, new_parent: Ino, new_name: &str) {
        let mut files = self.files();
        if let Some(existing) = files
            .iter()
            .find(|(&i, s)| i != ino && s.parent == new_parent && s.name == new_name)
            .map(|(&i, _)| i)
        {
            files.remove(&existing);
        }
        if let Some(s) = files.get_mut(&ino) {
            s.parent = new_parent;
            s.name = new_name.to_string();
        }
    }

    /// Records that scratch inode `ino` now stands for tree file `target`, and forgets it.
    pub fn became(&self, ino: Ino, target: Ino) {
        self.remove(ino);
        self.renamed
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino, target);
    }

    /// The tree file a scratch inode was renamed onto, else `ino` itself.
    pub fn canonical_ino(&self, ino: Ino) -> Ino {
        if ino < SCRATCH_BASE {
            return ino;
        }
        let renamed = self.renamed.read().unwrap_or_else(|e| e.into_inner());
        renamed.get(&ino).copied().unwrap_or(ino)
    }
}
