//! The block cache on disk: the bytes of remote objects already fetched, kept across reads
//! and mounts, within a size limit, the least recently used blocks evicted first.
//!
//! Layout: `<cache dir>/<hash of the object's version>/<block number in hex>`. A block file
//! holds the version line it was fetched for (URL without secrets, size, ETag,
//! Last-Modified), the extents of the block it holds with a CRC-32 each, then their bytes;
//! it is written under a temporary name and renamed, so a reader sees a whole file or none.
//!
//! Invariants: a block is used only when its version line is the mounted object's and every
//! extent's CRC matches (anything else is removed and fetched again); the cache directory
//! belongs to this user and nobody else may write in it (else it is refused); files are
//! opened without following links; what a read allocates is bounded by the block size.
//! See docs/remote.md#cache.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::blocks::Extents;
use super::BLOCK;

const MAGIC: &[u8; 8] = b"PTEFSBK1";
/// Most extents a block file may list (more is a damaged file).
const MAX_EXTENTS: usize = 4096;
/// A temporary file older than this was left by a process that died while writing it.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// The cache of one object version.
pub struct DiskCache {
    root: PathBuf,
    dir: PathBuf,
    version: String,
    limit: u64,
    /// Bytes the cache directory holds, as last counted plus what was written since.
    used: AtomicU64,
    evicting: Mutex<()>,
}

/// Makes `path` a directory of this user's that no one else may write in, or says why it
/// cannot be one.
fn private_dir(path: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(path)?;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let why = if !meta.is_dir() {
        Some("it is not a directory (a link is not followed)".to_string())
    } else if meta.uid() != uid {
        Some(format!(
            "it belongs to uid {}, not to uid {uid}",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "its mode {:o} lets other users write in it",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: not used as a cache: {why}", path.display()),
        )),
        None => Ok(()),
    }
}

fn open_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The extents a block file holds, when it is whole and of `version` and block `block`
/// (slices of `bytes`, nothing copied).
fn decode(bytes: &Bytes, version: &str, block: u64) -> Option<Extents> {
    if bytes.get(..8)? != MAGIC {
        return None;
    }
    let vlen = u32_at(bytes, 8)? as usize;
    let mut at = 12usize.checked_add(vlen)?;
    if bytes.get(12..at)? != version.as_bytes() {
        return None;
    }
    let n = u32_at(bytes, at)? as usize;
    at += 4;
    if n > MAX_EXTENTS {
        return None;
    }
    let table = at;
    let mut data = table.checked_add(n.checked_mul(20)?)?;
    let block_start = block.checked_mul(BLOCK)?;
    let mut extents = Vec::with_capacity(n);
    for i in 0..n {
        let e = table + i * 20;
        let (start, len, crc) = (
            u64_at(bytes, e)?,
            u64_at(bytes, e + 8)?,
            u32_at(bytes, e + 16)?,
        );
        let end = start.checked_add(len)?;
        if start < block_start || end > block_start.checked_add(BLOCK)? || len == 0 {
            return None;
        }
        let body = bytes.get(data..data.checked_add(len as usize)?)?;
        if crc32fast::hash(body) != crc {
            return None;
        }
        extents.push((start, bytes.slice(data..data + len as usize)));
        data += len as usize;
    }
    (data == bytes.len()).then_some(extents)
}

/// The head of a block file: everything but the extents' bytes, which follow it in order.
fn encode_head(version: &str, extents: &Extents) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + version.len() + extents.len() * 20);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(version.len() as u32).to_le_bytes());
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(&(extents.len() as u32).to_le_bytes());
    for (start, b) in extents {
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(b).to_le_bytes());
    }
    out
}

/// Every file of the cache (its block files and temporary files), with size and time of
/// last use; stale temporary files are removed on the way.
fn scan(root: &Path) -> Vec<(SystemTime, PathBuf, u64)> {
    let mut files = Vec::new();
    let Ok(dirs) = std::fs::read_dir(root) else {
        return files;
    };
    for d in dirs.flatten() {
        if !d.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(d.path()) else {
            continue;
        };
        for f in entries.flatten() {
            let Ok(meta) = f.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let tmp = f.file_name().to_string_lossy().ends_with(".tmp");
            if tmp {
                if mtime.elapsed().is_ok_and(|age| age > STALE_TMP) {
                    let _ = std::fs::remove_file(f.path());
                }
                continue;
            }
            files.push((mtime, f.path(), meta.len()));
        }
    }
    files
}

