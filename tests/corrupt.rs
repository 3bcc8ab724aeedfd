//! Corrupted fixtures must never crash ptefs: a deterministic corpus (truncations, byte
//! flips, absurd header fields, out-of-range offsets, sizes and indices) goes through parsing,
//! tree building, rendering of every text, reading of every file and `check`, and a sample of
//! it through the `ptefs` binary, offline and mounted for real (which needs `/dev/fuse` and
//! the right to mount; see `common::fuse_missing`). Every refusal
//! carries a message naming the problem.
//!
//! Also: a model file truncated on disk while open gives EIO, never SIGBUS; inputs that once
//! took quadratic time or memory stay fast. `PTEFS_CORRUPT_VERBOSE=1` prints every case, its
//! time and outcome (run with `--nocapture`).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fixture_files, manifests, read_all, walk};
use ptefs::format::generated::{ptd_fb, pte_fb};
use ptefs::format::writer::{
    pack_flat_tensor, pack_program, ptd_program_region, pte_program_region,
};
use ptefs::format::Model;
use ptefs::format::{Kind, ModelFile};
use ptefs::fs::{FileType, Fs, Options};
use ptefs::tree::Tree;

/// A generated table with some fields set (the generated structs are non-exhaustive).
macro_rules! mk {
    ($t:path { $($f:ident : $v:expr),* $(,)? }) => {{
        let mut x = <$t>::default();
        $(x.$f = $v;)*
        x
    }};
}

/// xorshift64*: the corpus is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// One corrupted input: the files to open (index 0 is the model file, the rest attached
/// `.ptd` files) and, when the corruption must be refused, words one of which the refusal
/// names.
struct Case {
    name: String,
    files: Vec<(PathBuf, Vec<u8>)>,
    must_refuse: Option<&'static [&'static str]>,
    /// Whether it must be refused or opened with at least one defect from `check`.
    must_flag: bool,
}

#[derive(Debug)]
enum Outcome {
    Refused(String),
    /// Opened; how many defects `check` found.
    Opened(usize),
}

/// Everything a user can do with an opened file, on files held in memory.
fn exercise(files: &[(PathBuf, Vec<u8>)]) -> Outcome {
    let mut parsed = Vec::new();
    for (path, bytes) in files {
        match ModelFile::from_bytes(path, bytes.clone()) {
            Ok(f) => parsed.push(f),
            Err(e) => return Outcome::Refused(e.message().to_string()),
        }
    }
    let model = match Model::from_files(parsed) {
        Ok(m) => m,
        Err(e) => return Outcome::Refused(e.message().to_string()),
    };
    let tree = Tree::build(Arc::new(model));
    Outcome::Opened(use_tree(tree))
}

fn use_tree(tree: Tree) -> usize {
    let defects = ptefs::check::defects(&tree.model);
    for d in &defects {
        assert!(!d.trim().is_empty(), "an empty defect line");
    }
    let fs = Fs::new(tree, Options { read_only: true });
    for (path, ino, kind) in walk(&fs) {
        if kind == FileType::Directory {
            continue;
        }
        let bytes = read_all(&fs, ino, 1 << 20).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(bytes.len() as u64, fs.getattr(ino).unwrap().size, "{path}");
        if path.ends_with(".json") {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .unwrap_or_else(|e| panic!("{path}: not JSON: {e}"));
        }
        // A read straddling the .npy header and the data.
        let _ = fs.read(ino, 60, 100).unwrap();
        for name in fs.listxattr(ino).unwrap() {
            fs.getxattr(ino, &name).unwrap();
        }
    }
    let mut out = Vec::new();
    if let Err(e) = ptefs::offline::info(&fs, &mut out) {
        assert!(!e.message().is_empty());
    }
    ptefs::offline::ls(&fs, "", true, true, &mut Vec::new()).unwrap();
    defects.len()
}

struct Fixture {
    path: PathBuf,
    bytes: Vec<u8>,
    /// The `.ptd` files it is opened with.
    data: Vec<(PathBuf, Vec<u8>)>,
    /// For a `.ptd`: a `.pte` that attaches it, and that `.pte`'s other data files.
    user: Option<(PathBuf, Vec<u8>)>,
}

fn fixtures() -> Vec<Fixture> {
    let read = |p: &Path| std::fs::read(p).unwrap();
    let pairs: Vec<(PathBuf, Vec<PathBuf>)> =
        manifests().iter().map(|m| fixture_files(m)).collect();
    pairs
        .iter()
        .map(|(path, data)| Fixture {
            path: path.clone(),
            bytes: read(path),
            data: data.iter().map(|d| (d.clone(), read(d))).collect(),
            user: pairs
                .iter()
                .find(|(_, d)| d.contains(path))
                .map(|(p, _)| (p.clone(), read(p))),
        })
        .collect()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn has_eh00(b: &[u8]) -> bool {
    b.len() >= 16 && &b[8..12] == b"eh00"
}

fn is_ptd(b: &[u8]) -> bool {
    &b[4..8] == b"FT01"
}

/// Where the flatbuffer ends and the segment data begins.
fn regions(b: &[u8]) -> (usize, usize) {
    if is_ptd(b) {
        (
            (u64_at(b, 16) + u64_at(b, 24)) as usize,
            u64_at(b, 32) as usize,
        )
    } else if has_eh00(b) {
        (u64_at(b, 16) as usize, u64_at(b, 24) as usize)
    } else {
        (b.len(), b.len())
    }
}

/// A case of the fixture with `bytes` in place of the fixture's own; a corrupted `.ptd` is
/// also tried attached to a `.pte` that uses it.
fn cases_of(
    f: &Fixture, name: String, bytes: Vec<u8>, must_refuse: Option<&'static [&'static str]>,
) -> Vec<Case> {
    let mut files = vec![(f.path.clone(), bytes.clone())];
    files.extend(f.data.iter().cloned());
    let mut out = vec![Case {
        name: name.clone(),
        files,
        must_refuse,
        must_flag: false,
    }];
    if let Some((pte, pte_bytes)) = &f.user {
        out.push(Case {
            name: format!("{name} attached to {}", pte.display()),
            files: vec![(pte.clone(), pte_bytes.clone()), (f.path.clone(), bytes)],
            must_refuse,
            must_flag: false,
        });
    }
    out
}

fn truncations(f: &Fixture, out: &mut Vec<Case>) {
    let len = f.bytes.len();
    let stride = (len / 97).max(1);
    let mut cuts: Vec<usize> = (0..len.min(160)).collect();
    cuts.extend((160..len).step_by(stride));
    cuts.extend(len.saturating_sub(8)..len);
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts {
        let name = format!("{} truncated to {cut}", f.path.display());
        // With eh00/FH01 the header says how long the file is: every cut must be refused.
        let refuse: Option<&'static [&'static str]> =
            (has_eh00(&f.bytes) || is_ptd(&f.bytes)).then_some(&[""]);
        out.extend(cases_of(f, name, f.bytes[..cut].to_vec(), refuse));
    }
}

fn flips(f: &Fixture, rng: &mut Rng, n: usize, out: &mut Vec<Case>) {
    let (program_end, _) = regions(&f.bytes);
    for k in 0..n {
        let mut b = f.bytes.clone();
        let flips = 1 + rng.below(4);
        let mut what = Vec::new();
        for _ in 0..flips {
            // Most flips in the flatbuffer, some in the fixed headers.
            let at = if rng.below(5) == 0 {
                rng.below(48.min(b.len() as u64)) as usize
            } else {
                8 + rng.below(program_end as u64 - 8) as usize
            };
            let v = match rng.below(4) {
                0 => 0xff,
                1 => 0x00,
                2 => b[at] ^ (1 << rng.below(8)),
                _ => rng.next() as u8,
            };
            b[at] = v;
            what.push(format!("{at}={v:#x}"));
        }
        let name = format!("{} flip #{k} [{}]", f.path.display(), what.join(" "));
        out.extend(cases_of(f, name, b, None));
    }
}

const HUGE: u64 = 1 << 62;

