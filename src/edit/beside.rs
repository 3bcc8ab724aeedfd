//! Files beside the model: journals and re-layout files, created and removed relative to the
//! directory descriptor opened with the model, never through a path another user could
//! repoint.
//!
//! Invariants: a file is created only with `O_CREAT | O_EXCL | O_NOFOLLOW`, or unnamed
//! (`O_TMPFILE`) and named later with `linkat`, which like `O_EXCL` fails when the name
//! exists; always mode 0600 and given the model's owner, so a name planted by another user
//! (a symbolic link, a FIFO, a file of theirs) makes the creation fail instead of being
//! written through, with an error-level refusal naming what has the name and whose it is. A
//! file that needs no name of its own until it replaces the model (`create_unique`,
//! `link_unique`) gets one ending in 64 random bits (`getrandom`), which nobody can plant
//! ahead of it; only the journal's name is fixed, since recovery must find it. An existing
//! file is opened only with `O_NOFOLLOW | O_NONBLOCK` and checked (`fstat`) before it is
//! trusted; the model is replaced only by `renameat` within that directory, after checking
//! that its name still names the mounted file.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;

use crate::error::{Error, Result};
use crate::format::ModelFile;

/// The directory of a model file and the model's name in it.
pub struct Beside<'a> {
    model: &'a ModelFile,
    dir: &'a File,
}

/// The longest file name most Linux file systems accept, in bytes.
pub const NAME_MAX: usize = 255;

/// `.<model name><suffix>`, as bytes (the model's name need not be UTF-8). A model name too
/// long for that to fit is cut and followed by a hash of the whole name, so the result is
/// still a valid name, the same for the same model, and distinct for distinct models.
pub fn name_for(model_name: &OsStr, suffix: &str) -> OsString {
    let name = model_name.as_bytes();
    let mut out = Vec::with_capacity(NAME_MAX);
    out.push(b'.');
    if 1 + name.len() + suffix.len() <= NAME_MAX {
        out.extend_from_slice(name);
    } else {
        let hash = format!("~{:016x}", fnv1a(name));
        let keep = NAME_MAX.saturating_sub(1 + hash.len() + suffix.len());
        out.extend_from_slice(&name[..keep.min(name.len())]);
        out.extend_from_slice(hash.as_bytes());
    }
    out.extend_from_slice(suffix.as_bytes());
    OsString::from_vec(out)
}

/// FNV-1a, 64 bits: stable across builds and platforms, which a name found again after a
/// restart needs (std's hasher is not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How many random names `create_unique` and `link_unique` try: a second try is already
/// one chance in 2^64 of meeting a name nobody planted.
const UNIQUE_TRIES: usize = 8;

/// `prefix` followed by 64 random bits in hexadecimal.
fn unique_name(prefix: &[u8]) -> Result<OsString> {
    let mut bits = [0u8; 8];
    // SAFETY: a buffer of the given length.
    let n = unsafe { libc::getrandom(bits.as_mut_ptr().cast(), bits.len(), 0) };
    if n != bits.len() as isize {
        return Err(last_error("getrandom"));
    }
    let mut name = prefix.to_vec();
    name.extend_from_slice(format!("{:016x}", u64::from_ne_bytes(bits)).as_bytes());
    Ok(OsString::from_vec(name))
}

