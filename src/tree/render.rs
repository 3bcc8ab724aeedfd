//! The generated text files: JSON (docs/tree.md#json-files), `operators.txt`,
//! `instructions.txt` (docs/tree.md#instructions-and-operators).
//!
//! Invariants: output depends only on the files' contents and names, never on their
//! directories (keys in schema order, no hash maps iterated, `file` is a file's name), so two
//! mounts of equal copies anywhere render equal bytes; every file ends with a newline. Enum
//! values without a name are written as numbers. Lists made from a plan's lists grow with
//! them at most linearly: a signature describes at most [`SIGNATURE_SHOWN`] entries of at
//! most [`SIGNATURE_RANK_SHOWN`] dimensions, an IntList's `values` has one number per item.
//!
//! Output goes to any `fmt::Write`: a counter (for a size), a `String`, or a buffer of the
//! exact size. The tables that can hold millions of entries (`program.json`,
//! `flat_tensor.json`) are written entry by entry ([`Lazy`]), so rendering them needs about
//! the output's size in memory, not a `serde_json::Value` of the whole table.

use std::fmt::{self, Write};

use serde_json::{json, Map, Value};

use super::sharing::Shared;
use super::{Ino, TextKind, Tree};
use crate::catalog::payloads::{file_name, used_by_json};
use crate::format::generated::{ptd_fb, pte_fb};
use crate::format::layout::{Location, TensorData};
use crate::format::range::ByteRange;
use crate::format::{scalar_type, Kind, Model};

/// Byte vectors longer than this are shown as `{"bytes": N}`.
const INLINE_BYTES_SHOWN: usize = 64;

/// Writes the text of node `ino`, of kind `kind`, to `out`.
pub fn render(tree: &Tree, ino: Ino, kind: TextKind, out: &mut dyn Write) -> fmt::Result {
    let model = &*tree.model;
    match kind {
        TextKind::HeaderJson(f) => to_text(&header_json(model, f), out),
        TextKind::ProgramJson => lazy_to_text(&program_json(model), out),
        TextKind::FlatTensorJson(f) => lazy_to_text(&flat_tensor_json(model, f), out),
        TextKind::PlanJson(p) => to_text(&plan_json(model, p), out),
        TextKind::ValueJson(p, i) => {
            to_text(&named(tree, ino, None, value_json(tree, ino, p, i)), out)
        }
        TextKind::DelegateJson(p, j) => to_text(&delegate_json(model, p, j), out),
        TextKind::NamedDataJson(f, k) => {
            let key = model.named_data_keys(f).get(k).map(|k| (f, *k));
            to_text(
                &named(tree, ino, key, named_data_json(tree, ino, f, k)),
                out,
            )
        }
        TextKind::Operators(p) => operators_txt(model, p, out),
        TextKind::Instructions(p) => instructions_txt(model, p, out),
        TextKind::PayloadHeader(p, j) => match tree.catalog.payloads.get(p, j) {
            Some(dec) => to_text(&dec.payload.header_json(), out),
            None => to_text(&Value::Null, out),
        },
        TextKind::PayloadGraphJson(p, j) => match tree.catalog.payloads.get(p, j) {
            Some(dec) => to_text(&dec.graph_json(model), out),
            None => to_text(&Value::Null, out),
        },
        TextKind::PayloadGraphTxt(p, j) => match tree.catalog.payloads.get(p, j) {
            Some(dec) => out.write_str(&dec.payload.graph_txt()),
            None => Ok(()),
        },
        TextKind::PayloadValueJson(p, j, k) => match tree.catalog.payloads.get(p, j) {
            Some(dec) => to_text(&named(tree, ino, None, dec.value_json(model, k)), out),
            None => to_text(&Value::Null, out),
        },
        TextKind::SizesTxt => match tree.sizes() {
            Ok(sizes) => out.write_str(&sizes.text()),
            Err(e) => writeln!(out, "sizes: {e}"),
        },
        TextKind::SizesJson => match tree.sizes() {
            Ok(sizes) => out.write_str(&sizes.json_text()),
            Err(e) => to_text(&json!({ "error": e }), out),
        },
        TextKind::PlanGraphDot(p) => super::dot::plan_dot(tree, p, out),
        TextKind::PayloadGraphDot(p, j) => match tree.catalog.payloads.get(p, j) {
            Some(dec) => out.write_str(&dec.payload.graph_dot()),
            None => Ok(()),
        },
        TextKind::Hist(of) => {
            let svg = super::hist::render(tree, ino, of).map_err(|_| fmt::Error)?;
            out.write_str(&String::from_utf8_lossy(&svg))
        }
        TextKind::NameJson(i) => match &tree.names {
            Some(v) => to_text(&v.json(i), out),
            None => to_text(&Value::Null, out),
        },
        TextKind::SizesSvg => {
            let root = crate::sizes::blocks::root(&tree.catalog);
            out.write_str(&crate::picture::treemap::svg("where the bytes go", &root))
        }
    }
}

/// `v` with `"checkpoint_name"` added when the named views name the tensor its `.json`
/// (`ino`) describes (docs/tree.md#named-views).
fn named(tree: &Tree, ino: Ino, key: Option<(usize, &str)>, mut v: Value) -> Value {
    if let (Some(name), Value::Object(m)) = (tree.checkpoint_name(ino, key), &mut v) {
        m.insert("checkpoint_name".into(), json!(name));
    }
    v
}

/// The text of node `ino`, rendered into a new buffer (not cached).
pub fn render_to_vec(tree: &Tree, ino: Ino, kind: TextKind) -> Vec<u8> {
    let mut out = String::new();
    render(tree, ino, kind, &mut out).expect("a String takes any text");
    out.into_bytes()
}

/// Whether a text of this kind can be large (its size grows with a table of the file), so
/// that its size is worth counting before it is rendered into an exact buffer.
pub fn may_be_large(kind: TextKind) -> bool {
    matches!(
        kind,
        TextKind::ProgramJson
            | TextKind::FlatTensorJson(_)
            | TextKind::Operators(_)
            | TextKind::Instructions(_)
            | TextKind::PlanGraphDot(_)
    )
}

fn to_text(v: &Value, out: &mut dyn Write) -> fmt::Result {
    write_pretty(v, 0, out)?;
    out.write_char('\n')
}

