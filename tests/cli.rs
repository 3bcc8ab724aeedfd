//! The command line around the tree, through the `ptefs` binary and real mounts: what
//! `check` and `mount` say about models the runtime cannot load (and the data files beside
//! them), one mount per file and `umount` only of ptefs's own mounts, the daemon's log when
//! no syslog listens, `recover`, closed pipes, the `/dev/fuse` messages, shell completions
//! and man pages.
//!
//! They need root and `/dev/fuse` (as in CI), plus `unshare` and `setpriv` (util-linux) for
//! the tests that change `/dev` in a mount namespace of their own.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ptefs::edit::journal;
use ptefs::edit::Source;
use ptefs::format::{Model, ModelFile};

mod common;
use common::mount::{run, text, Mount, BIN};
use common::{copy_fixture, fixtures_dir, fuse_missing, is_mounted, pattern, Copied};

/// `ptefs <args>`.
fn ptefs(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new(BIN);
    for a in args {
        cmd.arg(a);
    }
    run(&mut cmd)
}

/// Asserts that `out` is a failure whose message says `says`.
fn refused(out: &Output, says: &str) {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "succeeded: {err}");
    assert!(err.contains(says), "expected {says:?} in: {err}");
}

/// A new directory `name` in `root`.
fn subdir(root: &Path, name: &str) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir(&d).unwrap();
    d
}

/// Runs a bash script in a mount namespace of its own (so it may change `/dev` without
/// touching the machine), with `$BIN` set to ptefs and `args` as `$1`, `$2`, ….
fn in_namespace(script: &str, args: &[&Path]) -> Output {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "bash",
        "-ec",
        script,
        "ns",
    ])
    .args(args)
    .env("BIN", BIN);
    run(&mut cmd)
}

/// The copy of `name` (and its data files) with nothing else beside it.
fn fixture_alone(name: &str) -> Copied {
    let c = copy_fixture(name);
    for d in &c.data {
        std::fs::remove_file(d).unwrap();
    }
    c
}

// ---- check and mount agree with the runtime ----

