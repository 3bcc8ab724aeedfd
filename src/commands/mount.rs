//! `ptefs mount`: everything that can be checked is checked while the terminal is still
//! ours (the file, the mountpoint, that this user can use `/dev/fuse`, that no ptefs mount
//! is there and that no daemon mounts the file already), interrupted commits are finished,
//! then, unless in the foreground, the daemon forks (`crate::daemon`): the child detaches,
//! parses the model, mounts and serves; the parent prints the warnings about the model and
//! where the daemon logs when there is no syslog, and returns once the mount is live or
//! failed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::daemon::background::{self, Ready, Side};
use crate::daemon::{logging, options, serve};
use crate::edit::recovery;
use crate::error::{Error, Result};
use crate::format::model::remote_name;
use crate::format::Model;
use crate::fs::SizeLimits;
use crate::host::{canonical_files, claims, mounts};
use crate::tree::{Tree, DEFAULT_MAX_NODES};

/// What `ptefs mount` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct MountRequest {
    pub file: PathBuf,
    pub mountpoint: PathBuf,
    /// `.ptd` files to attach.
    pub data: Vec<PathBuf>,
    pub read_only: bool,
    /// Stay attached and log to stderr.
    pub foreground: bool,
    /// `-o` lists, each comma-separated.
    pub options: Vec<String>,
    /// `-v` count.
    pub verbose: u8,
    /// In the background, log here instead of syslog.
    pub log_file: Option<PathBuf>,
    /// Refuse files whose tree would have more nodes (`--max-nodes`); `None`: `-o max_nodes=`
    /// if given, else `DEFAULT_MAX_NODES`.
    pub max_nodes: Option<u64>,
    /// The largest size a blob, a delegate payload or a scratch file may be given
    /// (`--max-file-size`); `None`: `-o max_file_size=` if given, else what the file
    /// system's free space allows.
    pub max_file_size: Option<u64>,
    /// `--names MAP|CHECKPOINT`: the named views (docs/tree.md#named-views).
    pub names: Option<PathBuf>,
}

/// What is in the way of a mount on `path`: a FUSE mount whose daemon has exited.
fn dead_mount(path: &Path) -> Error {
    let p = path.display();
    Error::new(
        libc::ENOTCONN,
        format!("{p}: a FUSE mount whose daemon has exited is there: unmount it first (`ptefs umount {p}` if ptefs made it, else `fusermount3 -u {p}`)"),
    )
}

fn mountpoint_dir(path: &Path) -> Result<PathBuf> {
    let canonical = |p: &Path| p.canonicalize().map_err(|e| Error::io(p.display(), e));
    let meta = std::fs::metadata(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            dead_mount(path)
        } else {
            Error::io(path.display(), e)
        }
    })?;
    if !meta.is_dir() {
        return Err(Error::new(
            libc::ENOTDIR,
            format!("{}: the mountpoint is not a directory", path.display()),
        ));
    }
    canonical(path)
}

/// Whether this process may open `/dev/fuse` for reading and writing (as its effective
/// user, as the open will be).
fn may_open(path: &std::ffi::CStr) -> bool {
    // SAFETY: a valid C string.
    unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::R_OK | libc::W_OK,
            libc::AT_EACCESS,
        ) == 0
    }
}

/// The name of group `gid`, if it has one.
fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: zeroed memory is a valid group struct.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut found = std::ptr::null_mut();
    // SAFETY: valid buffers whose sizes are passed; `found` points into them on success.
    let r = unsafe { libc::getgrgid_r(gid, &mut group, buf.as_mut_ptr(), buf.len(), &mut found) };
    if r != 0 || found.is_null() {
        return None;
    }
    // SAFETY: on success `gr_name` is a C string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(group.gr_name) };
    Some(name.to_string_lossy().into_owned())
}

/// Whether `tool` is an executable file in `PATH`.
fn in_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            std::fs::metadata(d.join(tool)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
    })
}

