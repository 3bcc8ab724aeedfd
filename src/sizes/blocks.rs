//! Where the bytes of a model's files go, as blocks for the treemap of `sizes.svg`
//! (docs/tree.md#sizessvg): each file, its regions (the header and flatbuffer, each segment,
//! what lies outside them), and in each region what it holds: delegate payloads (and the
//! constants inside them), constant tensors, initial states, named data; each leaf keyed by
//! what colours it (the scalar type, the backend's datatype, `scales`, `graph`).
//!
//! Invariants: every byte of a file is in exactly one leaf (bytes several tensors share are
//! counted once, for the first in file order; bytes no part names are `padding`), so the
//! blocks of a file add up to its size; the order of blocks depends only on the files.

use crate::backend::KeyRole;
use crate::format::layout::{FileIndex, Location};
use crate::format::range::ByteRange;
use crate::format::{scalar_type, Kind};
use crate::picture::treemap::Block;

use crate::catalog::Catalog;

/// A part of a region: its bytes, label and key, and parts inside it (a payload's
/// constants).
struct Item {
    range: ByteRange,
    label: String,
    key: String,
    inner: Vec<Item>,
}

/// Leaves for `items` (sorted by start, not overlapping) in `range`, with the bytes between
/// them as `gap` leaves.
fn fill(range: ByteRange, mut items: Vec<Item>, gap: (&str, &str)) -> Vec<Block> {
    items.sort_by_key(|i| (i.range.start(), std::cmp::Reverse(i.range.len())));
    let mut out = Vec::new();
    let mut at = range.start();
    let mut gaps = 0u64;
    for item in items {
        let (start, end) = (item.range.start(), item.range.end());
        // Outside the range, or bytes already counted: shared bytes count once.
        if start < at || end > range.end() || item.range.is_empty() {
            continue;
        }
        gaps += start - at;
        if item.inner.is_empty() {
            out.push(Block::leaf(item.label, item.range.len(), item.key));
        } else {
            let children = fill(item.range, item.inner, ("graph", &item.key));
            out.push(Block::group(item.label, children));
        }
        at = end;
    }
    gaps += range.end().saturating_sub(at);
    if gaps > 0 {
        out.push(Block::leaf(gap.1, gaps, gap.0));
    }
    out
}

/// Short label of a named-data key (SHA-256 keys are shown by their first 12 digits).
fn key_label(key: &str) -> String {
    if key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("{}…", &key[..12])
    } else {
        key.to_string()
    }
}

/// The key of named data that payloads read: the reader's datatype, or `scales`.
fn named_key(catalog: &Catalog, key: &str, layout: Option<i8>) -> String {
    if let Some(t) = layout {
        return scalar_type::display(t);
    }
    match catalog.payloads.uses_of(key).first() {
        Some(u) if u.blob.role == KeyRole::Scale => "scales".to_string(),
        Some(u) => u.blob.datatype.clone(),
        None => "blob".to_string(),
    }
}

