//! The filesystem without FUSE: every operation the kernel can ask for, answered from the
//! current `Tree`, with errors as errno values, and every decision about caching, handles and
//! permissions made here. `crate::fuse` only translates.
//!
//! Invariants: a request works on one snapshot (`Arc<Tree>`) from start to end, so a reader
//! sees the old or the new file after a commit, never a mix; nothing the kernel sends can make
//! an operation panic (unknown inodes and handles are `ENOENT`/`EBADF`); reads never touch a
//! mapped byte beyond the backing file's current size; what the kernel must forget after a
//! commit is sent through the `Invalidator` once the operation holds no lock.

pub mod access;
mod attr;
mod commit;
mod dirs;
mod external;
mod handles;
mod hidden;
mod invalidate;
mod read;
mod refusals;
mod reply;
mod scratch;
mod staging;
mod stream;
mod write;

pub use attr::{Attr, FileType, BLOCK_SIZE};
pub use dirs::{DirEntry, DirPage};
pub use invalidate::{Invalidator, NoInvalidation};
pub use read::ReadData;
pub use refusals::{ERRORS_INO, ERRORS_NAME};
pub use reply::{Capability, Entry, KernelConfig, Lookup, Opened, StatFs, Unsupported};
pub use staging::SizeLimits;
pub use write::{RenameMode, SetAttr};

use std::ffi::OsStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::tree::{Ino, Tree};

/// How long the kernel may cache names and attributes. The daemon is the only writer and
/// invalidates what a commit changes, so this can be long.
const TTL: Duration = Duration::from_secs(3600);

/// The longest name a directory entry can carry (`NAME_MAX`).
pub const NAME_MAX: u32 = 255;

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub read_only: bool,
}

/// Names in this tree, and of its extended attributes, are UTF-8: the model's names are
/// strings, shown percent-encoded where they cannot be file names. A name that is not UTF-8
/// names nothing here: each operation answers as it does for a name that does not exist
/// (ENOENT, a negative entry, ENODATA), and nothing can be created under it (EINVAL).
fn utf8(name: &OsStr) -> Option<&str> {
    name.to_str()
}

/// ENOENT for `name` in directory `parent`.
fn not_found_in(tree: &Tree, parent: Ino, name: &OsStr) -> Error {
    Error::not_found(format!("{}/{}", tree.path(parent), name.to_string_lossy()))
}

/// The refusal of a name that cannot be created here (see `utf8`).
fn not_utf8(name: &OsStr) -> Error {
    Error::invalid(format!(
        "{name:?}: names in this tree are UTF-8, like the model's own"
    ))
}

/// `access(2)` bits.
pub const R_OK: i32 = 4;
pub const W_OK: i32 = 2;
pub const X_OK: i32 = 1;

/// Ownership, mode and times of a model file, which the nodes of its tree show.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// The model file's permission bits; nodes never show more than these allow.
    pub mode: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

