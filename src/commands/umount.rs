//! `ptefs umount`: unmounts a mount that a ptefs daemon of this user made, and waits until
//! that daemon has finished its pending commits and exited.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::host::claims;
use crate::host::mounts::{absolute, daemon_gone, find_mount, unmount_path};

/// How long a busy mount is retried before `ptefs umount` gives up.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

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
    let record = claims::mount_record(&entry.dev)
        .filter(|r| r.mountpoint.as_deref() == Some(path.as_path()));
    let record = match record {
        Some(r) if r.held || daemon_gone(&path) => r,
        _ => {
            let what = if entry.is_ptefs() {
                let dirs: Vec<String> = claims::runtime_dirs()
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
    claims::wait_for_daemon(&record.file)
}
