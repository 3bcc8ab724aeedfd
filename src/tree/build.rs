//! Builds the `Tree` that shows a `Model` (docs/tree.md#a-pte-mount, docs/tree.md#a-ptd-mount).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use super::lazy::{LazyDir, LazyKind};
use super::{Content, HistOf, Ino, NamedFile, Node, TextCache, TextKind, Tree, ROOT, UNKNOWN_LEN};
use crate::backend::{BlobRef, FloatView};
use crate::catalog::names::{self, Names};
use crate::catalog::{Catalog, Decoded, Payloads};
use crate::error::{Error, Result};
use crate::format::layout::{FileIndex, Location, TensorData, TensorShape};
use crate::format::sharing::TensorId;
use crate::format::target::WeightsView;
use crate::format::{npy, scalar_type, Kind, Model, WriteTarget};
use crate::names::view::{not_shown, NamedViews};
use crate::names::NameMap;

/// The most nodes a tree may have unless the user allows more (`--max-nodes`): about 1.5
/// million tensor values, several GiB of memory for the parsed program and the tree.
pub const DEFAULT_MAX_NODES: u64 = 4_000_000;

pub(super) struct Builder {
    /// The inode of `nodes[0]`.
    base: Ino,
    nodes: Vec<Node>,
    /// Every directory, and whether its children were listed in name order as they were
    /// added (`finish` sorts the others).
    dirs: Vec<(Ino, bool)>,
    /// The lazy directory being filled, which is not among `nodes`: its inode, its children,
    /// and whether they were listed in name order.
    top: Option<(Ino, Vec<Ino>, bool)>,
    /// The lazy directories the eager part declared, in declaration order.
    lazy: Vec<Declared>,
}

/// A lazy directory as the eager build declares it: its inode, what it shows, how many
/// nodes it will hold and whether any of them is writable.
struct Declared {
    dir: Ino,
    kind: LazyKind,
    count: u64,
    writable: bool,
}

impl Builder {
    /// A builder of the eager part of a tree, whose root is inode 1.
    fn eager(capacity: usize) -> Builder {
        let mut nodes = Vec::with_capacity(capacity);
        nodes.push(Node {
            name: String::new(),
            parent: ROOT,
            content: Content::Dir(Vec::new()),
            write: None,
        });
        Builder {
            base: ROOT,
            nodes,
            dirs: vec![(ROOT, false)],
            top: None,
            lazy: Vec::new(),
        }
    }

    /// A builder of the contents of lazy directory `dir`, whose nodes take the inodes from
    /// `first` on.
    fn contents_of(dir: Ino, first: Ino, count: u64) -> Builder {
        Builder {
            base: first,
            nodes: Vec::with_capacity(usize::try_from(count).unwrap_or(0)),
            dirs: Vec::new(),
            top: Some((dir, Vec::new(), false)),
            lazy: Vec::new(),
        }
    }

    /// The inode the next node gets.
    fn next_ino(&self) -> Ino {
        self.base + self.nodes.len() as Ino
    }

    /// Adds a node without listing it in its parent; the caller lists it with `set_children`.
    fn push_unlisted(&mut self, node: Node) -> Ino {
        let ino = self.next_ino();
        if node.is_dir() {
            self.dirs.push((ino, false));
        }
        self.nodes.push(node);
        ino
    }

    /// Adds a node and lists it in its parent.
    fn push_node(&mut self, node: Node) -> Ino {
        let parent = node.parent;
        let ino = self.push_unlisted(node);
        match &mut self.top {
            Some((top, children, _)) if *top == parent => children.push(ino),
            _ => {
                if let Content::Dir(children) = &mut self.node_mut(parent).content {
                    children.push(ino);
                }
            }
        }
        ino
    }

    fn push(&mut self, parent: Ino, name: String, content: Content) -> Ino {
        self.push_node(node(parent, name, content, None))
    }

    fn dir(&mut self, parent: Ino, name: &str) -> Ino {
        self.push(parent, name.to_string(), Content::Dir(Vec::new()))
    }

    /// Adds a directory whose contents are built when first used (`super::lazy`), with the
    /// number of nodes they will be, and whether any of them is writable.
    fn lazy_dir(
        &mut self, parent: Ino, name: &str, kind: LazyKind, (count, writable): (u64, bool),
    ) -> Ino {
        let k = self.lazy.len();
        let dir = self.push(parent, name.to_string(), Content::LazyDir(k));
        self.lazy.push(Declared {
            dir,
            kind,
            count,
            writable,
        });
        dir
    }

