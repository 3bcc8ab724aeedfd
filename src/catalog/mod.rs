//! What an opened model holds, by name: the names of its parts, its decoded delegate
//! payloads, and the tensors each file's `weights.safetensors` lists. The tree shows these;
//! commits, `check`, `info` and `apply` use them without building a tree.
//!
//! Invariants: a `Catalog` describes exactly one opened `Model` (the one it holds) and is
//! rebuilt with it after a commit that re-lays a file out or changes a decoded payload;
//! payloads are decoded once per catalog; each file's listing is made at most once, when
//! first asked for.

pub mod names;
pub mod payloads;
pub mod sizes;
pub mod weights;

use std::sync::{Arc, OnceLock};

use crate::format::layout::FileIndex;
use crate::format::Model;

pub use names::Names;
pub use payloads::{Decoded, KeyUse, Payloads};
pub use weights::{Piece, WeightsFile};

pub struct Catalog {
    pub model: Arc<Model>,
    /// Directory and file names of the model's parts.
    pub names: Names,
    /// The decoded delegate payloads.
    pub payloads: Payloads,
    /// Per file, its `weights.safetensors` listing, once asked for.
    weights: Vec<OnceLock<WeightsFile>>,
}

impl Catalog {
    /// The catalog of `model`: its names, and its payloads decoded.
    pub fn of(model: Arc<Model>) -> Catalog {
        let payloads = Payloads::decode(&model);
        Catalog::with_payloads(model, payloads)
    }

    /// The catalog of `model`, whose payloads were decoded already.
    pub fn with_payloads(model: Arc<Model>, payloads: Payloads) -> Catalog {
        Catalog {
            names: Names::of(&model),
            weights: (0..model.files.len()).map(|_| OnceLock::new()).collect(),
            payloads,
            model,
        }
    }

    /// The `weights.safetensors` of file `file`, listed on the first call: listing every
    /// tensor of a large model costs more than building the rest of its tree, and most
    /// mounts never open the file.
    pub fn weights(&self, file: FileIndex) -> &WeightsFile {
        self.weights[file]
            .get_or_init(|| WeightsFile::of(&self.model, &self.names, &self.payloads, file))
    }

    /// The listing of file `file` if something asked for it. A listing nobody asked for has
    /// never shown its size or bytes, so nothing cached from it can be stale.
    pub fn weights_if_listed(&self, file: FileIndex) -> Option<&WeightsFile> {
        self.weights.get(file)?.get()
    }
}
