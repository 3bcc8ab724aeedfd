//! The `fuser::Filesystem` adapter: each kernel request becomes one call into `fs::Fs`, and
//! its result becomes the reply. Nothing is decided here: inode numbers, attributes, flags
//! and errors are translated, and every error goes through `fuse_error!`, which logs it at
//! the level the core gave it.
//!
//! Invariant: every reply is sent exactly once.

mod notices;

pub use notices::{notices, NoticeQueues, Notices};

use std::ffi::OsStr;
use std::io;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents,
    PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyPoll,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::error::{Error, Result};
use crate::fs::access::Caller;
use crate::fs::{self, Attr, FileType, Fs, Opened, RenameMode, SetAttr};

/// `max_write`: large writes mean fewer requests when a tensor is replaced.
const MAX_WRITE: u32 = 16 << 20;

/// Logs `$e` (a `crate::error::Error`) for operation `$op` at its level and replies with its
/// errno.
macro_rules! fuse_error {
    ($op:expr, $reply:expr, $e:expr) => {{
        let e: Error = $e;
        log::log!(e.level(), "{}: {}", $op, e.message());
        $reply.error(Errno::from_i32(e.errno()))
    }};
}

/// Replies to an operation the tree has no use for with the core's refusal.
macro_rules! fuse_unsupported {
    ($self:expr, $op:expr, $reply:expr) => {
        fuse_error!($op, $reply, $self.fs.unsupported($op))
    };
}

pub struct FuseFs {
    fs: std::sync::Arc<Fs>,
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

/// Inode 0 is how a negative entry reads on the wire.
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
        blksize: fs::BLOCK_SIZE,
        flags: 0,
    }
}

/// The user a request comes from, for the core's permission checks.
fn caller(req: &Request) -> Caller {
    Caller::of_process(req.uid(), req.gid(), req.pid())
}

fn open_flags(o: &Opened) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.cache_dir {
        f |= FopenFlags::FOPEN_CACHE_DIR;
    }
    f
}

/// Names in this tree are UTF-8; any other name cannot exist in it.
fn name_str(name: &OsStr) -> Result<&str> {
    name.to_str()
        .ok_or_else(|| Error::not_found(format!("{name:?} (names in this tree are UTF-8)")))
}

fn rename_mode(flags: RenameFlags) -> RenameMode {
    if flags.contains(RenameFlags::RENAME_EXCHANGE) {
        RenameMode::Exchange
    } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
        RenameMode::NoReplace
    } else {
        RenameMode::Replace
    }
}

/// The xattr size protocol: a size of 0 asks for the length only.
fn reply_xattr(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

/// Replies to an operation with nothing to return.
fn empty(op: &str, reply: ReplyEmpty, result: Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => fuse_error!(op, reply, e),
    }
}