    fn text(&mut self, parent: Ino, name: &str, kind: TextKind) -> Ino {
        self.push(parent, name.to_string(), text(kind))
    }

    fn node_mut(&mut self, ino: Ino) -> &mut Node {
        &mut self.nodes[(ino - self.base) as usize]
    }

    /// Sets the children of `dir`, which the caller has put in name order.
    fn set_children(&mut self, dir: Ino, children: Vec<Ino>) {
        if let Some((top, listed, ordered)) = &mut self.top {
            if *top == dir {
                *listed = children;
                *ordered = true;
                return;
            }
        }
        self.node_mut(dir).content = Content::Dir(children);
        if let Some(d) = self.dirs.iter_mut().rev().find(|(d, _)| *d == dir) {
            d.1 = true;
        }
    }

    /// Sorts `children` by the names of nodes of this builder.
    fn sort_by_name(&self, children: &mut [Ino]) {
        let (base, nodes) = (self.base, &self.nodes);
        children.sort_by(|a, b| {
            nodes[(*a - base) as usize]
                .name
                .cmp(&nodes[(*b - base) as usize].name)
        });
    }

    /// Sorts the children of every directory by name, except those already in order.
    fn sort_dirs(&mut self) {
        for k in 0..self.dirs.len() {
            let (dir, ordered) = self.dirs[k];
            if ordered {
                continue;
            }
            let Content::Dir(children) = &mut self.node_mut(dir).content else {
                continue;
            };
            let mut children = std::mem::take(children);
            self.sort_by_name(&mut children);
            self.node_mut(dir).content = Content::Dir(children);
        }
    }

    /// The eager tree, its lazy directories given the inodes after its own.
    fn finish(mut self, catalog: Arc<Catalog>, names: Option<Arc<NamedViews>>) -> Tree {
        self.sort_dirs();
        let mut first = self.next_ino();
        let lazy = self
            .lazy
            .iter()
            .map(|d| {
                let l = LazyDir::new(d.dir, first, d.count, d.writable, d.kind);
                first = first.saturating_add(d.count);
                l
            })
            .collect();
        Tree {
            model: catalog.model.clone(),
            catalog,
            names,
            nodes: self.nodes,
            lazy,
            sharing: OnceLock::new(),
            texts: TextCache::new(super::TEXT_CACHE_BUDGET),
            sizes: OnceLock::new(),
        }
    }

    /// The nodes of a lazy directory and its children in name order.
    fn finish_contents(mut self) -> (Vec<Node>, Vec<Ino>) {
        self.sort_dirs();
        let (_, mut children, ordered) = self.top.take().expect("a builder of contents");
        if !ordered {
            self.sort_by_name(&mut children);
        }
        (self.nodes, children)
    }
}

fn text(kind: TextKind) -> Content {
    Content::Text {
        kind,
        len: AtomicU64::new(UNKNOWN_LEN),
    }
}

/// `<base><ext>`, allocated once at its final size (a tree holds a few names per value).
fn file_name(base: &str, ext: &str) -> String {
    let mut name = String::with_capacity(base.len() + ext.len());
    name.push_str(base);
    name.push_str(ext);
    name
}

/// `0..n` in the order of their decimal strings: 0, 1, 10, 100, …, 11, …, 2, ….
///
/// A preorder walk of the decimal digits: after `k` come `k0`…`k9` (those below `n`), then
/// `k + 1`, or the next number of the closest ancestor that has one. Names `<i>.<ext>` sort
/// in this order of `i`, since '.' sorts before every digit.
fn decimal_order(n: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    out.push(0);
    let mut k = 1;
    while out.len() < n {
        out.push(k);
        match k.checked_mul(10).filter(|&first_child| first_child < n) {
            Some(first_child) => k = first_child,
            None => {
                while k % 10 == 9 || k + 1 >= n {
                    k /= 10;
                }
                k += 1;
            }
        }
    }
    out
}

fn node(parent: Ino, name: String, content: Content, write: Option<WriteTarget>) -> Node {
    Node {
        name,
        parent,
        content,
        write,
    }
}

