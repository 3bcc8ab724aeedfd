//! The extended attributes of a model file carried to the new file that replaces it (a
//! re-layout): its access ACL, `user.*` and `trusted.*` attributes, and its security labels
//! where they can be set (docs/writes.md#size-changing-commits).
//!
//! Invariants: what is read is bounded by the kernel's own limits (a list of names and a
//! value are at most 64 KiB each), so a file cannot make this allocate more; the ACL is set
//! after the mode, since setting an access ACL sets the mode's group bits from its mask; an
//! attribute that cannot be carried fails the whole re-layout, with its name, except a
//! security label, which the new file otherwise gets from its directory as any new file does.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use crate::error::{Error, Result};

/// The kernel's bound on a list of attribute names and on one value (`XATTR_LIST_MAX`,
/// `XATTR_SIZE_MAX`).
const MAX: usize = 64 << 10;

/// The names of `file`'s extended attributes.
fn names(file: &File) -> io::Result<Vec<Vec<u8>>> {
    let mut list = vec![0u8; MAX];
    // SAFETY: the buffer is MAX bytes long, as passed.
    let n = unsafe { libc::flistxattr(file.as_raw_fd(), list.as_mut_ptr().cast(), MAX) };
    if n < 0 {
        let e = io::Error::last_os_error();
        // A file system without extended attributes has none to carry.
        return match e.raw_os_error() {
            Some(libc::ENOTSUP) => Ok(Vec::new()),
            _ => Err(e),
        };
    }
    list.truncate(n as usize);
    Ok(list
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// Gives `to` the extended attributes of `from` (after `to` got `from`'s mode).
pub fn carry(from: &File, to: &File, shown: &str) -> Result<()> {
    let names =
        names(from).map_err(|e| Error::io(format!("list the attributes of {shown}'s model"), e))?;
    let mut value = vec![0u8; MAX];
    for name in names {
        let label = name.starts_with(b"security.");
        let shown_name = String::from_utf8_lossy(&name).into_owned();
        let Ok(c) = CString::new(name) else { continue };
        // SAFETY: a C string and a buffer of MAX bytes, as passed.
        let n = unsafe {
            libc::fgetxattr(from.as_raw_fd(), c.as_ptr(), value.as_mut_ptr().cast(), MAX)
        };
        let set = if n < 0 {
            -1
        } else {
            // SAFETY: a C string and the n bytes just read.
            unsafe {
                libc::fsetxattr(
                    to.as_raw_fd(),
                    c.as_ptr(),
                    value.as_ptr().cast(),
                    n as usize,
                    0,
                )
            }
        };
        if set < 0 && !label {
            return Err(Error::io(
                format!("give {shown} its model's attribute {shown_name:?}"),
                io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}
