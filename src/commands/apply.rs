//! `ptefs apply`: a bulk update from a safetensors file, without FUSE, through the same
//! commit engine as a write of `weights.safetensors` on a mount (docs/writes.md#ptefs-apply).
//!
//! Invariants: the files are claimed as a mount claims them, so an update never runs while
//! one of them is mounted (or being updated by another `apply`); an interrupted commit left
//! beside a file is finished or discarded first, as a mount would; the update is checked
//! whole before anything is written, and one mismatch refuses all of it; the changed
//! tensors of each file are written with one journal, so after a crash each file holds all
//! old or all new bytes. `--dry-run` writes nothing, and does not finish interrupted
//! commits (it reports them).
//!
//! With `--names`, the update's tensors are named as a checkpoint names them
//! (docs/writes.md#updates-by-checkpoint-name): a map given as a file must describe the
//! files byte for byte before anything is written, and after the write it is replaced
//! (a new file beside it, renamed over it) with the digests of the files as written; it is
//! never one of the model files.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::edit::recovery;
use crate::edit::{self, bulk, Source};
use crate::error::{Error, Result};
use crate::format::safetensors::HeaderBound;
use crate::format::target::WeightsView;
use crate::format::Model;
use crate::host::claims;
use crate::names::checkpoint::{read_adapter_config, Adapter, Kind};
use crate::names::update::ByName;
use crate::names::{learn, Checkpoint, NameMap};
use crate::quote;

/// What `ptefs apply` was asked.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    pub file: PathBuf,
    pub data: Vec<PathBuf>,
    pub update: PathBuf,
    /// A name map, or the checkpoint(s) to learn one from: the update names tensors as
    /// they do.
    pub names: Vec<PathBuf>,
    pub dry_run: bool,
}

/// Where the names of an update by name come from.
enum Names {
    /// A map read from this file.
    File(PathBuf, NameMap),
    /// A map learned now from checkpoints.
    Learned(NameMap),
}

impl Names {
    fn map(&self) -> &NameMap {
        match self {
            Names::File(_, m) | Names::Learned(m) => m,
        }
    }
}

/// Whether `--names` gives a map (a `.json` file that is not a sharded checkpoint's index).
fn is_map(path: &std::path::Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.ends_with(".json") && !name.ends_with(".index.json") && !path.is_dir()
}

/// The names `--names` gives for `catalog`'s model: a map checked against the files, or
/// one learned from the checkpoints.
fn names_of(given: &[PathBuf], catalog: &Catalog, model_paths: &[&PathBuf]) -> Result<Names> {
    let model = &*catalog.model;
    if given.iter().any(|p| is_map(p)) {
        let [path] = given else {
            return Err(Error::invalid(
                "--names: give one name map, or the checkpoint(s) to learn the names from",
            ));
        };
        // The map is replaced after the write: never by a model file.
        if let Ok(target) = path.canonicalize() {
            if model_paths.iter().any(|p| **p == target) {
                return Err(Error::invalid(format!(
                    "--names {}: that is a model file, not a name map",
                    path.display()
                )));
            }
        }
        let map = NameMap::read(path)?;
        map.check_files(model)
            .map_err(|e| e.context(format!("--names {}", path.display())))?;
        return Ok(Names::File(path.clone(), map));
    }
    let checkpoints = given
        .iter()
        .map(|p| Checkpoint::open(p))
        .collect::<Result<Vec<_>>>()?;
    let learned = learn(catalog, &checkpoints)?;
    Ok(Names::Learned(NameMap::from_learned(
        &learned,
        model,
        &checkpoints,
    )))
}

/// The update file `given` names: a PEFT adapter's directory stands for its
/// `adapter_model.safetensors`.
fn update_file(given: &std::path::Path) -> PathBuf {
    let adapter = given.join("adapter_model.safetensors");
    if given.is_dir() && adapter.is_file() {
        adapter
    } else {
        given.to_path_buf()
    }
}

/// The new adapter's configuration, beside an update made for a map learned from one.
fn new_adapter(map: &NameMap, update: &std::path::Path) -> Result<Option<Adapter>> {
    if !map.checkpoints.iter().any(|c| c.kind == Kind::Peft) {
        return Ok(None);
    }
    let config = update.with_file_name("adapter_config.json");
    if !config.is_file() {
        return Ok(None);
    }
    read_adapter_config(&config).map(Some)
}