/// Checks that this user can mount FUSE file systems, saying what is missing and how to get
/// it: the device, access to it, and (for a user other than root) the setuid helper.
fn fuse_usable() -> Result<()> {
    let dev = c"/dev/fuse";
    let meta = match std::fs::metadata("/dev/fuse") {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::new(
                libc::ENODEV,
                "/dev/fuse is missing: load the fuse module (`modprobe fuse`), or in a container pass the device in (`docker run --device /dev/fuse --cap-add SYS_ADMIN`)",
            ));
        }
        Err(e) => return Err(Error::io("/dev/fuse", e)),
    };
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return Ok(());
    }
    if !may_open(dev) {
        let group = group_name(meta.gid()).unwrap_or_else(|| meta.gid().to_string());
        let fix = if meta.gid() != 0 && meta.mode() & 0o060 == 0o060 {
            format!(
                "add this user to group {group} (`usermod -aG {group} USER`, then log in again)"
            )
        } else {
            "let every user open it (`chmod 0666 /dev/fuse`, the mode Debian's udev rule gives it; fusermount3 still decides who may mount where)".to_string()
        };
        return Err(Error::new(
            libc::EACCES,
            format!(
                "/dev/fuse is not accessible to this user (uid {uid}; it has mode {:o}, owner uid {}, group {group}): mount as root, or {fix}",
                meta.mode() & 0o7777,
                meta.uid(),
            ),
        ));
    }
    if std::env::var_os("FUSERMOUNT_PATH").is_none()
        && !in_path("fusermount3")
        && !in_path("fusermount")
    {
        return Err(Error::new(
            libc::ENOENT,
            "a user other than root mounts through the setuid helper fusermount3, which is not installed: `apt-get install fuse3` (or mount as root)",
        ));
    }
    Ok(())
}

/// Refuses a mountpoint where ptefs already mounts something: the new mount would hide it.
/// A mount is ptefs's when its name says so or a ptefs daemon of this user recorded it; one
/// whose daemon has exited is named as such.
fn refuse_mount_over(mountpoint: &Path) -> Result<()> {
    let Some(entry) = mounts::find_mount(mountpoint) else {
        return Ok(());
    };
    let record = claims::mount_record(&entry.dev);
    if !entry.is_ptefs() && record.is_none() {
        return Ok(());
    }
    let record = record.filter(|r| r.held);
    if record.is_none() && mounts::daemon_gone(mountpoint) {
        return Err(dead_mount(mountpoint));
    }
    let pid = record
        .as_ref()
        .and_then(|r| r.pid)
        .map(|p| format!(", ptefs pid {p}"))
        .unwrap_or_default();
    let of = record
        .and_then(|r| r.model)
        .map(|m| m.display().to_string())
        .unwrap_or_else(|| entry.source.trim_start_matches("ptefs:").to_string());
    Err(Error::new(
        libc::EBUSY,
        format!(
            "{} is already a ptefs mount (of {of}{pid}); unmount it first",
            mountpoint.display()
        ),
    ))
}

/// At most this many defects are printed at mount; `ptefs check` lists them all.
const WARNINGS_SHOWN: usize = 10;

/// What the mount says about a model the runtime would refuse or fail on: the defects
/// `ptefs check` reports (the first `WARNINGS_SHOWN`), then the `.ptd` files beside the
/// model that hold keys it lacks.
fn warnings(tree: &Tree) -> serve::Warnings {
    let catalog = tree.catalog.clone();
    // Checked on another thread while the mount starts: the checks walk every value. The
    // payloads the tree decoded are checked as they are, not decoded again.
    std::thread::spawn(move || {
        let model = &*catalog.model;
        let mut defects = crate::check::defects_with(model, &catalog.payloads);
        if defects.len() > WARNINGS_SHOWN {
            let more = defects.len() - WARNINGS_SHOWN;
            defects.truncate(WARNINGS_SHOWN);
            defects.push(format!("… and {more} more: `ptefs check` lists them all"));
        }
        defects.extend(crate::check::data_beside_with(model, &catalog.payloads));
        defects
    })
}

/// The first of `files` that is a remote object (shown without its secrets), after
/// checking that each remote one is a URL ptefs can read.
fn remote_files<'a>(files: impl Iterator<Item = &'a PathBuf>) -> Result<Option<String>> {
    let mut first = None;
    for f in files {
        if let Some(url) = remote_name(f) {
            let address = crate::source::remote::Address::parse(url).map_err(|e| {
                Error::invalid(format!("{}: {e}", crate::source::remote::shown(url)))
            })?;
            first.get_or_insert(address.shown);
        }
    }
    Ok(first)
}

