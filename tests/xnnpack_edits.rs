//! The XNNPACK trees of real exports, written and reported (docs/tree.md#xnnpack-delegates,
//! docs/writes.md#which-scales-are-fresh-and-which-are-kept): re-quantizing writes of
//! `values/<id>.f32.npy` through the core and through a real mount, with every byte of the
//! files they may and may not change; their refusals; `used_by` of `named_data/<key>.json`
//! against flatc's decoding of the payloads; `ptefs check` on payloads that do not decode or
//! name what is not there; and the float32 view of every datatype the fixtures have, pinned
//! against a NumPy implementation of the rules.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{json, Value};

use common::mount::{py, py_errno, python, run, text, Mount, BIN};
use common::{copy_files, fixture_files, fixtures_dir, fuse_missing, load_json, Copied};
use ptefs::backend::xnnpack::decode;
use ptefs::format::generated::xnn_fb;
use ptefs::format::layout::Location;
use ptefs::format::Model;
use ptefs::fs::{Fs, Options};
use ptefs::tree::Tree;

// ---- fixtures and files ----

/// The model file and data files of fixture `name` (`"llama_8da4w"`, `"extra/xnnpack_q8"`).
fn fixture(name: &str) -> (PathBuf, Vec<PathBuf>) {
    fixture_files(&fixtures_dir().join(format!("{name}.pte.json")))
}

fn copy(name: &str) -> Copied {
    let (model, data) = fixture(name);
    copy_files(&model, &data)
}

/// A model file and its data files (the model first), each with its bytes now.
fn read_files(model: &Path, data: &[PathBuf]) -> Vec<(PathBuf, Vec<u8>)> {
    std::iter::once(model)
        .chain(data.iter().map(PathBuf::as_path))
        .map(|p| (p.to_path_buf(), std::fs::read(p).unwrap()))
        .collect()
}

fn contents(c: &Copied) -> Vec<(PathBuf, Vec<u8>)> {
    read_files(&c.model, &c.data)
}

fn open(c: &Copied) -> Fs {
    let model = Model::open_writable(&c.model, &c.data).unwrap();
    Fs::new(Tree::build(Arc::new(model)), Options { read_only: false })
}

fn read(fs: &Fs, path: &str) -> Vec<u8> {
    let ino = fs.tree().find(path).unwrap_or_else(|| panic!("no {path}"));
    common::read_all(fs, ino, 1 << 20).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn read_json(fs: &Fs, path: &str) -> Value {
    serde_json::from_slice(&read(fs, path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Replaces the content of `path` the way `cp` does: O_TRUNC, writes, close.
fn replace(fs: &Fs, path: &str, data: &[u8]) -> Result<(), ptefs::error::Error> {
    let ino = fs.tree().find(path).unwrap_or_else(|| panic!("no {path}"));
    let fh = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC)?.fh;
    let mut off = 0;
    for chunk in data.chunks(4096) {
        fs.write(fh, off, chunk)?;
        off += chunk.len() as u64;
    }
    let flushed = fs.flush(fh);
    fs.release(fh)?;
    flushed
}

/// A `.npy` (version 1.0) of `descr` values shaped `dims`, written out by hand.
fn npy(descr: &str, dims: &[u64], data: &[u8]) -> Vec<u8> {
    let shape = match dims {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            dims.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    out
}

fn f32_npy(dims: &[u64], values: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy("<f4", dims, &data)
}

/// The float32 values of a `.npy` of `<f4` (version 1.0 header).
fn npy_f32(bytes: &[u8]) -> Vec<f32> {
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let header = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert!(text(&bytes[10..10 + header]).contains("'<f4'"));
    bytes[10 + header..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("{v} is not a list"))
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect()
}

/// A byte range of a model file, as a `.json` names it: `file` (the file's name, which is
/// unique among a model's files), `file_offset` and `nbytes` (or `size`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Span {
    file: String,
    start: u64,
    end: u64,
}

impl Span {
    fn of(j: &Value) -> Span {
        let start = j["file_offset"].as_u64().unwrap();
        let len = j.get("nbytes").unwrap_or(&j["size"]).as_u64().unwrap();
        let file = Path::new(j["file"].as_str().unwrap()).file_name().unwrap();
        Span {
            file: file.to_string_lossy().into_owned(),
            start,
            end: start + len,
        }
    }

    /// Whether the span lies in `path` and holds byte `at` of it.
    fn holds(&self, path: &Path, at: u64) -> bool {
        path.file_name().is_some_and(|n| *n == *self.file) && (self.start..self.end).contains(&at)
    }

    fn bytes<'a>(&self, files: &'a [(PathBuf, Vec<u8>)]) -> &'a [u8] {
        let (_, b) = files
            .iter()
            .find(|(p, _)| p.file_name().is_some_and(|n| *n == *self.file))
            .unwrap_or_else(|| panic!("no file {} among the model's", self.file));
        &b[self.start as usize..self.end as usize]
    }
}

/// Every byte that differs between two versions of the same files, as (file, offset).
fn changed_bytes(
    before: &[(PathBuf, Vec<u8>)], after: &[(PathBuf, Vec<u8>)],
) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for ((p, a), (q, b)) in before.iter().zip(after) {
        assert_eq!(p, q);
        assert_eq!(a.len(), b.len(), "{} changed size", p.display());
        out.extend(
            a.iter()
                .zip(b)
                .enumerate()
                .filter(|(_, (x, y))| x != y)
                .map(|(i, _)| (p.clone(), i as u64)),
        );
    }
    out
}

