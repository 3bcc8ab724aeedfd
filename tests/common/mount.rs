//! Real mounts through the `ptefs` binary, and the tools tests drive them with.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{copy_files, is_mounted, unmount, Copied};

pub const BIN: &str = env!("CARGO_BIN_EXE_ptefs");

pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fixture copied into a temp dir and mounted there; unmounted when dropped.
pub struct Mount {
    pub dir: tempfile::TempDir,
    pub model: PathBuf,
    pub data: Vec<PathBuf>,
    pub mnt: PathBuf,
    pub args: Vec<String>,
    pub live: bool,
}

impl Mount {
    /// Copies `file` and `data` into a new temporary directory and mounts the copy with
    /// `args`.
    pub fn new(file: &Path, data: &[PathBuf], args: &[&str]) -> Mount {
        let Copied {
            dir, model, data, ..
        } = copy_files(file, data);
        let mut m = Mount::unmounted(dir, model, data, args);
        m.mount();
        m
    }

    /// A mount of `model` (and `data`), files under `dir`, on a new `mnt` directory in
    /// `dir`, with `args`; not mounted yet.
    pub fn unmounted(
        dir: tempfile::TempDir, model: PathBuf, data: Vec<PathBuf>, args: &[&str],
    ) -> Mount {
        let mnt = dir.path().canonicalize().unwrap().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        Mount {
            dir,
            model,
            data,
            mnt,
            args: args.iter().map(|s| s.to_string()).collect(),
            live: false,
        }
    }

    pub fn mount(&mut self) {
        let out = run(&mut self.mount_command());
        assert!(
            out.status.success(),
            "ptefs mount {} failed: {}",
            self.model.display(),
            text(&out.stderr)
        );
        self.live = true;
        // `mount` returns once the mount is live: no waiting here.
        assert!(
            is_mounted(&self.mnt),
            "mount returned before the mount was live"
        );
    }

    pub fn mount_command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("mount").arg(&self.model).arg(&self.mnt);
        for d in &self.data {
            cmd.arg("--data").arg(d);
        }
        cmd.args(&self.args);
        cmd
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn umount(&mut self) {
        let out = run(Command::new(BIN).arg("umount").arg(&self.mnt));
        assert!(
            out.status.success(),
            "ptefs umount failed: {}",
            text(&out.stderr)
        );
        self.live = false;
        assert!(!is_mounted(&self.mnt), "still mounted after ptefs umount");
    }

    pub fn remount(&mut self) {
        self.umount();
        self.mount();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.live {
            unmount(&self.mnt);
        }
    }
}

/// Starts `ptefs mount --foreground model mnt` (its output discarded) and waits until the
/// mount shows its tree; the child is the daemon.
pub fn mount_foreground(model: &Path, mnt: &Path) -> Child {
    mount_foreground_with(model, &[], mnt)
}

/// `mount_foreground` of `model` with its data files `data`.
pub fn mount_foreground_with(model: &Path, data: &[PathBuf], mnt: &Path) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.arg("mount").arg("--foreground").arg(model).arg(mnt);
    for d in data {
        cmd.arg("--data").arg(d);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A foreground mount says nothing once it is live; the bound only keeps a broken
    // daemon from hanging the test.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mnt.join("header.json").exists() {
        assert!(Instant::now() < deadline, "mount did not come up");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// A `python3` that has NumPy (the one on PATH may be a bare pyenv build).
pub fn python() -> &'static str {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        for cand in ["python3", "/usr/bin/python3", "/usr/local/bin/python3"] {
            let ok = Command::new(cand)
                .args(["-c", "import numpy"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return cand.to_string();
            }
        }
        panic!("no python3 with NumPy found: install python3-numpy (see .ci/run)");
    })
}

/// Runs a Python script with `args`; returns (exit ok, stdout, stderr).
pub fn py(script: &str, args: &[&str]) -> (bool, String, String) {
    let out = run(Command::new(python()).arg("-c").arg(script).args(args));
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The errno a Python snippet reports, or "ok".
pub fn py_errno(script: &str, args: &[&str]) -> String {
    let wrapped = format!(
        "import sys, os, errno\ntry:\n{}\n    print('ok')\nexcept OSError as e:\n    print(errno.errorcode.get(e.errno, e.errno))\n",
        script
            .lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (ok, stdout, stderr) = py(&wrapped, args);
    assert!(ok, "python failed: {stderr}");
    stdout.trim().to_string()
}

/// One extended attribute read with `getfattr`, as a user does; "" when the file has none.
pub fn xattr(path: &Path, name: &str) -> String {
    let out = run(Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(path));
    text(&out.stdout)
}

pub fn tool(cmd: &mut Command) -> Vec<u8> {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        text(&out.stderr)
    );
    out.stdout
}
