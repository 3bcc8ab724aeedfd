//! Corrupted XNNPACK payloads stored in segments: the payload truncated (its segment made
//! shorter), bits flipped inside it, and absurd sizes and counts in its `XH00` header and
//! its flatbuffer (vector lengths, dims, scale counts, value ids). The container around a
//! payload stays sound, so every such file opens: the delegate keeps `delegate.json` and
//! `processed.bin` (showing the corrupted bytes), every other file is served as before,
//! `xnnpack/` appears exactly when the payload still decodes, and `check` names the
//! delegate when it does not. The cases also join the corpus that `drivers` and `mounted`
//! run through the core, the binary and real mounts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use crate::cases::{fixtures, Case, Fixture};
use crate::common::{self, read_all, walk, Rng};
use crate::mutate::{is_ptd, program_of, rebuild_pte, regions};
use ptefs::backend::xnnpack::decode;
use ptefs::format::generated::{pte_fb, xnn_fb};
use ptefs::format::{Model, ModelFile};
use ptefs::fs::{FileType, Fs, Options};
use ptefs::tree::Tree;

/// An XNNPACK payload of a fixture that lives in a segment.
struct SegmentPayload {
    plan: usize,
    delegate: usize,
    plan_name: String,
    segment: usize,
    /// Where the payload is in the file.
    start: usize,
    len: usize,
}

