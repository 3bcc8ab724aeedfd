//! Reads: slices of the mapped file, or of generated text, never a copy of the file; and,
//! for copying a whole file into staged content, reads through the model's descriptors.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::catalog::Piece;
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::tree::{Content, Ino, Tree};

/// How far ahead of a sequential reader the backing file is asked into the page cache, and
/// the size of the windows that are asked for. Reads copy from the mapping, and a page fault
/// on it reads only a small window of a cold file at a time.
const READ_AHEAD: u64 = 8 << 20;

/// The bytes of one read; holds the snapshot so the mapping outlives the reply.
pub struct ReadData {
    tree: Arc<Tree>,
    part: Part,
}

enum Part {
    Mapped {
        file: usize,
        start: usize,
        end: usize,
    },
    Text {
        text: Arc<[u8]>,
        start: usize,
        end: usize,
    },
    Owned(Vec<u8>),
}

impl ReadData {
    pub(super) fn owned(tree: Arc<Tree>, bytes: Vec<u8>) -> ReadData {
        ReadData {
            tree,
            part: Part::Owned(bytes),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.part {
            Part::Mapped { file, start, end } => self.tree.model.files[*file]
                .mapped()
                .and_then(|m| m.get(*start..*end))
                .unwrap_or_default(),
            Part::Text { text, start, end } => &text[*start..*end],
            Part::Owned(v) => v,
        }
    }
}

/// Fails with EIO when another process truncated the backing file below `end`: touching
/// those mapped pages would raise SIGBUS.
fn check_still_backed(tree: &Tree, loc: &Location) -> Result<()> {
    let file = &tree.model.files[loc.file];
    if file.poisoned() {
        return Err(Error::new(
            libc::EIO,
            format!(
                "{} shrank while mounted: its mapped bytes are gone; remount it",
                file.path.display()
            ),
        ));
    }
    if let Some(f) = &file.file {
        let len = f.metadata().map(|m| m.len()).map_err(|e| {
            Error::new(
                libc::EIO,
                format!("{}: cannot stat: {e}", file.path.display()),
            )
        })?;
        if len < loc.range.end() || len < file.len() {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "{} shrank to {len} bytes while mounted (it was {}): refusing to read",
                    file.path.display(),
                    file.len()
                ),
            ));
        }
    }
    Ok(())
}

/// Bytes `range` of model file `file`, read (or copied from its mapping) for a reader of a
/// tree file whose bytes end at `limit` (a remote source reads ahead no further); a failure
/// is EIO.
fn read_range(
    tree: &Tree, file: usize, range: crate::format::range::ByteRange, limit: u64,
) -> Result<std::borrow::Cow<'_, [u8]>> {
    tree.model.files[file]
        .read_within(range, limit)
        .map_err(|e| Error::new(libc::EIO, e.to_string()))
}

/// Bytes `start..end` of model file `file` as a reply: a slice of the mapping when the file
/// is mapped (nothing copied), else the bytes read (`limit` as in `read_range`).
fn range_part(tree: &Arc<Tree>, file: usize, start: usize, end: usize, limit: u64) -> Result<Part> {
    if tree.model.files[file].mapped().is_some() {
        return Ok(Part::Mapped { file, start, end });
    }
    let range = crate::format::range::ByteRange::new(start as u64, (end - start) as u64)
        .ok_or_else(|| Error::new(libc::EIO, "a read range overflows"))?;
    Ok(Part::Owned(
        read_range(tree, file, range, limit)?.into_owned(),
    ))
}

fn window(len: u64, offset: u64, size: u32) -> (usize, usize) {
    let start = offset.min(len);
    let end = offset.saturating_add(size as u64).min(len);
    (start as usize, end as usize)
}

/// The backing bytes a read of `ino` touches, and where the bytes a sequential reader of
/// the same node reads next end: (file, start, end, limit), offsets in the file.
fn backing_span(tree: &Tree, ino: Ino, offset: u64, size: u32) -> Option<(usize, u64, u64, u64)> {
    let node = tree.node(ino)?;
    let range = |loc: &Location, header: u64| {
        let clamp = |x: u64| loc.range.start() + x.saturating_sub(header).min(loc.range.len());
        let end = offset.saturating_add(size as u64);
        (loc.file, clamp(offset), clamp(end), loc.range.end())
    };
    match &node.content {
        Content::Range(l) => Some(range(l, 0)),
        Content::Npy { header, location } => Some(range(location, header.len() as u64)),
        // The tensors of a `weights.safetensors` follow each other in file order, file by
        // file: what follows a read is in the file its first range is in.
        Content::Weights { view } => {
            let w = tree.weights(*view);
            let pieces = w.pieces(offset, size);
            let mut ranges = pieces.iter().filter_map(|p| match p {
                Piece::Range(l) => Some(*l),
                Piece::Header(_) => None,
            });
            let first = ranges.next()?;
            let last = ranges.rfind(|l| l.file == first.file).unwrap_or(first);
            // Sorted by offset within a file: its last tensor ends the bytes it shows.
            let limit = w
                .entries
                .iter()
                .rev()
                .find(|e| e.location.file == first.file)?
                .location
                .range
                .end();
            Some((first.file, first.range.start(), last.range.end(), limit))
        }
        _ => None,
    }
}

