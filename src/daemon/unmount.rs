//! Unmounting: `umount(2)` as root, else through fusermount; `ptefs umount`, which waits for
//! the daemon's pending commits.

use std::path::Path;
use std::time::{Duration, Instant};

use super::lock;
use super::mountinfo::{absolute, c_path, find_mount};
use crate::error::{Error, Result};

/// How long a busy mount is retried before `ptefs umount` gives up.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

fn run_fusermount(path: &Path, lazy: bool) -> Result<()> {
    let mut last = String::from("neither fusermount3 nor fusermount was found");
    for tool in ["fusermount3", "fusermount"] {
        let mut cmd = std::process::Command::new(tool);
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        cmd.arg("--").arg(path);
        match cmd.output() {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                return Err(Error::new(
                    libc::EBUSY,
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => last = format!("{tool}: {e}"),
        }
    }
    Err(Error::new(libc::ENOENT, last))
}

/// Unmounts `path`; `lazy` detaches a busy mount.
pub fn unmount_path(path: &Path, lazy: bool) -> Result<()> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let c = c_path(path).ok_or_else(|| Error::invalid("a path with a NUL byte"))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(Error::io(path.display(), e));
        }
    }
    run_fusermount(path, lazy)
}

/// `ptefs umount`: unmounts a ptefs mount and waits until its daemon has exited.
pub fn umount(mountpoint: &Path) -> Result<()> {
    let path = absolute(mountpoint);
    let Some(entry) = find_mount(&path) else {
        return Err(Error::new(
            libc::EINVAL,
            format!("{}: not mounted", mountpoint.display()),
        ));
    };
    if !entry.is_ptefs() {
        return Err(Error::new(
            libc::EINVAL,
            format!(
                "{}: not a ptefs mount (it is {} from {})",
                mountpoint.display(),
                entry.fstype,
                entry.source
            ),
        ));
    }
    let lock = lock::open_lock(&entry.dev);
    // The kernel sends the release of a closed file after close() returned: a mount whose
    // last file was just closed can be busy for a moment.
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        match unmount_path(&path, false) {
            Ok(()) => break,
            Err(e) if e.errno() == libc::EBUSY && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                return Err(e.context(format!("cannot unmount {}", mountpoint.display())));
            }
        }
    }
    match lock {
        // The daemon holds the lock until it has committed everything and exited.
        Some(lock) => lock::wait_for_daemon(&lock),
        None => Ok(()),
    }
}