/// Parses the model and its data files and builds the tree that the mount shows, with the
/// named views of `names` (a map checked against the files, or a checkpoint learned from,
/// its report logged), unless it would have more than `max_nodes` nodes.
fn open_tree(
    file: &Path, data: &[PathBuf], read_only: bool, max_nodes: u64, names: Option<&Path>,
) -> Result<Tree> {
    let model = if read_only {
        Model::open(file, data)?
    } else {
        Model::open_writable(file, data)?
    };
    Tree::build_with(Arc::new(model), max_nodes, |catalog| {
        names
            .map(|p| {
                crate::names::given::map_for(p, catalog, &mut |line| log::info!("names: {line}"))
            })
            .transpose()
    })
}

/// ptefs's own `-o` options.
#[derive(Debug, Default, PartialEq, Eq)]
struct OwnOptions {
    max_nodes: Option<u64>,
    max_file_size: Option<u64>,
}

/// A size in bytes, with an optional suffix K, M, G or T (powers of 1024).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(format!(
                        "{s:?}: expected bytes, or a number with K, M, G or T"
                    ))
                }
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("{s:?}: expected bytes, or a number with K, M, G or T ({e})"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?}: more bytes than 64 bits hold"))
}

/// Takes ptefs's own `-o` options (`max_nodes=N`, `max_file_size=SIZE`) out of the list
/// given to FUSE.
fn own_options(options: &[String]) -> Result<(Vec<String>, OwnOptions)> {
    let mut own = OwnOptions::default();
    let mut rest = Vec::new();
    for opt in options.iter().flat_map(|o| o.split(',')) {
        let opt = opt.trim();
        if let Some(n) = opt.strip_prefix("max_nodes=") {
            own.max_nodes = Some(n.parse::<u64>().map_err(|e| {
                Error::invalid(format!(
                    "-o max_nodes={n}: expected a number of nodes ({e})"
                ))
            })?);
        } else if let Some(n) = opt.strip_prefix("max_file_size=") {
            own.max_file_size =
                Some(parse_size(n).map_err(|e| Error::invalid(format!("-o max_file_size: {e}")))?);
        } else {
            rest.push(opt.to_string());
        }
    }
    Ok((rest, own))
}

