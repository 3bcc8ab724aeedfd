//! Remote models against real servers on loopback ports (docs/remote.md): nginx for HTTP,
//! moto's S3 server for S3, and a fault-injecting proxy in front of nginx. The commands and
//! mounts read URLs as they read local files; listing fetches only headers, flatbuffers and
//! payloads; reads fetch what they need plus a bounded read-ahead; the block cache serves a
//! second mount; faults are retried, then reported as EIO naming the URL and range; a
//! changed object is never mixed with the old one; a stalled request holds up only its own
//! readers; secrets of a URL or of the environment show nowhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

mod common;

use common::mount::{run, text, BIN};
use common::servers::{Faults, Nginx, Proxy, S3, S3_SECRET};

fn fixture(name: &str) -> PathBuf {
    common::fixtures_dir().join(name)
}

/// `ptefs ARGS`, with the block cache off unless the args name one.
fn ptefs(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    if !args.contains(&"--cache-dir") && !args.contains(&"--cache-size") {
        cmd.args(["--cache-size", "0"]);
    }
    run(&mut cmd)
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The fixtures served: (model, data files).
const SERVED: &[(&str, &[&str])] = &[
    ("linear_ext.pte", &["linear_ext.ptd"]),
    ("llama_8da4w.pte", &["llama_8da4w.ptd"]),
    ("linear_xnnpack.pte", &[]),
    ("dtypes.pte", &[]),
];

fn serve_fixtures(n: &Nginx) {
    for (m, data) in SERVED {
        n.add(m, &fixture(m));
        for d in *data {
            n.add(d, &fixture(d));
        }
    }
}

/// `--data` arguments for `data` at `url`.
fn data_args(data: &[&str], url: impl Fn(&str) -> String) -> Vec<String> {
    data.iter()
        .flat_map(|d| ["--data".to_string(), url(d)])
        .collect()
}

#[test]
fn commands_read_urls_as_they_read_local_files() {
    let n = Nginx::start();
    serve_fixtures(&n);
    for (m, data) in SERVED {
        let local: Vec<String> = data
            .iter()
            .map(|d| fixture(d).display().to_string())
            .collect();
        let local_data = data_args(data, |d| fixture(d).display().to_string());
        let remote_data = data_args(data, |d| n.url(d));
        let args = |file: String, cmd: &[&str], d: &[String]| -> Vec<String> {
            let mut a: Vec<String> = vec![cmd[0].to_string(), file];
            a.extend(cmd[1..].iter().map(|s| s.to_string()));
            a.extend(d.iter().cloned());
            a
        };
        let both = |cmd: &[&str]| {
            let l = args(fixture(m).display().to_string(), cmd, &local_data);
            let r = args(n.url(m), cmd, &remote_data);
            let l: Vec<&str> = l.iter().map(String::as_str).collect();
            let r: Vec<&str> = r.iter().map(String::as_str).collect();
            (ptefs(&l), ptefs(&r))
        };
        let (l, r) = both(&["ls", "", "-R"]);
        assert_eq!(ok(l, m), ok(r, m), "{m}: ls -R differs");
        let (l, r) = both(&["cat", "weights.safetensors"]);
        assert!(l.status.success() && r.status.success(), "{m}");
        assert!(l.stdout == r.stdout, "{m}: weights.safetensors differs");
        let (l, r) = both(&["info"]);
        let (l, r) = (ok(l, m), ok(r, m));
        // The first line names the file; every other line is the same.
        assert_eq!(r.lines().next().unwrap(), format!("file: {}", n.url(m)));
        assert_eq!(
            l.lines().skip(1).collect::<Vec<_>>(),
            r.lines().skip(1).collect::<Vec<_>>(),
            "{m}: info differs"
        );
        let (l, r) = both(&["check"]);
        assert_eq!(l.status.success(), r.status.success(), "{m}: check differs");
        let _ = local;
    }
    // Every tensor file of a tree reads the same bytes.
    let listing = ok(
        ptefs(&[
            "ls",
            &n.url("llama_8da4w.pte"),
            "",
            "-R",
            "--data",
            &n.url("llama_8da4w.ptd"),
        ]),
        "ls",
    );
    let mut compared = 0;
    for path in listing
        .lines()
        .filter(|p| p.ends_with(".bin") || p.ends_with(".npy"))
    {
        let l = ptefs(&[
            "cat",
            fixture("llama_8da4w.pte").to_str().unwrap(),
            path,
            "--data",
            fixture("llama_8da4w.ptd").to_str().unwrap(),
        ]);
        let r = ptefs(&[
            "cat",
            &n.url("llama_8da4w.pte"),
            path,
            "--data",
            &n.url("llama_8da4w.ptd"),
        ]);
        assert!(l.status.success() && l.stdout == r.stdout, "{path}");
        compared += 1;
    }
    assert!(compared > 20, "only {compared} files compared");
}

/// Bytes of the headers, flatbuffers and delegate payloads of a local model (what a
/// listing may need).
fn structure_bytes(model: &Path, data: &[PathBuf]) -> u64 {
    let m = ptefs::format::Model::open(model, data).unwrap();
    let mut total: u64 = m.files.iter().map(|f| f.program_end()).sum();
    if let Some(layout) = &m.pte_layout {
        for plan in &layout.plans {
            total += plan
                .delegates
                .iter()
                .flatten()
                .map(|l| l.range.len())
                .sum::<u64>();
        }
    }
    total
}

#[test]
fn listing_fetches_headers_flatbuffers_and_payloads_never_tensors() {
    let n = Nginx::start();
    serve_fixtures(&n);
    for (m, data) in SERVED {
        n.clear_log();
        let mut args = vec!["ls".to_string(), n.url(m), String::new(), "-R".into()];
        args.extend(data_args(data, |d| n.url(d)));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(ptefs(&args), m);
        let local: Vec<PathBuf> = data.iter().map(|d| fixture(d)).collect();
        let needed = structure_bytes(&fixture(m), &local);
        let mut fetched = 0;
        for f in std::iter::once(m).chain(data.iter()) {
            fetched += n.served(f).1;
        }
        // The first read of each file is 4 KiB, whatever its flatbuffer needs.
        let files = 1 + data.len() as u64;
        assert!(
            fetched <= needed + 4096 * files,
            "{m}: listing fetched {fetched} bytes, headers, flatbuffers and payloads are {needed}: {:?}",
            n.log()
        );
        // Where the bytes go (the size of sizes.txt, and info --sizes) comes from the tables:
        // equal bytes are not looked for in a remote model.
        for cmd in [&["ls", "", "-l"][..], &["info", "--sizes"][..]] {
            n.clear_log();
            let mut args = vec![cmd[0].to_string(), n.url(m)];
            args.extend(cmd[1..].iter().map(|a| a.to_string()));
            args.extend(data_args(data, |d| n.url(d)));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = ok(ptefs(&args), m);
            if cmd[0] == "info" {
                assert!(
                    out.contains("stored more than once: not looked for"),
                    "{out}"
                );
            }
            let fetched: u64 = std::iter::once(m)
                .chain(data.iter())
                .map(|f| n.served(f).1)
                .sum();
            assert!(
                fetched <= needed + 4096 * files,
                "{m}: {cmd:?} fetched {fetched} bytes, headers, flatbuffers and payloads are {needed}"
            );
        }
    }
}

/// The `examples/make_model` binary cargo built beside the tests.
fn make_model(out: &Path, args: &[&str]) {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples/make_model");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds it (the examples are built with the tests)",
        bin.display()
    );
    let st = Command::new(&bin).arg(out).args(args).status().unwrap();
    assert!(st.success(), "make_model failed");
}