/// The `<base>.bin` and, when NumPy can describe it, `<base>.npy` of a tensor's bytes.
fn tensor_nodes(
    dir: Ino, base: &str, loc: Location, shape: &Arc<TensorShape>, of: TensorId,
) -> (Node, Option<Node>) {
    let bin = node(
        dir,
        file_name(base, ".bin"),
        Content::Range(loc),
        Some(WriteTarget::TensorBin {
            location: loc,
            shape: shape.clone(),
            of,
        }),
    );
    let npy = npy_header(shape).map(|header| {
        node(
            dir,
            file_name(base, ".npy"),
            Content::Npy {
                header,
                location: loc,
            },
            Some(WriteTarget::TensorNpy {
                location: loc,
                shape: shape.clone(),
                of,
            }),
        )
    });
    (bin, npy)
}

/// Whether a tensor gets a `.npy` (`npy_header` is `Some`), without making the header.
fn has_npy(shape: &TensorShape) -> bool {
    scalar_type::numpy_descr_str(shape.scalar_type).is_some() && shape.physical_dims().is_some()
}

/// Whether a tensor whose bytes are at hand gets a `.hist.svg` (docs/tree.md#histograms):
/// it has a `.npy` and its elements are numbers.
fn has_hist(shape: &TensorShape) -> bool {
    has_npy(shape) && super::hist::has_histogram(shape.scalar_type)
}

/// `<base>.hist.svg`, whose length is fixed.
fn hist_node(dir: Ino, base: &str, of: HistOf) -> Node {
    node(
        dir,
        file_name(base, ".hist.svg"),
        Content::Text {
            kind: TextKind::Hist(of),
            len: AtomicU64::new(crate::picture::hist::HIST_SVG_LEN as u64),
        },
        None,
    )
}

/// The `.npy` header of a tensor (docs/tree.md#physical-shape-and-dim-order: its physical
/// shape), when NumPy can describe its type.
fn npy_header(shape: &TensorShape) -> Option<Vec<u8>> {
    let descr = scalar_type::numpy_descr_str(shape.scalar_type)?;
    Some(npy::header_from_dims(descr, shape.physical_dims()?))
}

fn add_segments(
    b: &mut Builder, parent: Ino, file: FileIndex, segments: &[crate::format::range::ByteRange],
) {
    let dir = b.dir(parent, "segments");
    for (n, r) in segments.iter().enumerate() {
        let loc = Location { file, range: *r };
        let ino = b.push(dir, n.to_string(), Content::Range(loc));
        let node = b.node_mut(ino);
        node.write = Some(WriteTarget::Segment {
            file,
            index: n,
            location: loc,
        });
    }
}

/// `weights.safetensors` showing `view`, at `dir` (docs/tree.md#weightssafetensors).
fn add_weights(b: &mut Builder, dir: Ino, view: WeightsView) {
    let ino = b.push(
        dir,
        "weights.safetensors".to_string(),
        Content::Weights { view },
    );
    b.node_mut(ino).write = Some(WriteTarget::Weights { view });
}

fn add_ptd(b: &mut Builder, model: &Model, root: Ino, file: FileIndex) {
    let ptd = model.ptd(file).expect("a .ptd");
    b.text(root, "header.json", TextKind::HeaderJson(file));
    b.text(root, "flat_tensor.json", TextKind::FlatTensorJson(file));
    b.lazy_dir(
        root,
        "named_data",
        LazyKind::PtdNamedData(file),
        ptd_named_count(model, file),
    );
    add_segments(b, root, file, &ptd.segments);
    // A data file attached to a program shows exactly what a mount of it alone shows; the
    // program's root shows every file.
    let view = if file == 0 {
        WeightsView::Root
    } else {
        WeightsView::File(file)
    };
    add_weights(b, root, view);
}

/// The contents of `named_data/` of data file `file`: each entry's `.json`, and its `.bin`
/// (with `.npy` and `.hist.svg` for a tensor) when its bytes are at hand.
pub(super) fn fill_ptd_named(
    b: &mut Builder, model: &Model, names: &Names, nd_dir: Ino, file: FileIndex,
) {
    let nd_names = &names.named_data[file];
    for (k, blob) in model.ptd_blobs[file].iter().flatten().enumerate() {
        let base = &nd_names[k];
        b.push(
            nd_dir,
            file_name(base, ".json"),
            text(TextKind::NamedDataJson(file, k)),
        );
        let Ok(loc) = blob.location else { continue };
        match &blob.tensor {
            Some(shape) => {
                let (bin, npy) = tensor_nodes(nd_dir, base, loc, shape, TensorId::key(file, k));
                b.push_node(bin);
                if let Some(npy) = npy {
                    b.push_node(npy);
                }
                if has_hist(shape) {
                    b.push_node(hist_node(nd_dir, base, HistOf::Named(file, k)));
                }
            }
            None => {
                let ino = b.push(nd_dir, file_name(base, ".bin"), Content::Range(loc));
                let node = b.node_mut(ino);
                node.write = Some(WriteTarget::Blob {
                    file,
                    named_index: k,
                });
            }
        }
    }
}

