//! Reading ExecuTorch files: the `.pte` program container and the `.ptd` FlatTensor container.
//!
//! Invariants: nothing in this module trusts a number read from a file. Every offset and size
//! goes through [`range::checked_range`] before it is used to index bytes, the FlatBuffers
//! verifier runs before any table is read, and a malformed file yields a [`FormatError`] that
//! names what was wrong, where, and what was expected. No FUSE here.

pub mod error;
#[allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    deprecated,
    mismatched_lifetime_syntaxes,
    non_camel_case_types,
    non_snake_case,
    unsafe_op_in_unsafe_fn,
    unused_imports
)]
#[rustfmt::skip]
pub mod generated;
pub mod header;
pub mod layout;
pub mod model;
pub mod npy;
pub mod ptd;
pub mod pte;
pub mod range;
pub mod safetensors;
pub mod scalar_type;
pub mod sharing;
pub mod target;
pub mod writer;

pub use error::FormatError;
pub use model::{Kind, Model, ModelFile};
pub use target::WriteTarget;