#[test]
fn external_tensors_without_data_are_defects_and_the_ptd_beside_is_named() {
    if fuse_missing() {
        return;
    }
    let c = copy_fixture("linear_ext.pte");
    let ptd = c.data[0].display().to_string();
    let out = ptefs(&[&"check", &c.model]);
    assert!(
        !out.status.success(),
        "check accepted unattached EXTERNAL tensors"
    );
    let report = text(&out.stdout);
    assert!(
        report.contains(
            "2 EXTERNAL tensor(s) (\"lin.weight\", …) need a .ptd data file, and none is attached"
        ),
        "{report}"
    );
    let advice = format!(
        "{ptd} sits beside the model and has the 2 missing key(s): attach it with --data {ptd}"
    );
    assert!(report.contains(&advice), "{report}");
    assert!(
        text(&out.stderr).contains("1 defect(s)"),
        "{}",
        text(&out.stderr)
    );
    // Attached, the same file is sound.
    let out = ptefs(&[&"check", &c.model, &"--data", &c.data[0]]);
    assert!(out.status.success(), "{}", text(&out.stdout));

    // The mount happens, warns, and names the file, without attaching it.
    let mnt = subdir(&c.root, "mnt");
    let out = ptefs(&[&"mount", &c.model, &mnt]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let shown = std::fs::read_dir(&mnt).map(|d| d.count());
    common::unmount(&mnt);
    assert!(
        err.contains("ptefs: warning: plan 0 (\"forward\"): 2 EXTERNAL tensor(s)"),
        "{err}"
    );
    assert!(err.contains(&format!("ptefs: warning: {advice}")), "{err}");
    assert!(shown.is_ok(), "the mount was not live");
    assert!(!mnt.join("data").exists());
}

#[test]
fn data_files_beside_are_named_by_their_keys_and_only_when_trusted() {
    let c = fixture_alone("linear_ext.pte");
    let real = fixtures_dir().join("linear_ext.ptd");
    // The right keys under another name, looked at after the planted names below.
    let good = c.root.join("weights-v2.ptd");
    std::fs::copy(&real, &good).unwrap();
    // A FIFO (which must not hang the reader), a link to the right file, a copy of
    // another user and a copy anyone may write: none of them is named.
    let fifo = std::ffi::CString::new(
        c.root
            .join("a-fifo.ptd")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink(&real, c.root.join("b-link.ptd")).unwrap();
    let theirs = c.root.join("c-theirs.ptd");
    std::fs::copy(&real, &theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let open = c.root.join("d-open.ptd");
    std::fs::copy(&real, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
    // A .ptd without the keys.
    std::fs::copy(
        fixtures_dir().join("llama_qc4.ptd"),
        c.root.join("e-other.ptd"),
    )
    .unwrap();

    let out = ptefs(&[&"check", &c.model]);
    assert!(!out.status.success());
    let report = text(&out.stdout);
    let advice: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("beside the model"))
        .collect();
    let good = good.display().to_string();
    assert_eq!(
        advice,
        [format!(
            "{good} sits beside the model and has the 2 missing key(s): attach it with --data {good}"
        )],
        "{report}"
    );
    // Without any file that has the keys, nothing is named.
    std::fs::remove_file(&good).unwrap();
    let report = text(&ptefs(&[&"check", &c.model]).stdout);
    assert!(!report.contains("beside the model"), "{report}");
}

#[test]
fn a_pte_attached_with_data_is_refused_naming_it_first() {
    let model = fixtures_dir().join("linear_ext.pte");
    let other = fixtures_dir().join("add_mul.pte").canonicalize().unwrap();
    let says = format!(
        "{}: attached with --data, so expected a .ptd (identifier FT01), found a .pte (identifier ET12)",
        other.display()
    );
    // `check` reports it as the file's defect; `info` refuses.
    let out = ptefs(&[&"check", &model, &"--data", &other]);
    assert!(!out.status.success());
    assert!(text(&out.stdout).contains(&says), "{}", text(&out.stdout));
    refused(&ptefs(&[&"info", &model, &"--data", &other]), &says);
}

#[test]
fn delegate_keys_no_attached_file_has_are_defects_and_warnings() {
    if fuse_missing() {
        return;
    }
    let c = copy_fixture("linear_xnnpack_ext.pte");
    // Attached to the data file of another model, which lacks the delegate's keys.
    let wrong = c.root.join("linear_ext.ptd");
    std::fs::copy(fixtures_dir().join("linear_ext.ptd"), &wrong).unwrap();
    let out = ptefs(&[&"check", &c.model, &"--data", &wrong]);
    assert!(!out.status.success());
    let report = text(&out.stdout);
    let missing: Vec<&str> = report
        .lines()
        .filter(|l| {
            l.starts_with("plan 0 (\"forward\") delegate 0 (XnnpackBackend): value %")
                && l.ends_with("which no attached file has")
        })
        .collect();
    assert_eq!(missing.len(), 2, "{report}");
    let ptd = c.data[0].display().to_string();
    let advice = format!(
        "{ptd} sits beside the model and has the 2 missing key(s): attach it with --data {ptd}"
    );
    assert!(report.contains(&advice), "{report}");

    let mnt = subdir(&c.root, "mnt");
    let out = ptefs(&[&"mount", &c.model, &mnt, &"--data", &wrong]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let live = is_mounted(&mnt);
    common::unmount(&mnt);
    assert!(live);
    let err = text(&out.stderr);
    for line in &missing {
        assert!(err.contains(&format!("ptefs: warning: {line}")), "{err}");
    }
    assert!(err.contains(&advice), "{err}");
}

#[test]
fn a_payload_that_does_not_decode_is_a_defect_and_a_warning() {
    if fuse_missing() {
        return;
    }
    let c = copy_fixture("linear_xnnpack.pte");
    let loc = {
        let model = Model::open(&c.model, &[] as &[PathBuf]).unwrap();
        let layout = model.pte_layout.as_ref().unwrap();
        *layout.plans[0].delegates[0].as_ref().unwrap()
    };
    let mut bytes = std::fs::read(&c.model).unwrap();
    let start = loc.range.start() as usize;
    bytes[start..start + 8].fill(0xff);
    std::fs::write(&c.model, &bytes).unwrap();

    let out = ptefs(&[&"check", &c.model]);
    assert!(!out.status.success());
    let report = text(&out.stdout);
    let defect = report
        .lines()
        .find(|l| {
            l.starts_with(
                "plan 0 (\"forward\") delegate 0 (XnnpackBackend): the payload does not decode: ",
            )
        })
        .unwrap_or_else(|| panic!("{report}"))
        .to_string();

    let mnt = subdir(&c.root, "mnt");
    let out = ptefs(&[&"mount", &c.model, &mnt]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let payload =
        std::fs::metadata(mnt.join("plans/forward/delegates/0/processed.bin")).map(|m| m.len());
    let decoded = mnt.join("plans/forward/delegates/0/xnnpack").exists();
    common::unmount(&mnt);
    assert!(
        text(&out.stderr).contains(&format!("ptefs: warning: {defect}")),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(payload.unwrap(), loc.range.len());
    assert!(!decoded);
}

// ---- one mount per file; umount only of ptefs's own mounts ----

/// Asserts that mounting `other` on a new directory beside the model of `m` is refused,
/// naming the mount `m` made.
fn refused_as_mounted_by(m: &Mount, other: &Path) {
    let second = m.model.parent().unwrap().join("second");
    let _ = std::fs::create_dir(&second);
    refused(
        &ptefs(&[&"mount", &other, &second]),
        &format!("is already mounted on {} (ptefs pid ", m.mnt.display()),
    );
    assert!(!is_mounted(&second));
}

#[test]
fn a_file_is_mounted_once_whatever_path_or_link_names_it() {
    if fuse_missing() {
        return;
    }
    let fx = fixtures_dir().join("linear.pte");
    let m = Mount::new(&fx, &[], &[]);
    let root = m.model.parent().unwrap().to_path_buf();
    let link = root.join("hard-link.pte");
    std::fs::hard_link(&m.model, &link).unwrap();
    let alias = root.join("alias");
    std::os::unix::fs::symlink(&root, &alias).unwrap();
    let by_alias = alias.join("linear.pte");
    for other in [&link, &by_alias] {
        refused_as_mounted_by(&m, other);
    }
}

#[test]
fn the_claim_follows_the_file_through_a_relayout() {
    if fuse_missing() {
        return;
    }
    let fx = fixtures_dir().join("linear_xnnpack.pte");
    let m = Mount::new(&fx, &[], &[]);
    let before = std::fs::metadata(&m.model).unwrap().ino();
    let payload = m.path("plans/forward/delegates/0/processed.bin");
    let mut grown = std::fs::read(&payload).unwrap();
    grown.extend(pattern(1000, 3));
    std::fs::write(&payload, &grown).unwrap();
    // The re-layout renamed a new inode over the model: that inode is the mounted one now,
    // and the old one, which the file system may give to any new file, is claimed no more.
    let after = std::fs::metadata(&m.model).unwrap().ino();
    assert_ne!(before, after, "the write did not re-lay the file out");
    let root = m.model.parent().unwrap().to_path_buf();
    let link = root.join("hard-link.pte");
    std::fs::hard_link(&m.model, &link).unwrap();
    refused_as_mounted_by(&m, &link);
    let claims: Vec<String> = std::fs::read_dir("/run/ptefs")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let dev = std::fs::metadata(&m.model).unwrap().dev();
    assert!(
        claims.contains(&format!("file-{dev}-{after}.lock")),
        "{claims:?}"
    );
    assert!(
        !claims.contains(&format!("file-{dev}-{before}.lock")),
        "{claims:?}"
    );
}

#[test]
fn a_mount_with_other_names_is_still_recognised_as_ptefs() {
    if fuse_missing() {
        return;
    }
    let fx = fixtures_dir().join("linear.pte");
    // Its file-system name and type no longer say ptefs; its record does.
    let mut m = Mount::new(&fx, &[], &["-o", "fsname=weights,subtype=plain"]);
    let line = common::mountinfo_line(&m.mnt).unwrap();
    assert!(!line.contains("ptefs"), "{line}");
    let other = m.model.with_file_name("other.pte");
    std::fs::copy(&fx, &other).unwrap();
    let out = ptefs(&[&"mount", &other, &m.mnt]);
    refused(
        &out,
        &format!(
            "{} is already a ptefs mount (of {}, ptefs pid ",
            m.mnt.display(),
            m.model.display()
        ),
    );
    m.umount();
}

/// A FUSE file system that answers nothing, served by this test process.
struct Silent;
impl fuser::Filesystem for Silent {}

/// Mounts `Silent` on `at`, calling itself `fsname` of type `subtype`.
fn foreign_fuse(at: &Path, fsname: &str, subtype: &str) -> fuser::BackgroundSession {
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(fsname.to_string()),
        fuser::MountOption::CUSTOM(format!("subtype={subtype}")),
    ];
    fuser::Session::new(Silent, at, &cfg)
        .and_then(|s| s.spawn())
        .unwrap_or_else(|e| panic!("mount {}: {e}", at.display()))
}

#[test]
fn umount_leaves_alone_mounts_ptefs_did_not_make() {
    if fuse_missing() {
        return;
    }
    let c = copy_fixture("linear.pte");
    // A tmpfs.
    let tmpfs = subdir(&c.root, "tmpfs");
    let out = run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&tmpfs));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let umount = ptefs(&[&"umount", &tmpfs]);
    let still = is_mounted(&tmpfs);
    let _ = Command::new("umount").arg(&tmpfs).status();
    assert!(still, "ptefs umount removed a tmpfs");
    refused(
        &umount,
        "it is not a ptefs mount: it is tmpfs from tmpfs; not unmounted",
    );

    // Another FUSE file system that calls itself ptefs, and claims to show the model.
    let fake = subdir(&c.root, "fake");
    let session = foreign_fuse(&fake, &format!("ptefs:{}", c.model.display()), "ptefs");
    let umount = ptefs(&[&"umount", &fake]);
    let still = is_mounted(&fake);
    // Nor does a mount or a recovery of that model go ahead.
    let mnt = subdir(&c.root, "mnt");
    let mount = ptefs(&[&"mount", &c.model, &mnt]);
    let recover = ptefs(&[&"recover", &c.model]);
    if is_mounted(&mnt) {
        common::unmount(&mnt);
    }
    session.umount_and_join().unwrap();
    assert!(still, "ptefs umount removed a mount it did not make");
    refused(
        &umount,
        &format!(
            "{}: no ptefs daemon of this user made it (no record of it in /run/ptefs or {}): it is fuse.ptefs from ptefs:{}; not unmounted",
            fake.display(),
            std::env::temp_dir().join("ptefs-0").display(),
            c.model.display()
        ),
    );
    let elsewhere = format!("is already mounted on {}", fake.display());
    refused(&mount, &elsewhere);
    refused(&recover, &elsewhere);
}

#[test]
fn umount_removes_a_ptefs_mount_whose_daemon_died() {
    if fuse_missing() {
        return;
    }
    let c = copy_fixture("linear.pte");
    let mnt = subdir(&c.root, "mnt");
    let mut daemon = common::mount::mount_foreground(&c.model, &mnt);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let dead = std::fs::File::open(mnt.join("header.json")).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(libc::ENOTCONN), "{dead}");
    // Mounting there says what is in the way.
    refused(
        &ptefs(&[&"mount", &c.model, &mnt]),
        &format!(
            "{}: a FUSE mount whose daemon has exited is there: unmount it first (`ptefs umount {}`",
            mnt.display(),
            mnt.display()
        ),
    );
    let out = ptefs(&[&"umount", &mnt]);
    if is_mounted(&mnt) {
        common::force_unmount(&mnt);
        panic!("ptefs umount left the dead mount: {}", text(&out.stderr));
    }
    assert!(out.status.success(), "{}", text(&out.stderr));
    // And the file mounts again.
    let out = ptefs(&[&"mount", &c.model, &mnt]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    common::unmount(&mnt);
}

// ---- the daemon's log without syslog ----

/// The path after `marker` on a line of `text`.
fn path_after(text: &str, marker: &str) -> Option<PathBuf> {
    text.lines()
        .find_map(|l| l.split_once(marker))
        .map(|(_, p)| PathBuf::from(p.trim()))
}

#[test]
fn without_syslog_the_daemon_logs_each_refusal_once_to_a_file_it_names() {
    if fuse_missing() {
        return;
    }
    let c = copy_fixture("linear.pte");
    let mnt = subdir(&c.root, "mnt");
    let short = c.root.join("short.bin");
    std::fs::write(&short, [0u8; 40]).unwrap();
    let before = std::fs::read(&c.model).unwrap();
    // In a mount namespace where nothing listens at /dev/log (it may be missing already):
    // a refused `cp` (flush, then release), a refused Python write with an fsync, an empty
    // `cp`, and a `dd` that succeeds (it closes a duplicate of the emptied file before it
    // writes: that close's refusal is no refusal of what `dd` wrote).
    let script = r#"
        if [ -e /dev/log ]; then mount --bind /dev/null /dev/log; fi
        "$BIN" mount "$1" "$2" 2> "$3/mount.err"
        cp "$2/plans/forward/values/0.bin" "$3/same.bin"
        dd if="$3/same.bin" of="$2/plans/forward/values/0.bin" status=none
        ! cp /dev/null "$2/plans/forward/values/0.bin" 2> "$3/empty.err"
        ! cp "$4" "$2/plans/forward/values/0.bin" 2> "$3/cp.err"
        ! python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, bytes(44))
os.fsync(fd)
os.close(fd)' "$2/plans/forward/values/0.bin" 2> "$3/py.err"
        "$BIN" umount "$2"
    "#;
    let out = in_namespace(script, &[&c.model, &mnt, &c.root, &short]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stderr),
        std::fs::read_to_string(c.root.join("mount.err")).unwrap_or_default()
    );
    let said = std::fs::read_to_string(c.root.join("mount.err")).unwrap();
    let log_path = path_after(&said, "the daemon logs its errors to ")
        .unwrap_or_else(|| panic!("the mount did not say where it logs: {said}"));
    let log = std::fs::read_to_string(&log_path);
    let meta = std::fs::symlink_metadata(&log_path);
    let dir_meta = std::fs::symlink_metadata(log_path.parent().unwrap());
    let _ = std::fs::remove_file(&log_path);
    let log = log.unwrap();
    assert!(said.contains("no syslog listens at /dev/log"), "{said}");
    assert!(log_path.starts_with("/run/ptefs"), "{}", log_path.display());
    let meta = meta.unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), 0);
    assert_eq!(dir_meta.unwrap().mode() & 0o777, 0o700);
    assert!(
        log.lines().next().is_some_and(|l| l.ends_with(&format!(
            ": {} on {}",
            c.model.display(),
            mnt.display()
        ))),
        "{log}"
    );
    let refusals = |got: &str| {
        log.lines()
            .filter(|l| {
                l.contains(&format!(
                    "plans/forward/values/0.bin: needs 48 bytes for FLOAT[3,4], got {got}"
                ))
            })
            .count()
    };
    assert_eq!(refusals("40"), 1, "{log}");
    assert_eq!(refusals("44"), 1, "{log}");
    assert_eq!(refusals("0"), 1, "{log}");
    assert!(text(&std::fs::read(c.root.join("cp.err")).unwrap()).contains("Invalid argument"));
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

