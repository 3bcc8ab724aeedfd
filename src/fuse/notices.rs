//! Cache invalidations for the kernel, sent from threads of their own.
//!
//! Invariants: a request handler never calls into the kernel itself: the kernel may hold
//! locks that an invalidation needs until the handler replies. Handlers queue invalidations
//! here; a handler that committed waits for its inode invalidations at most
//! `INVALIDATION_WAIT`, so it can be delayed but never deadlocked. Inode invalidations never
//! queue behind an entry invalidation (which waits for directory locks that a rename in
//! progress holds): each kind has its own thread.

use std::ffi::OsString;
use std::io;
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::time::Duration;

use fuser::{INodeNo, Notifier};

use crate::fs::Invalidator;
use crate::tree::Ino;

/// How long a request handler waits for the kernel to drop what a commit changed, before it
/// replies anyway. The wait makes "close() returned" mean "every reader sees the new bytes"
/// in all but the pathological case above.
const INVALIDATION_WAIT: Duration = Duration::from_secs(1);

type InodeNotice = (Vec<Ino>, Option<SyncSender<()>>);

/// Where request handlers send cache invalidations for the kernel.
#[derive(Clone)]
pub struct Notices {
    inodes: Sender<InodeNotice>,
    entries: Sender<(Ino, OsString)>,
}

/// The other ends of `Notices`, served by two threads once the session exists.
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

impl Invalidator for Notices {
    fn inodes(&self, inodes: Vec<Ino>, wait: bool) {
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

    fn entry(&self, parent: Ino, name: &str) {
        let _ = self.entries.send((parent, name.into()));
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