/// The nodes of `named_data/` of data file `file`, and whether one is writable.
fn ptd_named_count(model: &Model, file: FileIndex) -> (u64, bool) {
    let mut n = 0;
    let mut writable = false;
    for blob in model.ptd_blobs[file].iter().flatten() {
        n += 1;
        if blob.location.is_ok() {
            writable = true;
            n += 1 + blob
                .tensor
                .as_deref()
                .map_or(0, |t| u64::from(has_npy(t)) + u64::from(has_hist(t)));
        }
    }
    (n, writable)
}

/// The nodes of `plans/<name>/values/` of `tensors`, and whether one is writable.
fn values_count(tensors: &[Option<Box<TensorData>>]) -> (u64, bool) {
    let mut n = 0;
    let mut writable = false;
    for t in tensors {
        n += 1;
        if let Some(t) = t.as_ref().filter(|t| t.location.is_some()) {
            writable = true;
            n += 1 + u64::from(has_npy(&t.shape)) + u64::from(has_hist(&t.shape));
        }
    }
    (n, writable)
}

/// The contents of `plans/<name>/values/`: every value's `.json`, and the `.bin` and `.npy`
/// of tensors whose bytes are at hand. Inodes follow the values' order; the listing is in
/// name order, built without comparing names.
pub(super) fn fill_values(
    b: &mut Builder, values: Ino, p: usize, tensors: &[Option<Box<TensorData>>],
) {
    // Per value, the inode of its `.json`; its `.bin`, `.npy` and `.hist.svg`, when it has
    // them, follow in that order (a `.hist.svg` only after a `.npy`).
    let mut first = Vec::with_capacity(tensors.len() + 1);
    let mut buf = [0u8; 20];
    for (i, t) in tensors.iter().enumerate() {
        let base = names::decimal(i as u64, &mut buf);
        let json = file_name(base, ".json");
        first.push(b.push_unlisted(node(values, json, text(TextKind::ValueJson(p, i)), None)));
        if let Some((t, loc)) = t.as_ref().and_then(|t| t.location.map(|l| (t, l))) {
            let (bin, npy) = tensor_nodes(values, base, loc, &t.shape, TensorId::value(p, i));
            b.push_unlisted(bin);
            if let Some(npy) = npy {
                b.push_unlisted(npy);
                if has_hist(&t.shape) {
                    b.push_unlisted(hist_node(values, base, HistOf::Value(p, i)));
                }
            }
        }
    }
    let end = b.next_ino();
    first.push(end);
    let mut children = Vec::with_capacity((end - first[0]) as usize);
    for i in decimal_order(tensors.len()) {
        let (json, next) = (first[i], first[i + 1]);
        // Name order: ".bin" < ".hist.svg" < ".json" < ".npy".
        if next - json > 1 {
            children.push(json + 1);
        }
        if next - json > 3 {
            children.push(json + 3);
        }
        children.push(json);
        if next - json > 2 {
            children.push(json + 2);
        }
    }
    b.set_children(values, children);
}

