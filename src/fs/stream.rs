//! An upload onto a `weights.safetensors` written straight into a new copy of the model file
//! as it arrives (docs/writes.md#uploads-written-straight-into-a-new-copy), instead of being
//! staged and then written again.
//!
//! Invariants: a stream begins only once the whole safetensors header has arrived and
//! names, in the order of its data, tensors of one model file that take their bytes as
//! they are (same dtype and shape), at increasing places of that file, none sharing its
//! bytes with a distinct tensor, and more than half of a file worth copying
//! (`edit::copy::worth_copying`); its bytes must then arrive in order, each once, and no
//! further than the header declares. Every byte received is either in the header (kept in
//! memory by `Staged`) or in the copy, at its tensor's place: what was received can always
//! be read back (`received`), so anything else a writer does (a write elsewhere, a truncate,
//! a read of its own content) turns the stream back into staged content first. Nothing
//! reaches the model: the copy is unnamed until its commit (`fs::commit`) validates it.

use std::sync::Arc;

use crate::catalog::Catalog;
use crate::content::{Bytes, Source, Write};
use crate::edit::bulk::{self, Fit};
use crate::edit::copy::{self, Copy};
use crate::error::{Error, Result};
use crate::format::layout::{FileIndex, Location};
use crate::format::safetensors;
use crate::format::sharing::TensorId;
use crate::format::target::WeightsView;

/// What a writer of a `weights.safetensors` may stream into: the snapshot it opened, and
/// the generation of the mount's changes then (`fs::external`).
#[derive(Clone)]
pub struct Start {
    pub catalog: Arc<Catalog>,
    pub view: WeightsView,
    pub generation: u64,
}

/// One tensor of the upload: its bytes in the upload, and where they go.
struct Piece {
    /// Offsets in the upload (from its start, the header included).
    begin: u64,
    end: u64,
    location: Location,
    of: TensorId,
}

pub struct Stream {
    pub start: Start,
    file: FileIndex,
    /// The upload's length, as its header declares it.
    total: u64,
    pieces: Vec<Piece>,
    /// The piece the next byte belongs to.
    next: usize,
    /// Bytes of the upload received, header included.
    received: u64,
    /// The copy; None once committed or given up, when only `file` is left to read back.
    copy: Option<Copy>,
    /// The copy's file, to read back what was received.
    file_of_copy: std::fs::File,
}

impl Stream {
    /// A stream for an upload whose first bytes, the whole header, are `head`; None when
    /// the upload cannot be streamed (it then stays staged, and its commit says what is
    /// wrong with it, if anything).
    pub fn begin(start: &Start, head: &[u8]) -> Result<Option<Stream>> {
        let catalog = &*start.catalog;
        let entries = &catalog.weights(start.view).entries;
        let Ok((header, data_len)) = safetensors::parse_declared(head) else {
            return Ok(None);
        };
        if header.data_start != head.len() as u64 {
            return Ok(None);
        }
        let Ok(fits) = bulk::match_entries(catalog, &header, entries, None) else {
            return Ok(None);
        };
        let model = &*catalog.model;
        let shared = model.shared_bytes();
        let mut pieces = Vec::with_capacity(fits.len());
        for (t, fit) in header.tensors.iter().zip(&fits) {
            let Fit::Bytes(e) = fit else {
                return Ok(None);
            };
            let in_order = pieces.last().is_none_or(|p: &Piece| {
                p.location.file == e.location.file
                    && p.location.range.end() <= e.location.range.start()
            });
            if !in_order || !shared.sharers(&e.location).is_empty() {
                return Ok(None);
            }
            pieces.push(Piece {
                begin: header.data_start + t.begin,
                end: header.data_start + t.end,
                location: e.location,
                of: e.of,
            });
        }
        let Some(file) = pieces.first().map(|p| p.location.file) else {
            return Ok(None);
        };
        let mf = &model.files[file];
        if !copy::worth_copying(data_len, mf.len()) || !copy::may_copy(mf) {
            return Ok(None);
        }
        let Some(copy) = Copy::begin(mf)? else {
            return Ok(None);
        };
        let file_of_copy = copy
            .file()?
            .try_clone()
            .map_err(|e| Error::io("duplicate the new copy", e))?;
        Ok(Some(Stream {
            start: start.clone(),
            file,
            total: header.data_start + data_len,
            pieces,
            next: 0,
            received: header.data_start,
            copy: Some(copy),
            file_of_copy,
        }))
    }

    /// The upload's length, as its header declares it.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes of the upload received, its header included.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The model file the copy replaces.
    pub fn file(&self) -> FileIndex {
        self.file
    }

    /// Whether `len` bytes at `offset` continue the upload as it declared itself.
    pub fn takes(&self, offset: u64, len: u64) -> bool {
        self.copy.is_some()
            && offset == self.received
            && offset.checked_add(len).is_some_and(|end| end <= self.total)
    }

    /// Writes the next `data` of the upload (`takes` said yes) at its tensors' places.
    pub fn write(&mut self, mut data: &[u8]) -> Result<()> {
        let copy = self
            .copy
            .as_mut()
            .ok_or_else(|| Error::invalid("the upload's copy is gone"))?;
        while !data.is_empty() {
            let p = self
                .pieces
                .get(self.next)
                .ok_or_else(|| Error::invalid("bytes past the upload's last tensor"))?;
            let within = self.received - p.begin;
            let n = (p.end - self.received).min(data.len() as u64) as usize;
            copy.write(p.location.range.start() + within, &data[..n])?;
            data = &data[n..];
            self.received += n as u64;
            if self.received == p.end {
                self.next += 1;
            }
        }
        Ok(())
    }

    /// Whether the whole upload has arrived.
    pub fn whole(&self) -> bool {
        self.received == self.total
    }

    /// Calls `out` with every byte received past the header, at its offset in the upload,
    /// read back from the copy (which goes on through the page cache).
    pub fn received_data(&mut self, mut out: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        if let Some(copy) = self.copy.as_mut() {
            copy.settle()?;
        }
        let mut buf = Vec::new();
        for p in &self.pieces {
            let upto = p.end.min(self.received);
            if upto <= p.begin {
                break;
            }
            let source = Source::File {
                file: &self.file_of_copy,
                offset: p.location.range.start(),
                len: upto - p.begin,
            };
            let mut at = p.begin;
            source
                .for_each_chunk(&mut buf, |chunk| {
                    out(at, chunk).map_err(|e| std::io::Error::other(e.to_string()))?;
                    at += chunk.len() as u64;
                    Ok(())
                })
                .map_err(|e| Error::io("read back the upload from its copy", e))?;
        }
        Ok(())
    }

    /// The writes the upload makes, every tensor it names, read from the copy (settled).
    pub fn writes(&mut self) -> Result<Vec<Write<'_>>> {
        if let Some(copy) = self.copy.as_mut() {
            copy.settle()?;
        }
        let file = &self.file_of_copy;
        Ok(self
            .pieces
            .iter()
            .map(|p| Write {
                location: p.location,
                bytes: Bytes::Staged(Source::File {
                    file,
                    offset: p.location.range.start(),
                    len: p.location.range.len(),
                }),
                of: Some(p.of),
            })
            .collect())
    }

    /// The copy, for its commit; the stream keeps its file to read back.
    pub fn take_copy(&mut self) -> Option<Copy> {
        self.copy.take()
    }
}