fn f32_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn i32_le(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

// ---- XNNPACK values as the tree shows them ----

/// A constant of a decoded payload, by its tree paths and `.json`.
#[derive(Debug, Clone)]
struct XValue {
    /// `plans/<p>/delegates/<j>/xnnpack/values/<id>` (add `.json`, `.f32.npy`, ...).
    base: String,
    json: Value,
}

impl XValue {
    fn datatype(&self) -> &str {
        self.json["datatype"].as_str().unwrap()
    }

    fn dims(&self) -> Vec<u64> {
        u64s(&self.json["dims"])
    }

    fn numel(&self) -> usize {
        self.dims().iter().product::<u64>() as usize
    }

    fn data(&self) -> Span {
        Span::of(&self.json["constant"])
    }

    fn scales(&self) -> Span {
        Span::of(&self.json["quant"]["scales"])
    }

    fn roles(&self) -> Vec<&str> {
        self.json["used_by"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["role"].as_str().unwrap())
            .collect()
    }

    /// The scale index of each element, for a filter `[out, …]` (per tensor, per channel
    /// along `channel_dim`, or per group of `[out, in]`), as the schema defines them.
    fn scale_index(&self) -> Vec<usize> {
        let dims = self.dims();
        let n = self.numel();
        let q = &self.json["quant"];
        match q["type"].as_str().unwrap() {
            "PerTensorQuant" => vec![0; n],
            "PerChannelQuant" => {
                let cd = q["channel_dim"].as_u64().unwrap() as usize;
                let inner: u64 = dims[cd + 1..].iter().product();
                (0..n as u64)
                    .map(|e| ((e / inner) % dims[cd]) as usize)
                    .collect()
            }
            "PerChannelGroupQuant" => {
                let group = q["group_size"].as_u64().unwrap();
                let cols = dims[1];
                (0..n as u64)
                    .map(|e| ((e / cols) * (cols / group) + (e % cols) / group) as usize)
                    .collect()
            }
            t => panic!("{}: quant type {t}", self.base),
        }
    }

    /// The scales stored at `scales()` in `files`, as the runtime reads them.
    fn scale_values(&self, files: &[(PathBuf, Vec<u8>)]) -> Vec<f32> {
        let b = self.scales().bytes(files);
        match self.json["quant"]["scales"]["dtype"].as_str().unwrap() {
            "fp32" => f32_le(b),
            "bf16" => b
                .chunks_exact(2)
                .map(|h| f32::from_bits(u32::from(u16::from_le_bytes([h[0], h[1]])) << 16))
                .collect(),
            d => panic!("scale dtype {d}"),
        }
    }
}

/// Every XNNPACK value `.json` of the tree.
fn xvalues(fs: &Fs) -> Vec<XValue> {
    common::walk(fs)
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| p.contains("/xnnpack/values/") && p.ends_with(".json"))
        .map(|p| XValue {
            base: p.trim_end_matches(".json").to_string(),
            json: read_json(fs, &p),
        })
        .collect()
}

/// The first XNNPACK value of `datatype` in the tree.
fn first_value(fs: &Fs, datatype: &str) -> XValue {
    xvalues(fs)
        .into_iter()
        .find(|v| v.datatype() == datatype)
        .unwrap_or_else(|| panic!("no {datatype} value"))
}

/// How a test reads the `.json` files of a tree (through the core or a mount): the parsed
/// file at a path, None when there is none.
type JsonAt<'a> = &'a dyn Fn(&str) -> Option<Value>;

fn core_json(fs: &Fs) -> impl Fn(&str) -> Option<Value> + '_ {
    move |p| fs.tree().find(p).map(|_| read_json(fs, p))
}

/// The graph (`graph.json`) of the payload a value belongs to.
fn graph_of(json: JsonAt, v: &XValue) -> Value {
    let dir = &v.base[..v.base.find("/values/").unwrap()];
    json(&format!("{dir}/graph.json")).expect("graph.json")
}

/// The value `id` of the payload `v` belongs to.
fn sibling(json: JsonAt, v: &XValue, id: u64) -> Option<XValue> {
    let base = format!("{}/{id}", &v.base[..v.base.rfind('/').unwrap()]);
    let j = json(&format!("{base}.json"))?;
    Some(XValue { base, json: j })
}

/// The int32 constant biases of the nodes that use `filter` as their filter.
fn int32_biases(json: JsonAt, filter: &XValue) -> Vec<XValue> {
    let graph = graph_of(json, filter);
    let mut out: Vec<XValue> = Vec::new();
    for u in filter.json["used_by"].as_array().unwrap() {
        let node = &graph["xnodes"][u["node"].as_u64().unwrap() as usize]["xnode_union"];
        let Some(bias) = node["bias_id"]
            .as_u64()
            .and_then(|b| sibling(json, filter, b))
        else {
            continue;
        };
        if matches!(bias.datatype(), "qint32" | "qcint32")
            && !bias.json["constant"].is_null()
            && !out.iter().any(|o| o.base == bias.base)
        {
            out.push(bias);
        }
    }
    out
}

/// The input scale of the node that uses `filter` (a static per-tensor `qint8` input).
fn input_scale(json: JsonAt, filter: &XValue) -> f32 {
    let graph = graph_of(json, filter);
    let node = filter.json["used_by"][0]["node"].as_u64().unwrap() as usize;
    let input = graph["xnodes"][node]["xnode_union"]["input1_id"]
        .as_u64()
        .unwrap();
    let j = sibling(json, filter, input).expect("the node's input");
    j.json["quant"]["scale"].as_f64().unwrap() as f32
}

/// The largest magnitude a fresh symmetric scale maps to, by datatype
/// (docs/writes.md#which-scales-are-fresh-and-which-are-kept).
fn qmax(datatype: &str) -> f32 {
    match datatype {
        "qcint4" | "qbint4" => 7.0,
        "qint8" | "qcint8" => 127.0,
        d => panic!("no fresh scales for {d}"),
    }
}

