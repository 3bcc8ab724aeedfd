//! Who may open what. A node shows bytes of one or more model files (an attached `.ptd`
//! may belong to another user than the `.pte`), and a daemon running as root can read and
//! write all of them: so at every open the caller is checked the way the kernel would check
//! a direct open of each file behind the node.
//!
//! Invariants: the check reads the files' current owner, mode and POSIX ACL (`fstat` and
//! `fgetxattr` on the descriptors the mount holds), so a `chmod` of a model reaches the
//! mount at the next open. Reading a node needs read permission on every file it shows
//! bytes of (and on the file whose tree it is in); writing needs write permission on every
//! file a commit may change, and write permission on the directory holding it, since a
//! commit creates its journal or its new file there. Either needs search permission on
//! every directory above each file. Root passes, as it does for direct opens. A file or
//! directory whose attributes cannot be read denies.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::hidden::Process;
use super::{Entry, Fs, Opened, RenameMode, SetAttr};
use crate::error::{Error, Result};
use crate::format::layout::FileIndex;
use crate::tree::Ino;

/// `access(2)` bits, as in the mode's "other" triplet.
pub const READ: u32 = 4;
pub const WRITE: u32 = 2;
pub const SEARCH: u32 = 1;

/// The user a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// The thread that asks (0: unknown, as for a process in another PID namespace).
    pub pid: u32,
}

impl Caller {
    /// Root: passes every check (offline commands and tests act as the process does).
    pub fn root() -> Caller {
        Caller {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            pid: 0,
        }
    }

    /// The user of process `pid`, with the supplementary groups `/proc` lists for it. When
    /// they cannot be read (the process is gone, or in another PID namespace), only `gid`
    /// counts: a check may then deny what a group would allow, never the reverse.
    pub fn of_process(uid: u32, gid: u32, pid: u32) -> Caller {
        let groups = if pid == 0 {
            Vec::new()
        } else {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| supplementary_groups(&s, uid))
                .unwrap_or_default()
        };
        Caller {
            uid,
            gid,
            groups,
            pid,
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether the caller may access a file with these attributes as `want` asks (`READ`,
    /// `WRITE`, `SEARCH`, or'ed), the way the kernel decides for a non-root user.
    pub fn may(&self, attrs: &FileAttrs, want: u32) -> bool {
        if self.is_root() {
            return true;
        }
        let granted = |perm: u32| perm & want == want;
        let mode = attrs.mode;
        if self.uid == attrs.uid {
            return granted(mode >> 6 & 7);
        }
        let Some(acl) = &attrs.acl else {
            return if self.in_group(attrs.gid) {
                granted(mode >> 3 & 7)
            } else {
                granted(mode & 7)
            };
        };
        // POSIX.1e: a named user's entry, else the owning group and named groups (any one
        // granting suffices), each limited by the mask; else "other".
        let mask = acl.mask.unwrap_or(7);
        if let Some(&(_, perm)) = acl.users.iter().find(|(u, _)| *u == self.uid) {
            return granted(perm & mask);
        }
        let groups: Vec<u32> = std::iter::once((attrs.gid, acl.group_obj))
            .chain(acl.groups.iter().copied())
            .filter(|(g, _)| self.in_group(*g))
            .map(|(_, perm)| perm)
            .collect();
        if !groups.is_empty() {
            return groups.iter().any(|&p| granted(p & mask));
        }
        granted(mode & 7)
    }
}

/// The `Groups:` line of `/proc/<pid>/status`, checked against the `Uid:` line (a pid that
/// was reused by another user's process gives nothing).
fn supplementary_groups(status: &str, uid: u32) -> Option<Vec<u32>> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::split_whitespace)
    };
    let real_uid: u32 = field("Uid:")?.next()?.parse().ok()?;
    if real_uid != uid {
        let effective: u32 = field("Uid:")?.nth(1)?.parse().ok()?;
        if effective != uid {
            return None;
        }
    }
    field("Groups:")?.map(|g| g.parse().ok()).collect()
}

/// What a permission check needs of a file or directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileAttrs {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub acl: Option<Acl>,
}

/// The entries of a POSIX access ACL that `FileAttrs::mode` does not carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub users: Vec<(u32, u32)>,
    pub group_obj: u32,
    pub groups: Vec<(u32, u32)>,
    pub mask: Option<u32>,
}

