//! A model file on a local file system: opened relative to its directory without following
//! links (so the directory and the file always go together), and mapped read-only.
//!
//! Invariants: the file is a regular file, opened `O_NOFOLLOW` through a descriptor of its
//! directory that was opened first; the mapping is read-only, and a truncation by another
//! process is caught (`crate::guard`) and reported through `poisoned()` instead of killing
//! the process with SIGBUS.

use std::borrow::Cow;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::{slice, ByteSource, Memory};

/// A NUL in a name cannot reach the kernel.
fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the name"))
}

/// Device and inode of `name` in `dir`, without following a link.
pub fn stat_in(dir: &File, name: &OsStr) -> io::Result<(u64, u64)> {
    let c = c_name(name)?;
    // SAFETY: zeroed memory is a valid stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid directory descriptor, C string and stat buffer.
    if unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// Opens `name` in directory `dir` without following a link.
fn open_in(dir: &File, name: &OsStr, writable: bool) -> io::Result<File> {
    let c = c_name(name)?;
    let access = if writable {
        libc::O_RDWR
    } else {
        libc::O_RDONLY
    };
    // SAFETY: a valid directory descriptor and C string.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            access | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned here alone.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens `name` in `dir` for writing when `writable` and allowed, else for reading; says
/// which it got.
fn open_in_best(dir: &File, name: &OsStr, writable: bool) -> io::Result<(File, bool)> {
    if !writable {
        return open_in(dir, name, false).map(|f| (f, false));
    }
    match open_in(dir, name, true) {
        Ok(f) => Ok((f, true)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS)) => {
            open_in(dir, name, false).map(|f| (f, false))
        }
        Err(e) => Err(e),
    }
}

/// A local model file, opened: the descriptor commits write through (never the path, which
/// another process may repoint), and the directory files beside it are created in.
pub struct LocalFile {
    /// The absolute path, so that xattrs and JSON name a path usable from any directory.
    pub path: PathBuf,
    pub file: File,
    /// The directory holding the file, opened before it: files beside the model (journals,
    /// re-layout files) are created relative to it, and the file is opened again through it.
    pub dir: Option<Arc<File>>,
    /// The file's name in `dir`.
    pub name: OsString,
    /// Whether `file` was opened for writing.
    pub writable: bool,
}

impl LocalFile {
    /// Opens `path` (for writing when `writable` and allowed, else read-only). Errors say
    /// what failed; the caller names the path.
    pub fn open(path: &Path, writable: bool) -> io::Result<LocalFile> {
        let path = path.canonicalize()?;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a file"));
        };
        // The directory first, then the file in it: another process swapping a directory
        // of the path in between cannot make the two disagree.
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(parent)?;
        let (file, writable) = open_in_best(&dir, name, writable)?;
        let name = name.to_os_string();
        Ok(LocalFile {
            path,
            file,
            dir: Some(Arc::new(dir)),
            name,
            writable,
        })
    }

    /// The file `name` names in `dir` now (after a commit renamed a new file over it),
    /// opened as before.
    pub fn reopen(
        path: &Path, dir: &Arc<File>, name: &OsStr, writable: bool,
    ) -> io::Result<LocalFile> {
        let (file, writable) = open_in_best(dir, name, writable)?;
        Ok(LocalFile {
            path: path.to_path_buf(),
            file,
            dir: Some(dir.clone()),
            name: name.to_os_string(),
            writable,
        })
    }

    /// An open file known as `path`, without its directory (tests, tools).
    pub fn from_file(path: PathBuf, file: File, writable: bool) -> LocalFile {
        let name = path.file_name().unwrap_or_default().to_os_string();
        LocalFile {
            path,
            file,
            dir: None,
            name,
            writable,
        }
    }

    /// Device and inode of the opened file, after checking it is a regular file.
    pub fn identity(&self) -> io::Result<(u64, u64)> {
        let meta = self.file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok((meta.dev(), meta.ino()))
    }

    /// The file's bytes: a read-only mapping (an empty file, which cannot be mapped, is
    /// empty bytes).
    pub fn map(&self) -> io::Result<Box<dyn ByteSource>> {
        if self.file.metadata()?.len() == 0 {
            return Ok(Box::new(Memory(Vec::new())));
        }
        // SAFETY: the mapping is read-only; a concurrent truncation by another process is
        // handled by `crate::guard` (reads check the size, SIGBUS is caught).
        let map = unsafe { Mmap::map(&self.file) }?;
        Ok(Box::new(Mapped {
            watch: crate::guard::Watch::new(map.as_ptr(), map.len()),
            map,
            released: std::sync::atomic::AtomicU64::new(0),
        }))
    }
}