impl Identity {
    pub fn of(meta: &std::fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        let at = |secs: i64, nanos: i64| {
            let d =
                std::time::Duration::new(secs.unsigned_abs(), nanos.clamp(0, 999_999_999) as u32);
            if secs >= 0 {
                SystemTime::UNIX_EPOCH + d
            } else {
                SystemTime::UNIX_EPOCH - d
            }
        };
        Identity {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
            atime: at(meta.atime(), meta.atime_nsec()),
            mtime: at(meta.mtime(), meta.mtime_nsec()),
            ctime: at(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// For models held in memory (tests): root's, readable and writable by its owner.
    fn unknown() -> Identity {
        Identity {
            uid: 0,
            gid: 0,
            mode: 0o644,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
        }
    }
}

pub struct Fs {
    tree: RwLock<Arc<Tree>>,
    /// Per model file, in the model's order.
    identities: RwLock<Vec<Identity>>,
    pub options: Options,
    handles: handles::Handles,
    /// Where staged content spills (the model's directory), and the memory it may take.
    spill: Arc<staging::Spill>,
    scratch: scratch::ScratchFiles,
    /// Names of writable files an unlink hid until they are created again.
    hidden: hidden::Hidden,
    dirs: dirs::DirHandles,
    invalidator: Arc<dyn Invalidator>,
    /// Held for reading while mapped bytes are handed out, for writing while a commit
    /// changes them in place, so no reply mixes old and new bytes.
    gate: RwLock<()>,
    /// One commit at a time.
    commit_lock: std::sync::Mutex<()>,
    /// Told before a re-layout renames a new file over a model file, and of every new
    /// snapshot while the previous one still holds its files open.
    watcher: Arc<dyn crate::edit::FileWatcher>,
    /// The refusals of writes, for `user.ptefs.error` and the `errors` file.
    refusals: refusals::Refusals,
    /// Whether the root shows the `errors` file (mounts do; offline commands do not).
    errors_file: bool,
    /// Changes of the files' bytes, for handles and for changes made behind the mount.
    changes: external::Changes,
    /// The name map file the named views were read from (`--names MAP`): replaced with the
    /// new digests after each write by name (docs/writes.md#writing-through-the-named-views).
    names_file: Option<std::path::PathBuf>,
    /// Model files commits wrote since the named views' map last got their digests.
    stale_digests: std::sync::Mutex<Vec<crate::format::layout::FileIndex>>,
}

/// The identity of each model file of `tree`.
fn identities_of(tree: &Tree) -> Vec<Identity> {
    tree.model
        .files
        .iter()
        .map(|f| {
            f.file
                .as_ref()
                .and_then(|f| f.metadata().ok())
                .map(|m| Identity::of(&m))
                .unwrap_or_else(Identity::unknown)
        })
        .collect()
}

impl Fs {
    /// A filesystem whose commits need no cache invalidation (offline commands, tests).
    pub fn new(tree: Tree, options: Options) -> Fs {
        Fs::with_invalidator(tree, options, Arc::new(NoInvalidation))
    }

    pub fn with_invalidator(tree: Tree, options: Options, invalidator: Arc<dyn Invalidator>) -> Fs {
        let identities = identities_of(&tree);
        let spill = staging::Spill::new(tree.model.files[0].dir.clone(), staging::MEMORY_BUDGET);
        Fs {
            tree: RwLock::new(Arc::new(tree)),
            identities: RwLock::new(identities),
            options,
            handles: Default::default(),
            spill,
            scratch: Default::default(),
            hidden: Default::default(),
            dirs: Default::default(),
            invalidator,
            gate: RwLock::new(()),
            commit_lock: Default::default(),
            watcher: Arc::new(crate::edit::Unwatched),
            refusals: Default::default(),
            errors_file: false,
            changes: Default::default(),
            names_file: None,
            stale_digests: Default::default(),
        }
    }

    /// Replaces the name map file at `path` after each write by name (a mount's `--names
    /// MAP`; not a checkpoint).
    pub fn with_names_file(mut self, path: Option<std::path::PathBuf>) -> Fs {
        self.names_file = path;
        self
    }

    /// Shows the `errors` file at the root (see `refusals`).
    pub fn with_errors_file(mut self) -> Fs {
        self.errors_file = true;
        self
    }

    /// Whether `ino` is the `errors` file of this mount.
    fn is_errors(&self, ino: Ino) -> bool {
        self.errors_file && ino == ERRORS_INO
    }

    /// Keeps the refusal of a write of tree file `ino` where the user can read it.
    fn record_refusal(&self, tree: &Tree, ino: Ino, e: &Error) {
        if tree.node(ino).is_none() {
            return;
        }
        let path = tree.path(ino);
        // Messages start with the path they are about; the log has its own column for it.
        let reason = e
            .message()
            .strip_prefix(&format!("{path}: "))
            .unwrap_or(e.message());
        self.refusals.record(ino, &path, reason);
        if self.errors_file {
            self.invalidator.inodes(vec![ERRORS_INO], true);
        }
    }

    /// Tells `watcher` of re-layouts and new snapshots (see `edit::FileWatcher`).
    pub fn watched_by(mut self, watcher: Arc<dyn crate::edit::FileWatcher>) -> Fs {
        self.watcher = watcher;
        self
    }

    /// The current snapshot.
    pub fn tree(&self) -> Arc<Tree> {
        self.tree.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the snapshot after a commit.
    fn replace_tree(&self, tree: Tree) {
        self.watcher.now_open(&tree.model);
        // Directories the old snapshot built are built in the new one, so that what a later
        // commit invalidates covers the inodes the kernel holds: before the swap, and again
        // after it for a directory a request built in between.
        tree.adopt_built(&self.tree());
        let new = Arc::new(tree);
        let old = std::mem::replace(
            &mut *self.tree.write().unwrap_or_else(|e| e.into_inner()),
            new.clone(),
        );
        new.adopt_built(&old);
        self.refresh_identity();
        // Unmapping a large file frees its page tables, which takes a quarter of a second
        // per GiB: do it off the request path. (Should the thread not start, the closure is
        // dropped here, which unmaps inline.)
        let _ = std::thread::Builder::new()
            .name("ptefs-unmap".into())
            .spawn(move || drop(old));
    }

    /// Frees memory kept for writes that have not come (see `staging::SPARE_KEPT_FOR`).
    pub fn free_idle_memory(&self) {
        self.spill.free_idle_spare(staging::SPARE_KEPT_FOR);
    }

    /// Takes the model files' owners, modes and times again (after a commit, and at every
    /// open: a `chmod` or `chown` of a model shows at once). When an owner or mode changed,
    /// the kernel forgets the attributes it cached.
    pub fn refresh_identity(&self) {
        let fresh = identities_of(&self.tree());
        let changed = {
            let mut held = self.identities.write().unwrap_or_else(|e| e.into_inner());
            let changed = held.len() != fresh.len()
                || held
                    .iter()
                    .zip(&fresh)
                    .any(|(a, b)| (a.uid, a.gid, a.mode) != (b.uid, b.gid, b.mode));
            *held = fresh;
            changed
        };
        if changed {
            self.invalidator.inodes(self.tree().built_inodes(), false);
        }
    }

    /// The owner, mode and times a node shows: those of the file whose tree it is in, with
    /// no permission bit another file it shows bytes of lacks.
    pub fn identity_of(&self, tree: &Tree, ino: Ino) -> Identity {
        let held = self.identities.read().unwrap_or_else(|e| e.into_inner());
        let files = tree.files_read(ino);
        let mut id = files
            .first()
            .and_then(|&f| held.get(f))
            .copied()
            .unwrap_or_else(Identity::unknown);
        for f in files.iter().skip(1).filter_map(|&f| held.get(f)) {
            id.mode &= f.mode;
        }
        id
    }

    fn read_only_error() -> Error {
        Error::new(libc::EROFS, "the mount is read-only")
    }

    /// What the kernel is asked for when the session starts.
    pub fn kernel_config(&self) -> KernelConfig {
        KernelConfig {
            capabilities: vec![
                Capability::ReaddirPlus,
                Capability::ParallelDirops,
                Capability::HandleKillprivV2,
            ],
            max_write: 16 << 20,
            max_readahead: u32::MAX,
            max_background: 64,
        }
    }

    /// The refusal of an operation the tree has no use for. Shaping the tree (mknod, mkdir,
    /// rmdir, symlink, link) is EPERM: its shape is the model's. The rest is ENOSYS, after
    /// which the kernel stops asking and uses its own code (`lseek` of data and holes,
    /// `copy_file_range` through reads and writes, `fsync` of a directory, whose entries
    /// change only at commits, which are durable when they return), or ENOTTY for ioctls.
    pub fn unsupported(&self, op: Unsupported) -> Error {
        match op {
            Unsupported::Mknod
            | Unsupported::Mkdir
            | Unsupported::Rmdir
            | Unsupported::Symlink
            | Unsupported::Link => {
                if self.options.read_only {
                    Fs::read_only_error()
                } else {
                    Error::new(
                        libc::EPERM,
                        format!(
                            "{}: not supported in a ptefs tree (its shape is the model's)",
                            op.name()
                        ),
                    )
                }
            }
            Unsupported::Ioctl => Error::new(libc::ENOTTY, "no ioctls here"),
            _ => Error::new(
                libc::ENOSYS,
                format!("{}: the kernel's own code serves it", op.name()),
            ),
        }
    }

    /// Attributes of a name in a directory, or ENOENT (also for a name an unlink hid).
    pub fn lookup(&self, parent: Ino, name: impl AsRef<OsStr>) -> Result<Attr> {
        let name = name.as_ref();
        let tree = self.tree();
        if tree.children(parent).is_none() {
            return Err(match tree.node(parent) {
                Some(_) => Error::new(libc::ENOTDIR, format!("inode {parent} is not a directory")),
                None => Error::not_found(format!("inode {parent}")),
            });
        }
        let missing = || not_found_in(&tree, parent, name);
        let name = utf8(name).ok_or_else(missing)?;
        self.show_expired();
        let ino = match tree.lookup(parent, name) {
            Some(ino) if self.hidden_ino(&tree, ino) => return Err(missing()),
            Some(ino) => ino,
            None if parent == crate::tree::ROOT && name == ERRORS_NAME && self.errors_file => {
                ERRORS_INO
            }
            None => self.scratch.lookup(parent, name).ok_or_else(missing)?,
        };
        self.attr_in(&tree, ino)
    }

    /// A lookup as the kernel wants it: a missing name is a negative entry, not an error.
    pub fn lookup_entry(&self, parent: Ino, name: impl AsRef<OsStr>) -> Result<Lookup> {
        let name = name.as_ref();
        match self.lookup(parent, name) {
            Ok(attr) => Ok(Lookup::Found(Entry::new(attr))),
            Err(e) if e.errno() == libc::ENOENT => {
                let hidden = self.hidden_file(parent, name).is_some();
                Ok(Lookup::Missing {
                    ttl: if hidden { Duration::ZERO } else { TTL },
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The attributes everyone sees: committed sizes.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.attr_in(&self.tree(), self.canonical_ino(ino))
    }

    /// The attributes seen through handle `fh`: the committed ones, also for a writer. The
    /// kernel keeps one size per file for everyone, so a writer's staged size given here
    /// would show a file half written (or empty, after an `O_TRUNC` open) to every other
    /// process until the commit.
    pub fn getattr_entry(&self, ino: Ino, _fh: Option<u64>) -> Result<Entry> {
        Ok(Entry::new(self.getattr(ino)?))
    }

    /// A read of what everyone sees (committed bytes, or a scratch file's), as an owned
    /// value (offline commands, tests). The mount uses `read_with`.
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<ReadData> {
        let ino = self.canonical_ino(ino);
        let tree = self.tree();
        if self.is_errors(ino) {
            let text = self.refusals.text();
            let start = (offset as usize).min(text.len());
            let end = start.saturating_add(size as usize).min(text.len());
            return Ok(ReadData::owned(tree, text[start..end].to_vec()));
        }
        if let Some(content) = self.scratch.content(ino) {
            return Ok(ReadData::owned(
                tree,
                scratch::lock(&content).read(offset, size)?,
            ));
        }
        read::read(tree, ino, offset, size)
    }

    /// Hands `reply` the bytes of a read through handle `fh` (or why there are none) while
    /// no commit can change them: a writer reads what it staged, everyone else the committed
    /// bytes. Asks the kernel first to bring what follows into the page cache.
    pub fn read_with<R>(
        &self, ino: Ino, fh: Option<u64>, offset: u64, size: u32,
        reply: impl FnOnce(Result<&[u8]>) -> R,
    ) -> R {
        let mut opened_at = None;
        if let Some(h) = fh.and_then(|fh| self.handles.get(fh).ok()) {
            let mut h = handles::lock(&h);
            if let Some(staged) = &mut h.staged {
                return match staged.read(offset, size) {
                    Ok(bytes) => reply(Ok(&bytes)),
                    Err(e) => reply(Err(e)),
                };
            }
            opened_at = Some(h.opened_at);
        }
        if self.is_errors(ino) {
            return match self.read(ino, offset, size) {
                Ok(data) => reply(Ok(data.bytes())),
                Err(e) => reply(Err(e)),
            };
        }
        // Bytes changed behind the mount are never served: checked before the read, and
        // after it, so the next read fails (see `external`).
        if let Err(e) = self.check_files(false) {
            return reply(Err(e));
        }
        let ino = self.canonical_ino(ino);
        let tree = self.tree();
        if let Some(opened) = opened_at {
            if let Err(e) = self.refuse_changed_since(&tree, ino, opened) {
                return reply(Err(e));
            }
        }
        read::read_ahead(&tree, ino, offset, size);
        let result = {
            let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            match self.read(ino, offset, size) {
                Ok(data) => reply(Ok(data.bytes())),
                Err(e) => reply(Err(e)),
            }
        };
        let _ = self.check_files(false);
        result
    }

    /// `statfs`: the model's bytes and nodes, nothing free.
    pub fn statfs(&self) -> StatFs {
        const FRSIZE: u64 = 4096;
        let tree = self.tree();
        let bytes: u64 = tree.model.files.iter().map(|f| f.len()).sum();
        StatFs {
            blocks: bytes.div_ceil(FRSIZE),
            bfree: 0,
            bavail: 0,
            files: tree.node_count(),
            ffree: 0,
            bsize: BLOCK_SIZE,
            namelen: NAME_MAX,
            frsize: FRSIZE as u32,
        }
    }

    /// `access(2)`: the mode bits tell the truth about what this mount allows.
    pub fn access(&self, ino: Ino, mask: i32) -> Result<()> {
        let a = self.getattr(ino)?;
        if mask & W_OK != 0 && a.perm & 0o200 == 0 {
            return Err(if self.options.read_only {
                Fs::read_only_error()
            } else {
                Error::new(
                    libc::EACCES,
                    format!("{}: read-only", self.tree().path(self.canonical_ino(ino))),
                )
            });
        }
        if mask & X_OK != 0 && a.perm & 0o100 == 0 {
            return Err(Error::new(
                libc::EACCES,
                format!(
                    "{}: not executable",
                    self.tree().path(self.canonical_ino(ino))
                ),
            ));
        }
        Ok(())
    }

    /// The `user.ptefs.*` attributes of a node; scratch files have none.
    fn xattrs(&self, ino: Ino) -> Result<Vec<(String, String)>> {
        let ino = self.canonical_ino(ino);
        if self.scratch.contains(ino) || self.is_errors(ino) {
            return Ok(Vec::new());
        }
        let tree = self.tree();
        if tree.node(ino).is_none() {
            return Err(Error::not_found(format!("inode {ino}")));
        }
        let mut x = tree.xattrs(ino);
        if let Some(reason) = self.refusals.last_of(ino) {
            x.push(("user.ptefs.error".to_string(), reason));
        }
        Ok(x)
    }

    pub fn listxattr(&self, ino: Ino) -> Result<Vec<String>> {
        Ok(self.xattrs(ino)?.into_iter().map(|(k, _)| k).collect())
    }

    /// Only the `user.` namespace exists here. ENOTSUP (not ENODATA) for the others lets
    /// `ls -l` remember that this filesystem has no SELinux labels or ACLs, instead of asking
    /// twice per file.
    pub fn getxattr(&self, ino: Ino, name: impl AsRef<OsStr>) -> Result<Vec<u8>> {
        let name = name.as_ref();
        let missing = || {
            let path = self.tree().path(self.canonical_ino(ino));
            Error::new(libc::ENODATA, format!("{path}: no attribute {name:?}"))
        };
        let name = utf8(name).ok_or_else(missing)?;
        if !name.starts_with("user.") {
            return Err(Error::new(
                libc::ENOTSUP,
                format!("{name}: only user.* attributes exist here"),
            ));
        }
        self.xattrs(ino)?
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_bytes())
            .ok_or_else(missing)
    }

    /// `setxattr`: the `user.ptefs.*` attributes describe the model and cannot be set; there
    /// is nowhere to keep others.
    pub fn setxattr(&self, ino: Ino, name: impl AsRef<OsStr>) -> Result<()> {
        self.change_xattr(ino, name.as_ref(), "changed", |name| {
            Error::new(
                libc::ENOTSUP,
                format!("{name:?}: this tree keeps no attributes of its own"),
            )
        })
    }

    /// `removexattr`: the `user.ptefs.*` attributes cannot be removed, and there are no
    /// others.
    pub fn removexattr(&self, ino: Ino, name: impl AsRef<OsStr>) -> Result<()> {
        self.change_xattr(ino, name.as_ref(), "removed", |name| {
            Error::new(libc::ENODATA, format!("no attribute {name:?}"))
        })
    }

    /// The refusal of a change to attribute `name` of `ino`: EROFS on a read-only mount,
    /// EPERM for the model's own attributes, `other` for the rest.
    fn change_xattr(
        &self, ino: Ino, name: &OsStr, verb: &str, other: impl FnOnce(&OsStr) -> Error,
    ) -> Result<()> {
        self.getattr(ino)?;
        if self.options.read_only {
            return Err(Fs::read_only_error());
        }
        match utf8(name) {
            Some(n) if n.starts_with("user.ptefs.") => Err(Error::new(
                libc::EPERM,
                format!("{n} describes the model and cannot be {verb}"),
            )),
            _ => Err(other(name)),
        }
    }
}