/// New float values for a filter: the current ones scaled and shifted, so that every
/// channel and group gets another scale.
fn new_values(old: &[f32]) -> Vec<f32> {
    let largest = old.iter().fold(0f32, |m, v| m.max(v.abs()));
    old.iter()
        .enumerate()
        .map(|(i, v)| v * 1.75 + largest * 0.03 * ((i % 7) as f32 - 3.0))
        .collect()
}

/// What a re-quantizing write of `filter` (from `old` to `new` values) must have done to
/// the files (`before` → `after`): changed its weights and scales, and its int32 biases by
/// the ratio of old to new filter scales, and nothing else; `read_back` (its `.f32.npy`
/// now) is within half a fresh step of `new`.
#[allow(clippy::too_many_arguments)]
fn check_requantized(
    what: &str, filter: &XValue, biases: &[XValue], input_scale: Option<f32>, new: &[f32],
    read_back: &[f32], before: &[(PathBuf, Vec<u8>)], after: &[(PathBuf, Vec<u8>)],
) {
    let mut allowed = vec![filter.data(), filter.scales()];
    for b in biases {
        allowed.extend([b.data(), b.scales()]);
    }
    for (file, at) in changed_bytes(before, after) {
        assert!(
            allowed.iter().any(|s| s.holds(&file, at)),
            "{what}: byte {at} of {} changed, outside the weights {:?}, scales {:?} and biases",
            file.display(),
            filter.data(),
            filter.scales()
        );
    }
    assert_ne!(
        filter.data().bytes(before),
        filter.data().bytes(after),
        "{what}: weights unchanged"
    );
    assert_ne!(
        filter.scales().bytes(before),
        filter.scales().bytes(after),
        "{what}: scales unchanged"
    );
    // Fresh scales: the largest magnitude of each channel or group over qmax, so every
    // value lands within half a step of what was written.
    let index = filter.scale_index();
    let new_scales = filter.scale_values(after);
    let mut largest = vec![0f32; new_scales.len()];
    for (e, v) in new.iter().enumerate() {
        largest[index[e]] = largest[index[e]].max(v.abs());
    }
    let q = qmax(filter.datatype());
    for (s, (&stored, &m)) in new_scales.iter().zip(&largest).enumerate() {
        // bf16 scales keep 8 bits of mantissa.
        assert!(
            (stored - m / q).abs() <= m / q * 0.004 + f32::MIN_POSITIVE,
            "{what}: scale {s} is {stored}, expected about {} (largest {m} / {q})",
            m / q
        );
    }
    assert_eq!(read_back.len(), new.len());
    for (e, (&got, &want)) in read_back.iter().zip(new).enumerate() {
        let step = new_scales[index[e]];
        assert!(
            (got - want).abs() <= 0.5 * step * 1.01 + want.abs() * 1e-6,
            "{what}: element {e} reads {got}, {want} was written (step {step})"
        );
    }
    // Each int32 bias is in units of input scale × filter scale: the float value the
    // runtime adds must stay what it was, and the bias's own view with it.
    let old_scales = filter.scale_values(before);
    for bias in biases {
        let (q0, q1) = (
            i32_le(bias.data().bytes(before)),
            i32_le(bias.data().bytes(after)),
        );
        let s_in = input_scale.expect("a static input scale");
        for c in 0..q0.len() {
            let f = if old_scales.len() == 1 { 0 } else { c };
            let was = f64::from(q0[c]) * f64::from(s_in) * f64::from(old_scales[f]);
            let now = f64::from(q1[c]) * f64::from(s_in) * f64::from(new_scales[f]);
            let unit = f64::from(s_in) * f64::from(new_scales[f]);
            assert!(
                (was - now).abs() <= 0.5 * unit * 1.001,
                "{what}: bias {} element {c}: {} -> {} ({was} -> {now})",
                bias.base,
                q0[c],
                q1[c]
            );
        }
        let bias_scales = bias.scale_values(after);
        for (c, (&bs, &fs_new)) in bias_scales
            .iter()
            .zip(new_scales.iter().cycle())
            .enumerate()
        {
            let want = s_in * fs_new;
            assert!(
                (bs - want).abs() <= want * 1e-5,
                "{what}: bias {} scale {c} is {bs}, expected input × filter scale {want}",
                bias.base
            );
        }
    }
}