/// Runs `ptefs apply`, printing what changed (or would) to `out`.
pub fn apply(req: &ApplyRequest, out: &mut dyn Write) -> Result<bulk::Summary> {
    crate::host::refuse_remote(
        "ptefs apply",
        std::iter::once(req.file.as_path()).chain(req.data.iter().map(PathBuf::as_path)),
    )?;
    let (file, data) = crate::host::canonical_files(&req.file, &req.data)?;
    let paths: Vec<&PathBuf> = std::iter::once(&file).chain(&data).collect();
    let claims = claims::Claims::new(
        paths
            .iter()
            .map(|p| claims::claim_file(p, claims::Holder::Apply))
            .collect::<Result<Vec<_>>>()?,
    );
    if req.dry_run {
        for warning in recovery::interrupted_commits(&file, &data) {
            eprintln!("ptefs: warning: {warning}");
        }
    } else {
        let _members = super::claim_commit_members(
            &paths.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
            claims::Holder::Apply,
        )?;
        for p in &paths {
            recovery::recover(p, true)?;
        }
    }

    let update_path = update_file(&req.update);
    let update = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&update_path)
        .map_err(|e| Error::io(format!("open {}", update_path.display()), e))?;
    let meta = update
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", update_path.display()), e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "{}: not a regular file",
            update_path.display()
        )));
    }
    let source = Source::File {
        file: &update,
        offset: 0,
        len: meta.len(),
    };

    let model = if req.dry_run {
        Model::open(&file, &data)?
    } else {
        Model::open_writable(&file, &data)?
    };
    let catalog = Catalog::of(Arc::new(model));
    let model = &*catalog.model;
    let names = if req.names.is_empty() {
        None
    } else {
        Some(names_of(&req.names, &catalog, &paths)?)
    };
    let mut notes = Vec::new();
    let (plan, summary) = match &names {
        None => {
            // The tensors the mount's root `weights.safetensors` shows: every file's, named
            // as there, so an update made for the mount applies here as it is.
            let entries = catalog.weights(WeightsView::Root).entries.clone();
            // The header is read once the model's tensors say how large it may be.
            let header = bulk::read_header(source, &HeaderBound::of(&entries))
                .map_err(|e| e.context(update_path.display()))?;
            bulk::plan_header(&catalog, &entries, &header, source, None)
        }
        Some(names) => {
            let map = names.map();
            let bound = crate::names::update::header_bound(map);
            let header =
                bulk::read_header(source, &bound).map_err(|e| e.context(update_path.display()))?;
            let adapter = new_adapter(map, &update_path)?;
            let by = ByName::check(&catalog, map, &header, adapter.as_ref())
                .map_err(|e| e.context(update_path.display()))?;
            notes.extend(by.notes());
            bulk::plan_items(&catalog, by.items(&catalog, &header, source))
        }
    }
    .and_then(|(plan, summary)| {
        edit::params::check(&catalog, &plan)?;
        Ok((edit::identity::separate(model, plan)?, summary))
    })
    .map_err(|e| e.context(update_path.display()))?;
    if !req.dry_run {
        for f in plan.files() {
            let f = &model.files[f];
            if !f.writable {
                return Err(Error::new(
                    libc::EACCES,
                    format!(
                        "{}: not writable by this user, so nothing was written",
                        f.path.display()
                    ),
                ));
            }
        }
        let written = plan.files();
        edit::commit_plan(model, plan, || (), &claims)?;
        if let (false, Some(Names::File(path, map))) = (written.is_empty(), &names) {
            update_map(path, map, &file, &data, &written)?;
        }
    }
    for note in &notes {
        writeln!(out, "{note}").map_err(|e| Error::io("standard output", e))?;
    }
    report(&summary, req.dry_run, out).map_err(|e| Error::io("standard output", e))?;
    Ok(summary)
}

/// Replaces the map at `path` with `map` holding the digests of the files as they are now
/// (still claimed: as this command wrote them). Only the files the commit wrote are hashed
/// again: the others were checked against the map's digests before the commit, under the
/// same claims.
fn update_map(
    path: &Path, map: &NameMap, file: &Path, data: &[PathBuf], written: &[usize],
) -> Result<()> {
    let model = Model::open(file, data)?;
    let mut map = map.clone();
    crate::names::update::record_digests(&mut map, &model, written)?;
    crate::names::map::save_replacing(path, &map, &model)
        .map_err(|e| e.context("the files were written, the map was not updated"))
}

fn report(summary: &bulk::Summary, dry_run: bool, out: &mut dyn Write) -> std::io::Result<()> {
    let (changed, written) = if dry_run {
        ("would change", "would be written")
    } else {
        ("changed", "written")
    };
    // One write for many lines: standard output writes each line on its own otherwise, and
    // an update of every tensor of an LLM lists thousands.
    let mut out = std::io::BufWriter::with_capacity(64 << 10, out);
    // Names come from the model and the update: escaped, as `ptefs ls` shows them.
    for name in &summary.changed {
        writeln!(out, "{changed}\t{}", quote::listed(name))?;
    }
    for name in &summary.unchanged {
        writeln!(out, "unchanged\t{}", quote::listed(name))?;
    }
    writeln!(
        out,
        "{} tensor(s) {changed}, {} unchanged, {} bytes {written}",
        summary.changed.len(),
        summary.unchanged.len(),
        summary.bytes
    )?;
    out.flush()
}