/// The nodes of value `k` of a decoded payload: its `.json`, and for a constant whose bytes
/// are at hand its `.bin`, `.npy` (when NumPy can describe it) and `.f32.npy` (when the
/// backend dequantizes it).
fn payload_value_nodes(
    model: &Model, dec: &Decoded, dir: Ino, p: usize, j: usize, k: usize,
) -> Vec<Node> {
    let payload = &*dec.payload;
    let mut buf = [0u8; 20];
    let base = names::decimal(u64::from(payload.value_id(k)), &mut buf).to_string();
    let mut out = vec![node(
        dir,
        file_name(&base, ".json"),
        text(TextKind::PayloadValueJson(p, j, k)),
        None,
    )];
    let Some(constant) = payload.constant(k) else {
        return out;
    };
    let Some(location) = dec.locate(model, &constant.bytes) else {
        return out;
    };
    let what: Arc<str> = constant.what.into();
    let of = match &constant.bytes {
        BlobRef::Named { key, .. } => model
            .named_blob(key)
            .map(|(file, k, _)| TensorId::key(file, k)),
        _ => None,
    };
    out.push(node(
        dir,
        file_name(&base, ".bin"),
        Content::Range(location),
        Some(WriteTarget::PayloadConstant {
            location,
            what: what.clone(),
            of,
        }),
    ));
    // A `.npy` and a `.f32.npy` are listed only when the bytes at hand back them: dims far
    // larger than the constant's bytes (`check` reports them) would list files of many GB
    // whose reads could only fail. A commit that resizes the bytes may thus change the
    // tree's shape (the kernel is then told to look every name up again).
    if let Some((descr, shape)) = constant.npy.filter(|(d, s)| npy_backed(d, s, &location)) {
        let shape: Arc<[u64]> = shape.into();
        out.push(node(
            dir,
            file_name(&base, ".npy"),
            Content::Npy {
                header: npy::header_from_dims(descr, shape.iter().copied()),
                location,
            },
            Some(WriteTarget::PayloadConstantNpy {
                location,
                descr,
                shape,
                what,
                of,
            }),
        ));
    }
    if dec.value_view(model, k).is_some_and(|v| v.backed()) {
        out.push(hist_node(dir, &base, HistOf::Payload(p, j, k)));
    }
    if let Some(view) = dec.float_view(model, k).filter(FloatView::backed) {
        let write = payload
            .float_writable(k)
            .then_some(WriteTarget::PayloadConstantF32 {
                plan: p,
                delegate: j,
                value: payload.value_id(k),
            });
        out.push(node(
            dir,
            file_name(&base, ".f32.npy"),
            Content::FloatView {
                header: view.npy_header(),
                view: Arc::new(view),
            },
            write,
        ));
    }
    out
}

/// Whether a constant's bytes at `location` are exactly the array its `.npy` would describe.
fn npy_backed(descr: &str, shape: &[u64], location: &Location) -> bool {
    npy::data_nbytes(descr, shape) == Some(location.range.len())
}

/// `delegates/<j>/<backend>/` of a payload that decoded (docs/tree.md#xnnpack-delegates).
fn add_payload(
    b: &mut Builder, model: &Model, delegate_dir: Ino, p: usize, j: usize, dec: &Decoded,
) {
    let dir = b.dir(delegate_dir, dec.payload.backend().dir_name());
    b.text(dir, "header.json", TextKind::PayloadHeader(p, j));
    b.text(dir, "graph.json", TextKind::PayloadGraphJson(p, j));
    b.text(dir, "graph.txt", TextKind::PayloadGraphTxt(p, j));
    b.text(dir, "graph.dot", TextKind::PayloadGraphDot(p, j));
    b.lazy_dir(
        dir,
        "values",
        LazyKind::PayloadValues(p, j),
        payload_values_count(model, dec),
    );
}

/// The contents of `delegates/<j>/<backend>/values/` of a decoded payload.
pub(super) fn fill_payload_values(
    b: &mut Builder, model: &Model, values: Ino, p: usize, j: usize, dec: &Decoded,
) {
    for k in 0..dec.payload.value_count() {
        for n in payload_value_nodes(model, dec, values, p, j, k) {
            b.push_node(n);
        }
    }
}

