//! What the kernel must forget after a commit, and the interface through which the core tells
//! it. The FUSE adapter implements `Invalidator` with the session's notifier; offline commands
//! and tests, which have no kernel cache, use `NoInvalidation`.

use crate::tree::Ino;

/// Where the core sends cache invalidations. Calls come from request handlers that hold no
/// core lock; an implementation must not call back into the core.
pub trait Invalidator: Send + Sync {
    /// Drop cached pages and attributes of `inodes`. With `wait`, return once the kernel did
    /// (or after a bounded wait: the kernel may hold locks the invalidation needs until a
    /// request in progress is answered).
    fn inodes(&self, inodes: Vec<Ino>, wait: bool);

    /// Forget the cached name `name` in directory `parent`.
    fn entry(&self, parent: Ino, name: &str);
}

pub struct NoInvalidation;

impl Invalidator for NoInvalidation {
    fn inodes(&self, _inodes: Vec<Ino>, _wait: bool) {}

    fn entry(&self, _parent: Ino, _name: &str) {}
}

/// The kernel caches a commit made stale: inodes, and names whose inode changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Invalidate {
    pub inodes: Vec<Ino>,
    pub entries: Vec<(Ino, String)>,
}

impl Invalidate {
    pub fn inodes(inodes: Vec<Ino>) -> Invalidate {
        Invalidate {
            inodes,
            entries: Vec::new(),
        }
    }

    pub fn send(self, to: &dyn Invalidator) {
        for (parent, name) in &self.entries {
            to.entry(*parent, name);
        }
        if !self.inodes.is_empty() {
            to.inodes(self.inodes, true);
        }
    }
}