/// Re-quantizing writes of one filter of each quantized datatype through the core.
#[test]
fn f32_writes_requantize_weights_scales_and_int32_biases_and_nothing_else() {
    // (fixture, datatype, whether its filters have int32 biases to rescale)
    let cases = [
        ("extra/xnn_qb4_linear", "qbint4", false),
        ("extra/xnn_qc4_linear", "qcint4", false),
        ("extra/xnn_qd8_qc8_linear", "qcint8", false),
        ("extra/xnnpack_q8", "qcint8", true),
        ("extra/xnn_qc8_conv", "qcint8", true),
        ("extra/xnn_qs8_linear", "qint8", true),
        ("llama_8da4w", "qbint4", false),
        ("llama_qc4", "qcint4", false),
    ];
    for (name, datatype, biased) in cases {
        let filters: Vec<XValue> = {
            let c = copy(name);
            xvalues(&open(&c))
                .into_iter()
                .filter(|v| v.datatype() == datatype && v.roles() == ["filter"])
                .collect()
        };
        assert!(!filters.is_empty(), "{name}: no {datatype} filter");
        // Every filter of the small fixtures, the first of the LLMs.
        let take = if name.starts_with("llama") {
            1
        } else {
            filters.len()
        };
        for base in filters.iter().take(take).map(|f| &f.base) {
            let what = format!("{name} {base}");
            let c = copy(name);
            let fs = open(&c);
            // The copy's own paths: the `.json` names the files it reads.
            let filter = XValue {
                base: base.clone(),
                json: read_json(&fs, &format!("{base}.json")),
            };
            let before = contents(&c);
            let f32_path = format!("{}.f32.npy", filter.base);
            let old = npy_f32(&read(&fs, &f32_path));
            assert_eq!(old.len(), filter.numel(), "{what}");
            let biases: Vec<(XValue, Vec<f32>)> = int32_biases(&core_json(&fs), &filter)
                .into_iter()
                .map(|b| {
                    let view = npy_f32(&read(&fs, &format!("{}.f32.npy", b.base)));
                    (b, view)
                })
                .collect();
            assert_eq!(!biases.is_empty(), biased, "{what}: int32 biases");
            let s_in = biased.then(|| input_scale(&core_json(&fs), &filter));
            let new = new_values(&old);
            replace(&fs, &f32_path, &f32_npy(&filter.dims(), &new))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let after = contents(&c);
            let back = npy_f32(&read(&fs, &f32_path));
            let bias_values: Vec<XValue> = biases.iter().map(|(b, _)| b.clone()).collect();
            check_requantized(
                &what,
                &filter,
                &bias_values,
                s_in,
                &new,
                &back,
                &before,
                &after,
            );
            for (b, view_before) in &biases {
                // The bias's own view follows its rescaled scales: the same floats, within
                // half a step of its new unit.
                let view = npy_f32(&read(&fs, &format!("{}.f32.npy", b.base)));
                let unit = b.scale_values(&after);
                for (c, (x, y)) in view.iter().zip(view_before).enumerate() {
                    assert!(
                        (x - y).abs() <= 0.5 * unit[c % unit.len()] * 1.01 + y.abs() * 1e-6,
                        "{what}: bias {} element {c}: {y} -> {x}",
                        b.base
                    );
                }
            }
            // A fresh mount of the files shows what the commit left.
            let again = open(&c);
            assert_eq!(
                npy_f32(&read(&again, &f32_path)),
                back,
                "{what}: after a remount"
            );
            assert!(
                ptefs::check::defects(&again.tree().model).is_empty(),
                "{what}: {:?}",
                ptefs::check::defects(&again.tree().model)
            );
        }
    }
}

/// An int32 bias keeps its stored scales (its unit is input scale × filter scale): a write
/// of its view changes only its integers, and a value those scales cannot hold is refused.
#[test]
fn bias_f32_writes_keep_the_stored_scales() {
    let c = copy("extra/xnnpack_q8");
    let fs = open(&c);
    let bias = first_value(&fs, "qcint32");
    let path = format!("{}.f32.npy", bias.base);
    let old = npy_f32(&read(&fs, &path));
    let before = contents(&c);
    let doubled: Vec<f32> = old.iter().map(|v| v * 2.0).collect();
    replace(&fs, &path, &f32_npy(&bias.dims(), &doubled)).unwrap();
    let after = contents(&c);
    for (file, at) in changed_bytes(&before, &after) {
        let d = bias.data();
        assert!(
            d.holds(&file, at),
            "byte {at} of {} changed outside the bias's integers",
            file.display()
        );
    }
    let q0 = i32_le(bias.data().bytes(&before));
    let q1 = i32_le(bias.data().bytes(&after));
    for (a, b) in q0.iter().zip(&q1) {
        assert!((i64::from(*b) - 2 * i64::from(*a)).abs() <= 1, "{a} -> {b}");
    }

    let mut huge = doubled.clone();
    huge[1] = 1e30;
    let e = replace(&fs, &path, &f32_npy(&bias.dims(), &huge)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    for words in [
        "element 1",
        "not representable with its stored scale",
        "stored scales are kept",
    ] {
        assert!(e.message().contains(words), "{e}");
    }
    assert_eq!(contents(&c), after, "a refused write changed the files");
}

// ---- payloads patched in place ----

/// Plan 0 delegate 0's payload in a model file: where it starts in the file, where its
/// flatbuffer starts in it, and its bytes.
struct Payload {
    file_offset: usize,
    flatbuffer: usize,
    bytes: Vec<u8>,
}

impl Payload {
    fn of(model: &Path) -> Payload {
        let m = Model::open(model, &[] as &[PathBuf]).unwrap();
        let loc: Location = m.pte_layout.as_ref().unwrap().plans[0].delegates[0]
            .clone()
            .unwrap();
        assert_eq!(loc.file, 0);
        let bytes = m.files[0].read(loc.range).unwrap().to_vec();
        let flatbuffer = decode(&bytes).unwrap().flatbuffer.start() as usize;
        Payload {
            file_offset: loc.range.start() as usize,
            flatbuffer,
            bytes,
        }
    }

    fn graph(&self) -> xnn_fb::XNNGraph<'_> {
        flatbuffers::root::<xnn_fb::XNNGraph>(&self.bytes[self.flatbuffer..]).unwrap()
    }

    /// The file offset of field `voffset` of `table` (a table of this payload's flatbuffer).
    fn field(&self, table: &flatbuffers::Table, voffset: u16) -> usize {
        let at = table.vtable().get(voffset);
        assert_ne!(at, 0, "the field is not stored");
        self.file_offset + self.flatbuffer + table.loc() + usize::from(at)
    }

    /// The file offset of the first occurrence of `needle` in the payload.
    fn find(&self, needle: &[u8]) -> usize {
        let at = self
            .bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("the bytes are in the payload");
        self.file_offset + at
    }

    /// The quantized value `id` of the graph.
    fn quantized(&self, id: u32) -> xnn_fb::XNNQuantizedTensorValue<'_> {
        self.graph()
            .xvalues()
            .unwrap()
            .iter()
            .filter_map(|v| v.xvalue_union_as_xnnquantized_tensor_value())
            .find(|q| q.tensor_value().unwrap().id_out() == id)
            .unwrap()
    }
}

