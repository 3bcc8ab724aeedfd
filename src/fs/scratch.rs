//! Editors' scratch files: new files created in a writable directory, held by the daemon in
//! memory. They never reach the model file except by being renamed onto a writable file
//! (a commit of their bytes as that file's content); from then on the scratch inode stands
//! for that file, since the kernel knows the new name by it.
//!
//! Invariant: scratch inode numbers start at `SCRATCH_BASE`, far above any tree node, and are
//! never reused; names are unique per directory among scratch files and tree files alike
//! (the caller checks the tree).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};

use crate::error::{Error, Result};
use crate::tree::Ino;

/// Scratch files get inode numbers far above any tree node.
const SCRATCH_BASE: Ino = 1 << 48;

#[derive(Debug)]
struct Scratch {
    parent: Ino,
    name: String,
    data: Vec<u8>,
}

#[derive(Default)]
pub(super) struct ScratchFiles {
    files: Mutex<HashMap<Ino, Scratch>>,
    next: AtomicU64,
    /// Scratch inodes renamed onto a tree file, and that file.
    renamed: RwLock<HashMap<Ino, Ino>>,
}

fn not_found(ino: Ino) -> Error {
    Error::not_found(format!("scratch inode {ino}"))
}

/// Writes `data` at `offset` of `buf`, growing it with zeros.
pub(super) fn write_at(buf: &mut Vec<u8>, offset: u64, data: &[u8]) -> Result<()> {
    let end = offset
        .checked_add(data.len() as u64)
        .and_then(|e| usize::try_from(e).ok())
        .ok_or_else(|| {
            Error::new(
                libc::EFBIG,
                format!("write at offset {offset} is too large"),
            )
        })?;
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[offset as usize..end].copy_from_slice(data);
    Ok(())
}

/// `[offset, offset + size)` of `data`, clamped to its end.
pub(super) fn window(data: &[u8], offset: u64, size: u32) -> Vec<u8> {
    let start = offset.min(data.len() as u64) as usize;
    let end = offset.saturating_add(size as u64).min(data.len() as u64) as usize;
    data[start..end].to_vec()
}

pub(super) fn resize(buf: &mut Vec<u8>, size: u64) -> Result<()> {
    let size = usize::try_from(size)
        .map_err(|_| Error::new(libc::EFBIG, format!("size {size} is too large")))?;
    buf.resize(size, 0);
    Ok(())
}

impl ScratchFiles {
    fn files(&self) -> MutexGuard<'_, HashMap<Ino, Scratch>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with<T>(&self, ino: Ino, f: impl FnOnce(&mut Scratch) -> Result<T>) -> Result<T> {
        f(self.files().get_mut(&ino).ok_or_else(|| not_found(ino))?)
    }

    pub fn create(&self, parent: Ino, name: &str) -> Ino {
        let ino = SCRATCH_BASE + self.next.fetch_add(1, Ordering::Relaxed);
        self.files().insert(
            ino,
            Scratch {
                parent,
                name: name.to_string(),
                data: Vec::new(),
            },
        );
        ino
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

    pub fn size(&self, ino: Ino) -> Option<u64> {
        if ino < SCRATCH_BASE {
            return None;
        }
        self.files().get(&ino).map(|s| s.data.len() as u64)
    }

    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Option<Vec<u8>> {
        if ino < SCRATCH_BASE {
            return None;
        }
        self.files()
            .get(&ino)
            .map(|s| window(&s.data, offset, size))
    }

    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<()> {
        self.with(ino, |s| write_at(&mut s.data, offset, data))
    }

    pub fn set_len(&self, ino: Ino, size: u64) -> Result<()> {
        self.with(ino, |s| resize(&mut s.data, size))
    }

    pub fn bytes(&self, ino: Ino) -> Result<Vec<u8>> {
        self.with(ino, |s| Ok(s.data.clone()))
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
