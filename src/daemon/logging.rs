//! Where the daemon's log goes: stderr in the foreground; in the background `--log-file`,
//! else syslog, else (no syslog listening at `/dev/log`, common in containers) stderr until
//! the fork, then a log file of the daemon's own in the runtime directory, which the mount
//! names. The level comes from `-v` and `RUST_LOG`.
//!
//! Invariants: a background mount never logs into nothing while it still has a terminal; the
//! runtime log file is created only in a directory that belongs to the daemon's user and
//! that nobody else may write (`lock::runtime_dir`), relative to that directory's
//! descriptor, without following links and with mode 0600, and is used only if it is then a
//! regular file of that user with one link; it is created at the first record after the
//! mount is live, so mounts that log nothing leave nothing behind. What the daemon logs
//! between the fork and the moment the mount is live is kept in memory: if the mount fails,
//! the parent prints the failure, and those records are dropped.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The socket syslog listens on.
const SYSLOG_SOCKET: &str = "/dev/log";

/// At most this many bytes of records are kept between the fork and the live mount.
const PENDING_MAX: usize = 64 << 10;

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

/// Whether something listens on `/dev/log` (a datagram or a stream socket, as glibc's
/// syslog tries them): without it, syslog drops every record silently.
pub fn syslog_listens() -> bool {
    UnixDatagram::unbound().is_ok_and(|s| s.connect(SYSLOG_SOCKET).is_ok())
        || UnixStream::connect(SYSLOG_SOCKET).is_ok()
}

/// Where log records go.
pub enum LogTarget<'a> {
    Stderr,
    File(&'a Path),
    Syslog,
    /// No syslog: stderr, then a runtime log file (`RuntimeLog`).
    Fallback,
}

/// The runtime log file of a daemon: its directory (open) and path. The file itself is
/// created at the first record after the mount is live.
pub struct RuntimeLog {
    dir: File,
    name: CString,
    pub path: PathBuf,
    /// The first line of the file: who writes it.
    header: String,
}

impl RuntimeLog {
    /// The log file daemon `pid` will write, in this user's runtime directory, for the mount
    /// of `model` on `mountpoint`: `mount-<pid>.log`, or, when an earlier daemon with the
    /// same pid left that file, `mount-<pid>.<n>.log` with the first `n` that is free, so
    /// each daemon's file holds its own records only.
    pub fn for_daemon(pid: i32, model: &Path, mountpoint: &Path) -> Result<RuntimeLog> {
        let (dir, dir_path) = crate::host::claims::runtime_dir()
            .map_err(|e| e.context("no directory for the daemon's log file"))?;
        let taken = |name: &str| {
            !matches!(
                crate::source::stat_in(&dir, std::ffi::OsStr::new(name)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound
            )
        };
        let name = (0..1000)
            .map(|n| match n {
                0 => format!("mount-{pid}.log"),
                n => format!("mount-{pid}.{n}.log"),
            })
            .find(|name| !taken(name))
            .ok_or_else(|| {
                Error::new(
                    libc::EEXIST,
                    format!(
                        "{}: mount-{pid}.log and 999 more names are taken",
                        dir_path.display()
                    ),
                )
            })?;
        Ok(RuntimeLog {
            dir,
            path: dir_path.join(&name),
            name: CString::new(name).expect("no NUL"),
            header: format!(
                "ptefs daemon pid {pid}: {} on {}\n",
                model.display(),
                mountpoint.display()
            ),
        })
    }

    /// Opens the file for appending: created with mode 0600 if missing (relative to the
    /// directory, not following a link), used only if it is then a regular file of this
    /// user with one link. What this daemon writes starts with the header.
    fn open(&self) -> std::io::Result<File> {
        let flags = libc::O_WRONLY
            | libc::O_APPEND
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_NONBLOCK
            | libc::O_CLOEXEC;
        // SAFETY: a valid directory descriptor and C string.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), self.name.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned here alone.
        let mut file = unsafe { File::from_raw_fd(fd) };
        let meta = file.metadata()?;
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        if !meta.is_file() || meta.uid() != uid || meta.nlink() != 1 || meta.mode() & 0o077 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "not a private regular file of this user",
            ));
        }
        file.write_all(self.header.as_bytes())?;
        Ok(file)
    }
}