fn lazy_to_text(v: &Lazy<'_>, out: &mut dyn Write) -> fmt::Result {
    write_lazy(v, 0, out)?;
    out.write_char('\n')
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

fn pad(depth: usize, out: &mut dyn Write) -> fmt::Result {
    for _ in 0..depth {
        out.write_str("  ")?;
    }
    Ok(())
}

/// A JSON string literal, escaped exactly as `serde_json` escapes it.
fn write_json_str(s: &str, out: &mut dyn Write) -> fmt::Result {
    out.write_char('"')?;
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.write_str(&s[start..i])?;
        if escape.is_empty() {
            write!(out, "\\u{b:04x}")?;
        } else {
            out.write_str(escape)?;
        }
        start = i + 1;
    }
    out.write_str(&s[start..])?;
    out.write_char('"')
}

/// Two-space indented JSON whose arrays of scalars (sizes, dim orders, offsets) stay on one
/// line, so a tensor's shape reads at a glance.
fn write_pretty(v: &Value, depth: usize, out: &mut dyn Write) -> fmt::Result {
    match v {
        Value::Array(items) if items.iter().all(is_scalar) => {
            out.write_char('[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_str(", ")?;
                }
                write_pretty(item, depth, out)?;
            }
            out.write_char(']')
        }
        Value::Array(items) => {
            out.write_str("[\n")?;
            for (i, item) in items.iter().enumerate() {
                pad(depth + 1, out)?;
                write_pretty(item, depth + 1, out)?;
                out.write_str(if i + 1 < items.len() { ",\n" } else { "\n" })?;
            }
            pad(depth, out)?;
            out.write_char(']')
        }
        Value::Object(map) if map.is_empty() => out.write_str("{}"),
        Value::Object(map) => {
            out.write_str("{\n")?;
            for (i, (k, item)) in map.iter().enumerate() {
                pad(depth + 1, out)?;
                write_json_str(k, out)?;
                out.write_str(": ")?;
                write_pretty(item, depth + 1, out)?;
                out.write_str(if i + 1 < map.len() { ",\n" } else { "\n" })?;
            }
            pad(depth, out)?;
            out.write_char('}')
        }
        Value::String(s) => write_json_str(s, out),
        scalar => write!(out, "{scalar}"),
    }
}

/// JSON made while it is written: a table with millions of entries never exists whole as a
/// `Value`. Written exactly as `write_pretty` writes the `Value` it stands for ([`Lazy::to_value`]).
enum Lazy<'a> {
    Value(Value),
    Object(Vec<(&'static str, Lazy<'a>)>),
    /// An array of `len` objects or arrays (never scalars, which `write_pretty` would put on
    /// one line), each made when it is written.
    Items(usize, Box<dyn Fn(usize) -> Lazy<'a> + 'a>),
}

impl<'a> Lazy<'a> {
    /// `null`, or one item per element made by `f`.
    fn items<T>(v: &'a Option<Vec<T>>, f: impl Fn(&'a T) -> Lazy<'a> + 'a) -> Lazy<'a> {
        match v {
            None => Lazy::Value(Value::Null),
            Some(v) => Lazy::Items(v.len(), Box::new(move |i| f(&v[i]))),
        }
    }

    /// The whole `Value` (tests compare the two renderings).
    #[cfg(test)]
    fn to_value(&self) -> Value {
        match self {
            Lazy::Value(v) => v.clone(),
            Lazy::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_value()))
                    .collect(),
            ),
            Lazy::Items(n, f) => Value::Array((0..*n).map(|i| f(i).to_value()).collect()),
        }
    }
}

fn write_lazy(v: &Lazy<'_>, depth: usize, out: &mut dyn Write) -> fmt::Result {
    match v {
        Lazy::Value(v) => write_pretty(v, depth, out),
        Lazy::Object(fields) if fields.is_empty() => out.write_str("{}"),
        Lazy::Object(fields) => {
            out.write_str("{\n")?;
            for (i, (k, item)) in fields.iter().enumerate() {
                pad(depth + 1, out)?;
                write_json_str(k, out)?;
                out.write_str(": ")?;
                write_lazy(item, depth + 1, out)?;
                out.write_str(if i + 1 < fields.len() { ",\n" } else { "\n" })?;
            }
            pad(depth, out)?;
            out.write_char('}')
        }
        Lazy::Items(0, _) => out.write_str("[]"),
        Lazy::Items(n, f) => {
            out.write_str("[\n")?;
            for i in 0..*n {
                let item = f(i);
                debug_assert!(!matches!(&item, Lazy::Value(v) if is_scalar(v)));
                pad(depth + 1, out)?;
                write_lazy(&item, depth + 1, out)?;
                out.write_str(if i + 1 < *n { ",\n" } else { "\n" })?;
            }
            pad(depth, out)?;
            out.write_char(']')
        }
    }
}

// Windows of texts too large to keep (docs/tree.md#size-limits): a `Lazy` rendering is
// counted once with `Mark`s every `MARK_EVERY` bytes, each the path to the item that starts
// there; a read then renders from the last mark at or before its offset, to the end of its
// window, so reading a 300 MB `program.json` never holds it whole.

/// About how many bytes of text lie between two marks.
pub const MARK_EVERY: u64 = 64 << 10;

/// A place where a `Lazy` rendering can start again: the offset of an array item's first
/// byte, and its path (at each level, the index of the object field or array item taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub at: u64,
    path: Box<[u32]>,
}

/// A `Write` that counts, records marks when asked, and passes on what it is given.
struct Walker<'w> {
    out: &'w mut dyn Write,
    at: u64,
    path: Vec<u32>,
    /// Recording: the marks so far, where the next may go, and the bytes between two.
    marks: Option<(&'w mut Vec<Mark>, u64, u64)>,
}

impl Write for Walker<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.at += s.len() as u64;
        self.out.write_str(s)
    }
}

impl Walker<'_> {
    /// Records a mark at an item about to start, when a mark is due.
    fn item_starts(&mut self) {
        if let Some((marks, next, every)) = &mut self.marks {
            if self.at >= *next {
                marks.push(Mark {
                    at: self.at,
                    path: self.path.clone().into_boxed_slice(),
                });
                *next = self.at + *every;
            }
        }
    }
}

