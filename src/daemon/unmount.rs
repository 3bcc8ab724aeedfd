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

/// Whether the FUSE mount at `path` has lost its daemon: the kernel answers what it must
/// ask the daemon with `ENOTCONN`. `statfs` is always asked (attributes may come from the
/// kernel's cache for an hour).
pub fn daemon_gone(path: &Path) -> bool {
    let Some(c) = c_path(path) else {
        return false;
    };
    // SAFETY: zeroed memory is a valid statfs buffer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and buffer.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// `ptefs umount`: unmounts a mount that a ptefs daemon of this user made, and waits until
/// that daemon has exited. A mount is ptefs's when the daemon's record of it (`lock`) names
/// this mountpoint, and that daemon still holds it, or is gone and left the mount dead. Any
/// other mount is left alone, whatever it calls itself.
pub fn umount(mountpoint: &Path) -> Result<()> {
    let path = absolute(mountpoint);
    let Some(entry) = find_mount(&path) else {
        return Err(Error::new(
            libc::EINVAL,
            format!("{}: not mounted", mountpoint.display()),
        ));
    };
    let record =
        lock::mount_record(&entry.dev).filter(|r| r.mountpoint.as_deref() == Some(path.as_path()));
    let record = match record {
        Some(r) if r.held || daemon_gone(&path) => r,
        _ => {
            let what = if entry.is_ptefs() {
                let dirs: Vec<String> = lock::runtime_dirs()
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect();
                format!(
                    "no ptefs daemon of this user made it (no record of it in {})",
                    dirs.join(" or ")
                )
            } else {
                "it is not a ptefs mount".to_string()
            };
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "{}: {what}: it is {} from {}; not unmounted",
                    mountpoint.display(),
                    entry.fstype,
                    entry.source
                ),
            ));
        }
    };
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
    if !record.held {
        // The daemon died without unmounting: nothing to wait for, and its record is stale.
        record.remove_if_abandoned();
        return Ok(());
    }
    // The daemon holds the lock until it has committed everything and exited.
    lock::wait_for_daemon(&record.file)
}