fn patch(path: &Path, at: usize, bytes: &[u8]) {
    let mut b = std::fs::read(path).unwrap();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, b).unwrap();
}

/// `xnn_qc8_conv` with the depthwise filter %6 reading the scale blob of the first filter
/// %3 (both are four fp32 scales): what ExecuTorch writes when two filters have equal
/// scales, since it stores equal bytes once under one key.
fn shared_scales() -> Copied {
    let c = copy("extra/xnn_qc8_conv");
    let p = Payload::of(&c.model);
    let first = p.quantized(3).quant_params_as_per_channel_quant().unwrap();
    let depthwise = p.quantized(6).quant_params_as_per_channel_quant().unwrap();
    let at = p.field(
        &depthwise._tab,
        xnn_fb::PerChannelQuant::VT_SCALE_BUFFER_IDX,
    );
    patch(&c.model, at, &first.scale_buffer_idx().to_le_bytes());
    c
}

/// Every refusal of a `.f32.npy` write says why with EINVAL, and changes no byte.
#[test]
fn f32_write_refusals_say_why_and_change_nothing() {
    let c = copy("llama_8da4w");
    let fs = open(&c);
    let filter = first_value(&fs, "qbint4");
    let path = format!("{}.f32.npy", filter.base);
    let dims = filter.dims();
    let old = npy_f32(&read(&fs, &path));
    let before = contents(&c);
    let mut nan = old.clone();
    nan[5] = f32::NAN;
    let mut inf = old.clone();
    inf[7] = f32::NEG_INFINITY;
    let reshaped = [dims[0] / 2, dims[1] * 2];
    let doubles: Vec<u8> = old
        .iter()
        .flat_map(|v| f64::from(*v).to_le_bytes())
        .collect();
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "shape",
            f32_npy(&reshaped, &old),
            &[".npy shape differs", "expected [64, 64]"],
        ),
        (
            "fewer values",
            f32_npy(&dims, &old[..old.len() - 1]),
            &[".npy data is", "expected 16384"],
        ),
        (
            "dtype",
            npy("<f8", &dims, &doubles),
            &[".npy dtype differs", "expected '<f4'", "found '<f8'"],
        ),
        (
            "NaN",
            f32_npy(&dims, &nan),
            &["element 5 is NaN", "only finite"],
        ),
        ("infinity", f32_npy(&dims, &inf), &["element 7 is -inf"]),
        ("not a .npy", b"0.5 0.25\n".to_vec(), &["not a .npy file"]),
    ];
    for (what, content, words) in cases {
        let e = replace(&fs, &path, &content).expect_err(what);
        assert_eq!(e.errno(), libc::EINVAL, "{what}: {e}");
        for w in words {
            assert!(e.message().contains(w), "{what}: {e}");
        }
        assert_eq!(
            contents(&c),
            before,
            "{what}: the refused write changed the files"
        );
        assert_eq!(npy_f32(&read(&fs, &path)), old, "{what}");
    }

    let c = shared_scales();
    let fs = open(&c);
    assert!(ptefs::check::defects(&fs.tree().model).is_empty());
    let before = contents(&c);
    let dir = "plans/forward/delegates/0/xnnpack/values";
    for (id, other) in [(3, 6), (6, 3)] {
        let v = read_json(&fs, &format!("{dir}/{id}.json"));
        let dims = u64s(&v["dims"]);
        let path = format!("{dir}/{id}.f32.npy");
        let new = new_values(&npy_f32(&read(&fs, &path)));
        let e = replace(&fs, &path, &f32_npy(&dims, &new)).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        let words = format!("value %{other} of plan 0 delegate 0 reads the scales of %{id}");
        assert!(e.message().contains(&words), "{e}");
        assert_eq!(
            contents(&c),
            before,
            "%{id}: the refused write changed the files"
        );
    }
}

// ---- ptefs check ----

/// `ptefs check` of `model` with `data`: (exit code, stdout lines, stderr).
fn check(model: &Path, data: &[PathBuf]) -> (Option<i32>, Vec<String>, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("check").arg(model);
    for d in data {
        cmd.arg("--data").arg(d);
    }
    let out = run(&mut cmd);
    (
        out.status.code(),
        text(&out.stdout).lines().map(str::to_string).collect(),
        text(&out.stderr),
    )
}

/// `check` found exactly `lines` defects, each containing its words, and said so.
fn expect_defects(c: &Copied, lines: &[&[&str]]) {
    let (code, out, err) = check(&c.model, &c.data);
    assert_eq!(code, Some(1), "exit status; stdout {out:?}, stderr {err}");
    assert_eq!(out.len(), lines.len(), "{out:?}");
    for (line, words) in out.iter().zip(lines) {
        for w in *words {
            assert!(line.contains(w), "{line:?} lacks {w:?}");
        }
    }
    let summary = format!("ptefs: {}: {} defect(s)", c.model.display(), lines.len());
    assert_eq!(err.trim(), summary);
}

/// The tree still shows the rest of the file: the delegate keeps `delegate.json` and
/// `processed.bin`, and every named-data blob reads as it is in the file.
fn rest_of_tree_served(c: &Copied, decoded: bool) {
    let model = Model::open(&c.model, &c.data).unwrap();
    let fs = Fs::new(Tree::build(Arc::new(model)), Options { read_only: true });
    let delegate = "plans/forward/delegates/0";
    assert!(fs
        .tree()
        .find(&format!("{delegate}/processed.bin"))
        .is_some());
    assert!(fs
        .tree()
        .find(&format!("{delegate}/delegate.json"))
        .is_some());
    assert_eq!(
        fs.tree().find(&format!("{delegate}/xnnpack")).is_some(),
        decoded
    );
    let files = contents(c);
    for (p, _, _) in common::walk(&fs) {
        if p.starts_with("named_data/") && p.ends_with(".json") {
            let j = read_json(&fs, &p);
            let bin = read(&fs, &p.replace(".json", ".bin"));
            assert_eq!(bin, Span::of(&j).bytes(&files), "{p}");
        }
    }
}