/// A 48 MiB model with a 32 MiB tensor (value 0), made once.
fn big_model() -> &'static Path {
    static MODEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &MODEL
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("big.pte");
            make_model(
                &p,
                &[
                    "--total", "48M", "--big", "32M", "--second", "8M", "--values", "300",
                ],
            );
            (dir, p)
        })
        .1
}

fn mount_url(url: &str, mnt: &Path, extra: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("mount").arg(url).arg(mnt).args(extra);
    run(&mut cmd)
}

/// A mount point that is unmounted when dropped.
struct Mnt(tempfile::TempDir, PathBuf);

impl Mnt {
    fn new() -> Mnt {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mnt");
        std::fs::create_dir(&p).unwrap();
        Mnt(d, p)
    }
    fn log(&self) -> PathBuf {
        self.0.path().join("log")
    }
    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }
}

impl Drop for Mnt {
    fn drop(&mut self) {
        if common::is_mounted(&self.1) {
            common::unmount(&self.1);
        }
    }
}

#[test]
fn a_mount_reads_lazily_reads_ahead_and_a_second_mount_reads_the_cache() {
    if common::fuse_missing() {
        return;
    }
    let n = Nginx::start();
    n.add("big.pte", big_model());
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().join("c");
    let m = Mnt::new();
    let log = m.log();
    let opts = [
        "--cache-dir",
        cache_dir.to_str().unwrap(),
        "--log-file",
        log.to_str().unwrap(),
    ];
    n.clear_log();
    ok(mount_url(&n.url("big.pte"), &m.1, &opts), "mount");
    let ls = run(Command::new("ls").arg("-lR").arg(&m.1));
    assert!(ls.status.success());
    let (requests, listed) = n.served("big.pte");
    let needed = structure_bytes(big_model(), &[]);
    assert!(
        listed <= needed + 4096,
        "mount and ls -lR fetched {listed} bytes in {requests} requests; the flatbuffer is {needed}"
    );
    // A sequential read of the 32 MiB tensor: the bytes of the local file, fetched with a
    // read-ahead that stays inside the tensor.
    let tensor = m.1.join("plans/forward/values/0.bin");
    let remote = std::fs::read(&tensor).unwrap();
    let offset: u64 = xattr_u64(&tensor, "user.ptefs.offset");
    let local = std::fs::read(big_model()).unwrap();
    assert_eq!(remote.len(), 32 << 20);
    assert!(remote[..] == local[offset as usize..offset as usize + remote.len()]);
    let (requests, fetched) = n.served("big.pte");
    let read = fetched - listed;
    assert!(
        read <= remote.len() as u64 + (4 << 20),
        "reading {} bytes fetched {read}",
        remote.len()
    );
    // Blocks of 4 MiB, several at once: far fewer requests than the kernel's reads.
    assert!(requests < 40, "{requests} requests: {:?}", n.log());
    // Unmounted and mounted again: the tree and the tensor come from the cache.
    common::unmount(&m.1);
    n.clear_log();
    ok(mount_url(&n.url("big.pte"), &m.1, &opts), "second mount");
    let again = std::fs::read(&tensor).unwrap();
    assert!(again == remote);
    // One request: the first 4 KiB, whose answer says the object is the same version.
    let log = n.log();
    assert_eq!(log.len(), 1, "the second mount fetched: {log:?}");
    assert!(log[0].contains("\"bytes=0-4095\""), "{log:?}");
}

