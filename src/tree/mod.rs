//! The virtual tree of docs/tree.md, built from parsed files.
//!
//! Invariants: inode numbers are positions in `nodes` plus one (the root is 1) for the nodes
//! built with the tree, then the ranges of the lazy directories (`lazy`), all assigned in a
//! deterministic walk of the file, so the same file always gets the same numbers; every
//! directory's children are sorted by name and unique; every byte range a node points at lies
//! inside its file (it came from `format::layout`). Generated text is rendered on use and
//! kept in a cache of fixed size (`cache`); its length, once known, stays in the node.

pub mod build;
pub mod cache;
pub mod dot;
pub mod hist;
pub mod lazy;
pub mod render;
pub mod sharing;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::backend::FloatView;
use crate::catalog::{Catalog, WeightsFile};
use crate::format::layout::{FileIndex, Location, TensorShape};
use crate::format::sharing::TensorId;
use crate::format::target::WeightsView;
use crate::format::{Model, WriteTarget};
use crate::names::NamedViews;

pub use build::{node_count, DEFAULT_MAX_NODES};
pub use cache::{TextCache, TEXT_CACHE_BUDGET};
pub use sharing::{Relation, Shared, SharingIndex};

pub type Ino = u64;
pub const ROOT: Ino = 1;

/// Generated text files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    HeaderJson(FileIndex),
    ProgramJson,
    FlatTensorJson(FileIndex),
    PlanJson(usize),
    Operators(usize),
    Instructions(usize),
    ValueJson(usize, usize),
    DelegateJson(usize, usize),
    NamedDataJson(FileIndex, usize),
    /// `<backend>/header.json` of the decoded payload of delegate (plan, delegate).
    PayloadHeader(usize, usize),
    PayloadGraphJson(usize, usize),
    PayloadGraphTxt(usize, usize),
    /// `<backend>/values/<id>.json` of the value at this position of the payload's values.
    PayloadValueJson(usize, usize, usize),
    /// `sizes.txt` and `sizes.json` at the root: where the bytes go (`crate::sizes`).
    SizesTxt,
    SizesJson,
    /// `plans/<name>/graph.dot` of plan p.
    PlanGraphDot(usize),
    /// `<backend>/graph.dot` of the decoded payload of delegate (plan, delegate).
    PayloadGraphDot(usize, usize),
    /// A `.hist.svg`: always `picture::hist::HIST_SVG_LEN` bytes, so its size is known
    /// before its values are read.
    Hist(HistOf),
    /// `sizes.svg` at the root: where the bytes of the files go.
    SizesSvg,
    /// `names/<name>.json` of name i of the named views (docs/tree.md#named-views).
    NameJson(usize),
}

/// Whose values a `.hist.svg` shows (docs/tree.md#histograms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistOf {
    /// Value i of plan p.
    Value(usize, usize),
    /// Named-data entry k of data file f (a key with a tensor layout).
    Named(FileIndex, usize),
    /// The value at position k of the decoded payload of delegate (plan, delegate).
    Payload(usize, usize, usize),
    /// Name i of the named views, in the checkpoint's layout and dtype.
    Name(usize),
}

/// A file of the named views whose bytes are computed per read (docs/tree.md#named-views).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedFile {
    /// `names/<name>.npy` of name i.
    Npy(usize),
    /// `names.safetensors`.
    Safetensors,
}

#[derive(Debug)]
pub enum Content {
    Dir(Vec<Ino>),
    /// A directory whose contents are built when first used: lazy directory k of the tree
    /// (`lazy`).
    LazyDir(usize),
    /// Bytes of a range of a backing file.
    Range(Location),
    /// A `.npy`: a generated header followed by the bytes of a range.
    Npy {
        header: Vec<u8>,
        location: Location,
    },
    /// A `.npy` of float32 values dequantized, per read, from a constant's bytes and scales.
    FloatView {
        header: Vec<u8>,
        view: Arc<FloatView>,
    },
    /// A `weights.safetensors`: a generated header, then ranges of the model files (the
    /// catalog lists them when first asked).
    Weights {
        view: WeightsView,
    },
    /// A file of the named views, computed per read from the stored tensors.
    Named(NamedFile),
    /// Generated text; its bytes live in the tree's `TextCache`.
    Text {
        kind: TextKind,
        /// The rendered length, or `UNKNOWN_LEN` until it was first rendered or counted.
        len: AtomicU64,
    },
}

