//! Serving a mount: the FUSE session with its worker threads, the threads that send cache
//! invalidations, a thread that watches the model files' owner and mode (and frees memory
//! kept for writes that did not come), and a thread that turns SIGINT/SIGTERM/SIGHUP into
//! "commit, then unmount".
//! When open files keep the mount busy after a signal, it is detached, and the daemon ends
//! once the kernel lets go of it or after a grace period.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, Session};

use super::background::Ready;
use crate::error::{Error, Result};
use crate::fs::{Fs, Options, SizeLimits};
use crate::fuse::FuseFs;
use crate::host::claims::{Claims, FileClaim, MountLock};
use crate::host::mounts::{find_mount, unmount_path};
use crate::tree::Tree;

/// What the mount's block-device info gets as readahead, so the kernel sends 1 MiB reads.
const READ_AHEAD_KB: &str = "1024";

/// How long a detached, still-busy mount is served after a signal.
const GRACE: Duration = Duration::from_secs(5);

enum Event {
    /// The session ended (the mount is gone).
    Ended(std::io::Result<()>),
    /// A signal asked for an unmount, which is done or detached.
    Unmounting,
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

/// Waits for a signal, then commits what is staged and unmounts (or detaches a busy mount).
fn on_signals(fs: Arc<Fs>, mountpoint: PathBuf, events: mpsc::Sender<Event>) {
    let set = signal_set();
    let mut sig = 0;
    // SAFETY: waits on a valid set that every thread blocks.
    unsafe { libc::sigwait(&set, &mut sig) };
    log::info!("signal {sig}: committing pending writes and unmounting");
    fs.commit_all();
    if let Err(e) = unmount_path(&mountpoint, false) {
        log::info!("unmount: {e}; detaching the busy mount");
        if let Err(e) = unmount_path(&mountpoint, true) {
            log::error!("cannot unmount {}: {e}", mountpoint.display());
        }
    }
    let _ = events.send(Event::Unmounting);
}

/// How often the model files' owner and mode are checked for changes, and idle memory freed.
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// What `check` warns about the model, being computed while the mount starts.
pub type Warnings = std::thread::JoinHandle<Vec<String>>;

fn finished(warnings: Warnings) -> Vec<String> {
    warnings
        .join()
        .unwrap_or_else(|_| vec!["the model's check stopped with an internal error".into()])
}

/// How a mount serves its tree: read-only or not, and the sizes writes may take.
#[derive(Debug, Clone)]
pub struct Settings {
    pub read_only: bool,
    pub limits: SizeLimits,
    /// The name map file of `--names MAP`, replaced after each write by name.
    pub names_file: Option<std::path::PathBuf>,
}

/// Mounts `tree` on `mountpoint`, reports through `ready` once the mount is live, with
/// `warnings`, and serves until it is unmounted.
pub fn serve(
    tree: Tree, settings: Settings, config: &Config, mountpoint: &Path, ready: Ready,
    warnings: Warnings, claims: Vec<FileClaim>,
) -> Result<()> {
    let Settings {
        read_only,
        limits,
        names_file,
    } = settings;
    // Signals go to the signal thread only: block them before any thread starts.
    let set = signal_set();
    // SAFETY: changes this thread's mask; threads started later inherit it.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };

    let (notices, queues) = crate::fuse::notices();
    let claims = Arc::new(Claims::new(claims));
    let fs = Arc::new(
        Fs::with_invalidator(tree, Options { read_only }, Arc::new(notices))
            .with_size_limits(limits)
            .with_names_file(names_file)
            .watched_by(claims.clone())
            .with_errors_file(),
    );
    let started = Session::new(FuseFs::new(fs.clone()), mountpoint, config)
        .map_err(|e| Error::io(format!("cannot mount on {}", mountpoint.display()), e))
        .and_then(|session| {
            queues
                .spawn(session.notifier(), session.notifier())
                .map_err(|e| Error::io("cannot start a thread", e))?;
            Ok(session)
        });
    let session = match started {
        Ok(s) => s,
        Err(e) => {
            log::error!("{e}");
            // Released before the report: the next mount may start as soon as it is read.
            claims.release();
            let failed = Err(e);
            ready.report(&failed, &finished(warnings));
            return failed;
        }
    };
    let lock = match find_mount(mountpoint) {
        Some(entry) => {
            raise_readahead(&entry.dev);
            MountLock::take(&entry.dev, mountpoint, &fs.tree().model.files[0].path)
        }
        None => {
            log::warn!("{} is not in the mount table", mountpoint.display());
            None
        }
    };
    let paths = fs.tree().model.paths();
    super::watch::start(&fs, &paths.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    let (events, events_rx) = mpsc::channel();
    {
        let (fs, mp, events) = (fs.clone(), mountpoint.to_path_buf(), events.clone());
        std::thread::Builder::new()
            .name("ptefs-signals".into())
            .spawn(move || on_signals(fs, mp, events))
            .map_err(|e| Error::io("cannot start a thread", e))?;
    }
    {
        // A chmod or chown of a model file shows in the mount within a second, also to
        // users whose kernel caches would otherwise keep the old owner and mode; memory
        // kept for the next write is freed once no write came for a while.
        let fs = Arc::downgrade(&fs);
        std::thread::Builder::new()
            .name("ptefs-upkeep".into())
            .spawn(move || {
                while let Some(fs) = fs.upgrade() {
                    fs.refresh_identity();
                    fs.free_idle_memory();
                    drop(fs);
                    std::thread::sleep(UPKEEP_EVERY);
                }
            })
            .map_err(|e| Error::io("cannot start a thread", e))?;
    }
    let background = session
        .spawn()
        .map_err(|e| Error::io("cannot start the FUSE session", e))?;
    std::thread::Builder::new()
        .name("ptefs-session".into())
        .spawn(move || {
            let _ = events.send(Event::Ended(background.join()));
        })
        .map_err(|e| Error::io("cannot start a thread", e))?;
    log::info!(
        "mounted {} on {}{}",
        fs.tree().model.files[0].path.display(),
        mountpoint.display(),
        if read_only { " (read-only)" } else { "" }
    );
    ready.report(&Ok(()), &finished(warnings));

    let ended = match events_rx.recv() {
        Ok(Event::Ended(r)) => r,
        Ok(Event::Unmounting) => match events_rx.recv_timeout(GRACE) {
            Ok(Event::Ended(r)) => r,
            Ok(Event::Unmounting) | Err(RecvTimeoutError::Timeout) => {
                fs.commit_all();
                log::warn!("the mount is still in use {GRACE:?} after the signal: exiting");
                Ok(())
            }
            Err(RecvTimeoutError::Disconnected) => Ok(()),
        },
        Err(_) => Ok(()),
    };
    // Blocks of a remote model fetched last reach the cache before the daemon exits.
    crate::source::remote::flush();
    // The files are free again before `ptefs umount`, which waits on the lock, returns.
    claims.release();
    drop(lock);
    match ended {
        Ok(()) => {
            log::info!("unmounted {}", mountpoint.display());
            Ok(())
        }
        // The kernel ends the connection of a detached (lazily unmounted) mount this way when
        // its last user lets go, as it ends a plain unmount with ENODEV, which the session
        // takes as its end.
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            log::info!(
                "unmounted {} (the kernel ended the connection)",
                mountpoint.display()
            );
            Ok(())
        }
        Err(e) => Err(Error::io("the FUSE session failed", e)),
    }
}
