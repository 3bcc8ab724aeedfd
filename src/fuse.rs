//! The `fuser::Filesystem` adapter: each kernel request becomes one call into `fs::Fs`, and
//! its result becomes the reply. No filesystem logic lives here, only translation: inode
//! numbers, attributes, open flags, the xattr size protocol, directory handles, and the
//! cache invalidations the kernel needs after a commit.
//!
//! Invariants: a request handler never calls into the kernel itself: invalidations go to
//! separate threads through channels, because the kernel may hold locks that an
//! invalidation needs until the handler replies. A handler that committed waits for its
//! invalidation at most `INVALIDATION_WAIT`, so it can be delayed but never deadlocked.
//! Every reply is sent exactly once.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags,
    PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::fs::{self, Attr, FileType, Fs, FsError, FsResult, Invalidate, SetAttr};
use crate::tree::{Content, Ino};

/// How long the kernel may cache entries and attributes. The daemon is the only writer and
/// invalidates what a commit changes, so this can be long.
pub const TTL: Duration = Duration::from_secs(3600);

/// `max_write`: large writes mean fewer requests when a tensor is replaced.
const MAX_WRITE: u32 = 16 << 20;

/// How far beyond a read the backing file is asked into the page cache. Reads copy from
/// the mapping, and a page fault on it reads only a small window of a cold file at a time.
const PREFETCH: u64 = 8 << 20;

/// `st_blksize` and the statfs block size, as the core reports for files.
const BLKSIZE: u32 = 1 << 20;

/// How long a request handler waits for the kernel to drop what a commit changed, before
/// it replies anyway. The invalidation runs on another thread, so a handler can never
/// deadlock on it (the kernel may hold a page lock that the invalidation needs until some
/// request is answered); the wait only makes "close() returned" mean "every reader sees
/// the new bytes" in all but that pathological case.
const INVALIDATION_WAIT: Duration = Duration::from_secs(1);

type InodeNotice = (Vec<Ino>, Option<SyncSender<()>>);

/// Where request handlers send cache invalidations for the kernel.
#[derive(Clone)]
pub struct Notices {
    inodes: Sender<InodeNotice>,
    entries: Sender<(Ino, OsString)>,
}

/// The other ends of `Notices`, served by two threads once the session exists: inode
/// invalidations (which a handler may wait for) never queue behind an entry invalidation
/// (which waits for directory locks that a rename in progress holds).
pub struct NoticeQueues {
    inodes: Receiver<InodeNotice>,
    entries: Receiver<(Ino, OsString)>,
}

pub fn notices() -> (Notices, NoticeQueues) {
    let (inodes, inodes_rx) = std::sync::mpsc::channel();
    let (entries, entries_rx) = std::sync::mpsc::channel();
    (
        Notices { inodes, entries },
        NoticeQueues {
            inodes: inodes_rx,
            entries: entries_rx,
        },
    )
}

impl Notices {
    /// Drops cached pages and attributes of `inodes`; with `wait`, returns once the kernel
    /// did (or after `INVALIDATION_WAIT`).
    pub fn inodes(&self, inodes: Vec<Ino>, wait: bool) {
        if inodes.is_empty() {
            return;
        }
        if !wait {
            let _ = self.inodes.send((inodes, None));
            return;
        }
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        if self.inodes.send((inodes, Some(done))).is_ok()
            && finished.recv_timeout(INVALIDATION_WAIT).is_err()
        {
            log::debug!("cache invalidation still running after {INVALIDATION_WAIT:?}");
        }
    }

    /// Forgets the cached name `name` in directory `parent`.
    pub fn entry(&self, parent: Ino, name: OsString) {
        let _ = self.entries.send((parent, name));
    }
}