fn header_fields(f: &Fixture, out: &mut Vec<Case>) {
    let len = f.bytes.len() as u64;
    let (program_end, base) = regions(&f.bytes);
    let (program_end, base) = (program_end as u64, base as u64);
    let mut push = |name: String, b: Vec<u8>, refuse: Option<&'static [&'static str]>| {
        out.extend(cases_of(
            f,
            format!("{} {name}", f.path.display()),
            b,
            refuse,
        ));
    };
    let set32 = |at: usize, v: u32| {
        let mut b = f.bytes.clone();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        b
    };
    let set64 = |at: usize, v: u64| {
        let mut b = f.bytes.clone();
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    const ROOT: &[&str] = &["root table offset"];
    for v in [
        0u32,
        4,
        7,
        len as u32,
        len as u32 - 3,
        u32::MAX,
        0x8000_0000,
    ] {
        push(format!("root offset {v}"), set32(0, v), Some(ROOT));
    }
    for v in [8u32, program_end as u32 - 4, program_end as u32 / 2 + 1] {
        push(format!("root offset {v}"), set32(0, v), None);
    }
    for id in [b"ET13", b"FT02", b"\0\0\0\0", b"et12"] {
        let mut b = f.bytes.clone();
        b[4..8].copy_from_slice(id);
        push(format!("identifier {id:?}"), b, Some(&["identifier"]));
    }
    let mut b = f.bytes.clone();
    b[4..8].copy_from_slice(if is_ptd(&f.bytes) { b"ET12" } else { b"FT01" });
    push("identifier of the other kind".into(), b, None);
    if is_ptd(&f.bytes) {
        const FH01: &[&str] = &["FH01"];
        for v in [0u32, 39, 41, 1000, len as u32, u32::MAX] {
            let refuse = (v < 40 || v as u64 + 8 > len).then_some(FH01);
            push(format!("FH01 length {v}"), set32(12, v), refuse);
        }
        let mut b = f.bytes.clone();
        b[8..12].copy_from_slice(b"FH02");
        push("FH01 magic".into(), b, Some(FH01));
        for (at, field) in [
            (16, "flatbuffer_offset"),
            (24, "flatbuffer_size"),
            (32, "segment_base_offset"),
            (40, "segment_data_size"),
        ] {
            for v in [len + 1, HUGE, u64::MAX, u64::MAX - 7] {
                push(format!("{field} {v}"), set64(at, v), Some(&["FH01"]));
            }
            for v in [0, 1, 48, program_end, base, len] {
                push(format!("{field} {v}"), set64(at, v), None);
            }
        }
        return;
    }
    if !has_eh00(&f.bytes) {
        // A bare flatbuffer: put an absurd eh00 in front of it.
        let mut b = f.bytes.clone();
        b[8..12].copy_from_slice(b"eh00");
        push("eh00 spliced over a bare flatbuffer".into(), b, None);
        return;
    }
    const LEN: &[&str] = &["eh00"];
    for v in [0u32, 1, 23] {
        push(
            format!("eh00 length {v}"),
            set32(12, v),
            Some(&["eh00 header length"]),
        );
    }
    for v in [len as u32, u32::MAX, 0x8000_0000] {
        push(format!("eh00 length {v}"), set32(12, v), Some(LEN));
    }
    for v in [24u32, 25, 31, 33, 40, 64] {
        push(format!("eh00 length {v}"), set32(12, v), None);
    }
    let mut b = f.bytes.clone();
    b[8..12].copy_from_slice(b"eh01");
    push("eh01 magic".into(), b, None);
    const PS: &[&str] = &["program_size", "root table offset"];
    for v in [len + 1, HUGE, u64::MAX, u64::MAX - 7, 0, 1, 39] {
        push(format!("program_size {v}"), set64(16, v), Some(PS));
    }
    for v in [40, 64, program_end - 1, program_end + 1, base, len] {
        push(format!("program_size {v}"), set64(16, v), None);
    }
    const SB: &[&str] = &["segment_base_offset", "segment data"];
    for v in [len + 1, HUGE, u64::MAX, u64::MAX - 7, 1, program_end - 1] {
        push(format!("segment_base_offset {v}"), set64(24, v), Some(SB));
    }
    for v in [0, program_end, base - 1, base + 1, len] {
        push(format!("segment_base_offset {v}"), set64(24, v), None);
    }
    const SD: &[&str] = &["segment_data_size"];
    for v in [len - base + 1, len, HUGE, u64::MAX, u64::MAX - base + 1] {
        push(format!("segment_data_size {v}"), set64(32, v), Some(SD));
    }
    for v in [0, 1, len - base - 1] {
        push(format!("segment_data_size {v}"), set64(32, v), None);
    }
}

/// A `.pte` rebuilt from `program` with the fixture's segment data after it.
fn rebuild_pte(orig: &[u8], program: &pte_fb::ProgramT) -> Vec<u8> {
    let (_, base) = regions(orig);
    let data = &orig[base.min(orig.len())..];
    let fb = pack_program(program, 16);
    let (mut out, new_base) = pte_program_region(&fb, 16, 128, data.len() as u64, true);
    out.resize(new_base as usize, 0);
    out.extend_from_slice(data);
    out
}

fn rebuild_ptd(orig: &[u8], ft: &ptd_fb::FlatTensorT) -> Vec<u8> {
    let (_, base) = regions(orig);
    let data = &orig[base..];
    let fb = pack_flat_tensor(ft);
    let (mut out, new_base) = ptd_program_region(&fb, 128, data.len() as u64);
    out.resize(new_base as usize, 0);
    out.extend_from_slice(data);
    out
}

fn program_of(b: &[u8]) -> pte_fb::ProgramT {
    let (end, _) = regions(b);
    flatbuffers::root::<pte_fb::Program>(&b[..end])
        .unwrap()
        .unpack()
}

fn flat_tensor_of(b: &[u8]) -> ptd_fb::FlatTensorT {
    let (end, _) = regions(b);
    flatbuffers::root::<ptd_fb::FlatTensor>(&b[..end])
        .unwrap()
        .unpack()
}

type PteEdit = Box<dyn Fn(&mut pte_fb::ProgramT) -> bool>;

fn tensors(p: &mut pte_fb::ProgramT) -> Vec<&mut pte_fb::TensorT> {
    p.execution_plan
        .iter_mut()
        .flatten()
        .flat_map(|plan| plan.values.iter_mut().flatten())
        .filter_map(|v| match &mut v.val {
            pte_fb::KernelTypesT::Tensor(t) => Some(&mut **t),
            _ => None,
        })
        .collect()
}

fn plans(p: &mut pte_fb::ProgramT) -> Vec<&mut pte_fb::ExecutionPlanT> {
    p.execution_plan.iter_mut().flatten().collect()
}

/// Applies `f` to the first tensor that `pick` accepts, or to all of them with `all`.
fn on_tensors(
    all: bool, pick: fn(&pte_fb::TensorT) -> bool, f: impl Fn(&mut pte_fb::TensorT) + 'static,
) -> PteEdit {
    Box::new(move |p| {
        let mut any = false;
        for t in tensors(p).into_iter().filter(|t| pick(t)) {
            f(t);
            any = true;
            if !all {
                break;
            }
        }
        any
    })
}

fn with_bytes(t: &pte_fb::TensorT) -> bool {
    t.data_buffer_idx > 0
}

fn any_tensor(_: &pte_fb::TensorT) -> bool {
    true
}

fn instructions(p: &mut pte_fb::ProgramT) -> Vec<&mut pte_fb::InstructionT> {
    p.execution_plan
        .iter_mut()
        .flatten()
        .flat_map(|plan| plan.chains.iter_mut().flatten())
        .flat_map(|c| c.instructions.iter_mut().flatten())
        .collect()
}

