//! File attributes as the tree shows them (DESIGN.md §2: modes, sizes, owner, times).

use std::time::SystemTime;

use super::Fs;
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
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(512)
    }
}

/// A directory is writable (for editors' scratch files) when it holds a writable file.
pub fn dir_is_writable(tree: &Tree, ino: Ino) -> bool {
    tree.children(ino).is_some_and(|c| {
        c.iter()
            .any(|&c| tree.node(c).is_some_and(|n| n.write.is_some()))
    })
}

impl Fs {
    pub(super) fn attr_in(&self, tree: &Tree, ino: Ino) -> Result<Attr> {
        if let Some(size) = self.scratch.size(ino) {
            return Ok(self.scratch_attr(ino, size));
        }
        let node = tree
            .node(ino)
            .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
        let id = self.identity();
        let writable = !self.options.read_only;
        let (kind, perm, nlink) = match &node.content {
            Content::Dir(children) => {
                let subdirs = children
                    .iter()
                    .filter(|&&c| tree.node(c).is_some_and(|n| n.is_dir()))
                    .count() as u32;
                let perm = if writable && dir_is_writable(tree, ino) {
                    0o755
                } else {
                    0o555
                };
                (FileType::Directory, perm, 2 + subdirs)
            }
            _ => {
                let perm = if writable && node.write.is_some() {
                    0o644
                } else {
                    0o444
                };
                (FileType::RegularFile, perm, 1)
            }
        };
        Ok(Attr {
            ino,
            size: tree.size(ino),
            kind,
            perm,
            nlink,
            uid: id.uid,
            gid: id.gid,
            atime: id.atime,
            mtime: id.mtime,
            ctime: id.ctime,
            blksize: BLOCK_SIZE,
        })
    }

    /// A scratch file: an editor's, shown writable by the model file's owner.
    fn scratch_attr(&self, ino: Ino, size: u64) -> Attr {
        let id = self.identity();
        Attr {
            ino,
            size,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: id.uid,
            gid: id.gid,
            atime: id.atime,
            mtime: id.mtime,
            ctime: id.ctime,
            blksize: BLOCK_SIZE,
        }
    }
}
