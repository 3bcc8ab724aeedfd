//! Same-size updates that rewrite most of a file, committed as a new copy of it
//! (docs/writes.md#large-updates-as-a-new-copy): the file's bytes with the new ranges in
//! their places, written once, front to back, into a new file beside the model, which a
//! re-layout's rename then puts in the model's place (`relayout::Prepared`).
//!
//! Invariants: the copy has the model's exact layout and size (the flatbuffer and every byte
//! outside the new ranges are copied as they are); it is written strictly in order, so every
//! byte is written once; the model is not touched; the copy is unnamed (`O_TMPFILE`) until it
//! is complete, durable and parses back as the same kind of file, then named as a
//! re-layout's new file is (`.<name>.ptefs-new.<random>`), so recovery and the group commit
//! treat it as one; a copy dropped before it is named leaves nothing behind. A `Copy` holds
//! no borrow of the model, so a mount can write one while an upload arrives.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

use super::beside::Beside;
use super::direct::{self, DirectWriter};
use super::relayout::{temp_prefix, Prepared};
use crate::content::{Bytes, Source};
use crate::error::{Error, Result};
use crate::format::range::ByteRange;
use crate::format::{Kind, ModelFile};

/// Files smaller than this are always written in place: their commit costs its fsyncs, not
/// its bytes, and a copy gives the file a new inode (its hard links keep the old bytes, and
/// every open file of a mount must be opened again).
pub const COPY_FROM: u64 = 1 << 20;

/// Whether a same-size commit that writes `written` bytes of a file of `len` bytes is
/// written as a new copy: when it writes more than half of a file of at least `COPY_FROM`
/// bytes. A journal commit writes each new byte twice (the journal, then in place) and a
/// copy writes every byte of the file once, so the copy writes less exactly when the new
/// bytes are more than half of the file; small updates stay in place, where only they are
/// written.
pub fn worth_copying(written: u64, len: u64) -> bool {
    len >= COPY_FROM && written > len / 2
}

/// Whether `model` may be replaced by a new copy: not when it has extended attributes (an
/// ACL, `user.*`, security labels), which a copy would not carry, so its commits stay in
/// place where they are kept. Unknown (the attributes cannot be listed) counts as having
/// some.
pub fn may_copy(model: &ModelFile) -> bool {
    let Some(file) = model.file.as_ref() else {
        return false;
    };
    // SAFETY: with a null buffer and size 0, flistxattr only returns the list's length.
    let n = unsafe { libc::flistxattr(file.as_raw_fd(), std::ptr::null_mut(), 0) };
    n == 0
}

/// The memory a copy being written holds (its direct I/O buffers).
pub const MEMORY: u64 = direct::MEMORY;

/// A new copy of a model file being written.
pub struct Copy {
    /// The model file, as it was when the copy began.
    src: File,
    out: File,
    /// Straight to the disk where the file system allows it: the new bytes are not copied
    /// into fresh page-cache pages, which on these machines costs more than writing them;
    /// None once settled (`settle`), or where direct I/O is refused: through the page cache.
    direct: Option<DirectWriter<File>>,
    /// How far the copy is written, from its start.
    pos: u64,
    len: u64,
    buf: Vec<u8>,
    /// The copy, for messages.
    shown: String,
    /// Whether the model is a `.pte` (else a `.ptd`): the copy must parse back as one.
    pte: bool,
    /// Complete and durable: nothing more is written.
    complete: bool,
    /// Why a write to the copy failed: its bytes may be lost (a direct write fails after
    /// the calls that gave it its bytes returned), so it can never be committed, read back
    /// or written again.
    failed: Option<String>,
}