impl FuseFs {
    pub fn new(fs: std::sync::Arc<Fs>) -> FuseFs {
        FuseFs { fs }
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
        for e in self.fs.commit_all() {
            log::error!("commit at unmount failed: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = name_str(name).and_then(|n| self.fs.lookup_entry(parent.0, n));
        match r {
            Ok(entry) => match entry.attr {
                Some(a) => reply.entry(&entry.ttl, &to_fuser(&a), Generation(0)),
                None => reply.entry(&entry.ttl, &negative_entry(), Generation(0)),
            },
            Err(e) => fuse_error!("lookup", reply, e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr_via(ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&fs::TTL, &to_fuser(&a)),
            Err(e) => fuse_error!("getattr", reply, e),
        }
    }

    fn setattr(
        &self, req: &Request, ino: INodeNo, mode: Option<u32>, uid: Option<u32>, gid: Option<u32>,
        size: Option<u64>, _atime: Option<TimeOrNow>, _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>, fh: Option<FileHandle>, _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>, _bkuptime: Option<SystemTime>, _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            fh: fh.map(|f| f.0),
        };
        match self.fs.setattr_as(&caller(req), ino.0, change) {
            Ok(a) => reply.attr(&fs::TTL, &to_fuser(&a)),
            Err(e) => fuse_error!("setattr", reply, e),
        }
    }

    fn mknod(
        &self, _req: &Request, _parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32,
        _rdev: u32, reply: ReplyEntry,
    ) {
        fuse_unsupported!(self, "mknod", reply)
    }

    fn mkdir(
        &self, _req: &Request, _parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32,
        reply: ReplyEntry,
    ) {
        fuse_unsupported!(self, "mkdir", reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            "unlink",
            reply,
            name_str(name).and_then(|n| self.fs.unlink_as(&caller(req), parent.0, n)),
        )
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        fuse_unsupported!(self, "rmdir", reply)
    }

    fn symlink(
        &self, _req: &Request, _parent: INodeNo, _link_name: &OsStr, _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        fuse_unsupported!(self, "symlink", reply)
    }

    fn rename(
        &self, req: &Request, parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr,
        flags: RenameFlags, reply: ReplyEmpty,
    ) {
        let r = name_str(name).and_then(|n| {
            let new = name_str(newname)?;
            self.fs.rename_as(
                &caller(req),
                parent.0,
                n,
                newparent.0,
                new,
                rename_mode(flags),
            )
        });
        empty("rename", reply, r)
    }

    fn link(
        &self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        fuse_unsupported!(self, "link", reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open_as(&caller(req), ino.0, flags.0) {
            Ok(o) => reply.opened(FileHandle(o.fh), open_flags(&o)),
            Err(e) => fuse_error!("open", reply, e),
        }
    }

    fn read(
        &self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, size: u32,
        _flags: OpenFlags, _lock_owner: Option<LockOwner>, reply: ReplyData,
    ) {
        let mut reply = Some(reply);
        let r = self.fs.read_with(ino.0, Some(fh.0), offset, size, |bytes| {
            if let Some(reply) = reply.take() {
                reply.data(bytes);
            }
        });
        if let (Err(e), Some(reply)) = (r, reply.take()) {
            fuse_error!("read", reply, e);
        }
    }

    fn write(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, data: &[u8],
        _write_flags: WriteFlags, _flags: OpenFlags, _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => fuse_error!("write", reply, e),
        }
    }

    fn flush(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        empty("close", reply, self.fs.flush(fh.0))
    }

    fn release(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags,
        _lock_owner: Option<LockOwner>, _flush: bool, reply: ReplyEmpty,
    ) {
        empty("release", reply, self.fs.release(fh.0))
    }

    fn fsync(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty,
    ) {
        empty("fsync", reply, self.fs.fsync(fh.0))
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir_as(&caller(req), ino.0) {
            Ok(o) => reply.opened(FileHandle(o.fh), open_flags(&o)),
            Err(e) => fuse_error!("opendir", reply, e),
        }
    }

    fn readdir(
        &self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory,
    ) {
        let entries = match self.fs.readdir(ino.0, fh.0, offset) {
            Ok(l) => l,
            Err(e) => return fuse_error!("readdir", reply, e),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            let kind = to_fuser(&e.attr).kind;
            if reply.add(INodeNo(e.attr.ino), i as u64 + 1, kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.fs.readdir(ino.0, fh.0, offset) {
            Ok(l) => l,
            Err(e) => return fuse_error!("readdirplus", reply, e),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            let attr = to_fuser(&e.attr);
            if reply.add(
                INodeNo(e.attr.ino),
                i as u64 + 1,
                &e.name,
                &fs::TTL,
                &attr,
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    fn setxattr(
        &self, _req: &Request, ino: INodeNo, name: &OsStr, _value: &[u8], _flags: i32,
        _position: u32, reply: ReplyEmpty,
    ) {
        let r = self.fs.setxattr(ino.0, &name.to_string_lossy());
        empty("setxattr", reply, r)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = name_str(name)
            .map_err(|_| Error::new(libc::ENODATA, format!("no attribute {name:?}")))
            .and_then(|n| self.fs.getxattr(ino.0, n));
        match r {
            Ok(value) => reply_xattr(reply, &value, size),
            Err(e) => fuse_error!("getxattr", reply, e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut list = Vec::new();
                for n in names {
                    list.extend_from_slice(n.as_bytes());
                    list.push(0);
                }
                reply_xattr(reply, &list, size);
            }
            Err(e) => fuse_error!("listxattr", reply, e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            "removexattr",
            reply,
            self.fs.removexattr(ino.0, &name.to_string_lossy()),
        )
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let r = self.fs.access_as(&caller(req), ino.0, mask.bits());
        empty("access", reply, r)
    }

    fn create(
        &self, req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, flags: i32,
        reply: ReplyCreate,
    ) {
        let created =
            name_str(name).and_then(|n| self.fs.create_as(&caller(req), parent.0, n, flags));
        match created {
            Ok((a, o)) => reply.created(
                &fs::TTL,
                &to_fuser(&a),
                Generation(0),
                FileHandle(o.fh),
                open_flags(&o),
            ),
            Err(e) => fuse_error!("create", reply, e),
        }
    }

    // Operations the tree has no use for, answered without fuser's "not implemented"
    // warnings. ENOSYS makes the kernel stop asking and use its generic code.
    fn ioctl(
        &self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _flags: IoctlFlags, _cmd: u32,
        _in_data: &[u8], _out_size: u32, reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn poll(
        &self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _ph: PollNotifier,
        _events: PollEvents, _flags: PollFlags, reply: ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _offset: u64, _length: u64,
        _mode: i32, reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _offset: i64, _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self, _req: &Request, _ino_in: INodeNo, _fh_in: FileHandle, _offset_in: u64,
        _ino_out: INodeNo, _fh_out: FileHandle, _offset_out: u64, _len: u64,
        _flags: CopyFileRangeFlags, reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }
}