// ---- recover ----

/// A journal for new bytes over the whole first segment of `model`, left beside it as a
/// crash right after the journal's fsync leaves it; returns the new content of the file.
fn interrupted_commit(model: &Path) -> Vec<u8> {
    let file = ModelFile::open_writable(model).unwrap();
    let seg = file.writable_ranges()[0];
    let new = pattern(seg.len() as usize, 0x5a);
    let writes = [(seg.start(), Source::Memory(&new))];
    let pending = journal::begin(&file, &writes).unwrap();
    drop(pending);
    let mut whole = std::fs::read(model).unwrap();
    whole[seg.as_usize()].copy_from_slice(&new);
    whole
}

/// Writes the first half of what `whole` changes into `model`: the tensor is torn.
fn tear(model: &Path, whole: &[u8]) {
    let mut bytes = std::fs::read(model).unwrap();
    let first = bytes.iter().zip(whole).position(|(a, b)| a != b).unwrap();
    let last = bytes.iter().zip(whole).rposition(|(a, b)| a != b).unwrap();
    let mid = first + (last - first) / 2;
    bytes[first..mid].copy_from_slice(&whole[first..mid]);
    std::fs::write(model, &bytes).unwrap();
}

#[test]
fn recover_replays_the_journal_over_a_torn_file() {
    let c = copy_fixture("linear_ext.pte");
    let whole = interrupted_commit(&c.model);
    tear(&c.model, &whole);
    let out = ptefs(&[&"check", &c.model]);
    let report = text(&out.stdout);
    assert!(
        report.contains(&format!(
            "an interrupted commit left this journal ({} bytes in 1 range(s)), so {} may hold partly written bytes: run `ptefs recover {}`",
            ModelFile::open(&c.model).unwrap().writable_ranges()[0].len(),
            c.model.display(),
            c.model.display()
        )),
        "{report}"
    );
    let out = ptefs(&[&"recover", &c.model, &"--data", &c.data[0]]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!(
            "{}: finished an interrupted commit from its journal",
            c.model.display()
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("{}: no interrupted commit", c.data[0].display())),
        "{said}"
    );
    assert_eq!(std::fs::read(&c.model).unwrap(), whole);
    assert!(!journal::journal_path(&c.model).exists());
    let out = ptefs(&[&"check", &c.model, &"--data", &c.data[0]]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn recover_discards_a_torn_journal_and_says_why() {
    let c = copy_fixture("linear.pte");
    let before = std::fs::read(&c.model).unwrap();
    interrupted_commit(&c.model);
    let j = journal::journal_path(&c.model);
    let len = std::fs::metadata(&j).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&j)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let out = ptefs(&[&"check", &c.model]);
    assert!(!out.status.success());
    let report = text(&out.stdout);
    assert!(
        report.contains(&format!(
            "{}: torn journal: {} bytes, expected {len}; the commit that wrote it did not start changing {}: `ptefs recover {}` (or a mount) removes it",
            j.display(),
            len - 3,
            c.model.display(),
            c.model.display()
        )),
        "{report}"
    );
    let out = ptefs(&[&"recover", &c.model]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!(
            "{}: discarded the journal of an interrupted commit (torn journal: {} bytes, expected {len}); the file is unchanged",
            c.model.display(),
            len - 3
        )),
        "{said}"
    );
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
    assert!(!j.exists());
}

