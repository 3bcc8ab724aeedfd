//! `ptefs names`: learn the names of a model's tensors from the checkpoint(s) it was exported
//! from, print the report, and write the name map (docs/names.md, docs/commands.md#ptefs-names);
//! or, with `--map`, check a map against the files and print its report.
//!
//! Invariants: the model files are only read; `-o` replaces its file atomically (a new file
//! beside it, created exclusively and without following links, renamed over it) and is
//! refused when it names one of the model or checkpoint files; a map is written only with
//! the digest of every model file. The command fails when no checkpoint tensor was named,
//! and when a map does not fit the files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::output;
use crate::catalog::Catalog;
use crate::edit::recovery::interrupted_commits;
use crate::error::{Error, Result};
use crate::format::Model;
use crate::names::map::write_replacing;
use crate::names::{learn, report, stored_tensors, Checkpoint, NameMap};

/// What `ptefs names` was asked.
#[derive(Debug, Clone, Default)]
pub struct NamesRequest {
    pub file: PathBuf,
    pub data: Vec<PathBuf>,
    /// Checkpoints to learn from.
    pub from: Vec<PathBuf>,
    /// Where to write the map.
    pub output: Option<PathBuf>,
    /// A map to check instead of learning one.
    pub map: Option<PathBuf>,
}

/// Runs `ptefs names`; the report goes to `out`. Returns the map.
pub fn names(req: &NamesRequest, out: &mut dyn Write) -> Result<NameMap> {
    for warning in interrupted_commits(&req.file, &req.data) {
        log::warn!("{warning}");
        eprintln!("ptefs: warning: {warning}");
    }
    let model = Arc::new(Model::open(&req.file, &req.data)?);
    let catalog = Catalog::of(model.clone());
    if let Some(path) = &req.map {
        let map = NameMap::read(path)?;
        map.check_files(&model)?;
        map.check_targets(&stored_tensors(&catalog))
            .map_err(|e| e.context(path.display()))?;
        out.write_all(report::render(&map).as_bytes())
            .map_err(output)?;
        return Ok(map);
    }
    if req.from.is_empty() {
        return Err(Error::invalid(
            "no checkpoint: give --from CHECKPOINT (or --map MAP.json)",
        ));
    }
    let checkpoints = req
        .from
        .iter()
        .map(|p| Checkpoint::open(p))
        .collect::<Result<Vec<_>>>()?;
    if let Some(o) = &req.output {
        refuse_overwriting(o, &model, &checkpoints)?;
    }
    let learned = learn(&catalog, &checkpoints)?;
    for (s, why) in &learned.unreadable {
        eprintln!(
            "ptefs: warning: {}: not compared: {why}",
            learned.stored[*s].path
        );
    }
    let mut map = NameMap::from_learned(&learned, &model, &checkpoints);
    if let Some(o) = &req.output {
        map.compute_digests(&model)?;
        let mut text =
            serde_json::to_vec_pretty(&map.to_json()?).expect("JSON of strings and numbers");
        text.push(b'\n');
        write_replacing(o, &text)?;
    }
    out.write_all(report::render(&map).as_bytes())
        .map_err(output)?;
    if map.matched() == 0 {
        let _ = out.flush();
        let sources: Vec<String> = req.from.iter().map(|p| p.display().to_string()).collect();
        return Err(Error::invalid(format!(
            "0 of {} checkpoint tensors matched: {} does not hold the weights of {}",
            map.names.len(),
            sources.join(" + "),
            req.file.display()
        )));
    }
    Ok(map)
}

/// Refuses an output path that is one of the files read.
fn refuse_overwriting(o: &Path, model: &Model, checkpoints: &[Checkpoint]) -> Result<()> {
    let Ok(target) = o.canonicalize() else {
        return Ok(());
    };
    let inputs = model
        .files
        .iter()
        .map(|f| f.path.clone())
        .chain(checkpoints.iter().flat_map(|c| c.files.iter().cloned()));
    for input in inputs {
        if input.canonicalize().is_ok_and(|i| i == target) {
            return Err(Error::invalid(format!(
                "-o {}: that is {}, which this command reads; give the map another name",
                o.display(),
                input.display()
            )));
        }
    }
    Ok(())
}
