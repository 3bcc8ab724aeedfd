//! A root daemon in a hostile environment, through real mounts: other local users, files
//! planted beside the model, untrusted journals, absurd sizes, a model replaced under the
//! mount, and concurrent handles on one file.
//!
//! They need root (to mount, to create a second user and to make a small tmpfs) and
//! `/dev/fuse`, as in CI.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::mount::{py_errno, run, text, Mount, BIN};
use common::{fixtures_dir, fuse_missing};

const TENSOR: &str = "plans/forward/values/0.bin";

fn linear() -> PathBuf {
    fixtures_dir().join("linear.pte")
}

fn xnnpack() -> PathBuf {
    fixtures_dir().join("linear_xnnpack.pte")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A shell command's exit status and stderr, run as `user` (uid, gid) when given.
fn sh(user: Option<(u32, u32)>, script: &str) -> (bool, String) {
    let mut cmd = match user {
        Some((uid, gid)) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg("sh");
            c
        }
        None => Command::new("sh"),
    };
    let out = run(cmd.arg("-c").arg(script));
    (out.status.success(), text(&out.stderr))
}

/// A second local user for the tests, created once.
fn other_user() -> (u32, u32) {
    static USER: OnceLock<(u32, u32)> = OnceLock::new();
    *USER.get_or_init(|| {
        const NAME: &str = "ptefs-test-other";
        let id = |flag: &str| {
            let out = run(Command::new("id").arg(flag).arg(NAME));
            out.status
                .success()
                .then(|| text(&out.stdout).trim().parse::<u32>().unwrap())
        };
        if id("-u").is_none() {
            let out = run(Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                ])
                .arg(NAME));
            assert!(
                out.status.success() || id("-u").is_some(),
                "useradd: {}",
                text(&out.stderr)
            );
        }
        (id("-u").unwrap(), id("-g").unwrap())
    })
}

/// Lets every user reach the mount's directory (temporary directories are 0700).
fn open_to_all(m: &Mount) {
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn other_users_get_no_more_than_the_model_file_allows() {
    if fuse_missing() {
        return;
    }
    let user = Some(other_user());
    let m = Mount::new(&linear(), &[], &["-o", "allow_other"]);
    open_to_all(&m);
    let before = std::fs::read(&m.model).unwrap();
    let t = m.path(TENSOR);
    let values = m.path("plans/forward/values");
    let q = |p: &Path| format!("'{}'", p.display());
    // A root-owned 0644 model: others read, and may not write, create or truncate.
    let (ok, err) = sh(user, &format!("cat {} > /dev/null", q(&t)));
    assert!(ok, "{err}");
    for script in [
        format!("printf x > {}", q(&t)),
        format!("printf x > {}/new.bin", q(&values)),
        format!("truncate -s 0 {}", q(&t)),
        format!("truncate -s 1T {}", q(&t)),
    ] {
        let (ok, err) = sh(user, &script);
        assert!(!ok, "{script}: allowed");
        assert!(err.contains("Permission denied"), "{script}: {err}");
    }
    assert_eq!(std::fs::read(&m.model).unwrap(), before);
    let meta = std::fs::metadata(&t).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o644, 0));
    drop(m);

    // A 0600 model shows nothing to others.
    let mut m = Mount::new(&linear(), &[], &["-o", "allow_other"]);
    open_to_all(&m);
    m.umount();
    std::fs::set_permissions(&m.model, std::fs::Permissions::from_mode(0o600)).unwrap();
    m.mount();
    let t = m.path(TENSOR);
    assert_eq!(std::fs::metadata(&t).unwrap().mode() & 0o777, 0o600);
    let json = m.path("plans/forward/values/0.json");
    assert_eq!(std::fs::metadata(&json).unwrap().mode() & 0o777, 0o400);
    assert_eq!(
        std::fs::metadata(m.path("plans")).unwrap().mode() & 0o777,
        0o500
    );
    for script in [
        format!("cat {} > /dev/null", q(&t)),
        format!("ls {}", q(&m.path("plans"))),
    ] {
        let (ok, err) = sh(user, &script);
        assert!(!ok, "{script}: allowed");
        assert!(err.contains("Permission denied"), "{script}: {err}");
    }
    // The owner still reads and writes.
    let (ok, err) = sh(None, &format!("cat {} > /dev/null", q(&t)));
    assert!(ok, "{err}");
}

