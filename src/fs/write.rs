//! Writes: handles, per-file staging, editors' scratch files, and commits (DESIGN.md §3).
//!
//! Invariants: the model file changes only inside `commit_staged` (reached from flush,
//! fsync, release, truncate-by-path and rename); until then staged bytes live in memory. A
//! file has one staging area shared by all its open handles, so writers in turn see each
//! other's bytes. Scratch files never reach the model file except by being renamed onto a
//! writable file, which commits their bytes as that file's new content; from then on the
//! scratch inode stands for that file (`resolve`), since the kernel knows the name by it. A
//! rejected commit discards the staged bytes and changes nothing on disk.
//!
//! Commit points: `flush` comes for every close(2) of a descriptor, duplicates included (a
//! shell's `> file` closes one before the command writes anything; NumPy's `tofile` writes
//! through a `dup` and closes it before the real close), so a flush commits only what its
//! handle wrote or truncated since the last commit, and `release` (the last close) commits
//! whatever is still staged. A refused commit sticks to its handle: every later write,
//! truncate, flush and fsync through it fails with the same error, so the final close reports
//! it and no later write combines with bytes the refusal discarded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::{Attr, FileType, Fs, FsError, FsResult, ReadData};
use crate::edit::{self, Outcome};
use crate::tree::{Content, Ino, Tree};

/// Scratch files get inode numbers far above any tree node.
pub const SCRATCH_BASE: Ino = 1 << 48;

/// What `Fs::setattr` may change.
#[derive(Debug, Default, Clone, Copy)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// The handle of an `ftruncate`.
    pub fh: Option<u64>,
}

/// What the kernel must drop after a commit: cached pages and attributes of inodes, and
/// cached names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Invalidate {
    pub inodes: Vec<Ino>,
    /// Names (parent, name) the kernel must look up again: a name whose inode changed.
    pub entries: Vec<(Ino, String)>,
}

