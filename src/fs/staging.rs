//! Staged content of tree files being written: the bytes a commit will validate.
//!
//! Invariants: a file has one staging area shared by all its open writers, so writers in turn
//! see each other's bytes; nothing is copied until the first write or truncate; `dirty`
//! says whether the staged bytes differ from what was last committed.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::scratch::{resize, window, write_at};
use crate::error::Result;
use crate::tree::Ino;

#[derive(Debug, Default)]
struct Staged {
    /// None until the first write or truncate: opening alone copies nothing.
    data: Option<Vec<u8>>,
    dirty: bool,
    /// Open write handles of the file.
    writers: usize,
}

#[derive(Default)]
pub(super) struct Staging {
    files: Mutex<HashMap<Ino, Staged>>,
}

/// An empty buffer with room for `capacity` staged bytes. A large one asks for transparent
/// huge pages: touching 64 MiB of new 4 KiB pages costs more than copying the bytes into them.
pub(super) fn staging_buffer(capacity: usize) -> Vec<u8> {
    const PAGE: usize = 4096;
    let v = Vec::with_capacity(capacity);
    if capacity >= 2 << 20 {
        let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (v.as_ptr() as usize + capacity) / PAGE * PAGE;
        // SAFETY: advice on whole pages inside the buffer's own allocation; it changes
        // how they are backed, never their contents.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end.saturating_sub(start),
                libc::MADV_HUGEPAGE,
            )
        };
    }
    v
}

impl Staging {
    fn files(&self) -> MutexGuard<'_, HashMap<Ino, Staged>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A writer opens `ino`; with `truncate_to`, the staged content starts empty, with room
    /// for that many bytes.
    pub fn open_writer(&self, ino: Ino, truncate_to: Option<usize>) {
        let mut files = self.files();
        let s = files.entry(ino).or_default();
        s.writers += 1;
        if let Some(capacity) = truncate_to {
            s.data = Some(staging_buffer(capacity));
            s.dirty = true;
        }
    }

    /// A writer of `ino` is gone; the staging area goes with the last one.
    pub fn close_writer(&self, ino: Ino) {
        let mut files = self.files();
        if let Some(s) = files.get_mut(&ino) {
            s.writers = s.writers.saturating_sub(1);
            if s.writers == 0 {
                files.remove(&ino);
            }
        }
    }

    /// Applies `change` to the staged bytes of `ino`, first copying the committed content
    /// (`current`) if nothing was staged yet. Returns the number of open writers.
    pub fn change(
        &self, ino: Ino, current: impl FnOnce() -> Result<Vec<u8>>,
        change: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<usize> {
        let mut files = self.files();
        let s = files.entry(ino).or_default();
        if s.data.is_none() {
            s.data = Some(current()?);
        }
        change(s.data.as_mut().expect("staged"))?;
        s.dirty = true;
        Ok(s.writers)
    }

    pub fn write(
        &self, ino: Ino, offset: u64, data: &[u8], current: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<()> {
        self.change(ino, current, |buf| write_at(buf, offset, data))
            .map(|_| ())
    }

    /// Resizes the staged bytes; returns the number of open writers.
    pub fn set_len(
        &self, ino: Ino, size: u64, current: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<usize> {
        self.change(ino, current, |buf| resize(buf, size))
    }

    /// Size of the staged bytes while they differ from the committed ones.
    pub fn size(&self, ino: Ino) -> Option<u64> {
        self.files()
            .get(&ino)
            .filter(|s| s.dirty)
            .and_then(|s| s.data.as_ref())
            .map(|d| d.len() as u64)
    }

    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Option<Vec<u8>> {
        self.files()
            .get(&ino)
            .filter(|s| s.dirty)
            .and_then(|s| s.data.as_deref())
            .map(|d| window(d, offset, size))
    }

    /// Takes the staged bytes of `ino` for a commit, if a writer changed them.
    pub fn take_dirty(&self, ino: Ino) -> Option<Vec<u8>> {
        let mut files = self.files();
        let s = files.get_mut(&ino).filter(|s| s.dirty)?;
        s.dirty = false;
        Some(s.data.take().unwrap_or_default())
    }

    /// After a successful commit: writers still open continue from the committed bytes.
    pub fn committed(&self, ino: Ino, data: Vec<u8>) {
        if let Some(s) = self.files().get_mut(&ino) {
            s.data = Some(data);
        }
    }

    /// After a refused commit or a last close: drops what was staged (`take_dirty` already
    /// took it) and the staging area when no writer holds it.
    pub fn discard_if_unused(&self, ino: Ino) {
        let mut files = self.files();
        if files.get(&ino).is_some_and(|s| s.writers == 0) {
            files.remove(&ino);
        }
    }

    /// Files whose staged bytes wait for a commit.
    pub fn dirty(&self) -> Vec<Ino> {
        self.files()
            .iter()
            .filter(|(_, s)| s.dirty)
            .map(|(&i, _)| i)
            .collect()
    }
}
