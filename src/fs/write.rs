//! The write operations (docs/writes.md#staging-and-commit, docs/writes.md#xnnpack-constants):
//! open, create, write, truncate, close, fsync, rename, unlink.
//!
//! A writer of a tree file stages its own copy (see `handles`); the model file changes only
//! at a commit of that copy:
//! - `flush` (every close(2), duplicates included) commits what the handle changed since its
//!   last commit. If the content is not a valid whole yet, the refusal is returned (so `cp`,
//!   `dd` and Python see it) and the content stays staged: the handle remains usable, so
//!   `cmd > file`, whose shell closes a duplicate before `cmd` writes, still works.
//!   Content an `O_TRUNC` open emptied and nothing wrote since is only checked: committing
//!   it would put an empty file on disk ahead of what `cmd` writes next; the last close
//!   commits it when nothing did. Its refusal is returned to every close, and logged once,
//!   at the last close, only if nothing was written by then.
//! - `fsync` commits the content when it is valid, and otherwise succeeds without writing
//!   anything (`dd oflag=dsync` fsyncs partial content after every block).
//! - `release` (the last close) commits what changed since the last attempt; the kernel
//!   cannot report an error from it, so content a `flush` was refused for (and reported) is
//!   not tried again there.
//! - `truncate(2)` by path commits at once.
//!
//! Invariants: every size is checked against what the file can hold before anything is
//! allocated (EFBIG); after every operation that committed, or failed to, the kernel is told
//! what to forget.

use std::ffi::OsStr;
use std::sync::Arc;

use super::commit::Invalid;
use super::handles::{lock, Handle, Target};
use super::hidden::Process;
use super::invalidate::Invalidate;
use super::staging::{self, Relayout, Room, SizeLimits, Spill, Staged};
use super::stream::Start;
use super::{not_found_in, not_utf8, scratch, utf8, Attr, Fs, Opened};
use crate::error::{Error, Result};
use crate::format::target::resizable_limit;
use crate::format::WriteTarget;
use crate::tree::{Ino, Tree};

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

/// `renameat2` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace the destination if it exists.
    Replace,
    /// `RENAME_NOREPLACE`: fail with EEXIST if the destination exists.
    NoReplace,
    /// `RENAME_EXCHANGE`: swap two names.
    Exchange,
}

fn wants_write(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
}

impl Fs {
    /// The tree file a scratch inode was renamed onto, else `ino` itself.
    pub fn canonical_ino(&self, ino: Ino) -> Ino {
        self.scratch.canonical_ino(ino)
    }

    /// The content of scratch file `ino`.
    fn scratch_content(&self, ino: Ino) -> Result<scratch::Content> {
        self.scratch
            .content(ino)
            .ok_or_else(|| Error::not_found(format!("scratch inode {ino}")))
    }

    fn target(&self, ino: Ino) -> Target {
        let ino = self.canonical_ino(ino);
        if self.scratch.contains(ino) {
            Target::Scratch(ino)
        } else {
            Target::Tree(ino)
        }
    }

    /// Tells the kernel what an operation on `ino` made stale: what a commit changed, or,
    /// after a failure, the file itself.
    fn publish<T>(&self, ino: Ino, result: Result<(T, Invalidate)>) -> Result<T> {
        match result {
            Ok((value, inval)) => {
                inval.send(&*self.invalidator);
                Ok(value)
            }
            Err(e) => {
                // Refusals a user should read (not the repeats and probes logged at debug).
                if e.level() <= log::Level::Warn {
                    self.record_refusal(&self.tree(), ino, &e);
                }
                self.invalidator.inodes(vec![ino], true);
                Err(e)
            }
        }
    }