impl DiskCache {
    /// The cache of object version `version` (its `Version::key`) in `root`, which holds at
    /// most `limit` bytes.
    pub fn open(root: &Path, limit: u64, version: &str) -> io::Result<DiskCache> {
        if let Some(parent) = root.parent() {
            if !parent.as_os_str().is_empty() && !parent.exists() {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)?;
            }
        }
        private_dir(root)?;
        let hash = Sha256::digest(version.as_bytes());
        let name: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
        let dir = root.join(name);
        private_dir(&dir)?;
        let used = scan(root).iter().map(|(_, _, n)| n).sum();
        Ok(DiskCache {
            root: root.to_path_buf(),
            dir,
            version: version.to_string(),
            limit,
            used: AtomicU64::new(used),
            evicting: Mutex::new(()),
        })
    }

    fn path(&self, block: u64) -> PathBuf {
        self.dir.join(format!("{block:x}"))
    }

    /// The extents of `block` the cache holds for this version, marking the block used.
    pub fn get(&self, block: u64) -> Option<Extents> {
        let path = self.path(block);
        let mut file = open_nofollow(&path).ok()?;
        let meta = file.metadata().ok()?;
        let most = BLOCK + 64 * 1024 + self.version.len() as u64 + 20 * MAX_EXTENTS as u64;
        if !meta.is_file() || meta.len() > most {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).ok()?;
        match decode(&Bytes::from(bytes), &self.version, block) {
            Some(extents) => {
                // Its time of use, for eviction.
                let _ = file.set_modified(SystemTime::now());
                Some(extents)
            }
            None => {
                log::debug!("{}: damaged or of another version, removed", path.display());
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores the extents of `block` (replacing what the cache held of it), then evicts the
    /// least recently used blocks when the cache is over its limit.
    pub fn put(&self, block: u64, extents: &Extents) -> io::Result<()> {
        if self.limit == 0 {
            return Ok(());
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let head = encode_head(&self.version, extents);
        let size = head.len() + extents.iter().map(|(_, b)| b.len()).sum::<usize>();
        let tmp = self.dir.join(format!(
            "{block:x}.{}.{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(&head)?;
            for (_, b) in extents {
                f.write_all(b)?;
            }
            std::fs::rename(&tmp, self.path(block))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        let used = self.used.fetch_add(size as u64, Ordering::Relaxed) + size as u64;
        if used > self.limit {
            self.evict();
        }
        Ok(())
    }

    /// Removes the least recently used block files until the cache holds at most 90% of
    /// its limit (other processes' blocks too: the limit is the directory's).
    fn evict(&self) {
        let Ok(_one) = self.evicting.try_lock() else {
            return;
        };
        let mut files = scan(&self.root);
        let mut total: u64 = files.iter().map(|(_, _, n)| n).sum();
        files.sort();
        let target = self.limit / 10 * 9;
        for (_, path, size) in files {
            if total <= target {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= size;
            }
        }
        self.used.store(total, Ordering::Relaxed);
    }

    /// Bytes the cache directory holds, as last counted.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(start: u64, fill: u8, len: usize) -> (u64, Bytes) {
        (start, Bytes::from(vec![fill; len]))
    }

    #[test]
    fn blocks_come_back_only_for_their_version_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        let c = DiskCache::open(&root, 1 << 30, "v1").unwrap();
        let extents = vec![ext(BLOCK, 1, 10), ext(BLOCK + 100, 2, 50)];
        c.put(1, &extents).unwrap();
        assert_eq!(c.get(1).unwrap(), extents);
        assert!(c.get(2).is_none());
        // Another version of the object uses another directory and never these blocks.
        let c2 = DiskCache::open(&root, 1 << 30, "v2").unwrap();
        assert!(c2.get(1).is_none());
        // A damaged byte is caught by the CRC and the file removed.
        let path = c.path(1);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(c.get(1).is_none());
        assert!(!path.exists());
        // A block file renamed to another block's name is refused (its extents lie
        // outside that block).
        c.put(1, &extents).unwrap();
        std::fs::rename(c.path(1), c.path(3)).unwrap();
        assert!(c.get(3).is_none());
    }

    #[test]
    fn the_least_recently_used_blocks_are_evicted_first() {
        let dir = tempfile::tempdir().unwrap();
        let one = 100_000usize;
        let c = DiskCache::open(dir.path(), 7 * one as u64 / 2, "v").unwrap();
        for b in 0..3u64 {
            c.put(b, &vec![ext(b * BLOCK, b as u8, one)]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        // Block 0 is used again: block 1 is now the oldest.
        assert!(c.get(0).is_some());
        std::thread::sleep(Duration::from_millis(20));
        c.put(3, &vec![ext(3 * BLOCK, 3, one)]).unwrap();
        assert!(c.get(1).is_none(), "the least recently used block stays");
        assert!(c.get(0).is_some() && c.get(2).is_some() && c.get(3).is_some());
        assert!(c.used() <= 7 * one as u64 / 2);
    }

    #[test]
    fn a_directory_others_may_write_in_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = DirBuilder::new()
            .mode(0o777)
            .create(dir.path().join("open"));
        open.unwrap();
        std::fs::set_permissions(
            dir.path().join("open"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let e = DiskCache::open(&dir.path().join("open"), 1 << 20, "v")
            .err()
            .unwrap();
        assert!(e.to_string().contains("other users write"), "{e}");
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link")).unwrap();
        let e = DiskCache::open(&dir.path().join("link"), 1 << 20, "v")
            .err()
            .unwrap();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }
}
