//! What `--names` gives a command that reads a model (`mount`, `ls`, `cat`, `diff`): a name
//! map made by `ptefs names`, or a checkpoint to learn one from (docs/names.md#using-names).
//!
//! Invariants: a map is used only when its files are, byte for byte, the model's
//! (`NameMap::check_files`) and its targets are stored tensors there; a checkpoint is learned
//! from as `ptefs names --from` learns, and a learning that names nothing is refused.

use std::io::Read;
use std::path::Path;

use super::checkpoint::Checkpoint;
use super::map::{NameMap, FORMAT};
use super::matching::learn;
use super::report;
use super::stored::stored_tensors;
use crate::catalog::Catalog;
use crate::error::{Error, Result};

/// Whether `path` is a name map: a regular file whose JSON says `"format": "ptefs-names"`
/// early on (maps are written with it first). Anything else is a checkpoint.
pub fn is_map(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut head = Vec::new();
    if file.take(4096).read_to_end(&mut head).is_err() {
        return false;
    }
    let text = String::from_utf8_lossy(&head);
    text.trim_start().starts_with('{') && text.contains(&format!("\"{FORMAT}\""))
}

/// The map `path` gives for `catalog`'s model: a map, checked against the files; or one
/// learned from a checkpoint, whose report lines go to `say`.
pub fn map_for(path: &Path, catalog: &Catalog, say: &mut dyn FnMut(&str)) -> Result<NameMap> {
    let model = &*catalog.model;
    if is_map(path) {
        let map = NameMap::read(path)?;
        map.check_files(model)?;
        map.check_targets(&stored_tensors(catalog))
            .map_err(|e| e.context(path.display()))?;
        return Ok(map);
    }
    let checkpoint = Checkpoint::open(path)?;
    let checkpoints = [checkpoint];
    let learned = learn(catalog, &checkpoints)?;
    for (s, why) in &learned.unreadable {
        say(&format!(
            "warning: {}: not compared: {why}",
            learned.stored[*s].path
        ));
    }
    let mut map = NameMap::from_learned(&learned, model, &checkpoints);
    map.compute_digests(model)?;
    for line in report::render(&map).lines().filter(|l| !l.is_empty()) {
        say(line);
    }
    if map.matched() == 0 {
        return Err(Error::invalid(format!(
            "--names {}: 0 of {} checkpoint tensors matched: it does not hold the weights of {}",
            path.display(),
            map.names.len(),
            model.files[0].path.display()
        )));
    }
    Ok(map)
}
