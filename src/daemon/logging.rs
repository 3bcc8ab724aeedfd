//! Where the daemon's log goes: stderr in the foreground, else syslog or a log file; the
//! level from `-v` and `RUST_LOG`.

use std::ffi::CString;
use std::path::Path;

use crate::error::{Error, Result};

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

/// Where log records go.
pub enum LogTarget<'a> {
    Stderr,
    File(&'a Path),
    Syslog,
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
    }
    Ok(())
}
