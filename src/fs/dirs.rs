//! Directory listings and directory handles.
//!
//! Invariant: a listing is taken at the first read of a handle (and again when it is read
//! from offset 0, as after `rewinddir`) and served from there at every offset, so a listing
//! read in several requests is consistent even when a commit lands in between. The entry
//! at index `i` has the cookie (offset) `i + 1`, which is where the next read starts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Attr, Fs, Opened, TTL};
use crate::error::{Error, Result};
use crate::tree::{Ino, Tree};

/// One name of a listing with its attributes (readdirplus answers both at once).
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: String,
    pub attr: Attr,
}

/// The entries of a listing from an offset on, each with its cookie, and how long the
/// kernel may keep the attributes they carry.
#[derive(Debug, Clone)]
pub struct DirPage {
    listing: Arc<[DirEntry]>,
    from: usize,
    pub ttl: Duration,
}

impl DirPage {
    /// `(cookie, entry)` pairs: the cookie is the offset of the entry after this one.
    pub fn entries(&self) -> impl Iterator<Item = (u64, &DirEntry)> {
        self.listing
            .iter()
            .enumerate()
            .skip(self.from)
            .map(|(i, e)| (i as u64 + 1, e))
    }
}

/// An open directory: which one, and its listing once read.
struct DirHandle {
    ino: Ino,
    listing: Option<Arc<[DirEntry]>>,
}

#[derive(Default)]
pub(super) struct DirHandles {
    next: AtomicU64,
    open: Mutex<HashMap<u64, DirHandle>>,
}

impl DirHandles {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, DirHandle>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// ENOTDIR or ENOENT for `ino`, which has no children.
fn not_a_dir(tree: &Tree, ino: Ino) -> Error {
    match tree.node(ino) {
        Some(_) => Error::new(
            libc::ENOTDIR,
            format!("{} is not a directory", tree.path(ino)),
        ),
        None => Error::not_found(format!("inode {ino}")),
    }
}

impl Fs {
    /// Directory entries with their attributes, `.` and `..` first; names an unlink hid are
    /// left out.
    pub fn list(&self, ino: Ino) -> Result<Vec<DirEntry>> {
        let tree = self.tree();
        let children = tree.children(ino).ok_or_else(|| not_a_dir(&tree, ino))?;
        self.show_expired();
        let hidden = self.hidden_in(&tree, ino);
        let scratch = self.scratch.entries(ino);
        let mut out = Vec::with_capacity(children.len() + scratch.len() + 2);
        let entry = |name: String, ino: Ino| -> Result<DirEntry> {
            Ok(DirEntry {
                name,
                attr: self.attr_in(&tree, ino)?,
            })
        };
        out.push(entry(".".to_string(), ino)?);
        let parent = tree.node(ino).map_or(ino, |n| n.parent);
        out.push(entry("..".to_string(), parent)?);
        for &c in children {
            let Some(name) = tree.node(c).map(|n| &n.name) else {
                continue;
            };
            if !hidden.contains(name) {
                out.push(entry(name.clone(), c)?);
            }
        }
        for (name, s) in scratch {
            if let Ok(e) = entry(name, s) {
                out.push(e);
            }
        }
        if ino == crate::tree::ROOT
            && self.errors_file
            && tree.lookup(ino, super::ERRORS_NAME).is_none()
        {
            out.push(entry(super::ERRORS_NAME.to_string(), super::ERRORS_INO)?);
        }
        Ok(out)
    }

    /// Opens a directory. The kernel may cache its listing across opens (it drops it itself
    /// when a name is created, removed or renamed through the mount), except while the
    /// directory holds a hidden name, which comes back without any such request.
    pub fn opendir(&self, ino: Ino) -> Result<Opened> {
        let tree = self.tree();
        if tree.children(ino).is_none() {
            return Err(not_a_dir(&tree, ino));
        }
        self.show_expired();
        let cache = self.hidden_in(&tree, ino).is_empty();
        let fh = self.dirs.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.dirs
            .open()
            .insert(fh, DirHandle { ino, listing: None });
        Ok(Opened {
            fh,
            keep_cache: cache,
            direct_io: false,
            cache_dir: cache,
        })
    }

    /// The entries of open directory `fh` from `offset` (a cookie an earlier page gave, or
    /// 0) on. The listing is taken at the first read and at every read from offset 0.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<DirPage> {
        let held = {
            let open = self.dirs.open();
            let h = open
                .get(&fh)
                .ok_or_else(|| Error::new(libc::EBADF, format!("unknown directory handle {fh}")))?;
            (h.ino, h.listing.clone().filter(|_| offset != 0))
        };
        let listing = match held {
            (_, Some(l)) => l,
            (ino, None) => {
                let l: Arc<[DirEntry]> = self.list(ino)?.into();
                if let Some(h) = self.dirs.open().get_mut(&fh) {
                    h.listing = Some(l.clone());
                }
                l
            }
        };
        Ok(DirPage {
            from: usize::try_from(offset).map_or(listing.len(), |o| o.min(listing.len())),
            listing,
            ttl: TTL,
        })
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.open().remove(&fh);
    }
}
