//! Where a model file's bytes come from: a local file mapped into memory (reads are slices
//! of the mapping, nothing copied), or bytes held in memory; ranged reads of a remote object
//! fit the same interface. Parsing, the tree, the backends and the read path ask a
//! [`ByteSource`] for ranges and never learn which kind it is; only the read path asks
//! whether the whole file is mapped, to reply with slices of it.
//!
//! Invariants: a source never returns bytes outside `0..len()`; a range that does not fit
//! is an error, not a short read; `len()` is the length the source had when it was opened,
//! and a source whose bytes can no longer be trusted (a mapped file that shrank) says so
//! through `poisoned()`.

pub mod local;

use std::borrow::Cow;
use std::io;
use std::ops::Range;

pub use local::{stat_in, LocalFile, Mapped};

/// The bytes of one model file.
pub trait ByteSource: Send + Sync {
    /// The file's length when it was opened.
    fn len(&self) -> u64;

    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole file, when it is in memory (a mapping, or bytes held): the read path then
    /// replies with slices of it.
    fn mapped(&self) -> Option<&[u8]>;

    /// The bytes of `range`: borrowed when the file is in memory, read otherwise.
    fn read(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>>;

    /// Whether the bytes can no longer be trusted (the file shrank under its mapping).
    fn poisoned(&self) -> bool {
        false
    }

    /// Says the bytes of `range` will not be read again soon: a mapping drops its pages of
    /// them from the process (the page cache keeps them; a later read maps them again), so
    /// reading a large file through once holds a window of it, not all of it.
    fn release(&self, _range: Range<u64>) {}
}

/// `range` of `bytes`, or the error a source gives for a range it does not hold.
pub fn slice(bytes: &[u8], range: Range<u64>) -> io::Result<&[u8]> {
    usize::try_from(range.start)
        .ok()
        .zip(usize::try_from(range.end).ok())
        .and_then(|(s, e)| bytes.get(s..e))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "bytes {}..{} lie outside the {} bytes of the file",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            )
        })
}

/// Bytes held in memory: files made in memory (tests, a re-laid-out file checked before it
/// is renamed into place), and empty files, which cannot be mapped.
pub struct Memory(pub Vec<u8>);

impl ByteSource for Memory {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn mapped(&self) -> Option<&[u8]> {
        Some(&self.0)
    }

    fn read(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        slice(&self.0, range).map(Cow::Borrowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_outside_the_bytes_is_an_error_not_a_short_read() {
        let m = Memory(b"abcdef".to_vec());
        assert_eq!(&*m.read(1..4).unwrap(), b"bcd");
        assert_eq!(&*m.read(6..6).unwrap(), b"");
        assert!(m.read(4..7).is_err());
        assert!(m.read(u64::MAX - 1..u64::MAX).is_err());
        assert_eq!(m.len(), 6);
    }
}
