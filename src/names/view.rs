//! Named views (docs/tree.md#named-views): every tensor a name map names, read back in the
//! checkpoint's layout and dtype from where the model stores it — the transform undone,
//! quantized values dequantized, then converted to the checkpoint's float type. What a
//! mount shows under `names/` and in `names.safetensors`, and what `ptefs diff --names`
//! compares.
//!
//! Invariants: a view is resolved against one catalog, and only from a map whose targets
//! `NameMap::check_targets` accepts there; a name is shown only when it is `matched` and its
//! checkpoint dtype is a float type (F64, F32, F16, BF16); every read is of a window of
//! elements, computed from the stored bytes on demand (nothing holds a whole tensor beyond
//! the model's mapping); sizes are fixed when the view is resolved, so `stat` reads nothing.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::map::{name_json, NameMap, Status};
use super::stored::{stored_tensors, Stored};
use super::transform::{IndexMap, Transform};
use crate::backend::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::catalog::names::{file_name, NAME_MAX};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::{npy, safetensors, Model};

/// The longest extension a name's files get (`.hist.svg`).
pub const LONGEST_EXTENSION: usize = ".hist.svg".len();

/// Elements read from the stored tensor at a time.
pub const WINDOW: usize = 1 << 16;

/// A checkpoint's float type, which a named view converts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Float {
    F64,
    F32,
    F16,
    BF16,
}

impl Float {
    pub fn parse(dtype: &str) -> Option<Float> {
        Some(match dtype {
            "F64" => Float::F64,
            "F32" => Float::F32,
            "F16" => Float::F16,
            "BF16" => Float::BF16,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Float::F64 => "F64",
            Float::F32 => "F32",
            Float::F16 => "F16",
            Float::BF16 => "BF16",
        }
    }

    /// Bytes of one element in the checkpoint's type (in `names.safetensors`).
    pub fn size(self) -> u64 {
        match self {
            Float::F64 => 8,
            Float::F32 => 4,
            Float::F16 | Float::BF16 => 2,
        }
    }

    /// The NumPy type of the `.npy`: NumPy has no bfloat16, so BF16 is shown as float32
    /// (each value exactly the bfloat16 one, widened).
    pub fn npy_descr(self) -> &'static str {
        match self {
            Float::F64 => "<f8",
            Float::F32 | Float::BF16 => "<f4",
            Float::F16 => "<f2",
        }
    }

    /// Bytes of one element of the `.npy`.
    pub fn npy_size(self) -> u64 {
        match self {
            Float::F64 => 8,
            Float::F32 | Float::BF16 => 4,
            Float::F16 => 2,
        }
    }

    /// `v` rounded to this type, as float32 (F64 keeps the float32 value).
    pub fn round(self, v: f32) -> f32 {
        match self {
            Float::F64 | Float::F32 => v,
            Float::F16 => f16_to_f32(f32_to_f16(v)),
            Float::BF16 => bf16_to_f32(f32_to_bf16(v)),
        }
    }

    /// Appends `v` in this type's bytes (`npy`: the `.npy`'s type), little-endian.
    fn push(self, v: f32, npy: bool, out: &mut Vec<u8>) {
        match (self, npy) {
            (Float::F64, _) => out.extend_from_slice(&f64::from(v).to_le_bytes()),
            (Float::F32, _) | (Float::BF16, true) => {
                out.extend_from_slice(&self.round(v).to_le_bytes())
            }
            (Float::F16, _) => out.extend_from_slice(&f32_to_f16(v).to_le_bytes()),
            (Float::BF16, false) => out.extend_from_slice(&f32_to_bf16(v).to_le_bytes()),
        }
    }
}

/// A checkpoint name of the map, with its file names and, when it is shown, how it is read.
#[derive(Debug)]
pub struct Named {
    pub name: String,
    /// The base of its file names under `names/` (percent-encoded as keys are,
    /// docs/tree.md#names-and-percent-encoding).
    pub base: String,
    /// Its index in `NameMap::names`.
    pub entry: usize,
    pub shown: Option<Shown>,
}