#[test]
fn recover_refuses_an_untrusted_journal_and_leaves_it() {
    let c = copy_fixture("linear.pte");
    let whole = interrupted_commit(&c.model);
    tear(&c.model, &whole);
    let torn = std::fs::read(&c.model).unwrap();
    let j = journal::journal_path(&c.model);
    std::fs::set_permissions(&j, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = ptefs(&[&"recover", &c.model]);
    refused(
        &out,
        &format!(
            "{}: not replayed: anyone may write it (mode 666), and a journal is replayed only when its owner alone may write it; it was left in place",
            j.display()
        ),
    );
    assert!(j.exists());
    assert_eq!(std::fs::read(&c.model).unwrap(), torn);
    // `check` does not send the user to a `recover` that refuses.
    let out = ptefs(&[&"check", &c.model]);
    assert!(!out.status.success());
    let report = text(&out.stdout);
    assert!(
        report.contains(&format!(
            "{}: not replayed: anyone may write it (mode 666), and a journal is replayed only when its owner alone may write it; it was left in place (remove it as root if it is not from an interrupted ptefs commit); `ptefs recover` and mounts refuse {} until it is gone",
            j.display(),
            c.model.display()
        )),
        "{report}"
    );
    assert!(!report.contains("run `ptefs recover"), "{report}");
}

#[test]
fn a_journal_of_other_bytes_is_named_with_its_bytes_escaped() {
    let c = copy_fixture("linear.pte");
    let j = journal::journal_path(&c.model);
    std::fs::write(&j, b"\x1b[2Jjunk and more junk bytes").unwrap();
    std::fs::set_permissions(&j, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = ptefs(&[&"check", &c.model]);
    assert!(!out.status.success());
    let report = text(&out.stdout);
    assert!(
        report.contains("it does not start with PTEFSJ02 (found \\x1b[2Jjunk)"),
        "{report}"
    );
    assert!(!report.contains('\x1b'), "{report}");
}

/// Sets or clears `chattr +i` on `path`; false when it is gone or its file system has no
/// such flag.
fn set_immutable(path: &Path, on: bool) -> bool {
    const IMMUTABLE: libc::c_int = 0x10;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS read and write one int.
    if unsafe { libc::ioctl(fd, libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return false;
    }
    flags = if on {
        flags | IMMUTABLE
    } else {
        flags & !IMMUTABLE
    };
    // SAFETY: as above.
    unsafe { libc::ioctl(fd, libc::FS_IOC_SETFLAGS, &flags) == 0 }
}

/// Clears `chattr +i` on a path when dropped, so the test's directory can be removed.
struct Mutable<'a>(&'a Path);

impl Drop for Mutable<'_> {
    fn drop(&mut self) {
        set_immutable(self.0, false);
    }
}

#[test]
fn an_immutable_journal_is_replayed_once_and_recover_says_it_cannot_be_removed() {
    let c = copy_fixture("linear.pte");
    let whole = interrupted_commit(&c.model);
    tear(&c.model, &whole);
    let j = journal::journal_path(&c.model);
    if !set_immutable(&j, true) {
        eprintln!("no immutable flag on this file system: not tested");
        return;
    }
    let _mutable = Mutable(&j);
    let bytes = ModelFile::open(&c.model).unwrap().writable_ranges()[0].len();
    let fix = format!(
        "but the journal cannot be removed (it is immutable): `chattr -i {0}`, then remove it. Until it is gone, `ptefs recover`, apply and read-write mounts replay it again and stop here: that writes nothing while {1} holds its bytes, but would undo a later change of those bytes made without ptefs",
        j.display(),
        c.model.display()
    );
    let out = ptefs(&[&"recover", &c.model]);
    refused(
        &out,
        &format!(
            "{}: finished an interrupted commit from its journal ({bytes} bytes in 1 range(s)); {fix}",
            c.model.display()
        ),
    );
    assert_eq!(std::fs::read(&c.model).unwrap(), whole);
    assert!(j.exists());
    // Again: the model holds the journal's bytes, nothing is written, and it says so.
    let mtime = std::fs::metadata(&c.model).unwrap().modified().unwrap();
    let out = ptefs(&[&"recover", &c.model]);
    refused(
        &out,
        &format!(
            "{}: already held every byte of its journal ({bytes} bytes in 1 range(s)), so it was replayed before; nothing was written; {fix}",
            c.model.display()
        ),
    );
    assert_eq!(
        std::fs::metadata(&c.model).unwrap().modified().unwrap(),
        mtime
    );
    assert_eq!(std::fs::read(&c.model).unwrap(), whole);
    // A read-write mount stops there too.
    if !fuse_missing() {
        let mnt = subdir(&c.root, "mnt");
        refused(&ptefs(&[&"mount", &c.model, &mnt]), &fix);
        assert!(!is_mounted(&mnt));
    }
    // Once the flag is cleared, recover removes it.
    assert!(set_immutable(&j, false));
    let out = ptefs(&[&"recover", &c.model]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!j.exists());
    assert_eq!(std::fs::read(&c.model).unwrap(), whole);
}

#[test]
fn recover_is_refused_while_the_file_is_mounted() {
    if fuse_missing() {
        return;
    }
    let m = Mount::new(&fixtures_dir().join("linear.pte"), &[], &[]);
    let out = ptefs(&[&"recover", &m.model]);
    refused(
        &out,
        &format!("is already mounted on {} (ptefs pid ", m.mnt.display()),
    );
}

/// `ptefs <args>` under `/usr/bin/time`: its output, its peak resident memory in bytes and
/// its time in seconds. Panics when a signal ended it (an allocation that failed aborts).
fn measured(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (Output, u64, f64) {
    let stats = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%M %e", "-o"]).arg(stats.path()).arg(BIN);
    for a in args {
        cmd.arg(a);
    }
    let out = run(&mut cmd);
    let said = std::fs::read_to_string(stats.path()).unwrap();
    assert!(
        !said.contains("terminated by signal"),
        "{said}{}",
        text(&out.stderr)
    );
    let last = said.lines().last().unwrap_or_default();
    let (kib, secs) = last.split_once(' ').unwrap();
    (
        out,
        kib.parse::<u64>().unwrap() << 10,
        secs.parse().unwrap(),
    )
}

/// What a command whose memory is bounded may use: the journal windows (a few MiB) and the
/// process itself (about 7 MiB), with room to spare; far below what the journals of these
/// tests declare or hold.
const JOURNAL_MEMORY: u64 = 64 << 20;

/// `measured`, asserting the memory bound and reporting the figures.
fn bounded(what: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let (out, peak, secs) = measured(args);
    eprintln!("{what}: peak RSS {} KiB, {secs} s", peak >> 10);
    assert!(
        peak < JOURNAL_MEMORY,
        "{what}: peak RSS {peak} bytes, over {JOURNAL_MEMORY}"
    );
    out
}

/// Creates `path` (mode 0600) holding `head`, `len` bytes long: the rest is a hole.
fn sparse_file(path: &Path, head: &[u8], len: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, head, 0).unwrap();
    f.set_len(len).unwrap();
}

/// An 8 GiB `.ptd` that takes a few KiB of disk (two FLOAT[32768, 32768] tensors, each in a
/// segment of 4 GiB) in a new directory; returns it and where its segments start.
fn sparse_8_gib_ptd() -> (tempfile::TempDir, PathBuf, u64) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().canonicalize().unwrap().join("big.ptd");
    let base = common::safetensors::sparse_many_tensor_ptd(&model, 2, 32768);
    assert_eq!(std::fs::metadata(&model).unwrap().len(), base + (8 << 30));
    (dir, model, base)
}