/// The `system.posix_acl_access` value that gives `uid` no rights on a `0644` file.
fn acl_denying(uid: u32) -> String {
    let mut raw = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 0, uid),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        raw.extend_from_slice(&tag.to_le_bytes());
        raw.extend_from_slice(&perm.to_le_bytes());
        raw.extend_from_slice(&id.to_le_bytes());
    }
    format!("0x{}", hex(&raw))
}

/// Waits (at most 10 s) until `path` shows owner `uid`: the daemon checks every second.
fn shows_owner(path: &Path, uid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::metadata(path).unwrap().uid() != uid {
        assert!(
            std::time::Instant::now() < deadline,
            "{} still shows owner {} after a chown of the model",
            path.display(),
            std::fs::metadata(path).unwrap().uid()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Root's daemon opens every file it shows; each open is checked as the kernel would check
/// a direct open of the files behind the node, for the user who asks.
#[test]
fn a_user_gets_through_the_mount_what_they_get_from_the_files() {
    if fuse_missing() {
        return;
    }
    let user = other_user();
    let q = |p: &Path| format!("'{}'", p.display());
    let m = Mount::new(&linear(), &[], &["-o", "allow_other"]);
    open_to_all(&m);
    let t = m.path(TENSOR);
    let new = m.dir.path().join("new.bin");
    std::fs::write(&new, pattern(48, 9)).unwrap();
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o644)).unwrap();
    let write = format!("cat {} > {}", q(&new), q(&t));

    // The model is theirs, its directory is not: a commit would create files there.
    std::os::unix::fs::chown(&m.model, Some(user.0), Some(user.1)).unwrap();
    shows_owner(&t, user.0);
    let before = std::fs::read(&m.model).unwrap();
    let (ok, err) = sh(Some(user), &write);
    assert!(!ok && err.contains("Permission denied"), "{err}");
    assert_eq!(std::fs::read(&m.model).unwrap(), before);

    // Their directory too: they write, as they could without ptefs.
    std::os::unix::fs::chown(m.dir.path(), Some(user.0), Some(user.1)).unwrap();
    let (ok, err) = sh(Some(user), &write);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), pattern(48, 9));

    // Given back to root, and an access ACL denying them: a direct read fails, and so does
    // a read through the mount, though the mode alone would allow it.
    std::os::unix::fs::chown(&m.model, Some(0), Some(0)).unwrap();
    std::os::unix::fs::chown(m.dir.path(), Some(0), Some(0)).unwrap();
    shows_owner(&t, 0);
    let set = run(Command::new("setfattr")
        .args(["-n", "system.posix_acl_access", "-v"])
        .arg(acl_denying(user.0))
        .arg(&m.model));
    assert!(set.status.success(), "setfattr: {}", text(&set.stderr));
    let (ok, _) = sh(Some(user), &format!("cat {} > /dev/null", q(&m.model)));
    assert!(!ok, "setup: the ACL does not deny a direct read");
    let (ok, err) = sh(Some(user), &format!("cat {} > /dev/null", q(&t)));
    assert!(!ok && err.contains("Permission denied"), "{err}");

    // A directory above the model they cannot search hides it as it would without ptefs.
    run(Command::new("setfattr")
        .args(["-x", "system.posix_acl_access"])
        .arg(&m.model));
    let (ok, err) = sh(Some(user), &format!("cat {} > /dev/null", q(&t)));
    assert!(ok, "{err}");
    let mut m = m;
    m.umount();
    let models = m.dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let moved = models.join(m.model.file_name().unwrap());
    std::fs::rename(&m.model, &moved).unwrap();
    m.model = moved;
    m.mount();
    let (ok, err) = sh(Some(user), &format!("cat {} > /dev/null", q(&t)));
    assert!(ok, "{err}");
    std::fs::set_permissions(&models, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (ok, err) = sh(Some(user), &format!("cat {} > /dev/null", q(&t)));
    assert!(!ok && err.contains("Permission denied"), "{err}");
}