/// `ptefs mount`: returns once the mount is live (in the background) or once it is
/// unmounted (in the foreground). In the background this returns in both processes: the
/// parent with the mount's outcome, the daemon after its session ended.
pub fn mount(req: &MountRequest) -> Result<()> {
    let log_target = match (&req.log_file, req.foreground) {
        (_, true) => logging::LogTarget::Stderr,
        (Some(path), false) => logging::LogTarget::File(path),
        (None, false) if logging::syslog_listens() => logging::LogTarget::Syslog,
        (None, false) => logging::LogTarget::Fallback,
    };
    let runtime_log = matches!(log_target, logging::LogTarget::Fallback);
    logging::init(req.verbose, log_target)?;
    // Everything that can be checked is checked while the terminal is still ours.
    let (file, data) = canonical_files(&req.file, &req.data)?;
    // A remote object's URL is checked here; the object itself is first asked for by the
    // daemon (the network runtime cannot cross the fork).
    let remote = remote_files(std::iter::once(&file).chain(&data))?;
    let mountpoint = mountpoint_dir(&req.mountpoint)?;
    // Absolute, as given: the daemon leaves the directory it was started in, and a map
    // file it replaces later is replaced where it was named, never through a link.
    let names = req
        .names
        .as_ref()
        .map(|p| {
            std::path::absolute(p).map_err(|e| Error::io(format!("--names {}", p.display()), e))
        })
        .transpose()?;
    fuse_usable()?;
    refuse_mount_over(&mountpoint)?;
    // Each local file is mounted once; the claims are held for the daemon's whole life. A
    // remote object is claimed by nobody: ptefs never writes to one.
    let local = || {
        std::iter::once(&file)
            .chain(&data)
            .filter(|p| remote_name(p).is_none())
    };
    let mut claims = local()
        .map(|p| claims::claim_file(p, claims::Holder::Mount(&mountpoint)))
        .collect::<Result<Vec<_>>>()?;
    for p in local() {
        mounts::refuse_if_mounted(p)?;
    }
    let (fuse_options, own) = own_options(&req.options)?;
    let max_nodes = req.max_nodes.or(own.max_nodes).unwrap_or(DEFAULT_MAX_NODES);
    if let Some(url) = &remote {
        log::info!("{url}: a remote model is mounted read-only (writes fail with EROFS)");
    }
    let shown = match &remote {
        Some(_) => PathBuf::from(crate::source::remote::shown(&file.to_string_lossy())),
        None => file.clone(),
    };
    let (config, read_only) = options::fuse_config(
        &fuse_options,
        req.read_only || remote.is_some(),
        &shown,
        remote.is_some(),
    );
    let settings = serve::Settings {
        read_only,
        limits: SizeLimits {
            max_file_size: req.max_file_size.or(own.max_file_size),
            ..SizeLimits::default()
        },
        names_file: names
            .as_deref()
            .filter(|p| crate::names::given::is_map(p))
            .map(Path::to_path_buf),
    };
    let local_paths: Vec<&Path> = local().map(PathBuf::as_path).collect();
    let members = match crate::commands::claim_commit_members(
        &local_paths,
        claims::Holder::Mount(&mountpoint),
    ) {
        Ok(m) => Some(m),
        Err(e) if read_only => {
            // Nothing is recovered: another file of the commit is busy.
            log::warn!("{e}: interrupted commits are left for a later mount or ptefs recover");
            None
        }
        Err(e) => return Err(e),
    };
    for p in local().filter(|_| members.is_some()) {
        // Printed, unless the log itself goes to the terminal (foreground, or no syslog).
        if let Err(e) = recovery::recover(p, !req.foreground && !runtime_log) {
            if !read_only {
                return Err(e);
            }
            // A warning at least: the mount goes on without finishing the commit.
            log::log!(e.level().min(log::Level::Warn), "{e}");
        }
    }
    // The other files of a commit were claimed for its recovery only.
    drop(members);
    if req.foreground {
        let tree = open_tree(&file, &data, read_only, max_nodes, names.as_deref())?;
        let warnings = warnings(&tree);
        return serve::serve(
            tree,
            settings,
            &config,
            &mountpoint,
            Ready::Foreground,
            warnings,
            claims,
        );
    }
    match background::fork()? {
        Side::Parent(outcome) => {
            // The daemon holds the claims now (the locks belong to the descriptors it
            // inherited); they are its to release.
            std::mem::forget(claims);
            outcome
        }
        Side::Child(ready) => {
            // From here on, what this process prints goes nowhere: the parent prints what
            // the child reports.
            background::detach();
            for c in &mut claims {
                c.record_daemon();
            }
            let ready = if runtime_log {
                // SAFETY: getpid cannot fail.
                let pid = unsafe { libc::getpid() };
                match logging::RuntimeLog::for_daemon(pid, &file, &mountpoint) {
                    Ok(log) => ready.log_to(log),
                    Err(e) => {
                        drop(claims);
                        let failed = Err(e.context(
                            "no syslog listens at /dev/log (use --log-file or --foreground)",
                        ));
                        ready.report(&failed, &[]);
                        return failed;
                    }
                }
            } else {
                ready
            };
            let tree = match open_tree(&file, &data, read_only, max_nodes, names.as_deref()) {
                Ok(t) => t,
                Err(e) => {
                    // Released before the report: the next mount may start as soon as the
                    // parent has read it.
                    drop(claims);
                    let failed = Err(e);
                    ready.report(&failed, &[]);
                    return failed;
                }
            };
            let warnings = warnings(&tree);
            serve::serve(
                tree,
                settings,
                &config,
                &mountpoint,
                ready,
                warnings,
                claims,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_suffixes_and_refuse_what_they_cannot_hold() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4 << 10));
        assert_eq!(parse_size("16g"), Ok(16 << 30));
        assert_eq!(parse_size(" 2T "), Ok(2 << 40));
        for bad in ["", "K", "1.5G", "-1", "12X", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn own_options_leave_the_fuse_ones() {
        let (rest, own) = own_options(&[
            "allow_other,max_file_size=1M".to_string(),
            "max_nodes=10,noexec".to_string(),
        ])
        .unwrap();
        assert_eq!(rest, ["allow_other", "noexec"]);
        assert_eq!(
            own,
            OwnOptions {
                max_nodes: Some(10),
                max_file_size: Some(1 << 20),
            }
        );
        let e = own_options(&["max_file_size=lots".to_string()]).unwrap_err();
        assert!(e.to_string().contains("-o max_file_size"), "{e}");
    }
}
