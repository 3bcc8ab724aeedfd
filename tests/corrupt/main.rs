//! Corrupted fixtures must never crash ptefs: a deterministic corpus (truncations, byte
//! flips, absurd header fields, out-of-range offsets, sizes and indices) goes through parsing,
//! tree building, rendering of every text, reading of every file and `check`, and a sample of
//! it through the `ptefs` binary, offline and mounted for real (which needs `/dev/fuse` and
//! the right to mount; see `common::fuse_missing`). Every refusal
//! carries a message naming the problem.
//!
//! Also: a model file truncated on disk while open gives EIO, never SIGBUS; inputs that once
//! took quadratic time or memory stay fast. `PTEFS_CORRUPT_VERBOSE=1` prints every case, its
//! time and outcome (run with `--nocapture`).
//!
//! - `cases`: the corpus, case by case, from every fixture;
//! - `edits`: the table of structured edits of the flatbuffers, and which `check` must flag;
//! - `mutate`: reading a fixture's regions and tables, and rebuilding a file around them;
//! - `drivers`: the corpus through the core, from disk, and through the binary's commands;
//! - `mounted`: a sample of the corpus mounted for real;
//! - `payloads`: XNNPACK payloads corrupted inside their segments (also in the corpus);
//! - `live`: files truncated while open;
//! - `limits`: inputs that once took quadratic time or memory.

#[path = "../common/mod.rs"]
mod common;

/// A generated table with some fields set (the generated structs are non-exhaustive).
macro_rules! mk {
    ($t:path { $($f:ident : $v:expr),* $(,)? }) => {{
        let mut x = <$t>::default();
        $(x.$f = $v;)*
        x
    }};
}

mod cases;
mod drivers;
mod edits;
mod limits;
mod live;
mod mounted;
mod mutate;
mod payloads;
