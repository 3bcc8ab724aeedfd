//! The watch on the model files: inotify events on their directories (a file's own events,
//! and a rename or create over its name) make the mount check the files at once, so a change
//! made behind the mount shows without waiting for the next open or read
//! (docs/writes.md#changes-behind-the-mount).
//!
//! Invariants: the directories are watched, not the files, so the watch follows a name
//! through renames (ptefs's own re-layouts included); events are only a cue: what changed is
//! decided by `Fs::check_files` from the files' stamps, so ptefs's own commits, whose events
//! arrive too, change nothing; bursts of events (a `cp` writing a file in many pieces) are
//! checked once they pause.

use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::fs::Fs;

/// How long events must pause before the files are checked.
const SETTLE: Duration = Duration::from_millis(50);

/// Starts watching the directories of `files` for changes to those names; returns without a
/// watch (logging why) when inotify is not available.
pub fn start(fs: &Arc<Fs>, files: &[&Path]) {
    // SAFETY: creates a descriptor owned below.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    if fd < 0 {
        log::warn!(
            "no inotify watch on the model files ({}): changes made behind the mount show at the next open or read",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: a descriptor just opened and owned here alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mask = libc::IN_MODIFY
        | libc::IN_ATTRIB
        | libc::IN_CLOSE_WRITE
        | libc::IN_MOVED_TO
        | libc::IN_MOVED_FROM
        | libc::IN_CREATE
        | libc::IN_DELETE;
    let mut names: HashSet<OsString> = HashSet::new();
    for f in files {
        let (Some(dir), Some(name)) = (f.parent(), f.file_name()) else {
            continue;
        };
        names.insert(name.to_os_string());
        let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: a valid inotify descriptor and C string.
        if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), mask) } < 0 {
            log::warn!(
                "no inotify watch on {}: {}",
                dir.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    let fs = Arc::downgrade(fs);
    let started = std::thread::Builder::new()
        .name("ptefs-watch".into())
        .spawn(move || run(fd, names, fs));
    if let Err(e) = started {
        log::warn!("no inotify watch on the model files: cannot start a thread: {e}");
    }
}

/// Whether `fd` has events within `timeout`.
fn readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// Reads the pending events; says whether one names a watched file.
fn drain(fd: &OwnedFd, names: &HashSet<OsString>) -> bool {
    let mut buf = [0u8; 16 << 10];
    let mut hit = false;
    loop {
        // SAFETY: reads into a buffer of the size passed.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return hit;
        }
        let mut at = 0usize;
        let n = n as usize;
        let head = std::mem::size_of::<libc::inotify_event>();
        while at + head <= n {
            // SAFETY: the kernel wrote whole events; the header is read unaligned.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
            let len = ev.len as usize;
            let name_at = at + head;
            let Some(raw) = buf.get(name_at..name_at + len) else {
                break;
            };
            let name: Vec<u8> = raw.iter().copied().take_while(|&b| b != 0).collect();
            if names.contains(&OsString::from_vec(name)) {
                hit = true;
            }
            at = name_at + len;
        }
    }
}

fn run(fd: OwnedFd, names: HashSet<OsString>, fs: Weak<Fs>) {
    loop {
        if !readable(&fd, Duration::from_secs(1)) {
            if fs.strong_count() == 0 {
                return;
            }
            continue;
        }
        let mut hit = drain(&fd, &names);
        // Wait for the burst to pause.
        while readable(&fd, SETTLE) {
            hit |= drain(&fd, &names);
        }
        if !hit {
            continue;
        }
        let Some(fs) = fs.upgrade() else {
            return;
        };
        // What changed, and what is done about it, is logged there.
        let _ = fs.check_files(true);
    }
}
