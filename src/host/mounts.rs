//! The kernel's mount table (`/proc/self/mountinfo`): which mount sits at a path, the name
//! a ptefs mount shows there, and unmounting (`umount(2)` as root, else fusermount).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    /// "major:minor"
    pub dev: String,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    pub fn is_ptefs(&self) -> bool {
        self.fstype == "fuse.ptefs" || self.source.starts_with("ptefs:")
    }
}

/// Undoes the octal escapes (`\040`) of mountinfo paths.
fn unescape(field: &str) -> OsString {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok());
            if let Some(v) = oct {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    OsString::from_vec(out)
}

/// Every mount of this process's mount namespace, bottom to top.
pub fn table() -> Vec<MountEntry> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || fields.len() < sep + 3 {
            continue;
        }
        out.push(MountEntry {
            mountpoint: PathBuf::from(unescape(fields[4])),
            dev: fields[2].to_string(),
            fstype: fields[sep + 1].to_string(),
            source: unescape(fields[sep + 2]).to_string_lossy().into_owned(),
        });
    }
    out
}

/// The topmost mount at `path` (an absolute, canonical path), from the mount table.
pub fn find_mount(path: &Path) -> Option<MountEntry> {
    table().into_iter().rfind(|e| e.mountpoint == path)
}

/// Refuses `file` (canonical) when a FUSE mount's file-system name says a ptefs daemon
/// mounts it, naming the mountpoint. Claims (`lock`) are per user: this also finds the
/// daemons of other users, and mounts whose daemon has exited.
pub fn refuse_if_mounted(file: &Path) -> Result<()> {
    let name = fsname(file);
    match table()
        .into_iter()
        .find(|e| e.fstype.starts_with("fuse") && e.source == name)
    {
        None => Ok(()),
        Some(e) => Err(Error::new(
            libc::EBUSY,
            format!(
                "{} is already mounted on {} (by a ptefs daemon of another user, or one that has exited); unmount it first",
                file.display(),
                e.mountpoint.display()
            ),
        )),
    }
}

/// The absolute path of a mountpoint without touching the mount itself when it is dead.
pub fn absolute(path: &Path) -> PathBuf {
    if let Ok(c) = path.canonicalize() {
        return c;
    }
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|p| p.join(name))
            .unwrap_or(abs.clone()),
        _ => abs,
    }
}

/// A path as bytes, for the C calls that take one.
pub fn c_path(path: &Path) -> Option<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_bytes()).ok()
}

/// The file-system name a mount of `file` gets unless `-o fsname=` says otherwise (the mount
/// table shows it as the mount's source; a comma would end the option).
pub fn fsname(file: &Path) -> String {
    format!("ptefs:{}", file.display()).replace(',', "_")
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape("/tmp/a\\040b"), OsString::from("/tmp/a b"));
        assert_eq!(unescape("/plain"), OsString::from("/plain"));
        assert_eq!(unescape("/x\\"), OsString::from("/x\\"));
    }
}