/// `fixture` copied and changed in place by `edit` (given the copy and the payload of
/// plan 0 delegate 0): `check` must report exactly the defects `lines`, and the tree still
/// serve the rest of the file, with an `xnnpack/` directory when `decoded`.
fn check_patched(
    fixture: &str, edit: impl FnOnce(&Copied, &Payload), lines: &[&[&str]], decoded: bool,
) {
    let c = copy(fixture);
    edit(&c, &Payload::of(&c.model));
    expect_defects(&c, lines);
    rest_of_tree_served(&c, decoded);
}

#[test]
fn check_reports_a_payload_that_does_not_decode() {
    let identifier = |c: &Copied, p: &Payload| {
        // The flatbuffer's file identifier, at byte 4 of the flatbuffer.
        assert_eq!(&p.bytes[p.flatbuffer + 4..p.flatbuffer + 8], b"XN01");
        patch(&c.model, p.file_offset + p.flatbuffer + 4, b"XN99");
    };
    let words: &[&str] = &[
        "plan 0 (\"forward\") delegate 0 (XnnpackBackend): the payload does not decode",
        "XN00 or XN01",
        "XN99",
    ];
    check_patched("extra/xnn_qb4_linear", identifier, &[words], false);
}

#[test]
fn check_reports_an_index_out_of_range() {
    let filter_id = |c: &Copied, p: &Payload| {
        let fc = p
            .graph()
            .xnodes()
            .unwrap()
            .iter()
            .find_map(|n| n.xnode_union_as_xnnfully_connected())
            .unwrap();
        let at = p.field(&fc._tab, xnn_fb::XNNFullyConnected::VT_FILTER_ID);
        patch(&c.model, at, &999u32.to_le_bytes());
    };
    let words: &[&str] = &[
        "plan 0 (\"forward\") delegate 0 (XnnpackBackend): the payload does not decode",
        "filter_id",
        "999",
    ];
    check_patched("extra/xnn_qb4_linear", filter_id, &[words], false);

    let constant_index = |c: &Copied, p: &Payload| {
        let filter = p.quantized(2).tensor_value().unwrap();
        let at = p.field(&filter._tab, xnn_fb::XNNTensorValue::VT_CONSTANT_BUFFER_IDX);
        patch(&c.model, at, &77u32.to_le_bytes());
    };
    let words: &[&str] = &[
        "the payload does not decode",
        "constant_buffer_idx",
        "77",
        "constant_data entries",
    ];
    check_patched("extra/xnn_qb4_linear", constant_index, &[words], false);
}

/// Changes the last character of `key` where the payload names it; returns the new key.
fn rename_key(c: &Copied, p: &Payload, key: &str) -> String {
    patch(&c.model, p.find(key.as_bytes()) + key.len() - 1, b"z");
    format!("{}z", &key[..key.len() - 1])
}