#[test]
fn links_planted_beside_the_model_are_never_written_through() {
    if fuse_missing() {
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("log");
    let m = Mount::new(&xnnpack(), &[], &["--log-file", log.to_str().unwrap()]);
    let victim = m.dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let before = std::fs::read(&m.model).unwrap();
    // The journal's name.
    let journal = m.dir.path().join(".linear_xnnpack.pte.ptefs-journal");
    std::os::unix::fs::symlink(&victim, &journal).unwrap();
    let seg = m.path("segments/0");
    let e = py_errno(
        "f = open(sys.argv[1], 'r+b')\nf.write(b'\\x01')\nf.close()",
        &[seg.to_str().unwrap()],
    );
    assert_eq!(e, "EEXIST");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(std::fs::read(&m.model).unwrap(), before);
    assert!(std::fs::symlink_metadata(&journal).unwrap().is_symlink());
    // Logged as an error (the default log shows no less), saying what is in the way and
    // what to do.
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let line = logged
        .lines()
        .find(|l| l.contains(".linear_xnnpack.pte.ptefs-journal"))
        .unwrap_or_else(|| panic!("not logged: {logged}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains("(a symbolic link owned by uid 0 already has this name, and ptefs never writes into a file it did not create: remove it as root if it is not from an interrupted ptefs commit)"),
        "{line}"
    );
    std::fs::remove_file(&journal).unwrap();

    // Names a re-layout's new file had in earlier versions (pid and counter), and others
    // with its prefix: the new file has no name until it is complete, then a random one,
    // so none of them is in the way or written through.
    let dev = std::fs::metadata(&m.mnt).unwrap().dev();
    let lock = format!(
        "/run/ptefs/mount-{}:{}.lock",
        libc::major(dev),
        libc::minor(dev)
    );
    // The lock records the pid, the mountpoint and the model, each ended by a NUL.
    let record = std::fs::read_to_string(&lock).unwrap();
    let pid = record.split('\0').next().unwrap().to_string();
    let planted: Vec<PathBuf> = (0..4)
        .map(|n| {
            let p = m
                .dir
                .path()
                .join(format!(".linear_xnnpack.pte.ptefs-new.{pid}.{n}"));
            std::os::unix::fs::symlink(&victim, &p).unwrap();
            p
        })
        .collect();
    let payload = m.path("plans/forward/delegates/0/processed.bin");
    let mut grown = std::fs::read(&payload).unwrap();
    grown.extend_from_slice(&[0; 100]);
    let new = m.dir.path().join("grown.bin");
    std::fs::write(&new, &grown).unwrap();
    let (ok, err) = sh(
        None,
        &format!("cp '{}' '{}'", new.display(), payload.display()),
    );
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&payload).unwrap(), grown);
    for p in &planted {
        assert!(std::fs::symlink_metadata(p).unwrap().is_symlink());
    }
    assert!(std::fs::symlink_metadata(&m.model).unwrap().is_file());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    // Nothing else with the prefix is left behind.
    let left: Vec<String> = std::fs::read_dir(m.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".ptefs-new.") && !n.contains(&format!(".{pid}.")))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A model owned by root in a directory every user may create names in (mode 1777, as a
/// shared model directory may be), and the mountpoint beside it.
fn shared_dir_model(model: &Path) -> Mount {
    let c = common::copy_files(model, &[]);
    let m = Mount::unmounted(c.dir, c.model, Vec::new(), &[]);
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    m
}

#[test]
fn another_users_names_for_new_files_block_nothing() {
    if fuse_missing() {
        return;
    }
    let user = other_user();
    let mut m = shared_dir_model(&xnnpack());
    let dir = m.dir.path().to_path_buf();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    // A file, a link and a FIFO of theirs, with the prefix of a re-layout's new files.
    let prefix = dir.join(".linear_xnnpack.pte.ptefs-new.");
    let q = |p: &Path| format!("'{}'", p.display());
    let (ok, err) = sh(
        Some(user),
        &format!(
            "printf theirs > {}0 && ln -s {} {}1 && mkfifo {}2",
            q(&prefix),
            q(&victim),
            q(&prefix),
            q(&prefix)
        ),
    );
    assert!(ok, "{err}");
    let planted: Vec<PathBuf> = (0..3)
        .map(|n| PathBuf::from(format!("{}{n}", prefix.display())))
        .collect();
    // Recovery leaves them alone, saying whose they are, and is not refused.
    let out = run(Command::new(BIN).arg("recover").arg(&m.model));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!(
            "{}0: left alone: it is a regular file owned by uid {}",
            prefix.display(),
            user.0
        )),
        "{said}"
    );
    assert!(said.contains("a FIFO owned by uid"), "{said}");
    // A mount and a resizing commit go ahead.
    m.mount();
    let payload = m.path("plans/forward/delegates/0/processed.bin");
    let mut grown = std::fs::read(&payload).unwrap();
    grown.extend_from_slice(&[7; 64]);
    std::fs::write(&payload, &grown).unwrap();
    assert_eq!(std::fs::read(&payload).unwrap(), grown);
    m.umount();
    // And `ptefs apply` (the model's own weights, applied back).
    let update = dir.join("update.safetensors");
    let out = run(Command::new(BIN)
        .arg("cat")
        .arg(&m.model)
        .arg("weights.safetensors"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(&update, &out.stdout).unwrap();
    let out = run(Command::new(BIN).arg("apply").arg(&m.model).arg(&update));
    assert!(out.status.success(), "{}", text(&out.stderr));
    for p in &planted {
        assert!(
            std::fs::symlink_metadata(p).is_ok(),
            "{} removed",
            p.display()
        );
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn another_users_file_at_the_journal_name_is_refused_with_its_owner_and_the_fix() {
    if fuse_missing() {
        return;
    }
    let user = other_user();
    let m = shared_dir_model(&linear());
    let journal = m.dir.path().join(".linear.pte.ptefs-journal");
    let before = std::fs::read(&m.model).unwrap();
    let q = format!("'{}'", journal.display());
    for (script, what) in [
        (format!("printf theirs > {q}"), "regular file"),
        (format!("ln -s /etc/passwd {q}"), "symbolic link"),
        (format!("mkfifo {q}"), "FIFO"),
    ] {
        let (ok, err) = sh(Some(user), &script);
        assert!(ok, "{err}");
        let owner = format!("owned by uid {}", user.0);
        let fix = "it was left in place (remove it as root if it is not from an interrupted ptefs commit)";
        for cmd in [
            vec![OsString::from("recover"), m.model.clone().into()],
            vec![
                OsString::from("mount"),
                m.model.clone().into(),
                m.mnt.clone().into(),
            ],
        ] {
            let out = run(Command::new(BIN).args(&cmd));
            let err = text(&out.stderr);
            assert!(!out.status.success(), "{cmd:?} with a {what}: {err}");
            assert!(!common::is_mounted(&m.mnt));
            assert!(
                err.contains(&format!("{}: not replayed", journal.display())),
                "{err}"
            );
            if what != "regular file" {
                assert!(err.contains(&format!("{what} {owner}")), "{what}: {err}");
            } else {
                assert!(
                    err.contains(&format!("it belongs to uid {}", user.0)),
                    "{err}"
                );
            }
            assert!(err.contains(fix), "{err}");
        }
        assert!(std::fs::symlink_metadata(&journal).is_ok());
        assert_eq!(std::fs::read(&m.model).unwrap(), before);
        std::fs::remove_file(&journal).unwrap();
    }
}

/// `ptefs <args>` run as `user` with `env` (and nothing else of this process's
/// environment but PATH).
fn ptefs_as(user: (u32, u32), env: &[(&str, &Path)], args: &[&Path]) -> std::process::Output {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={}", user.0))
        .arg(format!("--regid={}", user.1))
        .arg("--clear-groups")
        .arg(BIN)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

#[test]
fn a_runtime_directory_taken_by_another_user_is_refused_naming_it_and_never_used() {
    let user = other_user();
    let base = tempfile::tempdir().unwrap();
    let base = base.path().canonicalize().unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Their model, in a directory of theirs.
    let home = base.join("home");
    std::fs::create_dir(&home).unwrap();
    let model = home.join("m.pte");
    std::fs::copy(linear(), &model).unwrap();
    for p in [&home, &model] {
        std::os::unix::fs::chown(p, Some(user.0), Some(user.1)).unwrap();
    }
    // A temporary directory every user shares, where someone else took their lock
    // directory's name first.
    let tmp = base.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let taken = tmp.join(format!("ptefs-{}", user.0));
    std::fs::create_dir(&taken).unwrap();
    std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::chown(&taken, Some(65534), Some(65534)).unwrap();
    if Path::new(&format!("/run/user/{}", user.0)).exists() {
        eprintln!("/run/user/{} exists: the fallback is not reached", user.0);
        return;
    }
    let recover = |env: &[(&str, &Path)]| ptefs_as(user, env, &[Path::new("recover"), &model]);
    let out = recover(&[("TMPDIR", &tmp)]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}: it is a directory of uid 65534, not of this user, so it cannot hold this user's (uid {}) ptefs lock files: remove it as root, or set XDG_RUNTIME_DIR to a directory of uid {} that nobody else may write",
            taken.display(),
            user.0,
            user.0
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&taken).unwrap().count(), 0);
    // A link there is not followed either.
    std::fs::remove_dir(&taken).unwrap();
    let elsewhere = base.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::chown(&elsewhere, Some(user.0), Some(user.1)).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &taken).unwrap();
    let out = recover(&[("TMPDIR", &tmp)]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        err.contains(&format!(
            "{}: it is a symbolic link owned by uid 0, not a directory",
            taken.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // With a runtime directory of their own, nothing in the shared one matters.
    let run_dir = base.join("run");
    std::fs::create_dir(&run_dir).unwrap();
    std::os::unix::fs::chown(&run_dir, Some(user.0), Some(user.1)).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = recover(&[("TMPDIR", &tmp), ("XDG_RUNTIME_DIR", &run_dir)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("no interrupted commit"));

    // Root's commands never use the shared directory: the same name taken there blocks
    // nothing.
    let root_taken = tmp.join("ptefs-0");
    std::fs::create_dir(&root_taken).unwrap();
    std::os::unix::fs::chown(&root_taken, Some(65534), Some(65534)).unwrap();
    let out = run(Command::new(BIN)
        .arg("recover")
        .arg(&model)
        .env("TMPDIR", &tmp));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A journal (format 2) for `writes` into a file of `file_len` bytes.
fn journal(file_len: u64, writes: &[(u64, &[u8])]) -> Vec<u8> {
    let mut j = b"PTEFSJ02".to_vec();
    j.extend_from_slice(&file_len.to_le_bytes());
    j.extend_from_slice(&(writes.len() as u64).to_le_bytes());
    for (off, b) in writes {
        j.extend_from_slice(&off.to_le_bytes());
        j.extend_from_slice(&(b.len() as u64).to_le_bytes());
    }
    for (_, b) in writes {
        j.extend_from_slice(b);
    }
    let sum = crc32fast::hash(&j);
    j.extend_from_slice(&sum.to_le_bytes());
    j
}

#[test]
fn untrusted_journals_refuse_the_mount_and_stay() {
    if fuse_missing() {
        return;
    }
    let mut m = Mount::new(&linear(), &[], &[]);
    let off: u64 = std::fs::read_to_string(m.path("plans/forward/values/0.json"))
        .unwrap()
        .split("\"file_offset\": ")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    m.umount();
    let len = std::fs::metadata(&m.model).unwrap().len();
    let before = std::fs::read(&m.model).unwrap();
    let jpath = m.dir.path().join(".linear.pte.ptefs-journal");
    let refused = |why: &str| {
        let started = Instant::now();
        let out = run(&mut m.mount_command());
        assert!(!out.status.success(), "{why}: mounted");
        assert!(started.elapsed() < Duration::from_secs(20), "{why}: hung");
        let err = text(&out.stderr);
        assert!(err.contains(".linear.pte.ptefs-journal"), "{why}: {err}");
        assert!(err.contains(why), "{why}: {err}");
        assert!(std::fs::symlink_metadata(&jpath).is_ok(), "{why}: removed");
        assert_eq!(std::fs::read(&m.model).unwrap(), before, "{why}: replayed");
        std::fs::remove_file(&jpath).unwrap();
    };
    // A FIFO must not hang the mount; a link to /dev/zero must not be read.
    let c = std::ffi::CString::new(jpath.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    refused("not a regular file");
    std::os::unix::fs::symlink("/dev/zero", &jpath).unwrap();
    refused("symbolic link");
    // Written by someone else, or writable by anyone.
    std::fs::write(&jpath, journal(len, &[(off, &[1; 4])])).unwrap();
    std::os::unix::fs::chown(&jpath, Some(65534), Some(65534)).unwrap();
    refused("belongs to uid 65534");
    std::fs::write(&jpath, journal(len, &[(off, &[1; 4])])).unwrap();
    std::fs::set_permissions(&jpath, std::fs::Permissions::from_mode(0o666)).unwrap();
    refused("anyone may write");
    // Aimed at bytes no commit writes (the file's header), or longer than declared.
    std::fs::write(&jpath, journal(len, &[(0, &[0; 8])])).unwrap();
    refused("no in-place commit writes");
    let mut long = journal(len, &[(off, &[1; 4])]);
    long.extend_from_slice(&[0; 64]);
    std::fs::write(&jpath, long).unwrap();
    refused("more than");
    // A whole journal of an interrupted commit is replayed.
    std::fs::write(&jpath, journal(len, &[(off, &[7; 4])])).unwrap();
    let out = run(&mut m.mount_command());
    assert!(out.status.success(), "{}", text(&out.stderr));
    m.live = true;
    assert!(
        text(&out.stderr).contains("finished an interrupted commit"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(&std::fs::read(m.path(TENSOR)).unwrap()[..4], &[7; 4]);
    assert!(std::fs::symlink_metadata(&jpath).is_err());
}

/// Runs `f` with a small tmpfs mounted at a new directory; unmounts it after.
fn with_small_tmpfs(size: &str, f: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("small");
    std::fs::create_dir(&at).unwrap();
    let out = run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&at));
    assert!(out.status.success(), "mount tmpfs: {}", text(&out.stderr));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&at)));
    let _ = Command::new("umount").arg("-l").arg(&at).status();
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn a_journal_that_cannot_be_written_is_removed() {
    if fuse_missing() {
        return;
    }
    with_small_tmpfs("64k", |small| {
        let model = small.join("linear.pte");
        std::fs::copy(linear(), &model).unwrap();
        let mnt = small.parent().unwrap().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let out = run(Command::new(BIN).arg("mount").arg(&model).arg(&mnt));
        assert!(out.status.success(), "{}", text(&out.stderr));
        // Fill the file system.
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=4k"])
            .arg(format!("of={}", small.join("fill").display()))
            .stderr(Stdio::null())
            .status();
        let before = std::fs::read(&model).unwrap();
        let e = py_errno(
            "f = open(sys.argv[1], 'r+b')\nf.write(b'\\x01' * 48)\nf.close()",
            &[mnt.join(TENSOR).to_str().unwrap()],
        );
        assert_eq!(e, "ENOSPC");
        assert!(std::fs::symlink_metadata(small.join(".linear.pte.ptefs-journal")).is_err());
        assert_eq!(std::fs::read(&model).unwrap(), before);
        let out = run(Command::new(BIN).arg("check").arg(&model));
        assert!(out.status.success(), "{}", text(&out.stdout));
        let out = run(Command::new(BIN).arg("umount").arg(&mnt));
        assert!(out.status.success(), "{}", text(&out.stderr));
    });
}

#[test]
fn sizes_a_file_can_never_have_fail_at_the_request_and_the_daemon_lives() {
    if fuse_missing() {
        return;
    }
    // Scratch files are bounded by --max-file-size here (without it, by what one user may
    // hold: EDQUOT).
    let m = Mount::new(&linear(), &[], &["--max-file-size", "1G"]);
    let before = std::fs::read(&m.model).unwrap();
    let t = m.path(TENSOR);
    let scratch = m.path("plans/forward/values/scratch");
    for script in [
        format!("truncate -s 1T '{}'", t.display()),
        format!(
            "dd if=/dev/zero of='{}' bs=1 count=1 seek=1T conv=notrunc",
            t.display()
        ),
        format!("touch '{0}' && truncate -s 1T '{0}'", scratch.display()),
        format!(
            "dd if=/dev/zero of='{}' bs=1 count=1 seek=1T",
            scratch.display()
        ),
    ] {
        let (ok, err) = sh(None, &script);
        assert!(!ok, "{script}: accepted");
        assert!(err.contains("File too large"), "{script}: {err}");
    }
    assert_eq!(std::fs::read(&m.model).unwrap(), before);
    assert_eq!(std::fs::read(&t).unwrap().len(), 48);
}

#[test]
fn a_model_replaced_under_the_mount_is_never_written() {
    if fuse_missing() {
        return;
    }
    let m = Mount::new(&xnnpack(), &[], &[]);
    let old = std::fs::read(&m.model).unwrap();
    // Another file of the same size, renamed over the model's name.
    let mut other = old.clone();
    let n = other.len();
    other[n - 1] ^= 0xff;
    let tmp = m.dir.path().join("other.pte");
    std::fs::write(&tmp, &other).unwrap();
    std::fs::rename(&tmp, &m.model).unwrap();
    let seg = m.path("segments/0");
    let e = py_errno(
        "f = open(sys.argv[1], 'r+b')\nf.write(b'\\x01')\nf.close()",
        &[seg.to_str().unwrap()],
    );
    assert_eq!(e, "ESTALE");
    // A resize would have replaced the other file with the old model.
    let payload = m.path("plans/forward/delegates/0/processed.bin");
    let e = py_errno(
        "d = open(sys.argv[1], 'rb').read()\nf = open(sys.argv[1], 'wb')\nf.write(d + b'\\0' * 64)\nf.close()",
        &[payload.to_str().unwrap()],
    );
    assert_eq!(e, "ESTALE");
    assert_eq!(std::fs::read(&m.model).unwrap(), other);
    // Reads are refused too, naming the change, until the mount is made again: the mount
    // never shows the file it opened under a name that now holds another.
    let e = py_errno("open(sys.argv[1], 'rb').read()", &[seg.to_str().unwrap()]);
    assert_eq!(e, "ESTALE");
}

#[test]
fn concurrent_handles_commit_on_their_own_and_readers_see_committed_bytes() {
    if fuse_missing() {
        return;
    }
    let m = Mount::new(&linear(), &[], &[]);
    let t = m.path(TENSOR);
    let good = pattern(48, 1);
    let committed = std::fs::read(&t).unwrap();
    // Two writers of one file: one refused, one good; readers meanwhile see the committed
    // bytes, at their full size.
    let script = r#"
import os, sys, errno
path, good = sys.argv[1], bytes.fromhex(sys.argv[2])
committed = bytes.fromhex(sys.argv[3])
bad = os.open(path, os.O_WRONLY | os.O_TRUNC)
ok = os.open(path, os.O_WRONLY | os.O_TRUNC)
os.write(bad, b'\x02' * 40)
os.write(ok, good[:20])
assert open(path, 'rb').read() == committed, 'a reader saw staged bytes'
assert os.stat(path).st_size == 48, os.stat(path).st_size
os.write(ok, good[20:])
try:
    os.close(bad)
    raise SystemExit('the short write was accepted')
except OSError as e:
    assert e.errno == errno.EINVAL, e
os.close(ok)
assert open(path, 'rb').read() == good
print('ok')
"#;
    let (ok, out, err) = common::mount::py(
        script,
        &[t.to_str().unwrap(), &hex(&good), &hex(&committed)],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(std::fs::read(&t).unwrap(), good);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn fsync_of_partial_content_and_empty_writes() {
    if fuse_missing() {
        return;
    }
    let m = Mount::new(&linear(), &[], &[]);
    let t = m.path(TENSOR);
    let new = m.dir.path().join("new.bin");
    let data = pattern(48, 9);
    std::fs::write(&new, &data).unwrap();
    // dd with O_DSYNC fsyncs after every 16-byte block: partial content flushes nothing.
    let (ok, err) = sh(
        None,
        &format!(
            "dd if='{}' of='{}' bs=16 oflag=dsync status=none",
            new.display(),
            t.display()
        ),
    );
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), data);
    // An empty write fails at close.
    let before = std::fs::read(&m.model).unwrap();
    let (ok, err) = sh(None, &format!("cp /dev/null '{}'", t.display()));
    assert!(!ok, "cp /dev/null was accepted");
    assert!(err.contains("Invalid argument"), "{err}");
    assert_eq!(std::fs::read(&m.model).unwrap(), before);
    // `cmd > file` still works: the shell closes a duplicate before cmd writes.
    let data = pattern(48, 3);
    std::fs::write(&new, &data).unwrap();
    let (ok, err) = sh(
        None,
        &format!("cat '{}' > '{}'", new.display(), t.display()),
    );
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), data);
}