fn pte_edits() -> Vec<(String, PteEdit)> {
    use pte_fb::{InstructionArgumentsT as I, KernelTypesT as K};
    let mut e: Vec<(String, PteEdit)> = Vec::new();
    let mut add = |name: &str, f: PteEdit| e.push((name.to_string(), f));
    for (k, v) in [(0usize, u64::MAX), (0, HUGE), (1, u64::MAX), (1, 1 << 40)] {
        add(
            &format!("segment offset/size field {k} = {v}"),
            Box::new(move |p| {
                let Some(s) = p.segments.as_mut().and_then(|s| s.last_mut()) else {
                    return false;
                };
                if k == 0 {
                    s.offset = v;
                } else {
                    s.size = v;
                }
                true
            }),
        );
    }
    add(
        "segment offset + size overflow",
        Box::new(|p| {
            if let Some(s) = p.segments.as_mut().and_then(|s| s.first_mut()) {
                s.offset = HUGE * 3;
                s.size = HUGE * 2;
            }
            true
        }),
    );
    add(
        "extra segment past the end",
        Box::new(|p| {
            p.segments
                .get_or_insert_with(Vec::new)
                .push(mk!(pte_fb::DataSegmentT {
                    offset: 1 << 20,
                    size: 1,
                }));
            true
        }),
    );
    add("segments absent", Box::new(|p| p.segments.take().is_some()));
    add(
        "segments empty",
        Box::new(|p| p.segments.replace(vec![]).is_some()),
    );
    for v in [u64::MAX, HUGE, 1 << 20, 1] {
        add(
            &format!("constant offsets = {v}"),
            Box::new(move |p| {
                let Some(o) = p.constant_segment.as_mut().and_then(|c| c.offsets.as_mut()) else {
                    return false;
                };
                for x in o.iter_mut().skip(1) {
                    *x = v;
                }
                true
            }),
        );
    }
    for v in [u32::MAX, 1, 7] {
        add(
            &format!("constant segment_index = {v}"),
            Box::new(move |p| {
                p.constant_segment
                    .as_mut()
                    .map(|c| c.segment_index = v)
                    .is_some()
            }),
        );
    }
    add(
        "constant offsets absent",
        Box::new(|p| {
            p.constant_segment
                .as_mut()
                .map(|c| c.offsets = None)
                .is_some()
        }),
    );
    add(
        "constant offsets empty",
        Box::new(|p| {
            p.constant_segment
                .as_mut()
                .map(|c| c.offsets = Some(vec![]))
                .is_some()
        }),
    );
    add(
        "constant_segment absent",
        Box::new(|p| p.constant_segment.take().is_some()),
    );
    add(
        "inline constant buffers too short",
        Box::new(|p| {
            p.constant_segment = None;
            p.constant_buffer = Some(vec![
                mk!(pte_fb::BufferT {
                    storage: Some(vec![1, 2])
                });
                3
            ]);
            true
        }),
    );
    add(
        "inline constant buffers and constant segment",
        Box::new(|p| {
            p.constant_buffer = Some(vec![mk!(pte_fb::BufferT { storage: None }); 2]);
            true
        }),
    );
    for v in [u64::MAX, HUGE, 1 << 30] {
        add(
            &format!("mutable offsets = {v}"),
            Box::new(move |p| {
                let Some(m) = p.mutable_data_segments.as_mut().and_then(|m| m.first_mut()) else {
                    return false;
                };
                for x in m.offsets.iter_mut().flatten().skip(1) {
                    *x = v;
                }
                true
            }),
        );
    }
    add(
        "mutable segment_index huge",
        Box::new(|p| {
            p.mutable_data_segments
                .iter_mut()
                .flatten()
                .map(|m| m.segment_index = u32::MAX)
                .count()
                > 0
        }),
    );
    add(
        "mutable_data_segments empty",
        Box::new(|p| p.mutable_data_segments.replace(vec![]).is_some()),
    );
    add(
        "two mutable_data_segments",
        Box::new(|p| {
            let m = p.mutable_data_segments.get_or_insert_with(Vec::new);
            m.push(mk!(pte_fb::SubsegmentOffsetsT {
                segment_index: 99,
                offsets: Some(vec![0, u64::MAX]),
            }));
            m.push(mk!(pte_fb::SubsegmentOffsetsT {
                segment_index: 0,
                offsets: None,
            }));
            true
        }),
    );
    for all in [false, true] {
        let w = if all {
            "all tensors"
        } else {
            "a tensor with bytes"
        };
        let pick = if all { any_tensor } else { with_bytes };
        let sizes: [(&str, Vec<i32>); 7] = [
            ("sizes [-1]", vec![-1]),
            ("sizes [i32::MIN]", vec![i32::MIN]),
            ("sizes [3, -4]", vec![3, -4]),
            ("sizes overflowing 64 bits", vec![i32::MAX; 8]),
            ("sizes [i32::MAX, i32::MAX]", vec![i32::MAX, i32::MAX]),
            ("sizes of rank 40", vec![1; 40]),
            ("sizes of rank 300", vec![1; 300]),
        ];
        for (name, s) in sizes {
            let rank = s.len();
            add(
                &format!("{w}: {name}"),
                on_tensors(all, pick, move |t| {
                    t.sizes = Some(s.clone());
                    t.dim_order = Some((0..rank).map(|d| d as u8).collect());
                }),
            );
        }
        add(
            &format!("{w}: sizes absent"),
            on_tensors(all, pick, |t| t.sizes = None),
        );
        add(
            &format!("{w}: dim_order absent"),
            on_tensors(all, pick, |t| t.dim_order = None),
        );
        add(
            &format!("{w}: dim_order [255]"),
            on_tensors(all, pick, |t| {
                t.dim_order = Some(vec![255; t.sizes.as_ref().map_or(1, Vec::len)])
            }),
        );
        add(
            &format!("{w}: dim_order repeated"),
            on_tensors(all, pick, |t| {
                t.dim_order = Some(vec![0; t.sizes.as_ref().map_or(1, Vec::len)])
            }),
        );
        add(
            &format!("{w}: dim_order too long"),
            on_tensors(all, pick, |t| t.dim_order = Some((0..=255).collect())),
        );
        for st in [-1i8, 30, 100, i8::MAX, i8::MIN, 15, 16, 23] {
            add(
                &format!("{w}: scalar_type {st}"),
                on_tensors(all, pick, move |t| t.scalar_type = pte_fb::ScalarType(st)),
            );
        }
        add(
            &format!("{w}: data_buffer_idx huge"),
            on_tensors(all, pick, |t| t.data_buffer_idx = u32::MAX),
        );
        add(
            &format!("{w}: data_buffer_idx 1"),
            on_tensors(all, pick, |t| t.data_buffer_idx = 1),
        );
        add(
            &format!("{w}: mutable with huge index"),
            on_tensors(all, pick, |t| {
                t.data_buffer_idx = u32::MAX - 1;
                t.allocation_info = Some(Box::new(mk!(pte_fb::AllocationDetailsT {
                    memory_id: u32::MAX,
                    memory_offset_low: u32::MAX,
                    memory_offset_high: u32::MAX,
                })));
            }),
        );
        add(
            &format!("{w}: storage_offset"),
            on_tensors(all, pick, |t| t.storage_offset = i32::MIN),
        );
        add(
            &format!("{w}: shape_dynamism 99"),
            on_tensors(all, pick, |t| {
                t.shape_dynamism = pte_fb::TensorShapeDynamism(99)
            }),
        );
        add(
            &format!("{w}: layout -1"),
            on_tensors(all, pick, |t| t.layout = -1),
        );
        for (name, fqn, loc) in [
            (
                "EXTERNAL without a name",
                None,
                pte_fb::TensorDataLocation::EXTERNAL,
            ),
            (
                "EXTERNAL of a missing key",
                Some("no such key"),
                pte_fb::TensorDataLocation::EXTERNAL,
            ),
            (
                "EXTERNAL named '/'",
                Some("/"),
                pte_fb::TensorDataLocation::EXTERNAL,
            ),
            ("location 77", Some(".."), pte_fb::TensorDataLocation(77)),
        ] {
            add(
                &format!("{w}: {name}"),
                on_tensors(all, pick, move |t| {
                    t.extra_tensor_info = Some(Box::new(mk!(pte_fb::ExtraTensorInfoT {
                        mutable_data_segments_idx: u64::MAX,
                        fully_qualified_name: fqn.map(str::to_string),
                        location: loc,
                        device_type: pte_fb::DeviceType(99),
                        device_index: -1,
                    })))
                }),
            );
        }
    }
    add(
        "delegate location 7, index huge",
        Box::new(|p| {
            let mut any = false;
            for plan in plans(p) {
                for d in plan.delegates.iter_mut().flatten() {
                    d.processed = Some(Box::new(mk!(pte_fb::BackendDelegateDataReferenceT {
                        location: pte_fb::DataLocation(7),
                        index: u32::MAX,
                    })));
                    any = true;
                }
            }
            any
        }),
    );
    for (loc, index) in [
        (pte_fb::DataLocation::SEGMENT, u32::MAX),
        (pte_fb::DataLocation::SEGMENT, 99),
        (pte_fb::DataLocation::INLINE, 0),
        (pte_fb::DataLocation::INLINE, u32::MAX),
    ] {
        add(
            &format!("delegate {loc:?} index {index}"),
            Box::new(move |p| {
                let mut any = false;
                for plan in plans(p) {
                    for d in plan.delegates.iter_mut().flatten() {
                        d.processed = Some(Box::new(mk!(pte_fb::BackendDelegateDataReferenceT {
                            location: loc,
                            index: index,
                        })));
                        any = true;
                    }
                }
                any
            }),
        );
    }
    add(
        "inline delegate data",
        Box::new(|p| {
            p.backend_delegate_data = Some(vec![
                mk!(pte_fb::BackendDelegateInlineDataT {
                    data: Some(vec![7; 100]),
                }),
                mk!(pte_fb::BackendDelegateInlineDataT { data: None }),
            ]);
            for plan in plans(p) {
                plan.delegates
                    .get_or_insert_with(Vec::new)
                    .push(mk!(pte_fb::BackendDelegateT {
                        id: None,
                        processed: Some(Box::new(mk!(pte_fb::BackendDelegateDataReferenceT {
                            location: pte_fb::DataLocation::INLINE,
                            index: 1,
                        }))),
                        compile_specs: Some(vec![mk!(pte_fb::CompileSpecT {
                            key: None,
                            value: Some(vec![0; 1000]),
                        })]),
                    }));
            }
            true
        }),
    );
    add(
        "delegates without processed or id",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .flat_map(|pl| pl.delegates.iter_mut().flatten())
                .map(|d| {
                    d.processed = None;
                    d.id = None;
                })
                .count()
                > 0
        }),
    );
    for (name, keys) in [
        (
            "named_data keys that are not file names",
            vec!["/", "..", ".", "", "%", "a/b", "x\0y", "%2F"],
        ),
        ("duplicate named_data keys", vec!["k", "k", "k~1", "k"]),
    ] {
        add(
            name,
            Box::new(move |p| {
                let nd = p.named_data.get_or_insert_with(Vec::new);
                for (i, k) in keys.iter().enumerate() {
                    nd.push(mk!(pte_fb::NamedDataT {
                        key: Some(k.to_string()),
                        segment_index: i as u32 % 2,
                    }));
                }
                true
            }),
        );
    }
    add(
        "named_data segment index huge, key absent",
        Box::new(|p| {
            p.named_data
                .get_or_insert_with(Vec::new)
                .push(mk!(pte_fb::NamedDataT {
                    key: None,
                    segment_index: u32::MAX,
                }));
            true
        }),
    );
    add(
        "named_data without segments",
        Box::new(|p| {
            p.segments = None;
            p.named_data
                .get_or_insert_with(Vec::new)
                .push(mk!(pte_fb::NamedDataT {
                    key: Some("k".into()),
                    segment_index: 0,
                }));
            true
        }),
    );
    for (name, plan_name) in [
        ("empty", ""),
        ("dot", "."),
        ("dotdot", ".."),
        ("slash", "a/b"),
        ("percent", "%"),
        ("nul", "\0"),
    ] {
        add(
            &format!("plan name {name}"),
            Box::new(move |p| {
                plans(p)
                    .into_iter()
                    .map(|pl| pl.name = Some(plan_name.to_string()))
                    .count()
                    > 0
            }),
        );
    }
    add(
        "plan name absent",
        Box::new(|p| plans(p).into_iter().map(|pl| pl.name = None).count() > 0),
    );
    add(
        "duplicate plans",
        Box::new(|p| {
            let Some(v) = p.execution_plan.as_mut() else {
                return false;
            };
            let copy = v.clone();
            v.extend(copy.clone());
            v.extend(copy);
            true
        }),
    );
    add(
        "execution_plan absent",
        Box::new(|p| p.execution_plan.take().is_some()),
    );
    add(
        "plan vectors absent",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .map(|pl| {
                    pl.values = None;
                    pl.inputs = None;
                    pl.outputs = None;
                    pl.chains = None;
                    pl.operators = None;
                    pl.delegates = None;
                    pl.non_const_buffer_sizes = None;
                    pl.container_meta_type = None;
                })
                .count()
                > 0
        }),
    );
    add(
        "inputs and outputs out of range",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .map(|pl| {
                    pl.inputs = Some(vec![-1, i32::MAX, i32::MIN]);
                    pl.outputs = Some(vec![i32::MAX]);
                    pl.non_const_buffer_sizes = Some(vec![-1, i64::MIN, i64::MAX]);
                })
                .count()
                > 0
        }),
    );
    for v in [-1i32, i32::MAX, i32::MIN] {
        add(
            &format!("instruction indices {v}"),
            Box::new(move |p| {
                let mut any = false;
                for ins in instructions(p) {
                    match &mut ins.instr_args {
                        I::KernelCall(k) => {
                            k.op_index = v;
                            k.args = Some(vec![v, 0, v]);
                        }
                        I::DelegateCall(d) => {
                            d.delegate_index = v;
                            d.args = Some(vec![v]);
                        }
                        _ => {}
                    }
                    any = true;
                }
                any
            }),
        );
        add(
            &format!("control instructions {v}"),
            Box::new(move |p| {
                for pl in plans(p) {
                    let chains = pl.chains.get_or_insert_with(Vec::new);
                    chains.push(mk!(pte_fb::ChainT {
                        inputs: Some(vec![v]),
                        outputs: None,
                        instructions: Some(vec![
                            mk!(pte_fb::InstructionT {
                                instr_args: I::NONE,
                            }),
                            mk!(pte_fb::InstructionT {
                                instr_args: I::MoveCall(Box::new(mk!(pte_fb::MoveCallT {
                                    move_from: v,
                                    move_to: v,
                                }))),
                            }),
                            mk!(pte_fb::InstructionT {
                                instr_args: I::JumpFalseCall(Box::new(mk!(
                                    pte_fb::JumpFalseCallT {
                                        cond_value_index: v,
                                        destination_instruction: v,
                                    }
                                ))),
                            }),
                            mk!(pte_fb::InstructionT {
                                instr_args: I::FreeCall(Box::new(mk!(pte_fb::FreeCallT {
                                    value_index: v,
                                }))),
                            }),
                        ]),
                        stacktrace: Some(vec![mk!(pte_fb::FrameListT {
                            items: Some(vec![mk!(pte_fb::FrameT {
                                filename: None,
                                lineno: v,
                                name: Some("\0".into()),
                                context: None,
                            })]),
                        })]),
                    }));
                    chains.push(pte_fb::ChainT::default());
                }
                true
            }),
        );
    }
    add(
        "odd values",
        Box::new(|p| {
            for pl in plans(p) {
                let values = pl.values.get_or_insert_with(Vec::new);
                let n = values.len() as i32;
                for val in [
                    K::NONE,
                    K::Double(Box::new(mk!(pte_fb::DoubleT {
                        double_val: f64::NAN,
                    }))),
                    K::Double(Box::new(mk!(pte_fb::DoubleT {
                        double_val: f64::NEG_INFINITY,
                    }))),
                    K::String(Box::new(mk!(pte_fb::StringT {
                        string_val: Some("\0\"\\\u{7f}é".into()),
                    }))),
                    K::String(Box::new(mk!(pte_fb::StringT { string_val: None }))),
                    K::TensorList(Box::new(mk!(pte_fb::TensorListT {
                        items: Some(vec![-1, n, i32::MAX, 0]),
                    }))),
                    K::OptionalTensorList(Box::new(mk!(pte_fb::OptionalTensorListT {
                        items: Some(vec![-1, -2, i32::MIN]),
                    }))),
                    K::DoubleList(Box::new(mk!(pte_fb::DoubleListT {
                        items: Some(vec![f64::INFINITY, f64::NAN, -0.0]),
                    }))),
                    K::BoolList(Box::new(mk!(pte_fb::BoolListT { items: None }))),
                    K::IntList(Box::new(mk!(pte_fb::IntListT {
                        items: Some(vec![i64::MIN, i64::MAX]),
                    }))),
                    K::Tensor(Box::default()),
                ] {
                    values.push(mk!(pte_fb::EValueT { val: val }));
                }
            }
            true
        }),
    );
    add(
        "operators without names",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .map(|pl| {
                    pl.operators
                        .get_or_insert_with(Vec::new)
                        .push(mk!(pte_fb::OperatorT {
                            name: None,
                            overload: Some("\0/".into()),
                        }))
                })
                .count()
                > 0
        }),
    );
    add(
        "many values sharing one constant",
        Box::new(|p| {
            let Some(t) = tensors(p)
                .into_iter()
                .find(|t| with_bytes(t))
                .map(|t| t.clone())
            else {
                return false;
            };
            for pl in plans(p) {
                let values = pl.values.get_or_insert_with(Vec::new);
                for _ in 0..300 {
                    values.push(mk!(pte_fb::EValueT {
                        val: K::Tensor(Box::new(t.clone())),
                    }));
                }
            }
            true
        }),
    );
    add(
        "version 99",
        Box::new(|p| {
            p.version = u32::MAX;
            true
        }),
    );
    e
}

