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
use std::path::Path;
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
use crate::fs::{
    self, Attr, Capability, Entry, FileType, Fs, Lookup, Opened, RenameMode, SetAttr, Unsupported,
};

/// Logs `$e` (a `crate::error::Error`) for operation `$op` at its level and replies with its
/// errno.
macro_rules! fuse_error {
    ($op:expr, $reply:expr, $e:expr) => {{
        let e: Error = $e;
        log::log!(e.level(), "{}: {}", $op, e.message());
        $reply.error(Errno::from_i32(e.errno()))
    }};
}

/// Replies with what `$ok` makes of the value of `$result`, or with its error.
macro_rules! fuse_reply {
    ($op:expr, $reply:ident, $result:expr, $v:pat => $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(e) => fuse_error!($op, $reply, e),
        }
    };
}

/// Callbacks of operations the core refuses (`Fs::unsupported` decides how), listed as
/// `callback = Unsupported variant(argument types after the request) -> reply type`; they
/// answer with the core's error instead of fuser's "not implemented" warnings.
macro_rules! fuse_unsupported {
    ($($callback:ident = $op:ident($($arg:ty),*) -> $reply:ty;)*) => {
        $(
            fn $callback(&self, _req: &Request, $(_: $arg,)* reply: $reply) {
                fuse_error!(stringify!($callback), reply, self.fs.unsupported(Unsupported::$op))
            }
        )*
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
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

fn kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::Directory => fuser::FileType::Directory,
        FileType::RegularFile => fuser::FileType::RegularFile,
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

fn capability(c: Capability) -> InitFlags {
    match c {
        Capability::ReaddirPlus => InitFlags::FUSE_DO_READDIRPLUS,
        Capability::AtomicOTrunc => InitFlags::FUSE_ATOMIC_O_TRUNC,
        Capability::ParallelDirops => InitFlags::FUSE_PARALLEL_DIROPS,
        Capability::HandleKillprivV2 => InitFlags::FUSE_HANDLE_KILLPRIV_V2,
    }
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
        let want = self.fs.kernel_config();
        for c in want.capabilities {
            if config.add_capabilities(capability(c)).is_err() {
                log::debug!("the kernel does not offer {c:?}");
            }
        }
        // Each setter refuses a value above what the kernel allows and says what that is.
        let _ = config
            .set_max_write(want.max_write)
            .or_else(|max| config.set_max_write(max));
        let _ = config
            .set_max_readahead(want.max_readahead)
            .or_else(|max| config.set_max_readahead(max));
        let _ = config.set_max_background(want.max_background);
        Ok(())
    }

    fn destroy(&mut self) {
        self.fs.commit_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        fuse_reply!("lookup", reply, self.fs.lookup_entry(parent.0, name), l => match l {
            Lookup::Found(e) => reply.entry(&e.ttl, &to_fuser(&e.attr), Generation(0)),
            Lookup::Missing { ttl } => reply.entry(&ttl, &negative_entry(), Generation(0)),
        })
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self.fs.getattr_entry(ino.0, fh.map(|f| f.0));
        fuse_reply!("getattr", reply, r, e => reply.attr(&e.ttl, &to_fuser(&e.attr)))
    }

    fn setattr(
        &self, req: &Request, ino: INodeNo, mode: Option<u32>, uid: Option<u32>, gid: Option<u32>,
        size: Option<u64>, _atime: Option<TimeOrNow>, _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>, fh: Option<FileHandle>, _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>, _bkuptime: Option<SystemTime>, _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let fh = fh.map(|f| f.0);
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            fh,
        };
        let r = self.fs.setattr_as(&caller(req), ino.0, change);
        fuse_reply!("setattr", reply, r, e => reply.attr(&e.ttl, &to_fuser(&e.attr)))
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.fs.unlink_as(&caller(req), parent.0, name);
        empty("unlink", reply, r)
    }

    fn rename(
        &self, req: &Request, parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr,
        flags: RenameFlags, reply: ReplyEmpty,
    ) {
        let mode = rename_mode(flags);
        let r = self
            .fs
            .rename_as(&caller(req), parent.0, name, newparent.0, newname, mode);
        empty("rename", reply, r)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = self.fs.open_as(&caller(req), ino.0, flags.0);
        fuse_reply!("open", reply, r, o => reply.opened(FileHandle(o.fh), open_flags(&o)))
    }

    fn read(
        &self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, size: u32,
        _flags: OpenFlags, _lock_owner: Option<LockOwner>, reply: ReplyData,
    ) {
        self.fs.read_with(
            ino.0,
            Some(fh.0),
            offset,
            size,
            |r| fuse_reply!("read", reply, r, bytes => reply.data(bytes)),
        )
    }

    fn write(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, data: &[u8],
        _write_flags: WriteFlags, _flags: OpenFlags, _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        fuse_reply!("write", reply, self.fs.write(fh.0, offset, data), n => reply.written(n))
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
        let r = self.fs.opendir_as(&caller(req), ino.0);
        fuse_reply!("opendir", reply, r, o => reply.opened(FileHandle(o.fh), open_flags(&o)))
    }

    fn readdir(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64,
        mut reply: ReplyDirectory,
    ) {
        fuse_reply!("readdir", reply, self.fs.readdir(fh.0, offset), page => {
            for (cookie, e) in page.entries() {
                if reply.add(INodeNo(e.attr.ino), cookie, kind(e.attr.kind), &e.name) {
                    break;
                }
            }
            reply.ok()
        })
    }

    fn readdirplus(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        fuse_reply!("readdirplus", reply, self.fs.readdir(fh.0, offset), page => {
            for (cookie, e) in page.entries() {
                let attr = to_fuser(&e.attr);
                if reply.add(attr.ino, cookie, &e.name, &page.ttl, &attr, Generation(0)) {
                    break;
                }
            }
            reply.ok()
        })
    }

    fn releasedir(
        &self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
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
        empty("setxattr", reply, self.fs.setxattr(ino.0, name))
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = self.fs.getxattr(ino.0, name);
        fuse_reply!("getxattr", reply, r, value => reply_xattr(reply, &value, size))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        fuse_reply!("listxattr", reply, self.fs.listxattr(ino.0), names => {
            let list: Vec<u8> = names.iter().flat_map(|n| [n.as_bytes(), b"\0"].concat()).collect();
            reply_xattr(reply, &list, size)
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty("removexattr", reply, self.fs.removexattr(ino.0, name))
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let r = self.fs.access_as(&caller(req), ino.0, mask.bits());
        empty("access", reply, r)
    }

    fn create(
        &self, req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.fs.create_as(&caller(req), parent.0, name, flags);
        fuse_reply!("create", reply, r, (Entry { attr, ttl }, o) => {
            let (fh, flags) = (FileHandle(o.fh), open_flags(&o));
            reply.created(&ttl, &to_fuser(&attr), Generation(0), fh, flags)
        })
    }

    fuse_unsupported! {
        mknod = Mknod(INodeNo, &OsStr, u32, u32, u32) -> ReplyEntry;
        mkdir = Mkdir(INodeNo, &OsStr, u32, u32) -> ReplyEntry;
        rmdir = Rmdir(INodeNo, &OsStr) -> ReplyEmpty;
        symlink = Symlink(INodeNo, &OsStr, &Path) -> ReplyEntry;
        link = Link(INodeNo, INodeNo, &OsStr) -> ReplyEntry;
        fsyncdir = Fsyncdir(INodeNo, FileHandle, bool) -> ReplyEmpty;
        ioctl = Ioctl(INodeNo, FileHandle, IoctlFlags, u32, &[u8], u32) -> ReplyIoctl;
        poll = Poll(INodeNo, FileHandle, PollNotifier, PollEvents, PollFlags) -> ReplyPoll;
        fallocate = Fallocate(INodeNo, FileHandle, u64, u64, i32) -> ReplyEmpty;
        lseek = Lseek(INodeNo, FileHandle, i64, i32) -> ReplyLseek;
        copy_file_range = CopyFileRange(
            INodeNo, FileHandle, u64, INodeNo, FileHandle, u64, u64, CopyFileRangeFlags
        ) -> ReplyWrite;
    }
}