/// A journal header (format 2) for a file of `file_len` bytes declaring `ranges` ranges.
fn journal_header(file_len: u64, ranges: u64) -> Vec<u8> {
    let mut h = b"PTEFSJ02".to_vec();
    h.extend_from_slice(&file_len.to_le_bytes());
    h.extend_from_slice(&ranges.to_le_bytes());
    h
}

#[test]
fn a_sparse_journal_declaring_a_range_per_byte_is_refused_in_bounded_memory() {
    let (_dir, model, _) = sparse_8_gib_ptd();
    let len = std::fs::metadata(&model).unwrap().len();
    let j = journal::journal_path(&model);
    // A range per byte of the model, over a table that is a hole: its size holds them all
    // (128 GiB), 4 KiB of it on disk.
    sparse_file(&j, &journal_header(len, len), 24 + 16 * len + 4);
    let says = format!(
        "{}: not replayed: range 0 (journal bytes 24..40): 0 bytes at 0 cover bytes no in-place commit writes (outside every segment and inline payload); it was left in place",
        j.display()
    );
    let out = bounded("check", &[&"check", &model]);
    assert!(!out.status.success());
    assert!(text(&out.stdout).contains(&says), "{}", text(&out.stdout));
    let out = bounded("info", &[&"info", &model]);
    assert!(text(&out.stderr).contains(&says), "{}", text(&out.stderr));
    let out = bounded("recover", &[&"recover", &model]);
    refused(&out, &says);
    let out = bounded(
        "apply",
        &[&"apply", &model, &model.with_file_name("u.safetensors")],
    );
    refused(&out, &says);
    if !fuse_missing() {
        let mnt = model.with_file_name("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let out = ptefs(&[&"mount", &model, &mnt]);
        assert!(!is_mounted(&mnt));
        refused(&out, &says);
    }
    assert!(j.exists());

    // The same count in a journal of 4 KiB: it cannot hold its table, so it is torn.
    std::fs::remove_file(&j).unwrap();
    sparse_file(&j, &journal_header(len, len), 4096);
    let out = bounded("check", &[&"check", &model]);
    let torn = format!(
        "torn journal: 4096 bytes, shorter than its range table ({len} ranges; 4096 bytes hold at most 254)"
    );
    assert!(text(&out.stdout).contains(&torn), "{}", text(&out.stdout));
    let out = bounded("recover", &[&"recover", &model]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&torn), "{}", text(&out.stdout));
    assert!(!j.exists());
}