type PtdEdit = Box<dyn Fn(&mut ptd_fb::FlatTensorT) -> bool>;

fn ptd_edits() -> Vec<(String, PtdEdit)> {
    let mut e: Vec<(String, PtdEdit)> = Vec::new();
    let mut add = |name: &str, f: PtdEdit| e.push((name.to_string(), f));
    for (k, v) in [
        (0usize, u64::MAX),
        (0, HUGE),
        (1, u64::MAX),
        (1, 1 << 40),
        (1, 0),
    ] {
        add(
            &format!("segment field {k} = {v}"),
            Box::new(move |f| {
                let Some(s) = f.segments.as_mut().and_then(|s| s.last_mut()) else {
                    return false;
                };
                if k == 0 {
                    s.offset = v;
                } else {
                    s.size = v;
                }
                true
            }),
        );
    }
    add("segments absent", Box::new(|f| f.segments.take().is_some()));
    add(
        "named_data absent",
        Box::new(|f| f.named_data.take().is_some()),
    );
    add(
        "version 2",
        Box::new(|f| {
            f.version = 2;
            true
        }),
    );
    let layouts: Vec<(&str, i8, Vec<i32>, Vec<u8>)> = vec![
        ("negative size", 6, vec![-3], vec![0]),
        ("huge sizes", 6, vec![i32::MAX; 8], (0..8).collect()),
        ("too big for the segment", 6, vec![1 << 20], vec![0]),
        ("bad dim_order", 6, vec![3, 4], vec![1, 1]),
        ("short dim_order", 6, vec![3, 4], vec![0]),
        ("unknown scalar type", 99, vec![3], vec![0]),
        ("bfloat16", 15, vec![2], vec![0]),
        ("rank 0", 6, vec![], vec![]),
    ];
    for (name, st, sizes, order) in layouts {
        add(
            &format!("tensor_layout {name}"),
            Box::new(move |f| {
                let mut any = false;
                for nd in f.named_data.iter_mut().flatten() {
                    nd.tensor_layout = Some(Box::new(mk!(ptd_fb::TensorLayoutT {
                        scalar_type:
                            ptefs::format::generated::flat_tensor::executorch_flatbuffer::ScalarType(
                                st
                            ),
                        sizes: Some(sizes.clone()),
                        dim_order: Some(order.clone()),
                    })));
                    any = true;
                }
                any
            }),
        );
    }
    add(
        "tensor_layout vectors absent",
        Box::new(|f| {
            f.named_data
                .iter_mut()
                .flatten()
                .map(|nd| {
                    if let Some(l) = nd.tensor_layout.as_mut() {
                        l.sizes = None;
                        l.dim_order = None;
                    }
                })
                .count()
                > 0
        }),
    );
    add(
        "named_data segment index huge",
        Box::new(|f| {
            f.named_data
                .iter_mut()
                .flatten()
                .map(|nd| nd.segment_index = u32::MAX)
                .count()
                > 0
        }),
    );
    add(
        "duplicate and odd keys",
        Box::new(|f| {
            let nd = f.named_data.get_or_insert_with(Vec::new);
            let copy = nd.clone();
            nd.extend(copy);
            for k in ["/", "..", "", "a/../b"] {
                nd.push(mk!(ptd_fb::NamedDataT {
                    key: Some(k.into()),
                    segment_index: 0,
                    tensor_layout: None,
                }));
            }
            nd.push(mk!(ptd_fb::NamedDataT {
                key: None,
                segment_index: 0,
                tensor_layout: None,
            }));
            true
        }),
    );
    e
}