fn xattr_u64(path: &Path, name: &str) -> u64 {
    let out = run(Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(path));
    assert!(out.status.success(), "getfattr: {}", text(&out.stderr));
    text(&out.stdout).trim().parse().unwrap()
}

fn xattr(path: &Path, name: &str) -> String {
    let out = run(Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(path));
    text(&out.stdout)
}

#[test]
fn remote_mounts_are_read_only_and_writing_commands_refuse_urls() {
    if common::fuse_missing() {
        return;
    }
    let n = Nginx::start();
    serve_fixtures(&n);
    let m = Mnt::new();
    let log = m.log();
    ok(
        mount_url(
            &n.url("linear_ext.pte"),
            &m.1,
            &[
                "--data",
                &n.url("linear_ext.ptd"),
                "--log-file",
                log.to_str().unwrap(),
                "-v",
                "-o",
                "rw",
            ],
        ),
        "mount",
    );
    let err = std::fs::write(m.1.join("plans/forward/values/0.bin"), [0u8; 48]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::write(m.1.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    assert!(
        m.log_text().contains("a remote model is mounted read-only"),
        "{}",
        m.log_text()
    );
    assert!(common::mountinfo_line(&m.1).unwrap().contains(" ro,"));
    for args in [
        vec!["apply", &n.url("linear_ext.pte")[..], "/dev/null"],
        vec!["recover", &n.url("linear_ext.pte")[..]],
    ] {
        let out = run(Command::new(BIN).args(&args));
        assert!(!out.status.success());
        let e = text(&out.stderr);
        assert!(e.contains("a remote model is read-only"), "{e}");
    }
}

#[test]
fn secrets_of_the_url_show_nowhere() {
    if common::fuse_missing() {
        return;
    }
    let n = Nginx::start();
    serve_fixtures(&n);
    let secret = "tok3nSECRETvalue";
    let url = format!(
        "http://alice:{secret}pw@127.0.0.1:{}/linear_ext.pte?X-Amz-Signature={secret}",
        n.port
    );
    let data = format!("http://127.0.0.1:{}/linear_ext.ptd?sig={secret}", n.port);
    for cmd in [
        vec!["info"],
        vec!["ls", "", "-R"],
        vec!["check"],
        vec!["cat", "header.json"],
    ] {
        let mut args = vec![cmd[0], &url[..]];
        args.extend(&cmd[1..]);
        args.extend(["--data", &data[..]]);
        let out = ptefs(&args);
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{cmd:?}: {all}");
        assert!(!all.contains(secret), "{cmd:?} shows the secret: {all}");
    }
    // An error (a missing object) names the URL without its secrets.
    let missing = format!(
        "http://bob:{secret}@127.0.0.1:{}/nothing.pte?k={secret}",
        n.port
    );
    let out = ptefs(&["info", &missing]);
    let e = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        e.contains("http://127.0.0.1:") && e.contains("/nothing.pte"),
        "{e}"
    );
    assert!(!e.contains(secret), "{e}");
    // A mount: the mount table, the log, xattrs and JSON.
    let m = Mnt::new();
    let log = m.log();
    ok(
        mount_url(
            &url,
            &m.1,
            &["--data", &data, "--log-file", log.to_str().unwrap(), "-vv"],
        ),
        "mount",
    );
    let shown = format!("http://127.0.0.1:{}/linear_ext.ptd", n.port);
    let bin = m.1.join("plans/forward/values/0.bin");
    assert_eq!(xattr(&bin, "user.ptefs.file"), shown);
    let _ = std::fs::read(&bin).unwrap();
    let mut seen = m.log_text();
    seen.push_str(&common::mountinfo_line(&m.1).unwrap());
    seen.push_str(&std::fs::read_to_string(m.1.join("header.json")).unwrap());
    seen.push_str(&std::fs::read_to_string(m.1.join("data/linear_ext/header.json")).unwrap());
    seen.push_str(&std::fs::read_to_string("/proc/mounts").unwrap());
    assert!(!seen.contains(secret), "{seen}");
    assert!(seen.contains("mounted http://127.0.0.1:"), "{seen}");
}

#[test]
fn s3_objects_list_read_and_mount_with_credentials_from_the_environment() {
    let s3 = S3::start();
    s3.bucket("models");
    for name in ["llama_8da4w.pte", "llama_8da4w.ptd"] {
        s3.put(
            "models",
            &format!("exports/{name}"),
            &std::fs::read(fixture(name)).unwrap(),
        );
    }
    let url = "s3://models/exports/llama_8da4w.pte";
    let data = "s3://models/exports/llama_8da4w.ptd";
    let with_env = |args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(args).args(["--cache-size", "0"]);
        for (k, v) in s3.env() {
            cmd.env(k, v);
        }
        run(&mut cmd)
    };
    let remote = with_env(&["ls", url, "", "-R", "--data", data]);
    let local = ptefs(&[
        "ls",
        fixture("llama_8da4w.pte").to_str().unwrap(),
        "",
        "-R",
        "--data",
        fixture("llama_8da4w.ptd").to_str().unwrap(),
    ]);
    assert_eq!(ok(local, "ls"), ok(remote, "ls s3"));
    let w = with_env(&["cat", url, "weights.safetensors", "--data", data]);
    let l = ptefs(&[
        "cat",
        fixture("llama_8da4w.pte").to_str().unwrap(),
        "weights.safetensors",
        "--data",
        fixture("llama_8da4w.ptd").to_str().unwrap(),
    ]);
    assert!(
        w.status.success() && w.stdout == l.stdout,
        "{}",
        text(&w.stderr)
    );
    // Without credentials the store refuses, and says so.
    let out = run(Command::new(BIN)
        .args(["info", "s3://models/missing.pte", "--cache-size", "0"])
        .envs(s3.env()));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("s3://models/missing.pte"),
        "{}",
        text(&out.stderr)
    );
    if common::fuse_missing() {
        return;
    }
    let m = Mnt::new();
    let log = m.log();
    let mut cmd = Command::new(BIN);
    cmd.args(["mount", url])
        .arg(&m.1)
        .args([
            "--data",
            data,
            "--cache-size",
            "0",
            "--log-file",
            log.to_str().unwrap(),
            "-vv",
        ])
        .envs(s3.env());
    ok(run(&mut cmd), "mount s3");
    let key = "data/llama_8da4w/named_data";
    let names: Vec<_> = std::fs::read_dir(m.1.join(key))
        .unwrap()
        .flatten()
        .collect();
    let bin = names
        .iter()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .unwrap();
    let remote = std::fs::read(&bin).unwrap();
    let offset = xattr_u64(&bin, "user.ptefs.offset") as usize;
    let local = std::fs::read(fixture("llama_8da4w.ptd")).unwrap();
    assert!(remote[..] == local[offset..offset + remote.len()]);
    assert_eq!(
        xattr(&bin, "user.ptefs.file"),
        "s3://models/exports/llama_8da4w.ptd"
    );
    let seen = m.log_text();
    assert!(
        seen.contains("s3://models/exports/llama_8da4w.pte"),
        "{seen}"
    );
    assert!(!seen.contains(S3_SECRET), "the log shows the secret key");
}