#[test]
fn a_whole_journal_of_256_mib_is_checked_and_replayed_in_bounded_memory() {
    let (_dir, model, base) = sparse_8_gib_ptd();
    let len = std::fs::metadata(&model).unwrap().len();
    // 4096 ranges of 64 KiB, 2 MiB apart across both segments, each starting with bytes the
    // journal replaces (the rest of the model, and all of the journal's data, are holes).
    const RANGES: u64 = 4096;
    const RANGE: u64 = 64 << 10;
    let at = |i: u64| base + i * (2 << 20);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap();
    for i in 0..RANGES {
        std::os::unix::fs::FileExt::write_all_at(&f, &[0x5a; 512], at(i)).unwrap();
    }
    drop(f);
    let mut head = journal_header(len, RANGES);
    for i in 0..RANGES {
        head.extend_from_slice(&at(i).to_le_bytes());
        head.extend_from_slice(&RANGE.to_le_bytes());
    }
    let data = RANGES * RANGE;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..data / zeros.len() as u64 {
        crc.update(&zeros);
    }
    let end = head.len() as u64 + data;
    let j = journal::journal_path(&model);
    sparse_file(&j, &head, end + 4);
    let f = std::fs::OpenOptions::new().write(true).open(&j).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &crc.finalize().to_le_bytes(), end).unwrap();
    drop(f);

    let what = format!("{data} bytes in {RANGES} range(s)");
    let out = bounded("check", &[&"check", &model]);
    assert!(
        text(&out.stdout).contains(&format!("an interrupted commit left this journal ({what})")),
        "{}",
        text(&out.stdout)
    );
    let out = bounded("recover", &[&"recover", &model]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!(
            "finished an interrupted commit from its journal ({what})"
        )),
        "{}",
        text(&out.stdout)
    );
    assert!(!j.exists());
    let f = std::fs::File::open(&model).unwrap();
    let mut first = [1u8; 512];
    for i in 0..RANGES {
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut first, at(i)).unwrap();
        assert_eq!(first, [0; 512], "range {i} not replayed");
    }
}