    /// Empty staged content for writable tree file `ino`, with its size limit and what it
    /// needs on disk to grow (docs/writes.md#sizes-and-free-space).
    fn new_staged(&self, tree: &Tree, ino: Ino) -> Result<Staged> {
        let target = self.write_target(tree, ino)?;
        let path = tree.path(ino);
        let current = tree.size(ino);
        let (limit, why) = match (target, tree.names.as_deref()) {
            (WriteTarget::Weights { view }, _) => tree.weights(*view).update_limit(&path),
            (WriteTarget::NameNpy { name }, Some(v)) => v.update_limit(Some(*name), &path),
            (WriteTarget::NamesSafetensors, Some(v)) => v.update_limit(None, &path),
            (target, _) => target.size_limit(&path, current, self.spill.limits.max_file_size),
        };
        // Content of another size for a blob or a payload is a re-layout of its file.
        let relayout = match target {
            WriteTarget::Blob { file, .. } => Some(*file),
            WriteTarget::DelegatePayload { .. } => Some(0),
            _ => None,
        }
        .and_then(|f| {
            let file = &tree.model.files[f];
            Some(Relayout {
                dir: file.dir.clone()?,
                place: file
                    .path
                    .parent()
                    .map_or_else(|| ".".into(), |d| d.display().to_string()),
                file_len: file.len(),
                current,
            })
        });
        Ok(Staged::new(limit, why, self.spill.clone()).needing(Room { relayout }))
    }

    /// Empty staged content for tree file `ino`, emptied by an open or a truncate: an
    /// upload onto a `weights.safetensors` written from here streams into a new copy of the
    /// model when it can (docs/writes.md#uploads-written-straight-into-a-new-copy).
    fn emptied_staged(&self, tree: &Tree, ino: Ino) -> Result<Staged> {
        let staged = self.new_staged(tree, ino)?;
        Ok(match self.write_target(tree, ino)? {
            WriteTarget::Weights { view } => staged.streaming(Start {
                catalog: tree.catalog.clone(),
                view: *view,
                generation: self.changes.now(),
            }),
            _ => staged,
        })
    }

    /// Sets the sizes staged content may take (docs/writes.md#sizes-and-free-space).
    pub fn with_size_limits(mut self, limits: SizeLimits) -> Fs {
        let dir = self.tree().model.files[0].dir.clone();
        self.spill = Spill::limited(dir, staging::MEMORY_BUDGET, limits);
        self
    }

    /// The bytes one user's scratch files may hold together: the mount's limit, else twice
    /// the model's files and 1 GiB (an editor's copy of any of its files fits).
    fn scratch_bytes_per_user(&self) -> u64 {
        self.spill.limits.scratch_bytes_per_user.unwrap_or_else(|| {
            let model: u64 = self.tree().model.files.iter().map(|f| f.len()).sum();
            model.saturating_mul(2).saturating_add(1 << 30)
        })
    }

    /// Refuses growing scratch file `ino` to `len` bytes when its owner's scratch files
    /// would then hold more than `scratch_bytes_per_user` (EDQUOT, naming the numbers).
    fn scratch_room(&self, ino: Ino, len: u64) -> Result<()> {
        let Some(owner) = self.scratch.owner(ino) else {
            return Ok(());
        };
        let now = self.scratch.size(ino).unwrap_or(0);
        // A size no scratch file may have is refused by the content itself (EFBIG).
        if len <= now || self.spill.limits.max_file_size.is_some_and(|max| len > max) {
            return Ok(());
        }
        let (files, others) = self.scratch.usage(owner, ino);
        let cap = self.scratch_bytes_per_user();
        if others.saturating_add(len) > cap {
            return Err(Error::new(
                libc::EDQUOT,
                format!(
                    "a scratch file of {len} bytes: user {owner}'s scratch files would hold {} bytes \
                     ({files} other file(s) hold {others}), more than the {cap} one user may have in this mount",
                    others.saturating_add(len)
                ),
            ));
        }
        Ok(())
    }

    /// Staged content holding the committed bytes of tree file `ino`.
    fn staged_copy(&self, tree: &Arc<Tree>, ino: Ino) -> Result<Staged> {
        const CHUNK: u32 = 8 << 20;
        let mut staged = self.new_staged(tree, ino)?;
        let size = tree.size(ino);
        staged.reserve(size);
        let mut at = 0;
        while at < size {
            let data = super::read::read_for_copy(tree.clone(), ino, at, CHUNK)?;
            if data.bytes().is_empty() {
                break;
            }
            staged.write_at(at, data.bytes())?;
            at += data.bytes().len() as u64;
        }
        if tree.model.files.iter().any(|f| f.poisoned()) {
            return Err(Error::new(
                libc::EIO,
                "the model file shrank while mounted; remount it",
            ));
        }
        Ok(staged)
    }