/// A model served through a fault proxy: (nginx, proxy).
fn faulty() -> (Nginx, Proxy) {
    let n = Nginx::start();
    serve_fixtures(&n);
    n.add("big.pte", big_model());
    let p = Proxy::start(n.port);
    (n, p)
}

/// `ptefs cat` of `path` of `model` through the proxy, quick to give up.
fn cat_through(p: &Proxy, model: &str, path: &str) -> Output {
    ptefs(&[
        "cat",
        &p.url(model),
        path,
        "--timeout",
        "1",
        "--retries",
        "2",
    ])
}

#[test]
fn server_errors_and_short_bodies_are_retried_then_reported_naming_url_and_range() {
    let (_n, p) = faulty();
    let want = ok(
        ptefs(&[
            "cat",
            &fixture("dtypes.pte").display().to_string(),
            "weights.safetensors",
        ]),
        "cat",
    );
    // Two 503s, then answers: retried with backoff, the bytes are right.
    p.set(Faults {
        fail_next: 2,
        ..Faults::default()
    });
    let out = cat_through(&p, "dtypes.pte", "weights.safetensors");
    assert_eq!(ok(out, "after two 503s"), want);
    // A body cut in half once: the read resumes where it broke.
    p.set(Faults {
        truncate_next: 1,
        ..Faults::default()
    });
    assert_eq!(
        ok(
            cat_through(&p, "dtypes.pte", "weights.safetensors"),
            "truncated once"
        ),
        want
    );
    // Every answer an error: the command fails, naming the URL; within the retries.
    p.set(Faults {
        fail_all: true,
        ..Faults::default()
    });
    let before = p.counts().0;
    let out = cat_through(&p, "dtypes.pte", "weights.safetensors");
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains(&p.url("dtypes.pte")) && e.contains("503"), "{e}");
    assert!(
        p.counts().0 - before <= 3,
        "{} requests",
        p.counts().0 - before
    );
    // Every body cut short: an error naming the URL and the range.
    p.set(Faults {
        truncate_all: true,
        ..Faults::default()
    });
    let out = cat_through(&p, "dtypes.pte", "weights.safetensors");
    let e = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        e.contains(&p.url("dtypes.pte")) && e.contains("bytes 0.."),
        "{e}"
    );
}