/// `write_lazy` through a `Walker`, starting at `resume` (a mark's path) instead of the
/// beginning: along it, the openings of the enclosing objects and arrays and the fields and
/// items before it are skipped, since they lie before the mark.
fn walk_lazy(v: &Lazy<'_>, depth: usize, w: &mut Walker, resume: &[u32]) -> fmt::Result {
    match v {
        Lazy::Value(v) => write_pretty(v, depth, w),
        Lazy::Object(fields) if fields.is_empty() => w.write_str("{}"),
        Lazy::Object(fields) => {
            // A mark is never at an object field: along a path, a field is entered.
            let (first, rest) = match resume.split_first() {
                Some((&f, rest)) => (f as usize, Some(rest)),
                None => {
                    w.write_str("{\n")?;
                    (0, None)
                }
            };
            for (i, (k, item)) in fields.iter().enumerate().skip(first) {
                w.path.push(i as u32);
                let inside = rest.filter(|_| i == first);
                if inside.is_none() {
                    pad(depth + 1, w)?;
                    write_json_str(k, w)?;
                    w.write_str(": ")?;
                }
                walk_lazy(item, depth + 1, w, inside.unwrap_or(&[]))?;
                w.path.pop();
                w.write_str(if i + 1 < fields.len() { ",\n" } else { "\n" })?;
            }
            pad(depth, w)?;
            w.write_char('}')
        }
        Lazy::Items(0, _) => w.write_str("[]"),
        Lazy::Items(n, f) => {
            let first = match resume.first() {
                Some(&i) => i as usize,
                None => {
                    w.write_str("[\n")?;
                    0
                }
            };
            for i in first..*n {
                let item = f(i);
                w.path.push(i as u32);
                // The last index of a path is the item the mark is at, from its start; an
                // earlier one is an item the mark is inside of.
                let inside = (i == first && resume.len() > 1).then(|| &resume[1..]);
                if inside.is_none() {
                    w.item_starts();
                    pad(depth + 1, w)?;
                }
                walk_lazy(&item, depth + 1, w, inside.unwrap_or(&[]))?;
                w.path.pop();
                w.write_str(if i + 1 < *n { ",\n" } else { "\n" })?;
            }
            pad(depth, w)?;
            w.write_char(']')
        }
    }
}

/// The `Lazy` table a text of `kind` is written from, for the kinds that have one
/// (`program.json`, `flat_tensor.json`): those whose windows can be rendered on their own.
fn lazy_of(model: &Model, kind: TextKind) -> Option<Lazy<'_>> {
    match kind {
        TextKind::ProgramJson => Some(program_json(model)),
        TextKind::FlatTensorJson(f) => Some(flat_tensor_json(model, f)),
        _ => None,
    }
}

/// Whether windows of a text of `kind` can be rendered on their own (`render_window`).
pub fn windowed(kind: TextKind) -> bool {
    matches!(kind, TextKind::ProgramJson | TextKind::FlatTensorJson(_))
}

/// Discards what it is given.
struct Discard;

impl Write for Discard {
    fn write_str(&mut self, _: &str) -> fmt::Result {
        Ok(())
    }
}

/// A counted text of a `windowed` kind: its length and its marks.
#[derive(Debug)]
pub struct Marked {
    pub len: u64,
    pub marks: Vec<Mark>,
}

/// The length of a text of a `windowed` kind, and its marks; None for other kinds.
pub fn count_marked(tree: &Tree, kind: TextKind) -> Option<Marked> {
    count_marked_every(tree, kind, MARK_EVERY)
}

/// `count_marked` with a mark about every `every` bytes.
fn count_marked_every(tree: &Tree, kind: TextKind, every: u64) -> Option<Marked> {
    let lazy = lazy_of(&tree.model, kind)?;
    let mut marks = Vec::new();
    let mut sink = Discard;
    let mut w = Walker {
        out: &mut sink,
        at: 0,
        path: Vec::new(),
        marks: Some((&mut marks, every, every)),
    };
    walk_lazy(&lazy, 0, &mut w, &[])
        .and_then(|()| w.write_char('\n'))
        .ok()?;
    let len = w.at;
    Some(Marked { len, marks })
}

/// Keeps the bytes `[from, from + len)` of what is written to it, and stops the rendering
/// (with an error) once it has them.
struct Window {
    from: u64,
    len: usize,
    at: u64,
    out: Vec<u8>,
}

