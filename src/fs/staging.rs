//! Staged content: the bytes an open file holds until they are committed (a writer's copy of
//! a tree file) or for as long as it lives (a scratch file).
//!
//! Invariants: the first `SPILL_AT` bytes live in memory; beyond that the content moves to an
//! unnamed temporary file (`O_TMPFILE`, in the model's directory, else in `$TMPDIR`), so a
//! multi-GiB write needs neither its size in RAM nor a daemon that grows; every size is
//! checked against the file's limit before anything is allocated, and memory is reserved
//! fallibly, so a request can fail with EFBIG or ENOMEM but never abort the daemon.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use crate::edit::Source;
use crate::error::{Error, Result};

/// Staged content beyond this size spills to a temporary file.
pub const SPILL_AT: u64 = 64 << 20;

enum Buffer {
    Memory(Vec<u8>),
    Spilled { file: File, len: u64 },
}

/// The content of one open file, with the limit its size may not exceed.
pub struct Staged {
    buffer: Buffer,
    /// The largest size this content may take (what the file it becomes can hold).
    limit: u64,
    /// What the limit is, for messages ("FLOAT[3,4] holds 48 bytes").
    limit_reason: String,
    /// Where a spill file goes first (the model's directory), if open.
    spill_dir: Option<std::sync::Arc<File>>,
}

/// An unnamed file for spilled content: `O_TMPFILE` in `dir`, else in the temporary
/// directory. Nobody else can open it, and it disappears with its descriptor.
fn unnamed_file(dir: Option<&File>) -> Result<File> {
    let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
    if let Some(dir) = dir {
        // SAFETY: a valid directory descriptor and a constant C string.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c".".as_ptr(), flags, 0o600) };
        if fd >= 0 {
            // SAFETY: a descriptor just opened and owned here alone.
            return Ok(unsafe { File::from_raw_fd(fd) });
        }
    }
    let tmp = std::env::temp_dir();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags_tmpfile()
        .open(&tmp)
        .map_err(|e| Error::io(format!("create a temporary file in {}", tmp.display()), e))
}

/// `O_TMPFILE` for `OpenOptions`.
trait TmpFile {
    fn custom_flags_tmpfile(&mut self) -> &mut Self;
}

impl TmpFile for std::fs::OpenOptions {
    fn custom_flags_tmpfile(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .mode(0o600)
    }
}

fn grow(v: &mut Vec<u8>, len: usize) -> Result<()> {
    if len > v.len() {
        v.try_reserve_exact(len - v.len()).map_err(|_| {
            Error::new(
                libc::ENOMEM,
                format!("cannot hold {len} bytes of staged content in memory"),
            )
        })?;
    }
    v.resize(len, 0);
    Ok(())
}

impl Staged {
    /// Empty content that may grow to `limit` bytes.
    pub fn new(
        limit: u64, limit_reason: impl Into<String>, spill_dir: Option<std::sync::Arc<File>>,
    ) -> Staged {
        Staged {
            buffer: Buffer::Memory(Vec::new()),
            limit,
            limit_reason: limit_reason.into(),
            spill_dir,
        }
    }

