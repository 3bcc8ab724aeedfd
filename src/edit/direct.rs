//! Writing a file straight to the disk (`O_DIRECT`), for bytes that are written once and read
//! back only after a crash (journals): no copy into the page cache, no cached pages left for
//! writeback to find and for readers of the mount to lose their pages to.
//!
//! Invariants: every direct write is of whole `BLOCK`s from a page-aligned buffer at a
//! `BLOCK`-aligned offset, and ends at or before the end of what was appended, so the file
//! is never longer than its content, not even for a moment (a journal longer than its
//! header declares is not trusted at mount); the last partial block goes through the page
//! cache. Bytes are appended in order, each exactly once. One buffer is written (on a
//! thread of its own) while the next fills, so reading the bytes and writing them overlap;
//! blocks are still written in order, one request at a time, and the tail only after every
//! block before it is on disk.

use std::borrow::Borrow;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::JoinHandle;

use memmap2::MmapMut;

use crate::content::Source;

/// Direct I/O is done in whole blocks of this size (a multiple of every logical block size
/// Linux disks have), from a buffer aligned to it.
const BLOCK: usize = 4096;
/// The buffer: large enough that a direct write is a large request.
const BUFFER: usize = 8 << 20;
/// The memory a writer holds: the buffer filling and the one being written.
pub const MEMORY: u64 = 2 * BUFFER as u64;

/// Writes bytes one after the other from the start of a file opened for writing (held, or
/// borrowed), through a page-aligned buffer.
pub struct DirectWriter<F: Borrow<File>> {
    file: F,
    /// The same open file, for the thread that writes a full buffer.
    shared: Arc<File>,
    buf: MmapMut,
    filled: usize,
    /// Where `buf[0]` goes in the file.
    at: u64,
    /// The buffer being written, which the thread gives back.
    in_flight: Option<JoinHandle<io::Result<MmapMut>>>,
    /// Set once a write failed: the bytes it held are lost, so the file can never be whole
    /// and every later call fails too.
    broken: bool,
}

fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this writer borrows; it changes only its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether an error says direct I/O is not possible here (the caller writes through the page
/// cache instead).
pub fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
}

impl<F: Borrow<File>> DirectWriter<F> {
    /// A writer for `file`, from its start, or an error `unsupported` recognizes when its
    /// file system takes no direct I/O.
    pub fn new(file: F) -> io::Result<DirectWriter<F>> {
        let buf = MmapMut::map_anon(BUFFER)?;
        let shared = Arc::new(file.borrow().try_clone()?);
        set_direct(file.borrow(), true)?;
        Ok(DirectWriter {
            file,
            shared,
            buf,
            filled: 0,
            at: 0,
            in_flight: None,
            broken: false,
        })
    }

    /// An error if an earlier write failed (`broken`).
    fn usable(&self) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(
                "an earlier write of this file failed: its bytes are lost",
            ));
        }
        Ok(())
    }

    /// Appends the bytes of `src`, adding them to `crc` when given.
    pub fn append(&mut self, src: Source, crc: Option<&mut crc32fast::Hasher>) -> io::Result<()> {
        self.usable()?;
        let appended = self.append_unchecked(src, crc);
        self.broken |= appended.is_err();
        appended
    }

    fn append_unchecked(
        &mut self, src: Source, mut crc: Option<&mut crc32fast::Hasher>,
    ) -> io::Result<()> {
        let mut done = 0u64;
        while done < src.len() {
            let n = (BUFFER - self.filled).min((src.len() - done) as usize);
            let dst = &mut self.buf[self.filled..self.filled + n];
            src.read_at(done, dst)?;
            if let Some(c) = crc.as_deref_mut() {
                c.update(dst);
            }
            self.filled += n;
            done += n as u64;
            if self.filled == BUFFER {
                self.write_blocks()?;
            }
        }
        Ok(())
    }

    /// Waits for the buffer being written; returns it.
    fn wait(&mut self) -> io::Result<Option<MmapMut>> {
        match self.in_flight.take() {
            None => Ok(None),
            Some(h) => h
                .join()
                .map_err(|_| io::Error::other("the thread writing a buffer failed"))?
                .map(Some),
        }
    }

    /// Hands the whole blocks of the buffer to a thread that writes them directly, once the
    /// buffer before them is written, and goes on in the other buffer with the rest.
    fn write_blocks(&mut self) -> io::Result<()> {
        let whole = self.filled / BLOCK * BLOCK;
        if whole == 0 {
            return Ok(());
        }
        let mut next = match self.wait()? {
            Some(b) => b,
            None => MmapMut::map_anon(BUFFER)?,
        };
        let rest = self.filled - whole;
        next[..rest].copy_from_slice(&self.buf[whole..self.filled]);
        let full = std::mem::replace(&mut self.buf, next);
        let file = self.shared.clone();
        let at = self.at;
        self.in_flight = Some(
            std::thread::Builder::new()
                .name("direct-write".into())
                .spawn(move || file.write_all_at(&full[..whole], at).map(|_| full))?,
        );
        self.filled = rest;
        self.at += whole as u64;
        Ok(())
    }

    /// Writes what is left: whole blocks directly, the last partial block through the page
    /// cache; returns how many bytes were written in all. The file's descriptor is left
    /// without `O_DIRECT`, whatever happens.
    pub fn finish(mut self) -> io::Result<u64> {
        self.usable()?;
        self.write_blocks()?;
        self.wait()?;
        set_direct(self.file.borrow(), false)?;
        self.file
            .borrow()
            .write_all_at(&self.buf[..self.filled], self.at)?;
        Ok(self.at + self.filled as u64)
    }
}

impl<F: Borrow<File>> Drop for DirectWriter<F> {
    fn drop(&mut self) {
        // A writer given up on leaves a descriptor that writes through the page cache again,
        // once nothing writes directly any more.
        let _ = self.wait();
        let _ = set_direct(self.file.borrow(), false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_bytes_land_in_order_and_the_file_is_exactly_as_long() {
        // A file system without direct I/O (an old tmpfs) says so, and there is nothing to test.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut w = match DirectWriter::new(&file) {
            Ok(w) => w,
            Err(e) if unsupported(&e) => return,
            Err(e) => panic!("{e}"),
        };
        let a: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..BUFFER as u32 + 777).map(|i| (i / 3) as u8).collect();
        let mut crc = crc32fast::Hasher::new();
        w.append(Source::Memory(&a), Some(&mut crc)).unwrap();
        w.append(Source::Memory(&b), Some(&mut crc)).unwrap();
        w.append(Source::Memory(b"tail"), None).unwrap();
        assert_eq!(w.finish().unwrap(), (a.len() + b.len() + 4) as u64);
        let mut want = a.clone();
        want.extend_from_slice(&b);
        assert_eq!(crc.finalize(), crc32fast::hash(&want));
        want.extend_from_slice(b"tail");
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }
}