/// `Content::Text::len` of a text not rendered yet.
pub const UNKNOWN_LEN: u64 = u64::MAX;

#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub parent: Ino,
    pub content: Content,
    pub write: Option<WriteTarget>,
}

impl Node {
    pub fn is_dir(&self) -> bool {
        matches!(self.content, Content::Dir(_) | Content::LazyDir(_))
    }
}

pub struct Tree {
    /// What the model holds, by name: names, decoded payloads, weights listings.
    pub catalog: Arc<Catalog>,
    /// The catalog's model.
    pub model: Arc<Model>,
    /// The names a map gives the stored tensors (`--names`), resolved against the catalog.
    pub names: Option<Arc<NamedViews>>,
    /// The nodes built with the tree: inodes 1 to `nodes.len()`.
    nodes: Vec<Node>,
    /// The directories built when first used, in inode order, after `nodes`.
    lazy: Vec<lazy::LazyDir>,
    /// Paths that show each shared byte range, for `aliases` and `user.ptefs.shared`; built
    /// on first use.
    sharing: OnceLock<SharingIndex>,
    /// Rendered text, within a budget.
    texts: TextCache,
    /// Where the bytes go, accounted once per snapshot when `sizes.txt` or `sizes.json` is
    /// first read, so both keep one content and length while the snapshot lives.
    sizes: OnceLock<std::result::Result<crate::sizes::Sizes, String>>,
}

