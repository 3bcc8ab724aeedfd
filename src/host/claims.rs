//! A lock file per mount, named after the mount's device number and held (flock) by the
//! daemon for its whole life, so that `ptefs umount` can wait until the daemon has committed
//! everything and exited. It records the daemon's pid, the mountpoint and the model file: it
//! is how `ptefs umount` and `ptefs mount` tell a mount ptefs made from one that only looks
//! like it (a file-system name and subtype are any mount's to choose). A claim file per
//! model file (device and inode) keeps each file mounted once.
//!
//! Invariants: lock files live only in a directory that belongs to the daemon's user and
//! that nobody else may write (`/run/ptefs` for root; for another user
//! `$XDG_RUNTIME_DIR/ptefs`, else `/run/user/<uid>/ptefs` when that directory is theirs);
//! those are in directories no other user can create names in. `$TMPDIR/ptefs-<uid>` comes
//! last, a name anyone can take first: what has that name and is a symbolic link, not a
//! directory, someone else's or writable by others is never used nor followed, and is
//! refused with an error naming it, its owner and how to clear it (nothing is tried after
//! it, so all of a user's processes keep finding each other's locks). Lock files are opened
//! relative to that directory without following links.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::source::stat_in;

/// Where lock files may go, best first.
pub fn runtime_dirs() -> Vec<PathBuf> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut dirs = Vec::new();
    if uid == 0 {
        dirs.push(PathBuf::from("/run/ptefs"));
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        dirs.push(PathBuf::from(x).join("ptefs"));
    } else if let Some(run) = user_run_dir(uid) {
        dirs.push(run.join("ptefs"));
    }
    dirs.push(std::env::temp_dir().join(format!("ptefs-{uid}")));
    dirs
}

/// `/run/user/<uid>` (what `XDG_RUNTIME_DIR` names in a login session), when it is a
/// directory of `uid` that nobody else may write.
fn user_run_dir(uid: u32) -> Option<PathBuf> {
    let dir = PathBuf::from(format!("/run/user/{uid}"));
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    (meta.is_dir() && meta.uid() == uid && meta.mode() & 0o022 == 0).then_some(dir)
}