const ACL_XATTR: &std::ffi::CStr = c"system.posix_acl_access";
/// A header and at most this many entries are read; larger ACLs do not exist in practice
/// (ext4 allows about 500) and are treated as unreadable, which denies.
const ACL_MAX_ENTRIES: usize = 1024;

impl Acl {
    /// Parses the kernel's `system.posix_acl_access` value: version 2, then entries of
    /// (tag u16, perm u16, id u32), little-endian. `None` when it is not one.
    pub fn parse(raw: &[u8]) -> Option<Acl> {
        const USER_OBJ: u16 = 0x01;
        const USER: u16 = 0x02;
        const GROUP_OBJ: u16 = 0x04;
        const GROUP: u16 = 0x08;
        const MASK: u16 = 0x10;
        const OTHER: u16 = 0x20;
        let (head, entries) = raw.split_first_chunk::<4>()?;
        if u32::from_le_bytes(*head) != 2 || entries.len() % 8 != 0 {
            return None;
        }
        let mut acl = Acl {
            users: Vec::new(),
            group_obj: 0,
            groups: Vec::new(),
            mask: None,
        };
        let mut group_obj = None;
        for e in entries.chunks_exact(8) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u32::from(u16::from_le_bytes([e[2], e[3]]) & 7);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            match tag {
                USER => acl.users.push((id, perm)),
                GROUP => acl.groups.push((id, perm)),
                GROUP_OBJ => group_obj = Some(perm),
                MASK => acl.mask = Some(perm),
                USER_OBJ | OTHER => {}
                _ => return None,
            }
        }
        acl.group_obj = group_obj?;
        Some(acl)
    }
}

/// Reads an ACL with `get(buffer) -> length or -1`; `Ok(None)` when there is none.
fn read_acl(get: impl Fn(&mut [u8]) -> isize) -> std::io::Result<Option<Acl>> {
    let mut buf = vec![0u8; 4 + 8 * ACL_MAX_ENTRIES];
    let n = get(&mut buf);
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA | libc::ENOTSUP) => Ok(None),
            _ => Err(e),
        };
    }
    buf.truncate(n as usize);
    Acl::parse(&buf).map(Some).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "an access ACL ptefs cannot read",
        )
    })
}

impl FileAttrs {
    fn new(meta: &std::fs::Metadata, acl: Option<Acl>) -> FileAttrs {
        FileAttrs {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
            acl,
        }
    }

    /// Of an open file.
    pub fn of_file(file: &File) -> std::io::Result<FileAttrs> {
        let meta = file.metadata()?;
        let fd = file.as_raw_fd();
        // SAFETY: a valid descriptor, a constant C string, and a buffer of the given length.
        let acl = read_acl(|buf| unsafe {
            libc::fgetxattr(fd, ACL_XATTR.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        })?;
        Ok(FileAttrs::new(&meta, acl))
    }

    /// Of the directory or file at `path`, without following a link at its end.
    pub fn of_path(path: &Path) -> std::io::Result<FileAttrs> {
        let meta = std::fs::symlink_metadata(path)?;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: valid C strings and a buffer of the given length.
        let acl = read_acl(|buf| unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                ACL_XATTR.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })?;
        Ok(FileAttrs::new(&meta, acl))
    }
}

/// Why `caller` may not reach `path` (absolute) through its directories: the first
/// directory above it they cannot search, or one that cannot be read.
pub fn reach_denied(caller: &Caller, path: &Path) -> Option<String> {
    if caller.is_root() {
        return None;
    }
    for dir in path.ancestors().skip(1) {
        match FileAttrs::of_path(dir) {
            Ok(a) if caller.may(&a, SEARCH) => {}
            Ok(_) => {
                return Some(format!(
                    "{} is not searchable by uid {}",
                    dir.display(),
                    caller.uid
                ))
            }
            Err(e) => return Some(format!("{}: {e}", dir.display())),
        }
    }
    None
}

/// Whether `caller` may write a file of `dir` as far as the sticky bit goes: in a sticky
/// directory only the owner of a file (or of the directory) may rename over it, which a
/// commit that re-lays the file out does.
fn sticky_allows(caller: &Caller, dir: &FileAttrs, file: &FileAttrs) -> bool {
    dir.mode & libc::S_ISVTX == 0
        || caller.is_root()
        || caller.uid == file.uid
        || caller.uid == dir.uid
}