// ---- everyday use ----

/// Runs ptefs with `args`, its standard output a pipe nobody reads any more.
fn into_closed_pipe(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created and are owned here alone.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read_end);
    let mut cmd = Command::new(BIN);
    for a in args {
        cmd.arg(a);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .output()
        .unwrap()
}

#[test]
fn a_closed_pipe_ends_ls_and_cat_quietly() {
    let model = fixtures_dir().join("llama_lora.pte");
    for args in [
        &[&"ls" as &dyn AsRef<std::ffi::OsStr>, &model, &"-R", &"-l"][..],
        &[&"cat", &model, &"program.json"],
        &[&"info", &model],
    ] {
        let out = into_closed_pipe(args);
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
        assert_eq!(text(&out.stderr), "");
    }
    // As a shell runs them: no message, and a status of 0 or SIGPIPE's.
    for cmd in [
        "ls \"$1\" -R | head -1",
        "cat \"$1\" program.json | head -c1",
    ] {
        let out = run(Command::new("bash")
            .arg("-c")
            .arg(format!("set -o pipefail; \"$BIN\" {cmd} > /dev/null"))
            .arg("sh")
            .arg(&model)
            .env("BIN", BIN));
        let code = out.status.code();
        assert!(
            code == Some(0) || code == Some(128 + libc::SIGPIPE),
            "{cmd}: {code:?}"
        );
        assert_eq!(text(&out.stderr), "", "{cmd}");
    }
}

