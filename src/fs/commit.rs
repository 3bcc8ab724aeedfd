//! Commit orchestration: staged bytes become the new content of a tree file through
//! `crate::edit`, then the snapshot and the kernel's caches follow.
//!
//! Invariants: the model file changes only here; one commit runs at a time (`commit_lock`);
//! readers of mapped bytes wait while bytes change in place (`gate`); a refused commit
//! changes nothing on disk and leaves the snapshot as it was.

use std::sync::Arc;

use super::invalidate::Invalidate;
use super::staging::Staged;
use super::stream::Stream;
use super::Fs;
use crate::edit::{self, Outcome, Plan, Source};
use crate::error::{Error, Result};
use crate::format::layout::{FileIndex, Location};
use crate::format::{Model, WriteTarget};
use crate::tree::{Ino, Tree};

/// Whether the tree of `old` still describes the file after `outcome`: an in-place write
/// beyond the flatbuffer, and outside every decoded delegate payload, changes bytes that no
/// generated file or layout is computed from.
fn outcome_keeps_structure(old: &Tree, outcome: &Outcome) -> bool {
    let decoded: Vec<Location> = old
        .catalog
        .payloads
        .iter()
        .map(|(_, d)| d.location)
        .collect();
    let overlaps = |a: &Location, b: &Location| {
        a.file == b.file && a.range.start() < b.range.end() && b.range.start() < a.range.end()
    };
    match outcome {
        Outcome::InPlace { ranges } => ranges.iter().all(|l| {
            l.range.start() >= old.model.files[l.file].program_end()
                && !decoded.iter().any(|d| overlaps(l, d))
        }),
        Outcome::Relayout { .. } => false,
    }
}

/// Which inodes a commit changed: ranges overlapping an in-place write (and every generated
/// file when the write touched the flatbuffer), or everything after a re-layout.
fn invalidations(old: &Tree, outcome: &Outcome) -> Invalidate {
    if !outcome_keeps_structure(old, outcome) {
        return Invalidate::inodes(old.built_inodes());
    }
    let Outcome::InPlace { ranges } = outcome else {
        unreachable!("only in-place commits keep the structure")
    };
    let overlaps = |l: &Location| {
        ranges.iter().any(|r| {
            l.file == r.file && l.range.start() < r.range.end() && r.range.start() < l.range.end()
        })
    };
    Invalidate::inodes(
        old.built_nodes()
            .map(|(ino, _)| ino)
            .filter(|&ino| old.reads(ino).iter().any(overlaps))
            .collect(),
    )
}

/// Re-opens the files of `tree` after a commit (`ours`) or a change behind the mount, and
/// builds the new tree (docs/tree.md#named-views). Named views follow a commit of ours: the
/// map is resolved again on the new files by tree path (its digests are expected to differ
/// then); after a change behind the mount, only when the files are still those the map was
/// learned on. A map that no longer fits is dropped, with a warning.
pub fn reload(tree: &Tree, ours: bool) -> Result<Tree> {
    let model: Model = tree.model.reopen()?;
    let catalog = Arc::new(crate::catalog::Catalog::of(Arc::new(model)));
    let views = tree.names.as_ref().and_then(|v| {
        if !ours {
            if let Err(e) = v.map.check_files(&catalog.model) {
                log::warn!("names/ is gone: {e}");
                return None;
            }
        }
        crate::names::NamedViews::resolve(&catalog, v.map.clone())
            .map(Arc::new)
            .map_err(|e| log::warn!("names/ is gone after the commit: {e}"))
            .ok()
    });
    Ok(Tree::of_named(catalog, views))
}

/// What became of a streamed upload at a commit.
enum Streamed {
    Committed(Invalidate),
    /// Not a valid whole yet, and the commit waits (`Invalid::Wait`).
    Wait,
    /// To be committed as staged content.
    AsStaged,
}

/// What a commit does with content that is not a valid whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Invalid {
    /// Refuses it: the error says why (`close`, `rename`, `truncate`).
    Refuse,
    /// Leaves it staged and writes nothing (`fsync` of partial content).
    Wait,
}