impl Write for Window {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let b = s.as_bytes();
        let end = self.at + b.len() as u64;
        if end > self.from {
            let skip = self.from.saturating_sub(self.at) as usize;
            let room = self.len - self.out.len();
            let take = (b.len() - skip).min(room);
            self.out.extend_from_slice(&b[skip..skip + take]);
        }
        self.at = end;
        if self.out.len() == self.len {
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// Bytes `[offset, offset + size)` of a text of a `windowed` kind whose length is `len`,
/// rendered from the last of `marks` at or before `offset` (the beginning when there is
/// none): about `MARK_EVERY` bytes more than the window are rendered, and none are kept but
/// the window's.
pub fn render_window(
    tree: &Tree, kind: TextKind, marked: &Marked, offset: u64, size: u32,
) -> Vec<u8> {
    let (len, marks) = (marked.len, &marked.marks);
    let start = offset.min(len);
    let want = (offset.saturating_add(u64::from(size)).min(len) - start) as usize;
    let Some(lazy) = lazy_of(&tree.model, kind).filter(|_| want > 0) else {
        return Vec::new();
    };
    let mark = marks.partition_point(|m| m.at <= start);
    let (at, path): (u64, &[u32]) = match mark.checked_sub(1).map(|i| &marks[i]) {
        Some(m) => (m.at, &m.path),
        None => (0, &[]),
    };
    let mut window = Window {
        from: start,
        len: want,
        at,
        out: Vec::with_capacity(want),
    };
    let mut w = Walker {
        out: &mut window,
        at,
        path: Vec::new(),
        marks: None,
    };
    // The window stops the rendering with an error once full; the end of the text too.
    let _ = walk_lazy(&lazy, 0, &mut w, path).and_then(|()| w.write_char('\n'));
    window.out
}

fn bytes_value(data: &[u8]) -> Value {
    if data.len() > INLINE_BYTES_SHOWN {
        json!({ "bytes": data.len() })
    } else {
        json!(data)
    }
}

fn range_bytes_value(model: &Model, r: &ByteRange) -> Value {
    if r.len() as usize > INLINE_BYTES_SHOWN {
        json!({ "bytes": r.len() })
    } else {
        match model.files[0].read(*r) {
            Ok(bytes) => json!(&*bytes),
            Err(e) => json!({ "error": e.to_string() }),
        }
    }
}

fn double(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        json!(v.to_string())
    }
}

fn enum_name(name: Option<&str>, raw: i64) -> Value {
    name.map_or_else(|| json!(raw), |n| json!(n))
}

fn scalar_type_value(v: i8) -> Value {
    enum_name(scalar_type::name(v), v as i64)
}

fn dynamism(v: pte_fb::TensorShapeDynamism) -> Value {
    enum_name(v.variant_name(), v.0 as i64)
}

fn device_type(v: pte_fb::DeviceType) -> Value {
    enum_name(v.variant_name(), v.0 as i64)
}

fn data_location(v: pte_fb::DataLocation) -> Value {
    enum_name(v.variant_name(), v.0 as i64)
}

fn header_json(model: &Model, file: usize) -> Value {
    let f = &model.files[file];
    // The identifier was checked when the file was parsed.
    let identifier = match &f.kind {
        Kind::Pte(_) => "ET12",
        Kind::Ptd(_) => "FT01",
    };
    match &f.kind {
        Kind::Pte(p) => {
            let h = &p.header;
            let extended = h.extended.map_or(Value::Null, |e| {
                json!({
                    "magic": "eh00",
                    "length": e.length,
                    "program_size": e.program_size,
                    "segment_base_offset": e.segment_base_offset,
                    "segment_data_size": e.segment_data_size,
                })
            });
            json!({
                "identifier": identifier,
                "root_offset": h.root_offset,
                "extended_header": extended,
                "file_size": h.file_size,
            })
        }
        Kind::Ptd(p) => {
            let h = &p.header;
            json!({
                "identifier": identifier,
                "root_offset": h.root_offset,
                "extended_header": {
                    "magic": "FH01",
                    "length": h.length,
                    "flatbuffer_offset": h.flatbuffer_offset,
                    "flatbuffer_size": h.flatbuffer_size,
                    "segment_base_offset": h.segment_base_offset,
                    "segment_data_size": h.segment_data_size,
                },
                "file_size": h.file_size,
            })
        }
    }
}

fn opt<T, F: FnOnce(&T) -> Value>(v: &Option<T>, f: F) -> Value {
    v.as_ref().map_or(Value::Null, f)
}

fn allocation_json(a: &pte_fb::AllocationDetailsT) -> Value {
    json!({
        "memory_id": a.memory_id,
        "memory_offset_low": a.memory_offset_low,
        "memory_offset_high": a.memory_offset_high,
        "memory_offset": ((a.memory_offset_high as u64) << 32) | a.memory_offset_low as u64,
    })
}

fn extra_json(e: &pte_fb::ExtraTensorInfoT) -> Value {
    json!({
        "mutable_data_segments_idx": e.mutable_data_segments_idx,
        "fully_qualified_name": e.fully_qualified_name,
        "location": enum_name(e.location.variant_name(), e.location.0 as i64),
        "device_type": device_type(e.device_type),
        "device_index": e.device_index,
    })
}

/// The schema fields of a Tensor, in schema order.
fn tensor_fields(t: &pte_fb::TensorT) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("scalar_type".into(), scalar_type_value(t.scalar_type.0));
    m.insert("storage_offset".into(), json!(t.storage_offset));
    m.insert("sizes".into(), json!(t.sizes));
    m.insert("dim_order".into(), json!(t.dim_order));
    m.insert("requires_grad".into(), json!(t.requires_grad));
    m.insert("data_buffer_idx".into(), json!(t.data_buffer_idx));
    m.insert(
        "allocation_info".into(),
        opt(&t.allocation_info, |a| allocation_json(a)),
    );
    m.insert("layout".into(), json!(t.layout));
    m.insert("shape_dynamism".into(), dynamism(t.shape_dynamism));
    m.insert(
        "extra_tensor_info".into(),
        opt(&t.extra_tensor_info, |e| extra_json(e)),
    );
    m
}

fn union_object(type_name: &str, fields: Value) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), json!(type_name));
    if let Value::Object(rest) = fields {
        m.extend(rest);
    }
    Value::Object(m)
}

pub fn kernel_type_name(v: &pte_fb::KernelTypesT) -> &'static str {
    use pte_fb::KernelTypesT as K;
    match v {
        K::NONE => "NONE",
        K::Null(_) => "Null",
        K::Int(_) => "Int",
        K::Bool(_) => "Bool",
        K::Double(_) => "Double",
        K::Tensor(_) => "Tensor",
        K::String(_) => "String",
        K::IntList(_) => "IntList",
        K::DoubleList(_) => "DoubleList",
        K::BoolList(_) => "BoolList",
        K::TensorList(_) => "TensorList",
        K::OptionalTensorList(_) => "OptionalTensorList",
    }
}

/// The union member's fields, as in program.json.
fn kernel_value_fields(v: &pte_fb::KernelTypesT) -> Value {
    use pte_fb::KernelTypesT as K;
    match v {
        K::NONE | K::Null(_) => json!({}),
        K::Int(x) => json!({ "int_val": x.int_val }),
        K::Bool(x) => json!({ "bool_val": x.bool_val }),
        K::Double(x) => json!({ "double_val": double(x.double_val) }),
        K::Tensor(t) => Value::Object(tensor_fields(t)),
        K::String(s) => json!({ "string_val": s.string_val }),
        K::IntList(l) => json!({ "items": l.items }),
        K::DoubleList(l) => {
            json!({ "items": l.items.as_ref().map(|v| v.iter().map(|d| double(*d)).collect::<Vec<_>>()) })
        }
        K::BoolList(l) => json!({ "items": l.items }),
        K::TensorList(l) => json!({ "items": l.items }),
        K::OptionalTensorList(l) => json!({ "items": l.items }),
    }
}

fn evalue_json(e: &pte_fb::EValueT) -> Value {
    json!({ "val": union_object(kernel_type_name(&e.val), kernel_value_fields(&e.val)) })
}

fn instruction_json(i: &pte_fb::InstructionT) -> Value {
    use pte_fb::InstructionArgumentsT as A;
    let v = match &i.instr_args {
        A::NONE => json!({ "type": "NONE" }),
        A::KernelCall(k) => union_object(
            "KernelCall",
            json!({ "op_index": k.op_index, "args": k.args }),
        ),
        A::DelegateCall(d) => union_object(
            "DelegateCall",
            json!({ "delegate_index": d.delegate_index, "args": d.args }),
        ),
        A::MoveCall(m) => union_object(
            "MoveCall",
            json!({ "move_from": m.move_from, "move_to": m.move_to }),
        ),
        A::JumpFalseCall(j) => union_object(
            "JumpFalseCall",
            json!({ "cond_value_index": j.cond_value_index, "destination_instruction": j.destination_instruction }),
        ),
        A::FreeCall(f) => union_object("FreeCall", json!({ "value_index": f.value_index })),
    };
    json!({ "instr_args": v })
}

fn frame_json(f: &pte_fb::FrameT) -> Value {
    json!({ "filename": f.filename, "lineno": f.lineno, "name": f.name, "context": f.context })
}