/// Appends `bytes` at `pos` of `out`: through `direct` when there is one, else from a
/// buffer. Read into a buffer and written from it: `copy_file_range` between two files of
/// one ext4 file system copies through a pipe in the kernel, at half the speed, and a bulk
/// update has thousands of pieces.
fn append(
    direct: &mut Option<DirectWriter<File>>, out: &File, buf: &mut Vec<u8>, pos: u64, bytes: Source,
) -> std::io::Result<()> {
    if let Some(w) = direct {
        return w.append(bytes, None);
    }
    let mut at = pos;
    bytes.for_each_chunk(buf, |chunk| {
        out.write_all_at(chunk, at)?;
        at += chunk.len() as u64;
        Ok(())
    })
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// The model's descriptor, its size checked against what it had when opened.
fn source_of(model: &ModelFile) -> Result<(&File, u64)> {
    let src = model
        .file
        .as_ref()
        .ok_or_else(|| Error::invalid("the model is not backed by a file"))?;
    let len = src
        .metadata()
        .map_err(io(format!("stat {}", model.path.display())))?
        .len();
    if len != model.len() {
        return Err(Error::new(
            libc::ESTALE,
            format!(
                "{} is {len} bytes, not the {} it had when opened",
                model.path.display(),
                model.len()
            ),
        ));
    }
    Ok((src, len))
}

impl Copy {
    /// Starts an unnamed copy of `model` beside it, once its file system has room for it;
    /// None where the directory has no unnamed files.
    pub fn begin(model: &ModelFile) -> Result<Option<Copy>> {
        let beside = Beside::of(model)?;
        beside.check_model_named()?;
        let (_, len) = source_of(model)?;
        beside.need_room(
            len,
            &format!(
                "an update of most of {} writes a new copy of it beside it",
                model.path.display()
            ),
        )?;
        let Some(out) = beside.create_unnamed()? else {
            return Ok(None);
        };
        let shown = format!("the new (unnamed) copy of {}", model.path.display());
        Copy::into(model, out, shown).map(Some)
    }

    /// A copy of `model` written into `out`, created empty.
    fn into(model: &ModelFile, out: File, shown: String) -> Result<Copy> {
        let (src, len) = source_of(model)?;
        let src = src
            .try_clone()
            .map_err(io(format!("duplicate {}", model.path.display())))?;
        let direct = match out.try_clone().and_then(DirectWriter::new) {
            Ok(w) => Some(w),
            Err(e) if direct::unsupported(&e) => None,
            Err(e) => return Err(Error::io(format!("write {shown}"), e)),
        };
        Ok(Copy {
            src,
            out,
            direct,
            pos: 0,
            len,
            buf: Vec::new(),
            shown,
            pte: matches!(model.kind, Kind::Pte(_)),
            complete: false,
            failed: None,
        })
    }

    /// The copy, to read back what was written (after `settle`); an error once a write to
    /// it failed.
    pub fn file(&self) -> Result<&File> {
        self.usable()?;
        Ok(&self.out)
    }

    /// An error once a write to the copy failed (`failed`).
    fn usable(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(Error::new(
                libc::EIO,
                format!(
                    "{} lost bytes to a failed write ({why}): it cannot be used",
                    self.shown
                ),
            )),
            None => Ok(()),
        }
    }

    /// Remembers a failed write (`failed`) and passes its error on.
    fn note<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.failed.get_or_insert_with(|| e.message().to_string());
        }
        r
    }

    /// Copies the model's bytes up to `at`.
    fn copy_to(&mut self, at: u64) -> Result<()> {
        self.usable()?;
        if at < self.pos || at > self.len {
            return Err(Error::invalid(format!(
                "a copy of {} bytes written up to {} cannot be written at {at}",
                self.len, self.pos
            )));
        }
        if at == self.pos {
            return Ok(());
        }
        if self.complete {
            return Err(Error::invalid(format!("{} is complete", self.shown)));
        }
        let gap = Source::File {
            file: &self.src,
            offset: self.pos,
            len: at - self.pos,
        };
        let copied = append(&mut self.direct, &self.out, &mut self.buf, self.pos, gap)
            .map_err(io(format!("copy the model into {}", self.shown)));
        self.note(copied)?;
        self.pos = at;
        Ok(())
    }

    /// Appends `bytes` at `pos`.
    fn append(&mut self, bytes: Source) -> Result<()> {
        if self.complete {
            return Err(Error::invalid(format!("{} is complete", self.shown)));
        }
        self.usable()?;
        let appended = append(&mut self.direct, &self.out, &mut self.buf, self.pos, bytes)
            .map_err(io(format!("write {}", self.shown)));
        self.note(appended)?;
        self.pos += bytes.len();
        Ok(())
    }

    fn end_of(&self, at: u64, n: u64) -> Result<u64> {
        at.checked_add(n).filter(|&e| e <= self.len).ok_or_else(|| {
            Error::invalid(format!(
                "{n} bytes at {at} lie outside the {} bytes of {}",
                self.len, self.shown
            ))
        })
    }

    /// Writes `bytes` at `at`, at or past where the copy is written up to; the model's bytes
    /// fill the gap.
    pub fn write(&mut self, at: u64, bytes: &[u8]) -> Result<()> {
        self.write_source(at, Source::Memory(bytes))
    }

    /// `write` of content that may live in a file.
    pub fn write_source(&mut self, at: u64, bytes: Source) -> Result<()> {
        self.end_of(at, bytes.len())?;
        self.copy_to(at)?;
        self.append(bytes)
    }

    /// Writes out what direct I/O holds back and goes on through the page cache: what was
    /// written can then be read back through `file`.
    pub fn settle(&mut self) -> Result<()> {
        self.usable()?;
        let Some(w) = self.direct.take() else {
            return Ok(());
        };
        let settled = w
            .finish()
            .map_err(io(format!("write {}", self.shown)))
            .and_then(|n| {
                if n == self.pos {
                    Ok(())
                } else {
                    Err(Error::new(
                        libc::EIO,
                        format!("{}: {n} bytes written, expected {}", self.shown, self.pos),
                    ))
                }
            });
        self.note(settled)
    }

    /// Copies the rest of the model, gives the copy the model's mode, makes it durable and
    /// checks that it parses back as the same kind of file.
    pub fn complete(&mut self) -> Result<()> {
        self.usable()?;
        if self.complete {
            return Ok(());
        }
        self.copy_to(self.len)?;
        self.settle()?;
        let meta = self
            .src
            .metadata()
            .map_err(io(format!("stat the model of {}", self.shown)))?;
        // The owner was set at creation; the mode waits until the bytes are complete.
        // SAFETY: a plain system call on an open descriptor.
        unsafe { libc::fchmod(self.out.as_raw_fd(), meta.mode() & 0o7777) };
        let synced = self
            .out
            .sync_all()
            .map_err(io(format!("fsync {}", self.shown)));
        self.note(synced)?;
        self.check()?;
        self.complete = true;
        Ok(())
    }

    /// The copy parses as a model file, of the size it was written.
    fn check(&self) -> Result<()> {
        let file = self
            .out
            .try_clone()
            .map_err(io(format!("duplicate {}", self.shown)))?;
        let new = ModelFile::from_file(PathBuf::from(&self.shown), file, false)
            .map_err(|e| Error::new(libc::EIO, format!("the new copy does not parse back: {e}")))?;
        if new.len() != self.len || matches!(new.kind, Kind::Pte(_)) != self.pte {
            return Err(Error::new(
                libc::EIO,
                format!("{} is not a whole copy of its model", self.shown),
            ));
        }
        Ok(())
    }

    /// Completes the copy (`complete`) and names it beside `model`, which must be the file
    /// it copies, unchanged since: it is then ready to be renamed over the model.
    pub fn finish(mut self, model: &ModelFile) -> Result<Prepared<'_>> {
        let (src, _) = source_of(model)?;
        let (a, b) = (src.metadata(), self.src.metadata());
        let same = match (a, b) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino(), a.len()) == (b.dev(), b.ino(), b.len()),
            _ => false,
        };
        if !same {
            return Err(Error::new(
                libc::ESTALE,
                format!(
                    "{} is not the file {} was copied from",
                    model.path.display(),
                    self.shown
                ),
            ));
        }
        self.complete()?;
        let beside = Beside::of(model)?;
        let prefix = temp_prefix(beside.model_name());
        let name = match beside.link_unique(&self.out, &prefix)? {
            Some(name) => name,
            None => {
                // This process cannot name unnamed files: a named file gets its bytes.
                let (named, name) = beside.create_unique(&prefix)?;
                let shown = beside.shown(&name);
                let copied = Source::File {
                    file: &self.out,
                    offset: 0,
                    len: self.len,
                }
                .write_to(&named, 0, &mut self.buf)
                .map_err(io(format!("copy {} into {shown}", self.shown)))
                .and_then(|_| {
                    let mode = self.out.metadata().map(|m| m.mode()).unwrap_or(0o600);
                    // SAFETY: as above.
                    unsafe { libc::fchmod(named.as_raw_fd(), mode & 0o7777) };
                    named.sync_all().map_err(io(format!("fsync {shown}")))
                });
                if let Err(e) = copied {
                    let _ = beside.remove(&name);
                    return Err(e);
                }
                self.out = named;
                name
            }
        };
        Ok(Prepared::new(beside, model, name, self.out))
    }
}

