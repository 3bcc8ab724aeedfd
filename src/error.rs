//! The one error type below the command line: an errno for the kernel (or the exit status),
//! a sentence for people, and the level at which it deserves to be logged.
//!
//! Invariant: the message says what went wrong and where (a tree path, a file, an offset),
//! and, for refusals, what was expected and what was found. The level follows from the errno
//! unless the code that raised the error knows better (`with_level`): lookups of names that
//! do not exist are routine (debug), refusals of what the user asked are worth a warning,
//! failed I/O on the model file is an error.

use std::fmt;

use crate::format::FormatError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    errno: i32,
    message: String,
    level: log::Level,
}

pub type Result<T> = std::result::Result<T, Error>;

/// The level an errno is logged at when nothing more specific is known. Answers to probes
/// (a missing name or xattr, an ioctl such as `cp`'s FICLONE) are debug lines.
fn default_level(errno: i32) -> log::Level {
    match errno {
        libc::ENOENT
        | libc::ENODATA
        | libc::ENOTSUP
        | libc::ENOSYS
        | libc::ENOTTY
        | libc::ERANGE => log::Level::Debug,
        libc::EACCES
        | libc::EPERM
        | libc::EROFS
        | libc::EEXIST
        | libc::EISDIR
        | libc::ENOTDIR
        | libc::EBADF
        | libc::ENOTEMPTY => log::Level::Info,
        libc::EINVAL
        | libc::EFBIG
        | libc::ENOSPC
        | libc::EDQUOT
        | libc::ENAMETOOLONG
        | libc::EBUSY => log::Level::Warn,
        _ => log::Level::Error,
    }
}

impl Error {
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        Error {
            errno,
            message: message.into(),
            level: default_level(errno),
        }
    }

    /// `EINVAL`: content or arguments that cannot be accepted.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(libc::EINVAL, message)
    }

    /// `ENOENT` for `what`.
    pub fn not_found(what: impl fmt::Display) -> Self {
        Error::new(libc::ENOENT, format!("{what}: no such file or directory"))
    }

    /// A failed system call on `what`, with the errno it returned (EIO when it had none).
    pub fn io(what: impl fmt::Display, e: std::io::Error) -> Self {
        Error::new(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {e}"),
        )
    }

    pub fn with_level(mut self, level: log::Level) -> Self {
        self.level = level;
        self
    }

    /// The same error, its message prefixed with `context` ("plans/forward/values/0.bin: …").
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    pub fn errno(&self) -> i32 {
        self.errno
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn level(&self) -> log::Level {
        self.level
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// A malformed file: the request cannot be served from it.
impl From<FormatError> for Error {
    fn from(e: FormatError) -> Self {
        Error::new(libc::EINVAL, e.message().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_errno_unless_overridden() {
        assert_eq!(Error::not_found("x").level(), log::Level::Debug);
        assert_eq!(Error::invalid("x").level(), log::Level::Warn);
        assert_eq!(Error::new(libc::EIO, "x").level(), log::Level::Error);
        let e = Error::new(libc::EIO, "x").with_level(log::Level::Info);
        assert_eq!(e.level(), log::Level::Info);
        assert_eq!(Error::invalid("b").context("a").message(), "a: b");
    }
}