/// The first usable directory of `runtime_dirs`, opened, and its path.
pub fn runtime_dir() -> Result<(File, PathBuf)> {
    let mut last = None;
    for path in runtime_dirs() {
        match private_dir(&path) {
            Ok(dir) => return Ok((dir, path)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::new(libc::ENOENT, "no runtime directory")))
}

fn lock_name(dev: &str) -> String {
    format!("mount-{dev}.lock")
}

fn c_string(bytes: &[u8]) -> Result<CString> {
    CString::new(bytes).map_err(|_| Error::invalid("a name with a NUL byte"))
}

/// Opens (creating it, mode 0700, if missing) directory `path`, only if it is a real
/// directory of the current user that nobody else may write. A refusal is an error that
/// names what is there, whose it is, and how to clear it.
pub fn private_dir(path: &Path) -> Result<File> {
    let c = c_string(path.as_os_str().as_bytes())?;
    // SAFETY: a valid C string; EEXIST is handled by the checks below.
    unsafe { libc::mkdir(c.as_ptr(), 0o700) };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let occupied = |what: String| {
        let fix = if uid == 0 {
            "remove it as root".to_string()
        } else {
            format!("remove it as root, or set XDG_RUNTIME_DIR to a directory of uid {uid} that nobody else may write")
        };
        Error::new(
            libc::EPERM,
            format!(
                "{}: {what}, so it cannot hold this user's (uid {uid}) ptefs lock files: {fix}",
                path.display()
            ),
        )
        .with_level(log::Level::Error)
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match (e.raw_os_error(), std::fs::symlink_metadata(path)) {
            (Some(libc::ELOOP | libc::ENOTDIR), Ok(meta)) => occupied(format!(
                "it is {}, not a directory",
                crate::edit::describe_file(&meta)
            )),
            _ => Error::io(
                format!("{} (not a directory of its own)", path.display()),
                e,
            ),
        });
    }
    // SAFETY: a descriptor just opened and owned here alone.
    let dir = unsafe { File::from_raw_fd(fd) };
    let meta = dir
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if meta.uid() != uid {
        return Err(occupied(format!(
            "it is a directory of uid {}, not of this user",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(occupied(format!(
            "others may write it (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    Ok(dir)
}

/// Opens `name` in `dir` without following a link; `create` makes it (mode 0600) if needed.
fn open_in(dir: &File, name: &str, create: bool) -> Result<File> {
    let c = c_string(name.as_bytes())?;
    let mut flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    flags |= if create {
        libc::O_RDWR | libc::O_CREAT
    } else {
        libc::O_RDONLY
    };
    // SAFETY: a valid directory descriptor and C string.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, 0o600) };
    if fd < 0 {
        return Err(Error::io(name, std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor just opened and owned here alone.
    let file = unsafe { File::from_raw_fd(fd) };
    let regular = file.metadata().is_ok_and(|m| m.file_type().is_file());
    if !regular {
        return Err(Error::new(
            libc::EPERM,
            format!("{name} is not a regular file"),
        ));
    }
    Ok(file)
}

/// Whether `file` is still what `name` in `dir` names (a lock file removed between our open
/// and our lock leaves us holding a file nobody else can find).
fn still_named(dir: &File, name: &str, file: &File) -> bool {
    let now = stat_in(dir, std::ffi::OsStr::new(name)).ok();
    file.metadata()
        .is_ok_and(|m| now == Some((m.dev(), m.ino())))
}

/// The record of a mount: `pid`, mountpoint and model file, each followed by a NUL (paths
/// may hold any other byte).
fn encode_record(mountpoint: &Path, model: &Path) -> Vec<u8> {
    let mut out = format!("{}\0", std::process::id()).into_bytes();
    for p in [mountpoint, model] {
        out.extend_from_slice(p.as_os_str().as_bytes());
        out.push(0);
    }
    out
}

/// The daemon's lock file, held until it exits.
pub struct MountLock {
    dir: File,
    name: String,
    _file: File,
}

impl MountLock {
    /// Takes the lock of mount `dev` (on `mountpoint`, of `model`) and records the mount.
    pub fn take(dev: &str, mountpoint: &Path, model: &Path) -> Option<MountLock> {
        MountLock::take_in(&runtime_dirs(), dev, &encode_record(mountpoint, model))
    }

    /// Takes the lock of mount `dev` in the first usable directory of `dirs`, writing
    /// `record` into it.
    pub fn take_in(dirs: &[PathBuf], dev: &str, record: &[u8]) -> Option<MountLock> {
        let name = lock_name(dev);
        for path in dirs {
            let dir = match private_dir(path) {
                Ok(d) => d,
                Err(e) => {
                    log::warn!("not using {}: {e}", path.display());
                    continue;
                }
            };
            // A `ptefs umount` of the previous mount with this device number may still
            // hold the file for a moment after that daemon exited: wait for it here, so
            // that every mount of a device uses the same path.
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let mut file = match open_in(&dir, &name, true) {
                    Ok(f) => f,
                    Err(e) => {
                        log::warn!("not using {}: {e}", path.display());
                        break;
                    }
                };
                // SAFETY: flock on a descriptor we own.
                if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                    // `ptefs umount` removes the record of a dead daemon's mount while it
                    // holds the lock: a file locked after that is open again.
                    if !still_named(&dir, &name, &file) {
                        continue;
                    }
                    let _ = file.set_len(0);
                    let _ = file.write_all(record);
                    return Some(MountLock {
                        dir,
                        name,
                        _file: file,
                    });
                }
                if Instant::now() > deadline {
                    log::warn!(
                        "{}/{name} stays locked: `ptefs umount` will not wait for this daemon",
                        path.display()
                    );
                    return None;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        log::debug!("no lock file for mount {dev}: `ptefs umount` will not wait for the daemon");
        None
    }
}

impl Drop for MountLock {
    fn drop(&mut self) {
        if let Ok(c) = c_string(self.name.as_bytes()) {
            // SAFETY: a valid directory descriptor and C string.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) };
        }
    }
}

/// Held by a daemon for each file it mounts (and by `apply` and `recover` while they run),
/// so that a file is mounted once: two daemons committing into one file would each write
/// from a stale view of it. A claim names the file's device and inode; a commit that re-lays
/// the file out renames a new inode over it, and `Claims` moves the claim to the new inode
/// before the rename, so the new file is never unclaimed, and a claim never names an inode
/// that is closed, which the file system may give to an unrelated new file.
pub struct FileClaim {
    dir: File,
    name: String,
    file: File,
    /// The claimed model file, as its holder opened it.
    model: PathBuf,
    /// The first line of the claim file, saying who holds it.
    holder: String,
}

fn claim_name(meta: &std::fs::Metadata) -> String {
    format!("file-{}-{}.lock", meta.dev(), meta.ino())
}

/// Who holds a claim, as the next claimant is told.
#[derive(Debug, Clone, Copy)]
pub enum Holder<'a> {
    Mount(&'a Path),
    Apply,
    Recover,
}

impl Holder<'_> {
    /// The first line of the claim file: "mounted on /mnt/m".
    fn describe(&self) -> String {
        match self {
            Holder::Mount(p) => format!("mounted on {}", p.display()),
            Holder::Apply => APPLYING.to_string(),
            Holder::Recover => RECOVERING.to_string(),
        }
    }
}

const APPLYING: &str = "being updated by ptefs apply";
const RECOVERING: &str = "being recovered by ptefs recover";

/// Claims `model` for `holder`, or says who holds it already.
pub fn claim_file(model: &Path, holder: Holder) -> Result<FileClaim> {
    claim_file_in(&runtime_dirs(), model, holder)
}

/// Claims `model` for `holder` in the first usable directory of `dirs`.
pub fn claim_file_in(dirs: &[PathBuf], model: &Path, holder: Holder) -> Result<FileClaim> {
    let meta = std::fs::metadata(model).map_err(|e| Error::io(model.display(), e))?;
    let holder = holder.describe();
    let mut last = None;
    for path in dirs {
        match private_dir(path) {
            Ok(dir) => return FileClaim::take(dir, model, &meta, holder),
            Err(e) => last = Some(e),
        }
    }
    let e = last.unwrap_or_else(|| Error::new(libc::ENOENT, "no runtime directory"));
    // Without a private directory there is no record to check against.
    log::log!(
        e.level(),
        "cannot record the mount of {}: {e}",
        model.display()
    );
    Err(e)
}

impl FileClaim {
    /// Claims the file `meta` describes (named `model`) in `dir`.
    fn take(
        dir: File, model: &Path, meta: &std::fs::Metadata, holder: String,
    ) -> Result<FileClaim> {
        let name = claim_name(meta);
        // A claim released (and its file removed) between our open and our lock leaves us
        // holding a removed file: check the name still names it, else open it again.
        for _ in 0..100 {
            let mut file = open_in(&dir, &name, true)?;
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                return Err(held_by_other(&mut file, model));
            }
            if !still_named(&dir, &name, &file) {
                continue;
            }
            let _ = file.set_len(0);
            let _ = write!(file, "{holder}\n{}\n", std::process::id());
            return Ok(FileClaim {
                dir,
                name,
                file,
                model: model.to_path_buf(),
                holder,
            });
        }
        Err(Error::new(
            libc::EBUSY,
            format!("cannot claim {}: it keeps changing", model.display()),
        ))
    }

    /// The claimed model file.
    pub fn model(&self) -> &Path {
        &self.model
    }

    /// The daemon's pid, once it is known (after the fork).
    pub fn record_daemon(&mut self) {
        let _ = self.file.set_len(0);
        let _ = std::os::unix::fs::FileExt::write_all_at(
            &self.file,
            format!("{}\n{}\n", self.holder, std::process::id()).as_bytes(),
            0,
        );
    }

    /// Moves the claim to the file `meta` describes, which is about to take (or has taken)
    /// the model's name, and returns the claim on the previous file, if it was another: the
    /// caller releases it once nothing has that file open any more.
    pub fn follow(&mut self, meta: &std::fs::Metadata) -> Result<Option<FileClaim>> {
        if claim_name(meta) == self.name {
            return Ok(None);
        }
        let dir = self
            .dir
            .try_clone()
            .map_err(|e| Error::io("the runtime directory", e))?;
        let new = FileClaim::take(dir, &self.model, meta, self.holder.clone())?;
        Ok(Some(std::mem::replace(self, new)))
    }
}

/// The claims of one mount (or `apply`), kept on the files that have the models' names
/// through re-layouts (see `FileClaim`).
pub struct Claims {
    held: std::sync::Mutex<Vec<FileClaim>>,
    /// Claims on files a re-layout replaced, released once the snapshot that has them open
    /// is gone.
    retired: std::sync::Mutex<Vec<FileClaim>>,
}

impl Claims {
    pub fn new(claims: Vec<FileClaim>) -> Claims {
        Claims {
            held: std::sync::Mutex::new(claims),
            retired: Default::default(),
        }
    }

    /// Releases every claim.
    pub fn release(&self) {
        lock_list(&self.retired).clear();
        lock_list(&self.held).clear();
    }
}

fn lock_list(list: &std::sync::Mutex<Vec<FileClaim>>) -> std::sync::MutexGuard<'_, Vec<FileClaim>> {
    list.lock().unwrap_or_else(|e| e.into_inner())
}

impl crate::edit::FileWatcher for Claims {
    fn replacing(&self, path: &Path, new: &std::fs::Metadata) -> Result<()> {
        for claim in lock_list(&self.held)
            .iter_mut()
            .filter(|c| c.model() == path)
        {
            let old = claim.follow(new).map_err(|e| {
                e.context("cannot claim the re-laid-out file, so it is not renamed over the model")
            })?;
            lock_list(&self.retired).extend(old);
        }
        Ok(())
    }

    fn now_open(&self, model: &crate::format::Model) {
        // The new snapshot's files are claimed (`replacing`); the files of the previous
        // one are closed after this returns.
        lock_list(&self.retired).clear();
        for f in &model.files {
            let Some(meta) = f.file.as_ref().and_then(|h| h.metadata().ok()) else {
                continue;
            };
            for claim in lock_list(&self.held)
                .iter_mut()
                .filter(|c| c.model() == f.path)
            {
                if let Err(e) = claim.follow(&meta) {
                    log::warn!(
                        "{}: the claim that keeps it mounted once stays on its previous inode: {e}",
                        f.path.display()
                    );
                }
            }
        }
    }
}

/// The refusal of a claim `file` that another process holds, naming it.
fn held_by_other(file: &mut File, model: &Path) -> Error {
    let mut holder = String::new();
    let _ = file.take(4096).read_to_string(&mut holder);
    let mut lines = holder.lines();
    let at = lines.next().unwrap_or("mounted elsewhere");
    let pid = lines.next().unwrap_or("?");
    let advice = if at == APPLYING || at == RECOVERING {
        "try again once it is done"
    } else {
        "unmount it first"
    };
    Error::new(
        libc::EBUSY,
        format!(
            "{} is already {at} (ptefs pid {pid}); {advice}",
            model.display()
        ),
    )
}

impl Drop for FileClaim {
    fn drop(&mut self) {
        // Removed while still locked: a new claim that opened the old file notices.
        if let Ok(c) = c_string(self.name.as_bytes()) {
            // SAFETY: a valid directory descriptor and C string.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) };
        }
    }
}

/// What the lock file of mount `dev` says, as `ptefs umount` and `ptefs mount` read it.
pub struct MountRecord {
    /// The lock file, for `wait_for_daemon`.
    pub file: File,
    dir: File,
    name: String,
    /// Whether a live daemon holds it.
    pub held: bool,
    pub pid: Option<u32>,
    pub mountpoint: Option<PathBuf>,
    pub model: Option<PathBuf>,
}

/// The record of mount `dev` in this user's runtime directory, if ptefs made one.
pub fn mount_record(dev: &str) -> Option<MountRecord> {
    let name = lock_name(dev);
    runtime_dirs().into_iter().find_map(|d| {
        let dir = private_dir(&d).ok()?;
        let mut file = open_in(&dir, &name, false).ok()?;
        let mut bytes = Vec::new();
        // Bounded: a record is a pid and two paths.
        (&mut file)
            .take(3 * 4096 + 32)
            .read_to_end(&mut bytes)
            .ok()?;
        let mut fields = bytes.split(|&b| b == 0);
        let pid = fields
            .next()
            .and_then(|f| std::str::from_utf8(f).ok())
            .and_then(|f| f.trim().parse().ok());
        let path = |f: Option<&[u8]>| {
            f.filter(|f| !f.is_empty())
                .map(|f| PathBuf::from(std::ffi::OsStr::from_bytes(f)))
        };
        let mountpoint = path(fields.next());
        let model = path(fields.next());
        // SAFETY: flock on a descriptor we own.
        let held = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0;
        if !held {
            // SAFETY: as above.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
        Some(MountRecord {
            file,
            dir,
            name: name.clone(),
            held,
            pid,
            mountpoint,
            model,
        })
    })
}

impl MountRecord {
    /// Removes the record of a mount whose daemon is gone (after that mount was unmounted),
    /// unless a new daemon holds it by now.
    pub fn remove_if_abandoned(self) {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return;
        }
        if still_named(&self.dir, &self.name, &self.file) {
            if let Ok(c) = c_string(self.name.as_bytes()) {
                // SAFETY: a valid directory descriptor and C string.
                unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) };
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn uses_only_private_directories_and_never_follows_links() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        // A link planted where the directory would be.
        let linked = base.path().join("linked");
        std::os::unix::fs::symlink(&target, &linked).unwrap();
        assert!(private_dir(&linked).is_err());
        // A directory others may write.
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_dir(&open).is_err());
        // A directory of another user (only root can make one to test with).
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = base.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(private_dir(&theirs).is_err());
        }
        // A fresh one is created 0700 and used; a link planted as the lock file is not
        // followed.
        let fresh = base.path().join("fresh");
        let dir = private_dir(&fresh).unwrap();
        assert_eq!(
            std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let victim = target.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, fresh.join(lock_name("0:99"))).unwrap();
        assert!(open_in(&dir, &lock_name("0:99"), true).is_err());
        assert!(MountLock::take_in(&[linked, open, fresh.clone()], "0:99", b"record").is_none());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // With a clean directory the lock is taken, and removed when dropped.
        std::fs::remove_file(fresh.join(lock_name("0:99"))).unwrap();
        let lock = MountLock::take_in(std::slice::from_ref(&fresh), "0:99", b"record").unwrap();
        assert!(fresh.join(lock_name("0:99")).is_file());
        drop(lock);
        assert!(!fresh.join(lock_name("0:99")).exists());
    }

    /// Asserts that claiming `model` is refused because `ptefs apply` holds it.
    fn assert_held_by_apply(dirs: &[PathBuf], model: &Path) {
        let Err(err) = claim_file_in(dirs, model, Holder::Recover) else {
            panic!("claimed twice")
        };
        assert!(
            err.to_string().contains("being updated by ptefs apply"),
            "{err}"
        );
    }

    #[test]
    fn a_claim_follows_its_file_to_a_new_inode_and_frees_the_old() {
        let base = tempfile::tempdir().unwrap();
        let dirs = [base.path().join("run")];
        let model = base.path().join("m.pte");
        std::fs::write(&model, b"old").unwrap();
        let old = std::fs::metadata(&model).unwrap();
        let mut claim = claim_file_in(&dirs, &model, Holder::Apply).unwrap();
        assert_held_by_apply(&dirs, &model);
        // A new file renamed over the model, as a re-layout does (the old one stays open).
        let _still_open = File::open(&model).unwrap();
        let new_file = base.path().join(".m.pte.new");
        std::fs::write(&new_file, b"new").unwrap();
        std::fs::rename(&new_file, &model).unwrap();
        let new = std::fs::metadata(&model).unwrap();
        let previous = claim.follow(&new).unwrap();
        assert!(dirs[0].join(claim_name(&old)).exists());
        drop(previous);
        assert!(!dirs[0].join(claim_name(&old)).exists());
        assert!(dirs[0].join(claim_name(&new)).exists());
        assert_held_by_apply(&dirs, &model);
        drop(claim);
        assert!(!dirs[0].join(claim_name(&new)).exists());
        drop(claim_file_in(&dirs, &model, Holder::Recover).unwrap());
    }

    #[test]
    fn claims_move_to_the_new_file_before_its_rename_and_free_the_old_after() {
        use crate::edit::FileWatcher;
        let base = tempfile::tempdir().unwrap();
        let dirs = [base.path().join("run")];
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/linear.pte");
        let model = base.path().join("m.pte");
        std::fs::copy(&fixture, &model).unwrap();
        let old = std::fs::metadata(&model).unwrap();
        let claims = Claims::new(vec![claim_file_in(&dirs, &model, Holder::Apply).unwrap()]);
        let new_file = base.path().join(".m.pte.new");
        std::fs::copy(&fixture, &new_file).unwrap();
        let new = std::fs::metadata(&new_file).unwrap();
        claims.replacing(&model, &new).unwrap();
        // Both are claimed until the snapshot that has the old file open is replaced.
        assert!(dirs[0].join(claim_name(&old)).exists());
        assert!(dirs[0].join(claim_name(&new)).exists());
        std::fs::rename(&new_file, &model).unwrap();
        claims.now_open(&crate::format::Model::open(&model, &[] as &[PathBuf]).unwrap());
        assert!(!dirs[0].join(claim_name(&old)).exists());
        assert!(dirs[0].join(claim_name(&new)).exists());
        assert_held_by_apply(&dirs, &model);
        claims.release();
        assert!(!dirs[0].join(claim_name(&new)).exists());
    }
}