/// Adds the tree of a `.pte`; returns the delegate directories whose payloads decoded, for
/// `add_payload` to fill last: the nodes of a decoded payload depend on its bytes, and a
/// commit that changes them must not move the inode numbers of every node after them.
fn add_pte(
    b: &mut Builder, model: &Model, names: &Names, payloads: &Payloads, root: Ino,
) -> Vec<(Ino, usize, usize)> {
    let mut decoded_dirs = Vec::new();
    let pte = model.pte().expect("a .pte");
    let layout = model.pte_layout.as_ref().expect("a resolved .pte");
    b.text(root, "header.json", TextKind::HeaderJson(0));
    b.text(root, "program.json", TextKind::ProgramJson);
    let plans_dir = b.dir(root, "plans");
    for (p, name) in names.plans.iter().enumerate() {
        let plan_dir = b.dir(plans_dir, name);
        b.text(plan_dir, "plan.json", TextKind::PlanJson(p));
        b.text(plan_dir, "operators.txt", TextKind::Operators(p));
        b.text(plan_dir, "instructions.txt", TextKind::Instructions(p));
        b.text(plan_dir, "graph.dot", TextKind::PlanGraphDot(p));
        b.lazy_dir(
            plan_dir,
            "values",
            LazyKind::Values(p),
            values_count(&layout.plans[p].tensors),
        );
        let delegates_dir = b.dir(plan_dir, "delegates");
        for (j, loc) in layout.plans[p].delegates.iter().enumerate() {
            let d = b.dir(delegates_dir, &j.to_string());
            b.text(d, "delegate.json", TextKind::DelegateJson(p, j));
            if let Ok(loc) = loc {
                let ino = b.push(d, "processed.bin".to_string(), Content::Range(*loc));
                let node = b.node_mut(ino);
                node.write = Some(WriteTarget::DelegatePayload {
                    plan: p,
                    delegate: j,
                });
            }
            if payloads.get(p, j).is_some() {
                decoded_dirs.push((d, p, j));
            }
        }
    }
    let named = &layout.named_data;
    let count = named.len() as u64 + named.iter().filter(|l| l.is_ok()).count() as u64;
    let writable = named.iter().any(|l| l.is_ok());
    b.lazy_dir(
        root,
        "named_data",
        LazyKind::PteNamedData,
        (count, writable),
    );
    add_segments(b, root, 0, &pte.segments);
    add_weights(b, root, WeightsView::Root);
    if model.files.len() > 1 {
        let data = b.dir(root, "data");
        for (k, name) in names.data.iter().enumerate() {
            let sub = b.dir(data, name);
            add_ptd(b, model, sub, k + 1);
        }
    }
    decoded_dirs
}

/// The contents of a program's `named_data/`: each entry's `.json`, and its `.bin` when its
/// bytes are at hand.
pub(super) fn fill_pte_named(b: &mut Builder, model: &Model, names: &Names, nd_dir: Ino) {
    let layout = model.pte_layout.as_ref().expect("a resolved .pte");
    let nd_names = &names.named_data[0];
    for (k, loc) in layout.named_data.iter().enumerate() {
        b.push(
            nd_dir,
            file_name(&nd_names[k], ".json"),
            text(TextKind::NamedDataJson(0, k)),
        );
        if let Ok(loc) = loc {
            let ino = b.push(
                nd_dir,
                file_name(&nd_names[k], ".bin"),
                Content::Range(*loc),
            );
            let node = b.node_mut(ino);
            node.write = Some(WriteTarget::Blob {
                file: 0,
                named_index: k,
            });
        }
    }
}

/// `names/` and `names.safetensors` at the root (docs/tree.md#named-views): every name of
/// the map has a `.json`; a shown one also its `.npy` and `.hist.svg`.
fn add_names(b: &mut Builder, views: &NamedViews) {
    let shown = views.names.iter().filter(|n| n.shown.is_some()).count() as u64;
    let count = views.names.len() as u64 + 2 * shown;
    b.lazy_dir(ROOT, "names", LazyKind::Names, (count, shown > 0));
    let ino = b.push(
        ROOT,
        "names.safetensors".to_string(),
        Content::Named(NamedFile::Safetensors),
    );
    b.node_mut(ino).write = Some(WriteTarget::NamesSafetensors);
}

/// The contents of `names/`.
pub(super) fn fill_names(b: &mut Builder, views: &NamedViews, dir: Ino) {
    for (i, n) in views.names.iter().enumerate() {
        b.text(dir, &file_name(&n.base, ".json"), TextKind::NameJson(i));
        if n.shown.is_some() {
            let ino = b.push(
                dir,
                file_name(&n.base, ".npy"),
                Content::Named(NamedFile::Npy(i)),
            );
            b.node_mut(ino).write = Some(WriteTarget::NameNpy { name: i });
            b.push_node(hist_node(dir, &n.base, HistOf::Name(i)));
        }
    }
}

/// The nodes `add_names` makes for the names of `map`.
pub fn names_node_count(map: &NameMap) -> u64 {
    let shown = (0..map.names.len())
        .filter(|&e| not_shown(map, e).is_none())
        .count() as u64;
    2 + map.names.len() as u64 + 2 * shown
}

/// The number of nodes `Tree::build` makes for `model`, counted from its tables without
/// building anything (so a file too large for the limit is refused before it costs memory).
pub fn node_count(model: &Model) -> u64 {
    node_count_with(model, &Payloads::decode(model))
}