#[test]
fn check_reports_named_keys_that_no_attached_file_has() {
    // Alone: the key is missing from the program, and a .ptd may hold it.
    let key = {
        let c = copy("extra/xnn_qb4_linear");
        let filter = read_json(&open(&c), "plans/forward/delegates/0/xnnpack/values/2.json");
        filter["constant"]["named_key"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let missing = format!("{}z", &key[..key.len() - 1]);
    let needs = format!("needs named data \"{missing}\"");
    let words: &[&str] = &[
        "plan 0 (\"forward\") delegate 0 (XnnpackBackend): value %2 (qbint4[4,64])",
        &needs,
        "which the program does not have (attach its .ptd with --data)",
    ];
    let edit = |c: &Copied, p: &Payload| assert_eq!(rename_key(c, p, &key), missing);
    check_patched("extra/xnn_qb4_linear", edit, &[words], true);

    // With its .ptd attached: the key is in no file at hand.
    let filter = {
        let c = copy("llama_8da4w");
        first_value(&open(&c), "qbint4")
    };
    let key = filter.json["quant"]["scales"]["named_key"]
        .as_str()
        .unwrap();
    let missing = format!("{}z", &key[..key.len() - 1]);
    let needs = format!(
        "value %{} (qbint4[64,64]) scales needs named data \"{missing}\"",
        filter.json["id"]
    );
    let words: &[&str] = &[&needs, "which no attached file has"];
    let edit = |c: &Copied, p: &Payload| assert_eq!(rename_key(c, p, key), missing);
    check_patched("llama_8da4w", edit, &[words], true);
}

// ---- the float32 views against NumPy ----

/// Every fixture manifest of a `.pte` whose payloads flatc decoded for XNNPACK.
fn xnnpack_manifests() -> Vec<PathBuf> {
    common::manifests()
        .into_iter()
        .filter(|m| m.to_string_lossy().ends_with(".pte.json"))
        .filter(|m| {
            load_json(m)["plans"].as_array().unwrap().iter().any(|p| {
                p["delegates"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|d| d.get("xnnpack").is_some())
            })
        })
        .collect()
}

/// Each `.f32.npy` of every fixture equals, bit for bit, what `tests/xnnpack_reference.py`
/// computes in NumPy from the raw bytes and flatc's decoding of the payload; the tree has
/// a view exactly where the reference has one; and the fixtures cover every stored
/// datatype.
#[test]
fn f32_views_of_every_datatype_match_a_numpy_reference() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/xnnpack_reference.py");
    let mut seen = BTreeSet::new();
    for manifest in xnnpack_manifests() {
        let name = manifest.display().to_string();
        let out = tempfile::tempdir().unwrap();
        let done = run(Command::new(python())
            .arg(&script)
            .arg(&manifest)
            .arg(out.path()));
        assert!(
            done.status.success(),
            "{name}: the reference failed: {}",
            text(&done.stderr)
        );
        let stdout = text(&done.stdout);
        let (model, data) = fixture_files(&manifest);
        let m = Model::open(&model, &data).unwrap();
        let fs = Fs::new(Tree::build(Arc::new(m)), Options { read_only: true });
        let mut expected = BTreeSet::new();
        for line in stdout.lines() {
            let (place, datatype) = line.split_once(' ').unwrap();
            let mut parts = place.split('/');
            let (plan, j, id) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            let path = format!("plans/{plan}/delegates/{j}/xnnpack/values/{id}.f32.npy");
            let want = std::fs::read(out.path().join(format!("{plan}/{j}/{id}.f32"))).unwrap();
            let got = read(&fs, &path);
            let got = &got[got.len() - want.len()..];
            if got != want.as_slice() {
                let (a, b) = (f32_le(got), f32_le(&want));
                let k = a
                    .iter()
                    .zip(&b)
                    .position(|(x, y)| x.to_bits() != y.to_bits())
                    .unwrap();
                panic!(
                    "{name}: {path} ({datatype}): element {k} is {}, NumPy says {}",
                    a[k], b[k]
                );
            }
            expected.insert(path);
            seen.insert(datatype.to_string());
        }
        let views: BTreeSet<String> = common::walk(&fs)
            .into_iter()
            .map(|(p, _, _)| p)
            .filter(|p| p.ends_with(".f32.npy"))
            .collect();
        assert_eq!(views, expected, "{name}: the views the tree has");
    }
    let all = [
        "bf16", "fp16", "qbint4", "qcint4", "qcint8", "qcint32", "qint8", "qint32",
    ];
    let missing: Vec<&str> = all.iter().copied().filter(|d| !seen.contains(*d)).collect();
    assert!(missing.is_empty(), "no fixture has {missing:?}");
}

// ---- used_by ----

/// `used_by` of each named-data key, from flatc's decoding of the payloads in `manifest`:
/// every value whose constant or scales name the key, by plan, delegate and value.
fn expected_used_by(manifest: &Value) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for plan in manifest["plans"].as_array().unwrap() {
        for (j, d) in plan["delegates"].as_array().unwrap().iter().enumerate() {
            let Some(xnn) = d.get("xnnpack") else {
                continue;
            };
            let key_of = |idx: u64| -> Option<String> {
                let c = &xnn["constant_data"][idx as usize];
                c["named_key"]
                    .as_str()
                    .filter(|k| !k.is_empty())
                    .map(str::to_string)
            };
            for v in xnn["values"].as_array().unwrap() {
                let entry = |role: &str| {
                    json!({
                        "path": format!(
                            "plans/{}/delegates/{j}/xnnpack/values/{}",
                            plan["name"].as_str().unwrap(),
                            v["id_out"]
                        ),
                        "role": role,
                        "datatype": v["datatype"].as_str().unwrap().trim_start_matches("xnn_datatype_"),
                        "dims": v["dims"],
                    })
                };
                let idx = v["constant_buffer_idx"].as_u64().unwrap();
                if let Some(k) = (idx != 0).then(|| key_of(idx)).flatten() {
                    out.entry(k).or_default().push(entry("constant"));
                }
                let scale = v["quant"]["scale_buffer_idx"].as_u64().unwrap_or(0);
                if let Some(k) = (scale != 0).then(|| key_of(scale)).flatten() {
                    out.entry(k).or_default().push(entry("scale"));
                }
            }
        }
    }
    out
}

/// `named_data/<key>.json` of the tree root `root` (`""` or `data/<stem>/`): key → used_by.
fn used_by_in_tree(fs: &Fs, root: &str) -> BTreeMap<String, Value> {
    common::walk(fs)
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| {
            p.strip_prefix(root)
                .and_then(|r| r.strip_prefix("named_data/"))
                .is_some_and(|n| !n.contains('/') && n.ends_with(".json"))
        })
        .map(|p| {
            let j = read_json(fs, &p);
            (j["key"].as_str().unwrap().to_string(), j["used_by"].clone())
        })
        .collect()
}

/// Every `named_data/<key>.json` of every fixture, in the `.pte` tree and in the trees of
/// its attached `.ptd` files, lists as `used_by` exactly the XNNPACK values that flatc's
/// decoding says read the key; `[]` for keys nothing decoded reads, and in a `.ptd`
/// mounted alone.
#[test]
fn named_data_used_by_lists_the_xnnpack_values_that_read_each_key() {
    let mut listed = 0;
    for manifest in xnnpack_manifests() {
        let name = manifest.display().to_string();
        let m = load_json(&manifest);
        let mut expected = expected_used_by(&m);
        let (model, data) = fixture_files(&manifest);
        let fs = Fs::new(
            Tree::build(Arc::new(Model::open(&model, &data).unwrap())),
            Options { read_only: true },
        );
        let mut roots = vec![String::new()];
        for d in &data {
            let stem = d.file_stem().unwrap().to_string_lossy().into_owned();
            roots.push(format!("data/{stem}/"));
        }
        let mut seen_keys = BTreeSet::new();
        for root in &roots {
            for (key, used_by) in used_by_in_tree(&fs, root) {
                // A key in several files is read from the first (the program's own first).
                let want = if seen_keys.insert(key.clone()) {
                    expected.remove(&key).unwrap_or_default()
                } else {
                    Vec::new()
                };
                listed += want.len();
                assert_eq!(
                    used_by,
                    Value::Array(want),
                    "{name}: {root}named_data/{key}.json"
                );
            }
        }
        assert!(
            expected.is_empty(),
            "{name}: keys read but not in the tree: {expected:?}"
        );
        // A .ptd mounted alone has no payload that reads it.
        for d in &data {
            let fs = Fs::new(
                Tree::build(Arc::new(Model::open(d, &[] as &[PathBuf]).unwrap())),
                Options { read_only: true },
            );
            for (key, used_by) in used_by_in_tree(&fs, "") {
                assert_eq!(used_by, json!([]), "{}: {key}", d.display());
            }
        }
    }
    assert!(listed > 50, "only {listed} uses listed");
}