/// Whether the first and the last page of `[start, end)` of a mapped file are in the page
/// cache (then the bytes most likely are: they were read or written together).
fn cached(mapped: &[u8], start: u64, end: u64) -> bool {
    const PAGE: usize = 4096;
    if end <= start || end as usize > mapped.len() {
        return false;
    }
    let base = mapped.as_ptr() as usize;
    [start as usize, end as usize - 1].iter().all(|&at| {
        let page = (base + at) / PAGE * PAGE;
        let mut vec = 0u8;
        // SAFETY: `page` lies in the mapping (the page holding byte `at` of it, which starts
        // page-aligned), and mincore writes one byte for one page.
        let rc = unsafe { libc::mincore(page as *mut libc::c_void, PAGE, &mut vec) };
        rc == 0 && vec & 1 == 1
    })
}

/// Asks the kernel to read what follows a read into the page cache in the background (large
/// reads instead of one fault at a time), once per `READ_AHEAD` window of the backing file:
/// the first read of a file asks for the rest of its window and the next one, and a read
/// that starts a window, or crosses into one, asks for the window after it, unless that
/// window is cached already. Asking on every request, as far ahead each time, cost 10-20% of
/// cold read throughput when the bytes were cached; asking only for what is not cached keeps
/// the gain of reading ahead from the disk (2x for `weights.safetensors` after
/// `drop_caches`, which had none) without that cost.
pub(super) fn read_ahead(tree: &Tree, ino: Ino, offset: u64, size: u32) {
    let Some((file, first, last, limit)) = backing_span(tree, ino, offset, size) else {
        return;
    };
    if last <= first {
        return;
    }
    // The first window boundary after the read.
    let next = ((last - 1) / READ_AHEAD + 1) * READ_AHEAD;
    let (start, end) = if offset == 0 {
        // The first read of a file: the rest of its window and the next one.
        (first, next.saturating_add(READ_AHEAD).min(limit))
    } else if first % READ_AHEAD == 0 || first / READ_AHEAD != (last - 1) / READ_AHEAD {
        (next, next.saturating_add(READ_AHEAD).min(limit))
    } else {
        return;
    };
    let Some(model_file) = tree.model.files.get(file) else {
        return;
    };
    let Some(file) = model_file.file.as_ref() else {
        return;
    };
    // Asking for bytes already cached is not free: it walks the page cache over them.
    if model_file.mapped().is_none_or(|m| cached(m, start, end)) {
        return;
    }
    if end > start {
        // SAFETY: an advisory call on a descriptor the snapshot keeps open.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                start as libc::off_t,
                (end - start) as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
    }
}

