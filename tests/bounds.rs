//! Files whose tree could grow without bound: many paths sharing one constant buffer, texts
//! larger than the text cache, trees over the node limit, keys longer than a file name. Each
//! case goes through the core (`ptefs::fs::Fs`) and through a real mount of the `ptefs`
//! binary (which needs `/dev/fuse` and the right to mount; see `common::fuse_missing`).
//!
//! The synthetic models are built here with `format::writer`, as `tests/corrupt.rs` does.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{fixtures_dir, fuse_missing, read_all, walk};
use ptefs::format::generated::pte_fb;
use ptefs::format::writer::{pack_program, pte_program_region};
use ptefs::format::{Model, ModelFile};
use ptefs::fs::{FileType, Fs, Options};
use ptefs::tree::{node_count, Tree};

const BIN: &str = env!("CARGO_BIN_EXE_ptefs");

/// A generated table with some fields set (the generated structs are non-exhaustive).
macro_rules! mk {
    ($t:path { $($f:ident : $v:expr),* $(,)? }) => {{
        let mut x = <$t>::default();
        $(x.$f = $v;)*
        x
    }};
}

fn constant(buffer: u32) -> pte_fb::EValueT {
    mk!(pte_fb::EValueT {
        val: pte_fb::KernelTypesT::Tensor(Box::new(mk!(pte_fb::TensorT {
            scalar_type: pte_fb::ScalarType::FLOAT,
            sizes: Some(vec![4]),
            dim_order: Some(vec![0]),
            data_buffer_idx: buffer,
        }))),
    })
}

fn plan(name: &str, values: Vec<pte_fb::EValueT>) -> pte_fb::ExecutionPlanT {
    let relu = mk!(pte_fb::KernelCallT {
        op_index: 0,
        args: Some(vec![0, 0]),
    });
    mk!(pte_fb::ExecutionPlanT {
        name: Some(name.to_string()),
        values: Some(values),
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        chains: Some(vec![mk!(pte_fb::ChainT {
            inputs: Some(vec![]),
            outputs: Some(vec![]),
            instructions: Some(vec![mk!(pte_fb::InstructionT {
                instr_args: pte_fb::InstructionArgumentsT::KernelCall(Box::new(relu)),
            })]),
        })]),
        operators: Some(vec![mk!(pte_fb::OperatorT {
            name: Some("aten::relu".into()),
            overload: Some("out".into()),
        })]),
        delegates: Some(vec![]),
        non_const_buffer_sizes: Some(vec![0]),
    })
}

/// A `.pte` whose plan `forward` has `n` FLOAT[4] constants all on constant buffer 1, and a
/// plan `other` whose value 0 uses the same buffer (the same parameter in a second method);
/// with `key`, a named-data blob of 8 bytes under that key.
fn shared_pte(n: usize, key: Option<&str>) -> Vec<u8> {
    let mut other = vec![constant(1)];
    other.push(mk!(pte_fb::EValueT {
        val: pte_fb::KernelTypesT::Int(Box::new(mk!(pte_fb::IntT { int_val: 7 }))),
    }));
    let mut segments = vec![mk!(pte_fb::DataSegmentT {
        offset: 0,
        size: 16
    })];
    let mut named_data = Vec::new();
    if let Some(key) = key {
        segments.push(mk!(pte_fb::DataSegmentT {
            offset: 128,
            size: 8
        }));
        named_data.push(mk!(pte_fb::NamedDataT {
            key: Some(key.to_string()),
            segment_index: 1,
        }));
    }
    let program = mk!(pte_fb::ProgramT {
        execution_plan: Some(vec![
            plan("forward", (0..n).map(|_| constant(1)).collect()),
            plan("other", other),
        ]),
        constant_buffer: Some(vec![]),
        backend_delegate_data: Some(vec![]),
        constant_segment: Some(Box::new(mk!(pte_fb::SubsegmentOffsetsT {
            segment_index: 0,
            offsets: Some(vec![0, 0]),
        }))),
        segments: Some(segments),
        named_data: Some(named_data),
        mutable_data_segments: Some(vec![]),
    });
    let data_size = if key.is_some() { 136 } else { 16 };
    let (mut bytes, base) =
        pte_program_region(&pack_program(&program, 16), 16, 128, data_size, true);
    bytes.resize(base as usize, 0);
    bytes.extend((0..16u8).map(|b| b * 3));
    if key.is_some() {
        bytes.resize(base as usize + 128, 0);
        bytes.extend_from_slice(b"longkey!");
    }
    bytes
}

fn fs_of(bytes: Vec<u8>) -> Fs {
    let file = ModelFile::from_bytes(Path::new("shared.pte"), bytes).unwrap();
    let tree = Tree::build(Arc::new(Model::from_files(vec![file]).unwrap()));
    Fs::new(tree, Options { read_only: true })
}