/// The nodes of `<backend>/values/` of a decoded payload, and whether one is writable.
fn payload_values_count(model: &Model, dec: &Decoded) -> (u64, bool) {
    let mut n = 0;
    let mut writable = false;
    let payload = &*dec.payload;
    for k in 0..payload.value_count() {
        n += 1;
        let Some(constant) = payload.constant(k) else {
            continue;
        };
        let Some(location) = dec.locate(model, &constant.bytes) else {
            continue;
        };
        writable = true;
        n += 1;
        n += u64::from(
            constant
                .npy
                .is_some_and(|(d, s)| npy_backed(d, &s, &location)),
        );
        n += u64::from(dec.value_view(model, k).is_some_and(|v| v.backed()));
        n += u64::from(dec.float_view(model, k).is_some_and(|v| v.backed()));
    }
    (n, writable)
}

/// `node_count` with the payloads already decoded.
pub fn node_count_with(model: &Model, payloads: &Payloads) -> u64 {
    let mut n: u64 = 4; // the root, sizes.txt, sizes.json, sizes.svg
    let segments = |file: &crate::format::ModelFile| match &file.kind {
        Kind::Pte(p) => p.segments.len() as u64,
        Kind::Ptd(p) => p.segments.len() as u64,
    };
    // header.json, flat_tensor.json, named_data/, segments/, weights.safetensors
    let ptd = |f: FileIndex| 5 + segments(&model.files[f]) + ptd_named_count(model, f).0;
    match (&model.files[0].kind, &model.pte_layout) {
        (Kind::Pte(_), Some(layout)) => {
            // header.json, program.json, plans/, named_data/, segments/, weights.safetensors
            n += 6 + segments(&model.files[0]);
            for plan in &layout.plans {
                // the directory, plan.json, operators.txt, instructions.txt, graph.dot,
                // values/, delegates/
                n += 7 + values_count(&plan.tensors).0;
                for d in &plan.delegates {
                    n += 2 + u64::from(d.is_ok());
                }
            }
            for ((_, _), dec) in payloads.iter() {
                // <backend>/, header.json, graph.json, graph.txt, graph.dot, values/
                n += 6 + payload_values_count(model, dec).0;
            }
            for loc in &layout.named_data {
                n += 1 + u64::from(loc.is_ok());
            }
            if model.files.len() > 1 {
                n += 1;
                for f in 1..model.files.len() {
                    n += 1 + ptd(f);
                }
            }
        }
        _ => n += ptd(0),
    }
    n
}

impl Tree {
    /// The tree of `model`, unless it would have more than `max_nodes` nodes.
    pub fn build_limited(model: Arc<Model>, max_nodes: u64) -> Result<Tree> {
        Tree::build_named(model, max_nodes, None)
    }

    /// The tree of `model` with the named views of `map` (which the caller has checked
    /// against the files, `NameMap::check_files`), unless it would have more than
    /// `max_nodes` nodes.
    pub fn build_named(model: Arc<Model>, max_nodes: u64, map: Option<NameMap>) -> Result<Tree> {
        Tree::build_with(model, max_nodes, |_| Ok(map))
    }

    /// The tree of `model` with the named views of the map `names` gives for its catalog
    /// (checked against the files by `names`), unless it would have more than `max_nodes`
    /// nodes: the model alone is counted before `names` is asked.
    pub fn build_with(
        model: Arc<Model>, max_nodes: u64, names: impl FnOnce(&Catalog) -> Result<Option<NameMap>>,
    ) -> Result<Tree> {
        let payloads = Payloads::decode(&model);
        let n = node_count_with(&model, &payloads);
        if n > max_nodes {
            return Err(too_many_nodes(&model, n, max_nodes));
        }
        let catalog = Arc::new(Catalog::with_payloads(model, payloads));
        let map = names(&catalog)?;
        let n = n.saturating_add(map.as_ref().map_or(0, names_node_count));
        if n > max_nodes {
            return Err(too_many_nodes(&catalog.model, n, max_nodes));
        }
        let views = match map {
            Some(map) => Some(Arc::new(NamedViews::resolve(&catalog, map)?)),
            None => None,
        };
        Ok(Tree::of_named(catalog, views))
    }

    /// The tree of `model`, however large.
    pub fn build(model: Arc<Model>) -> Tree {
        Tree::of(Arc::new(Catalog::of(model)))
    }