fn chain_json(c: &pte_fb::ChainT) -> Lazy<'_> {
    Lazy::Object(vec![
        ("inputs", Lazy::Value(json!(c.inputs))),
        ("outputs", Lazy::Value(json!(c.outputs))),
        (
            "instructions",
            Lazy::items(&c.instructions, |i| Lazy::Value(instruction_json(i))),
        ),
        (
            "stacktrace",
            Lazy::items(&c.stacktrace, |fl| {
                Lazy::Value(json!({
                    "items": fl.items.as_ref().map(|i| i.iter().map(frame_json).collect::<Vec<_>>())
                }))
            }),
        ),
    ])
}

fn operator_json(o: &pte_fb::OperatorT) -> Value {
    json!({ "name": o.name, "overload": o.overload })
}

fn delegate_ref_json(r: &pte_fb::BackendDelegateDataReferenceT) -> Value {
    json!({ "location": data_location(r.location), "index": r.index })
}

fn compile_specs_json(specs: &Option<Vec<pte_fb::CompileSpecT>>) -> Value {
    opt(specs, |v| {
        json!(v
            .iter()
            .map(|c| json!({ "key": c.key, "value": opt(&c.value, |b| bytes_value(b)) }))
            .collect::<Vec<_>>())
    })
}

fn backend_delegate_json(d: &pte_fb::BackendDelegateT) -> Value {
    json!({
        "id": d.id,
        "processed": opt(&d.processed, |r| delegate_ref_json(r)),
        "compile_specs": compile_specs_json(&d.compile_specs),
    })
}

fn container_json(c: &pte_fb::ContainerMetadataT) -> Value {
    json!({ "encoded_inp_str": c.encoded_inp_str, "encoded_out_str": c.encoded_out_str })
}

fn non_const_device_json(v: &Option<Vec<pte_fb::NonConstBufferDeviceT>>) -> Value {
    opt(v, |v| {
        json!(v
            .iter()
            .map(|d| json!({
                "buffer_idx": d.buffer_idx,
                "device_type": device_type(d.device_type),
                "device_index": d.device_index,
            }))
            .collect::<Vec<_>>())
    })
}

fn plan_table_json(p: &pte_fb::ExecutionPlanT) -> Lazy<'_> {
    Lazy::Object(vec![
        ("name", Lazy::Value(json!(p.name))),
        (
            "container_meta_type",
            Lazy::Value(opt(&p.container_meta_type, |c| container_json(c))),
        ),
        (
            "values",
            Lazy::items(&p.values, |e| Lazy::Value(evalue_json(e))),
        ),
        ("inputs", Lazy::Value(json!(p.inputs))),
        ("outputs", Lazy::Value(json!(p.outputs))),
        ("chains", Lazy::items(&p.chains, chain_json)),
        (
            "operators",
            Lazy::items(&p.operators, |o| Lazy::Value(operator_json(o))),
        ),
        (
            "delegates",
            Lazy::items(&p.delegates, |d| Lazy::Value(backend_delegate_json(d))),
        ),
        (
            "non_const_buffer_sizes",
            Lazy::Value(json!(p.non_const_buffer_sizes)),
        ),
        (
            "non_const_buffer_device",
            Lazy::Value(non_const_device_json(&p.non_const_buffer_device)),
        ),
    ])
}

fn subsegment_json(s: &pte_fb::SubsegmentOffsetsT) -> Value {
    json!({ "segment_index": s.segment_index, "offsets": s.offsets })
}

/// `{"<field>": …}` for each inline buffer, when the program has the vector at all.
fn inline_items<'a, T>(
    model: &'a Model, present: &Option<T>, ranges: &'a [Option<ByteRange>], field: &'static str,
) -> Lazy<'a> {
    match present {
        None => Lazy::Value(Value::Null),
        Some(_) => Lazy::Items(
            ranges.len(),
            Box::new(move |i| {
                let mut m = Map::new();
                m.insert(
                    field.into(),
                    opt(&ranges[i], |r| range_bytes_value(model, r)),
                );
                Lazy::Value(Value::Object(m))
            }),
        ),
    }
}

fn program_json(model: &Model) -> Lazy<'_> {
    let pte = model.pte().expect("program.json exists only for a .pte");
    let p = &pte.program;
    Lazy::Object(vec![
        ("version", Lazy::Value(json!(p.version))),
        (
            "execution_plan",
            Lazy::items(&p.execution_plan, plan_table_json),
        ),
        (
            "constant_buffer",
            inline_items(model, &p.constant_buffer, &pte.inline_constants, "storage"),
        ),
        (
            "backend_delegate_data",
            inline_items(
                model,
                &p.backend_delegate_data,
                &pte.inline_delegate_data,
                "data",
            ),
        ),
        (
            "segments",
            Lazy::items(&p.segments, |s| {
                Lazy::Value(json!({ "offset": s.offset, "size": s.size }))
            }),
        ),
        (
            "constant_segment",
            Lazy::Value(opt(&p.constant_segment, |c| subsegment_json(c))),
        ),
        (
            "mutable_data_segments",
            Lazy::items(&p.mutable_data_segments, |s| {
                Lazy::Value(subsegment_json(s))
            }),
        ),
        (
            "named_data",
            Lazy::items(&p.named_data, |n| {
                Lazy::Value(json!({ "key": n.key, "segment_index": n.segment_index }))
            }),
        ),
    ])
}

fn layout_json(l: &ptd_fb::TensorLayoutT) -> Value {
    json!({
        "scalar_type": scalar_type_value(l.scalar_type.0),
        "sizes": l.sizes,
        "dim_order": l.dim_order,
    })
}

fn flat_tensor_json(model: &Model, file: usize) -> Lazy<'_> {
    let ft = &model
        .ptd(file)
        .expect("flat_tensor.json exists only for a .ptd")
        .flat_tensor;
    Lazy::Object(vec![
        ("version", Lazy::Value(json!(ft.version))),
        (
            "segments",
            Lazy::items(&ft.segments, |s| {
                Lazy::Value(json!({ "offset": s.offset, "size": s.size }))
            }),
        ),
        (
            "named_data",
            Lazy::items(&ft.named_data, |n| {
                Lazy::Value(json!({
                    "key": n.key,
                    "segment_index": n.segment_index,
                    "tensor_layout": opt(&n.tensor_layout, |l| layout_json(l)),
                }))
            }),
        ),
    ])
}

pub(super) fn plan(model: &Model, p: usize) -> &pte_fb::ExecutionPlanT {
    &model
        .pte()
        .expect("plans exist only in a .pte")
        .program
        .execution_plan
        .as_ref()
        .expect("plan")[p]
}

