//! What a file found beside a model is, judged on its open descriptor: whether only its
//! owner (and root) can have written it, which a journal must be before its bytes go into
//! the model; and whether a `chattr` flag keeps its name from being removed.
//!
//! Invariants: everything is judged on the open descriptor whose bytes are then read
//! (`fstat`, `fgetxattr`, `FS_IOC_GETFLAGS`), never by path; write access is judged as the
//! kernel grants it: the group and other bits of the mode, and every entry of the POSIX
//! access ACL (named users and groups through the ACL's mask); an ACL that cannot be read or
//! parsed is not trusted.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

const ACL_XATTR: &std::ffi::CStr = c"system.posix_acl_access";
/// An ACL value is at most this long (the kernel's `XATTR_SIZE_MAX`).
const ACL_MAX: usize = 64 << 10;

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const WRITE: u16 = 2;

/// "a FIFO owned by uid 1001": what `meta` describes, for messages.
pub fn describe(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let what = if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a device node"
    };
    format!("{what} owned by uid {}", meta.uid())
}

/// Who besides `meta`'s owner may write `file` (whose `fstat` is `meta`): `None` when
/// nobody, else a sentence for the refusal ("its group may write it (mode 660)").
pub fn others_may_write(file: &File, meta: &std::fs::Metadata) -> Option<String> {
    let mode = meta.mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Some(format!("anyone may write it (mode {mode:o})"));
    }
    let acl = match read_acl(file) {
        Ok(acl) => acl,
        Err(why) => return Some(why),
    };
    let Some(acl) = acl else {
        return (mode & 0o020 != 0).then(|| {
            format!(
                "its group (gid {}) may write it (mode {mode:o})",
                meta.gid()
            )
        });
    };
    acl_writers(&acl, meta.uid(), mode)
}

/// The raw ACL of `file`, `None` when it has none.
fn read_acl(file: &File) -> Result<Option<Vec<u8>>, String> {
    let mut buf = vec![0u8; ACL_MAX];
    // SAFETY: a valid descriptor, a constant C string and a buffer of the given length.
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            ACL_XATTR.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA | libc::ENOTSUP) => Ok(None),
            _ => Err(format!("its access ACL cannot be read ({e})")),
        };
    }
    buf.truncate(n as usize);
    Ok(Some(buf))
}

/// Who besides `owner` may write through the ACL `raw` (of a file of mode `mode`).
fn acl_writers(raw: &[u8], owner: u32, mode: u32) -> Option<String> {
    let unreadable = || {
        Some(format!(
            "its access ACL is not one ptefs can read ({} bytes)",
            raw.len()
        ))
    };
    let Some((head, entries)) = raw.split_first_chunk::<4>() else {
        return unreadable();
    };
    if u32::from_le_bytes(*head) != 2 || entries.len() % 8 != 0 {
        return unreadable();
    }
    let mut mask = None;
    // Entries whose write the mask may take away: named users, the owning group, named groups.
    let mut masked = Vec::new();
    for e in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        match tag {
            ACL_USER_OBJ => {}
            ACL_USER if id == owner => {}
            ACL_USER => masked.push((format!("uid {id}"), perm)),
            ACL_GROUP_OBJ => masked.push(("its group".to_string(), perm)),
            ACL_GROUP => masked.push((format!("gid {id}"), perm)),
            ACL_MASK => mask = Some(perm),
            ACL_OTHER if perm & WRITE != 0 => {
                return Some(format!(
                    "its access ACL lets anyone write it (mode {mode:o})"
                ))
            }
            ACL_OTHER => {}
            _ => return unreadable(),
        }
    }
    let mask = mask.unwrap_or(7);
    let writers: Vec<String> = masked
        .into_iter()
        .filter(|(_, perm)| perm & mask & WRITE != 0)
        .map(|(who, _)| who)
        .collect();
    (!writers.is_empty()).then(|| {
        format!(
            "its access ACL lets {} write it (mode {mode:o})",
            writers.join(", ")
        )
    })
}

/// `chattr` flags that keep a file's name from being removed: "immutable" (`+i`) or
/// "append-only" (`+a`), `None` when neither is set or the file system has no such flags.
pub fn unremovable_flag(file: &File) -> Option<&'static str> {
    const IMMUTABLE: libc::c_int = 0x10;
    const APPEND: libc::c_int = 0x20;
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if rc != 0 {
        return None;
    }
    if flags & IMMUTABLE != 0 {
        Some("immutable")
    } else if flags & APPEND != 0 {
        Some("append-only")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut raw = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            raw.extend_from_slice(&tag.to_le_bytes());
            raw.extend_from_slice(&perm.to_le_bytes());
            raw.extend_from_slice(&id.to_le_bytes());
        }
        raw
    }

    const ANY: u32 = u32::MAX;

    #[test]
    fn acl_write_is_judged_through_the_mask() {
        let base = [
            (ACL_USER_OBJ, 6, ANY),
            (ACL_GROUP_OBJ, 0, ANY),
            (ACL_OTHER, 0, ANY),
        ];
        assert_eq!(acl_writers(&acl(&base), 0, 0o600), None);
        // A named user with write, the mask allowing it.
        let mut v = base.to_vec();
        v.extend([(ACL_USER, 6, 1001), (ACL_MASK, 6, ANY)]);
        let why = acl_writers(&acl(&v), 0, 0o660).unwrap();
        assert!(why.contains("uid 1001"), "{why}");
        // The same entry under a mask without write (a default ACL on a 0600 file): nobody.
        let mut v = base.to_vec();
        v.extend([(ACL_USER, 6, 1001), (ACL_MASK, 0, ANY)]);
        assert_eq!(acl_writers(&acl(&v), 0, 0o600), None);
        // A named group, the owning group, other.
        let mut v = base.to_vec();
        v.extend([(ACL_GROUP, 2, 50), (ACL_MASK, 7, ANY)]);
        assert!(acl_writers(&acl(&v), 0, 0o670).unwrap().contains("gid 50"));
        let v = [
            (ACL_USER_OBJ, 6, ANY),
            (ACL_GROUP_OBJ, 6, ANY),
            (ACL_OTHER, 0, ANY),
        ];
        assert!(acl_writers(&acl(&v), 0, 0o660)
            .unwrap()
            .contains("its group"));
        let v = [
            (ACL_USER_OBJ, 6, ANY),
            (ACL_GROUP_OBJ, 0, ANY),
            (ACL_OTHER, 2, ANY),
        ];
        assert!(acl_writers(&acl(&v), 0, 0o602).unwrap().contains("anyone"));
        // The owner named again is still the owner.
        let mut v = base.to_vec();
        v.extend([(ACL_USER, 6, 0), (ACL_MASK, 6, ANY)]);
        assert_eq!(acl_writers(&acl(&v), 0, 0o660), None);
        // Not an ACL.
        assert!(acl_writers(&[1, 2, 3], 0, 0o600).is_some());
        assert!(acl_writers(&acl(&[(0x40, 0, 0)]), 0, 0o600).is_some());
    }
}
