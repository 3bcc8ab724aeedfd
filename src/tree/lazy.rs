//! Directories whose contents are built when first used: the per-value and per-entry
//! directories (`plans/<name>/values/`, `named_data/`, a payload's `values/`, `names/`),
//! which hold nearly every node of a large model. A mount answers before they exist and
//! builds each one when it is first listed or looked into (docs/architecture.md#a-read,
//! docs/tree.md#size-limits).
//!
//! Invariants: the eager build counts each lazy directory's nodes from the model's tables
//! (the same predicates the contents are built with) and gives it the inode range
//! `[first, first + count)` after every eager node, in declaration order; so inode numbers
//! do not depend on what was listed first, and the same files always get the same numbers.
//! Contents are built once per snapshot (`OnceLock`), and a directory whose contents would
//! not fill its range exactly shows as empty, with an error in the log, rather than give
//! one node two numbers.

use std::sync::OnceLock;

use super::{Ino, Node, Tree};
use crate::format::layout::FileIndex;

/// What a lazy directory shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LazyKind {
    /// `plans/<name>/values/` of plan p.
    Values(usize),
    /// `named_data/` of the program.
    PteNamedData,
    /// `named_data/` of data file f.
    PtdNamedData(FileIndex),
    /// `delegates/<j>/<backend>/values/` of the decoded payload of delegate (p, j).
    PayloadValues(usize, usize),
    /// `names/` of the named views.
    Names,
}

/// The nodes of a lazy directory and its listing in name order.
#[derive(Debug)]
struct Contents {
    nodes: Vec<Node>,
    children: Vec<Ino>,
}

#[derive(Debug)]
pub struct LazyDir {
    /// The directory's own inode (an eager node).
    pub dir: Ino,
    /// The inode of its first node.
    pub first: Ino,
    /// How many nodes it holds.
    pub count: u64,
    /// Whether any of them takes writes (a directory's mode shows it before it is built).
    pub writable: bool,
    pub kind: LazyKind,
    contents: OnceLock<Contents>,
}

impl LazyDir {
    pub fn new(dir: Ino, first: Ino, count: u64, writable: bool, kind: LazyKind) -> LazyDir {
        LazyDir {
            dir,
            first,
            count,
            writable,
            kind,
            contents: OnceLock::new(),
        }
    }

    /// Whether inode `ino` is in this directory's range.
    pub fn holds(&self, ino: Ino) -> bool {
        ino >= self.first && ino - self.first < self.count
    }

    /// Whether the contents were built.
    pub fn is_built(&self) -> bool {
        self.contents.get().is_some()
    }

    fn contents(&self, tree: &Tree) -> &Contents {
        self.contents.get_or_init(|| {
            let (nodes, children) = tree.fill_lazy(self);
            if nodes.len() as u64 == self.count {
                Contents { nodes, children }
            } else {
                log::error!(
                    "{}: built {} nodes where {} were counted; shown empty",
                    tree.path(self.dir),
                    nodes.len(),
                    self.count
                );
                Contents {
                    nodes: Vec::new(),
                    children: Vec::new(),
                }
            }
        })
    }

    /// The node of inode `ino` (in this directory's range), building the contents.
    pub fn node<'a>(&'a self, tree: &'a Tree, ino: Ino) -> Option<&'a Node> {
        let i = usize::try_from(ino.checked_sub(self.first)?).ok()?;
        self.contents(tree).nodes.get(i)
    }

    /// The listing in name order, building the contents.
    pub fn children<'a>(&'a self, tree: &'a Tree) -> &'a [Ino] {
        &self.contents(tree).children
    }

    /// The nodes built so far, with their inodes (none before the first use).
    pub fn built(&self) -> impl Iterator<Item = (Ino, &Node)> {
        let first = self.first;
        self.contents.get().into_iter().flat_map(move |c| {
            c.nodes
                .iter()
                .enumerate()
                .map(move |(i, n)| (first + i as Ino, n))
        })
    }
}