/// How a shown name is read.
#[derive(Debug)]
pub struct Shown {
    pub float: Float,
    /// The checkpoint's shape.
    pub shape: Vec<u64>,
    /// The target read (index in the name's targets), and the stored tensor there.
    pub target: usize,
    pub stored: Stored,
    /// `stored = transform(checkpoint)`, and its index map.
    pub transform: Transform,
    pub map: IndexMap,
    /// How its stored values map to floats, when quantized (`catalog::tensors`' scheme).
    pub scheme: Option<String>,
    /// The `.npy` header.
    pub npy_header: Vec<u8>,
    /// Where its bytes start in `names.safetensors`, after the header.
    pub offset: u64,
}

impl Shown {
    pub fn numel(&self) -> u64 {
        self.map.numel()
    }

    pub fn npy_len(&self) -> u64 {
        self.npy_header.len() as u64 + self.numel() * self.float.npy_size()
    }

    pub fn st_len(&self) -> u64 {
        self.numel() * self.float.size()
    }
}

/// The named views of a model: every name of a map, resolved against its catalog.
#[derive(Debug)]
pub struct NamedViews {
    pub map: NameMap,
    /// In the map's (checkpoint) order.
    pub names: Vec<Named>,
    /// Tree paths and named-data keys of every target, to their name's entry.
    by_path: HashMap<String, usize>,
    by_key: HashMap<(usize, String), usize>,
    /// `names.safetensors`'s header.
    pub st_header: Vec<u8>,
    pub st_len: u64,
}

/// Why a name of the map gets no `.npy`, when it gets none.
pub fn not_shown(map: &NameMap, entry: usize) -> Option<String> {
    let n = &map.names[entry];
    match &n.status {
        Status::Matched { .. } if Float::parse(&n.dtype).is_none() => Some(format!(
            "its checkpoint dtype {} is not a float type (F64, F32, F16, BF16)",
            n.dtype
        )),
        Status::Matched { .. } => None,
        other => Some(format!("not matched: {}", other.as_str())),
    }
}