/// Edits that break what the runtime relies on in every file they apply to (FORMAT.md §6):
/// `check` must report them, if parsing does not refuse them already.
const FLAGGED_PTE_EDITS: &[&str] = &[
    "segment offset/size field",
    "segment offset + size overflow",
    "constant offsets absent",
    "constant offsets empty",
    "constant_segment absent",
    "inline constant buffers",
    "two mutable_data_segments",
    "all tensors: sizes [-1]",
    "all tensors: sizes [i32::MIN]",
    "all tensors: sizes [3, -4]",
    "all tensors: sizes overflowing 64 bits",
    "all tensors: sizes of rank",
    "all tensors: sizes absent",
    "all tensors: dim_order absent",
    "all tensors: dim_order [255]",
    "all tensors: dim_order too long",
    "all tensors: scalar_type -1",
    "all tensors: scalar_type 30",
    "all tensors: scalar_type 100",
    "all tensors: scalar_type 127",
    "all tensors: scalar_type -128",
    "all tensors: data_buffer_idx huge",
    "all tensors: mutable with huge index",
    "all tensors: storage_offset",
    "all tensors: EXTERNAL without a name",
    "delegate location 7",
    "delegate SEGMENT",
    "delegate INLINE index 4294967295",
    "delegates without processed or id",
    "named_data segment index huge",
    "named_data without segments",
    "plan name absent",
    "execution_plan absent",
    "plan vectors absent",
    "inputs and outputs out of range",
    "instruction indices",
    "control instructions",
    "odd values",
    "operators without names",
];

const FLAGGED_PTD_EDITS: &[&str] = &[
    "segment field 0",
    "segment field 1 = 18446744073709551615",
    "segment field 1 = 1099511627776",
    "segments absent",
    "named_data absent",
    "version 2",
    "tensor_layout negative size",
    "tensor_layout huge sizes",
    "tensor_layout too big for the segment",
    "tensor_layout bad dim_order",
    "tensor_layout short dim_order",
    "tensor_layout unknown scalar type",
    "named_data segment index huge",
    "duplicate and odd keys",
];

/// The cases of one structured edit; `must_flag` when `check` has to report it.
fn edited_cases(f: &Fixture, name: &str, bytes: Vec<u8>, must_flag: bool) -> Vec<Case> {
    cases_of(f, format!("{} {name}", f.path.display()), bytes, None)
        .into_iter()
        .map(|c| Case { must_flag, ..c })
        .collect()
}