/// The new copy of `model` with same-size `patches` (ranges of the file and their new
/// bytes) in place, written and named beside it.
pub fn of_patches<'a>(
    model: &'a ModelFile, patches: &[(ByteRange, Bytes)],
) -> Result<Prepared<'a>> {
    let mut order: Vec<&(ByteRange, Bytes)> = patches.iter().collect();
    order.sort_by_key(|(r, _)| r.start());
    for pair in order.windows(2) {
        if pair[1].0.start() < pair[0].0.end() {
            return Err(Error::invalid(format!(
                "bytes {}..{} are written twice in one commit",
                pair[1].0.start(),
                pair[0].0.end().min(pair[1].0.end())
            )));
        }
    }
    let write_all = |copy: &mut Copy| -> Result<()> {
        for (range, bytes) in &order {
            let source = bytes.source();
            if source.len() != range.len() {
                return Err(Error::invalid(format!(
                    "{} bytes given for the {} bytes at {}",
                    source.len(),
                    range.len(),
                    range.start()
                )));
            }
            copy.write_source(range.start(), source)?;
        }
        Ok(())
    };
    if let Some(mut copy) = Copy::begin(model)? {
        write_all(&mut copy)?;
        return copy.finish(model);
    }
    // No unnamed files here: the copy has its name from the start, removed if it fails.
    let beside = Beside::of(model)?;
    let (out, name) = beside.create_unique(&temp_prefix(beside.model_name()))?;
    let written = out
        .try_clone()
        .map_err(io(format!("duplicate {}", beside.shown(&name))))
        .and_then(|dup| Copy::into(model, dup, beside.shown(&name)))
        .and_then(|mut copy| {
            write_all(&mut copy)?;
            copy.complete()
        });
    match written {
        Ok(()) => Ok(Prepared::new(beside, model, name, out)),
        Err(e) => {
            let _ = beside.remove(&name);
            Err(e)
        }
    }
}