/// A read-only mapping of a local file.
pub struct Mapped {
    /// Declared first so it is dropped (unregistered) before the unmap.
    watch: crate::guard::Watch,
    map: Mmap,
    /// The end of the last range released (`release`).
    released: std::sync::atomic::AtomicU64,
}

/// How far around a faulting address the kernel may map pages it has cached: the
/// fault-around window (64 KiB by default), or the whole large folio the page is in, up to
/// a page table's span (2 MiB). Pages released before come back this way (measured on
/// Linux 6.18 with ext4: 1 MiB was needed, 64 KiB left one window per small range mapped).
const FAULT_AROUND: u64 = 2 << 20;

/// Bytes released ranges must reach before their pages are dropped: one madvise per this
/// many bytes of a scan, instead of one per range (each drop makes the next read fault).
const RELEASE_BATCH: u64 = 8 << 20;

impl ByteSource for Mapped {
    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn mapped(&self) -> Option<&[u8]> {
        Some(&self.map)
    }

    fn read(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        slice(&self.map, range).map(Cow::Borrowed)
    }

    fn poisoned(&self) -> bool {
        self.watch.poisoned()
    }

    /// Drops pages of ranges read once from this mapping, so that a scan of the whole file
    /// keeps little of it in the process's resident memory; the pages stay in the page
    /// cache, and a later read faults them in again. Releases are batched: pages go once
    /// the ranges released since the last time reach `RELEASE_BATCH`, from `FAULT_AROUND`
    /// before that point (reading a neighbour maps them back) to the last whole page
    /// released, which the next range may share. A range behind the point goes at once.
    fn release(&self, range: Range<u64>) {
        use std::sync::atomic::Ordering;
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        let mark = self.released.load(Ordering::Relaxed);
        let (from, to) = if end <= mark {
            (start, end)
        } else if end - mark >= RELEASE_BATCH {
            let page = page_size();
            let to = end / page * page;
            self.released.store(to, Ordering::Relaxed);
            (start.min(mark.saturating_sub(FAULT_AROUND)), to)
        } else {
            return;
        };
        self.drop_pages(from, to);
    }
}

/// The size of a page (4 KiB when the system does not say).
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    }
}

impl Mapped {
    /// Unmaps the pages holding bytes `from..to` of the file (MADV_DONTNEED).
    fn drop_pages(&self, from: u64, to: u64) {
        let page = page_size();
        // The mapping starts on a page boundary; madvise rounds the length up to a page.
        let first = from / page * page;
        if to <= first {
            return;
        }
        // SAFETY: a read-only shared mapping of a file: MADV_DONTNEED only unmaps the
        // pages, whose contents come back from the file on the next access; no slice of
        // them handed out can observe a change.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                first as usize,
                (to - first) as usize,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Resident KiB of the mapping that holds `addr`, from /proc/self/smaps.
    fn resident_kib(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(kib) = line.strip_prefix("Rss:") {
                    return kib.trim().trim_end_matches("kB").trim().parse().ok();
                }
            }
        }
        None
    }

    /// A scan of many small ranges, each released after it was read, keeps a bounded part
    /// of the file mapped, and every byte reads back the same.
    #[test]
    fn a_scan_that_releases_keeps_little_mapped() {
        let len: usize = 40 << 20;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&bytes).unwrap();
        let local = LocalFile::open(file.path(), false).unwrap();
        let source = local.map().unwrap();
        let addr = source.mapped().unwrap().as_ptr() as usize;
        let mut peak = 0;
        // Ranges of 10,000 bytes: never page-aligned, each sharing pages with its neighbours.
        for (n, start) in (0..len as u64).step_by(10_000).enumerate() {
            let end = (start + 10_000).min(len as u64);
            let got = source.read(start..end).unwrap();
            assert_eq!(&*got, &bytes[start as usize..end as usize]);
            source.release(start..end);
            if n % 64 == 0 {
                peak = peak.max(resident_kib(addr).unwrap());
            }
        }
        // The batch and the reach back, with room for what a fault maps ahead.
        let bound = (RELEASE_BATCH + FAULT_AROUND) / 1024 + 4096;
        assert!(
            peak <= bound,
            "{peak} KiB mapped at once, expected at most {bound}"
        );
        // Read again after every release: the same bytes.
        assert_eq!(&*source.read(0..len as u64).unwrap(), &bytes[..]);
    }
}