    /// Opens a file; a write open of a tree file prepares its own staged copy.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<Opened> {
        self.open_by(ino, flags, 0)
    }

    /// `open` by thread `opener` (0: unknown), whose truncation of an `O_TRUNC` open is then
    /// known as this handle's (see `setattr_by`).
    pub fn open_by(&self, ino: Ino, flags: i32, opener: u32) -> Result<Opened> {
        let writable = wants_write(flags);
        if self.is_errors(ino) {
            if writable || flags & libc::O_TRUNC != 0 {
                return Err(if self.options.read_only {
                    Fs::read_only_error()
                } else {
                    Error::new(libc::EACCES, "errors is read-only: it lists refusals")
                });
            }
            let fh = self.handles.insert(Handle {
                target: Target::Tree(ino),
                writable: false,
                staged: None,
                dirty: false,
                truncated_only: false,
                refused: false,
                opened_at: 0,
                opener: 0,
            });
            // Its content grows with every refusal: no page of it may be kept.
            return Ok(Opened {
                fh,
                keep_cache: false,
                direct_io: true,
                cache_dir: false,
            });
        }
        let target = self.target(ino);
        let truncate = writable && flags & libc::O_TRUNC != 0;
        if let Target::Tree(_) = target {
            // Someone else may have changed the model since it was last looked at.
            self.check_files(true)?;
        }
        let mut handle = Handle {
            target,
            writable,
            staged: None,
            dirty: false,
            truncated_only: false,
            refused: false,
            opened_at: self.changes.now(),
            opener,
        };
        match target {
            Target::Scratch(ino) => {
                if truncate {
                    let content = self.scratch_content(ino)?;
                    scratch::lock(&content).set_len(0)?;
                }
            }
            Target::Tree(ino) => {
                let tree = self.tree();
                let node = tree
                    .node(ino)
                    .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
                if node.is_dir() && writable {
                    return Err(Error::new(
                        libc::EISDIR,
                        format!("{} is a directory", tree.path(ino)),
                    ));
                }
                if writable && (self.options.read_only || node.write.is_none()) {
                    return Err(self.not_writable(&tree, ino));
                }
                if truncate {
                    let mut staged = self.emptied_staged(&tree, ino)?;
                    // The new content is most likely as long as the old.
                    staged.reserve(tree.size(ino));
                    handle.staged = Some(staged);
                    handle.dirty = true;
                    handle.truncated_only = true;
                }
            }
        }
        let fh = self.handles.insert(handle);
        let tree_file = matches!(target, Target::Tree(_));
        Ok(Opened {
            fh,
            // Tree files keep their cached pages across opens: a commit drops them.
            keep_cache: tree_file && !writable,
            // A writer's bytes stay its own until committed: none may land in the page
            // cache that other opens read.
            direct_io: tree_file && writable,
            cache_dir: false,
        })
    }

    /// `create_by` root (offline commands and tests).
    pub fn create(
        &self, parent: Ino, name: impl AsRef<OsStr>, flags: i32,
    ) -> Result<(Attr, Opened)> {
        self.create_by(0, parent, name, flags)
    }

    /// Creates an editor's scratch file of user `uid` in a writable directory, or, for the
    /// name of a writable file an unlink hid, opens a truncating writer of that file and
    /// shows the name again (see `hidden`): its commit replaces the file.
    pub fn create_by(
        &self, uid: u32, parent: Ino, name: impl AsRef<OsStr>, flags: i32,
    ) -> Result<(Attr, Opened)> {
        if self.options.read_only {
            return Err(Fs::read_only_error());
        }
        let name = name.as_ref();
        let name = utf8(name).ok_or_else(|| not_utf8(name))?;
        let tree = self.tree();
        if tree.children(parent).is_none() {
            return Err(Error::not_found(format!("inode {parent}")));
        }
        self.show_expired();
        if let Some(ino) = tree.lookup(parent, name) {
            if !self.hidden_ino(&tree, ino) {
                return Err(Error::new(
                    libc::EEXIST,
                    format!("{}/{name} exists", tree.path(parent)),
                ));
            }
            let opened = self.open(ino, flags | libc::O_TRUNC)?;
            self.hidden.writing(opened.fh, ino);
            let path = tree.path(ino);
            self.hidden.show(&path);
            log::info!(
                "{path}: created again after its unlink: closing it commits the new content"
            );
            return Ok((self.getattr(ino)?, opened));
        }
        if !super::attr::dir_is_writable(&tree, parent) {
            return Err(Error::new(
                libc::EACCES,
                format!(
                    "cannot create {name} in {}: the directory is read-only",
                    tree.path(parent)
                ),
            ));
        }
        if self.scratch.lookup(parent, name).is_some() {
            return Err(Error::new(
                libc::EEXIST,
                format!("{}/{name} exists", tree.path(parent)),
            ));
        }
        let limits = self.spill.limits;
        let (limit, why) = resizable_limit("scratch files", limits.max_file_size);
        let content = Staged::new(limit, why, self.spill.clone());
        let ino = self
            .scratch
            .create(parent, name, uid, limits.scratch_files_per_user, content)?;
        let opened = self.open(ino, flags)?;
        Ok((self.getattr(ino)?, opened))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let shared = self.handles.get(fh)?;
        let mut h = lock(&shared);
        h.check_writable()?;
        match h.target {
            Target::Scratch(ino) => {
                let content = self.scratch_content(ino)?;
                self.scratch_room(ino, offset.saturating_add(data.len() as u64))?;
                scratch::lock(&content).write_at(offset, data)?;
            }
            Target::Tree(ino) => {
                if h.staged.is_none() {
                    h.staged = Some(self.staged_copy(&self.tree(), ino)?);
                }
                let path = || self.tree().path(ino);
                let staged = h.staged.as_mut().expect("staged above");
                staged
                    .write_at(offset, data)
                    .map_err(|e| e.context(path()))?;
                h.dirty = true;
                h.truncated_only = false;
                h.refused = false;
            }
        }
        Ok(data.len() as u32)
    }

    /// `chmod`, `chown`, `truncate`, `utimes` and the like. The owner and mode are those of
    /// the model file and cannot change; scratch files, and a file being created again after
    /// its unlink (see `hidden`), accept any (editors, `mv` and `install` set modes on their
    /// new file) and keep theirs. Times are ignored, so `touch` and `cp -p` work.
    pub fn setattr(&self, ino: Ino, change: SetAttr) -> Result<Attr> {
        self.setattr_by(ino, change, 0)
    }

    /// `setattr` by thread `caller` (0: unknown). The kernel truncates an `O_TRUNC` open by
    /// a size change without a handle, right after the open, from the same thread: that
    /// truncation is staged in the handle the thread just opened, like the rest of its
    /// writes, so nobody else sees the file empty (or its cached pages dropped) before the
    /// commit.
    pub fn setattr_by(&self, ino: Ino, change: SetAttr, caller: u32) -> Result<Attr> {
        let ino = self.canonical_ino(ino);
        if change.size == Some(0) && change.fh.is_none() && caller != 0 {
            if let Some(shared) = self.fresh_writer(ino, caller) {
                let tree = self.tree();
                let mut h = lock(&shared);
                h.staged = Some(self.emptied_staged(&tree, ino)?);
                h.dirty = true;
                h.truncated_only = true;
                drop(h);
                return self.getattr(ino);
            }
        }
        let result = self.setattr_inner(ino, change);
        self.publish(ino, result)
    }

    /// A handle of tree file `ino` that thread `opener` opened for writing and has neither
    /// written nor truncated yet.
    fn fresh_writer(&self, ino: Ino, opener: u32) -> Option<super::handles::Shared> {
        self.handles.all().into_iter().find(|shared| {
            let h = lock(shared);
            h.target == Target::Tree(ino)
                && h.writable
                && h.opener == opener
                && h.staged.is_none()
                && !h.dirty
        })
    }

    fn setattr_inner(&self, ino: Ino, change: SetAttr) -> Result<(Attr, Invalidate)> {
        let current = self.getattr(ino)?;
        let target = self.target(ino);
        if target == Target::Tree(ino) && !self.hidden.being_created(ino) {
            let changes_mode = change
                .mode
                .is_some_and(|m| (m & 0o7777) as u16 != current.perm);
            let changes_owner = change.uid.is_some_and(|u| u != current.uid)
                || change.gid.is_some_and(|g| g != current.gid);
            if changes_mode || changes_owner {
                return Err(if self.options.read_only {
                    Fs::read_only_error()
                } else {
                    Error::new(
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
        match (target, change.fh) {
            (Target::Scratch(ino), _) => {
                let content = self.scratch_content(ino)?;
                self.scratch_room(ino, size)?;
                scratch::lock(&content).set_len(size)?;
                Ok((self.getattr(ino)?, Invalidate::default()))
            }
            (Target::Tree(ino), Some(fh)) => {
                let shared = self.handles.get(fh)?;
                let mut h = lock(&shared);
                h.check_writable()?;
                let tree = self.tree();
                if h.staged.is_none() {
                    h.staged = Some(if size == 0 {
                        self.emptied_staged(&tree, ino)?
                    } else {
                        self.staged_copy(&tree, ino)?
                    });
                }
                let staged = h.staged.as_mut().expect("staged above");
                staged
                    .set_len(size)
                    .map_err(|e| e.context(tree.path(ino)))?;
                h.dirty = true;
                h.truncated_only = false;
                h.refused = false;
                let mut attr = current;
                attr.size = size;
                Ok((attr, Invalidate::default()))
            }
            (Target::Tree(ino), None) => {
                let inval = self.truncate_now(ino, size)?;
                Ok((self.getattr(ino)?, inval))
            }
        }
    }

    /// `truncate(2)` of a tree file by path: commits the resized content at once.
    fn truncate_now(&self, ino: Ino, size: u64) -> Result<Invalidate> {
        let tree = self.tree();
        let node = tree
            .node(ino)
            .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
        if node.is_dir() {
            return Err(Error::new(
                libc::EISDIR,
                format!("{} is a directory", tree.path(ino)),
            ));
        }
        if self.options.read_only || node.write.is_none() {
            return Err(self.not_writable(&tree, ino));
        }
        let mut staged = if size == 0 {
            self.new_staged(&tree, ino)?
        } else {
            self.staged_copy(&tree, ino)?
        };
        staged
            .set_len(size)
            .map_err(|e| e.context(tree.path(ino)))?;
        self.commit_staged(ino, &mut staged, Invalid::Refuse)
            .map(Option::unwrap_or_default)
    }

    /// `close()`: commits what this handle changed since its last commit, or returns why
    /// it cannot be committed (the content stays staged). Content only truncated by the
    /// open is checked but left for the last close to commit, as more writes may follow.
    pub fn flush(&self, fh: u64) -> Result<()> {
        let shared = self.handles.get(fh)?;
        let mut h = lock(&shared);
        let Target::Tree(ino) = h.target else {
            return Ok(());
        };
        if h.truncated_only && !h.refused {
            let checked = self.validate_staged(ino, &mut h);
            h.refused = checked.is_err();
            // Logged at the last close, if nothing is written by then: the writes usually
            // come after this close of a duplicate (`dd`, `cmd > file`).
            return checked.map_err(|e| e.with_level(log::Level::Debug));
        }
        // A duplicate descriptor closed after its twin (NumPy's `tofile`, a shell's
        // redirection) gets the same refusal for the same content: it was logged already.
        let repeated = h.refused;
        let result = self
            .commit_handle(ino, &mut h, Invalid::Refuse)
            .map_err(|e| {
                if repeated {
                    e.with_level(log::Level::Debug)
                } else {
                    e
                }
            });
        drop(h);
        self.publish(ino, result.map(|inval| ((), inval)))
    }

    /// `fsync()`: commits the handle's content when it is a valid whole; partial content is
    /// left staged and the call succeeds. The content is validated once: a valid whole is
    /// committed with the plan its validation made.
    pub fn fsync(&self, fh: u64) -> Result<()> {
        let shared = self.handles.get(fh)?;
        let mut h = lock(&shared);
        let Target::Tree(ino) = h.target else {
            return Ok(());
        };
        if !h.dirty {
            return Ok(());
        }
        let result = self.commit_handle(ino, &mut h, Invalid::Wait);
        drop(h);
        self.publish(ino, result.map(|inval| ((), inval)))
    }

    /// Why `h`'s staged content would not pass validation as the new content of `ino`.
    fn validate_staged(&self, ino: Ino, h: &mut Handle) -> Result<()> {
        let tree = self.tree();
        let staged = h
            .staged
            .as_mut()
            .ok_or_else(|| Error::new(libc::EIO, "nothing staged"))?;
        let target = self.write_target(&tree, ino)?;
        crate::edit::validate(&tree.catalog, target, staged.source()?)
            .map_err(|e| e.context(tree.path(ino)))
    }

    /// Commits the staged content of handle `h` (writing tree file `ino`) if it changed;
    /// content that is not a valid whole is refused, or with `Invalid::Wait` left staged.
    fn commit_handle(&self, ino: Ino, h: &mut Handle, invalid: Invalid) -> Result<Invalidate> {
        if !h.dirty {
            return Ok(Invalidate::default());
        }
        let staged = h.staged.as_mut().expect("a changed handle holds content");
        match self.commit_staged(ino, staged, invalid) {
            Ok(Some(inval)) => {
                h.dirty = false;
                h.refused = false;
                Ok(inval)
            }
            Ok(None) => Ok(Invalidate::default()),
            Err(e) => {
                h.refused = true;
                Err(e)
            }
        }
    }

    /// At a last close or an unmount: commits what changed since the last attempt; content
    /// whose commit was refused (and reported) is not tried again.
    fn commit_unreported(&self, ino: Ino, h: &mut Handle) -> Result<Invalidate> {
        if h.refused {
            return Ok(Invalidate::default());
        }
        self.commit_handle(ino, h, Invalid::Refuse)
    }

    /// Last close of a handle: commits what it still changed, then forgets it.
    pub fn release(&self, fh: u64) -> Result<()> {
        self.hidden.released(fh);
        let Some(shared) = self.handles.remove(fh) else {
            return Ok(());
        };
        let mut h = lock(&shared);
        let Target::Tree(ino) = h.target else {
            return Ok(());
        };
        let result = self.last_commit(ino, &mut h);
        drop(h);
        self.publish(ino, result.map(|inval| ((), inval)))
    }

    /// At a last close or an unmount: commits what changed since the last attempt (see
    /// `commit_unreported`); content an open emptied and nothing wrote since gets the
    /// refusal its closes got, which was not logged yet.
    fn last_commit(&self, ino: Ino, h: &mut Handle) -> Result<Invalidate> {
        if h.truncated_only && h.refused {
            return self.validate_staged(ino, h).map(|_| Invalidate::default());
        }
        self.commit_unreported(ino, h)
    }

    /// Commits what every open handle still changed (before an unmount), and logs each
    /// failure: nobody is left to report it to.
    pub fn commit_all(&self) {
        for shared in self.handles.all() {
            let mut h = lock(&shared);
            let Target::Tree(ino) = h.target else {
                continue;
            };
            match self.last_commit(ino, &mut h) {
                Ok(inval) => self.invalidator.inodes(inval.inodes, false),
                Err(e) => log::error!("commit before unmount failed: {e}"),
            }
        }
    }

    /// Renames: a scratch file onto a writable file replaces its content (a commit, which
    /// also shows the file's name again if an unlink hid it); scratch files may be renamed
    /// among themselves; tree files cannot move.
    pub fn rename(
        &self, parent: Ino, name: impl AsRef<OsStr>, new_parent: Ino, new_name: impl AsRef<OsStr>,
        mode: RenameMode,
    ) -> Result<()> {
        let tree = self.tree();
        let (name, new_name) = (name.as_ref(), new_name.as_ref());
        let name = utf8(name).ok_or_else(|| not_found_in(&tree, parent, name))?;
        let new_name = utf8(new_name).ok_or_else(|| not_utf8(new_name))?;
        let dst = tree.lookup(new_parent, new_name);
        let result = self.rename_inner(&tree, parent, name, new_parent, new_name, mode);
        self.publish(dst.unwrap_or(parent), result.map(|inval| ((), inval)))
    }

    fn rename_inner(
        &self, tree: &Tree, parent: Ino, name: &str, new_parent: Ino, new_name: &str,
        mode: RenameMode,
    ) -> Result<Invalidate> {
        if self.options.read_only {
            return Err(Fs::read_only_error());
        }
        if mode == RenameMode::Exchange {
            return Err(Error::new(
                libc::EPERM,
                "rename with RENAME_EXCHANGE: not supported in a ptefs tree (its shape is the model's)",
            ));
        }
        self.show_expired();
        let dst = tree.lookup(new_parent, new_name);
        let dst_hidden = dst.is_some_and(|d| self.hidden_ino(tree, d));
        let exists =
            (dst.is_some() && !dst_hidden) || self.scratch.lookup(new_parent, new_name).is_some();
        if mode == RenameMode::NoReplace && exists {
            return Err(Error::new(
                libc::EEXIST,
                format!("{}/{new_name} exists", tree.path(new_parent)),
            ));
        }
        let Some(src) = self.scratch.lookup(parent, name) else {
            return Err(match tree.lookup(parent, name) {
                Some(ino) if !self.hidden_ino(tree, ino) => Error::new(
                    libc::EPERM,
                    format!("{}/{name} cannot be moved or renamed", tree.path(parent)),
                ),
                _ => Error::not_found(format!("{}/{name}", tree.path(parent))),
            });
        };
        if let Some(dst) = dst {
            if tree.node(dst).is_none_or(|n| n.write.is_none()) {
                return Err(self.not_writable(tree, dst));
            }
            let content = self.scratch_content(src)?;
            let mut inval = self
                .commit_staged(dst, &mut scratch::lock(&content), Invalid::Refuse)?
                .unwrap_or_default();
            if dst_hidden {
                self.hidden.show(&tree.path(dst));
            }
            // Whoever holds the scratch inode (the kernel, for the new name) now holds the
            // file; new lookups of the name find the file's own inode.
            self.scratch.became(src, dst);
            inval.inodes.push(src);
            inval.entries.push((new_parent, new_name.to_string()));
            return Ok(inval);
        }
        if tree.children(new_parent).is_none() || !super::attr::dir_is_writable(tree, new_parent) {
            return Err(Error::new(
                libc::EACCES,
                format!("cannot move a scratch file into {}", tree.path(new_parent)),
            ));
        }
        self.scratch.rename(src, new_parent, new_name);
        Ok(Invalidate::default())
    }

    /// Deletes a scratch file, or hides the name of a writable tree file until it is created
    /// again (see `hidden`); other tree files cannot be deleted.
    pub fn unlink(&self, parent: Ino, name: impl AsRef<OsStr>) -> Result<()> {
        self.unlink_by(None, parent, name.as_ref())
    }

    /// `unlink` by process `by`, whose exit shows a name it hid again.
    pub(super) fn unlink_by(&self, by: Option<Process>, parent: Ino, name: &OsStr) -> Result<()> {
        if self.options.read_only {
            return Err(Fs::read_only_error());
        }
        let tree = self.tree();
        let missing = || not_found_in(&tree, parent, name);
        let name = utf8(name).ok_or_else(missing)?;
        self.show_expired();
        if let Some(ino) = self.scratch.lookup(parent, name) {
            self.scratch.remove(ino);
            return Ok(());
        }
        let ino = tree.lookup(parent, name).ok_or_else(missing)?;
        if self.hidden_ino(&tree, ino) {
            return Err(missing());
        }
        match tree.node(ino) {
            Some(node) if node.write.is_some() => {
                self.hide(&tree, ino, by);
                Ok(())
            }
            _ => Err(Error::new(
                libc::EPERM,
                format!(
                    "{}/{name} is part of the model and cannot be deleted",
                    tree.path(parent)
                ),
            )),
        }
    }
}
