//! A sample of the corpus mounted for real through the `ptefs` binary.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cases::corpus;
use crate::common;
use ptefs::format::Model;
use ptefs::format::ModelFile;

/// Whether the core opens these files rather than refusing them.
fn core_opens(files: &[(PathBuf, Vec<u8>)]) -> bool {
    let parsed: Option<Vec<ModelFile>> = files
        .iter()
        .map(|(p, b)| ModelFile::from_bytes(p, b.clone()).ok())
        .collect();
    parsed.is_some_and(|p| Model::from_files(p).is_ok())
}

/// Runs `cmd` with stdout and stderr in files (a pipe left open by a forked daemon would
/// block `output()`), killing it after `limit`. The exit status (`None` on timeout) and
/// stderr.
fn run_bounded(
    cmd: &mut Command, dir: &Path, limit: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let err_path = dir.join("stderr");
    let err = std::fs::File::create(&err_path).unwrap();
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (
        status,
        std::fs::read_to_string(&err_path).unwrap_or_default(),
    )
}

/// A live mount, unmounted when dropped.
struct MountGuard {
    mnt: PathBuf,
    live: bool,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.live {
            common::unmount(&self.mnt);
        }
    }
}

/// Ends a daemon that stopped answering: kills the `ptefs mount` process serving `mnt` (the
/// mount point is a fresh temp dir, so only this test's daemon names it) and aborts the FUSE
/// connection of device `dev`, so that a thread blocked on it gets an error instead of
/// waiting forever.
fn end_hung_daemon(mnt: &Path, dev: u64) {
    use std::os::unix::ffi::OsStrExt;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.get(1) == Some(&&b"mount"[..]) && args.contains(&mnt.as_os_str().as_bytes()) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let minor = libc::minor(dev);
    let _ = std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
}

/// The value of a `listxattr`/`getxattr`-style call `f(buffer, size)`: asks for the size,
/// then for the bytes.
fn xattr_value(f: impl Fn(*mut libc::c_char, usize) -> isize) -> std::io::Result<Vec<u8>> {
    let size = f(std::ptr::null_mut(), 0);
    if size < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; size as usize];
    let got = f(buf.as_mut_ptr().cast(), buf.len());
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(got as usize);
    Ok(buf)
}

/// Walks a mounted tree through the kernel: readdir, lstat, a whole read of every file, and
/// every extended attribute. EIO on a read or an attribute is a defect reported properly;
/// anything else wrong is returned. Finally the mount point itself must still answer.
fn walk_mounted(mnt: &Path) -> Result<usize, Vec<String>> {
    use std::os::unix::ffi::OsStrExt;
    let mut problems = Vec::new();
    let mut entries = 0;
    let mut stack = vec![mnt.to_path_buf()];
    let eio = |e: &std::io::Error| e.raw_os_error() == Some(libc::EIO);
    let mut paths = vec![mnt.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                problems.push(format!("readdir {}: {e}", dir.display()));
                continue;
            }
        };
        for e in rd {
            let e = match e {
                Ok(e) => e,
                Err(e) => {
                    problems.push(format!("readdir {}: {e}", dir.display()));
                    break;
                }
            };
            entries += 1;
            let path = e.path();
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    problems.push(format!("lstat {}: {e}", path.display()));
                    continue;
                }
            };
            paths.push(path.clone());
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            // Not std::fs::read, which reserves the size first: a float32 view whose dims a
            // corrupted payload made absurd is terabytes long, and its reads fail with EIO.
            let mut read = Vec::new();
            let got = std::fs::File::open(&path)
                .and_then(|f| {
                    std::io::Read::read_to_end(&mut std::io::Read::take(f, meta.len()), &mut read)
                })
                .map(|_| read);
            match got {
                Ok(b) if b.len() as u64 != meta.len() => problems.push(format!(
                    "read {}: {} bytes, but its size is {}",
                    path.display(),
                    b.len(),
                    meta.len()
                )),
                Ok(_) => {}
                Err(e) if eio(&e) => {}
                Err(e) => problems.push(format!("read {}: {e}", path.display())),
            }
        }
    }
    for path in &paths {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let names = match xattr_value(|buf, len| unsafe { libc::llistxattr(c.as_ptr(), buf, len) })
        {
            Ok(n) => n,
            Err(e) => {
                problems.push(format!("listxattr {}: {e}", path.display()));
                continue;
            }
        };
        for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let n = std::ffi::CString::new(name).unwrap();
            match xattr_value(|buf, len| unsafe {
                libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.cast(), len)
            }) {
                Ok(_) => {}
                Err(e) if eio(&e) => {}
                Err(e) => problems.push(format!(
                    "getxattr {} {}: {e}",
                    path.display(),
                    String::from_utf8_lossy(name)
                )),
            }
        }
    }
    if let Err(e) = std::fs::metadata(mnt) {
        problems.push(format!("the mount point no longer answers: {e}"));
    }
    if problems.is_empty() {
        Ok(entries)
    } else {
        Err(problems)
    }
}