impl Invalidate {
    fn inodes(inodes: Vec<Ino>) -> Invalidate {
        Invalidate {
            inodes,
            entries: Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
struct Staged {
    /// None until the first write or truncate: opening alone copies nothing.
    data: Option<Vec<u8>>,
    dirty: bool,
    handles: usize,
}

#[derive(Debug)]
struct Scratch {
    parent: Ino,
    name: String,
    data: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Handle {
    ino: Ino,
    writable: bool,
    /// Wrote or truncated since its last commit.
    wrote: bool,
    /// The refusal of a commit through this handle; see the module comment.
    failed: Option<FsError>,
}

#[derive(Default)]
pub(super) struct WriteState {
    next_fh: AtomicU64,
    handles: Mutex<HashMap<u64, Handle>>,
    staged: Mutex<HashMap<Ino, Staged>>,
    scratch: Mutex<HashMap<Ino, Scratch>>,
    next_scratch: AtomicU64,
    /// Scratch inodes renamed onto a tree file, and that file.
    renamed: RwLock<HashMap<Ino, Ino>>,
    /// One commit at a time.
    commit_lock: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn is_scratch(ino: Ino) -> bool {
    ino >= SCRATCH_BASE
}

fn wants_write(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
}

/// The bytes a writer starts from: the file's current content.
fn current_bytes(tree: &Arc<Tree>, ino: Ino) -> FsResult<Vec<u8>> {
    let size = tree.size(ino);
    let mut out = staging_buffer(usize::try_from(size).unwrap_or(0));
    while (out.len() as u64) < size {
        let data = super::read::read(tree.clone(), ino, out.len() as u64, u32::MAX)?;
        if data.bytes().is_empty() {
            break;
        }
        out.extend_from_slice(data.bytes());
    }
    if tree.model.files.iter().any(|f| f.poisoned()) {
        return Err(FsError::new(
            libc::EIO,
            "the model file shrank while mounted; remount it",
        ));
    }
    Ok(out)
}

/// An empty buffer with room for `capacity` staged bytes. A large one asks for transparent
/// huge pages: touching 64 MiB of new 4 KiB pages costs more than copying the bytes into
/// them.
fn staging_buffer(capacity: usize) -> Vec<u8> {
    const PAGE: usize = 4096;
    let v = Vec::with_capacity(capacity);
    if capacity >= 2 << 20 {
        let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (v.as_ptr() as usize + capacity) / PAGE * PAGE;
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
    v
}

fn write_at(buf: &mut Vec<u8>, offset: u64, data: &[u8]) -> FsResult<()> {
    let end = offset
        .checked_add(data.len() as u64)
        .and_then(|e| usize::try_from(e).ok())
        .ok_or_else(|| {
            FsError::new(
                libc::EFBIG,
                format!("write at offset {offset} is too large"),
            )
        })?;
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[offset as usize..end].copy_from_slice(data);
    Ok(())
}

fn resize(buf: &mut Vec<u8>, size: u64) -> FsResult<()> {
    let size = usize::try_from(size)
        .map_err(|_| FsError::new(libc::EFBIG, format!("size {size} is too large")))?;
    buf.resize(size, 0);
    Ok(())
}

/// Whether the tree of `old` still describes the file after `outcome`: an in-place write
/// beyond the flatbuffer changes bytes that no generated file or layout is computed from.
fn outcome_keeps_structure(old: &Tree, outcome: &Outcome) -> bool {
    match outcome {
        Outcome::InPlace { file, range } => range.start >= old.model.files[*file].program_end(),
        Outcome::Relayout { .. } => false,
    }
}

/// Which inodes a commit changed: ranges overlapping an in-place write (and every generated
/// file when the write touched the flatbuffer), or everything after a re-layout.
fn invalidations(old: &Tree, outcome: &Outcome) -> Invalidate {
    let all = || (1..=old.nodes.len() as Ino).collect();
    let inodes = match outcome {
        Outcome::Relayout { .. } => all(),
        Outcome::InPlace { file, range } => {
            if !outcome_keeps_structure(old, outcome) {
                all()
            } else {
                old.nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| match &n.content {
                        Content::Range(l) | Content::Npy { location: l, .. } => {
                            l.file == *file
                                && l.range.start < range.end()
                                && range.start < l.range.end()
                        }
                        _ => false,
                    })
                    .map(|(i, _)| i as Ino + 1)
                    .collect()
            }
        }
    };
    Invalidate::inodes(inodes)
}

impl Fs {
    fn not_writable(&self, tree: &Tree, ino: Ino) -> FsError {
        if self.options.read_only {
            FsError::new(libc::EROFS, "the mount is read-only")
        } else {
            FsError::new(
                libc::EACCES,
                format!("{} is read-only: only tensor bytes, named data, delegate payloads and segments can be written", tree.path(ino)),
            )
        }
    }

    /// Opens a file; a write open of a writable file starts (or joins) its staging.
    pub fn open(&self, ino: Ino, flags: i32) -> FsResult<u64> {
        let ino = self.resolve(ino);
        let writable = wants_write(flags);
        if is_scratch(ino) {
            let mut scratch = lock(&self.writes.scratch);
            let s = scratch
                .get_mut(&ino)
                .ok_or_else(|| FsError::not_found(format!("inode {ino}")))?;
            if writable && flags & libc::O_TRUNC != 0 {
                s.data.clear();
            }
        } else {
            let tree = self.tree();
            let node = tree
                .node(ino)
                .ok_or_else(|| FsError::not_found(format!("inode {ino}")))?;
            if node.is_dir() && writable {
                return Err(FsError::new(
                    libc::EISDIR,
                    format!("{} is a directory", tree.path(ino)),
                ));
            }
            if writable {
                if self.options.read_only || node.write.is_none() {
                    return Err(self.not_writable(&tree, ino));
                }
                let mut staged = lock(&self.writes.staged);
                let s = staged.entry(ino).or_default();
                s.handles += 1;
                if flags & libc::O_TRUNC != 0 {
                    // The new content is most likely as long as the old: one allocation.
                    let expected = usize::try_from(tree.size(ino)).unwrap_or(0);
                    s.data = Some(staging_buffer(expected));
                    s.dirty = true;
                }
            }
        }
        let fh = self.writes.next_fh.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.writes.handles).insert(
            fh,
            Handle {
                ino,
                writable,
                wrote: false,
                failed: None,
            },
        );
        Ok(fh)
    }

    /// The tree file a scratch inode was renamed onto, else `ino` itself.
    pub fn resolve(&self, ino: Ino) -> Ino {
        if !is_scratch(ino) {
            return ino;
        }
        let renamed = self
            .writes
            .renamed
            .read()
            .unwrap_or_else(|e| e.into_inner());
        renamed.get(&ino).copied().unwrap_or(ino)
    }

    /// Applies `update` to handle `fh` and returns what it was before.
    fn update_handle(&self, fh: u64, update: impl FnOnce(&mut Handle)) -> FsResult<Handle> {
        let mut handles = lock(&self.writes.handles);
        let h = handles
            .get_mut(&fh)
            .ok_or_else(|| FsError::new(libc::EBADF, format!("unknown file handle {fh}")))?;
        let before = h.clone();
        update(h);
        Ok(before)
    }

    /// Marks handle `fh` as having written, unless a refused commit stuck to it.
    fn start_write(&self, fh: u64) -> FsResult<Handle> {
        let before = self.update_handle(fh, |h| h.wrote = h.failed.is_none())?;
        match before.failed {
            Some(e) => Err(e),
            None => Ok(before),
        }
    }

    /// Creates an editor's scratch file in a writable directory.
    pub fn create(&self, parent: Ino, name: &str, flags: i32) -> FsResult<(Attr, u64)> {
        if self.options.read_only {
            return Err(FsError::new(libc::EROFS, "the mount is read-only"));
        }
        let tree = self.tree();
        if tree.children(parent).is_none() {
            return Err(FsError::not_found(format!("inode {parent}")));
        }
        if !super::attr::dir_is_writable(&tree, parent) {
            return Err(FsError::new(
                libc::EACCES,
                format!(
                    "cannot create {name} in {}: the directory is read-only",
                    tree.path(parent)
                ),
            ));
        }
        if tree.lookup(parent, name).is_some() || self.scratch_lookup(parent, name).is_some() {
            return Err(FsError::new(
                libc::EEXIST,
                format!("{}/{name} exists", tree.path(parent)),
            ));
        }
        let ino = SCRATCH_BASE + self.writes.next_scratch.fetch_add(1, Ordering::Relaxed);
        lock(&self.writes.scratch).insert(
            ino,
            Scratch {
                parent,
                name: name.to_string(),
                data: Vec::new(),
            },
        );
        let fh = self.open(ino, flags)?;
        Ok((self.getattr(ino)?, fh))
    }

    pub(super) fn scratch_lookup(&self, parent: Ino, name: &str) -> Option<Ino> {
        lock(&self.writes.scratch)
            .iter()
            .find(|(_, s)| s.parent == parent && s.name == name)
            .map(|(&ino, _)| ino)
    }

    /// Scratch files of a directory, for `readdir`.
    pub(super) fn scratch_entries(&self, parent: Ino) -> Vec<(String, Ino)> {
        let mut v: Vec<_> = lock(&self.writes.scratch)
            .iter()
            .filter(|(_, s)| s.parent == parent)
            .map(|(&ino, s)| (s.name.clone(), ino))
            .collect();
        v.sort();
        v
    }

    /// Size of a scratch file, or of a file's staged bytes while a writer holds them.
    pub(super) fn staged_size(&self, ino: Ino) -> Option<u64> {
        if is_scratch(ino) {
            return lock(&self.writes.scratch)
                .get(&ino)
                .map(|s| s.data.len() as u64);
        }
        lock(&self.writes.staged)
            .get(&ino)
            .filter(|s| s.dirty)
            .and_then(|s| s.data.as_ref())
            .map(|d| d.len() as u64)
    }

    pub(super) fn scratch_attr(&self, ino: Ino) -> FsResult<Attr> {
        let size = self
            .staged_size(ino)
            .ok_or_else(|| FsError::not_found(format!("inode {ino}")))?;
        let id = self.identity();
        Ok(Attr {
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
            blksize: super::attr::BLOCK_SIZE,
        })
    }

    /// Staged or scratch bytes for a read, when a writer holds them.
    pub(super) fn staged_read(
        &self,
        tree: &Arc<Tree>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Option<ReadData> {
        let window = |data: &[u8]| {
            let start = (offset.min(data.len() as u64)) as usize;
            let end = (offset.saturating_add(size as u64).min(data.len() as u64)) as usize;
            data[start..end].to_vec()
        };
        if is_scratch(ino) {
            let scratch = lock(&self.writes.scratch);
            return scratch
                .get(&ino)
                .map(|s| ReadData::owned(tree.clone(), window(&s.data)));
        }
        let staged = lock(&self.writes.staged);
        staged
            .get(&ino)
            .filter(|s| s.dirty)
            .and_then(|s| s.data.as_deref())
            .map(|d| ReadData::owned(tree.clone(), window(d)))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let h = self.start_write(fh)?;
        if !h.writable {
            return Err(FsError::new(
                libc::EBADF,
                "the file was not opened for writing",
            ));
        }
        if is_scratch(h.ino) {
            let mut scratch = lock(&self.writes.scratch);
            let s = scratch
                .get_mut(&h.ino)
                .ok_or_else(|| FsError::not_found(format!("inode {}", h.ino)))?;
            write_at(&mut s.data, offset, data)?;
            return Ok(data.len() as u32);
        }
        let tree = self.tree();
        let mut staged = lock(&self.writes.staged);
        let s = staged.entry(h.ino).or_default();
        if s.data.is_none() {
            s.data = Some(current_bytes(&tree, h.ino)?);
        }
        write_at(s.data.as_mut().expect("staged"), offset, data)?;
        s.dirty = true;
        Ok(data.len() as u32)
    }

    /// `chmod`, `chown`, `truncate`, `utimes` and the like. The owner and mode are those of
    /// the model file and cannot change; scratch files accept any (editors copy modes onto
    /// their new file) and keep 0644. Times are ignored, so `touch` and `cp -p` work.
    pub fn setattr(&self, ino: Ino, change: SetAttr) -> FsResult<(Attr, Invalidate)> {
        let ino = self.resolve(ino);
        let current = self.getattr(ino)?;
        if !is_scratch(ino) {
            let changes_mode = change
                .mode
                .is_some_and(|m| (m & 0o7777) as u16 != current.perm);
            let changes_owner = change.uid.is_some_and(|u| u != current.uid)
                || change.gid.is_some_and(|g| g != current.gid);
            if changes_mode || changes_owner {
                return Err(if self.options.read_only {
                    FsError::new(libc::EROFS, "the mount is read-only")
                } else {
                    FsError::new(
                        libc::EPERM,
                        format!(
                            "{}: mode and owner are those of the model file",
                            self.tree().path(ino)
                        ),
                    )
                });
            }
        }
        let Some(size) = change.size else {
            return Ok((current, Invalidate::default()));
        };
        if let Some(fh) = change.fh {
            self.start_write(fh)?;
        }
        self.set_size(ino, size)
    }

    /// Resizes the staged bytes; without an open writer, commits at once.
    fn set_size(&self, ino: Ino, size: u64) -> FsResult<(Attr, Invalidate)> {
        if is_scratch(ino) {
            let mut scratch = lock(&self.writes.scratch);
            let s = scratch
                .get_mut(&ino)
                .ok_or_else(|| FsError::not_found(format!("inode {ino}")))?;
            resize(&mut s.data, size)?;
            drop(scratch);
            return Ok((self.getattr(ino)?, Invalidate::default()));
        }
        let tree = self.tree();
        let node = tree
            .node(ino)
            .ok_or_else(|| FsError::not_found(format!("inode {ino}")))?;
        if node.is_dir() {
            return Err(FsError::new(
                libc::EISDIR,
                format!("{} is a directory", tree.path(ino)),
            ));
        }
        if self.options.read_only || node.write.is_none() {
            return Err(self.not_writable(&tree, ino));
        }
        let open_writers = {
            let mut staged = lock(&self.writes.staged);
            let s = staged.entry(ino).or_default();
            if s.data.is_none() {
                s.data = Some(if size == 0 {
                    Vec::new()
                } else {
                    current_bytes(&tree, ino)?
                });
            }
            resize(s.data.as_mut().expect("staged"), size)?;
            s.dirty = true;
            s.handles
        };
        let inval = if open_writers == 0 {
            let r = self.commit_staged(ino);
            lock(&self.writes.staged).remove(&ino);
            r?
        } else {
            Invalidate::default()
        };
        Ok((self.getattr(ino)?, inval))
    }

    /// Commits the staged bytes of `ino` if a writer changed them.
    fn commit_staged(&self, ino: Ino) -> FsResult<Invalidate> {
        let _one_at_a_time = lock(&self.writes.commit_lock);
        let mut staged = lock(&self.writes.staged);
        let Some(s) = staged.get_mut(&ino).filter(|s| s.dirty) else {
            return Ok(Invalidate::default());
        };
        s.dirty = false;
        let data = s.data.take().unwrap_or_default();
        let result = self.commit_bytes(ino, &data);
        if result.is_ok() {
            // Further writes through still-open handles continue from the committed bytes.
            if let Some(s) = staged.get_mut(&ino) {
                s.data = Some(data);
            }
        }
        result
    }

    /// Validates `data` as the new content of tree file `ino`, writes it, and switches to
    /// the new snapshot.
    fn commit_bytes(&self, ino: Ino, data: &[u8]) -> FsResult<Invalidate> {
        let tree = self.tree();
        let node = tree
            .node(ino)
            .ok_or_else(|| FsError::not_found(format!("inode {ino}")))?;
        let target = node
            .write
            .clone()
            .ok_or_else(|| self.not_writable(&tree, ino))?;
        let path = tree.path(ino);
        // Readers of the mapped bytes wait while they change in place (see `read_with`).
        let exclusive = || self.gate.write().unwrap_or_else(|e| e.into_inner());
        // The caller reports a refusal (the adapter logs it with the operation).
        let outcome = edit::commit(&tree, &target, data, exclusive)
            .map_err(|e| FsError::new(e.errno, format!("{path}: {}", e.message)))?;
        let inval = invalidations(&tree, &outcome);
        if outcome_keeps_structure(&tree, &outcome) {
            // Same offsets and sizes, and the mapping shares the page cache with the write:
            // the snapshot already shows the new bytes. Re-parsing would cost time
            // proportional to the number of values, not to the tensor.
            self.refresh_identity();
        } else {
            let new_tree = edit::reload(&tree).map_err(|e| {
                log::error!("{path} was written but the model could not be re-read: {e}");
                FsError::new(
                    libc::EIO,
                    format!("{path}: written, but re-reading the model failed: {e}"),
                )
            })?;
            self.replace_tree(new_tree);
        }
        log::info!("committed {path} ({} bytes, {outcome:?})", data.len());
        Ok(inval)
    }

    /// `close()`: commits the file's staged bytes if this handle changed them.
    pub fn flush(&self, fh: u64) -> FsResult<Invalidate> {
        self.commit_through(fh, false)
    }

    /// `fsync()`: commits the file's staged bytes, whoever changed them.
    pub fn fsync(&self, fh: u64) -> FsResult<Invalidate> {
        self.commit_through(fh, true)
    }

    fn commit_through(&self, fh: u64, always: bool) -> FsResult<Invalidate> {
        let h = self.update_handle(fh, |h| h.wrote = false)?;
        if let Some(e) = h.failed {
            return Err(e);
        }
        if !h.writable || is_scratch(h.ino) || !(h.wrote || always) {
            return Ok(Invalidate::default());
        }
        let result = self.commit_staged(h.ino);
        if let Err(e) = &result {
            let _ = self.update_handle(fh, |h| h.failed = Some(e.clone()));
        }
        result
    }

    /// Last close of a handle: commits anything still staged, then forgets the handle.
    pub fn release(&self, fh: u64) -> FsResult<Invalidate> {
        let Some(h) = lock(&self.writes.handles).remove(&fh) else {
            return Ok(Invalidate::default());
        };
        if !h.writable || is_scratch(h.ino) {
            return Ok(Invalidate::default());
        }
        let result = self.commit_staged(h.ino);
        let mut staged = lock(&self.writes.staged);
        if let Some(s) = staged.get_mut(&h.ino) {
            s.handles = s.handles.saturating_sub(1);
            if s.handles == 0 {
                staged.remove(&h.ino);
            }
        }
        result
    }

    /// Commits everything still staged (before an unmount).
    pub fn commit_all(&self) -> Vec<FsResult<Invalidate>> {
        let dirty: Vec<Ino> = lock(&self.writes.staged)
            .iter()
            .filter(|(_, s)| s.dirty)
            .map(|(&i, _)| i)
            .collect();
        dirty
            .into_iter()
            .map(|ino| self.commit_staged(ino))
            .collect()
    }

    /// Renames: a scratch file onto a writable file replaces its content (a commit); scratch
    /// files may be renamed among themselves; tree files cannot move.
    pub fn rename(
        &self,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
    ) -> FsResult<Invalidate> {
        if self.options.read_only {
            return Err(FsError::new(libc::EROFS, "the mount is read-only"));
        }
        let tree = self.tree();
        let Some(src) = self.scratch_lookup(parent, name) else {
            return Err(match tree.lookup(parent, name) {
                Some(_) => FsError::new(
                    libc::EPERM,
                    format!("{}/{name} cannot be moved or renamed", tree.path(parent)),
                ),
                None => FsError::not_found(format!("{}/{name}", tree.path(parent))),
            });
        };
        if let Some(dst) = tree.lookup(new_parent, new_name) {
            if self.options.read_only || tree.node(dst).is_none_or(|n| n.write.is_none()) {
                return Err(self.not_writable(&tree, dst));
            }
            let data = lock(&self.writes.scratch)
                .get(&src)
                .map(|s| s.data.clone())
                .unwrap_or_default();
            let _one_at_a_time = lock(&self.writes.commit_lock);
            let mut inval = self.commit_bytes(dst, &data)?;
            lock(&self.writes.scratch).remove(&src);
            // Whoever holds the scratch inode (the kernel, for the new name) now holds the
            // file; new lookups of the name find the file's own inode.
            self.writes
                .renamed
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(src, dst);
            inval.inodes.push(src);
            inval.entries.push((new_parent, new_name.to_string()));
            return Ok(inval);
        }
        if tree.children(new_parent).is_none() || !super::attr::dir_is_writable(&tree, new_parent) {
            return Err(FsError::new(
                libc::EACCES,
                format!("cannot move a scratch file into {}", tree.path(new_parent)),
            ));
        }
        let mut scratch = lock(&self.writes.scratch);
        if let Some(existing) = scratch
            .iter()
            .find(|(_, s)| s.parent == new_parent && s.name == new_name)
            .map(|(&i, _)| i)
        {
            scratch.remove(&existing);
        }
        if let Some(s) = scratch.get_mut(&src) {
            s.parent = new_parent;
            s.name = new_name.to_string();
        }
        Ok(Invalidate::default())
    }

    /// Deletes a scratch file; tree files cannot be deleted.
    pub fn unlink(&self, parent: Ino, name: &str) -> FsResult<()> {
        if self.options.read_only {
            return Err(FsError::new(libc::EROFS, "the mount is read-only"));
        }
        if let Some(ino) = self.scratch_lookup(parent, name) {
            lock(&self.writes.scratch).remove(&ino);
            return Ok(());
        }
        let tree = self.tree();
        match tree.lookup(parent, name) {
            Some(_) => Err(FsError::new(
                libc::EPERM,
                format!(
                    "{}/{name} is part of the model and cannot be deleted",
                    tree.path(parent)
                ),
            )),
            None => Err(FsError::not_found(format!("{}/{name}", tree.path(parent)))),
        }
    }
}
