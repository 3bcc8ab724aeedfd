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

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::edit::recovery;
use crate::edit::{self, bulk, Source};
use crate::error::{Error, Result};
use crate::format::safetensors::HeaderBound;
use crate::format::target::WeightsView;
use crate::format::Model;
use crate::host::claims;
use crate::quote;

/// What `ptefs apply` was asked.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    pub file: PathBuf,
    pub data: Vec<PathBuf>,
    pub update: PathBuf,
    pub dry_run: bool,
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

    let update = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&req.update)
        .map_err(|e| Error::io(format!("open {}", req.update.display()), e))?;
    let meta = update
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", req.update.display()), e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "{}: not a regular file",
            req.update.display()
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
    // The tensors the mount's root `weights.safetensors` shows: every file's, named as
    // there, so an update made for the mount applies here as it is.
    let entries = catalog.weights(WeightsView::Root).entries.clone();
    // The header is read once the model's tensors say how large it may be.
    let header = bulk::read_header(source, &HeaderBound::of(&entries))
        .map_err(|e| e.context(req.update.display()))?;
    let (plan, summary) = bulk::plan_header(model, &entries, &header, source, None)
        .and_then(|(plan, summary)| {
            edit::params::check(&catalog, &plan)?;
            Ok((edit::identity::separate(model, plan)?, summary))
        })
        .map_err(|e| e.context(req.update.display()))?;
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
        edit::commit_plan(model, plan, || (), &claims)?;
    }
    report(&summary, req.dry_run, out).map_err(|e| Error::io("standard output", e))?;
    Ok(summary)
}

fn report(summary: &bulk::Summary, dry_run: bool, out: &mut dyn Write) -> std::io::Result<()> {
    let (changed, written) = if dry_run {
        ("would change", "would be written")
    } else {
        ("changed", "written")
    };
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
    )
}