impl NoticeQueues {
    /// Serves both queues until every `Notices` is gone.
    pub fn spawn(self, inodes: Notifier, entries: Notifier) -> io::Result<()> {
        let NoticeQueues {
            inodes: inodes_rx,
            entries: entries_rx,
        } = self;
        std::thread::Builder::new()
            .name("ptefs-inval".into())
            .spawn(move || {
                for (mut list, done) in inodes_rx {
                    list.sort_unstable();
                    list.dedup();
                    for ino in list {
                        // ENOENT only means the kernel holds nothing for this inode.
                        if let Err(e) = inodes.inval_inode(INodeNo(ino), 0, -1) {
                            log::trace!("invalidate inode {ino}: {e}");
                        }
                    }
                    if let Some(done) = done {
                        let _ = done.try_send(());
                    }
                }
            })?;
        std::thread::Builder::new()
            .name("ptefs-inval-dir".into())
            .spawn(move || {
                for (parent, name) in entries_rx {
                    if let Err(e) = entries.inval_entry(INodeNo(parent), &name) {
                        log::trace!("invalidate entry {parent}/{name:?}: {e}");
                    }
                }
            })?;
        Ok(())
    }
}

/// A directory's entries as `Fs::readdir` gave them, `.` and `..` first.
type Listing = Arc<Vec<(String, Attr)>>;

pub struct FuseFs {
    fs: Arc<Fs>,
    notices: Notices,
    /// Directory listings, taken once per `opendir` and served from there.
    dirs: Mutex<HashMap<u64, Listing>>,
    next_dir: AtomicU64,
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno)
}

