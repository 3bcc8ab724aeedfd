//! Same-size updates that rewrite most of a file, committed as a new copy of it
//! (docs/writes.md#large-updates-as-a-new-copy): the file's bytes with the new ranges in
//! their places, written once, front to back, into a new file beside the model, which a
//! re-layout's rename then puts in the model's place (`relayout::Prepared`).
//!
//! Invariants: the copy has the model's exact layout and size (the flatbuffer and every byte
//! outside the new ranges are copied as they are, in the kernel); it is written strictly in
//! order, so every byte is written once; the model is not touched; the copy is unnamed
//! (`O_TMPFILE`) until it is complete, durable and parses back as the same kind of file, then
//! named as a re-layout's new file is (`.<name>.ptefs-new.<random>`), so recovery and the
//! group commit treat it as one; a copy dropped before it is finished leaves nothing behind.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

use super::beside::Beside;
use super::direct::{self, DirectWriter};
use super::relayout::{temp_prefix, Prepared};
use crate::content::{copy_in_kernel, Bytes, Source};
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

/// A new copy of a model file being written.
pub struct Copy<'a> {
    /// Always Some until `finish` hands it on.
    beside: Option<Beside<'a>>,
    model: &'a ModelFile,
    src: &'a File,
    out: File,
    /// The copy's name while it has one (only where the directory has no unnamed files).
    name: Option<OsString>,
    /// Straight to the disk where the file system allows it (`direct`): the new bytes are
    /// not copied into fresh page-cache pages, which on these machines costs more than
    /// writing them; else None, and the copy is written through the page cache.
    direct: Option<DirectWriter<File>>,
    /// How far the copy is written, from its start.
    pos: u64,
    len: u64,
    buf: Vec<u8>,
}

impl Drop for Copy<'_> {
    fn drop(&mut self) {
        if let (Some(name), Some(beside)) = (self.name.take(), &self.beside) {
            let _ = beside.remove(&name);
        }
    }
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

impl<'a> Copy<'a> {
    /// Starts a copy of `model` beside it, once its file system has room for it.
    pub fn begin(model: &'a ModelFile) -> Result<Copy<'a>> {
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
        let beside = Beside::of(model)?;
        beside.check_model_named()?;
        beside.need_room(
            len,
            &format!(
                "an update of most of {} writes a new copy of it beside it",
                model.path.display()
            ),
        )?;
        let (out, name) = match beside.create_unnamed()? {
            Some(out) => (out, None),
            None => {
                let (out, name) = beside.create_unique(&temp_prefix(beside.model_name()))?;
                (out, Some(name))
            }
        };
        let direct = match out.try_clone().and_then(DirectWriter::new) {
            Ok(w) => Some(w),
            Err(e) if direct::unsupported(&e) => None,
            Err(e) => {
                let _ = name.as_ref().map(|n| beside.remove(n));
                return Err(Error::io(
                    format!("write a new copy of {}", model.path.display()),
                    e,
                ));
            }
        };
        Ok(Copy {
            beside: Some(beside),
            model,
            src,
            out,
            name,
            direct,
            pos: 0,
            len,
            buf: Vec::new(),
        })
    }

    fn beside(&self) -> &Beside<'a> {
        self.beside.as_ref().expect("held until finished")
    }

    fn shown(&self) -> String {
        match &self.name {
            Some(name) => self.beside().shown(name),
            None => format!("the new (unnamed) copy of {}", self.model.path.display()),
        }
    }

    /// How far the copy is written: the next write must start here or later.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Copies the model's bytes up to `at`.
    fn copy_to(&mut self, at: u64) -> Result<()> {
        if at < self.pos || at > self.len {
            return Err(Error::invalid(format!(
                "a copy of {} bytes written up to {} cannot be written at {at}",
                self.len, self.pos
            )));
        }
        let n = at - self.pos;
        if n == 0 {
            return Ok(());
        }
        if self.direct.is_some() {
            let gap = Source::File {
                file: self.src,
                offset: self.pos,
                len: n,
            };
            return self.append(gap);
        }
        let done = copy_in_kernel(self.src, self.pos, &self.out, self.pos, n).map_err(io(
            format!("copy {} into {}", self.model.path.display(), self.shown()),
        ))?;
        self.pos += done;
        if self.pos < at {
            let rest = Source::File {
                file: self.src,
                offset: self.pos,
                len: at - self.pos,
            };
            self.append(rest)?;
        }
        Ok(())
    }