#[test]
fn hostile_answers_are_refused_without_unbounded_memory() {
    let (_n, p) = faulty();
    let rss = |args: &[&str]| -> (Output, u64) {
        let out = run(Command::new("/usr/bin/time")
            .args(["-f", "maxrss %M"])
            .arg(BIN)
            .args(args)
            .args(["--cache-size", "0", "--timeout", "2", "--retries", "1"]));
        let e = text(&out.stderr);
        let kib = e
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("maxrss "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no maxrss in {e}"));
        (out, kib)
    };
    let (baseline, base_kib) = rss(&["info", &p.url("big.pte")]);
    ok(baseline, "info");
    let cases: Vec<(&str, Faults, &str)> = vec![
        (
            "a server that ignores Range",
            Faults {
                ignore_range: true,
                ..Faults::default()
            },
            "range request not supported",
        ),
        (
            "a Content-Length of 1 TiB",
            Faults {
                content_length: Some(1 << 40),
                ..Faults::default()
            },
            "big.pte",
        ),
        (
            "more bytes than the range",
            Faults {
                extra_bytes: 1 << 20,
                ..Faults::default()
            },
            "big.pte",
        ),
        (
            "a redirect loop",
            Faults {
                redirect_loop: true,
                ..Faults::default()
            },
            "redirect",
        ),
    ];
    for (what, faults, says) in cases {
        p.set(faults);
        let before = p.counts().0;
        let (out, kib) = rss(&["cat", &p.url("big.pte"), "plans/forward/values/0.bin"]);
        let e = text(&out.stderr);
        assert!(!out.status.success(), "{what}: the read succeeded");
        assert!(
            e.to_lowercase().contains(&says.to_lowercase()),
            "{what}: {e}"
        );
        // The object is 48 MiB: memory stays far below it.
        assert!(
            kib < base_kib + 24 * 1024,
            "{what}: {kib} KiB at most, {base_kib} KiB for info"
        );
        assert!(
            p.counts().0 - before < 100,
            "{what}: {} requests",
            p.counts().0 - before
        );
    }
}

#[test]
fn a_changed_object_is_never_mixed_with_the_old_one() {
    if common::fuse_missing() {
        return;
    }
    let (n, p) = faulty();
    for (via_proxy, name) in [(false, "llama_8da4w.ptd"), (true, "llama_8da4w.ptd")] {
        let m = Mnt::new();
        let log = m.log();
        let url = |f: &str| if via_proxy { p.url(f) } else { n.url(f) };
        p.set(Faults::default());
        n.add(name, &fixture(name));
        ok(
            mount_url(
                &url("llama_8da4w.pte"),
                &m.1,
                &[
                    "--data",
                    &url(name),
                    "--cache-size",
                    "0",
                    "--log-file",
                    log.to_str().unwrap(),
                ],
            ),
            "mount",
        );
        let dir = m.1.join("data/llama_8da4w/named_data");
        let bins: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect();
        assert!(std::fs::read(&bins[0]).is_ok());
        if via_proxy {
            // A server that ignores If-Match, answering with another ETag.
            p.set(Faults {
                etag: Some("\"another\"".into()),
                ..Faults::default()
            });
        } else {
            // The file replaced on the server: a new ETag and other bytes.
            let mut bytes = std::fs::read(fixture(name)).unwrap();
            for b in bytes.iter_mut().skip(4096) {
                *b ^= 0x5a;
            }
            std::thread::sleep(Duration::from_millis(1100));
            std::fs::write(n.root.join(name), bytes).unwrap();
        }
        for bin in &bins[bins.len() - 2..] {
            let e = std::fs::read(bin).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{}", bin.display());
        }
        let text = m.log_text();
        assert!(
            text.contains(&format!(
                "{} changed on the server since it was mounted",
                url(name)
            )) && text.contains("remount"),
            "{text}"
        );
    }
}

#[test]
fn a_stalled_request_holds_up_only_its_own_readers() {
    if common::fuse_missing() {
        return;
    }
    let (_n, p) = faulty();
    let m = Mnt::new();
    let log = m.log();
    ok(
        mount_url(
            &p.url("big.pte"),
            &m.1,
            &[
                "--cache-size",
                "0",
                "--timeout",
                "1",
                "--retries",
                "1",
                "--log-file",
                log.to_str().unwrap(),
            ],
        ),
        "mount",
    );
    let big = m.1.join("plans/forward/values/0.bin");
    let other = m.1.join("plans/forward/values/1.bin");
    let start = xattr_u64(&big, "user.ptefs.offset");
    // Requests for the big tensor's first block wait 30 s; nothing else does.
    p.set(Faults {
        stall: Some((start..start + 1, Duration::from_secs(30))),
        ..Faults::default()
    });
    let stalled = std::thread::spawn(move || std::fs::read(&big).map_err(|e| e.raw_os_error()));
    std::thread::sleep(Duration::from_millis(300));
    // Another reader of the same mount is served while the first one waits.
    let bytes = std::fs::read(&other).unwrap();
    assert_eq!(bytes.len(), 8 << 20);
    assert!(!stalled.is_finished(), "the stalled read ended first");
    // The stalled read gives up after its timeouts and retries: EIO, logged with its range.
    let r = stalled.join().unwrap();
    assert_eq!(r.err(), Some(Some(libc::EIO)));
    let text = m.log_text();
    assert!(
        text.contains(&format!("{}: bytes {start}..", p.url("big.pte"))),
        "{text}"
    );
}