/// The most inputs, and the most outputs, a signature describes: a plan can list millions
/// of values, and `plan.json` stays small. `inputs_total` and `outputs_total` count them all.
pub const SIGNATURE_SHOWN: usize = 256;

/// The most dimensions a signature entry lists (the runtime handles 16): one value may be
/// named by every input, so a tensor with millions of sizes would otherwise be written
/// [`SIGNATURE_SHOWN`] times.
pub const SIGNATURE_RANK_SHOWN: usize = 64;

/// The sizes and dim order of a tensor of a signature, or why they are not shown.
pub fn signature_dims(t: &pte_fb::TensorT) -> std::result::Result<(&[i32], &[u8]), String> {
    let sizes = t.sizes.as_deref().unwrap_or_default();
    let order = t.dim_order.as_deref().unwrap_or_default();
    let rank = sizes.len().max(order.len());
    if rank > SIGNATURE_RANK_SHOWN {
        return Err(format!(
            "{rank} dimensions: more than a signature shows ({SIGNATURE_RANK_SHOWN}); the value's .json lists them"
        ));
    }
    Ok((sizes, order))
}

/// The value a plan's input or output `index` names, or why there is none.
pub fn io_value(
    plan: &pte_fb::ExecutionPlanT, index: i32,
) -> std::result::Result<&pte_fb::KernelTypesT, String> {
    let values = plan.values.as_deref().unwrap_or_default();
    usize::try_from(index)
        .ok()
        .and_then(|i| values.get(i))
        .map(|v| &v.val)
        .ok_or_else(|| {
            format!(
                "value index {index} out of range (expected 0 to {}, the plan's values)",
                values.len() as i64 - 1
            )
        })
}

/// The value of an Int, Bool or Double.
fn primitive_value(v: &pte_fb::KernelTypesT) -> Option<Value> {
    use pte_fb::KernelTypesT as K;
    match v {
        K::Int(x) => Some(json!(x.int_val)),
        K::Bool(x) => Some(json!(x.bool_val)),
        K::Double(x) => Some(double(x.double_val)),
        _ => None,
    }
}

/// One input or output as the runtime's `MethodMeta` describes it: a tensor's dtype, sizes
/// (upper bounds when the shape is dynamic), dim order and dynamism; another value's type,
/// and for an Int, Bool or Double the value the program holds (which the runtime requires
/// an input to be given again).
fn signature_entry(plan: &pte_fb::ExecutionPlanT, index: i32) -> Value {
    use pte_fb::KernelTypesT as K;
    let mut m = Map::new();
    m.insert("index".into(), json!(index));
    match io_value(plan, index) {
        Err(defect) => {
            m.insert("type".into(), Value::Null);
            m.insert("defect".into(), json!(defect));
        }
        Ok(v) => {
            m.insert("type".into(), json!(kernel_type_name(v)));
            match v {
                K::Tensor(t) => {
                    m.insert("scalar_type".into(), scalar_type_value(t.scalar_type.0));
                    match signature_dims(t) {
                        Ok((sizes, order)) => {
                            m.insert("sizes".into(), json!(sizes));
                            m.insert("dim_order".into(), json!(order));
                        }
                        Err(defect) => {
                            m.insert("sizes".into(), Value::Null);
                            m.insert("dim_order".into(), Value::Null);
                            m.insert("defect".into(), json!(defect));
                        }
                    }
                    m.insert("shape_dynamism".into(), dynamism(t.shape_dynamism));
                }
                other => {
                    if let Some(value) = primitive_value(other) {
                        m.insert("value".into(), value);
                    }
                }
            }
        }
    }
    Value::Object(m)
}

/// `signature` of `plan.json`: the method's inputs and outputs, the first
/// [`SIGNATURE_SHOWN`] of each described.
fn signature_json(plan: &pte_fb::ExecutionPlanT) -> Value {
    let side = |indices: &Option<Vec<i32>>| {
        let indices = indices.as_deref().unwrap_or_default();
        let shown: Vec<Value> = indices
            .iter()
            .take(SIGNATURE_SHOWN)
            .map(|&i| signature_entry(plan, i))
            .collect();
        (Value::Array(shown), json!(indices.len()))
    };
    let (inputs, inputs_total) = side(&plan.inputs);
    let (outputs, outputs_total) = side(&plan.outputs);
    json!({
        "inputs": inputs,
        "inputs_total": inputs_total,
        "outputs": outputs,
        "outputs_total": outputs_total,
    })
}

fn plan_json(model: &Model, p: usize) -> Value {
    let plan = plan(model, p);
    let layout = &model.pte_layout.as_ref().expect("resolved").plans[p];
    let tensors = layout.tensors.iter().flatten().count();
    let with_bytes = layout
        .tensors
        .iter()
        .flatten()
        .filter(|t| t.location.is_some())
        .count();
    let instructions = crate::format::pte::instruction_count(plan);
    json!({
        "name": plan.name,
        "inputs": plan.inputs,
        "outputs": plan.outputs,
        "signature": signature_json(plan),
        "non_const_buffer_sizes": plan.non_const_buffer_sizes,
        "non_const_buffer_device": non_const_device_json(&plan.non_const_buffer_device),
        "container_meta_type": opt(&plan.container_meta_type, |c| container_json(c)),
        "counts": {
            "values": plan.values.as_ref().map_or(0, Vec::len),
            "tensors": tensors,
            "tensors_with_bytes": with_bytes,
            "chains": plan.chains.as_ref().map_or(0, Vec::len),
            "instructions": instructions,
            "operators": plan.operators.as_ref().map_or(0, Vec::len),
            "delegates": plan.delegates.as_ref().map_or(0, Vec::len),
        },
    })
}

fn location_fields(model: &Model, m: &mut Map<String, Value>, loc: Option<Location>) {
    match loc {
        Some(l) => {
            m.insert("file".into(), json!(file_name(model, l.file)));
            m.insert("file_offset".into(), json!(l.range.start()));
        }
        None => {
            m.insert("file".into(), Value::Null);
            m.insert("file_offset".into(), Value::Null);
        }
    }
}

/// `aliases` and `aliases_total` (docs/tree.md#shared-bytes): the first paths that show the
/// same bytes, with their relation to this one, and how many there are in all.
fn alias_fields(tree: &Tree, m: &mut Map<String, Value>, loc: Option<Location>, json: Ino) {
    let shared = match (loc, tree.tensor_of_json(json)) {
        (Some(l), Some(id)) => tree.sharing().others(&l, id),
        _ => Shared::default(),
    };
    let listed: Vec<Value> = shared
        .listed
        .iter()
        .map(|(s, relation)| {
            json!({ "path": tree.tensor_path(s.id), "relation": relation.as_str() })
        })
        .collect();
    m.insert("aliases".into(), Value::Array(listed));
    m.insert("aliases_total".into(), json!(shared.total));
}

