//! A lock file per mount, named after the mount's device number and held (flock) by the
//! daemon for its whole life, so that `ptefs umount` can wait until the daemon has committed
//! everything and exited.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

fn runtime_dirs() -> Vec<PathBuf> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut dirs = Vec::new();
    if uid == 0 {
        dirs.push(PathBuf::from("/run/ptefs"));
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        dirs.push(PathBuf::from(x).join("ptefs"));
    }
    dirs.push(std::env::temp_dir().join(format!("ptefs-{uid}")));
    dirs
}

fn lock_name(dev: &str) -> String {
    format!("mount-{dev}.lock")
}

/// The daemon's lock file, held until it exits.
pub struct MountLock {
    path: PathBuf,
    _file: File,
}

impl MountLock {
    pub fn take(dev: &str) -> Option<MountLock> {
        for dir in runtime_dirs() {
            if std::fs::create_dir_all(&dir).is_err() {
                continue;
            }
            let path = dir.join(lock_name(dev));
            let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
            else {
                continue;
            };
            // A `ptefs umount` of the previous mount with this device number may still
            // hold the file for a moment after that daemon exited: wait for it here, so
            // that every mount of a device uses the same path.
            let deadline = Instant::now() + Duration::from_secs(2);
            // SAFETY: flock on a descriptor we own.
            while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                if Instant::now() > deadline {
                    log::warn!(
                        "{} stays locked: `ptefs umount` will not wait for this daemon",
                        path.display()
                    );
                    return None;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = file.set_len(0);
            let _ = writeln!(file, "{}", std::process::id());
            return Some(MountLock { path, _file: file });
        }
        log::debug!("no lock file for mount {dev}: `ptefs umount` will not wait for the daemon");
        None
    }
}

impl Drop for MountLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Opens the lock file of a mount, for `umount` to wait on.
pub fn open_lock(dev: &str) -> Option<File> {
    runtime_dirs()
        .into_iter()
        .find_map(|d| File::open(d.join(lock_name(dev))).ok())
}

/// Waits until the daemon holding `lock` has exited (at most ten minutes).
pub fn wait_for_daemon(lock: &File) -> Result<()> {
    let start = Instant::now();
    let mut told = false;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        if !told && start.elapsed() > Duration::from_secs(2) {
            eprintln!("ptefs: waiting for the daemon to finish its commits…");
            told = true;
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err(Error::new(
                libc::ETIMEDOUT,
                "the daemon did not exit within 10 minutes of the unmount",
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