impl Tree {
    pub fn node(&self, ino: Ino) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        if let Some(node) = self.nodes.get(i) {
            return Some(node);
        }
        self.lazy_holding(ino)?.node(self, ino)
    }

    /// The lazy directory whose range holds `ino`.
    fn lazy_holding(&self, ino: Ino) -> Option<&lazy::LazyDir> {
        let k = self
            .lazy
            .partition_point(|d| d.first <= ino)
            .checked_sub(1)?;
        self.lazy.get(k).filter(|d| d.holds(ino))
    }

    /// The lazy directory `ino` is, if it is one.
    pub fn lazy_dir(&self, ino: Ino) -> Option<&lazy::LazyDir> {
        match self.node(ino)?.content {
            Content::LazyDir(k) => self.lazy.get(k),
            _ => None,
        }
    }

    /// The listing of directory `ino` in name order (a lazy directory is built for it).
    pub fn children(&self, ino: Ino) -> Option<&[Ino]> {
        match &self.node(ino)?.content {
            Content::Dir(children) => Some(children),
            Content::LazyDir(k) => Some(self.lazy.get(*k)?.children(self)),
            _ => None,
        }
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Option<Ino> {
        let children = self.children(parent)?;
        children
            .binary_search_by(|&c| self.node(c).map_or("", |n| n.name.as_str()).cmp(name))
            .ok()
            .map(|i| children[i])
    }

    /// How many nodes the tree has, built or not.
    pub fn node_count(&self) -> u64 {
        self.nodes.len() as u64 + self.lazy.iter().map(|d| d.count).sum::<u64>()
    }

    /// Every node with its inode, in inode order; every lazy directory is built for it.
    pub fn nodes(&self) -> impl Iterator<Item = (Ino, &Node)> {
        let eager = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i as Ino + 1, n));
        eager.chain(self.lazy.iter().flat_map(move |d| {
            d.children(self);
            d.built()
        }))
    }

    /// The nodes built so far with their inodes, in inode order: the only ones the kernel
    /// can have been told of.
    pub fn built_nodes(&self) -> impl Iterator<Item = (Ino, &Node)> {
        let eager = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i as Ino + 1, n));
        eager.chain(self.lazy.iter().flat_map(|d| d.built()))
    }

    /// Builds every lazy directory `old` built whose range this tree gives the same
    /// directory: the kernel may hold their inodes, and what invalidates a snapshot's inodes
    /// covers only the nodes it built. (A directory whose range moved is another shape, and
    /// replacing a tree of another shape invalidates everything `old` built.)
    pub fn adopt_built(&self, old: &Tree) {
        for (x, y) in old.lazy.iter().zip(&self.lazy) {
            if x.is_built()
                && (x.dir, x.first, x.count, x.kind) == (y.dir, y.first, y.count, y.kind)
            {
                y.children(self);
            }
        }
    }

    /// `(parent, name)` of every built node but the root: the names the kernel may hold.
    pub fn built_entries(&self) -> Vec<(Ino, String)> {
        self.built_nodes()
            .skip(1)
            .map(|(_, n)| (n.parent, n.name.clone()))
            .collect()
    }

    /// Whether `other` gives every inode number `self` has shown the same name, parent and
    /// kind (lazy directories `self` never built have shown nothing; the same ranges are
    /// enough for them).
    pub fn same_shape(&self, other: &Tree) -> bool {
        let same = |x: &Node, y: &Node| {
            x.parent == y.parent && x.is_dir() == y.is_dir() && x.name == y.name
        };
        self.nodes.len() == other.nodes.len()
            && self.nodes.iter().zip(&other.nodes).all(|(x, y)| same(x, y))
            && self.lazy.len() == other.lazy.len()
            && self.lazy.iter().zip(&other.lazy).all(|(x, y)| {
                (x.dir, x.first, x.count, x.kind) == (y.dir, y.first, y.count, y.kind)
                    && (!x.is_built() || {
                        y.children(other);
                        // A directory shown empty (contents that missed their count) is
                        // another shape.
                        y.built().count() as u64 == y.count
                            && x.built().zip(y.built()).all(|((_, a), (_, b))| same(a, b))
                    })
            })
    }

    /// The inodes of `built_nodes`.
    pub fn built_inodes(&self) -> Vec<Ino> {
        self.built_nodes().map(|(ino, _)| ino).collect()
    }

    /// Finds a slash-separated path from the root ("" or "/" is the root).
    pub fn find(&self, path: &str) -> Option<Ino> {
        let mut ino = ROOT;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            ino = self.lookup(ino, part)?;
        }
        Some(ino)
    }

    /// The path of a node from the root, without a leading slash.
    pub fn path(&self, ino: Ino) -> String {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let Some(node) = self.node(cur) else { break };
            parts.push(node.name.as_str());
            cur = node.parent;
        }
        parts.reverse();
        parts.join("/")
    }

    /// The byte ranges of the model files that node `ino`'s content is read from (what a
    /// commit that changes them makes stale). A `weights.safetensors` nobody listed yet has
    /// shown nothing that could be stale.
    pub fn reads(&self, ino: Ino) -> Vec<Location> {
        match self.node(ino).map(|n| &n.content) {
            Some(Content::Range(l) | Content::Npy { location: l, .. }) => vec![*l],
            Some(Content::FloatView { view, .. }) => view.sources().collect(),
            Some(Content::Weights { view }) => self
                .catalog
                .weights_if_listed(*view)
                .map(|w| w.entries.iter().map(|e| e.location).collect())
                .unwrap_or_default(),
            Some(Content::Text {
                kind: TextKind::Hist(of),
                ..
            }) => hist::sources(self, *of),
            Some(Content::Named(f)) => match (&self.names, f) {
                (Some(v), NamedFile::Npy(i)) => v.sources(*i),
                (Some(v), NamedFile::Safetensors) => v.all_sources(),
                (None, _) => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// Bytes `[offset, offset + size)` of a file of the named views, computed from the
    /// stored tensors.
    pub fn named_read(
        &self, f: NamedFile, offset: u64, size: u32,
    ) -> crate::error::Result<Vec<u8>> {
        let views = self.names.as_ref().ok_or_else(|| {
            crate::error::Error::not_found("this tree has no named views".to_string())
        })?;
        match f {
            NamedFile::Npy(i) => views.npy_read(&self.model, i, offset, size),
            NamedFile::Safetensors => views.safetensors_read(&self.model, offset, size),
        }
    }

    /// The checkpoint name of the tensor a value's or a named-data entry's `.json` (`ino`)
    /// describes, when a map names it: by tree path, or by the named-data key of its bytes.
    pub fn checkpoint_name(&self, ino: Ino, key: Option<(FileIndex, &str)>) -> Option<&str> {
        let views = self.names.as_deref()?;
        if let Some(n) = views.name_at(&self.sharer_path(ino)) {
            return Some(n);
        }
        key.and_then(|(f, k)| views.name_of_key(f, k))
    }

    /// The `weights.safetensors` `view` shows, listed on the first call.
    pub fn weights(&self, view: WeightsView) -> &WeightsFile {
        self.catalog.weights(view)
    }

    /// The model file whose tree `ino` is in: an attached file's nodes are under
    /// `data/<name>/`, every other node is the first file's.
    pub fn file_of(&self, ino: Ino) -> FileIndex {
        if self.model.files.len() < 2 {
            return 0;
        }
        let Some(data) = self.lookup(ROOT, "data") else {
            return 0;
        };
        let mut cur = ino;
        while cur != ROOT {
            let Some(node) = self.node(cur) else { break };
            if node.parent == data {
                return self
                    .catalog
                    .names
                    .data
                    .iter()
                    .position(|n| *n == node.name)
                    .map_or(0, |k| k + 1);
            }
            cur = node.parent;
        }
        0
    }

    /// The model files whose bytes reading `ino` shows (its own file's first).
    pub fn files_read(&self, ino: Ino) -> Vec<FileIndex> {
        let mut files = vec![self.file_of(ino)];
        files.extend(self.reads(ino).iter().map(|l| l.file));
        dedup(files)
    }

    /// The model files a commit of new content for `ino` may change.
    pub fn files_written(&self, ino: Ino) -> Vec<FileIndex> {
        let Some(node) = self.node(ino) else {
            return Vec::new();
        };
        let mut files: Vec<FileIndex> = self.reads(ino).iter().map(|l| l.file).collect();
        match &node.write {
            // A name may be stored in any file (tied tensors, re-quantized constants).
            Some(
                WriteTarget::Weights {
                    view: WeightsView::Root,
                }
                | WriteTarget::NameNpy { .. }
                | WriteTarget::NamesSafetensors,
            ) => files.extend(0..self.model.files.len()),
            Some(target) => files.extend(target.files()),
            None => {}
        }
        dedup(files)
    }

    /// Which paths show the same bytes (docs/tree.md#shared-bytes), indexed on first use.
    pub fn sharing(&self) -> &SharingIndex {
        self.sharing.get_or_init(|| SharingIndex::build(self))
    }

    /// The tree path a sharer stands for: its `.json`'s path without the extension
    /// (`plans/forward/values/3`, `data/w/named_data/lin.weight`).
    pub fn sharer_path(&self, json: Ino) -> String {
        let mut path = self.path(json);
        if path.ends_with(".json") {
            path.truncate(path.len() - ".json".len());
        }
        path
    }

    /// The tree path of tensor `id` (`plans/forward/values/3`, `data/w/named_data/lin.weight`),
    /// from the catalog's names, without building its directory.
    pub fn tensor_path(&self, id: TensorId) -> String {
        let names = &self.catalog.names;
        match id {
            TensorId::Value { plan, index } => {
                let plan = names.plans.get(plan as usize).map_or("", String::as_str);
                format!("plans/{plan}/values/{index}")
            }
            TensorId::Key { file, index } => {
                let key = names
                    .named_data
                    .get(file as usize)
                    .and_then(|k| k.get(index as usize))
                    .map_or("", String::as_str);
                match file.checked_sub(1).and_then(|d| names.data.get(d as usize)) {
                    Some(stem) => format!("data/{stem}/named_data/{key}"),
                    None => format!("named_data/{key}"),
                }
            }
        }
    }

    /// The tensor a value's or a named-data entry's `.json` (`json`) describes.
    pub fn tensor_of_json(&self, json: Ino) -> Option<TensorId> {
        match self.node(json)?.content {
            Content::Text { kind, .. } => sharing::tensor_of(kind),
            _ => None,
        }
    }

    /// The `.json` of a `.bin` or `.npy` of a value or a named-data entry: the sibling with
    /// the same base name.
    fn json_of(&self, ino: Ino) -> Option<Ino> {
        let node = self.node(ino)?;
        let base = node
            .name
            .strip_suffix(".bin")
            .or_else(|| node.name.strip_suffix(".npy"))?;
        let mut name = String::with_capacity(base.len() + 5);
        name.push_str(base);
        name.push_str(".json");
        let json = self.lookup(node.parent, &name)?;
        match &self.node(json)?.content {
            Content::Text {
                kind: TextKind::ValueJson(..) | TextKind::NamedDataJson(..),
                ..
            } => Some(json),
            _ => None,
        }
    }

    /// What shares the bytes of a `.bin` or `.npy` file (empty when nothing does).
    pub fn shared(&self, ino: Ino) -> Shared {
        let location = match self.node(ino).map(|n| &n.content) {
            Some(Content::Range(l) | Content::Npy { location: l, .. }) => *l,
            _ => return Shared::default(),
        };
        match self.json_of(ino).and_then(|json| self.tensor_of_json(json)) {
            Some(id) => self.sharing().others(&location, id),
            None => Shared::default(),
        }
    }

    /// Where the bytes go (`sizes.txt`), accounted on the first call.
    pub fn sizes(&self) -> &std::result::Result<crate::sizes::Sizes, String> {
        self.sizes.get_or_init(|| {
            crate::sizes::Sizes::of(&self.catalog).map_err(|e| e.message().to_string())
        })
    }

    /// The rendered-text cache (tests look at what it holds).
    pub fn text_cache(&self) -> &TextCache {
        &self.texts
    }

    /// Replaces the text cache by an empty one of `budget` bytes (the default is
    /// `TEXT_CACHE_BUDGET`).
    pub fn set_text_budget(&mut self, budget: usize) {
        self.texts = TextCache::new(budget);
    }

    /// The bytes of a generated text file: from the cache, else rendered (and cached); None
    /// for a node that is not text, or a picture whose values cannot be read.
    pub fn text(&self, ino: Ino) -> Option<Arc<[u8]>> {
        self.try_text(ino).ok()
    }

    /// The bytes of a generated text file, or why they cannot be made: a histogram whose
    /// values cannot be read fails (EIO), and the failure is not cached.
    pub fn try_text(&self, ino: Ino) -> crate::error::Result<Arc<[u8]>> {
        let Some(Content::Text { kind, len }) = self.node(ino).map(|n| &n.content) else {
            return Err(crate::error::Error::not_found(format!(
                "inode {ino} is not a generated file"
            )));
        };
        if let TextKind::Hist(of) = kind {
            return self
                .texts
                .try_get_or_render(ino, || hist::render(self, ino, *of).map(Into::into));
        }
        let text = self.texts.get_or_render(ino, || {
            let known = len.load(Ordering::Relaxed);
            if known != UNKNOWN_LEN {
                self.render_exact(ino, *kind, known)
            } else if render::may_be_large(*kind) {
                let n = self.count(ino, *kind);
                self.render_exact(ino, *kind, n)
            } else {
                self.render_string(ino, *kind)
            }
        });
        len.store(text.len() as u64, Ordering::Relaxed);
        Ok(text)
    }

    /// Bytes `[offset, offset + size)` of a generated text file (clamped to its end), as a
    /// buffer and the range of it that holds them: a slice of the whole text, cached as
    /// `text` caches it, or, for a text too large for the cache that renders by windows
    /// (docs/tree.md#size-limits), the window alone, rendered from the text's marks.
    pub fn text_window(
        &self, ino: Ino, offset: u64, size: u32,
    ) -> crate::error::Result<(Arc<[u8]>, usize, usize)> {
        let Some(Content::Text { kind, len }) = self.node(ino).map(|n| &n.content) else {
            return Err(crate::error::Error::not_found(format!(
                "inode {ino} is not a generated file"
            )));
        };
        let budget = self.texts.budget() as u64;
        let known = len.load(Ordering::Relaxed);
        if render::windowed(*kind) && (known == UNKNOWN_LEN || known > budget) {
            if let Some(marked) = self.marked(ino, *kind, len).filter(|m| m.len > budget) {
                let bytes = render::render_window(self, *kind, &marked, offset, size);
                let n = bytes.len();
                return Ok((bytes.into(), 0, n));
            }
        }
        let text = self.try_text(ino)?;
        let start = offset.min(text.len() as u64) as usize;
        let end = offset
            .saturating_add(u64::from(size))
            .min(text.len() as u64) as usize;
        Ok((text, start, end))
    }

    /// The length and marks of a text of a `render::windowed` kind: kept in the cache, or
    /// counted (and then kept when the text is too large for the cache). Its length is
    /// stored in the node.
    fn marked(&self, ino: Ino, kind: TextKind, len: &AtomicU64) -> Option<Arc<render::Marked>> {
        if let Some(m) = self.texts.marked(ino) {
            return Some(m);
        }
        let marked = Arc::new(render::count_marked(self, kind)?);
        len.store(marked.len, Ordering::Relaxed);
        if marked.len > self.texts.budget() as u64 {
            self.texts.keep_marked(ino, marked.clone());
        }
        Some(marked)
    }

    fn render_string(&self, ino: Ino, kind: TextKind) -> Arc<[u8]> {
        render::render_to_vec(self, ino, kind).into()
    }

    /// The length of a text, rendered into a counter.
    fn count(&self, ino: Ino, kind: TextKind) -> u64 {
        let mut counter = Counter(0);
        render::render(self, ino, kind, &mut counter).expect("a counter takes any text");
        counter.0
    }

    /// Renders a text of known length straight into a buffer of that length, so a large text
    /// is in memory once, not once growing and once copied.
    fn render_exact(&self, ino: Ino, kind: TextKind, len: u64) -> Arc<[u8]> {
        let Ok(n) = usize::try_from(len) else {
            return self.render_string(ino, kind);
        };
        let mut buf = Arc::<[u8]>::new_uninit_slice(n);
        let slot = Arc::get_mut(&mut buf).expect("a new Arc is unique");
        let mut out = SliceWriter { buf: slot, at: 0 };
        if render::render(self, ino, kind, &mut out).is_ok() && out.at == n {
            // SAFETY: `SliceWriter` wrote `at == n` bytes from the start, all of the slice.
            unsafe { buf.assume_init() }
        } else {
            // Rendering is deterministic, so this is not expected; stay correct anyway.
            self.render_string(ino, kind)
        }
    }

    /// The `user.ptefs.*` attributes of a file, in listing order
    /// (docs/tree.md#extended-attributes): where its bytes are, and for `.bin`/`.npy` files
    /// their type and shape.
    pub fn xattrs(&self, ino: Ino) -> Vec<(String, String)> {
        let mut x = self.location_xattrs(ino);
        if !x.is_empty() {
            let shared = self.shared(ino);
            if shared.total > 0 {
                x.push(("user.ptefs.shared".to_string(), self.shared_xattr(&shared)));
            }
        }
        x
    }

    /// `user.ptefs.shared`: `<relation>:<path>` for each listed sharer, comma-separated, then
    /// ` (+N more)` when some were not listed. In the paths, `,`, space and control
    /// characters are percent-encoded (`%2C`, `%20`, `%0A`); tree names never hold these
    /// escapes otherwise (a `%` of a key is always `%25`), so the value splits unambiguously
    /// on `,` and on its last space.
    fn shared_xattr(&self, shared: &Shared) -> String {
        let mut out = String::new();
        for (k, (s, relation)) in shared.listed.iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            out.push_str(relation.as_str());
            out.push(':');
            for c in self.tensor_path(s.id).chars() {
                match c {
                    ',' | ' ' | '\u{0}'..='\u{1f}' | '\u{7f}' => {
                        out.push_str(&format!("%{:02X}", c as u32))
                    }
                    c => out.push(c),
                }
            }
        }
        let more = shared.total - shared.listed.len();
        if more > 0 {
            out.push_str(&format!(" (+{more} more)"));
        }
        out
    }

    fn location_xattrs(&self, ino: Ino) -> Vec<(String, String)> {
        let Some(node) = self.node(ino) else {
            return Vec::new();
        };
        let location = match &node.content {
            Content::Range(l) | Content::Npy { location: l, .. } => *l,
            Content::FloatView { view, .. } => {
                // The float32 view of a constant: where the constant's bytes are.
                let dims: Vec<String> = view.layout.shape().iter().map(u64::to_string).collect();
                let order: Vec<String> = (0..dims.len()).map(|d| d.to_string()).collect();
                return vec![
                    ("user.ptefs.dtype".to_string(), "fp32".to_string()),
                    (
                        "user.ptefs.shape".to_string(),
                        format!("[{}]", dims.join(",")),
                    ),
                    (
                        "user.ptefs.dim_order".to_string(),
                        format!("[{}]", order.join(",")),
                    ),
                    (
                        "user.ptefs.file".to_string(),
                        self.model.files[view.data.file].path.display().to_string(),
                    ),
                    (
                        "user.ptefs.offset".to_string(),
                        view.data.range.start().to_string(),
                    ),
                ];
            }
            _ => return Vec::new(),
        };
        let blob = |len: u64| TensorShape {
            scalar_type: 0,
            sizes: vec![i32::try_from(len).unwrap_or(-1)],
            dim_order: vec![0],
        };
        let shape = match &node.write {
            Some(WriteTarget::TensorBin { shape, .. } | WriteTarget::TensorNpy { shape, .. }) => {
                Some(shape.clone())
            }
            Some(
                WriteTarget::PayloadConstant { what, .. }
                | WriteTarget::PayloadConstantNpy { what, .. },
            ) => {
                // "qbint4[64,64]": the payload's own datatype and dims.
                let (dtype, dims) = what.split_once('[').unwrap_or((what, "]"));
                let rank = dims
                    .trim_end_matches(']')
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .count();
                let order: Vec<String> = (0..rank).map(|d| d.to_string()).collect();
                return vec![
                    ("user.ptefs.dtype".to_string(), dtype.to_string()),
                    ("user.ptefs.shape".to_string(), format!("[{dims}")),
                    (
                        "user.ptefs.dim_order".to_string(),
                        format!("[{}]", order.join(",")),
                    ),
                    (
                        "user.ptefs.file".to_string(),
                        self.model.files[location.file].path.display().to_string(),
                    ),
                    (
                        "user.ptefs.offset".to_string(),
                        location.range.start().to_string(),
                    ),
                ];
            }
            Some(WriteTarget::Blob { .. } | WriteTarget::DelegatePayload { .. }) => {
                Some(Arc::new(blob(location.range.len())))
            }
            _ => None,
        };
        let mut x = Vec::new();
        if let Some(shape) = shape {
            let list = |v: &[i64]| {
                format!(
                    "[{}]",
                    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
                )
            };
            x.push((
                "user.ptefs.dtype".to_string(),
                crate::format::scalar_type::display(shape.scalar_type),
            ));
            let sizes: Vec<i64> = shape.sizes.iter().map(|&s| s as i64).collect();
            let order: Vec<i64> = shape.dim_order.iter().map(|&d| d as i64).collect();
            x.push(("user.ptefs.shape".to_string(), list(&sizes)));
            x.push(("user.ptefs.dim_order".to_string(), list(&order)));
        }
        x.push((
            "user.ptefs.file".to_string(),
            self.model.files[location.file].path.display().to_string(),
        ));
        x.push((
            "user.ptefs.offset".to_string(),
            location.range.start().to_string(),
        ));
        x
    }

    /// Exact size of a file (0 for directories).
    pub fn size(&self, ino: Ino) -> u64 {
        match self.node(ino).map(|n| &n.content) {
            Some(Content::Range(loc)) => loc.range.len(),
            Some(Content::Npy { header, location }) => header.len() as u64 + location.range.len(),
            Some(Content::FloatView { header, view }) => {
                header.len() as u64 + view.layout.numel() * 4
            }
            Some(Content::Weights { view }) => self.weights(*view).len,
            Some(Content::Named(f)) => match (&self.names, f) {
                (Some(v), NamedFile::Npy(i)) => v
                    .names
                    .get(*i)
                    .and_then(|n| n.shown.as_ref())
                    .map_or(0, |s| s.npy_len()),
                (Some(v), NamedFile::Safetensors) => v.st_len,
                (None, _) => 0,
            },
            Some(Content::Text { kind, len }) => {
                let known = len.load(Ordering::Relaxed);
                if let TextKind::Hist(_) = kind {
                    crate::picture::hist::HIST_SVG_LEN as u64
                } else if known != UNKNOWN_LEN {
                    known
                } else if render::may_be_large(*kind) {
                    // Counted, not kept: `stat` of a large text must not hold it in memory
                    // (the marks of one read by windows are kept, for the reads to come).
                    if let Some(m) = self.marked(ino, *kind, len) {
                        return m.len;
                    }
                    let n = self.count(ino, *kind);
                    len.store(n, Ordering::Relaxed);
                    n
                } else {
                    self.text(ino).map_or(0, |t| t.len() as u64)
                }
            }
            _ => 0,
        }
    }
}

/// Counts what is written.
struct Counter(u64);

impl std::fmt::Write for Counter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len() as u64;
        Ok(())
    }
}

/// Writes into a slice of known length; fails rather than overflow it.
struct SliceWriter<'a> {
    buf: &'a mut [std::mem::MaybeUninit<u8>],
    at: usize,
}

impl std::fmt::Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.at.checked_add(s.len()).ok_or(std::fmt::Error)?;
        let dst = self.buf.get_mut(self.at..end).ok_or(std::fmt::Error)?;
        for (d, &b) in dst.iter_mut().zip(s.as_bytes()) {
            d.write(b);
        }
        self.at = end;
        Ok(())
    }
}

/// `files` without repeats, in first-seen order.
fn dedup(files: Vec<FileIndex>) -> Vec<FileIndex> {
    let mut seen = Vec::with_capacity(files.len());
    for f in files {
        if !seen.contains(&f) {
            seen.push(f);
        }
    }
    seen
}
