//! File attributes as the tree shows them (docs/tree.md#modes-owners-and-times: modes, sizes,
//! owner, times).

use std::time::SystemTime;

use super::{Fs, Identity};
use crate::error::{Error, Result};
use crate::tree::{Content, Ino, Tree};

/// `st_blksize`: large, so that tools read in big chunks.
pub const BLOCK_SIZE: u32 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Directory,
    RegularFile,
}

#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: Ino,
    pub size: u64,
    pub kind: FileType,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub blksize: u32,
}

impl Attr {
    /// A node's attributes, with the owner and times of the model file `id` describes.
    fn shown(ino: Ino, size: u64, kind: FileType, perm: u16, nlink: u32, id: &Identity) -> Attr {
        Attr {
            ino,
            size,
            kind,
            perm,
            nlink,
            uid: id.uid,
            gid: id.gid,
            atime: id.atime,
            mtime: id.mtime,
            ctime: id.ctime,
            blksize: BLOCK_SIZE,
        }
    }

    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(512)
    }
}

/// A directory is writable (for editors' scratch files) when it holds a writable file.
/// Permission bits that never show more than the model file's own `mode` allows: a file is
/// readable by whom the model is, and writable (when the tree makes it writable) by whom
/// the model is; a directory is searchable by whom may read it.
pub fn perm(model_mode: u32, dir: bool, writable: bool) -> u16 {
    let read = model_mode & 0o444;
    let write = if writable { model_mode & 0o222 } else { 0 };
    let search = if dir { read >> 2 } else { 0 };
    (read | write | search) as u16
}

pub fn dir_is_writable(tree: &Tree, ino: Ino) -> bool {
    // A lazy directory knows without being built.
    if let Some(lazy) = tree.lazy_dir(ino) {
        return lazy.writable;
    }
    tree.children(ino).is_some_and(|c| {
        c.iter()
            .any(|&c| tree.node(c).is_some_and(|n| n.write.is_some()))
    })
}

impl Fs {
    pub(super) fn attr_in(&self, tree: &Tree, ino: Ino) -> Result<Attr> {
        if let Some(size) = self.scratch.size(ino) {
            return Ok(self.scratch_attr(tree, ino, size));
        }
        if self.is_errors(ino) {
            // Read-only, readable by whom may read the model.
            let id = self.identity_of(tree, crate::tree::ROOT);
            let size = self.refusals.text().len() as u64;
            let perm = perm(id.mode, false, false);
            return Ok(Attr::shown(ino, size, FileType::RegularFile, perm, 1, &id));
        }
        let node = tree
            .node(ino)
            .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
        let id = self.identity_of(tree, ino);
        let writable = !self.options.read_only;
        let (kind, perm, nlink) = match &node.content {
            Content::Dir(children) => {
                let subdirs = children
                    .iter()
                    .filter(|&&c| tree.node(c).is_some_and(|n| n.is_dir()))
                    .count() as u32;
                let perm = perm(id.mode, true, writable && dir_is_writable(tree, ino));
                (FileType::Directory, perm, 2 + subdirs)
            }
            // Known without building it: it holds no directory.
            Content::LazyDir(_) => {
                let perm = perm(id.mode, true, writable && dir_is_writable(tree, ino));
                (FileType::Directory, perm, 2)
            }
            _ => {
                let perm = perm(id.mode, false, writable && node.write.is_some());
                (FileType::RegularFile, perm, 1)
            }
        };
        Ok(Attr::shown(ino, tree.size(ino), kind, perm, nlink, &id))
    }

    /// A scratch file: an editor's, shown writable by the owner of the model file whose
    /// tree holds its directory.
    fn scratch_attr(&self, tree: &Tree, ino: Ino, size: u64) -> Attr {
        let parent = self.scratch.parent(ino).unwrap_or(crate::tree::ROOT);
        let id = self.identity_of(tree, parent);
        let perm = perm(id.mode, false, true);
        Attr::shown(ino, size, FileType::RegularFile, perm, 1, &id)
    }
}

#[cfg(test)]
mod tests {
    use super::perm;

    #[test]
    fn modes_never_show_more_than_the_model_allows() {
        assert_eq!(perm(0o644, false, true), 0o644);
        assert_eq!(perm(0o644, false, false), 0o444);
        assert_eq!(perm(0o644, true, true), 0o755);
        assert_eq!(perm(0o644, true, false), 0o555);
        assert_eq!(perm(0o600, false, true), 0o600);
        assert_eq!(perm(0o600, false, false), 0o400);
        assert_eq!(perm(0o600, true, false), 0o500);
        assert_eq!(perm(0o640, true, true), 0o750);
        assert_eq!(perm(0o664, false, true), 0o664);
    }
}