/// The target a name is read from: the closest (exact float copies before quantized ones).
fn best_target(targets: &[super::map::MapTarget]) -> usize {
    let key = |k: usize| {
        let q = &targets[k].quality;
        (q.max_error, q.rms_steps)
    };
    (0..targets.len())
        .min_by(|&a, &b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .unwrap_or(0)
}

impl NamedViews {
    /// Resolves `map` against `catalog`: refused when a target is not a stored tensor of
    /// the recorded type and shape there (the files' digests are the caller's to check,
    /// `NameMap::check_files`).
    pub fn resolve(catalog: &Catalog, map: NameMap) -> Result<NamedViews> {
        let stored = stored_tensors(catalog);
        map.check_targets(&stored)?;
        let schemes: HashMap<String, String> = crate::catalog::tensors::of(catalog)
            .into_iter()
            .filter_map(|t| Some((t.path, t.scheme?)))
            .collect();
        let mut names = Vec::with_capacity(map.names.len());
        let mut by_path = HashMap::new();
        let mut by_key = HashMap::new();
        let mut offset = 0u64;
        let mut st: Vec<(String, &str, Vec<u64>, u64)> = Vec::new();
        let mut meta: Vec<(String, String)> = Vec::new();
        for (entry, n) in map.names.iter().enumerate() {
            let base = file_name(&n.name, NAME_MAX - LONGEST_EXTENSION);
            let mut named = Named {
                name: n.name.clone(),
                base,
                entry,
                shown: None,
            };
            if let Status::Matched { targets, .. } = &n.status {
                for t in targets {
                    for p in std::iter::once(&t.stored.path).chain(&t.stored.also) {
                        by_path.entry(p.clone()).or_insert(entry);
                    }
                    if let Some(k) = &t.stored.key {
                        by_key.entry((t.stored.file, k.clone())).or_insert(entry);
                    }
                }
                if let Some(float) = Float::parse(&n.dtype) {
                    let target = best_target(targets);
                    let t = &targets[target];
                    let s = stored
                        .iter()
                        .find(|s| s.path == t.stored.path)
                        .expect("check_targets found every target");
                    let map = IndexMap::new(&t.transform, &n.shape, &s.shape).ok_or_else(|| {
                        Error::invalid(format!(
                            "{}: its transform {} does not turn {:?} into {}'s {:?}",
                            n.name, t.transform, n.shape, s.path, s.shape
                        ))
                    })?;
                    let shown = Shown {
                        float,
                        shape: n.shape.clone(),
                        target,
                        stored: s.clone(),
                        scheme: schemes.get(&s.path).cloned(),
                        npy_header: npy::header(float.npy_descr(), &n.shape),
                        offset,
                        transform: t.transform.clone(),
                        map,
                    };
                    offset = offset.checked_add(shown.st_len()).ok_or_else(|| {
                        Error::invalid("the named tensors add up past 2^64 bytes")
                    })?;
                    st.push((
                        n.name.clone(),
                        float.name(),
                        n.shape.clone(),
                        shown.st_len(),
                    ));
                    meta.push((n.name.clone(), t.stored.path.clone()));
                    named.shown = Some(shown);
                }
            }
            names.push(named);
        }
        let st_header = safetensors::header(&st, &meta);
        let st_len = (st_header.len() as u64)
            .checked_add(offset)
            .ok_or_else(|| Error::invalid("names.safetensors would pass 2^64 bytes"))?;
        Ok(NamedViews {
            map,
            names,
            by_path,
            by_key,
            st_header,
            st_len,
        })
    }

    /// How large new content of `names/<name>.npy` of name `i` (None: of
    /// `names.safetensors`) may be, and why (docs/writes.md#sizes-and-free-space): a `.npy`
    /// header and float64 values of the checkpoint's shape; a header naming every name and
    /// each in float32, or in its checkpoint dtype when wider.
    pub fn update_limit(&self, i: Option<usize>, path: &str) -> (u64, String) {
        let numel =
            |n: &super::map::MapName| n.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d));
        match i {
            Some(i) => {
                let n = self
                    .names
                    .get(i)
                    .map_or(0, |n| numel(&self.map.names[n.entry]));
                let len = npy::MAX_HEADER_LEN.saturating_add(n.saturating_mul(8));
                (
                    len,
                    format!("{path} takes a .npy header and at most float64 values of the checkpoint's shape ({len} bytes)"),
                )
            }
            None => {
                let bound = super::update::header_bound(&self.map);
                let data = self.map.names.iter().fold(0u64, |a, n| {
                    let size = super::elem::Elem::of_safetensors(&n.dtype)
                        .map_or(8, |e| e.size())
                        .max(4);
                    a.saturating_add(numel(n).saturating_mul(size))
                });
                (
                    data.saturating_add(8 + bound.bytes),
                    format!(
                        "{path} takes a header of at most {} bytes for its {} name(s) and {data} bytes of values (each name in float32, or its checkpoint dtype when wider)",
                        bound.bytes, bound.tensors
                    ),
                )
            }
        }
    }

    /// How many names are shown (have a `.npy`).
    pub fn shown(&self) -> usize {
        self.names.iter().filter(|n| n.shown.is_some()).count()
    }

    /// The checkpoint name of the stored tensor at tree path `path` (without extension).
    pub fn name_at(&self, path: &str) -> Option<&str> {
        self.by_path
            .get(path)
            .map(|&e| self.map.names[e].name.as_str())
    }

    /// The checkpoint name of the stored tensor whose bytes are named-data key `key` of
    /// model file `file`.
    pub fn name_of_key(&self, file: usize, key: &str) -> Option<&str> {
        self.by_key
            .get(&(file, key.to_string()))
            .map(|&e| self.map.names[e].name.as_str())
    }

    /// The byte ranges name `i` reads.
    pub fn sources(&self, i: usize) -> Vec<Location> {
        match self.names.get(i).and_then(|n| n.shown.as_ref()) {
            Some(s) => match &s.stored.reading {
                super::stored::Reading::Dense { location, .. } => vec![*location],
                super::stored::Reading::View(v) => v.sources().collect(),
            },
            None => Vec::new(),
        }
    }

    /// Every byte range `names.safetensors` reads.
    pub fn all_sources(&self) -> Vec<Location> {
        (0..self.names.len())
            .flat_map(|i| self.sources(i))
            .collect()
    }

    /// Elements `first .. first + out.len()` of name `i`, in the checkpoint's order, as
    /// float32 values rounded to the checkpoint's type.
    pub fn read(&self, model: &Model, i: usize, first: u64, out: &mut [f32]) -> Result<()> {
        let s = self
            .names
            .get(i)
            .and_then(|n| n.shown.as_ref())
            .ok_or_else(|| Error::not_found(format!("name {i} has no view")))?;
        let values = s.stored.values(model)?;
        gather(&s.map, first, out, |at, o| values.read(at, o))?;
        for v in out.iter_mut() {
            *v = s.float.round(*v);
        }
        Ok(())
    }

    /// Appends elements `first .. first + n` of name `i` to `out` in its `.npy` type
    /// (`npy`) or its checkpoint type.
    fn encode(
        &self, model: &Model, i: usize, first: u64, n: u64, npy: bool, out: &mut Vec<u8>,
    ) -> Result<()> {
        let float = self.names[i].shown.as_ref().expect("shown").float;
        let mut buf = vec![0f32; (n as usize).min(WINDOW)];
        let mut at = first;
        while at < first + n {
            let k = ((first + n - at) as usize).min(WINDOW);
            self.read(model, i, at, &mut buf[..k])?;
            for &v in &buf[..k] {
                float.push(v, npy, out);
            }
            at += k as u64;
        }
        Ok(())
    }

    /// Bytes `[offset, offset + size)` of the elements of name `i`, `elem` bytes each,
    /// starting at byte 0 of the elements (clamped to `total` bytes).
    fn element_bytes(
        &self, model: &Model, i: usize, npy: bool, offset: u64, end: u64, out: &mut Vec<u8>,
    ) -> Result<()> {
        let s = self.names[i].shown.as_ref().expect("shown");
        let elem = if npy {
            s.float.npy_size()
        } else {
            s.float.size()
        };
        let total = s.numel() * elem;
        let end = end.min(total);
        if offset >= end {
            return Ok(());
        }
        let first = offset / elem;
        let last = end.div_ceil(elem);
        let mut bytes = Vec::with_capacity(((last - first) * elem) as usize);
        self.encode(model, i, first, last - first, npy, &mut bytes)?;
        let from = (offset - first * elem) as usize;
        out.extend_from_slice(&bytes[from..from + (end - offset) as usize]);
        Ok(())
    }

    /// Bytes `[offset, offset + size)` of `names/<base>.npy` of name `i`.
    pub fn npy_read(&self, model: &Model, i: usize, offset: u64, size: u32) -> Result<Vec<u8>> {
        let s = self
            .names
            .get(i)
            .and_then(|n| n.shown.as_ref())
            .ok_or_else(|| Error::not_found(format!("name {i} has no .npy")))?;
        let len = s.npy_len();
        let (start, end) = (offset.min(len), offset.saturating_add(size.into()).min(len));
        let mut out = Vec::with_capacity((end - start) as usize);
        let h = s.npy_header.len() as u64;
        if start < h {
            out.extend_from_slice(&s.npy_header[start as usize..end.min(h) as usize]);
        }
        if end > h {
            self.element_bytes(model, i, true, start.max(h) - h, end - h, &mut out)?;
        }
        Ok(out)
    }

    /// Bytes `[offset, offset + size)` of `names.safetensors`.
    pub fn safetensors_read(&self, model: &Model, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (start, end) = (
            offset.min(self.st_len),
            offset.saturating_add(size.into()).min(self.st_len),
        );
        let mut out = Vec::with_capacity((end - start) as usize);
        let h = self.st_header.len() as u64;
        if start < h {
            out.extend_from_slice(&self.st_header[start as usize..end.min(h) as usize]);
        }
        if end > h {
            let (from, to) = (start.max(h) - h, end - h);
            for (i, n) in self.names.iter().enumerate() {
                let Some(s) = &n.shown else { continue };
                let (a, b) = (s.offset, s.offset + s.st_len());
                if b <= from || a >= to {
                    continue;
                }
                self.element_bytes(model, i, false, from.max(a) - a, to.min(b) - a, &mut out)?;
            }
        }
        Ok(out)
    }

    /// `names/<base>.json` of name `i`: the map's entry, and how the view reads it.
    pub fn json(&self, i: usize) -> Value {
        let n = &self.names[i];
        let entry = &self.map.names[n.entry];
        let mut o = json!({ "name": n.name });
        if let (Value::Object(o), Value::Object(e)) = (&mut o, name_json(entry)) {
            o.extend(e);
        }
        o["checkpoint_path"] = json!(self.map.checkpoints.get(entry.checkpoint).map(|c| &c.path));
        match &n.shown {
            Some(s) => {
                let Status::Matched { targets, .. } = &entry.status else {
                    unreachable!("shown names are matched")
                };
                let t = &targets[s.target];
                o["view"] = json!({
                    "npy": format!("names/{}.npy", n.base),
                    "npy_dtype": match s.float {
                        Float::F64 => "float64",
                        Float::F32 | Float::BF16 => "float32",
                        Float::F16 => "float16",
                    },
                    "read_from": t.stored.path,
                    "stored": t.stored.what,
                    "scheme": s.scheme,
                    "transform": t.transform.to_json(),
                    "transform_text": t.transform.to_string(),
                });
            }
            None => {
                o["view"] = Value::Null;
                o["why_no_view"] = json!(not_shown(&self.map, n.entry));
            }
        }
        o
    }
}