fn tensor_value_json(
    tree: &Tree, ino: Ino, i: usize, t: &pte_fb::TensorT, d: &TensorData,
) -> Value {
    let mut m = Map::new();
    m.insert("index".into(), json!(i));
    m.insert("type".into(), json!("Tensor"));
    m.insert("scalar_type".into(), scalar_type_value(t.scalar_type.0));
    m.insert("sizes".into(), json!(t.sizes));
    m.insert("dim_order".into(), json!(t.dim_order));
    m.insert("shape_dynamism".into(), dynamism(t.shape_dynamism));
    m.insert("nbytes".into(), json!(d.nbytes));
    m.insert("data".into(), json!(d.kind.as_str()));
    m.insert("data_buffer_idx".into(), json!(t.data_buffer_idx));
    m.insert(
        "allocation_info".into(),
        opt(&t.allocation_info, |a| allocation_json(a)),
    );
    m.insert(
        "fully_qualified_name".into(),
        json!(t
            .extra_tensor_info
            .as_ref()
            .and_then(|e| e.fully_qualified_name.clone())),
    );
    location_fields(&tree.model, &mut m, d.location);
    alias_fields(tree, &mut m, d.location, ino);
    m.insert("storage_offset".into(), json!(t.storage_offset));
    m.insert("requires_grad".into(), json!(t.requires_grad));
    m.insert("layout".into(), json!(t.layout));
    m.insert(
        "extra_tensor_info".into(),
        opt(&t.extra_tensor_info, |e| extra_json(e)),
    );
    if let Some(defect) = &d.defect {
        m.insert("defect".into(), json!(defect));
    }
    Value::Object(m)
}

fn value_json(tree: &Tree, ino: Ino, p: usize, i: usize) -> Value {
    use pte_fb::KernelTypesT as K;
    let model = &*tree.model;
    let plan = plan(model, p);
    let value = &plan.values.as_ref().expect("values")[i];
    if let (K::Tensor(t), Some(d)) = (
        &value.val,
        &model.pte_layout.as_ref().expect("resolved").plans[p].tensors[i],
    ) {
        return tensor_value_json(tree, ino, i, t, d);
    }
    let mut m = Map::new();
    m.insert("index".into(), json!(i));
    m.insert("type".into(), json!(kernel_type_name(&value.val)));
    match &value.val {
        K::NONE | K::Null(_) | K::Tensor(_) => {}
        v @ (K::Int(_) | K::Bool(_) | K::Double(_)) => {
            m.insert("value".into(), primitive_value(v).unwrap_or(Value::Null));
        }
        K::String(s) => {
            m.insert("value".into(), json!(s.string_val));
        }
        K::IntList(l) => {
            m.insert("items".into(), json!(l.items));
            let items = l.items.as_deref().unwrap_or_default();
            m.insert("values".into(), int_list_values(plan, items));
        }
        other => {
            if let Value::Object(fields) = kernel_value_fields(other) {
                m.extend(fields);
            }
        }
    }
    Value::Object(m)
}

/// The integers an IntList stands for: its items are indices of values, each an Int (or a
/// value the runtime fills in, such as a symbolic size, whose Int holds the exported size).
/// An item that is not the index of an Int is `null`. One number per item, so the text
/// grows with the list as `items` does.
fn int_list_values(plan: &pte_fb::ExecutionPlanT, items: &[i64]) -> Value {
    let values = plan.values.as_deref().unwrap_or_default();
    Value::Array(
        items
            .iter()
            .map(|&i| {
                let value = usize::try_from(i).ok().and_then(|i| values.get(i));
                match value.map(|v| &v.val) {
                    Some(pte_fb::KernelTypesT::Int(x)) => json!(x.int_val),
                    _ => Value::Null,
                }
            })
            .collect(),
    )
}

fn delegate_json(model: &Model, p: usize, j: usize) -> Value {
    let d = &plan(model, p).delegates.as_ref().expect("delegates")[j];
    let loc = &model.pte_layout.as_ref().expect("resolved").plans[p].delegates[j];
    let mut m = Map::new();
    m.insert("index".into(), json!(j));
    m.insert("id".into(), json!(d.id));
    m.insert(
        "processed".into(),
        opt(&d.processed, |r| delegate_ref_json(r)),
    );
    match loc {
        Ok(l) => {
            m.insert("nbytes".into(), json!(l.range.len()));
            location_fields(model, &mut m, Some(*l));
        }
        Err(e) => {
            m.insert("nbytes".into(), Value::Null);
            location_fields(model, &mut m, None);
            m.insert("defect".into(), json!(e.to_string()));
        }
    }
    m.insert("compile_specs".into(), compile_specs_json(&d.compile_specs));
    Value::Object(m)
}

fn named_data_json(tree: &Tree, ino: Ino, file: usize, k: usize) -> Value {
    let model = &*tree.model;
    let mut m = Map::new();
    let (key, segment_index, loc, layout) = match &model.files[file].kind {
        Kind::Pte(p) => {
            let nd = &p.program.named_data.as_ref().expect("named_data")[k];
            let loc = model.pte_layout.as_ref().expect("resolved").named_data[k].clone();
            (nd.key.clone(), nd.segment_index, loc, Value::Null)
        }
        Kind::Ptd(_) => {
            let blob = &model.ptd_blobs[file].as_ref().expect("blobs")[k];
            let nd = &model
                .ptd(file)
                .expect("ptd")
                .flat_tensor
                .named_data
                .as_ref()
                .expect("named_data")[k];
            (
                Some(blob.key.clone()),
                blob.segment_index,
                blob.location.clone(),
                opt(&nd.tensor_layout, |l| layout_json(l)),
            )
        }
    };
    m.insert("key".into(), json!(key));
    m.insert("segment_index".into(), json!(segment_index));
    match &loc {
        Ok(l) => {
            m.insert("size".into(), json!(l.range.len()));
            location_fields(model, &mut m, Some(*l));
        }
        Err(_) => {
            m.insert("size".into(), Value::Null);
            location_fields(model, &mut m, None);
        }
    }
    alias_fields(tree, &mut m, loc.as_ref().ok().copied(), ino);
    if let Err(e) = &loc {
        m.insert("defect".into(), json!(e.to_string()));
    }
    if matches!(model.files[file].kind, Kind::Ptd(_)) {
        m.insert("tensor_layout".into(), layout);
    }
    // The values of decoded payloads that read this entry: a key found first in another
    // file is read there, not here.
    let uses = match key.as_deref() {
        Some(key)
            if model
                .named_blob(key)
                .is_some_and(|(f, i, _)| (f, i) == (file, k)) =>
        {
            tree.catalog.payloads.uses_of(key)
        }
        _ => &[],
    };
    m.insert(
        "used_by".into(),
        used_by_json(uses, &tree.catalog.names.plans),
    );
    Value::Object(m)
}

