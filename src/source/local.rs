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
        }))
    }
}

/// A read-only mapping of a local file.
pub struct Mapped {
    /// Declared first so it is dropped (unregistered) before the unmap.
    watch: crate::guard::Watch,
    map: Mmap,
}

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

    fn release(&self, range: Range<u64>) {
        let (Ok(start), Ok(end)) = (usize::try_from(range.start), usize::try_from(range.end))
        else {
            return;
        };
        let end = end.min(self.map.len());
        if start >= end {
            return;
        }
        // SAFETY: the mapping is shared and read-only, so its contents are the file's: pages
        // dropped are read back from the page cache unchanged, and slices borrowed from them
        // keep their bytes. A failure only leaves the pages mapped.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Resident pages of the mapping that holds `addr`, from /proc/self/smaps, in KiB.
    fn resident_kib(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a <= addr && addr < b;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("Rss:") {
                    return kb.trim().trim_end_matches(" kB").trim().parse().ok();
                }
            }
        }
        None
    }

    /// Released pages leave the process and read back unchanged, partial pages included.
    #[test]
    fn released_pages_read_back_unchanged() {
        let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&bytes).unwrap();
        let local = LocalFile::open(file.path(), false).unwrap();
        let source = local.map().unwrap();
        let whole = source.mapped().unwrap();
        let sum: u64 = whole.iter().map(|&b| u64::from(b)).sum();
        assert!(sum > 0);
        let addr = whole.as_ptr() as usize;
        let before = resident_kib(addr).expect("the mapping in /proc/self/smaps");
        source.release(100..(1 << 20) - 100);
        let after = resident_kib(addr).expect("the mapping in /proc/self/smaps");
        assert!(
            after + 512 < before,
            "resident {before} KiB, then {after} KiB"
        );
        assert_eq!(source.read(0..1 << 20).unwrap().as_ref(), &bytes[..]);
        // Ranges past the end, or empty, are ignored.
        source.release(1 << 30..1 << 31);
        source.release(5..5);
    }
}
