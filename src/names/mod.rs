//! Names: every tensor a model stores, named as the checkpoint it was exported from names
//! it, learned from that checkpoint by content (docs/names.md).
//!
//! - `checkpoint`: the checkpoints read (safetensors, sharded, PEFT adapters).
//! - `stored`: the tensors a model stores, with the tree path that shows each and its
//!   float32 values and quantization steps.
//! - `transform`: how a checkpoint tensor's elements are laid out where they are stored.
//! - `matching`: learning, sampled then confirmed, never guessing.
//! - `map`: the name map (`ptefs names -o`), its JSON, and the digests that tie it to the
//!   files it was learned on.
//! - `report`: the human-readable report of a map.
//! - `given`: what `--names` gives a command: a map checked against the files, or a
//!   checkpoint learned from.
//! - `view`: a map resolved against a model: each name read back in the checkpoint's
//!   layout and dtype (the mount's `names/`, `ptefs diff --names`).
//! - `update`: updates by checkpoint name, as items of one bulk update.
//!
//! Invariants: nothing here writes a model file or loads a whole one into memory; what is
//! read is bounded by the largest tensor (a fixed sample per stored tensor, windows of
//! elements); a name is given only to a stored tensor no other name matches within noise.

pub mod checkpoint;
pub mod elem;
pub mod given;
pub mod map;
pub mod matching;
pub mod report;
pub mod stored;
pub mod transform;
pub mod update;
pub mod view;

pub use checkpoint::{Adapter, Checkpoint};
pub use map::NameMap;
pub use matching::{learn, Learned, Match, NameResult, Outcome, Quality};
pub use stored::{stored_tensors, Stored, Values};
pub use transform::{Direction, IndexMap, Transform};
pub use view::NamedViews;
