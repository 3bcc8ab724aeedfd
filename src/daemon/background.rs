//! Leaving the terminal: the parent forks, the child detaches, parses the model, mounts and
//! reports through a pipe once the mount is live (or why it is not); the parent prints that
//! and exits. The parent stays small, so forking and its exit cost next to nothing, and the
//! daemon never copies the parsed model on write.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use super::logging::{self, RuntimeLog};
use crate::error::{Error, Result};

/// Where the mount reports that it is live, or why it is not.
pub enum Ready {
    Foreground,
    /// The pipe to the parent, and the daemon's runtime log file when there is no syslog.
    Pipe(File, Option<RuntimeLog>),
}

impl Ready {
    /// From the live mount on, the daemon logs to `log` (no syslog); the parent says so.
    pub fn log_to(self, log: RuntimeLog) -> Ready {
        match self {
            Ready::Pipe(f, _) => Ready::Pipe(f, Some(log)),
            other => other,
        }
    }

    /// Tells whoever waits for the mount how it went, after the warnings about the model
    /// (one line each). In the foreground the warnings go to the log (stderr) and a failure
    /// is returned to the caller, which prints it.
    pub fn report(self, result: &Result<()>, warnings: &[String]) {
        match self {
            Ready::Foreground => {
                for w in warnings {
                    log::warn!("{w}");
                }
            }
            Ready::Pipe(mut f, log) => {
                let mut msg = String::new();
                for w in warnings {
                    msg.push_str("warn:");
                    msg.push_str(&w.replace('\n', " "));
                    msg.push('\n');
                }
                match result {
                    Ok(()) => {
                        if let Some(log) = log {
                            msg.push_str(&format!("log:{}\n", log.path.display()));
                            logging::live(log);
                        }
                        msg.push_str("ok")
                    }
                    Err(e) => msg.push_str(&format!("error:{}", e.message().replace('\n', " "))),
                }
                let _ = f.write_all(msg.as_bytes());
            }
        }
    }
}

/// Which side of the fork this process is.
pub enum Side {
    /// The parent: the mount is live (`Ok`) or failed with the child's message.
    Parent(Result<()>),
    /// The child: it must serve, then report through the pipe.
    Child(Ready),
}

/// Forks. Call before any thread is started, so the child is a faithful copy.
pub fn fork() -> Result<Side> {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::io("pipe", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned here alone.
    let (read_end, write_end) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: no thread has been started yet, so the child is a faithful copy.
    match unsafe { libc::fork() } {
        -1 => Err(Error::io("fork", std::io::Error::last_os_error())),
        0 => {
            drop(read_end);
            logging::forked();
            Ok(Side::Child(Ready::Pipe(write_end, None)))
        }
        _child => {
            drop(write_end);
            let mut all = String::new();
            let mut read_end = read_end;
            let _ = read_end.read_to_string(&mut all);
            let mut msg = "";
            for line in all.lines() {
                if let Some(w) = line.strip_prefix("warn:") {
                    eprintln!("ptefs: warning: {w}");
                } else if let Some(path) = line.strip_prefix("log:") {
                    eprintln!(
                        "ptefs: no syslog listens at /dev/log: the daemon logs its errors to {path}"
                    );
                } else {
                    msg = line;
                }
            }
            Ok(Side::Parent(if msg == "ok" {
                Ok(())
            } else if let Some(e) = msg.strip_prefix("error:") {
                Err(Error::new(libc::EIO, e))
            } else {
                Err(Error::new(
                    libc::EIO,
                    "the daemon exited before the mount was live (see the log)",
                ))
            }))
        }
    }
}

/// Leaves the terminal: a new session, `/` as working directory, stdio on /dev/null.
pub fn detach() {
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