/// Bytes the file system holding the open file or directory `f` has free for unprivileged
/// users (`f_bavail`, what `df` shows as available): the blocks it keeps for root stay for
/// root, though ptefs runs as root.
pub fn free_space(f: &File) -> Result<u64> {
    // SAFETY: `statvfs` is plain data, written whole by a successful call on a valid
    // descriptor.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a statvfs.
    if unsafe { libc::fstatvfs(f.as_raw_fd(), &mut st) } != 0 {
        return Err(last_error("statvfs"));
    }
    #[allow(clippy::useless_conversion)] // fsblkcnt_t and c_ulong are u32 on some targets
    Ok(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

/// Refuses with ENOSPC, naming the numbers, when `need` bytes are more than the file
/// system of `f` (known as `place`) has free. `what` says what needs them.
pub fn need_room(f: &File, place: &str, need: u64, what: &str) -> Result<()> {
    let free = free_space(f)?;
    if need > free {
        return Err(Error::new(
            libc::ENOSPC,
            format!("{what}: {need} bytes, and the file system of {place} has {free} bytes free"),
        ));
    }
    Ok(())
}

fn c_name(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| Error::invalid(format!("{name:?}: a file name with NUL")))
}

fn last_error(what: impl std::fmt::Display) -> Error {
    Error::io(what, std::io::Error::last_os_error())
}

impl<'a> Beside<'a> {
    pub fn of(model: &'a ModelFile) -> Result<Beside<'a>> {
        let dir = model.dir.as_ref().ok_or_else(|| {
            Error::new(
                libc::EIO,
                format!("{}: its directory is not open", model.path.display()),
            )
        })?;
        if model.name.is_empty() {
            return Err(Error::invalid(format!(
                "{}: no file name",
                model.path.display()
            )));
        }
        Ok(Beside { model, dir })
    }

    /// The model's directory, open.
    pub fn dir(&self) -> &File {
        self.dir
    }

    /// Refuses with ENOSPC when the model's file system has fewer than `need` bytes free
    /// for `what` (docs/writes.md#sizes-and-free-space).
    pub fn need_room(&self, need: u64, what: &str) -> Result<()> {
        let place = self
            .model
            .path
            .parent()
            .map_or_else(|| ".".to_string(), |d| d.display().to_string());
        need_room(self.dir, &place, need, what)
    }

    /// The model's file name in its directory.
    pub fn model_name(&self) -> &OsStr {
        &self.model.name
    }

    /// `<dir>/<name>`, for messages.
    pub fn shown(&self, name: &OsStr) -> String {
        self.model.path.with_file_name(name).display().to_string()
    }

    /// Creates `name` for writing: it must not exist in any form. Mode 0600, owned by the
    /// model's owner.
    pub fn create(&self, name: &OsStr) -> Result<File> {
        let c = c_name(name)?;
        let flags =
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_RDWR | libc::O_CLOEXEC;
        // SAFETY: a valid directory descriptor and C string.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), c.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(self.create_error(name, std::io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just opened and owned here alone.
        let file = unsafe { File::from_raw_fd(fd) };
        self.give_to_owner(&file)?;
        Ok(file)
    }

    fn create_error(&self, name: &OsStr, e: std::io::Error) -> Error {
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Error::io(format!("create {}", self.shown(name)), e);
        }
        // Nothing a commit creates is there before it: whatever is in the way needs a
        // person, so the refusal is an error whatever the operation that met it.
        Error::io(
            format!(
                "create {} ({} already has this name, and ptefs never writes into a file it did not create: remove it as root if it is not from an interrupted ptefs commit)",
                self.shown(name),
                self.what_is(name)
            ),
            e,
        )
        .with_level(log::Level::Error)
    }

    /// "a FIFO owned by uid 1001": what has `name` now, for messages (it may change at any
    /// moment: nothing is decided on it).
    fn what_is(&self, name: &OsStr) -> String {
        match std::fs::symlink_metadata(self.model.path.with_file_name(name)) {
            Ok(meta) => super::trust::describe(&meta),
            Err(_) => "something".to_string(),
        }
    }

    /// Gives a file this process created the model's owner and group.
    fn give_to_owner(&self, file: &File) -> Result<()> {
        if let Some(model) = &self.model.file {
            let meta = model
                .metadata()
                .map_err(|e| Error::io(format!("stat {}", self.model.path.display()), e))?;
            // Only root may give the file away; otherwise it stays ours, as the model is.
            // SAFETY: a plain system call on an open descriptor.
            unsafe { libc::fchown(file.as_raw_fd(), meta.uid(), meta.gid()) };
        }
        Ok(())
    }

    /// Creates an unnamed file in the directory (`O_TMPFILE`): mode 0600, owned by the
    /// model's owner, openable by nobody else, gone when its descriptor closes unless `link`
    /// names it. `None` when the file system has no unnamed files.
    pub fn create_unnamed(&self) -> Result<Option<File>> {
        let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
        // SAFETY: a valid directory descriptor and a constant C string.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), c".".as_ptr(), flags, 0o600) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL) => Ok(None),
                _ => Err(Error::io(
                    format!(
                        "create an unnamed file beside {}",
                        self.model.path.display()
                    ),
                    e,
                )),
            };
        }
        // SAFETY: a descriptor just opened and owned here alone.
        let file = unsafe { File::from_raw_fd(fd) };
        self.give_to_owner(&file)?;
        Ok(Some(file))
    }

    /// Gives `file`, an unnamed file of `create_unnamed`, the name `name`. Like `create`, it
    /// fails with EEXIST when anything (a link, a FIFO, a file) already has that name, and
    /// never writes through it. `Ok(false)` when this process may not name unnamed files
    /// (neither `AT_EMPTY_PATH`, which needs a capability, nor `/proc/self/fd` works).
    pub fn link(&self, file: &File, name: &OsStr) -> Result<bool> {
        let c = c_name(name)?;
        let dir = self.dir.as_raw_fd();
        let fd = file.as_raw_fd();
        let cannot =
            |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EPERM));
        // SAFETY: valid descriptors and C strings.
        let mut rc =
            unsafe { libc::linkat(fd, c"".as_ptr(), dir, c.as_ptr(), libc::AT_EMPTY_PATH) };
        let mut err = std::io::Error::last_os_error();
        if rc != 0 && cannot(&err) {
            let proc = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
            // SAFETY: as above; the magic link names this process's own descriptor.
            rc = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc.as_ptr(),
                    dir,
                    c.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            err = std::io::Error::last_os_error();
            if rc != 0 && cannot(&err) {
                return Ok(false);
            }
        }
        if rc != 0 {
            return Err(self.create_error(name, err));
        }
        Ok(true)
    }

    /// Creates a new file whose name is `prefix` followed by 16 random hexadecimal digits,
    /// as `create` does; returns it and its name. A name that exists (planted, or not
    /// unique by chance) is passed over for another.
    pub fn create_unique(&self, prefix: &[u8]) -> Result<(File, OsString)> {
        let mut last = None;
        for _ in 0..UNIQUE_TRIES {
            let name = unique_name(prefix)?;
            match self.create(&name) {
                Ok(file) => return Ok((file, name)),
                Err(e) if e.errno() == libc::EEXIST => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("tried at least once"))
    }

    /// Gives `file`, an unnamed file of `create_unnamed`, a name made as `create_unique`
    /// makes one; `Ok(None)` when this process may not name unnamed files (see `link`).
    pub fn link_unique(&self, file: &File, prefix: &[u8]) -> Result<Option<OsString>> {
        let mut last = None;
        for _ in 0..UNIQUE_TRIES {
            let name = unique_name(prefix)?;
            match self.link(file, &name) {
                Ok(true) => return Ok(Some(name)),
                Ok(false) => return Ok(None),
                Err(e) if e.errno() == libc::EEXIST => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("tried at least once"))
    }

    /// Opens an existing `name` for reading without following a link and without blocking
    /// on a FIFO; `None` when nothing has that name.
    pub fn open_existing(&self, name: &OsStr) -> Result<Option<File>> {
        let c = c_name(name)?;
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        // SAFETY: a valid directory descriptor and C string.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), c.as_ptr(), flags) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                Some(libc::ELOOP) => Err(Error::new(
                    libc::EPERM,
                    format!(
                        "{} is a symbolic link ({})",
                        self.shown(name),
                        self.what_is(name)
                    ),
                )),
                _ => Err(Error::io(format!("open {}", self.shown(name)), e)),
            };
        }
        // SAFETY: a descriptor just opened and owned here alone.
        Ok(Some(unsafe { File::from_raw_fd(fd) }))
    }

    /// Removes `name` (a link is removed, not followed).
    pub fn remove(&self, name: &OsStr) -> Result<()> {
        let c = c_name(name)?;
        // SAFETY: a valid directory descriptor and C string.
        if unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(last_error(format!("remove {}", self.shown(name))));
        }
        Ok(())
    }

    /// Makes the directory's entries durable.
    pub fn sync(&self) -> Result<()> {
        self.dir.sync_all().map_err(|e| {
            Error::io(
                format!("fsync of the directory of {}", self.model.path.display()),
                e,
            )
        })
    }

    /// Fails with ESTALE when the model's name no longer names the mounted file.
    pub fn check_model_named(&self) -> Result<()> {
        self.model.still_named().map_err(|why| {
            Error::new(
                libc::ESTALE,
                format!("{why}: refusing to commit into the file that now has its name"),
            )
        })
    }

    /// Renames `name` over the model, once the model's name still names the mounted file.
    pub fn replace_model(&self, name: &OsStr) -> Result<()> {
        self.check_model_named()?;
        let from = c_name(name)?;
        let to = c_name(&self.model.name)?;
        let dir = self.dir.as_raw_fd();
        // SAFETY: valid descriptors and C strings.
        if unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) } != 0 {
            return Err(last_error(format!(
                "rename {} over {}",
                self.shown(name),
                self.model.path.display()
            )));
        }
        self.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_beside_a_model_always_fit_and_stay_distinct() {
        let short = name_for(OsStr::new("m.pte"), ".ptefs-journal");
        assert_eq!(short, OsStr::new(".m.pte.ptefs-journal"));
        let long_a = OsString::from_vec(vec![b'a'; 250]);
        let mut long_b = long_a.clone().into_vec();
        long_b[249] = b'b';
        let long_b = OsString::from_vec(long_b);
        let a = name_for(&long_a, ".ptefs-journal");
        let b = name_for(&long_b, ".ptefs-journal");
        assert_eq!(a.len(), NAME_MAX);
        assert_eq!(b.len(), NAME_MAX);
        assert_ne!(a, b);
        assert_eq!(a, name_for(&long_a, ".ptefs-journal"));
        // Not UTF-8: kept as bytes.
        let raw = OsStr::from_bytes(b"m\xff.pte");
        assert_eq!(name_for(raw, ".x").as_bytes(), b".m\xff.pte.x");
    }

    /// Files beside a model are private to the model's owner, whoever runs the daemon
    /// (as root, they are given to that owner), and never replace what has the name.
    #[test]
    fn files_beside_a_model_are_0600_and_the_models_owners() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pte");
        let src =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/linear.pte");
        std::fs::copy(src, &p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let root = unsafe { libc::geteuid() } == 0;
        let (uid, gid) = if root {
            (54321, 54322)
        } else {
            let m = std::fs::metadata(&p).unwrap();
            (m.uid(), m.gid())
        };
        if root {
            std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        }
        let model = ModelFile::open_writable(&p).unwrap();
        let beside = Beside::of(&model).unwrap();
        let name = name_for(&model.name, ".ptefs-test");
        drop(beside.create(&name).unwrap());
        let meta = std::fs::symlink_metadata(dir.path().join(&name)).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!((meta.uid(), meta.gid()), (uid, gid));
        let again = beside.create(&name).unwrap_err();
        assert_eq!(again.errno(), libc::EEXIST, "{}", again.message());
    }

    #[test]
    fn unique_names_are_new_and_a_planted_name_is_refused_as_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pte");
        let src =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/linear.pte");
        std::fs::copy(src, &p).unwrap();
        let model = ModelFile::open_writable(&p).unwrap();
        let beside = Beside::of(&model).unwrap();
        let prefix = b".m.pte.ptefs-new.";
        let (_, a) = beside.create_unique(prefix).unwrap();
        let (_, b) = beside.create_unique(prefix).unwrap();
        assert_ne!(a, b);
        for n in [&a, &b] {
            let tail = &n.as_bytes()[prefix.len()..];
            assert!(n.as_bytes().starts_with(prefix), "{n:?}");
            assert_eq!(tail.len(), 16, "{n:?}");
            assert!(tail.iter().all(u8::is_ascii_hexdigit), "{n:?}");
        }
        if let Some(unnamed) = beside.create_unnamed().unwrap() {
            let name = beside.link_unique(&unnamed, prefix).unwrap().unwrap();
            assert!(std::fs::symlink_metadata(dir.path().join(&name))
                .unwrap()
                .is_file());
        }
        // A fixed name something else has: refused, saying what has it.
        let victim = dir.path().join("victim");
        std::os::unix::fs::symlink(&victim, dir.path().join(".m.pte.x")).unwrap();
        let e = beside.create(OsStr::new(".m.pte.x")).unwrap_err();
        assert_eq!(e.errno(), libc::EEXIST);
        assert_eq!(e.level(), log::Level::Error);
        assert!(
            e.message().contains("(a symbolic link owned by uid "),
            "{e}"
        );
        assert!(!victim.exists());
    }
}