/// The first XNNPACK payload of a `.pte` fixture that lives in a segment.
fn segment_payload(f: &Fixture) -> Option<SegmentPayload> {
    if is_ptd(&f.bytes) {
        return None;
    }
    let program = program_of(&f.bytes);
    let (_, base) = regions(&f.bytes);
    let segments = program.segments.as_deref().unwrap_or_default();
    for (p, plan) in program.execution_plan.iter().flatten().enumerate() {
        for (j, d) in plan.delegates.iter().flatten().enumerate() {
            let Some(r) = &d.processed else { continue };
            if d.id.as_deref() != Some("XnnpackBackend")
                || r.location != pte_fb::DataLocation::SEGMENT
            {
                continue;
            }
            let s = &segments[r.index as usize];
            return Some(SegmentPayload {
                plan: p,
                delegate: j,
                plan_name: plan.name.clone().unwrap_or_default(),
                segment: r.index as usize,
                start: base + s.offset as usize,
                len: s.size as usize,
            });
        }
    }
    None
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Where field `voffset` of the table at `table` of flatbuffer `fb` is, if stored.
fn field(fb: &[u8], table: usize, voffset: u16) -> Option<usize> {
    let vtable = (table as i64 - i64::from(u32_at(fb, table) as i32)) as usize;
    if usize::from(voffset) + 2 > usize::from(u16_at(fb, vtable)) {
        return None;
    }
    let at = u16_at(fb, vtable + usize::from(voffset));
    (at != 0).then(|| table + usize::from(at))
}

/// What the offset stored at `at` points to.
fn follow(fb: &[u8], at: usize) -> usize {
    at + u32_at(fb, at) as usize
}

/// The tables of a vector of tables that starts (at its length) at `vector`.
fn tables(fb: &[u8], vector: usize) -> Vec<usize> {
    (0..u32_at(fb, vector) as usize)
        .map(|k| follow(fb, vector + 4 + 4 * k))
        .collect()
}

/// Positions in a payload's flatbuffer (relative to the flatbuffer) of fields worth
/// corrupting, by name: vector lengths, the dims and scale counts of the first constants,
/// and the first input id of the first node.
fn flatbuffer_fields(fb: &[u8]) -> Vec<(&'static str, usize)> {
    let mut out = Vec::new();
    let root = follow(fb, 0);
    for (name, voffset) in [
        ("xnodes length", xnn_fb::XNNGraph::VT_XNODES),
        ("xvalues length", xnn_fb::XNNGraph::VT_XVALUES),
        ("constant_data length", xnn_fb::XNNGraph::VT_CONSTANT_DATA),
    ] {
        if let Some(at) = field(fb, root, voffset) {
            out.push((name, follow(fb, at)));
        }
    }
    let values = field(fb, root, xnn_fb::XNNGraph::VT_XVALUES).map(|at| follow(fb, at));
    let mut dims_done = false;
    let mut scales_done = false;
    for value in values.map(|v| tables(fb, v)).unwrap_or_default() {
        let Some(union) =
            field(fb, value, xnn_fb::XValue::VT_XVALUE_UNION).map(|at| follow(fb, at))
        else {
            continue;
        };
        let quantized = fb[field(fb, value, xnn_fb::XValue::VT_XVALUE_UNION_TYPE).unwrap_or(0)]
            == xnn_fb::XValueUnion::XNNQuantizedTensorValue.0;
        let tensor = if quantized {
            match field(fb, union, xnn_fb::XNNQuantizedTensorValue::VT_TENSOR_VALUE) {
                Some(at) => follow(fb, at),
                None => continue,
            }
        } else {
            union
        };
        let constant = field(fb, tensor, xnn_fb::XNNTensorValue::VT_CONSTANT_BUFFER_IDX)
            .is_some_and(|at| u32_at(fb, at) != 0);
        if constant && !dims_done {
            if let Some(dims) =
                field(fb, tensor, xnn_fb::XNNTensorValue::VT_DIMS).map(|at| follow(fb, at))
            {
                out.push(("dims length of the first constant", dims));
                out.push(("dims[0] of the first constant", dims + 4));
                dims_done = true;
            }
        }
        if quantized && constant && !scales_done {
            let params = field(fb, union, xnn_fb::XNNQuantizedTensorValue::VT_QUANT_PARAMS)
                .map(|at| follow(fb, at));
            let kind = field(
                fb,
                union,
                xnn_fb::XNNQuantizedTensorValue::VT_QUANT_PARAMS_TYPE,
            )
            .map(|at| fb[at]);
            let num_scales = match kind {
                Some(k) if k == xnn_fb::XNNQuantParams::PerChannelQuant.0 => {
                    xnn_fb::PerChannelQuant::VT_NUM_SCALES
                }
                Some(k) if k == xnn_fb::XNNQuantParams::PerChannelGroupQuant.0 => {
                    xnn_fb::PerChannelGroupQuant::VT_NUM_SCALES
                }
                _ => continue,
            };
            if let Some(at) = params.and_then(|t| field(fb, t, num_scales)) {
                out.push(("num_scales of the first quantized constant", at));
                scales_done = true;
            }
        }
    }
    for (name, voffset) in [
        ("input_ids[0]", xnn_fb::XNNGraph::VT_INPUT_IDS),
        ("output_ids[0]", xnn_fb::XNNGraph::VT_OUTPUT_IDS),
    ] {
        let ids = field(fb, root, voffset).map(|at| follow(fb, at));
        if let Some(ids) = ids.filter(|&v| u32_at(fb, v) > 0) {
            out.push((name, ids + 4));
        }
    }
    out
}

/// A corrupted payload: the case, where the payload is, and its bytes as corrupted.
pub struct PayloadCase {
    pub case: Case,
    plan: usize,
    delegate: usize,
    plan_name: String,
    payload: Vec<u8>,
}

impl PayloadCase {
    /// Whether ptefs's decoder still reads the payload.
    fn decodes(&self) -> bool {
        decode(&self.payload).is_ok()
    }
}

/// The payload cases of one fixture.
fn payload_cases_of(f: &Fixture, rng: &mut Rng) -> Vec<PayloadCase> {
    let Some(sp) = segment_payload(f) else {
        return Vec::new();
    };
    let payload = &f.bytes[sp.start..sp.start + sp.len];
    let graph = decode(payload).expect("the fixture's payload decodes");
    // The payload's regions end here: a cut before this is a broken payload.
    let end = graph
        .flatbuffer
        .end()
        .max(graph.header.map_or(0, |h| h.constant_range().end())) as usize;
    let mut out = Vec::new();
    let mut push = |name: String, bytes: Vec<u8>, payload: Vec<u8>, must_flag: bool| {
        let mut files = vec![(f.path.clone(), bytes)];
        files.extend(f.data.iter().cloned());
        out.push(PayloadCase {
            case: Case {
                name: format!(
                    "{} payload of plan {} delegate {}: {name}",
                    f.path.display(),
                    sp.plan,
                    sp.delegate
                ),
                files,
                must_refuse: None,
                must_flag,
            },
            plan: sp.plan,
            delegate: sp.delegate,
            plan_name: sp.plan_name.clone(),
            payload,
        });
    };

    // Truncated: the segment says the payload is shorter.
    let mut cuts = vec![0, 1, 7, 8, 29, 30, 31, 32, 33, end / 2, end - 1, end];
    cuts.extend((0..4).map(|_| rng.below(end as u64) as usize));
    cuts.retain(|&c| c < sp.len);
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts {
        let mut program = program_of(&f.bytes);
        program.segments.as_mut().unwrap()[sp.segment].size = cut as u64;
        push(
            format!("truncated to {cut} of {} bytes", sp.len),
            rebuild_pte(&f.bytes, &program),
            payload[..cut].to_vec(),
            cut < end,
        );
    }

    // Bits flipped inside the payload.
    for _ in 0..24 {
        let at = rng.below(sp.len as u64) as usize;
        let bit = rng.below(8);
        let mut bytes = f.bytes.clone();
        bytes[sp.start + at] ^= 1 << bit;
        let p = bytes[sp.start..sp.start + sp.len].to_vec();
        push(format!("bit {bit} of byte {at} flipped"), bytes, p, false);
    }

    // Absurd sizes and counts.
    let mut set = |name: String, at: usize, value: &[u8], must_flag: bool| {
        let mut bytes = f.bytes.clone();
        bytes[sp.start + at..sp.start + at + value.len()].copy_from_slice(value);
        let p = bytes[sp.start..sp.start + sp.len].to_vec();
        push(name, bytes, p, must_flag);
    };
    if graph.header.is_some() {
        let len = sp.len as u32;
        for (field, at) in [
            ("flatbuffer_offset", 10),
            ("flatbuffer_size", 14),
            ("constant_data_offset", 18),
        ] {
            for v in [u32::MAX, 0x8000_0000, len + 1] {
                set(format!("XH00 {field} {v}"), at, &v.to_le_bytes(), true);
            }
        }
        for v in [u64::MAX, 1 << 62, u64::from(len) + 1] {
            set(
                format!("XH00 constant_data_size {v}"),
                22,
                &v.to_le_bytes(),
                true,
            );
        }
        for v in [0u16, 29, u16::MAX] {
            let broken = v < 30 || usize::from(v) > sp.len;
            set(
                format!("XH00 header length {v}"),
                8,
                &v.to_le_bytes(),
                broken,
            );
        }
    }
    let fb_start = graph.flatbuffer.start() as usize;
    let fb = &payload[fb_start..graph.flatbuffer.end() as usize];
    for (name, at) in flatbuffer_fields(fb) {
        // A vector longer than the payload and an id no value has cannot decode (u32::MAX
        // is "no value" for an optional input); a dims or scale count that disagrees with
        // the bytes is a size that check reports.
        let absurd = if name.contains("_ids") {
            [u32::MAX - 1, 0x3fff_ffff]
        } else {
            [u32::MAX, 0x3fff_ffff]
        };
        for v in absurd {
            set(format!("{name} {v}"), fb_start + at, &v.to_le_bytes(), true);
        }
    }
    out
}

/// Every payload case of every fixture with an XNNPACK payload in a segment.
pub fn payload_cases() -> Vec<PayloadCase> {
    // Seeded: the same cases on every run.
    let mut rng = Rng::new(0x5eed_2026_0002);
    fixtures()
        .iter()
        .flat_map(|f| payload_cases_of(f, &mut rng))
        .collect()
}

/// The payload cases as corpus cases, for the drivers.
pub fn cases(out: &mut Vec<Case>) {
    out.extend(payload_cases().into_iter().map(|c| c.case));
}

/// The bytes of every segment-backed named-data blob of the fixture's files, by path.
fn blob_paths(fs: &Fs) -> Vec<String> {
    walk(fs)
        .into_iter()
        .filter(|(p, _, k)| {
            *k == FileType::RegularFile
                && (p.starts_with("named_data/") || p.contains("/named_data/"))
                && p.ends_with(".bin")
        })
        .map(|(p, _, _)| p)
        .collect()
}

fn tree_of(files: &[(PathBuf, Vec<u8>)]) -> Fs {
    let parsed = files
        .iter()
        .map(|(p, b)| ModelFile::from_bytes(p, b.clone()).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let model = Model::from_files(parsed).unwrap_or_else(|e| panic!("{e}"));
    Fs::new(Tree::build(Arc::new(model)), Options { read_only: true })
}

/// Each corrupted payload opens; the delegate shows its bytes; the tree around it is the
/// fixture's own (every named-data blob and constant value reads the same); `xnnpack/`
/// exists exactly when the payload decodes; `check` names the delegate when it does not.
#[test]
fn corrupted_payloads_keep_the_rest_of_the_tree() {
    let cases = payload_cases();
    assert!(cases.len() > 300, "only {} payload cases", cases.len());
    let mut originals: Vec<(PathBuf, Fs)> = Vec::new();
    let (mut decoded, mut flagged) = (0, 0);
    for c in &cases {
        let name = &c.case.name;
        let model = &c.case.files[0].0;
        if !originals.iter().any(|(p, _)| p == model) {
            let mut files = vec![(model.clone(), std::fs::read(model).unwrap())];
            files.extend(c.case.files[1..].iter().cloned());
            originals.push((model.clone(), tree_of(&files)));
        }
        let original = &originals.iter().find(|(p, _)| p == model).unwrap().1;
        let fs = tree_of(&c.case.files);
        let delegate = format!("plans/{}/delegates/{}", c.plan_name, c.delegate);
        let processed = fs
            .tree()
            .find(&format!("{delegate}/processed.bin"))
            .unwrap();
        assert_eq!(
            read_all(&fs, processed, 1 << 20).unwrap(),
            c.payload,
            "{name}"
        );
        assert!(
            fs.tree()
                .find(&format!("{delegate}/delegate.json"))
                .is_some(),
            "{name}"
        );
        let has_tree = fs.tree().find(&format!("{delegate}/xnnpack")).is_some();
        assert_eq!(has_tree, c.decodes(), "{name}: xnnpack/ present");
        decoded += usize::from(has_tree);
        for p in blob_paths(original) {
            let a = read_all(original, original.tree().find(&p).unwrap(), 1 << 20).unwrap();
            let ino = fs
                .tree()
                .find(&p)
                .unwrap_or_else(|| panic!("{name}: {p} is gone"));
            assert_eq!(read_all(&fs, ino, 1 << 20).unwrap(), a, "{name}: {p}");
        }
        let defects = ptefs::check::defects(&fs.tree().model);
        let place = format!(
            "plan {} (\"{}\") delegate {} (XnnpackBackend)",
            c.plan, c.plan_name, c.delegate
        );
        if !c.decodes() {
            assert!(
                defects
                    .iter()
                    .any(|d| d.starts_with(&format!("{place}: the payload does not decode: "))),
                "{name}: {defects:?}"
            );
        }
        if c.case.must_flag {
            assert!(
                defects.iter().any(|d| d.starts_with(&place)),
                "{name}: {defects:?}"
            );
            flagged += 1;
        }
    }
    eprintln!(
        "{} payload cases: {decoded} still decode, {flagged} must be flagged",
        cases.len()
    );
    assert!(decoded > 0 && decoded < cases.len());
}

/// A sample of the payload cases through `ptefs check` and a real read-only mount: check
/// exits 1 naming the delegate for every flagged case; the mount serves the delegate's
/// bytes and the rest of the tree, answers reads of a view whose bytes no longer fit with
/// EIO, and unmounts.
#[test]
fn corrupted_payloads_through_check_and_a_mount() {
    if common::fuse_missing() {
        return;
    }
    let exe = env!("CARGO_BIN_EXE_ptefs");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let cases = payload_cases();
    // Every kind of corruption, on several fixtures.
    let step = cases.len() / 24;
    let mut mounted = 0;
    for (n, c) in cases.iter().enumerate().filter(|(n, _)| n % step == 0) {
        let name = &c.case.name;
        let case_dir = root.join(n.to_string());
        std::fs::create_dir(&case_dir).unwrap();
        let paths = c.case.write_to(&case_dir, "");
        let data: Vec<String> = paths[1..]
            .iter()
            .flat_map(|p| ["--data".to_string(), p.display().to_string()])
            .collect();
        let out = Command::new(exe)
            .arg("check")
            .arg(&paths[0])
            .args(&data)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let place = format!(
            "plan {} (\"{}\") delegate {}",
            c.plan, c.plan_name, c.delegate
        );
        if c.case.must_flag || !c.decodes() {
            assert_eq!(out.status.code(), Some(1), "{name}: {stdout}");
            assert!(
                stdout.lines().any(|l| l.starts_with(&place)),
                "{name}: {stdout}"
            );
        } else {
            assert!(
                matches!(out.status.code(), Some(0 | 1)),
                "{name}: {}",
                out.status
            );
        }

        let mnt = case_dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mut m = common::mount::Mount {
            dir: tempfile::tempdir().unwrap(),
            model: paths[0].clone(),
            data: paths[1..].to_vec(),
            mnt: mnt.clone(),
            args: vec!["--read-only".into()],
            live: false,
        };
        m.mount();
        mounted += 1;
        let delegate = mnt.join(format!("plans/{}/delegates/{}", c.plan_name, c.delegate));
        assert_eq!(
            std::fs::read(delegate.join("processed.bin")).unwrap(),
            c.payload,
            "{name}"
        );
        assert_eq!(delegate.join("xnnpack").exists(), c.decodes(), "{name}");
        // The tree of the written files, whose names the mount's data/ directories take.
        let model = Model::open(&paths[0], &paths[1..]).unwrap();
        let fs = Fs::new(Tree::build(Arc::new(model)), Options { read_only: true });
        for p in blob_paths(&fs) {
            let want = read_all(&fs, fs.tree().find(&p).unwrap(), 1 << 20).unwrap();
            assert_eq!(std::fs::read(mnt.join(&p)).unwrap(), want, "{name}: {p}");
        }
        if c.decodes() {
            read_views(&delegate.join("xnnpack"), name);
        }
        m.umount();
    }
    assert!(mounted >= 20, "{mounted} mounted");
}

/// Reads the first MiB of every file of a mounted `xnnpack/` tree: it reads, or a
/// float32 view whose bytes no longer fit its dims fails with EIO.
fn read_views(dir: &Path, name: &str) {
    use std::io::Read;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let mut buf = vec![0u8; 1 << 20];
            let mut f = std::fs::File::open(&p).unwrap();
            match f.read(&mut buf) {
                Ok(_) => {}
                Err(e)
                    if e.raw_os_error() == Some(libc::EIO)
                        && p.to_string_lossy().ends_with(".f32.npy") => {}
                Err(e) => panic!("{name}: {}: {e}", p.display()),
            }
        }
    }
}