impl Fs {
    /// What a write to tree file `ino` means, or why it cannot be written.
    pub(super) fn write_target<'t>(&self, tree: &'t Tree, ino: Ino) -> Result<&'t WriteTarget> {
        tree.node(ino)
            .ok_or_else(|| Error::not_found(format!("inode {ino}")))?
            .write
            .as_ref()
            .ok_or_else(|| self.not_writable(tree, ino))
    }

    /// Commits `staged` as the new content of tree file `ino`; None when the content is not
    /// a valid whole and `invalid` says to wait.
    pub(super) fn commit_staged(
        &self, ino: Ino, staged: &mut Staged, invalid: Invalid,
    ) -> Result<Option<Invalidate>> {
        let _one_at_a_time = self.commit_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stream) = staged.stream_mut() {
            match self.commit_stream(ino, stream, invalid)? {
                Streamed::Committed(inval) => return Ok(Some(inval)),
                Streamed::Wait => return Ok(None),
                Streamed::AsStaged => {}
            }
        }
        self.commit_bytes(ino, staged.source()?, invalid)
    }

    /// Commits an upload streamed into a new copy of the model (docs/writes.md#uploads-written-straight-into-a-new-copy):
    /// once it is whole, its bytes are validated where they lie in the copy, and the copy
    /// is completed, made durable and renamed over the model. An upload not yet whole, or
    /// streamed against a snapshot that some commit or change has replaced since, is
    /// committed as staged content (`AsStaged`). The caller holds `commit_lock`.
    fn commit_stream(&self, ino: Ino, stream: &mut Stream, invalid: Invalid) -> Result<Streamed> {
        if !stream.whole() {
            return Ok(match invalid {
                Invalid::Wait => Streamed::Wait,
                // Refused as staged content is, with the same message.
                Invalid::Refuse => Streamed::AsStaged,
            });
        }
        let before = self.tree();
        self.check_files_locked(true)?;
        let tree = self.tree();
        if !Arc::ptr_eq(&before, &tree)
            || !Arc::ptr_eq(&tree.catalog, &stream.start.catalog)
            || self.changes.now() != stream.start.generation
        {
            // The bytes around the tensors in the copy may be older than the model's.
            return Ok(Streamed::AsStaged);
        }
        let path = tree.path(ino);
        let file = stream.file();
        let len = stream.received();
        // The quantization parameters the new bytes land on, as `edit::validate::plan`
        // checks them after the header (which `Stream::begin` matched).
        // A copy that lost bytes fails here, fsync included; only what validation refuses
        // waits for more of the upload.
        let writes = stream.writes().map_err(|e| e.context(&path))?;
        let checked = edit::params::check(&tree.catalog, &Plan::InPlace { writes });
        match checked {
            Ok(()) => {}
            Err(_) if invalid == Invalid::Wait => return Ok(Streamed::Wait),
            Err(e) => return Err(e.context(&path)),
        }
        let copy = stream
            .take_copy()
            .ok_or_else(|| Error::new(libc::EIO, format!("{path}: the upload's copy is gone")))?;
        copy.finish(&tree.model.files[file])
            .and_then(|new| new.put_in_place(&*self.watcher))
            .map_err(|e| e.context(&path))?;
        log::info!("{path}: the upload was written straight into a new copy of the model file");
        let outcome = Outcome::Relayout { file };
        self.after_commit(&tree, ino, &path, &outcome, vec![file], len)
            .map(Streamed::Committed)
    }

    /// Validates `data` as the new content of tree file `ino`, writes it, and switches to
    /// the new snapshot. The caller holds `commit_lock`.
    fn commit_bytes(&self, ino: Ino, data: Source, invalid: Invalid) -> Result<Option<Invalidate>> {
        let before = self.tree();
        // A write staged against a model someone else has changed since is not committed.
        self.check_files_locked(true)?;
        let tree = self.tree();
        if !Arc::ptr_eq(&before, &tree) {
            return Err(Error::new(
                libc::ESTALE,
                format!(
                    "{}: the model changed behind the mount while this was being written, so nothing was committed; write it again",
                    tree.path(ino)
                ),
            ));
        }
        let target = self.write_target(&tree, ino)?;
        let path = tree.path(ino);
        let map = tree.names.as_deref().map(|v| &v.map);
        let plan = match crate::names::update::plan_file(&tree.catalog, map, target, data) {
            Ok(plan) => plan,
            Err(_) if invalid == Invalid::Wait => return Ok(None),
            Err(e) => return Err(e.context(&path)),
        };
        // Readers of the mapped bytes wait while they change in place (see `read_with`).
        let exclusive = || self.gate.write().unwrap_or_else(|e| e.into_inner());
        let written = plan.files();
        let outcome = edit::identity::separate(&tree.model, plan)
            .and_then(|plan| edit::commit_plan(&tree.model, plan, exclusive, &*self.watcher))
            .map_err(|e| e.context(&path))?;
        self.after_commit(&tree, ino, &path, &outcome, written, data.len())
            .map(Some)
    }

    /// After a commit of `len` bytes to tree file `ino` of `tree` wrote `written`: the
    /// snapshot follows (kept, or the files re-opened), and what the kernel must forget.
    fn after_commit(
        &self, tree: &Arc<Tree>, ino: Ino, path: &str, outcome: &Outcome, written: Vec<FileIndex>,
        len: u64,
    ) -> Result<Invalidate> {
        let outcome = outcome.clone();
        self.stale_digests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(written);
        let mut inval = invalidations(tree, &outcome);
        if outcome_keeps_structure(tree, &outcome) {
            // Handles opened before see that these changed (see `external`).
            self.changes.changed(&inval.inodes);
            // Pictures of the changed values are rendered again (docs/tree.md#histograms).
            for &changed in &inval.inodes {
                tree.text_cache().remove(changed);
            }
            // Same offsets and sizes, and the mapping shares the page cache with the write:
            // the snapshot already shows the new bytes. Re-parsing would cost time
            // proportional to the number of values, not to the tensor.
            self.refresh_identity();
        } else {
            let new_tree = reload(tree, true).map_err(|e| {
                Error::new(
                    libc::EIO,
                    format!("{path}: written, but re-reading the model failed: {e}"),
                )
            })?;
            if !tree.same_shape(&new_tree) {
                // Inode numbers now name other nodes (a decoded payload gained or lost
                // files): every cached name must be looked up again.
                inval.entries = tree.built_entries();
            }
            self.replace_tree(new_tree);
            self.changes.all_changed();
        }
        // Whatever file was written, the map's digests follow the files, so that `ptefs
        // names --map` and the next mount accept them (docs/writes.md#writing-through-the-named-views).
        self.follow_digests(path);
        self.refusals.clear(ino);
        log::info!("committed {path} ({len} bytes, {outcome:?})");
        Ok(inval)
    }

    /// After a commit of a mount with named views: the map gets the digests of the files commits
    /// wrote since it last got them, and a map given as a file is replaced with it. The
    /// commit is done whatever happens here, so a failure is logged, not returned.
    fn follow_digests(&self, path: &str) {
        let tree = self.tree();
        let Some(views) = tree.names.as_deref() else {
            return;
        };
        let mut stale = self.stale_digests.lock().unwrap_or_else(|e| e.into_inner());
        stale.sort_unstable();
        stale.dedup();
        let mut map = views.map.clone();
        let updated = crate::names::update::record_digests(&mut map, &tree.model, &stale)
            .and_then(|()| crate::names::NamedViews::resolve(&tree.catalog, map.clone()));
        let views = match updated {
            Ok(v) => v,
            Err(e) => {
                log::error!("{path}: written, but the name map's digests were not updated: {e}");
                return;
            }
        };
        stale.clear();
        drop(stale);
        if let Some(file) = &self.names_file {
            if let Err(e) = crate::names::map::save_replacing(file, &map, &tree.model) {
                log::error!(
                    "{path}: written, but the name map {} was not updated: {e}",
                    file.display()
                );
            }
        }
        self.replace_tree(Tree::of_named(tree.catalog.clone(), Some(Arc::new(views))));
    }

    pub(super) fn not_writable(&self, tree: &Tree, ino: Ino) -> Error {
        if self.options.read_only {
            Fs::read_only_error()
        } else {
            Error::new(
                libc::EACCES,
                format!("{} is read-only: only tensor bytes, named data, delegate payloads and segments can be written", tree.path(ino)),
            )
        }
    }
}