impl Fs {
    /// Whether `caller` may open node `ino` as `want` asks (`READ`, `WRITE`, or'ed): EACCES
    /// naming the file behind the node that refuses, and why.
    pub fn authorize(&self, caller: &Caller, ino: Ino, want: u32) -> Result<()> {
        self.refresh_identity();
        if caller.is_root() {
            return Ok(());
        }
        let tree = self.tree();
        let ino = self.canonical_ino(ino);
        // A scratch file is the daemon's: it answers as its directory does.
        let node = self.scratch.parent(ino).unwrap_or(ino);
        let is_dir = node != ino || tree.node(node).is_some_and(|n| n.is_dir());
        let mut checks: Vec<(FileIndex, u32)> = Vec::new();
        if want & READ != 0 {
            checks.extend(tree.files_read(node).into_iter().map(|f| (f, READ)));
        }
        if want & WRITE != 0 {
            let written = if is_dir {
                vec![tree.file_of(node)]
            } else {
                tree.files_written(node)
            };
            checks.extend(written.into_iter().map(|f| (f, WRITE)));
        }
        let shown = || match self.scratch.parent(ino) {
            Some(_) => format!("{} (a scratch file's directory)", tree.path(node)),
            None => tree.path(node),
        };
        let refuse = |why: String| {
            Err(Error::new(
                libc::EACCES,
                format!("{}: permission denied: {why}", shown()),
            ))
        };
        for (f, bits) in checks {
            let Some(file) = tree.model.files.get(f) else {
                continue;
            };
            let Some(open) = &file.file else {
                // Held in memory: there is no file to ask.
                continue;
            };
            let path = file.path.display();
            let verb = if bits == READ { "read" } else { "write" };
            let attrs = match FileAttrs::of_file(open) {
                Ok(a) => a,
                Err(e) => return refuse(format!("cannot check {path}: {e}")),
            };
            if !caller.may(&attrs, bits) {
                return refuse(format!(
                    "uid {} may not {verb} {path} (owner {}, mode {:04o})",
                    caller.uid, attrs.uid, attrs.mode
                ));
            }
            if let Some(why) = reach_denied(caller, &file.path) {
                return refuse(why);
            }
            if bits == WRITE {
                // A commit creates its journal or its new file beside the model.
                let dir = match file.dir.as_deref().map(FileAttrs::of_file) {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => {
                        return refuse(format!("cannot check the directory of {path}: {e}"))
                    }
                    None => return refuse(format!("the directory of {path} is not open")),
                };
                if !caller.may(&dir, WRITE | SEARCH) || !sticky_allows(caller, &dir, &attrs) {
                    return refuse(format!(
                        "a commit creates files beside {path}, in a directory uid {} may not write",
                        caller.uid
                    ));
                }
            }
        }
        Ok(())
    }
}

/// What an `open(2)` with `flags` asks for.
fn wanted(flags: i32) -> u32 {
    let truncate = if flags & libc::O_TRUNC != 0 { WRITE } else { 0 };
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => WRITE,
        libc::O_RDWR => READ | WRITE,
        _ => READ | truncate,
    }
}

/// The operations as a user asks for them: each checks the caller, then does it.
impl Fs {
    pub fn open_as(&self, caller: &Caller, ino: Ino, flags: i32) -> Result<Opened> {
        self.authorize(caller, ino, wanted(flags))?;
        self.open_by(ino, flags, caller.pid)
    }

    pub fn opendir_as(&self, caller: &Caller, ino: Ino) -> Result<Opened> {
        self.authorize(caller, ino, READ)?;
        self.opendir(ino)
    }

    /// A create in `parent`; creating the name of a hidden file again also opens that file
    /// for writing, so it needs what such an open needs.
    pub fn create_as(
        &self, caller: &Caller, parent: Ino, name: &OsStr, flags: i32,
    ) -> Result<(Entry, Opened)> {
        self.authorize(caller, parent, WRITE)?;
        if let Some(hidden) = self.hidden_file(parent, name) {
            self.authorize(caller, hidden, wanted(flags | libc::O_TRUNC))?;
        }
        let (attr, opened) = self.create_by(caller.uid, parent, name, flags)?;
        Ok((Entry::new(attr), opened))
    }

    pub fn rename_as(
        &self, caller: &Caller, parent: Ino, name: &OsStr, new_parent: Ino, new_name: &OsStr,
        mode: RenameMode,
    ) -> Result<()> {
        self.authorize(caller, parent, WRITE)?;
        self.authorize(caller, new_parent, WRITE)?;
        if let Some(dst) = new_name
            .to_str()
            .and_then(|n| self.tree().lookup(new_parent, n))
        {
            self.authorize(caller, dst, WRITE)?;
        }
        self.rename(parent, name, new_parent, new_name, mode)
    }