/// A sample of the corpus mounted for real (read-only): the mount is refused with a
/// message, or it serves the whole tree through the kernel (EIO for what is broken), stays
/// alive, and unmounts.
#[test]
fn corrupted_files_mount_or_are_refused() {
    if common::fuse_missing() {
        return;
    }
    let start = Instant::now();
    let exe = env!("CARGO_BIN_EXE_ptefs");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let cases = corpus();
    // Most of the corpus is refused on parsing: the sample is spread over the cases the core
    // opens (28 of them) and over those it refuses (10), so that most of it gets mounted.
    let opens: Vec<bool> = cases
        .iter()
        .map(|c| catch_unwind(AssertUnwindSafe(|| core_opens(&c.files))).unwrap_or(false))
        .collect();
    let n_open = opens.iter().filter(|&&o| o).count();
    let steps = [((cases.len() - n_open) / 10).max(1), (n_open / 28).max(1)];
    let mut seen = [0, 0];
    let sample = (0..cases.len()).filter(|&n| {
        let k = opens[n] as usize;
        seen[k] += 1;
        seen[k] % steps[k] == steps[k] / 2
    });
    let verbose = std::env::var_os("PTEFS_CORRUPT_VERBOSE").is_some();
    let mut failures = Vec::new();
    let (mut mounted, mut refused) = (0, 0);
    for n in sample {
        let case = &cases[n];
        let case_dir = root.join(n.to_string());
        std::fs::create_dir(&case_dir).unwrap();
        let paths = case.write_to(&case_dir, "");
        let mnt = case_dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mut cmd = Command::new(exe);
        cmd.arg("mount").arg(&paths[0]).arg(&mnt).arg("--read-only");
        for d in &paths[1..] {
            cmd.arg("--data").arg(d);
        }
        let (status, stderr) = run_bounded(&mut cmd, &case_dir, Duration::from_secs(20));
        let mut guard = MountGuard {
            mnt: mnt.clone(),
            live: common::mounted_as_ptefs(&mnt),
        };
        match status {
            None => {
                failures.push(format!("{}: ptefs mount did not return in 20 s", case.name));
                continue;
            }
            Some(s) if !s.success() => {
                refused += 1;
                if verbose {
                    eprintln!("{}: refused: {}", case.name, stderr.trim());
                }
                if s.code() != Some(1) || stderr.trim().is_empty() {
                    failures.push(format!(
                        "{}: ptefs mount failed ({s}) with stderr {stderr:?}",
                        case.name
                    ));
                }
                if guard.live {
                    failures.push(format!("{}: ptefs mount failed, yet mounted", case.name));
                }
                if opens[n] {
                    failures.push(format!(
                        "{}: the core opens it, but ptefs mount refused: {stderr}",
                        case.name
                    ));
                }
                continue;
            }
            Some(_) => {}
        }
        mounted += 1;
        if !opens[n] {
            failures.push(format!(
                "{}: the core refuses it, but ptefs mount accepted it",
                case.name
            ));
        }
        if !guard.live {
            failures.push(format!(
                "{}: ptefs mount returned 0, but no fuse.ptefs mount is listed",
                case.name
            ));
            continue;
        }
        let dev = match std::fs::metadata(&mnt) {
            Ok(m) => std::os::unix::fs::MetadataExt::dev(&m),
            Err(e) => {
                failures.push(format!("{}: stat of the new mount: {e}", case.name));
                continue;
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let walked = mnt.clone();
        std::thread::spawn(move || {
            let _ = tx.send(walk_mounted(&walked));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(entries)) => {
                if verbose {
                    eprintln!("{}: mounted, {entries} entries walked", case.name);
                }
            }
            Ok(Err(problems)) => {
                failures.push(format!("{}: {}", case.name, problems.join("; ")));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                failures.push(format!("{}: walking the mount panicked", case.name));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                failures.push(format!(
                    "{}: walking the mount did not finish in 20 s",
                    case.name
                ));
                end_hung_daemon(&mnt, dev);
                continue;
            }
        }
        if !common::mounted_as_ptefs(&mnt) {
            failures.push(format!(
                "{}: the mount went away while walking it",
                case.name
            ));
            continue;
        }
        let (status, stderr) = run_bounded(
            Command::new(exe).arg("umount").arg(&mnt),
            &case_dir,
            Duration::from_secs(20),
        );
        if status.is_some_and(|s| s.success()) {
            guard.live = common::mounted_as_ptefs(&mnt);
            if guard.live {
                failures.push(format!("{}: still mounted after ptefs umount", case.name));
            }
        } else {
            failures.push(format!(
                "{}: ptefs umount failed ({status:?}): {stderr}",
                case.name
            ));
        }
    }
    eprintln!(
        "{} cases mounted, {} refused, in {:?}",
        mounted,
        refused,
        start.elapsed()
    );
    assert!(
        mounted > 0 && refused > 0,
        "{mounted} mounted, {refused} refused"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