/// The items of file `f` that lie in its segments or flatbuffer.
fn items_of(catalog: &Catalog, f: FileIndex) -> Vec<Item> {
    let model = &*catalog.model;
    let mut items = Vec::new();
    let mut push = |l: &Location, label: String, key: String, inner: Vec<Item>| {
        if l.file == f {
            items.push(Item {
                range: l.range,
                label,
                key,
                inner,
            });
        }
    };
    if let Some(layout) = &model.pte_layout {
        for (p, plan) in layout.plans.iter().enumerate() {
            let name = &catalog.names.plans[p];
            for (i, t) in plan.tensors.iter().enumerate() {
                let Some((t, l)) = t.as_ref().and_then(|t| t.location.map(|l| (t, l))) else {
                    continue;
                };
                // External tensors are counted in their data file, as named data.
                if t.key.is_some() {
                    continue;
                }
                push(
                    &l,
                    format!("{name}/values/{i}"),
                    scalar_type::display(t.shape.scalar_type),
                    Vec::new(),
                );
            }
            for (j, d) in plan.delegates.iter().enumerate() {
                let Ok(l) = d else { continue };
                let dec = catalog.payloads.get(p, j);
                let backend = dec.map_or("not decoded", |d| d.payload.backend().display_name());
                let mut inner = Vec::new();
                if let Some(dec) = dec {
                    for k in 0..dec.payload.value_count() {
                        let Some(c) = dec.payload.constant(k) else {
                            continue;
                        };
                        let Some(cl) = dec.locate(model, &c.bytes) else {
                            continue;
                        };
                        if cl.file == l.file && within(l.range, cl.range) {
                            let dtype = c.what.split('[').next().unwrap_or_default();
                            inner.push(Item {
                                range: cl.range,
                                label: format!("%{} {}", dec.payload.value_id(k), c.what),
                                key: dtype.to_string(),
                                inner: Vec::new(),
                            });
                        }
                    }
                }
                let label = format!("{name} delegate {j} ({backend})");
                if inner.is_empty() {
                    push(l, label, "graph".to_string(), Vec::new());
                } else {
                    push(l, label, "graph".to_string(), inner);
                }
            }
        }
        if let Kind::Pte(pte) = &model.files[0].kind {
            let keys = pte.program.named_data.as_deref().unwrap_or_default();
            for (k, l) in layout.named_data.iter().enumerate() {
                let (Ok(l), Some(key)) = (l, keys.get(k).and_then(|n| n.key.as_deref())) else {
                    continue;
                };
                push(l, key_label(key), named_key(catalog, key, None), Vec::new());
            }
        }
    }
    for blob in model
        .ptd_blobs
        .get(f)
        .and_then(Option::as_ref)
        .into_iter()
        .flatten()
    {
        let Ok(l) = &blob.location else { continue };
        let layout = blob.tensor.as_ref().map(|t| t.scalar_type);
        push(
            l,
            key_label(&blob.key),
            named_key(catalog, &blob.key, layout),
            Vec::new(),
        );
    }
    items
}

/// The blocks of every file of `catalog`'s model: one per file, holding its regions.
pub fn account(catalog: &Catalog) -> Vec<Block> {
    let model = &*catalog.model;
    let mut files = Vec::new();
    for (f, file) in model.files.iter().enumerate() {
        let segments = match &file.kind {
            Kind::Pte(p) => &p.segments,
            Kind::Ptd(p) => &p.segments,
        };
        let mut items = items_of(catalog, f);
        let mut regions = Vec::new();
        let program = ByteRange::new(0, file.program_end().min(file.len()));
        if let Some(program) = program {
            let inside: Vec<Item> = extract(&mut items, program);
            let mut children = fill(program, inside, ("flatbuffer", "tables"));
            if children.len() == 1 && children[0].children.is_empty() {
                let only = children.remove(0);
                regions.push(Block::leaf(
                    "header and flatbuffer",
                    only.bytes,
                    "flatbuffer",
                ));
            } else {
                regions.push(Block::group("header and flatbuffer", children));
            }
        }
        let mut covered = program.map_or(0, |p| p.len());
        for (n, r) in segments.iter().enumerate() {
            let inside = extract(&mut items, *r);
            regions.push(Block::group(
                format!("segment {n}"),
                fill(*r, inside, ("padding", "padding")),
            ));
            covered += r.len();
        }
        let rest = file.len().saturating_sub(covered);
        if rest > 0 {
            regions.push(Block::leaf("padding between regions", rest, "padding"));
        }
        let name = crate::catalog::payloads::file_name(model, f);
        files.push(Block::group(name, regions));
    }
    files
}

/// Removes from `items` those inside `range` and returns them.
fn extract(items: &mut Vec<Item>, range: ByteRange) -> Vec<Item> {
    let (inside, outside): (Vec<Item>, Vec<Item>) = std::mem::take(items)
        .into_iter()
        .partition(|i| within(range, i.range));
    *items = outside;
    inside
}

/// Whether `inner` lies inside `outer`.
fn within(outer: ByteRange, inner: ByteRange) -> bool {
    inner.start() >= outer.start() && inner.end() <= outer.end()
}

/// The root block of `sizes.svg`: the one file, or every file of the model.
pub fn root(catalog: &Catalog) -> Block {
    let mut files = account(catalog);
    if files.len() == 1 {
        files.remove(0)
    } else {
        Block::group("files", files)
    }
}
