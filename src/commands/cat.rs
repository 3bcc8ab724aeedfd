//! `ptefs cat`: the bytes of a file of the tree, as a read of the mount gives them.

use std::io::Write;

use super::{find, output};
use crate::error::{Error, Result};
use crate::fs::{FileType, Fs};

/// Writes a file's bytes, read in requests of the block size, as through the mount.
pub fn cat(fs: &Fs, path: &str, out: &mut dyn Write) -> Result<()> {
    let ino = find(fs, path)?;
    let attr = fs.getattr(ino)?;
    if attr.kind == FileType::Directory {
        return Err(Error::new(libc::EISDIR, format!("{path}: is a directory")));
    }
    let mut offset = 0u64;
    while offset < attr.size {
        let data = fs.read(ino, offset, crate::fs::BLOCK_SIZE)?;
        let bytes = data.bytes();
        if bytes.is_empty() {
            break;
        }
        out.write_all(bytes).map_err(output)?;
        offset += bytes.len() as u64;
    }
    out.flush().map_err(output)
}