fn json_at(fs: &Fs, path: &str) -> (usize, Value) {
    let ino = fs.tree().find(path).unwrap_or_else(|| panic!("no {path}"));
    let bytes = read_all(fs, ino, 1 << 20).unwrap();
    (bytes.len(), serde_json::from_slice(&bytes).unwrap())
}

fn aliases(j: &Value) -> Vec<(String, String)> {
    j["aliases"]
        .as_array()
        .unwrap_or_else(|| panic!("no aliases in {j}"))
        .iter()
        .map(|a| {
            (
                a["path"].as_str().unwrap().to_string(),
                a["relation"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn listed(paths: impl IntoIterator<Item = String>, relation: &str) -> Vec<(String, String)> {
    paths
        .into_iter()
        .map(|p| (p, relation.to_string()))
        .collect()
}

fn xattr(fs: &Fs, path: &str, name: &str) -> Option<String> {
    let ino = fs.tree().find(path).unwrap();
    fs.getxattr(ino, name)
        .ok()
        .map(|v| String::from_utf8(v).unwrap())
}

const SHARERS: usize = 20_000;

/// The largest `.json` of a value whose bytes 20,000 paths share.
const JSON_BOUND: usize = 4096;

/// 20,000 values on one constant buffer: every `.json` stays small and lists 16 others in
/// tree order with their relation, `aliases_total` counts them all, and rendering all of
/// them is quick (it once listed every sharer in every file: quadratic).
#[test]
fn twenty_thousand_sharers_give_small_jsons_and_bounded_lists() {
    let fs = fs_of(shared_pte(SHARERS, None));
    // Each file is bounded, so listing them all costs time linear in their number.
    let forward = |i: usize| format!("plans/forward/values/{i}");
    for i in 0..SHARERS {
        let (len, j) = json_at(&fs, &format!("{}.json", forward(i)));
        assert!(len < JSON_BOUND, "{}.json is {len} bytes", forward(i));
        assert_eq!(j["aliases_total"], json!(SHARERS), "{}", forward(i));
        let want = listed(
            (0..17).filter(|&k| k != i).take(16).map(forward),
            "distinct",
        );
        assert_eq!(aliases(&j), want, "{}", forward(i));
    }
    let (_, j) = json_at(&fs, "plans/other/values/0.json");
    assert_eq!(j["aliases_total"], json!(SHARERS));
    assert_eq!(aliases(&j), listed((0..16).map(forward), "same_tensor"));
    // Values without bytes list nothing.
    let (_, j) = json_at(&fs, "plans/other/values/1.json");
    assert!(j.get("aliases").is_none(), "{j}");
    // The xattr: the same list in one line, and how many more there are.
    let list: Vec<String> = (1..17)
        .map(|k| format!("distinct:plans/forward/values/{k}"))
        .collect();
    let want = format!("{} (+{} more)", list.join(","), SHARERS - 16);
    for f in ["plans/forward/values/0.bin", "plans/forward/values/0.npy"] {
        assert_eq!(xattr(&fs, f, "user.ptefs.shared").as_deref(), Some(&*want));
        let ino = fs.tree().find(f).unwrap();
        assert!(fs
            .listxattr(ino)
            .unwrap()
            .contains(&"user.ptefs.shared".to_string()));
    }
    let other = xattr(&fs, "plans/other/values/0.bin", "user.ptefs.shared").unwrap();
    assert!(
        other.starts_with("same_tensor:plans/forward/values/0,same_tensor:plans/forward/values/1,")
    );
    assert!(other.ends_with(&format!(" (+{} more)", SHARERS - 16)));
}

/// What shares bytes in the fixtures, exactly: `two_methods.pte` uses one constant in both
/// plans; in `ext_shared`, `w1`/`w2` and `scale`/`offset` share a `.ptd` segment each, and each
/// EXTERNAL value is the key it names.
#[test]
fn relations_on_the_fixtures_that_share_bytes() {
    let open = |file: &str, data: &[&str]| {
        let dir = fixtures_dir();
        let data: Vec<PathBuf> = data.iter().map(|d| dir.join(d)).collect();
        ptefs::commands::open_fs(&dir.join(file), &data).unwrap()
    };
    let check = |fs: &Fs, path: &str, want: &[(&str, &str)]| {
        let (_, j) = json_at(fs, &format!("{path}.json"));
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(p, r)| (p.to_string(), r.to_string()))
            .collect();
        assert_eq!(aliases(&j), want, "{path}");
        assert_eq!(j["aliases_total"], json!(want.len()), "{path}");
        let shared = xattr(fs, &format!("{path}.bin"), "user.ptefs.shared");
        let line: Vec<String> = want.iter().map(|(p, r)| format!("{r}:{p}")).collect();
        assert_eq!(shared, (!want.is_empty()).then(|| line.join(",")), "{path}");
    };
    let fs = open("two_methods.pte", &[]);
    check(
        &fs,
        "plans/forward/values/0",
        &[("plans/relu_proj/values/0", "same_tensor")],
    );
    check(
        &fs,
        "plans/relu_proj/values/0",
        &[("plans/forward/values/0", "same_tensor")],
    );
    let fs = open("extra/ext_shared.pte", &["extra/ext_shared.ptd"]);
    let (v, k) = ("plans/forward/values/", "data/ext_shared/named_data/");
    let p = |a: &str, b: &str| format!("{a}{b}");
    let table: Vec<(String, Vec<(String, &str)>)> = vec![
        (
            p(v, "0"),
            vec![
                (p(v, "1"), "distinct"),
                (p(k, "w1"), "same_tensor"),
                (p(k, "w2"), "distinct"),
            ],
        ),
        (
            p(v, "1"),
            vec![
                (p(v, "0"), "distinct"),
                (p(k, "w1"), "distinct"),
                (p(k, "w2"), "same_tensor"),
            ],
        ),
        (p(v, "2"), vec![(p(k, "bias"), "same_tensor")]),
        (
            p(v, "3"),
            vec![
                (p(v, "4"), "distinct"),
                (p(k, "scale"), "same_tensor"),
                (p(k, "offset"), "distinct"),
            ],
        ),
        (
            p(v, "4"),
            vec![
                (p(v, "3"), "distinct"),
                (p(k, "scale"), "distinct"),
                (p(k, "offset"), "same_tensor"),
            ],
        ),
        (p(v, "5"), vec![(p(k, "steps"), "same_tensor")]),
        (
            p(k, "w1"),
            vec![
                (p(v, "0"), "same_tensor"),
                (p(v, "1"), "distinct"),
                (p(k, "w2"), "distinct"),
            ],
        ),
        (
            p(k, "w2"),
            vec![
                (p(v, "0"), "distinct"),
                (p(v, "1"), "same_tensor"),
                (p(k, "w1"), "distinct"),
            ],
        ),
        (p(k, "bias"), vec![(p(v, "2"), "same_tensor")]),
        (
            p(k, "scale"),
            vec![
                (p(v, "3"), "same_tensor"),
                (p(v, "4"), "distinct"),
                (p(k, "offset"), "distinct"),
            ],
        ),
        (
            p(k, "offset"),
            vec![
                (p(v, "3"), "distinct"),
                (p(v, "4"), "same_tensor"),
                (p(k, "scale"), "distinct"),
            ],
        ),
        (p(k, "steps"), vec![(p(v, "5"), "same_tensor")]),
    ];
    for (path, want) in &table {
        let want: Vec<(&str, &str)> = want.iter().map(|(a, r)| (a.as_str(), *r)).collect();
        check(&fs, path, &want);
    }
    // The .ptd alone: two keys on one segment are two tensors.
    let fs = open("extra/ext_shared.ptd", &[]);
    check(&fs, "named_data/w1", &[("named_data/w2", "distinct")]);
    check(
        &fs,
        "named_data/offset",
        &[("named_data/scale", "distinct")],
    );
    check(&fs, "named_data/steps", &[]);
    // Nothing shared: empty list, no xattr.
    let fs = open("linear.pte", &[]);
    check(&fs, "plans/forward/values/0", &[]);
}

/// The text cache stays within its budget while every file is read, and a text larger than
/// the whole budget (here `program.json`) is still served whole and right.
#[test]
fn text_cache_stays_within_its_budget() {
    let file = ModelFile::from_bytes(Path::new("shared.pte"), shared_pte(SHARERS, None)).unwrap();
    let mut tree = Tree::build(Arc::new(Model::from_files(vec![file]).unwrap()));
    const BUDGET: usize = 256 << 10;
    tree.set_text_budget(BUDGET);
    let fs = Fs::new(tree, Options { read_only: true });
    let program = fs.tree().find("program.json").unwrap();
    let size = fs.getattr(program).unwrap().size;
    assert!(
        size > 4 * BUDGET as u64,
        "program.json is only {size} bytes"
    );
    let mut total = 0u64;
    for (path, ino, kind) in walk(&fs) {
        if kind == FileType::Directory {
            continue;
        }
        let bytes = read_all(&fs, ino, 4096).unwrap();
        assert_eq!(bytes.len() as u64, fs.getattr(ino).unwrap().size, "{path}");
        total += bytes.len() as u64;
        assert!(fs.tree().text_cache().charged() <= BUDGET, "after {path}");
    }
    assert!(total > 10 * BUDGET as u64);
    // Evicted texts render again to the same bytes.
    let tree = fs.tree();
    let ino = tree.find("plans/forward/values/0.json").unwrap();
    let Some(ptefs::tree::Content::Text { kind, .. }) = tree.node(ino).map(|n| &n.content) else {
        panic!("a text");
    };
    let again = ptefs::tree::render::render_to_vec(&tree, ino, *kind);
    assert_eq!(&*tree.text(ino).unwrap(), &again[..]);
    let whole = read_all(&fs, program, 1 << 20).unwrap();
    serde_json::from_slice::<Value>(&whole).unwrap();
}

/// `node_count` is exact: it is what the limit compares, before anything is built.
#[test]
fn node_count_is_the_number_of_nodes_built() {
    for m in common::manifests() {
        let (file, data) = common::fixture_files(&m);
        let model = Model::open(&file, &data).unwrap();
        let n = node_count(&model);
        let tree = Tree::build(Arc::new(model));
        assert_eq!(n, tree.node_count(), "{}", file.display());
    }
    let file = ModelFile::from_bytes(Path::new("s.pte"), shared_pte(100, Some("k"))).unwrap();
    let model = Model::from_files(vec![file]).unwrap();
    let n = node_count(&model);
    assert_eq!(n, Tree::build(Arc::new(model)).node_count());
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Over the node limit, the offline commands refuse, naming the numbers and the option;
/// with the limit raised they work.
#[test]
fn offline_commands_refuse_a_tree_over_the_node_limit() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_temp(dir.path(), "big.pte", &shared_pte(1000, None));
    let model = Model::open(&file, &[] as &[PathBuf]).unwrap();
    let n = node_count(&model);
    let err = ptefs::commands::open_fs_limited(&file, &[], n - 1)
        .err()
        .expect("refused");
    let msg = err.to_string();
    for part in [
        &n.to_string(),
        &(n - 1).to_string(),
        "--max-nodes",
        "big.pte",
    ] {
        assert!(msg.contains(part), "{msg} lacks {part}");
    }
    assert!(ptefs::commands::open_fs_limited(&file, &[], n).is_ok());
    for cmd in [
        vec!["ls", "-l"],
        vec!["cat", "", "header.json"],
        vec!["info"],
        vec!["check"],
    ] {
        let run = |limit: u64| {
            let mut c = Command::new(BIN);
            c.arg(cmd[0]).arg(&file);
            c.args(cmd[1..].iter().filter(|a| !a.is_empty()));
            c.arg("--max-nodes").arg(limit.to_string());
            c.output().unwrap()
        };
        let out = run(1000);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{cmd:?}");
        assert!(
            stderr.contains("more than the limit of 1000") && stderr.contains("--max-nodes"),
            "{cmd:?}: {stderr}"
        );
        let out = run(n);
        assert!(out.status.success(), "{cmd:?}: {out:?}");
    }
    // The default allows it.
    let out = Command::new(BIN).arg("info").arg(&file).output().unwrap();
    assert!(out.status.success());
}

/// A key of 5,000 bytes: listed under a shortened name of at most 255 bytes (with `.json`),
/// readable, its `.json` showing the whole key; `check` reports it.
#[test]
fn a_long_key_is_shown_shortened_and_check_reports_it() {
    let key = "k".repeat(5000);
    let fs = fs_of(shared_pte(2, Some(&key)));
    let tree = fs.tree();
    let dir = tree.find("named_data").unwrap();
    let names: Vec<String> = fs
        .list(dir)
        .unwrap()
        .into_iter()
        .skip(2)
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    for n in &names {
        assert!(n.len() <= 255, "{} bytes", n.len());
    }
    let base = names[0].strip_suffix(".bin").unwrap();
    assert_eq!(names[1], format!("{base}.json"));
    // printf %s "$(printf 'k%.0s' $(seq 5000))" | sha256sum | cut -c1-16
    assert_eq!(base, format!("{}~622b8b1d5094d382", "k".repeat(233)));
    let (_, j) = json_at(&fs, &format!("named_data/{base}.json"));
    assert_eq!(j["key"], json!(key));
    let bin = tree.find(&format!("named_data/{base}.bin")).unwrap();
    assert_eq!(read_all(&fs, bin, 4096).unwrap(), b"longkey!");
    let mut defects = ptefs::check::defects(&tree.model);
    ptefs::commands::shortened_names(&tree.model, &mut defects);
    assert_eq!(defects.len(), 1, "{defects:?}");
    assert!(
        defects[0].contains("named_data[0] key")
            && defects[0].contains("(5000 bytes)")
            && defects[0].contains(&format!("named_data/{base}.json")),
        "{}",
        defects[0]
    );
    // The same name on every opening.
    let again = fs_of(shared_pte(2, Some(&key)));
    assert!(again
        .tree()
        .find(&format!("named_data/{base}.json"))
        .is_some());
}

/// A long plan name gets a shortened directory name too.
#[test]
fn a_long_plan_name_is_shortened() {
    let mut program_bytes = shared_pte(1, None);
    // Rename "other" by rebuilding: simplest through the generated tables.
    let (end, base) = {
        let b = &program_bytes;
        let u = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
        (u(16), u(24))
    };
    let mut program = flatbuffers::root::<pte_fb::Program>(&program_bytes[..end])
        .unwrap()
        .unpack();
    let long = "p".repeat(300);
    program.execution_plan.as_mut().unwrap()[1].name = Some(long.clone());
    let data = program_bytes.split_off(base);
    let (mut bytes, new_base) = pte_program_region(
        &pack_program(&program, 16),
        16,
        128,
        data.len() as u64,
        true,
    );
    bytes.resize(new_base as usize, 0);
    bytes.extend_from_slice(&data);
    let fs = fs_of(bytes);
    let tree = fs.tree();
    let plans = tree.find("plans").unwrap();
    let names: Vec<String> = fs
        .list(plans)
        .unwrap()
        .into_iter()
        .skip(2)
        .map(|e| e.name)
        .collect();
    assert_eq!(names[0], "forward");
    assert_eq!(names[1].len(), 255);
    assert!(names[1].starts_with("pppp") && names[1].contains('~'));
    let (_, j) = json_at(&fs, &format!("plans/{}/plan.json", names[1]));
    assert_eq!(j["name"], json!(long));
    let mut defects = ptefs::check::defects(&tree.model);
    ptefs::commands::shortened_names(&tree.model, &mut defects);
    assert!(
        defects.iter().any(|d| d.starts_with("plan 1 name")),
        "{defects:?}"
    );
}

// Real mounts.

fn is_mounted(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    table.lines().any(|l| l.split(' ').nth(4) == Some(want))
}

/// A daemon in the foreground (so its pid is known), unmounted when dropped.
struct Daemon {
    child: Child,
    mnt: PathBuf,
}

impl Daemon {
    fn start(model: &Path, mnt: &Path, args: &[&str]) -> Daemon {
        let log = mnt.with_extension("log");
        let child = Command::new(BIN)
            .arg("mount")
            .arg(model)
            .arg(mnt)
            .arg("--foreground")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child,
            mnt: mnt.to_path_buf(),
        };
        let t = Instant::now();
        while !is_mounted(mnt) {
            if let Some(status) = d.child.try_wait().unwrap() {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("ptefs mount --foreground exited: {status}: {said}");
            }
            assert!(t.elapsed() < Duration::from_secs(60), "not mounted");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// Peak resident memory of the daemon, in bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kib << 10
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .arg("umount")
            .arg(&self.mnt)
            .stdin(Stdio::null())
            .output();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn getfattr(path: &Path, name: &str) -> Option<String> {
    let out = Command::new("getfattr")
        .arg("--only-values")
        .arg("-n")
        .arg(name)
        .arg(path)
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap())
}

/// The daemon's peak memory while `ls -l` lists the 20,000-sharer values directory.
const DAEMON_RSS_BOUND: u64 = 512 << 20;

/// `ls -l` of 20,000 values sharing one buffer, through a real mount: it completes, quickly,
/// the daemon stays small, every `.json` is small, and the xattr reads through `getfattr`.
#[test]
fn ls_l_of_twenty_thousand_sharers_through_a_mount() {
    if fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let model = write_temp(&root, "shared.pte", &shared_pte(SHARERS, None));
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let d = Daemon::start(&model, &mnt, &[]);
    let values = mnt.join("plans/forward/values");
    let t = Instant::now();
    let out = Command::new("ls")
        .arg("-l")
        .arg(&values)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // Reported, not asserted: these machines are shared and noisy.
    let took = t.elapsed();
    assert!(out.status.success(), "{out:?}");
    let listing = String::from_utf8(out.stdout).unwrap();
    // A "total" line, then .bin, .hist.svg, .json and .npy of each value.
    assert_eq!(listing.lines().count(), 1 + 4 * SHARERS);
    for line in listing.lines().filter(|l| l.ends_with(".json")) {
        let size: usize = line.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!(size < JSON_BOUND, "{line}");
    }
    let peak = d.peak_rss();
    assert!(
        peak < DAEMON_RSS_BOUND,
        "daemon peak RSS {} MiB",
        peak >> 20
    );
    eprintln!(
        "ls -l of {} entries: {took:?}; daemon peak RSS {} MiB",
        4 * SHARERS,
        peak >> 20
    );
    let j: Value =
        serde_json::from_slice(&std::fs::read(values.join("19999.json")).unwrap()).unwrap();
    assert_eq!(j["aliases_total"], json!(SHARERS));
    let shared = getfattr(&values.join("5.bin"), "user.ptefs.shared").unwrap();
    assert!(
        shared.starts_with("distinct:plans/forward/values/0,distinct:plans/forward/values/1,")
            && shared.ends_with(&format!(" (+{} more)", SHARERS - 16)),
        "{shared}"
    );
    assert!(!shared.contains("values/5,"));
    let linear = fixtures_dir().join("linear.pte");
    let mnt2 = root.join("mnt2");
    std::fs::create_dir(&mnt2).unwrap();
    let _d2 = Daemon::start(&linear, &mnt2, &[]);
    assert_eq!(
        getfattr(
            &mnt2.join("plans/forward/values/0.bin"),
            "user.ptefs.shared"
        ),
        None
    );
}

/// `ptefs mount` refuses a file over `--max-nodes` (or `-o max_nodes=`) with a message
/// naming the numbers and the option; with a higher limit it mounts.
#[test]
fn mount_refuses_a_tree_over_the_node_limit_and_mounts_with_a_higher_one() {
    if fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let model = write_temp(&root, "big.pte", &shared_pte(1000, None));
    let n = node_count(&Model::open(&model, &[] as &[PathBuf]).unwrap());
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    for args in [
        vec!["--max-nodes".to_string(), "1000".to_string()],
        vec!["-o".to_string(), "max_nodes=1000".to_string()],
        vec!["-o".to_string(), "ro,max_nodes=1000".to_string()],
    ] {
        let out = Command::new(BIN)
            .arg("mount")
            .arg(&model)
            .arg(&mnt)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} mounted");
        assert!(!is_mounted(&mnt));
        assert!(
            stderr.contains(&format!("its tree would have {n} nodes"))
                && stderr.contains("more than the limit of 1000")
                && stderr.contains("--max-nodes"),
            "{args:?}: {stderr}"
        );
    }
    let limit = n.to_string();
    let d = Daemon::start(&model, &mnt, &["--max-nodes", &limit]);
    assert!(mnt.join("plans/forward/values/999.json").exists());
    drop(d);
    let d = Daemon::start(&model, &mnt, &["-o", &format!("max_nodes={limit}")]);
    assert!(mnt.join("plans/other/values/0.bin").exists());
    drop(d);
}

/// A 5,000-byte key through a real mount: `ls` lists it (it once failed with EIO for every
/// entry of the directory), `cat` reads it, its `.json` holds the whole key, and
/// `ptefs check` reports the shortened name.
#[test]
fn a_long_key_lists_and_reads_through_a_mount() {
    if fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let key = "k".repeat(5000);
    let model = write_temp(&root, "long.pte", &shared_pte(2, Some(&key)));
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _d = Daemon::start(&model, &mnt, &[]);
    let out = Command::new("ls")
        .arg("-l")
        .arg(mnt.join("named_data"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let listing = String::from_utf8(out.stdout).unwrap();
    let base = format!("{}~622b8b1d5094d382", "k".repeat(233));
    assert!(listing.contains(&format!("{base}.bin")), "{listing}");
    assert!(listing.contains(&format!("{base}.json")), "{listing}");
    let bin = std::fs::read(mnt.join(format!("named_data/{base}.bin"))).unwrap();
    assert_eq!(bin, b"longkey!");
    let j: Value = serde_json::from_slice(
        &std::fs::read(mnt.join(format!("named_data/{base}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(j["key"], json!(key));
    let out = Command::new(BIN).arg("check").arg(&model).output().unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("longer than a file name can be")
            && stdout.contains(&format!("named_data/{base}.json")),
        "{stdout}"
    );
}

/// A plan whose lists are huge and hostile: 3,000 inputs naming one tensor of 100,000
/// dimensions, indices out of range, an IntList whose items are not all Ints, and 40 plans.
/// `plan.json` describes 256 inputs with the long tensor's dimensions left out (written 256
/// times they would be 77 MB), and `info` stays one screen.
#[test]
fn signatures_and_info_of_huge_plans_stay_bounded() {
    let long = mk!(pte_fb::EValueT {
        val: pte_fb::KernelTypesT::Tensor(Box::new(mk!(pte_fb::TensorT {
            scalar_type: pte_fb::ScalarType::FLOAT,
            sizes: Some(vec![1; 100_000]),
            dim_order: Some(vec![]),
        }))),
    });
    let int = mk!(pte_fb::EValueT {
        val: pte_fb::KernelTypesT::Int(Box::new(mk!(pte_fb::IntT { int_val: 7 }))),
    });
    let list = mk!(pte_fb::EValueT {
        val: pte_fb::KernelTypesT::IntList(Box::new(mk!(pte_fb::IntListT {
            items: Some(vec![1, 0, 99_999_999, -1]),
        }))),
    });
    let mut forward = plan("forward", vec![long, int, list]);
    let mut inputs = vec![5_000_000, -3, 1];
    inputs.extend(std::iter::repeat_n(0, 3000));
    forward.inputs = Some(inputs);
    forward.outputs = Some(vec![1]);
    let mut plans = vec![forward];
    plans.extend((0..39).map(|i| plan(&format!("m{i}"), vec![])));
    let program = mk!(pte_fb::ProgramT {
        execution_plan: Some(plans),
        constant_buffer: Some(vec![]),
        backend_delegate_data: Some(vec![]),
        segments: Some(vec![]),
        named_data: Some(vec![]),
        mutable_data_segments: Some(vec![]),
    });
    let (bytes, _) = pte_program_region(&pack_program(&program, 16), 16, 0, 0, true);
    let fs = fs_of(bytes);

    let (len, j) = json_at(&fs, "plans/forward/plan.json");
    assert!(len < 128 << 10, "plan.json is {len} bytes");
    let sig = &j["signature"];
    assert_eq!(sig["inputs"].as_array().unwrap().len(), 256);
    assert_eq!(sig["inputs_total"], 3003);
    assert_eq!(sig["inputs"][0]["type"], Value::Null);
    let defect = sig["inputs"][0]["defect"].as_str().unwrap();
    assert!(defect.contains("5000000 out of range"), "{defect}");
    assert!(sig["inputs"][1]["defect"].as_str().unwrap().contains("-3"));
    assert_eq!(
        sig["inputs"][2],
        json!({"index": 1, "type": "Int", "value": 7})
    );
    let t = &sig["inputs"][3];
    assert_eq!((&t["type"], &t["sizes"]), (&json!("Tensor"), &Value::Null));
    assert!(
        t["defect"].as_str().unwrap().contains("100000 dimensions"),
        "{t}"
    );
    assert_eq!(
        sig["outputs"],
        json!([{"index": 1, "type": "Int", "value": 7}])
    );

    let (_, l) = json_at(&fs, "plans/forward/values/2.json");
    assert_eq!(l["items"], json!([1, 0, 99_999_999, -1]));
    assert_eq!(l["values"], json!([7, null, null, null]));

    let mut out = Vec::new();
    ptefs::commands::info(&fs, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.lines().count() <= 40, "{text}");
    assert!(text.len() < 8 << 10, "{text}");
    for line in [
        "    input 0: %5000000 (value index 5000000 out of range (expected 0 to 2, the plan's values))",
        "    input 2: %1 Int 7",
        "    … 2995 more inputs (plan.json describes 256)",
        "  … 24 more plans (ptefs ls FILE plans)",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let input3 = text
        .lines()
        .find(|l| l.starts_with("    input 3:"))
        .unwrap();
    assert!(input3.contains("100000 dimensions"), "{input3}");
}

/// An XNNPACK filter whose dims say `[2^31, 3, 3, 2]` while its bytes hold `[4, 3, 3, 2]`
/// (a 154 GB float32 view): the tree shows the value's `.json` and `.bin`, and no `.npy` or
/// `.f32.npy` that every read of would fail; `node_count` agrees, every file listed reads,
/// and `check` names the size.
#[test]
fn payload_views_the_bytes_cannot_back_are_not_listed() {
    let mut bytes = common::fixture_bytes("extra/xnn_qc8_conv.pte");
    // The dims vector of the first convolution's filter: length 4, then [4, 3, 3, 2].
    let dims: Vec<u8> = [4u32, 4, 3, 3, 2]
        .iter()
        .flat_map(|d| d.to_le_bytes())
        .collect();
    let at: Vec<usize> = bytes
        .windows(dims.len())
        .enumerate()
        .filter(|(_, w)| *w == dims)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "{at:?}");
    bytes[at[0] + 4..at[0] + 8].copy_from_slice(&(1u32 << 31).to_le_bytes());
    let values = "plans/forward/delegates/0/xnnpack/values";
    let file = ModelFile::from_bytes(Path::new("huge.pte"), bytes.clone()).unwrap();
    let model = Model::from_files(vec![file]).unwrap();
    let n = node_count(&model);
    let tree = Tree::build(Arc::new(model));
    assert_eq!(n, tree.node_count());
    let fs = Fs::new(tree, Options { read_only: true });
    let (_, j) = json_at(&fs, &format!("{values}/3.json"));
    assert_eq!(j["dims"], json!([1u64 << 31, 3, 3, 2]));
    assert!(fs.tree().find(&format!("{values}/3.bin")).is_some());
    for view in ["3.npy", "3.f32.npy", "3.hist.svg"] {
        assert!(
            fs.tree().find(&format!("{values}/{view}")).is_none(),
            "{view}"
        );
    }
    // The other filter keeps its views.
    for view in ["6.npy", "6.f32.npy", "6.hist.svg"] {
        assert!(
            fs.tree().find(&format!("{values}/{view}")).is_some(),
            "{view}"
        );
    }
    for (path, ino, kind) in walk(&fs) {
        if kind == FileType::RegularFile {
            let size = fs.getattr(ino).unwrap().size;
            assert!(size < 1 << 20, "{path}: {size} bytes");
            read_all(&fs, ino, 4096).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write_temp(dir.path(), "huge.pte", &bytes);
    let out = Command::new(BIN).arg("check").arg(&path).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        said.contains("value %3 (qcint8[2147483648,3,3,2]): named data")
            && said.contains("is 72 bytes, expected 38654705664"),
        "{said}"
    );
}

/// A `.pte` whose plan `forward` has `n` Null values, all one table (4 bytes of the file
/// each, as a crafted file may have them), and no segment.
fn null_values_pte(n: usize) -> Vec<u8> {
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let null = pte_fb::Null::create(&mut fbb, &pte_fb::NullArgs {});
    let value = pte_fb::EValue::create(
        &mut fbb,
        &pte_fb::EValueArgs {
            val_type: pte_fb::KernelTypes::Null,
            val: Some(null.as_union_value()),
        },
    );
    let values = fbb.create_vector(&vec![value; n]);
    let shell = plan("forward", vec![]);
    let chains: Vec<_> = shell
        .chains
        .iter()
        .flatten()
        .map(|c| c.pack(&mut fbb))
        .collect();
    let chains = fbb.create_vector(&chains);
    let operators: Vec<_> = shell
        .operators
        .iter()
        .flatten()
        .map(|o| o.pack(&mut fbb))
        .collect();
    let operators = fbb.create_vector(&operators);
    let name = fbb.create_string("forward");
    let empty = fbb.create_vector::<i32>(&[]);
    let delegates = fbb.create_vector::<flatbuffers::ForwardsUOffset<pte_fb::BackendDelegate>>(&[]);
    let sizes = fbb.create_vector::<i64>(&[0]);
    let plan = pte_fb::ExecutionPlan::create(
        &mut fbb,
        &pte_fb::ExecutionPlanArgs {
            name: Some(name),
            values: Some(values),
            inputs: Some(empty),
            outputs: Some(empty),
            chains: Some(chains),
            operators: Some(operators),
            delegates: Some(delegates),
            non_const_buffer_sizes: Some(sizes),
            ..Default::default()
        },
    );
    let plans = fbb.create_vector(&[plan]);
    let offsets = fbb.create_vector::<u64>(&[0]);
    let constant_segment = pte_fb::SubsegmentOffsets::create(
        &mut fbb,
        &pte_fb::SubsegmentOffsetsArgs {
            segment_index: 0,
            offsets: Some(offsets),
        },
    );
    let root = pte_fb::Program::create(
        &mut fbb,
        &pte_fb::ProgramArgs {
            execution_plan: Some(plans),
            constant_segment: Some(constant_segment),
            ..Default::default()
        },
    );
    fbb.finish(root, Some("ET12"));
    pte_program_region(fbb.finished_data(), 16, 128, 0, false).0
}

fn peak_of(args: &[&std::ffi::OsStr]) -> u64 {
    let stats = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(stats.path())
        .arg(BIN)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = std::fs::read_to_string(stats.path()).unwrap();
    said.trim().lines().last().unwrap().parse::<u64>().unwrap() << 10
}

/// A million Null values, 4 bytes of the file each (one table shared by all): `info` and
/// `check` take memory in proportion to the file, the daemon in proportion to the file until
/// `values/` is looked into and then to the tree's nodes too (one per value, within
/// --max-nodes), and reading the 79 MB
/// `program.json` through the mount adds next to nothing to its peak (it is rendered a
/// window at a time). The figures are printed; they once were 10 times the file's size for
/// `check`, 90 times for `info`, and `program.json` held whole while read.
#[test]
fn a_million_null_values_cost_memory_in_proportion() {
    const VALUES: usize = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let bytes = null_values_pte(VALUES);
    let file = bytes.len() as u64;
    let model = write_temp(&root, "nulls.pte", &bytes);
    // What the process takes anyway (about 7 MiB), and per byte of the file: the parsed
    // program (16 bytes a value) and its layout (8 bytes a value).
    let justified = (16 << 20) + 8 * file;
    for cmd in ["info", "check"] {
        let peak = peak_of(&[cmd.as_ref(), model.as_os_str()]);
        eprintln!(
            "ptefs {cmd}: peak RSS {} MiB for a {} MiB file",
            peak >> 20,
            file >> 20
        );
        assert!(peak < justified, "ptefs {cmd}: peak RSS {} MiB", peak >> 20);
    }
    if fuse_missing() {
        return;
    }
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let d = Daemon::start(&model, &mnt, &[]);
    // Until `values/` is listed, the tree holds no node per value.
    let started = d.peak_rss();
    eprintln!("mount: daemon peak RSS {} MiB", started >> 20);
    assert!(started < justified, "mount: {} MiB", started >> 20);
    // Looked into, it holds a node per value (`.json`), about 220 bytes each with its name.
    let last = format!("plans/forward/values/{}.json", VALUES - 1);
    assert!(mnt.join(last).is_file());
    let mounted = d.peak_rss();
    let nodes = VALUES as u64 + 16;
    eprintln!(
        "after a look into values/: daemon peak RSS {} MiB",
        mounted >> 20
    );
    assert!(
        mounted < justified + nodes * 320,
        "mount: {} MiB",
        mounted >> 20
    );
    let json = std::fs::read(mnt.join("program.json")).unwrap();
    assert!(json.len() > 70_000_000);
    let v: Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(
        v["execution_plan"][0]["values"][VALUES - 1],
        json!({"val": {"type": "Null"}})
    );
    drop((v, json));
    let read = d.peak_rss();
    eprintln!(
        "after reading program.json: daemon peak RSS {} MiB",
        read >> 20
    );
    assert!(
        read - mounted < 16 << 20,
        "reading program.json raised the daemon's peak by {} MiB",
        (read - mounted) >> 20
    );
}