fn structured(f: &Fixture, out: &mut Vec<Case>) {
    if is_ptd(&f.bytes) {
        let ft = flat_tensor_of(&f.bytes);
        out.extend(cases_of(
            f,
            format!("{} rebuilt", f.path.display()),
            rebuild_ptd(&f.bytes, &ft),
            None,
        ));
        for (name, edit) in ptd_edits() {
            let mut ft = ft.clone();
            if edit(&mut ft) {
                let flag = FLAGGED_PTD_EDITS.iter().any(|e| name.starts_with(e));
                out.extend(edited_cases(f, &name, rebuild_ptd(&f.bytes, &ft), flag));
            }
        }
        return;
    }
    let program = program_of(&f.bytes);
    out.extend(cases_of(
        f,
        format!("{} rebuilt", f.path.display()),
        rebuild_pte(&f.bytes, &program),
        None,
    ));
    for (name, edit) in pte_edits() {
        let mut p = program.clone();
        if edit(&mut p) {
            let flag = FLAGGED_PTE_EDITS.iter().any(|e| name.starts_with(e));
            out.extend(edited_cases(f, &name, rebuild_pte(&f.bytes, &p), flag));
        }
    }
}

/// An input the fuzzer found crashing: a fixture, bytes written over it at offsets, and the
/// length it is cut to.
type Regression = (
    &'static str,
    &'static [(usize, &'static [u8])],
    Option<usize>,
);

const REGRESSIONS: &[Regression] = &[];

fn regressions(out: &mut Vec<Case>) {
    for (k, (name, patches, cut)) in REGRESSIONS.iter().enumerate() {
        let path = common::fixtures_dir().join(name);
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, new) in patches.iter() {
            bytes[*at..*at + new.len()].copy_from_slice(new);
        }
        if let Some(cut) = cut {
            bytes.truncate(*cut);
        }
        out.push(Case {
            name: format!("regression {k} ({name})"),
            files: vec![(path, bytes)],
            must_refuse: None,
            must_flag: false,
        });
    }
}

fn corpus() -> Vec<Case> {
    let mut rng = Rng(0x5eed_2026_0001);
    let mut out = Vec::new();
    for f in fixtures() {
        truncations(&f, &mut out);
        flips(&f, &mut rng, 150, &mut out);
        header_fields(&f, &mut out);
        structured(&f, &mut out);
    }
    regressions(&mut out);
    out
}

fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

#[test]
fn corrupted_files_never_panic_and_refusals_name_the_problem() {
    let start = Instant::now();
    let cases = corpus();
    let mut failures = Vec::new();
    let (mut refused, mut opened) = (0, 0);
    let mut slowest = (Duration::ZERO, String::new());
    let verbose = std::env::var_os("PTEFS_CORRUPT_VERBOSE").is_some();
    for case in &cases {
        let t = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| exercise(&case.files)));
        let took = t.elapsed();
        if verbose {
            eprintln!("{:>8} us  {}", took.as_micros(), case.name);
        }
        if took > slowest.0 {
            slowest = (took, case.name.clone());
        }
        match r {
            Err(e) => failures.push(format!("{}: PANIC: {}", case.name, panic_text(&*e))),
            Ok(Outcome::Refused(msg)) => {
                refused += 1;
                if verbose {
                    eprintln!("    refused: {msg}");
                }
                if msg.trim().is_empty() {
                    failures.push(format!("{}: refused with an empty message", case.name));
                }
                if let Some(words) = case.must_refuse {
                    if !words.iter().any(|w| msg.contains(w)) {
                        failures.push(format!(
                            "{}: refusal {msg:?} names none of {words:?}",
                            case.name
                        ));
                    }
                }
            }
            Ok(Outcome::Opened(defects)) => {
                opened += 1;
                if case.must_flag && defects == 0 {
                    failures.push(format!("{}: opened, and check found no defect", case.name));
                }
                if verbose {
                    eprintln!("    opened: {defects} defects");
                }
                if case.must_refuse.is_some() {
                    failures.push(format!("{}: accepted, but must be refused", case.name));
                }
            }
        }
    }
    eprintln!(
        "{} cases ({refused} refused, {opened} opened) in {:?}; slowest {:?}: {}",
        cases.len(),
        start.elapsed(),
        slowest.0,
        slowest.1
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        slowest.0 < Duration::from_secs(5),
        "a case took {:?}: {}",
        slowest.0,
        slowest.1
    );
}