#[test]
fn mount_says_when_dev_fuse_is_missing_or_out_of_reach() {
    if fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let model = root.join("linear.pte");
    std::fs::copy(fixtures_dir().join("linear.pte"), &model).unwrap();
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mnt = subdir(&root, "mnt");
    std::os::unix::fs::chown(&mnt, Some(65534), Some(65534)).unwrap();

    // No device at all (a container started without it).
    let out = in_namespace(
        r#"mount -t tmpfs tmpfs /dev; "$BIN" mount "$1" "$2""#,
        &[&model, &mnt],
    );
    refused(
        &out,
        "/dev/fuse is missing: load the fuse module (`modprobe fuse`)",
    );

    // A device only root may open, and a user who is not root.
    let private = root.join("fuse");
    std::fs::write(&private, b"").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = in_namespace(
        r#"mount --bind "$3" /dev/fuse; setpriv --reuid=65534 --regid=65534 --clear-groups "$BIN" mount "$1" "$2""#,
        &[&model, &mnt, &private],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "/dev/fuse is not accessible to this user (uid 65534; it has mode 600, owner uid 0"
        ) && err.contains("mount as root, or let every user open it (`chmod 0666 /dev/fuse`"),
        "{err}"
    );
    assert!(!is_mounted(&mnt));
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    let bash = ptefs(&[&"completions", &"bash"]);
    assert!(bash.status.success());
    let script = text(&bash.stdout);
    for sub in [
        "mount",
        "umount",
        "ls",
        "cat",
        "info",
        "apply",
        "check",
        "recover",
        "completions",
        "man",
    ] {
        assert!(script.contains(sub), "bash completion lacks {sub}");
    }
    let parsed = run(Command::new("bash").arg("-n").arg("-c").arg(&script));
    assert!(parsed.status.success(), "{}", text(&parsed.stderr));
    let zsh = text(&ptefs(&[&"completions", &"zsh"]).stdout);
    assert!(zsh.starts_with("#compdef ptefs"), "{zsh}");

    let man = ptefs(&[&"man"]);
    assert!(man.status.success());
    let page = text(&man.stdout);
    assert!(page.contains(".TH ptefs 1"), "{page}");
    assert!(
        page.contains("recover") && page.contains("completions"),
        "{page}"
    );
    // Every page it names exists.
    assert!(!page.contains("ptefs\\-help"), "{page}");
    let page = text(&ptefs(&[&"man", &"recover"]).stdout);
    assert!(page.contains(".TH ptefs-recover 1"), "{page}");
    assert!(page.contains("\\-\\-data"), "{page}");
    refused(
        &ptefs(&[&"man", &"nope"]),
        "no command \"nope\": expected one of mount, umount",
    );
}
