//! Changes to the model files that ptefs did not make (docs/writes.md#changes-behind-the-mount),
//! and what readers see across any change (docs/writes.md#readers-during-a-commit).
//!
//! Each model file carries the stamp (size, modification and change times) ptefs last knew
//! it by. A different stamp, or a name that now names another file, means someone else
//! changed it: `cp other.ptd model.ptd`, `dd conv=notrunc`, `truncate`, a rename over it.
//! The files are checked at every open, before and after every read of their bytes, at
//! every commit, and whenever the daemon's watch reports an event on them.
//!
//! Invariants:
//! - Never a mix of two models: once a change is seen, no reply carries bytes of the changed
//!   file until a new snapshot is made from the file as it is now (the same file changed in
//!   place: re-opened and re-parsed, every cached page and attribute dropped), or, when the
//!   name now names another file or the file no longer parses, every read and open fails
//!   with `ESTALE` naming the file and the change, until the mount is remade.
//! - A handle sees one version of its file: the generation of the snapshot at its open is
//!   kept, and a read through it after the bytes it shows changed (by a commit of this
//!   mount, or behind it) fails with `ESTALE` instead of returning new bytes after old ones.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::Fs;
use crate::error::{Error, Result};
use crate::tree::{Ino, Tree};

/// What the mount knows of changes: the snapshots' generations, which inodes changed when,
/// and why the mount can no longer serve the model, when it cannot.
#[derive(Default)]
pub(super) struct Changes {
    /// Bumped at every change of what a file shows.
    generation: AtomicU64,
    /// The generation of the last change of every file at once (a new snapshot).
    all_changed_at: AtomicU64,
    /// The generation of the last change of single files (in-place commits).
    changed_at: Mutex<HashMap<Ino, u64>>,
    /// Why the model cannot be served (replaced, or no longer parsing), when it cannot.
    stale: Mutex<Option<String>>,
}

impl Changes {
    /// The generation now: what a handle opened now has seen.
    pub fn now(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records that the bytes of `inodes` changed.
    pub fn changed(&self, inodes: &[Ino]) {
        let g = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let mut at = self.changed_at.lock().unwrap_or_else(|e| e.into_inner());
        for &i in inodes {
            at.insert(i, g);
        }
    }

    /// Records that every file changed (a new snapshot).
    pub fn all_changed(&self) {
        let g = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.all_changed_at.store(g, Ordering::Release);
        self.changed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Whether the bytes `ino` shows changed after generation `seen`.
    pub fn changed_since(&self, ino: Ino, seen: u64) -> bool {
        if self.all_changed_at.load(Ordering::Acquire) > seen {
            return true;
        }
        let at = self.changed_at.lock().unwrap_or_else(|e| e.into_inner());
        at.get(&ino).is_some_and(|&g| g > seen)
    }

    fn stale(&self) -> Option<String> {
        self.stale.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_stale(&self, why: String) {
        *self.stale.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }
}

/// The refusal of a read or open while the mount cannot serve the model.
fn stale_error(why: &str) -> Error {
    Error::new(libc::ESTALE, why.to_string())
}

impl Fs {
    /// Fails while the mount cannot serve the model (see the module's invariants).
    pub(super) fn refuse_if_stale(&self) -> Result<()> {
        match self.changes.stale() {
            Some(why) => Err(stale_error(&why)),
            None => Ok(()),
        }
    }

    /// Checks every model file against what ptefs last knew of it; when one was changed by
    /// someone else, makes a new snapshot of the files as they are, or marks the mount stale.
    /// `names` also checks that the paths still name the files opened (a rename over one
    /// leaves the opened file as it was). Returns an error when the mount cannot serve the
    /// model now, or the snapshot it was asked about is gone.
    pub fn check_files(&self, names: bool) -> Result<()> {
        self.refuse_if_stale()?;
        if changed_file(&self.tree(), names).is_none() {
            return Ok(());
        }
        // One change handled at a time, and never during a commit of ours.
        let _one_at_a_time = self.commit_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.check_files_locked(names)
    }

    /// `check_files`, with the commit lock held by the caller.
    pub(super) fn check_files_locked(&self, names: bool) -> Result<()> {
        self.refuse_if_stale()?;
        let tree = self.tree();
        let Some((file, how)) = changed_file(&tree, names) else {
            return Ok(());
        };
        let now = self.tree();
        if !std::sync::Arc::ptr_eq(&now, &tree) {
            // Someone else made a new snapshot meanwhile.
            return self.refuse_if_stale();
        }
        let path = tree.model.files[file].path.display().to_string();
        if let Err(why) = tree.model.files[file].still_named() {
            return Err(self.go_stale(format!("{why}: remount to see what its name holds now")));
        }
        match super::commit::reload(&tree, false) {
            Ok(new_tree) => {
                log::warn!(
                    "{path} changed behind the mount ({how}): showing it anew; files opened before fail with ESTALE"
                );
                let entries = tree.built_entries();
                let inodes = tree.built_inodes();
                self.replace_tree(new_tree);
                self.changes.all_changed();
                let mut inval = super::invalidate::Invalidate::inodes(inodes);
                inval.entries = entries;
                inval.send(&*self.invalidator);
                Ok(())
            }
            Err(e) => Err(self.go_stale(format!(
                "{path} changed behind the mount ({how}) and cannot be read as a model now ({e}); remount it once it is whole"
            ))),
        }
    }

    /// Marks the mount stale for `why`, drops what the kernel cached, and returns the error.
    fn go_stale(&self, why: String) -> Error {
        log::error!("{why}");
        self.changes.set_stale(why.clone());
        self.changes.all_changed();
        self.invalidator.inodes(self.tree().built_inodes(), false);
        stale_error(&why)
    }

    /// Fails a read through a handle opened at generation `opened` once the bytes `ino`
    /// shows changed since: the reader would otherwise see old bytes, then new ones.
    pub(super) fn refuse_changed_since(&self, tree: &Tree, ino: Ino, opened: u64) -> Result<()> {
        if self.changes.changed_since(ino, opened) {
            return Err(Error::new(
                libc::ESTALE,
                format!(
                    "{}: its bytes changed since this file was opened; open it again to read them",
                    tree.path(ino)
                ),
            ));
        }
        Ok(())
    }
}

/// The first model file of `tree` that changed behind the mount, and how; with `names`, a
/// file whose name now names another file counts too.
fn changed_file(tree: &Tree, names: bool) -> Option<(usize, String)> {
    tree.model.files.iter().enumerate().find_map(|(i, f)| {
        if let Some(how) = f.changed_behind() {
            return Some((i, how));
        }
        if names {
            if let Err(why) = f.still_named() {
                return Some((i, why.to_string()));
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_see_changes_after_their_open_only() {
        let c = Changes::default();
        let opened = c.now();
        assert!(!c.changed_since(5, opened));
        c.changed(&[5]);
        assert!(c.changed_since(5, opened));
        assert!(!c.changed_since(6, opened));
        let later = c.now();
        assert!(!c.changed_since(5, later));
        c.all_changed();
        assert!(c.changed_since(6, later));
    }
}
