//! ptefs: ExecuTorch `.pte` / `.ptd` files as a directory tree.
//!
//! `format` reads and writes the files, `tree` turns a parsed file into the virtual tree of
//! docs/tree.md, `fs` answers filesystem operations on that tree without FUSE, and `fuse` is
//! the thin adapter that translates kernel requests into `fs` calls.

// The generated FlatBuffers code names `alloc::` paths.
extern crate alloc;

pub mod backend;
pub mod catalog;
pub mod check;
pub mod commands;
pub mod compare;
pub mod content;
pub mod daemon;
pub mod edit;
pub mod error;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod guard;
pub mod host;
pub mod names;
pub mod picture;
pub mod quote;
pub mod sizes;
pub mod source;
pub mod tree;
