//! Mounting: argument checks before the mount, the background server, clean unmounts.
//!
//! `mount` checks everything it can while it still has the terminal (the file, the
//! mountpoint, `/dev/fuse`) and finishes interrupted commits. Then, unless `--foreground`, it
//! forks: the child parses the model, detaches, mounts, and reports through a pipe once the
//! mount is live (or why it failed, a malformed model included); the parent prints that and
//! exits. The server answers with two worker threads, a thread that sends cache
//! invalidations to the kernel, and a thread that turns SIGINT/SIGTERM into "commit, then
//! unmount".
//!
//! A lock file per mount (named after the mount's device number, held by the daemon for its
//! whole life) lets `ptefs umount` wait until the daemon has committed and exited.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, Session, SessionACL};

use crate::edit::{journal, relayout};
use crate::fs::{Fs, Options};
use crate::fuse::{FuseFs, Notices};
use crate::tree::{Model, Tree};

#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    pub file: PathBuf,
    pub mountpoint: PathBuf,
    /// Attach a .ptd data file (repeatable); its tree appears under data/<stem>/.
    #[arg(long = "data", value_name = "PTD")]
    pub data: Vec<PathBuf>,
    /// Show every file read-only (writes fail with EROFS).
    #[arg(long)]
    pub read_only: bool,
    /// Stay attached and log to stderr.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// FUSE mount options, comma-separated (allow_other, default_permissions, ...).
    #[arg(short = 'o', value_name = "OPT[,OPT]")]
    pub options: Vec<String>,
    /// More logging (-v info, -vv debug, -vvv trace); RUST_LOG also works.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// In the background, log to this file instead of syslog.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
}

/// Worker threads answering the kernel (each with its own `/dev/fuse` descriptor).
const WORKERS: usize = 2;

/// What the mount's block-device info gets as readahead, so the kernel sends 1 MiB reads.
const READ_AHEAD_KB: &str = "1024";

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("ptefs: {message}");
    ExitCode::FAILURE
}

// ---------------------------------------------------------------------------------------
// Logging

fn level(verbose: u8) -> log::LevelFilter {
    match verbose {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        2 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    }
}

fn logger_builder(verbose: u8) -> env_logger::Builder {
    let mut b = env_logger::Builder::new();
    b.filter_level(level(verbose));
    // fuser reports unmounts it did not start, and similar, as warnings: keep them for -v.
    if verbose == 0 {
        b.filter_module("fuser", log::LevelFilter::Error);
    }
    b.parse_default_env();
    b
}

/// Log records to syslog, filtered like env_logger (levels, RUST_LOG).
struct Syslog {
    filter: env_logger::Logger,
}

impl log::Log for Syslog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &log::Record) {
        if !self.filter.matches(record) {
            return;
        }
        let priority = match record.level() {
            log::Level::Error => libc::LOG_ERR,
            log::Level::Warn => libc::LOG_WARNING,
            log::Level::Info => libc::LOG_INFO,
            log::Level::Debug | log::Level::Trace => libc::LOG_DEBUG,
        };
        let text = format!("{}", record.args()).replace('\0', " ");
        if let Ok(c) = CString::new(text) {
            // SAFETY: a constant format string with one C string argument.
            unsafe { libc::syslog(priority, c"%s".as_ptr(), c.as_ptr()) };
        }
    }

    fn flush(&self) {}
}

fn init_logging(args: &MountArgs) -> Result<(), String> {
    let mut b = logger_builder(args.verbose);
    if args.foreground {
        b.target(env_logger::Target::Stderr);
        let _ = b.try_init();
        return Ok(());
    }
    if let Some(path) = &args.log_file {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("{}: cannot open the log file: {e}", path.display()))?;
        b.target(env_logger::Target::Pipe(Box::new(file)));
        b.write_style(env_logger::WriteStyle::Never);
        let _ = b.try_init();
        return Ok(());
    }
    // SAFETY: the identifier is a static C string; openlog keeps the pointer.
    unsafe { libc::openlog(c"ptefs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    let filter = b.build();
    let max = filter.filter();
    if log::set_boxed_logger(Box::new(Syslog { filter })).is_ok() {
        log::set_max_level(max);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Mount table, lock files, unmounting

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
struct MountEntry {
    /// "major:minor"
    dev: String,
    fstype: String,
    source: String,
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

/// The topmost mount at `path` (an absolute, canonical path), from the mount table.
fn find_mount(path: &Path) -> Option<MountEntry> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut found = None;
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || fields.len() < sep + 3 {
            continue;
        }
        if Path::new(&unescape(fields[4])) == path {
            found = Some(MountEntry {
                dev: fields[2].to_string(),
                fstype: fields[sep + 1].to_string(),
                source: unescape(fields[sep + 2]).to_string_lossy().into_owned(),
            });
        }
    }
    found
}

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

/// The daemon's lock file, held (flock) until it exits.
struct MountLock {
    path: PathBuf,
    _file: File,
}

impl MountLock {
    fn take(dev: &str) -> Option<MountLock> {
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
fn open_lock(dev: &str) -> Option<File> {
    runtime_dirs()
        .into_iter()
        .find_map(|d| File::open(d.join(lock_name(dev))).ok())
}

fn run_fusermount(path: &Path, lazy: bool) -> Result<(), String> {
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
                return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => last = format!("{tool}: {e}"),
        }
    }
    Err(last)
}

/// Unmounts `path`: umount(2) as root, else through fusermount.
fn unmount_path(path: &Path, lazy: bool) -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(format!("{}: {e}", path.display()));
        }
    }
    run_fusermount(path, lazy)
}