    /// Appends `bytes` at `pos`.
    fn append(&mut self, bytes: Source) -> Result<()> {
        let written = match &mut self.direct {
            Some(w) => w.append(bytes, None),
            None => {
                let mut buf = std::mem::take(&mut self.buf);
                let mut pos = self.pos;
                let out = &self.out;
                // Read into a buffer and written from it: `copy_file_range` between two
                // files of one ext4 file system copies through a pipe in the kernel, at
                // half the speed, and a bulk update has thousands of pieces.
                let written = bytes.for_each_chunk(&mut buf, |chunk| {
                    out.write_all_at(chunk, pos)?;
                    pos += chunk.len() as u64;
                    Ok(())
                });
                self.buf = buf;
                written
            }
        };
        written.map_err(io(format!("write {}", self.shown())))?;
        self.pos += bytes.len();
        Ok(())
    }

    fn end_of(&self, at: u64, n: u64) -> Result<u64> {
        at.checked_add(n).filter(|&e| e <= self.len).ok_or_else(|| {
            Error::invalid(format!(
                "{n} bytes at {at} lie outside the {} bytes of {}",
                self.len,
                self.model.path.display()
            ))
        })
    }

    /// Writes `bytes` at `at` (at or past `position`); the model's bytes fill the gap.
    pub fn write(&mut self, at: u64, bytes: &[u8]) -> Result<()> {
        self.write_source(at, Source::Memory(bytes))
    }

    /// `write` of content that may live in a file.
    pub fn write_source(&mut self, at: u64, bytes: Source) -> Result<()> {
        self.end_of(at, bytes.len())?;
        self.copy_to(at)?;
        self.append(bytes)
    }

    /// Copies the rest of the model, gives the copy the model's mode, makes it durable,
    /// checks that it parses back as the same kind of file, and names it beside the model:
    /// it is then ready to be renamed over the model.
    pub fn finish(mut self) -> Result<Prepared<'a>> {
        self.copy_to(self.len)?;
        let shown = self.shown();
        if let Some(w) = self.direct.take() {
            let n = w.finish().map_err(io(format!("write {shown}")))?;
            if n != self.len {
                return Err(Error::new(
                    libc::EIO,
                    format!("{shown}: {n} bytes written, expected {}", self.len),
                ));
            }
        }
        let meta = self
            .src
            .metadata()
            .map_err(io(format!("stat {}", self.model.path.display())))?;
        // The owner was set at creation; the mode waits until the bytes are complete.
        // SAFETY: a plain system call on an open descriptor.
        unsafe { libc::fchmod(self.out.as_raw_fd(), meta.mode() & 0o7777) };
        self.out.sync_all().map_err(io(format!("fsync {shown}")))?;
        self.check(&shown)?;
        let name = match self.name.take() {
            Some(name) => name,
            None => self.name_unnamed(&shown)?,
        };
        let out = self
            .out
            .try_clone()
            .map_err(io(format!("duplicate {shown}")))?;
        // From here the name is the Prepared's to rename or remove.
        let beside = self.beside.take().expect("held until finished");
        Ok(Prepared::new(beside, self.model, name, out))
    }

    /// Names the finished unnamed copy; where this process cannot name unnamed files, a
    /// named file gets its bytes (in the kernel) instead.
    fn name_unnamed(&mut self, shown: &str) -> Result<OsString> {
        let prefix = temp_prefix(self.beside().model_name());
        if let Some(name) = self.beside().link_unique(&self.out, &prefix)? {
            return Ok(name);
        }
        let (named, name) = self.beside().create_unique(&prefix)?;
        self.name = Some(name.clone());
        let mut buf = std::mem::take(&mut self.buf);
        let copied = Source::File {
            file: &self.out,
            offset: 0,
            len: self.len,
        }
        .write_to(&named, 0, &mut buf);
        copied.map_err(io(format!(
            "copy {shown} into {}",
            self.beside().shown(&name)
        )))?;
        // SAFETY: as above.
        unsafe {
            libc::fchmod(
                named.as_raw_fd(),
                self.src.metadata().map(|m| m.mode()).unwrap_or(0o600) & 0o7777,
            )
        };
        named
            .sync_all()
            .map_err(io(format!("fsync {}", self.beside().shown(&name))))?;
        self.out = named;
        self.name = None;
        Ok(name)
    }

    /// The copy parses as the model did: same kind, same size.
    fn check(&self, shown: &str) -> Result<()> {
        let file = self
            .out
            .try_clone()
            .map_err(io(format!("duplicate {shown}")))?;
        let new = ModelFile::from_file(PathBuf::from(shown), file, false)
            .map_err(|e| Error::new(libc::EIO, format!("the new copy does not parse back: {e}")))?;
        let same_kind = matches!(
            (&new.kind, &self.model.kind),
            (Kind::Pte(_), Kind::Pte(_)) | (Kind::Ptd(_), Kind::Ptd(_))
        );
        if !same_kind || new.len() != self.len {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "{shown} is not a whole copy of {}",
                    self.model.path.display()
                ),
            ));
        }
        Ok(())
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
    let mut copy = Copy::begin(model)?;
    for (range, bytes) in order {
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
    copy.finish()
}