/// The same corruption read from disk: the refusal starts with the file's path.
#[test]
fn refusals_from_disk_start_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let cases = corpus();
    let mut failures = Vec::new();
    for (n, case) in cases.iter().enumerate().filter(|(n, _)| n % 23 == 0) {
        let paths: Vec<PathBuf> = case
            .files
            .iter()
            .enumerate()
            .map(|(k, (p, b))| {
                let to = dir.path().join(format!(
                    "{n}-{k}-{}",
                    p.file_name().unwrap().to_string_lossy()
                ));
                std::fs::write(&to, b).unwrap();
                to
            })
            .collect();
        let r = catch_unwind(|| match Model::open(&paths[0], &paths[1..]) {
            Ok(m) => {
                use_tree(Tree::build(Arc::new(m)));
                None
            }
            Err(e) => Some(e.message().to_string()),
        });
        match r {
            Err(e) => failures.push(format!("{}: PANIC: {}", case.name, panic_text(&*e))),
            Ok(Some(msg)) => {
                if !paths
                    .iter()
                    .any(|p| msg.starts_with(&p.display().to_string()))
                {
                    failures.push(format!(
                        "{}: {msg:?} does not start with the path",
                        case.name
                    ));
                }
            }
            Ok(None) => {}
        }
        let defects = ptefs::offline::check(&paths[0], &paths[1..]);
        if defects.iter().any(|d| d.trim().is_empty()) {
            failures.push(format!("{}: an empty defect", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The binary on a sample of the corpus: exit status 0 or 1 (never a signal), and a message
/// on stderr whenever it fails.
#[test]
fn the_binary_exits_cleanly_on_corrupted_files() {
    let dir = tempfile::tempdir().unwrap();
    let cases = corpus();
    let exe = env!("CARGO_BIN_EXE_ptefs");
    let mut failures = Vec::new();
    let mut runs = 0;
    let step = (cases.len() / 40).max(1);
    for (n, case) in cases.iter().enumerate().filter(|(n, _)| n % step == 0) {
        let paths: Vec<PathBuf> = case
            .files
            .iter()
            .enumerate()
            .map(|(k, (p, b))| {
                let to = dir.path().join(format!(
                    "{n}-{k}-{}",
                    p.file_name().unwrap().to_string_lossy()
                ));
                std::fs::write(&to, b).unwrap();
                to
            })
            .collect();
        let data: Vec<String> = paths[1..]
            .iter()
            .flat_map(|p| ["--data".to_string(), p.display().to_string()])
            .collect();
        let file = paths[0].display().to_string();
        let commands: [Vec<&str>; 5] = [
            vec!["info"],
            vec!["check"],
            vec!["ls", "-R", "-l"],
            vec!["cat", "", "header.json"],
            vec!["cat", "", "plans/forward/values/0.bin"],
        ];
        for cmd in commands {
            let mut args: Vec<String> = vec![cmd[0].to_string(), file.clone()];
            args.extend(
                cmd[1..]
                    .iter()
                    .filter(|a| !a.is_empty())
                    .map(|a| a.to_string()),
            );
            args.extend(data.iter().cloned());
            let out = Command::new(exe).args(&args).output().unwrap();
            runs += 1;
            let what = format!("{}: ptefs {}", case.name, args.join(" "));
            match out.status.code() {
                Some(0) => {}
                Some(1) => {
                    if String::from_utf8_lossy(&out.stderr).trim().is_empty() {
                        failures.push(format!("{what}: failed without a message on stderr"));
                    }
                }
                other => failures.push(format!(
                    "{what}: exit {other:?} ({}), stderr {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )),
            }
        }
    }
    eprintln!("{runs} runs of the binary");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A model file truncated on disk after opening: reads of bytes past the new end fail with
/// EIO; the process survives (no SIGBUS).
#[test]
fn truncation_while_open_gives_eio() {
    let mut tried = 0;
    for m in manifests() {
        let (file, data) = fixture_files(&m);
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join(file.file_name().unwrap());
        std::fs::copy(&file, &copy).unwrap();
        let fs = ptefs::offline::open_fs(&copy, &data).unwrap();
        let tree = fs.tree();
        let size = std::fs::metadata(&copy).unwrap().len();
        // Files whose bytes are in the model file, sorted by where they end.
        let mut ranged: Vec<(String, u64, u64)> = walk(&fs)
            .into_iter()
            .filter(|(_, _, k)| *k == FileType::RegularFile)
            .filter_map(|(path, ino, _)| match &tree.node(ino)?.content {
                ptefs::tree::Content::Range(l) | ptefs::tree::Content::Npy { location: l, .. }
                    if l.file == 0 && !l.range.is_empty() =>
                {
                    Some((path, ino, l.range.start()))
                }
                _ => None,
            })
            .collect();
        if ranged.is_empty() {
            continue;
        }
        ranged.sort_by_key(|r| r.2);
        let cut = ranged[0].2;
        let before: Vec<Vec<u8>> = ranged
            .iter()
            .map(|(_, ino, _)| read_all(&fs, *ino, 1 << 20).unwrap())
            .collect();
        assert!(before.iter().all(|b| !b.is_empty()));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_len(cut)
            .unwrap();
        assert!(cut < size);
        for (path, ino, _) in &ranged {
            let attr_size = fs.getattr(*ino).unwrap().size;
            let r = fs.read(*ino, 0, attr_size as u32);
            match r {
                Err(e) => {
                    assert_eq!(e.errno(), libc::EIO, "{}: {path}: {e}", file.display());
                    assert!(!e.message().is_empty());
                }
                // A .npy's first read may be only its generated header.
                Ok(d) if path.ends_with(".npy") && d.bytes().len() < attr_size as usize => {}
                Ok(d) => panic!(
                    "{}: {path}: read {} bytes after truncation",
                    file.display(),
                    d.bytes().len()
                ),
            }
            // Reading the data part of a .npy at its offset fails too.
            if path.ends_with(".npy") {
                let e = fs.read(*ino, attr_size - 1, 1).err().map(|e| e.errno());
                assert_eq!(e, Some(libc::EIO), "{path}");
            }
        }
        // Text files are generated from the parsed tables and stay readable.
        let header = tree.find("header.json").unwrap();
        assert!(!read_all(&fs, header, 1 << 20).unwrap().is_empty());
        // `cat` of a truncated tensor fails with a message, not a crash.
        let mut out = Vec::new();
        let e = ptefs::offline::cat(&fs, &ranged[0].0, &mut out).unwrap_err();
        assert!(!e.message().is_empty());
        tried += 1;
    }
    assert!(tried > 0);
}

/// The same for a file far larger than a page, cut in the middle of a 4 MiB segment, with
/// every page of the mapping touched after the cut.
#[test]
fn truncation_while_open_of_a_large_segment_gives_eio() {
    let f = fixtures()
        .into_iter()
        .find(|f| !is_ptd(&f.bytes) && has_eh00(&f.bytes) && f.data.is_empty())
        .unwrap();
    // Grow the last segment to 4 MiB.
    let mut program = program_of(&f.bytes);
    let segs = program.segments.as_mut().unwrap();
    let last = segs.last_mut().unwrap();
    let old_end = (last.offset + last.size) as usize;
    last.size += 4 << 20;
    let mut b = rebuild_pte(&f.bytes, &program);
    let new_base = regions(&b).1;
    b.truncate(new_base + old_end);
    b.resize(new_base + old_end + (4 << 20), 0x5a);
    let sd = (b.len() - new_base) as u64;
    b[32..40].copy_from_slice(&sd.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.pte");
    std::fs::write(&path, &b).unwrap();
    let fs = ptefs::offline::open_fs(&path, &[] as &[PathBuf]).unwrap();
    let tree = fs.tree();
    let n = tree.children(tree.find("segments").unwrap()).unwrap().len();
    let seg = tree.find(&format!("segments/{}", n - 1)).unwrap();
    let size = fs.getattr(seg).unwrap().size;
    assert!(size > 4 << 20);
    assert_eq!(fs.read(seg, 0, 1 << 20).unwrap().bytes().len(), 1 << 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(b.len() as u64 - (3 << 20))
        .unwrap();
    let mut off = 0;
    while off < size {
        let r = fs.read(seg, off, 1 << 16);
        if let Err(e) = &r {
            assert_eq!(e.errno(), libc::EIO);
        }
        off += 1 << 16;
    }
    assert_eq!(
        fs.read(seg, size - 1, 1).err().map(|e| e.errno()),
        Some(libc::EIO)
    );
    // Touch the lost pages directly, as a racing copy would: survived, then reported.
    let bytes = tree.model.files[0].bytes();
    let mut sum = 0u64;
    for i in (0..bytes.len()).step_by(4096) {
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(&bytes[i]) } as u64);
    }
    assert!(tree.model.files[0].poisoned(), "sum {sum}");
    assert_eq!(
        fs.read(seg, 0, 10).err().map(|e| e.errno()),
        Some(libc::EIO)
    );
}

/// The rebuilt fixtures used by the structured corruptions are sound before corruption.
#[test]
fn rebuilt_fixtures_are_sound() {
    for f in fixtures() {
        let b = if is_ptd(&f.bytes) {
            rebuild_ptd(&f.bytes, &flat_tensor_of(&f.bytes))
        } else {
            rebuild_pte(&f.bytes, &program_of(&f.bytes))
        };
        let mut files = vec![ModelFile::from_bytes(&f.path, b).unwrap()];
        for (p, d) in &f.data {
            files.push(ModelFile::from_bytes(p, d.clone()).unwrap());
        }
        let model = Model::from_files(files).unwrap();
        if let Kind::Pte(_) = model.files[0].kind {
            assert!(
                model.pte_layout.as_ref().unwrap().defects.is_empty(),
                "{}",
                f.path.display()
            );
        }
        let bare_add = !has_eh00(&f.bytes) && !is_ptd(&f.bytes);
        let defects = ptefs::check::defects(&model);
        assert!(
            defects.is_empty() || bare_add,
            "{}: {defects:?}",
            f.path.display()
        );
    }
}

/// A small file whose vectors point many times at one table passes the FlatBuffers verifier's
/// default limits and would unpack into hundreds of megabytes (here 400 KB into 350 MB, and a
/// few MB into more than the machine has). It is refused, quickly, saying why.
#[test]
fn shared_tables_cannot_multiply_memory() {
    let orig = std::fs::read(common::fixtures_dir().join("linear.pte")).unwrap();
    let program = program_of(&orig);
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let plan = program.execution_plan.as_ref().unwrap()[0].pack(&mut fbb);
    let plans = fbb.create_vector(&vec![plan; 100_000]);
    let root = pte_fb::Program::create(
        &mut fbb,
        &pte_fb::ProgramArgs {
            execution_plan: Some(plans),
            ..Default::default()
        },
    );
    fbb.finish(root, Some("ET12"));
    let (bytes, _) = pte_program_region(fbb.finished_data(), 16, 128, 0, false);
    assert!(bytes.len() < 500_000);
    let t = Instant::now();
    let err = Kind::parse(&bytes).unwrap_err();
    assert!(err.message().contains("Apparent size"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Sharing on the scale of real files (vtables, a few tables) stays accepted.
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let plan = program.execution_plan.as_ref().unwrap()[0].pack(&mut fbb);
    let plans = fbb.create_vector(&[plan, plan]);
    let root = pte_fb::Program::create(
        &mut fbb,
        &pte_fb::ProgramArgs {
            execution_plan: Some(plans),
            ..Default::default()
        },
    );
    fbb.finish(root, Some("ET12"));
    let (bytes, _) = pte_program_region(fbb.finished_data(), 16, 128, 0, false);
    assert!(Kind::parse(&bytes).is_ok());
}

/// Many plans: rendering every value's JSON stays linear in the number of plans (each names
/// its own path, which once recomputed every plan's directory name: 8,000 plans of one
/// tensor each, a 600 KB file, took 8.5 s in a release build, 32,000 over two minutes).
#[test]
fn many_plans_render_in_linear_time() {
    let n = 8000;
    let plans = (0..n)
        .map(|i| {
            let tensor = mk!(pte_fb::TensorT {
                sizes: Some(vec![1]),
                dim_order: Some(vec![0]),
            });
            mk!(pte_fb::ExecutionPlanT {
                name: Some(format!("p{}", i % 100)),
                values: Some(vec![mk!(pte_fb::EValueT {
                    val: pte_fb::KernelTypesT::Tensor(Box::new(tensor))
                })]),
            })
        })
        .collect();
    let program = mk!(pte_fb::ProgramT {
        execution_plan: Some(plans),
        constant_segment: Some(Box::new(mk!(pte_fb::SubsegmentOffsetsT {
            segment_index: 0,
            offsets: Some(vec![0, 0]),
        }))),
        segments: Some(vec![mk!(pte_fb::DataSegmentT { offset: 0, size: 4 })]),
    });
    let fb = pack_program(&program, 16);
    let (mut bytes, base) = pte_program_region(&fb, 16, 128, 4, true);
    bytes.resize(base as usize + 4, 7);
    let t = Instant::now();
    let file = ModelFile::from_bytes(Path::new("plans.pte"), bytes).unwrap();
    let tree = Tree::build(Arc::new(Model::from_files(vec![file]).unwrap()));
    let mut rendered = 0;
    for ino in 1..=tree.nodes.len() as u64 {
        if let ptefs::tree::Content::Text { .. } = tree.node(ino).unwrap().content {
            rendered += tree.text(ino).unwrap().len();
        }
    }
    assert!(rendered > 0);
    let last = tree.find("plans/p99~79/values/0.json").unwrap();
    let json: serde_json::Value = serde_json::from_slice(&tree.text(last).unwrap()).unwrap();
    assert_eq!(json["index"], 0);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// Many equal keys: naming them `k`, `k~1`, `k~2`, … stays linear (it tried every suffix from
/// 1 for each repeat: 40,000 equal keys, a 640 KB file, took 57 s in a release build).
#[test]
fn many_equal_keys_are_named_in_linear_time() {
    let orig = std::fs::read(common::fixtures_dir().join("linear.pte")).unwrap();
    let mut program = program_of(&orig);
    program.named_data = Some(
        (0..20_000)
            .map(|_| {
                mk!(pte_fb::NamedDataT {
                    key: Some("k".into()),
                    segment_index: 0,
                })
            })
            .collect(),
    );
    let t = Instant::now();
    let file = ModelFile::from_bytes(Path::new("keys.pte"), rebuild_pte(&orig, &program)).unwrap();
    let tree = Tree::build(Arc::new(Model::from_files(vec![file]).unwrap()));
    assert!(tree.find("named_data/k.bin").is_some());
    assert!(tree.find("named_data/k~19999.json").is_some());
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// Many EXTERNAL tensors resolved against a `.ptd` with as many keys: linear, not tensors ×
/// keys (40,000 of each took 2.8 s in a release build). Duplicate and missing keys are still
/// reported.
#[test]
fn many_external_tensors_resolve_in_linear_time() {
    let n = 40_000;
    let tensor = |key: String| {
        mk!(pte_fb::EValueT {
            val: pte_fb::KernelTypesT::Tensor(Box::new(mk!(pte_fb::TensorT {
                scalar_type: pte_fb::ScalarType::FLOAT,
                sizes: Some(vec![1]),
                dim_order: Some(vec![0]),
                extra_tensor_info: Some(Box::new(mk!(pte_fb::ExtraTensorInfoT {
                    fully_qualified_name: Some(key),
                    location: pte_fb::TensorDataLocation::EXTERNAL,
                }))),
            })))
        })
    };
    let mut values: Vec<_> = (0..n).map(|i| tensor(format!("w{i}"))).collect();
    values.push(tensor("missing".into()));
    let program = mk!(pte_fb::ProgramT {
        execution_plan: Some(vec![mk!(pte_fb::ExecutionPlanT {
            name: Some("forward".into()),
            values: Some(values),
        })]),
    });
    let (pte, _) = pte_program_region(&pack_program(&program, 16), 16, 128, 0, false);
    let ptd = |keys: Vec<String>| {
        let ft = mk!(ptd_fb::FlatTensorT {
            segments: Some(vec![mk!(ptd_fb::DataSegmentT { offset: 0, size: 4 })]),
            named_data: Some(
                keys.into_iter()
                    .map(|key| {
                        mk!(ptd_fb::NamedDataT {
                            key: Some(key),
                            tensor_layout: Some(Box::new(mk!(ptd_fb::TensorLayoutT {
                                scalar_type: ptefs::format::generated::flat_tensor::executorch_flatbuffer::ScalarType(6),
                                sizes: Some(vec![1]),
                                dim_order: Some(vec![0]),
                            }))),
                        })
                    })
                    .collect(),
            ),
        });
        let (mut b, base) = ptd_program_region(&pack_flat_tensor(&ft), 128, 4);
        b.resize(base as usize + 4, 1);
        b
    };
    let a = ptd((0..n).map(|i| format!("w{i}")).collect());
    let b = ptd(vec!["w7".into()]);
    let t = Instant::now();
    let files = vec![
        ModelFile::from_bytes(Path::new("ext.pte"), pte).unwrap(),
        ModelFile::from_bytes(Path::new("a.ptd"), a).unwrap(),
        ModelFile::from_bytes(Path::new("b.ptd"), b).unwrap(),
    ];
    let model = Model::from_files(files).unwrap();
    let took = t.elapsed();
    let layout = model.pte_layout.as_ref().unwrap();
    let located = layout.plans[0]
        .tensors
        .iter()
        .flatten()
        .filter(|t| t.location.is_some());
    assert_eq!(located.count(), n - 1);
    let defects = &layout.defects;
    assert_eq!(defects.len(), 2, "{defects:?}");
    assert!(defects
        .iter()
        .any(|d| d.contains("\"w7\" appears in more than one")));
    assert!(defects.iter().any(|d| d.contains("\"missing\" not found")));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// Whether the core opens these files rather than refusing them.
fn core_opens(files: &[(PathBuf, Vec<u8>)]) -> bool {
    let parsed: Option<Vec<ModelFile>> = files
        .iter()
        .map(|(p, b)| ModelFile::from_bytes(p, b.clone()).ok())
        .collect();
    parsed.is_some_and(|p| Model::from_files(p).is_ok())
}

/// Whether `mnt` is listed in /proc/self/mounts as a ptefs FUSE mount.
fn mounted_as_ptefs(mnt: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let want = mnt.display().to_string();
    table.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() > 2 && f[1].replace("\\040", " ") == want && f[2] == "fuse.ptefs"
    })
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

/// A live mount, unmounted when dropped: `ptefs umount`, else a lazy `fusermount3`.
struct MountGuard {
    mnt: PathBuf,
    live: bool,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let ok = Command::new(env!("CARGO_BIN_EXE_ptefs"))
            .arg("umount")
            .arg(&self.mnt)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .stderr(std::process::Stdio::null())
                .status();
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
            match std::fs::read(&path) {
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
        let paths: Vec<PathBuf> = case
            .files
            .iter()
            .enumerate()
            .map(|(k, (p, b))| {
                let name = p.file_name().unwrap().to_string_lossy();
                let to = case_dir.join(format!("{k}-{name}"));
                std::fs::write(&to, b).unwrap();
                to
            })
            .collect();
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
            live: mounted_as_ptefs(&mnt),
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
        if !mounted_as_ptefs(&mnt) {
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
            guard.live = mounted_as_ptefs(&mnt);
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
