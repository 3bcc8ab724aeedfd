//! The plain values the core answers the kernel with: attributes and how long to keep
//! them, lookups, open handles and their caching, `statfs`, what to ask for at `init`, and
//! which operations are not supported. The FUSE adapter turns each into its reply; the
//! decisions behind them are the core's.

use std::time::Duration;

use super::{Attr, TTL};

/// Attributes, and how long the kernel may keep them (and the name that led to them).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub attr: Attr,
    pub ttl: Duration,
}

impl Entry {
    pub(super) fn new(attr: Attr) -> Entry {
        Entry { attr, ttl: TTL }
    }
}

/// What a lookup tells the kernel. Names appear only through this mount, and the kernel
/// drops a negative entry when one is created there, so negative entries are cached too,
/// except for a name an unlink hid: it comes back without a request the kernel sees.
#[derive(Debug, Clone, Copy)]
pub enum Lookup {
    Found(Entry),
    Missing { ttl: Duration },
}

/// FUSE capabilities the daemon asks the kernel for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Listings carry attributes, so `ls -l` needs no lookup per name.
    ReaddirPlus,
    /// `O_TRUNC` arrives with the open, which stages empty content at once.
    AtomicOTrunc,
    /// Lookups and listings of one directory run in parallel.
    ParallelDirops,
    /// Files here never carry setuid bits or capabilities, so there is nothing to drop on
    /// a write; without it the kernel asks for `security.capability` before every write.
    HandleKillprivV2,
}

/// What the daemon asks of the kernel when the session starts. A kernel that offers less
/// gets as much as it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    pub capabilities: Vec<Capability>,
    /// Large writes mean fewer requests when a tensor is replaced.
    pub max_write: u32,
    /// Read-ahead asked for; the kernel caps it at what it offered (raising it further
    /// needs the bdi's `read_ahead_kb`, which the daemon sets after mounting).
    pub max_readahead: u32,
    /// Requests the kernel may have in flight in the background (read-ahead, async reads).
    pub max_background: u16,
}

/// Operations the tree has no use for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsupported {
    Mknod,
    Mkdir,
    Rmdir,
    Symlink,
    Link,
    Ioctl,
    Poll,
    Fallocate,
    Lseek,
    CopyFileRange,
    Fsyncdir,
}

impl Unsupported {
    /// The system call's name.
    pub fn name(self) -> &'static str {
        match self {
            Unsupported::Mknod => "mknod",
            Unsupported::Mkdir => "mkdir",
            Unsupported::Rmdir => "rmdir",
            Unsupported::Symlink => "symlink",
            Unsupported::Link => "link",
            Unsupported::Ioctl => "ioctl",
            Unsupported::Poll => "poll",
            Unsupported::Fallocate => "fallocate",
            Unsupported::Lseek => "lseek",
            Unsupported::CopyFileRange => "copy_file_range",
            Unsupported::Fsyncdir => "fsyncdir",
        }
    }
}

/// An open file or directory handle and how the kernel should cache its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// Keep cached pages from earlier opens (the tree's bytes change only at a commit, which
    /// drops them).
    pub keep_cache: bool,
    /// Bypass the page cache: a writer's staged bytes must not reach other readers through
    /// the kernel's cache before they are committed.
    pub direct_io: bool,
    /// For directories: the kernel may cache the listing.
    pub cache_dir: bool,
}

/// `statfs`, in the units the kernel wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}