/// Where the fallback logger's bytes go now.
enum Sink {
    /// Before the fork (the parent keeps the terminal).
    Stderr,
    /// Between the fork and the live mount.
    Pending(Vec<u8>),
    /// Once the mount is live: the file, opened at the first record.
    Runtime(RuntimeLog, Option<File>),
    /// The file could not be opened: records are dropped.
    Nowhere,
}

static SINK: Mutex<Sink> = Mutex::new(Sink::Stderr);

fn sink() -> std::sync::MutexGuard<'static, Sink> {
    SINK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fallback logger's output: whatever `SINK` says now.
struct Switchable;

impl Write for Switchable {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut sink = sink();
        match &mut *sink {
            Sink::Stderr => std::io::stderr().write_all(buf)?,
            Sink::Pending(v) => {
                if v.len() + buf.len() <= PENDING_MAX {
                    v.extend_from_slice(buf);
                }
            }
            Sink::Runtime(log, file) => {
                if file.is_none() {
                    match log.open() {
                        Ok(f) => *file = Some(f),
                        Err(_) => {
                            *sink = Sink::Nowhere;
                            return Ok(buf.len());
                        }
                    }
                }
                if let Some(f) = file {
                    f.write_all(buf)?;
                }
            }
            Sink::Nowhere => {}
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// In the daemon, right after the fork: records wait in memory until `live` (the terminal
/// is about to go).
pub fn forked() {
    let mut sink = sink();
    if matches!(*sink, Sink::Stderr) {
        *sink = Sink::Pending(Vec::new());
    }
}

/// The mount is live: records (those kept since the fork first) go to `log`.
pub fn live(log: RuntimeLog) {
    let mut sink = sink();
    let pending = match std::mem::replace(&mut *sink, Sink::Nowhere) {
        Sink::Pending(v) => v,
        _ => Vec::new(),
    };
    if pending.is_empty() {
        *sink = Sink::Runtime(log, None);
        return;
    }
    *sink = match log.open() {
        Ok(mut f) => {
            let _ = f.write_all(&pending);
            Sink::Runtime(log, Some(f))
        }
        Err(_) => Sink::Nowhere,
    };
}

pub fn init(verbose: u8, target: LogTarget) -> Result<()> {
    let mut b = logger_builder(verbose);
    match target {
        LogTarget::Stderr => {
            b.target(env_logger::Target::Stderr);
            let _ = b.try_init();
        }
        LogTarget::File(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    Error::io(format!("{}: cannot open the log file", path.display()), e)
                })?;
            b.target(env_logger::Target::Pipe(Box::new(file)));
            b.write_style(env_logger::WriteStyle::Never);
            let _ = b.try_init();
        }
        LogTarget::Syslog => {
            // SAFETY: the identifier is a static C string; openlog keeps the pointer.
            unsafe { libc::openlog(c"ptefs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
            let filter = b.build();
            let max = filter.filter();
            if log::set_boxed_logger(Box::new(Syslog { filter })).is_ok() {
                log::set_max_level(max);
            }
        }
        LogTarget::Fallback => {
            b.target(env_logger::Target::Pipe(Box::new(Switchable)));
            b.write_style(env_logger::WriteStyle::Never);
            let _ = b.try_init();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_does_not_write_into_the_log_of_an_earlier_one_with_its_pid() {
        // No process has this pid (pid_max is at most 2^22).
        let pid = i32::MAX - 7;
        let (_, dir) = crate::host::claims::runtime_dir().unwrap();
        let earlier = dir.join(format!("mount-{pid}.log"));
        std::fs::write(
            &earlier,
            format!("ptefs daemon pid {pid}: an earlier mount\n"),
        )
        .unwrap();
        let log = RuntimeLog::for_daemon(pid, Path::new("/m.pte"), Path::new("/mnt"));
        let _ = std::fs::remove_file(&earlier);
        let log = log.unwrap();
        assert_eq!(log.path, dir.join(format!("mount-{pid}.1.log")));
        let fresh = RuntimeLog::for_daemon(pid, Path::new("/m.pte"), Path::new("/mnt")).unwrap();
        assert_eq!(fresh.path, earlier);
    }
}