    /// An unlink in `parent`; hiding a writable file's name also needs write permission on
    /// the file, since it keeps the file from everyone else for a while.
    pub fn unlink_as(&self, caller: &Caller, parent: Ino, name: &OsStr) -> Result<()> {
        self.authorize(caller, parent, WRITE)?;
        let tree = self.tree();
        if let Some(ino) = name.to_str().and_then(|n| tree.lookup(parent, n)) {
            if tree.node(ino).is_some_and(|n| n.write.is_some()) {
                self.authorize(caller, ino, WRITE)?;
            }
        }
        self.unlink_by(Process::of(caller.pid), parent, name)
    }

    /// `truncate(2)` by path writes the file; the rest is checked by `setattr`, and an
    /// `ftruncate` by the open that gave its handle.
    pub fn setattr_as(&self, caller: &Caller, ino: Ino, change: SetAttr) -> Result<Entry> {
        if change.size.is_some() && change.fh.is_none() {
            self.authorize(caller, ino, WRITE)?;
        }
        self.setattr_by(ino, change, caller.pid).map(Entry::new)
    }

    pub fn access_as(&self, caller: &Caller, ino: Ino, mask: i32) -> Result<()> {
        let mut want = 0;
        if mask & super::R_OK != 0 {
            want |= READ;
        }
        if mask & super::W_OK != 0 {
            want |= WRITE;
        }
        self.authorize(caller, ino, want)?;
        self.access(ino, mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(uid: u32, gid: u32, mode: u32, acl: Option<Acl>) -> FileAttrs {
        FileAttrs {
            uid,
            gid,
            mode,
            acl,
        }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller {
            uid,
            gid,
            groups: groups.to_vec(),
            pid: 0,
        }
    }

    #[test]
    fn mode_bits_decide_like_the_kernel() {
        let f = attrs(1000, 100, 0o640, None);
        assert!(user(1000, 1, &[]).may(&f, READ | WRITE));
        assert!(user(2000, 100, &[]).may(&f, READ));
        assert!(!user(2000, 100, &[]).may(&f, WRITE));
        assert!(user(2000, 5, &[7, 100]).may(&f, READ));
        assert!(!user(2000, 5, &[7]).may(&f, READ));
        // The owner gets the owner's bits even when "other" has more.
        let g = attrs(1000, 100, 0o046, None);
        assert!(!user(1000, 100, &[]).may(&g, READ));
        assert!(Caller::root().may(&attrs(1, 1, 0, None), READ | WRITE));
    }

    #[test]
    fn an_acl_can_deny_a_named_user_what_other_allows() {
        let mut raw = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (0x01u16, 6u16, u32::MAX),
            (0x02, 0, 2000),
            (0x02, 6, 3000),
            (0x04, 4, u32::MAX),
            (0x08, 6, 300),
            (0x10, 4, u32::MAX),
            (0x20, 4, u32::MAX),
        ] {
            raw.extend_from_slice(&tag.to_le_bytes());
            raw.extend_from_slice(&perm.to_le_bytes());
            raw.extend_from_slice(&id.to_le_bytes());
        }
        let acl = Acl::parse(&raw).unwrap();
        let f = attrs(1000, 100, 0o644, Some(acl));
        assert!(
            !user(2000, 9, &[]).may(&f, READ),
            "named user with no rights"
        );
        assert!(user(3000, 9, &[]).may(&f, READ));
        assert!(!user(3000, 9, &[]).may(&f, WRITE), "limited by the mask");
        assert!(user(4000, 9, &[300]).may(&f, READ));
        assert!(!user(4000, 9, &[300]).may(&f, WRITE), "limited by the mask");
        assert!(user(5000, 9, &[]).may(&f, READ), "other");
        assert!(Acl::parse(&raw[..raw.len() - 1]).is_none());
        assert!(Acl::parse(&[1, 0, 0, 0]).is_none());
    }

    #[test]
    fn groups_come_from_proc_for_the_same_user_only() {
        let status = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t4 27 100 \n";
        assert_eq!(supplementary_groups(status, 1000), Some(vec![4, 27, 100]));
        assert_eq!(supplementary_groups(status, 2000), None);
        let none = "Uid:\t1000\t1000\t1000\t1000\nGroups:\t\n";
        assert_eq!(supplementary_groups(none, 1000), Some(vec![]));
    }
}
