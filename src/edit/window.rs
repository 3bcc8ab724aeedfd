//! Reading part of a file front to back through a buffer of fixed size, checksumming every
//! byte that passes: how journals are checked and replayed, whatever their size.
//!
//! Invariants: the buffer is allocated once, no larger than the window asked for and no
//! larger than what is left to read, so no length read from a file decides an allocation;
//! every byte between the start and the current position was read exactly once and went
//! into the checksum in order; a file that ends before the part it was opened for is an
//! `UnexpectedEof` error, never a short result.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// A forward reader of bytes `[position, end)` of a file.
pub struct Window<'f> {
    file: &'f File,
    /// Where the next byte taken comes from.
    position: u64,
    end: u64,
    buf: Vec<u8>,
    /// `buf[taken..filled]` holds the bytes from `position` on.
    taken: usize,
    filled: usize,
    crc: crc32fast::Hasher,
}

impl<'f> Window<'f> {
    /// Reads bytes `start..end` of `file` through a buffer of at most `window` bytes.
    pub fn new(file: &'f File, start: u64, end: u64, window: usize) -> Window<'f> {
        let left = end.saturating_sub(start);
        let size = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .clamp(1, window.max(1));
        Window {
            file,
            position: start,
            end: end.max(start),
            buf: vec![0; size],
            taken: 0,
            filled: 0,
            crc: crc32fast::Hasher::new(),
        }
    }

    /// The file offset of the next byte.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The checksum of every byte taken so far.
    pub fn crc(&self) -> crc32fast::Hasher {
        self.crc.clone()
    }

    /// Up to `max` bytes (at least one when `max > 0`): the next bytes of the file, which
    /// count as taken.
    pub fn take(&mut self, max: u64) -> io::Result<&[u8]> {
        if max == 0 {
            return Ok(&[]);
        }
        if self.taken == self.filled {
            self.fill()?;
        }
        let n = usize::try_from(max)
            .unwrap_or(usize::MAX)
            .min(self.filled - self.taken);
        let bytes = &self.buf[self.taken..self.taken + n];
        self.crc.update(bytes);
        self.taken += n;
        self.position += n as u64;
        Ok(bytes)
    }

    /// Fills `out` with the next bytes.
    pub fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < out.len() {
            let got = self.take((out.len() - done) as u64)?;
            out[done..done + got.len()].copy_from_slice(got);
            done += got.len();
        }
        Ok(())
    }

    /// The next 8 bytes, as a little-endian number.
    pub fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Takes the next `n` bytes, only checksumming them.
    pub fn skip(&mut self, n: u64) -> io::Result<()> {
        let mut left = n;
        while left > 0 {
            left -= self.take(left)?.len() as u64;
        }
        Ok(())
    }

    fn fill(&mut self) -> io::Result<()> {
        let left = self.end - self.position;
        if left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("no bytes past offset {}", self.position),
            ));
        }
        let want = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(self.buf.len());
        let mut got = 0;
        while got < want {
            match self
                .file
                .read_at(&mut self.buf[got..want], self.position + got as u64)
            {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the file ends at offset {}, before offset {}",
                            self.position + got as u64,
                            self.end
                        ),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.taken = 0;
        self.filled = want;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_across_refills_and_checksums_in_order() {
        let mut f = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        f.write_all(&bytes).unwrap();
        let mut w = Window::new(&f, 3, 1000, 10);
        let mut head = [0u8; 5];
        w.read_exact(&mut head).unwrap();
        assert_eq!(head, bytes[3..8]);
        // Crosses a refill.
        let n = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        assert_eq!(w.u64().unwrap(), n);
        w.skip(900).unwrap();
        assert_eq!(w.position(), 916);
        let rest = w.take(1000).unwrap().to_vec();
        assert!(!rest.is_empty() && rest.len() <= 10);
        w.skip(1000 - 916 - rest.len() as u64).unwrap();
        assert_eq!(w.crc().finalize(), crc32fast::hash(&bytes[3..]));
        let e = w.take(1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_file_shorter_than_promised_is_an_error() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[1; 100]).unwrap();
        let mut w = Window::new(&f, 0, 1 << 40, 4096);
        let e = w.skip(200).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        // The buffer is bounded by the window, not by the end promised.
        assert_eq!(w.buf.len(), 4096);
    }
}