/// Reads elements `first .. first + out.len()` in the checkpoint's order through `read`
/// (which reads stored elements `at .. at + o.len()`): runs of consecutive stored elements
/// are read at once, and a window whose stored elements lie close together is read as one
/// span.
pub fn gather(
    map: &IndexMap, first: u64, out: &mut [f32],
    mut read: impl FnMut(u64, &mut [f32]) -> Result<()>,
) -> Result<()> {
    let n = out.len();
    match first.checked_add(n as u64) {
        Some(end) if end <= map.numel() => {}
        _ => {
            return Err(Error::invalid(format!(
                "elements {first}..+{n} asked of a tensor of {}",
                map.numel()
            )))
        }
    }
    if map.is_identity() || n == 0 {
        return read(first, out);
    }
    let at: Vec<u64> = (0..n as u64).map(|k| map.stored(first + k)).collect();
    let (lo, hi) = at
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    let span = hi - lo + 1;
    if span <= 2 * n as u64 + 64 {
        let mut buf = vec![0f32; span as usize];
        read(lo, &mut buf)?;
        for (o, &s) in out.iter_mut().zip(&at) {
            *o = buf[(s - lo) as usize];
        }
        return Ok(());
    }
    let mut k = 0;
    while k < n {
        let mut len = 1;
        while k + len < n && at[k + len] == at[k] + len as u64 {
            len += 1;
        }
        read(at[k], &mut out[k..k + len])?;
        k += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Direction;

    #[test]
    fn gather_undoes_every_transform() {
        let cases = [
            (
                Transform::Axes { order: vec![1, 0] },
                vec![6, 10],
                vec![10, 6],
            ),
            (
                Transform::Rotary {
                    direction: Direction::HfToMeta,
                    heads: 2,
                },
                vec![12, 3],
                vec![12, 3],
            ),
            (
                Transform::Axes {
                    order: vec![0, 2, 3, 1],
                },
                vec![4, 3, 2, 2],
                vec![4, 2, 2, 3],
            ),
        ];
        for (t, ckpt, stored) in cases {
            let map = IndexMap::new(&t, &ckpt, &stored).unwrap();
            // Stored element s holds checkpoint element source(s).
            let stored_vals: Vec<f32> = (0..map.numel()).map(|s| map.source(s) as f32).collect();
            for (first, n) in [(0, map.numel() as usize), (5, 7), (1, 1)] {
                let mut out = vec![0f32; n];
                gather(&map, first, &mut out, |at, o| {
                    o.copy_from_slice(&stored_vals[at as usize..at as usize + o.len()]);
                    Ok(())
                })
                .unwrap();
                let want: Vec<f32> = (first..first + n as u64).map(|c| c as f32).collect();
                assert_eq!(out, want, "{t}");
            }
        }
    }

    #[test]
    fn floats_round_and_encode() {
        assert_eq!(Float::BF16.round(1.0 + 1.0 / 1024.0), 1.0);
        let mut out = Vec::new();
        Float::BF16.push(1.5, false, &mut out);
        assert_eq!(out, 0x3fc0u16.to_le_bytes());
        out.clear();
        Float::BF16.push(1.5, true, &mut out);
        assert_eq!(out, 1.5f32.to_le_bytes());
        assert_eq!(Float::parse("I64"), None);
    }
}
