//! Directory listings and directory handles.
//!
//! Invariant: a listing is taken once per `opendir` and served from there at every offset,
//! so a listing read in several requests is consistent even when a commit lands in between.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{Attr, Fs, Opened};
use crate::error::{Error, Result};
use crate::tree::Ino;

/// One name of a listing with its attributes (readdirplus answers both at once).
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: String,
    pub attr: Attr,
}

#[derive(Default)]
pub(super) struct DirHandles {
    next: AtomicU64,
    listings: Mutex<HashMap<u64, Arc<[DirEntry]>>>,
}

impl Fs {
    /// Directory entries with their attributes, `.` and `..` first.
    pub fn list(&self, ino: Ino) -> Result<Vec<DirEntry>> {
        let tree = self.tree();
        let children = tree.children(ino).ok_or_else(|| match tree.node(ino) {
            Some(_) => Error::new(
                libc::ENOTDIR,
                format!("{} is not a directory", tree.path(ino)),
            ),
            None => Error::not_found(format!("inode {ino}")),
        })?;
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
            out.push(entry(tree.nodes[(c - 1) as usize].name.clone(), c)?);
        }
        for (name, s) in scratch {
            if let Ok(e) = entry(name, s) {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Opens a directory. The kernel may cache its listing across opens: it drops it itself
    /// when a name is created, removed or renamed through the mount.
    pub fn opendir(&self, ino: Ino) -> Result<Opened> {
        let tree = self.tree();
        if tree.children(ino).is_none() {
            return Err(match tree.node(ino) {
                Some(_) => Error::new(
                    libc::ENOTDIR,
                    format!("{} is not a directory", tree.path(ino)),
                ),
                None => Error::not_found(format!("inode {ino}")),
            });
        }
        let fh = self.dirs.next.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Opened {
            fh,
            keep_cache: true,
            direct_io: false,
            cache_dir: true,
        })
    }

    /// The listing of an open directory; the entry at index `i` has offset `i + 1`. The
    /// listing is taken at the first read (offset 0) and kept until `releasedir`.
    pub fn readdir(&self, ino: Ino, fh: u64, offset: u64) -> Result<Arc<[DirEntry]>> {
        let mut listings = self.dirs.listings.lock().unwrap_or_else(|e| e.into_inner());
        if offset != 0 {
            if let Some(l) = listings.get(&fh) {
                return Ok(l.clone());
            }
        }
        let l: Arc<[DirEntry]> = self.list(ino)?.into();
        listings.insert(fh, l.clone());
        Ok(l)
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs
            .listings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh);
    }
}
