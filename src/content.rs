//! New content for a model: where a writer's bytes come from (memory, or a range of a file
//! when its staged content spilled to disk), bytes a commit computed itself, and a
//! same-size write of a range of a model file. Content is read in bounded chunks, so a
//! commit of GiBs needs neither their size in memory nor a mapping of them.
//!
//! This is the vocabulary shared by everything that plans writes: the edit layer, and the
//! backends whose values are written through a conversion (re-quantization).
//!
//! Invariant: a `Source` never reaches past its own `len`; sub-ranges are checked.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::sharing::TensorId;

/// How much of a file source is read at a time.
pub const CHUNK: usize = 8 << 20;

/// New bytes a commit computed itself (re-quantized weights, scales), or a view of what
/// the writer staged.
#[derive(Debug)]
pub enum Bytes<'a> {
    Staged(Source<'a>),
    Owned(Vec<u8>),
}

impl Bytes<'_> {
    pub fn source(&self) -> Source<'_> {
        match self {
            Bytes::Staged(s) => *s,
            Bytes::Owned(v) => Source::Memory(v),
        }
    }
}

/// A same-size write: new bytes for a byte range, and the tensor they belong to (none for
/// raw segments and delegate payloads, which are not tensors).
#[derive(Debug)]
pub struct Write<'a> {
    pub location: Location,
    pub bytes: Bytes<'a>,
    pub of: Option<TensorId>,
}

#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    Memory(&'a [u8]),
    File {
        file: &'a File,
        offset: u64,
        len: u64,
    },
}

impl<'a> Source<'a> {
    pub fn len(&self) -> u64 {
        match self {
            Source::Memory(b) => b.len() as u64,
            Source::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `[offset, offset + len)` of this source.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Source<'a>> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "bytes {offset}+{len} lie outside content of {} bytes",
                    self.len()
                ))
            })?;
        Ok(match *self {
            Source::Memory(b) => Source::Memory(&b[offset as usize..end as usize]),
            Source::File {
                file, offset: base, ..
            } => Source::File {
                file,
                offset: base + offset,
                len,
            },
        })
    }

    /// Fills `buf` from `offset` of this source.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Source::Memory(b) => {
                let start = offset as usize;
                buf.copy_from_slice(&b[start..start + buf.len()]);
                Ok(())
            }
            Source::File {
                file, offset: base, ..
            } => file.read_exact_at(buf, base + offset),
        }
    }

    /// The first `n` bytes (all of them when shorter), for headers.
    pub fn head(&self, n: u64) -> Result<Vec<u8>> {
        let n = n.min(self.len());
        let mut out = vec![0u8; n as usize];
        self.read_at(0, &mut out)
            .map_err(|e| Error::io("read staged content", e))?;
        Ok(out)
    }

    /// Calls `f` with consecutive chunks of the content, in order.
    pub fn for_each_chunk(
        &self, buf: &mut Vec<u8>, mut f: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        match self {
            Source::Memory(b) => f(b),
            Source::File { len, .. } => {
                let mut at = 0;
                while at < *len {
                    let n = (*len - at).min(CHUNK as u64) as usize;
                    buf.resize(n, 0);
                    self.read_at(at, &mut buf[..n])?;
                    f(&buf[..n])?;
                    at += n as u64;
                }
                Ok(())
            }
        }
    }

    /// Writes the content at `at` of `out`: in the kernel from a file source when it can.
    pub fn write_to(&self, out: &File, at: u64, buf: &mut Vec<u8>) -> io::Result<()> {
        if let Source::File { file, offset, len } = self {
            if copy_in_kernel(file, *offset, out, at, *len)? == *len {
                return Ok(());
            }
        }
        let mut pos = at;
        self.for_each_chunk(buf, |chunk| {
            out.write_all_at(chunk, pos)?;
            pos += chunk.len() as u64;
            Ok(())
        })
    }

    /// Whether the content equals `other`.
    pub fn equals(&self, other: &[u8], buf: &mut Vec<u8>) -> bool {
        if self.len() != other.len() as u64 {
            return false;
        }
        let mut at = 0;
        let mut same = true;
        let read = self.for_each_chunk(buf, |chunk| {
            same = same && chunk == &other[at..at + chunk.len()];
            at += chunk.len();
            Ok(())
        });
        read.is_ok() && same
    }

    /// Whether the content equals as many bytes at `offset` of `other`. The comparison stops
    /// at the first difference and starts with a small read, doubling up to `CHUNK`: a
    /// changed tensor usually differs early, so telling it apart costs little whatever its
    /// size, and only content that is the same is read whole.
    pub fn equals_file_range(
        &self, other: &File, offset: u64, buf: &mut Vec<u8>,
    ) -> io::Result<bool> {
        const FIRST: u64 = 4 << 10;
        let mut at = 0;
        let mut step = FIRST;
        while at < self.len() {
            let n = step.min(self.len() - at) as usize;
            buf.resize(2 * n, 0);
            let (mine, theirs) = buf.split_at_mut(n);
            self.read_at(at, mine)?;
            other.read_exact_at(&mut theirs[..n], offset + at)?;
            if *mine != theirs[..n] {
                return Ok(false);
            }
            at += n as u64;
            step = (step * 2).min(CHUNK as u64);
        }
        Ok(true)
    }
}

/// `copy_file_range` of `len` bytes; returns how many it copied, fewer when the kernel
/// cannot copy between these files (the caller copies the rest through a buffer).
pub(crate) fn copy_in_kernel(
    src: &File, src_off: u64, dst: &File, dst_off: u64, len: u64,
) -> io::Result<u64> {
    let mut off_in = src_off as libc::loff_t;
    let mut off_out = dst_off as libc::loff_t;
    let mut left = len;
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        // SAFETY: both descriptors are open; the offsets are plain integers owned here.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                chunk,
                0,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP) => {
                    Ok(len - left)
                }
                Some(libc::EINTR) => continue,
                _ => Err(err),
            };
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the source is shorter than expected",
            ));
        }
        left -= n as u64;
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_file_range_finds_a_difference_anywhere_and_equal_content() {
        let len = 3 * CHUNK + 12345;
        let content: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, b"prefix").unwrap();
        std::io::Write::write_all(&mut file, &content).unwrap();
        let mut buf = Vec::new();
        let same = Source::Memory(&content);
        assert!(same.equals_file_range(&file, 6, &mut buf).unwrap());
        for at in [0, 1, (64 << 10) + 3, CHUNK + 5, len - 1] {
            let mut other = content.clone();
            other[at] ^= 1;
            let src = Source::Memory(&other);
            assert!(!src.equals_file_range(&file, 6, &mut buf).unwrap(), "{at}");
            // The same from a file source.
            let mut f = tempfile::tempfile().unwrap();
            std::io::Write::write_all(&mut f, &other).unwrap();
            let src = Source::File {
                file: &f,
                offset: 0,
                len: len as u64,
            };
            assert!(!src.equals_file_range(&file, 6, &mut buf).unwrap(), "{at}");
        }
        // Equal as far as the file goes, but the file ends first: an error, not "different".
        file.set_len(6 + len as u64 - 1).unwrap();
        assert!(same.equals_file_range(&file, 6, &mut buf).is_err());
    }
}