/// The absolute path of a mountpoint without touching the mount itself when it is dead.
fn absolute(path: &Path) -> PathBuf {
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

pub fn umount(mountpoint: &Path) -> ExitCode {
    let path = absolute(mountpoint);
    let Some(entry) = find_mount(&path) else {
        return fail(format!("{}: not mounted", mountpoint.display()));
    };
    if entry.fstype != "fuse.ptefs" && !entry.source.starts_with("ptefs:") {
        return fail(format!(
            "{}: not a ptefs mount (it is {} from {})",
            mountpoint.display(),
            entry.fstype,
            entry.source
        ));
    }
    let lock = open_lock(&entry.dev);
    if let Err(e) = unmount_path(&path, false) {
        return fail(format!("cannot unmount {}: {e}", mountpoint.display()));
    }
    let Some(lock) = lock else {
        return ExitCode::SUCCESS;
    };
    // The daemon holds the lock until it has committed everything and exited.
    let start = Instant::now();
    let mut told = false;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return ExitCode::SUCCESS;
        }
        if !told && start.elapsed() > Duration::from_secs(2) {
            eprintln!("ptefs: waiting for the daemon to finish its commits…");
            told = true;
        }
        if start.elapsed() > Duration::from_secs(600) {
            return fail("the daemon did not exit within 10 minutes of the unmount");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------
// Mounting

/// Mount options: ours, then the user's `-o` list (which may override fsname and subtype).
fn fuse_config(args: &MountArgs, file: &Path) -> (Config, bool) {
    let mut read_only = args.read_only;
    let mut fsname = format!("ptefs:{}", file.display()).replace(',', "_");
    let mut subtype = "ptefs".to_string();
    let mut acl = SessionACL::Owner;
    let mut opts = Vec::new();
    for opt in args.options.iter().flat_map(|o| o.split(',')) {
        let o = match opt.trim() {
            "" => continue,
            "allow_other" => {
                acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                acl = SessionACL::RootAndOwner;
                continue;
            }
            "ro" => {
                read_only = true;
                continue;
            }
            "rw" => continue,
            "default_permissions" => MountOption::DefaultPermissions,
            "auto_unmount" => MountOption::AutoUnmount,
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            o if o.starts_with("fsname=") => {
                fsname = o["fsname=".len()..].to_string();
                continue;
            }
            o if o.starts_with("subtype=") => {
                subtype = o["subtype=".len()..].to_string();
                continue;
            }
            o => MountOption::CUSTOM(o.to_string()),
        };
        opts.push(o);
    }
    opts.push(MountOption::FSName(fsname));
    // Passed as a kernel option, so a direct mount(2) as root carries it too.
    opts.push(MountOption::CUSTOM(format!("subtype={subtype}")));
    opts.push(MountOption::NoAtime);
    if read_only {
        opts.push(MountOption::RO);
    }
    if opts.contains(&MountOption::AutoUnmount) && acl == SessionACL::Owner {
        acl = SessionACL::RootAndOwner;
    }
    let mut cfg = Config::default();
    cfg.mount_options = opts;
    cfg.acl = acl;
    cfg.n_threads = Some(WORKERS);
    cfg.clone_fd = true;
    (cfg, read_only)
}

/// Replays or discards journals and removes re-layout leftovers of interrupted commits.
fn recover(path: &Path, announce: bool) -> Result<(), String> {
    let say = |msg: String| {
        log::warn!("{msg}");
        if announce {
            eprintln!("ptefs: {msg}");
        }
    };
    match journal::recover(path) {
        Ok(journal::Recovery::None) => {}
        Ok(journal::Recovery::Replayed { offset, len }) => say(format!(
            "{}: finished an interrupted commit from its journal ({len} bytes at offset {offset})",
            path.display()
        )),
        Ok(journal::Recovery::Discarded(why)) => say(format!(
            "{}: discarded the journal of an interrupted commit ({why}); the file is unchanged",
            path.display()
        )),
        Err(e) => return Err(format!("{}: journal recovery failed: {e}", path.display())),
    }
    if let Some(tmp) = relayout::remove_stale(path) {
        say(format!(
            "{}: removed {} left by an interrupted re-layout; the file is unchanged",
            path.display(),
            tmp.display()
        ));
    }
    Ok(())
}

/// Where the mount reports that it is live, or why it is not.
enum Ready {
    Foreground,
    Pipe(File),
}

impl Ready {
    fn report(self, result: Result<(), String>) {
        match (self, result) {
            (Ready::Foreground, Ok(())) => {}
            (Ready::Foreground, Err(e)) => eprintln!("ptefs: {e}"),
            (Ready::Pipe(mut f), r) => {
                let msg = match r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("error:{e}"),
                };
                let _ = f.write_all(msg.as_bytes());
            }
        }
    }
}

pub fn mount(args: MountArgs) -> ExitCode {
    if let Err(e) = init_logging(&args) {
        return fail(e);
    }
    // Everything that can be checked is checked while the terminal is still ours.
    let file = match args.file.canonicalize() {
        Ok(f) => f,
        Err(e) => return fail(format!("{}: {e}", args.file.display())),
    };
    let mut data = Vec::new();
    for d in &args.data {
        match d.canonicalize() {
            Ok(p) => data.push(p),
            Err(e) => return fail(format!("{}: {e}", d.display())),
        }
    }
    let mountpoint = match std::fs::metadata(&args.mountpoint) {
        Ok(m) if m.is_dir() => match args.mountpoint.canonicalize() {
            Ok(p) => p,
            Err(e) => return fail(format!("{}: {e}", args.mountpoint.display())),
        },
        Ok(_) => {
            return fail(format!(
                "{}: the mountpoint is not a directory",
                args.mountpoint.display()
            ))
        }
        Err(e) => return fail(format!("{}: {e}", args.mountpoint.display())),
    };
    if !Path::new("/dev/fuse").exists() {
        return fail("/dev/fuse is missing: load the fuse module (modprobe fuse) or run where FUSE is available");
    }
    let (config, read_only) = fuse_config(&args, &file);
    for p in std::iter::once(&file).chain(&data) {
        if let Err(e) = recover(p, !args.foreground) {
            if !read_only {
                return fail(e);
            }
            log::warn!("{e}");
        }
    }
    if args.foreground {
        return match open_fs(&file, &data, read_only) {
            Ok(fs) => serve(fs, &config, &mountpoint, Ready::Foreground),
            Err(e) => fail(e),
        };
    }

    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return fail(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned here alone.
    let (read_end, write_end) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // The child parses the model: the parent stays small, so that forking and the parent's
    // exit cost next to nothing, and the daemon never copies the parsed model on write.
    // SAFETY: no thread has been started yet, so the child is a faithful copy.
    match unsafe { libc::fork() } {
        -1 => fail(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(read_end);
            let fs = match open_fs(&file, &data, read_only) {
                Ok(fs) => fs,
                Err(e) => {
                    Ready::Pipe(write_end).report(Err(e));
                    std::process::exit(1);
                }
            };
            detach();
            let code = serve(fs, &config, &mountpoint, Ready::Pipe(write_end));
            std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
        }
        _child => {
            drop(write_end);
            let mut msg = String::new();
            let mut read_end = read_end;
            let _ = read_end.read_to_string(&mut msg);
            if msg == "ok" {
                // The daemon owns the mount now.
                std::process::exit(0);
            } else if let Some(e) = msg.strip_prefix("error:") {
                fail(e)
            } else {
                fail("the daemon exited before the mount was live (see the log)")
            }
        }
    }
}

/// Parses the model and its data files and builds the tree that the mount shows.
fn open_fs(file: &Path, data: &[PathBuf], read_only: bool) -> Result<Arc<Fs>, String> {
    let model = Model::open(file, data).map_err(|e| e.to_string())?;
    let tree = Tree::build(Arc::new(model));
    Ok(Arc::new(Fs::new(tree, Options { read_only })))
}

/// Leaves the terminal: a new session, `/` as working directory, stdio on /dev/null.
fn detach() {
    // SAFETY: plain system calls on descriptors this process owns.
    unsafe {
        libc::setsid();
        let _ = libc::chdir(c"/".as_ptr());
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Raises the mount's readahead so the kernel sends 1 MiB reads (root only; best effort).
fn raise_readahead(dev: &str) {
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, READ_AHEAD_KB) {
        Ok(()) => log::debug!("{path} = {READ_AHEAD_KB}"),
        Err(e) => log::debug!("cannot raise readahead through {path}: {e}"),
    }
}

fn commit_pending(fs: &Fs, notices: &Notices) {
    for r in fs.commit_all() {
        match r {
            Ok(inval) => notices.inodes(inval.inodes, false),
            Err(e) => log::error!("commit before unmount failed: {}", e.message),
        }
    }
}

/// Waits for SIGINT/SIGTERM/SIGHUP, then commits what is staged and unmounts. When open
/// files keep the mount busy, it is detached; the daemon exits once it is released or
/// after a grace period.
fn on_signals(fs: Arc<Fs>, notices: Notices, mountpoint: PathBuf) {
    let set = signal_set();
    let mut sig = 0;
    // SAFETY: waits on a valid set that every thread blocks.
    unsafe { libc::sigwait(&set, &mut sig) };
    log::info!("signal {sig}: committing pending writes and unmounting");
    commit_pending(&fs, &notices);
    if let Err(e) = unmount_path(&mountpoint, false) {
        log::info!("unmount: {e}; detaching the busy mount");
        if let Err(e) = unmount_path(&mountpoint, true) {
            log::error!("cannot unmount {}: {e}", mountpoint.display());
        }
    }
    // The session ends (and the process exits) once the kernel lets go of the mount.
    std::thread::sleep(Duration::from_secs(5));
    commit_pending(&fs, &notices);
    log::warn!("the mount is still in use 5 s after the signal: exiting");
    std::process::exit(0);
}

fn serve(fs: Arc<Fs>, config: &Config, mountpoint: &Path, ready: Ready) -> ExitCode {
    // Signals go to the signal thread only: block them before any thread starts.
    let set = signal_set();
    // SAFETY: changes this thread's mask; threads started later inherit it.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };

    let (tx, queues) = crate::fuse::notices();
    let fuse = FuseFs::new(fs.clone(), tx.clone());
    let session = match Session::new(fuse, mountpoint, config) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("cannot mount on {}: {e}", mountpoint.display());
            log::error!("{msg}");
            ready.report(Err(msg));
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = queues.spawn(session.notifier(), session.notifier()) {
        ready.report(Err(format!("cannot start a thread: {e}")));
        return ExitCode::FAILURE;
    }
    let lock = match find_mount(mountpoint) {
        Some(entry) => {
            raise_readahead(&entry.dev);
            MountLock::take(&entry.dev)
        }
        None => {
            log::warn!("{} is not in the mount table", mountpoint.display());
            None
        }
    };
    {
        let (fs, tx, mp) = (fs.clone(), tx.clone(), mountpoint.to_path_buf());
        let _ = std::thread::Builder::new()
            .name("ptefs-signals".into())
            .spawn(move || on_signals(fs, tx, mp));
    }
    drop(tx);
    let tree = fs.tree();
    log::info!(
        "mounted {} on {}{}",
        tree.model.files[0].path.display(),
        mountpoint.display(),
        if fs.options.read_only {
            " (read-only)"
        } else {
            ""
        }
    );
    drop(tree);
    ready.report(Ok(()));
    let result = session.run();
    drop(lock);
    match result {
        Ok(()) => {
            log::info!("unmounted {}", mountpoint.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            log::error!("the FUSE session failed: {e}");
            ExitCode::FAILURE
        }
    }
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

    #[test]
    fn parses_mount_options() {
        let args = MountArgs {
            file: "m.pte".into(),
            mountpoint: "/mnt".into(),
            data: vec![],
            read_only: false,
            foreground: false,
            options: vec!["allow_other,ro".into(), "fsname=x".into()],
            verbose: 0,
            log_file: None,
        };
        let (cfg, ro) = fuse_config(&args, Path::new("/m.pte"));
        assert!(ro);
        assert_eq!(cfg.acl, SessionACL::All);
        assert!(cfg.mount_options.contains(&MountOption::FSName("x".into())));
        assert!(cfg.mount_options.contains(&MountOption::RO));
        assert!(cfg
            .mount_options
            .contains(&MountOption::CUSTOM("subtype=ptefs".into())));
    }
}