    /// The tree that shows `catalog`'s model.
    pub fn of(catalog: Arc<Catalog>) -> Tree {
        Tree::of_named(catalog, None)
    }

    /// The tree that shows `catalog`'s model, and the named views `views` (resolved against
    /// the same catalog).
    pub fn of_named(catalog: Arc<Catalog>, views: Option<Arc<NamedViews>>) -> Tree {
        let model = &*catalog.model;
        let mut b = Builder::eager(64);
        let (names, payloads) = (&catalog.names, &catalog.payloads);
        b.text(ROOT, "sizes.txt", TextKind::SizesTxt);
        b.text(ROOT, "sizes.json", TextKind::SizesJson);
        b.text(ROOT, "sizes.svg", TextKind::SizesSvg);
        match &model.files[0].kind {
            Kind::Pte(_) => {
                for (dir, p, j) in add_pte(&mut b, model, names, payloads, ROOT) {
                    let dec = payloads.get(p, j).expect("listed because it decoded");
                    add_payload(&mut b, model, dir, p, j, dec);
                }
            }
            Kind::Ptd(_) => {
                add_ptd(&mut b, model, ROOT, 0);
            }
        }
        if let Some(views) = &views {
            add_names(&mut b, views);
        }
        b.finish(catalog, views)
    }

    /// The nodes and the listing of lazy directory `dir` (`super::lazy`).
    pub(super) fn fill_lazy(&self, dir: &LazyDir) -> (Vec<Node>, Vec<Ino>) {
        let model = &*self.model;
        let names = &self.catalog.names;
        let mut b = Builder::contents_of(dir.dir, dir.first, dir.count);
        match dir.kind {
            LazyKind::Values(p) => {
                let layout = model.pte_layout.as_ref().expect("a resolved .pte");
                fill_values(&mut b, dir.dir, p, &layout.plans[p].tensors);
            }
            LazyKind::PteNamedData => fill_pte_named(&mut b, model, names, dir.dir),
            LazyKind::PtdNamedData(file) => fill_ptd_named(&mut b, model, names, dir.dir, file),
            LazyKind::PayloadValues(p, j) => {
                if let Some(dec) = self.catalog.payloads.get(p, j) {
                    fill_payload_values(&mut b, model, dir.dir, p, j, dec);
                }
            }
            LazyKind::Names => {
                if let Some(views) = &self.names {
                    fill_names(&mut b, views, dir.dir);
                }
            }
        }
        b.finish_contents()
    }
}

/// The refusal of a tree over the node limit, naming the numbers and how to raise it.
pub fn too_many_nodes(model: &Model, nodes: u64, max_nodes: u64) -> Error {
    let values: usize = model
        .pte_layout
        .as_ref()
        .map_or(0, |l| l.plans.iter().map(|p| p.tensors.len()).sum());
    Error::new(
        libc::EFBIG,
        format!(
            "{}: its tree would have {nodes} nodes ({values} values), more than the limit of {max_nodes}; \
             raise the limit with --max-nodes {nodes} (mount also takes -o max_nodes={nodes}) if the memory is there \
             (about {} MiB for the tree alone)",
            model.files[0].path.display(),
            (nodes.saturating_mul(NODE_MEMORY)).div_ceil(1 << 20)
        ),
    )
}

/// Memory of one node with its name, `.npy` header and place in a listing, roughly (224
/// bytes measured on a file of 2.5 million tensors).
const NODE_MEMORY: u64 = (std::mem::size_of::<Node>() + 96) as u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_order_is_name_order() {
        for n in (0..1200).chain([9999, 10000, 10001, 12345, 100_000]) {
            let mut by_name: Vec<usize> = (0..n).collect();
            by_name.sort_by_key(|i| i.to_string());
            assert_eq!(decimal_order(n), by_name, "n = {n}");
        }
    }

    #[test]
    fn value_file_names_sort_by_decimal_order() {
        let mut names: Vec<String> = (0..1500)
            .flat_map(|i| [".json", ".bin", ".npy"].map(|e| format!("{i}{e}")))
            .collect();
        names.sort();
        let ordered: Vec<String> = decimal_order(1500)
            .into_iter()
            .flat_map(|i| [".bin", ".json", ".npy"].map(|e| format!("{i}{e}")))
            .collect();
        assert_eq!(names, ordered);
    }
}