    /// Reserves room for `capacity` bytes in memory (when they would not spill), so the
    /// writes that fill a replaced file do not reallocate. A large buffer asks for
    /// transparent huge pages: touching 64 MiB of new 4 KiB pages costs more than copying the
    /// bytes into them.
    pub fn reserve(&mut self, capacity: u64) {
        const PAGE: usize = 4096;
        let Buffer::Memory(v) = &mut self.buffer else {
            return;
        };
        if capacity > SPILL_AT.min(self.limit) || v.try_reserve_exact(capacity as usize).is_err() {
            return;
        }
        if capacity >= 2 << 20 {
            let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
            let end = (v.as_ptr() as usize + v.capacity()) / PAGE * PAGE;
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
    }

    pub fn len(&self) -> u64 {
        match &self.buffer {
            Buffer::Memory(v) => v.len() as u64,
            Buffer::Spilled { len, .. } => *len,
        }
    }

    fn check_size(&self, size: u64) -> Result<()> {
        if size > self.limit {
            return Err(Error::new(
                libc::EFBIG,
                format!(
                    "{} bytes cannot fit: {} (at most {} bytes)",
                    size, self.limit_reason, self.limit
                ),
            ));
        }
        Ok(())
    }

    /// Moves the content to a temporary file.
    fn spill(&mut self) -> Result<()> {
        let Buffer::Memory(v) = &self.buffer else {
            return Ok(());
        };
        let file = unnamed_file(self.spill_dir.as_deref())?;
        file.write_all_at(v, 0)
            .map_err(|e| Error::io("write staged content to a temporary file", e))?;
        let len = v.len() as u64;
        self.buffer = Buffer::Spilled { file, len };
        Ok(())
    }

    /// Writes `data` at `offset`, growing the content with zeros.
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset.checked_add(data.len() as u64).ok_or_else(|| {
            Error::new(libc::EFBIG, format!("a write at offset {offset} overflows"))
        })?;
        self.check_size(end)?;
        if end > SPILL_AT {
            self.spill()?;
        }
        match &mut self.buffer {
            Buffer::Memory(v) => {
                let end = end as usize;
                if v.len() < end {
                    grow(v, end)?;
                }
                v[offset as usize..end].copy_from_slice(data);
            }
            Buffer::Spilled { file, len } => {
                file.write_all_at(data, offset)
                    .map_err(|e| Error::io("write staged content", e))?;
                *len = (*len).max(end);
            }
        }
        Ok(())
    }

    /// Truncates or extends the content to `size` bytes.
    pub fn set_len(&mut self, size: u64) -> Result<()> {
        self.check_size(size)?;
        if size > SPILL_AT {
            self.spill()?;
        }
        match &mut self.buffer {
            Buffer::Memory(v) => grow(v, size as usize)?,
            Buffer::Spilled { file, len } => {
                file.set_len(size)
                    .map_err(|e| Error::io("resize staged content", e))?;
                *len = size;
            }
        }
        Ok(())
    }

    /// `[offset, offset + size)`, clamped to the end.
    pub fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>> {
        let len = self.len();
        let start = offset.min(len);
        let end = offset.saturating_add(size as u64).min(len);
        match &self.buffer {
            Buffer::Memory(v) => Ok(v[start as usize..end as usize].to_vec()),
            Buffer::Spilled { file, .. } => {
                let mut out = vec![0u8; (end - start) as usize];
                file.read_exact_at(&mut out, start)
                    .map_err(|e| Error::io("read staged content", e))?;
                Ok(out)
            }
        }
    }

    /// All the content, for a commit: read from memory, or from the spill file in bounded
    /// chunks (never mapped, so committing GiBs does not grow the daemon).
    pub fn source(&self) -> Source<'_> {
        match &self.buffer {
            Buffer::Memory(v) => Source::Memory(v),
            Buffer::Spilled { file, len } => Source::File {
                file,
                offset: 0,
                len: *len,
            },
        }
    }

    /// Whether the content lives in a temporary file.
    #[cfg(test)]
    pub fn spilled(&self) -> bool {
        matches!(self.buffer, Buffer::Spilled { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_sizes_beyond_the_limit_before_allocating() {
        let mut s = Staged::new(48, "FLOAT[3,4] holds 48 bytes", None);
        assert_eq!(s.write_at(1 << 40, b"x").unwrap_err().errno(), libc::EFBIG);
        assert_eq!(s.set_len(1 << 40).unwrap_err().errno(), libc::EFBIG);
        assert_eq!(
            s.write_at(u64::MAX, b"xy").unwrap_err().errno(),
            libc::EFBIG
        );
        s.write_at(40, &[1; 8]).unwrap();
        assert_eq!(s.len(), 48);
        assert!(!s.spilled());
    }

    #[test]
    fn spills_past_the_threshold_and_reads_back() {
        let mut s = Staged::new(u64::MAX, "", None);
        s.write_at(0, b"head").unwrap();
        s.write_at(SPILL_AT + 10, b"tail").unwrap();
        assert!(s.spilled());
        assert_eq!(s.len(), SPILL_AT + 14);
        assert_eq!(s.read(0, 4).unwrap(), b"head");
        assert_eq!(s.read(SPILL_AT + 10, 100).unwrap(), b"tail");
        let all = s.source();
        assert_eq!(all.head(4).unwrap(), b"head");
        assert_eq!(all.len(), SPILL_AT + 14);
        s.set_len(2).unwrap();
        assert_eq!(s.source().head(10).unwrap(), b"he");
    }
}