pub fn read(tree: Arc<Tree>, ino: Ino, offset: u64, size: u32) -> Result<ReadData> {
    let node = tree
        .node(ino)
        .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
    let part = match &node.content {
        Content::Dir(_) | Content::LazyDir(_) => {
            return Err(Error::new(
                libc::EISDIR,
                format!("{} is a directory", tree.path(ino)),
            ))
        }
        Content::Range(loc) => {
            let (s, e) = window(loc.range.len(), offset, size);
            if s < e {
                check_still_backed(&tree, loc)?;
            }
            let base = loc.range.start() as usize;
            range_part(&tree, loc.file, base + s, base + e, loc.range.end())?
        }
        Content::Npy { header, location } => {
            let total = header.len() as u64 + location.range.len();
            let (s, e) = window(total, offset, size);
            let h = header.len();
            if s >= h {
                if s < e {
                    check_still_backed(&tree, location)?;
                }
                let base = location.range.start() as usize;
                range_part(
                    &tree,
                    location.file,
                    base + (s - h),
                    base + (e - h),
                    location.range.end(),
                )?
            } else {
                // The first read straddles the generated header: join the two parts.
                let mut out = header[s..e.min(h)].to_vec();
                if e > h {
                    check_still_backed(&tree, location)?;
                    let base = location.range.start();
                    let range = location.range.slice_from(0, (e - h) as u64);
                    debug_assert_eq!(range.start(), base);
                    out.extend_from_slice(&read_range(
                        &tree,
                        location.file,
                        range,
                        location.range.end(),
                    )?);
                    // A truncation during the copy leaves zeros behind: do not serve them.
                    check_still_backed(&tree, location)?;
                }
                Part::Owned(out)
            }
        }
        Content::FloatView { header, view } => {
            for l in view.sources() {
                check_still_backed(&tree, &l)?;
            }
            let bytes = crate::backend::view::read_f32(&tree.model, view, header, offset, size)?;
            // A truncation during the reads leaves zeros behind: do not serve them.
            for l in view.sources() {
                check_still_backed(&tree, &l)?;
            }
            Part::Owned(bytes)
        }
        Content::Weights { view } => {
            let w = tree.weights(*view);
            let pieces = w.pieces(offset, size);
            // The tensors follow each other in file order: the last one ends the bytes
            // the file shows.
            let limit = w.entries.last().map_or(0, |e| e.location.range.end());
            for p in &pieces {
                if let Piece::Range(l) = p {
                    check_still_backed(&tree, l)?;
                }
            }
            match pieces.as_slice() {
                // A read inside one tensor is a slice of the mapping.
                [Piece::Range(l)] => range_part(
                    &tree,
                    l.file,
                    l.range.start() as usize,
                    l.range.end() as usize,
                    limit.max(l.range.end()),
                )?,
                _ => {
                    let mut out = Vec::with_capacity(size as usize);
                    for p in &pieces {
                        match p {
                            Piece::Header(h) => out.extend_from_slice(h),
                            Piece::Range(l) => out.extend_from_slice(&read_range(
                                &tree,
                                l.file,
                                l.range,
                                limit.max(l.range.end()),
                            )?),
                        }
                    }
                    for p in &pieces {
                        if let Piece::Range(l) = p {
                            check_still_backed(&tree, l)?;
                        }
                    }
                    Part::Owned(out)
                }
            }
        }
        Content::Named(f) => {
            // Computed from the stored tensors: not from a file that shrank under its mapping.
            let sources = tree.reads(ino);
            for l in &sources {
                check_still_backed(&tree, l)?;
            }
            let bytes = tree.named_read(*f, offset, size)?;
            for l in &sources {
                check_still_backed(&tree, l)?;
            }
            Part::Owned(bytes)
        }
        Content::Text { .. } => {
            // A histogram reads tensor bytes: not from a file that shrank under its mapping.
            for l in tree.reads(ino) {
                check_still_backed(&tree, &l)?;
            }
            let (text, start, end) = tree.text_window(ino, offset, size)?;
            Part::Text { text, start, end }
        }
    };
    Ok(ReadData { tree, part })
}

/// The pieces of bytes `[offset, offset + size)` of a file that is `header` followed by the
/// bytes at `loc`.
fn pieces_of<'a>(loc: &Location, header: &'a [u8], offset: u64, size: u32) -> Vec<Piece<'a>> {
    let h = header.len() as u64;
    let (s, e) = window(h + loc.range.len(), offset, size);
    let (s, e) = (s as u64, e as u64);
    let mut pieces = Vec::new();
    if s < h {
        pieces.push(Piece::Header(&header[s as usize..e.min(h) as usize]));
    }
    if e > h {
        let from = s.max(h) - h;
        pieces.push(Piece::Range(Location {
            file: loc.file,
            range: loc.range.slice_from(from, e - h - from),
        }));
    }
    pieces
}

/// The bytes `read` gives, for copying a whole tree file into staged content: the model's
/// bytes are read through the file descriptors, not the mappings, so copying a GiB tensor or
/// `weights.safetensors` (a write open without `O_TRUNC`) leaves none of its pages resident
/// in the daemon. Generated files are read as `read` reads them.
pub fn read_for_copy(tree: Arc<Tree>, ino: Ino, offset: u64, size: u32) -> Result<ReadData> {
    let node = tree
        .node(ino)
        .ok_or_else(|| Error::not_found(format!("inode {ino}")))?;
    let pieces = match &node.content {
        Content::Range(l) => pieces_of(l, &[], offset, size),
        Content::Npy { header, location } => pieces_of(location, header, offset, size),
        Content::Weights { view } => tree.weights(*view).pieces(offset, size),
        _ => return read(tree.clone(), ino, offset, size),
    };
    let mut out = Vec::with_capacity(size as usize);
    for p in &pieces {
        match p {
            Piece::Header(h) => out.extend_from_slice(h),
            Piece::Range(l) => {
                check_still_backed(&tree, l)?;
                let file = &tree.model.files[l.file];
                let start = out.len();
                out.resize(start + l.range.len() as usize, 0);
                match &file.file {
                    Some(f) => std::os::unix::fs::FileExt::read_exact_at(
                        f,
                        &mut out[start..],
                        l.range.start(),
                    )
                    .map_err(|e| {
                        Error::new(
                            libc::EIO,
                            format!("{}: cannot read: {e}", file.path.display()),
                        )
                    })?,
                    None => out[start..].copy_from_slice(&read_range(
                        &tree,
                        l.file,
                        l.range,
                        l.range.end(),
                    )?),
                }
            }
        }
    }
    Ok(ReadData::owned(tree.clone(), out))
}