// ---- through a real mount ----

fn mounted_contents(m: &Mount) -> Vec<(PathBuf, Vec<u8>)> {
    read_files(&m.model, &m.data)
}

fn mounted_json(m: &Mount, path: &str) -> Value {
    serde_json::from_slice(&std::fs::read(m.path(path)).unwrap()).unwrap()
}

/// The first XNNPACK filter of `datatype` of a mount, through its `.json` files.
fn mounted_filter(m: &Mount, datatype: &str) -> XValue {
    let values = m.path("plans/forward/delegates/0/xnnpack/values");
    let mut names: Vec<String> = std::fs::read_dir(&values)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort_by_key(|n| n.trim_end_matches(".json").parse::<u32>().unwrap());
    names
        .into_iter()
        .map(|n| {
            let base = format!(
                "plans/forward/delegates/0/xnnpack/values/{}",
                n.trim_end_matches(".json")
            );
            let json = mounted_json(m, &format!("{base}.json"));
            XValue { base, json }
        })
        .find(|v| v.datatype() == datatype && v.roles() == ["filter"])
        .unwrap_or_else(|| panic!("no {datatype} filter"))
}

/// `numpy.save` of the view scaled and shifted as `new_values` does, onto the mount; the
/// array written is also saved to `copy` for the test to read.
const SAVE_NEW_VALUES: &str = "
import numpy as np, sys
path, copy = sys.argv[1], sys.argv[2]
a = np.load(path)
largest = np.float32(np.abs(a).max())
shift = ((np.arange(a.size) % 7) - 3).astype(np.float32).reshape(a.shape)
b = (a * np.float32(1.75) + largest * np.float32(0.03) * shift).astype(np.float32)
np.save(copy, b)
np.save(path, b)
";

/// Re-quantizing writes with `numpy.save` through a real mount, and their refusals: EINVAL
/// from `close()`, the reason in the daemon's log, no byte changed.
#[test]
fn f32_writes_and_refusals_through_a_real_mount() {
    if fuse_missing() {
        return;
    }
    for (name, datatype, biased) in [
        ("llama_8da4w", "qbint4", false),
        ("extra/xnn_qc4_linear", "qcint4", false),
        ("extra/xnnpack_q8", "qcint8", true),
    ] {
        let (model, data) = fixture(name);
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("log");
        let mut m = Mount::new(&model, &data, &["--log-file", log.to_str().unwrap()]);
        let filter = mounted_filter(&m, datatype);
        let what = format!("{name} {}", filter.base);
        let view = m.path(&format!("{}.f32.npy", filter.base));
        let view_arg = view.to_str().unwrap();
        let before = mounted_contents(&m);
        let old = npy_f32(&std::fs::read(&view).unwrap());

        let refusals = [
            (
                "np.save(p, np.zeros((3, 5), np.float32))",
                ".npy shape differs",
            ),
            (
                "np.save(p, np.load(p).astype(np.float64))",
                ".npy dtype differs",
            ),
            (
                "a = np.load(p); a.flat[3] = np.nan; np.save(p, a)",
                "element 3 is NaN; only finite values can be quantized",
            ),
        ];
        for (script, reason) in refusals {
            let script = format!("import numpy as np\np = sys.argv[1]\n{script}");
            assert_eq!(py_errno(&script, &[view_arg]), "EINVAL", "{what}: {script}");
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                logged.contains(&format!("{}.f32.npy: ", filter.base)) && logged.contains(reason),
                "{what}: the log lacks {reason:?}: {logged}"
            );
            assert_eq!(
                mounted_contents(&m),
                before,
                "{what}: {script} changed the files"
            );
        }
        assert_eq!(npy_f32(&std::fs::read(&view).unwrap()), old);

        let json = |p: &str| {
            let bytes = std::fs::read(m.path(p)).ok()?;
            Some(serde_json::from_slice::<Value>(&bytes).unwrap())
        };
        let biases = int32_biases(&json, &filter);
        assert_eq!(!biases.is_empty(), biased, "{what}: int32 biases");
        let s_in = biased.then(|| input_scale(&json, &filter));
        let written = logs.path().join("written.npy");
        let (ok, _, err) = py(SAVE_NEW_VALUES, &[view_arg, written.to_str().unwrap()]);
        assert!(ok, "{what}: numpy.save onto the view failed: {err}");
        let new = npy_f32(&std::fs::read(&written).unwrap());
        let back = npy_f32(&std::fs::read(&view).unwrap());
        m.umount();
        let after = mounted_contents(&m);
        check_requantized(&what, &filter, &biases, s_in, &new, &back, &before, &after);
        m.mount();
        assert_eq!(
            npy_f32(&std::fs::read(&view).unwrap()),
            back,
            "{what}: after a remount"
        );
    }

    // Scales another value reads too.
    let c = shared_scales();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("log");
    let m = Mount::new(&c.model, &c.data, &["--log-file", log.to_str().unwrap()]);
    let before = mounted_contents(&m);
    let view = m.path("plans/forward/delegates/0/xnnpack/values/3.f32.npy");
    let script = "import numpy as np\np = sys.argv[1]\nnp.save(p, np.load(p) * 2)";
    assert_eq!(py_errno(script, &[view.to_str().unwrap()]), "EINVAL");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("value %6 of plan 0 delegate 0 reads the scales of %3"),
        "{logged}"
    );
    assert_eq!(mounted_contents(&m), before);
}
