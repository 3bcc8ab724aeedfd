//! The virtual tree of DESIGN.md §2, built from parsed files.
//!
//! Invariants: inode numbers are positions in `nodes` plus one (the root is 1), assigned in
//! a deterministic walk of the file, so the same file always gets the same numbers; every
//! directory's children are sorted by name and unique; every byte range a node points at lies
//! inside its file (it came from `format::layout`). Generated text is rendered once, on first
//! use, and cached.

pub mod build;
pub mod names;
pub mod render;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::format::layout::{FileIndex, Location, TensorShape};
use crate::format::{Model, WriteTarget};

pub use names::Names;

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
}

#[derive(Debug)]
pub enum Content {
    Dir(Vec<Ino>),
    /// Bytes of a range of a backing file.
    Range(Location),
    /// A `.npy`: a generated header followed by the bytes of a range.
    Npy {
        header: Vec<u8>,
        location: Location,
    },
    Text {
        kind: TextKind,
        rendered: OnceLock<Arc<[u8]>>,
    },
}

#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub parent: Ino,
    pub content: Content,
    pub write: Option<WriteTarget>,
}

impl Node {
    pub fn is_dir(&self) -> bool {
        matches!(self.content, Content::Dir(_))
    }
}

pub struct Tree {
    pub model: Arc<Model>,
    pub nodes: Vec<Node>,
    /// Directory and file names of the model's parts.
    pub names: Names,
    /// Paths that show each tensor byte range, for `aliases` in the JSON; built on first use.
    aliases: OnceLock<HashMap<Location, Vec<String>>>,
}

impl Tree {
    pub fn node(&self, ino: Ino) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(i)
    }

    pub fn children(&self, ino: Ino) -> Option<&[Ino]> {
        match &self.node(ino)?.content {
            Content::Dir(children) => Some(children),
            _ => None,
        }
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Option<Ino> {
        let children = self.children(parent)?;
        children
            .binary_search_by(|&c| self.nodes[(c - 1) as usize].name.as_str().cmp(name))
            .ok()
            .map(|i| children[i])
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

    /// Paths that show each byte range, for the `aliases` of the JSON files.
    pub fn aliases(&self) -> &HashMap<Location, Vec<String>> {
        self.aliases
            .get_or_init(|| build::collect_aliases(&self.model, &self.names))
    }

    /// The bytes of a generated text file, rendered on first use.
    pub fn text(&self, ino: Ino) -> Option<Arc<[u8]>> {
        match &self.node(ino)?.content {
            Content::Text { kind, rendered } => Some(
                rendered
                    .get_or_init(|| render::render(self, *kind).into())
                    .clone(),
            ),
            _ => None,
        }
    }

    /// The `user.ptefs.*` attributes of a file, in listing order (DESIGN.md §2.6): where its
    /// bytes are, and for `.bin`/`.npy` files their type and shape.
    pub fn xattrs(&self, ino: Ino) -> Vec<(String, String)> {
        let Some(node) = self.node(ino) else {
            return Vec::new();
        };
        let location = match &node.content {
            Content::Range(l) | Content::Npy { location: l, .. } => *l,
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
            Some(Content::Text { .. }) => self.text(ino).map_or(0, |t| t.len() as u64),
            _ => 0,
        }
    }
}