fn to_fuser(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks(),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: match a.kind {
            FileType::Directory => fuser::FileType::Directory,
            FileType::RegularFile => fuser::FileType::RegularFile,
        },
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The reply to a lookup of a name that does not exist: a negative entry the kernel may
/// cache (names appear only through this mount, and the kernel drops the entry then).
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

fn name_str(name: &OsStr) -> FsResult<&str> {
    name.to_str().ok_or_else(|| {
        FsError::new(
            libc::ENOENT,
            format!("{name:?}: names in this tree are UTF-8"),
        )
    })
}

impl FuseFs {
    pub fn new(fs: Arc<Fs>, notices: Notices) -> FuseFs {
        FuseFs {
            fs,
            notices,
            dirs: Mutex::new(HashMap::new()),
            next_dir: AtomicU64::new(1),
        }
    }

    /// The core's inode for a kernel inode number.
    fn ino(&self, ino: INodeNo) -> Ino {
        self.fs.resolve(ino.0)
    }

    /// Drops the kernel's cache of what a commit changed, before the reply.
    fn invalidate(&self, inval: Invalidate) {
        for (parent, name) in inval.entries {
            self.notices.entry(parent, name.into());
        }
        self.notices.inodes(inval.inodes, true);
    }

    /// Result of a write-path operation: invalidations on success; on failure the reason
    /// goes to the log, and the kernel's cache of the file (which may hold the rejected
    /// bytes, written through it) is dropped.
    fn committed(&self, op: &str, ino: Ino, r: FsResult<Invalidate>) -> Result<(), Errno> {
        match r {
            Ok(inval) => {
                self.invalidate(inval);
                Ok(())
            }
            Err(e) => Err(self.failed(op, ino, e)),
        }
    }

    fn failed(&self, op: &str, ino: Ino, e: FsError) -> Errno {
        log::warn!("{op}: {}", e.message);
        self.notices.inodes(vec![ino], true);
        errno(&e)
    }

    fn refuse(&self, what: &str) -> Errno {
        if self.fs.options.read_only {
            Errno::EROFS
        } else {
            log::info!("{what}: not supported in a ptefs tree");
            Errno::EPERM
        }
    }

    /// Asks the kernel to read the backing bytes of a read, and what follows, into the page
    /// cache in the background (large reads instead of one fault at a time).
    fn prefetch(&self, ino: Ino, offset: u64, size: u32) {
        let tree = self.fs.tree();
        let Some(node) = tree.node(ino) else {
            return;
        };
        let (loc, header) = match &node.content {
            Content::Range(l) => (l, 0),
            Content::Npy { header, location } => (location, header.len() as u64),
            _ => return,
        };
        let clamp = |x: u64| x.saturating_sub(header).min(loc.range.len);
        let start = clamp(offset);
        let end = clamp(offset.saturating_add(size as u64).saturating_add(PREFETCH));
        let Some(file) = tree.model.files.get(loc.file).and_then(|f| f.file.as_ref()) else {
            return;
        };
        if end > start {
            // SAFETY: an advisory call on a descriptor the snapshot keeps open.
            unsafe {
                libc::posix_fadvise(
                    file.as_raw_fd(),
                    (loc.range.start + start) as libc::off_t,
                    (end - start) as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                )
            };
        }
    }

    fn listing(&self, ino: Ino, fh: u64, offset: u64) -> FsResult<Listing> {
        let mut dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        if offset != 0 {
            if let Some(l) = dirs.get(&fh) {
                return Ok(l.clone());
            }
        }
        let l = Arc::new(self.fs.readdir(ino)?);
        dirs.insert(fh, l.clone());
        Ok(l)
    }
}

impl fuser::Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // HANDLE_KILLPRIV_V2: files here never carry setuid bits or capabilities, so there
        // is nothing to drop on a write; without it the kernel asks for
        // `security.capability` before every write request.
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            if config.add_capabilities(flag).is_err() {
                log::debug!("the kernel does not offer {flag:?}");
            }
        }
        if let Err(max) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(max);
        }
        // As high as the kernel offered; raising it further needs the bdi's read_ahead_kb.
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn destroy(&mut self) {
        for r in self.fs.commit_all() {
            if let Err(e) = r {
                log::error!("commit at unmount failed: {}", e.message);
            }
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = name_str(name).and_then(|n| self.fs.lookup(self.ino(parent), n));
        match r {
            Ok(a) => reply.entry(&TTL, &to_fuser(&a), Generation(0)),
            Err(e) if e.errno == libc::ENOENT => {
                reply.entry(&TTL, &negative_entry(), Generation(0))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(self.ino(ino)) {
            Ok(a) => reply.attr(&TTL, &to_fuser(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            fh: fh.map(|f| f.0),
        };
        let ino = self.ino(ino);
        match self.fs.setattr(ino, change) {
            Ok((a, inval)) => {
                self.invalidate(inval);
                reply.attr(&TTL, &to_fuser(&a));
            }
            Err(e) => reply.error(self.failed("setattr", ino, e)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse("mknod"));
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse("mkdir"));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = name_str(name).and_then(|n| self.fs.unlink(self.ino(parent), n));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => {
                log::info!("unlink: {}", e.message);
                reply.error(errno(&e));
            }
        }
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refuse("rmdir"));
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse("symlink"));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (parent, newparent) = (self.ino(parent), self.ino(newparent));
        let (name, newname_str) = match (name_str(name), name_str(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(errno(&e)),
        };
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(self.refuse("rename with RENAME_EXCHANGE"));
        }
        let target = self.fs.lookup(newparent, newname_str).map(|a| a.ino);
        if flags.contains(RenameFlags::RENAME_NOREPLACE) && target.is_ok() {
            return reply.error(Errno::EEXIST);
        }
        let r = self.fs.rename(parent, name, newparent, newname_str);
        match self.committed("rename", target.unwrap_or(parent), r) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse("link"));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let ino = self.ino(ino);
        match self.fs.open(ino, flags.0) {
            Ok(fh) => {
                // Tree files keep their cached pages across opens: a commit drops them.
                let keep = if fs::is_scratch(ino) {
                    FopenFlags::empty()
                } else {
                    FopenFlags::FOPEN_KEEP_CACHE
                };
                reply.opened(FileHandle(fh), keep);
            }
            Err(e) => {
                if e.errno != libc::ENOENT {
                    log::info!("open: {}", e.message);
                }
                reply.error(errno(&e));
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ino = self.ino(ino);
        if !fs::is_scratch(ino) {
            self.prefetch(ino, offset, size);
        }
        let mut reply = Some(reply);
        let r = self.fs.read_with(ino, offset, size, |bytes| {
            if let Some(reply) = reply.take() {
                reply.data(bytes);
            }
        });
        if let Err(e) = r {
            log::warn!("read: {}", e.message);
            if let Some(reply) = reply.take() {
                reply.error(errno(&e));
            }
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => {
                log::warn!("write: {}", e.message);
                reply.error(errno(&e));
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let ino = self.ino(ino);
        match self.committed("close", ino, self.fs.flush(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.committed("release", self.ino(ino), self.fs.release(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let ino = self.ino(ino);
        match self.committed("fsync", ino, self.fs.fsync(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(self.ino(ino)) {
            Ok(a) if a.kind == FileType::Directory => {
                let fh = self.next_dir.fetch_add(1, Ordering::Relaxed);
                // The kernel caches listings across opens; it drops them itself when a
                // name is created, removed or renamed through the mount.
                reply.opened(
                    FileHandle(fh),
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
                );
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.listing(self.ino(ino), fh.0, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        for (i, (name, a)) in entries.iter().enumerate().skip(offset as usize) {
            let kind = to_fuser(a).kind;
            if reply.add(INodeNo(a.ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.listing(self.ino(ino), fh.0, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        for (i, (name, a)) in entries.iter().enumerate().skip(offset as usize) {
            let attr = to_fuser(a);
            if reply.add(
                INodeNo(a.ino),
                i as u64 + 1,
                name,
                &TTL,
                &attr,
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        const FRSIZE: u64 = 4096;
        let tree = self.fs.tree();
        let bytes: u64 = tree
            .model
            .files
            .iter()
            .map(|f| f.bytes().len() as u64)
            .sum();
        reply.statfs(
            bytes.div_ceil(FRSIZE),
            0,
            0,
            tree.nodes.len() as u64,
            0,
            BLKSIZE,
            255,
            FRSIZE as u32,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if self.fs.options.read_only {
            return reply.error(Errno::EROFS);
        }
        if name.to_string_lossy().starts_with("user.ptefs.") {
            reply.error(Errno::EPERM);
        } else {
            reply.error(Errno::ENOTSUP);
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // Only the user namespace exists here. ENOTSUP (not ENODATA) for the others lets
        // `ls -l` remember that this filesystem has no SELinux labels or ACLs, instead of
        // asking twice per file.
        if !name.as_bytes().starts_with(b"user.") {
            return reply.error(Errno::ENOTSUP);
        }
        let r = name_str(name)
            .map_err(|_| FsError::new(libc::ENODATA, "no such attribute"))
            .and_then(|n| self.fs.getxattr(self.ino(ino), n));
        match r {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(value) => reply.data(&value),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(self.ino(ino)) {
            Ok(names) => {
                let mut list = Vec::new();
                for n in names {
                    list.extend_from_slice(n.as_bytes());
                    list.push(0);
                }
                if size == 0 {
                    reply.size(list.len() as u32);
                } else if list.len() > size as usize {
                    reply.error(Errno::ERANGE);
                } else {
                    reply.data(&list);
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.fs.options.read_only {
            return reply.error(Errno::EROFS);
        }
        if name.to_string_lossy().starts_with("user.ptefs.") {
            reply.error(Errno::EPERM);
        } else {
            reply.error(Errno::ENODATA);
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let a = match self.fs.getattr(self.ino(ino)) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        // The mode bits tell the truth about what this mount allows, for every user.
        if mask.contains(AccessFlags::W_OK) && a.perm & 0o200 == 0 {
            return reply.error(if self.fs.options.read_only {
                Errno::EROFS
            } else {
                Errno::EACCES
            });
        }
        if mask.contains(AccessFlags::X_OK) && a.perm & 0o100 == 0 {
            return reply.error(Errno::EACCES);
        }
        reply.ok();
    }

    // Operations the tree has no use for, answered without fuser's "not implemented"
    // warnings. ENOSYS makes the kernel stop asking and use its generic code.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = name_str(name).and_then(|n| self.fs.create(self.ino(parent), n, flags));
        match r {
            Ok((a, fh)) => reply.created(
                &TTL,
                &to_fuser(&a),
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => {
                log::info!("create: {}", e.message);
                reply.error(errno(&e));
            }
        }
    }
}