pub(super) fn operator_name(o: &pte_fb::OperatorT) -> String {
    let name = o.name.as_deref().unwrap_or("");
    match o.overload.as_deref() {
        Some(ov) if !ov.is_empty() => format!("{name}.{ov}"),
        _ => name.to_string(),
    }
}

fn operators_txt(model: &Model, p: usize, out: &mut dyn Write) -> fmt::Result {
    for (i, o) in plan(model, p).operators.iter().flatten().enumerate() {
        writeln!(out, "{i}\t{}", operator_name(o))?;
    }
    Ok(())
}

fn args_text(args: &Option<Vec<i32>>) -> String {
    args.iter()
        .flatten()
        .map(|a| format!("%{a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The name of operator `op_index` of a plan's `operators`, or why there is none.
pub(super) fn kernel_operator(operators: &[pte_fb::OperatorT], op_index: i32) -> String {
    usize::try_from(op_index)
        .ok()
        .and_then(|i| operators.get(i))
        .map_or_else(
            || format!("<operator {op_index} out of range>"),
            operator_name,
        )
}

fn instructions_txt(model: &Model, p: usize, out: &mut dyn Write) -> fmt::Result {
    use pte_fb::InstructionArgumentsT as A;
    let plan = plan(model, p);
    let operators = plan.operators.as_deref().unwrap_or_default();
    let delegates = plan.delegates.as_deref().unwrap_or_default();
    for (c, chain) in plan.chains.iter().flatten().enumerate() {
        for (pc, ins) in chain.instructions.iter().flatten().enumerate() {
            let text = match &ins.instr_args {
                A::NONE => "none".to_string(),
                A::KernelCall(k) => {
                    let op = kernel_operator(operators, k.op_index);
                    format!("kernel {op}({})", args_text(&k.args))
                }
                A::DelegateCall(d) => {
                    let id = usize::try_from(d.delegate_index)
                        .ok()
                        .and_then(|i| delegates.get(i))
                        .map_or_else(
                            || "<out of range>".to_string(),
                            |d| d.id.clone().unwrap_or_default(),
                        );
                    format!("delegate {} {id}({})", d.delegate_index, args_text(&d.args))
                }
                A::MoveCall(m) => format!("move %{} -> %{}", m.move_from, m.move_to),
                A::JumpFalseCall(j) => format!(
                    "jump_false %{} -> {c}:{}",
                    j.cond_value_index, j.destination_instruction
                ),
                A::FreeCall(f) => format!("free %{}", f.value_index),
            };
            writeln!(out, "{c}:{pc}\t{text}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    /// Every fixture `.pte`/`.ptd` of `tests/fixtures` and `tests/fixtures/extra`.
    fn fixtures() -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut out = Vec::new();
        for d in [dir.clone(), dir.join("extra")] {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "pte" || x == "ptd") {
                    out.push(p);
                }
            }
        }
        out.sort();
        assert!(out.len() > 10);
        out
    }

    fn pretty(v: &Value) -> String {
        let mut s = String::new();
        to_text(v, &mut s).unwrap();
        s
    }

    #[test]
    fn lazy_tables_render_as_their_values() {
        for path in fixtures() {
            let model = crate::format::Model::open(&path, &[] as &[PathBuf]).unwrap();
            let lazy = match &model.files[0].kind {
                Kind::Pte(_) => program_json(&model),
                Kind::Ptd(_) => flat_tensor_json(&model, 0),
            };
            let mut streamed = String::new();
            lazy_to_text(&lazy, &mut streamed).unwrap();
            assert_eq!(streamed, pretty(&lazy.to_value()), "{}", path.display());
            drop(lazy);
            let tree = Tree::build(Arc::new(model));
            let ino = tree
                .find("program.json")
                .or_else(|| tree.find("flat_tensor.json"))
                .unwrap();
            assert_eq!(tree.size(ino), streamed.len() as u64);
            assert_eq!(&*tree.text(ino).unwrap(), streamed.as_bytes());
        }
    }

    /// Every window of every fixture's `program.json` and `flat_tensor.json`, rendered from
    /// marks a few bytes apart, is the slice of the whole text.
    #[test]
    fn windows_rendered_from_marks_are_slices_of_the_text() {
        for path in fixtures() {
            let model = crate::format::Model::open(&path, &[] as &[PathBuf]).unwrap();
            let tree = Tree::build(Arc::new(model));
            let (ino, kind) = match tree.find("program.json") {
                Some(ino) => (ino, TextKind::ProgramJson),
                None => (
                    tree.find("flat_tensor.json").unwrap(),
                    TextKind::FlatTensorJson(0),
                ),
            };
            let whole = tree.text(ino).unwrap();
            for every in [1, 37, 500, MARK_EVERY] {
                let marked = count_marked_every(&tree, kind, every).unwrap();
                assert_eq!(marked.len, whole.len() as u64, "{}", path.display());
                if every == 1 {
                    assert!(marked.marks.len() > 3, "{}", path.display());
                }
                let n = whole.len() as u64;
                for (offset, size) in [(0, 1), (0, 4096), (n / 3, 100), (n - 1, 10), (n, 5)]
                    .into_iter()
                    .chain((0..n).step_by(97).map(|o| (o, 61)))
                {
                    let got = render_window(&tree, kind, &marked, offset, size);
                    let (s, e) = (
                        offset.min(n) as usize,
                        (offset + u64::from(size)).min(n) as usize,
                    );
                    assert_eq!(
                        got,
                        &whole[s..e],
                        "{} every {every}: window {offset}+{size}",
                        path.display()
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn strings_are_escaped_as_serde_json_does(s in ".*", bytes in proptest::collection::vec(0u8..0x80, 0..40)) {
            for s in [s, String::from_utf8(bytes).unwrap()] {
                let mut out = String::new();
                write_json_str(&s, &mut out).unwrap();
                proptest::prop_assert_eq!(out, serde_json::to_string(&s).unwrap());
            }
        }
    }
}
