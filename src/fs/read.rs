//! Reads: slices of the mapped file, or of generated text, never a copy of the file.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::tree::weights::Piece;
use crate::tree::{Content, Ino, Tree};

/// How far beyond a read the backing file is asked into the page cache. Reads copy from the
/// mapping, and a page fault on it reads only a small window of a cold file at a time.
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
            Part::Mapped { file, start, end } => {
                &self.tree.model.files[*file].bytes()[*start..*end]
            }
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
        if len < loc.range.end() || len < file.bytes().len() as u64 {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "{} shrank to {len} bytes while mounted (it was {}): refusing to read",
                    file.path.display(),
                    file.bytes().len()
                ),
            ));
        }
    }
    Ok(())
}

fn window(len: u64, offset: u64, size: u32) -> (usize, usize) {
    let start = offset.min(len);
    let end = offset.saturating_add(size as u64).min(len);
    (start as usize, end as usize)
}

/// Asks the kernel to read the backing bytes of a read, and what follows, into the page cache
/// in the background (large reads instead of one fault at a time).
pub(super) fn read_ahead(tree: &Tree, ino: Ino, offset: u64, size: u32) {
    let Some(node) = tree.node(ino) else {
        return;
    };
    let (loc, header) = match &node.content {
        Content::Range(l) => (l, 0),
        Content::Npy { header, location } => (location, header.len() as u64),
        _ => return,
    };
    let clamp = |x: u64| x.saturating_sub(header).min(loc.range.len());
    let start = clamp(offset);
    let end = clamp(
        offset
            .saturating_add(size as u64)
            .saturating_add(READ_AHEAD),
    );
    let Some(file) = tree.model.files.get(loc.file).and_then(|f| f.file.as_ref()) else {
        return;
    };
    if end > start {
        // SAFETY: an advisory call on a descriptor the snapshot keeps open.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                (loc.range.start() + start) as libc::off_t,
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
        Content::Dir(_) => {
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
            Part::Mapped {
                file: loc.file,
                start: base + s,
                end: base + e,
            }
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
                Part::Mapped {
                    file: location.file,
                    start: base + (s - h),
                    end: base + (e - h),
                }
            } else {
                // The first read straddles the generated header: join the two parts.
                let mut out = header[s..e.min(h)].to_vec();
                if e > h {
                    check_still_backed(&tree, location)?;
                    let base = location.range.start() as usize;
                    out.extend_from_slice(
                        &tree.model.files[location.file].bytes()[base..base + (e - h)],
                    );
                    // A truncation during the copy leaves zeros behind: do not serve them.
                    check_still_backed(&tree, location)?;
                }
                Part::Owned(out)
            }
        }
        Content::Dequantized { header, view } => {
            for l in std::iter::once(&view.data).chain(&view.scales) {
                check_still_backed(&tree, l)?;
            }
            let bytes = crate::tree::xnnpack::read_f32(&tree.model, view, header, offset, size)?;
            // A truncation during the reads leaves zeros behind: do not serve them.
            for l in std::iter::once(&view.data).chain(&view.scales) {
                check_still_backed(&tree, l)?;
            }
            Part::Owned(bytes)
        }
        Content::Weights(w) => {
            let pieces = w.pieces(offset, size);
            for p in &pieces {
                if let Piece::Range(l) = p {
                    check_still_backed(&tree, l)?;
                }
            }
            match pieces.as_slice() {
                // A read inside one tensor is a slice of the mapping.
                [Piece::Range(l)] => Part::Mapped {
                    file: l.file,
                    start: l.range.start() as usize,
                    end: l.range.end() as usize,
                },
                _ => {
                    let mut out = Vec::with_capacity(size as usize);
                    for p in &pieces {
                        match p {
                            Piece::Header(h) => out.extend_from_slice(h),
                            Piece::Range(l) => out.extend_from_slice(
                                &tree.model.files[l.file].bytes()[l.range.as_usize()],
                            ),
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
        Content::Text { .. } => {
            let text = tree.text(ino).expect("a text node renders");
            let (s, e) = window(text.len() as u64, offset, size);
            Part::Text {
                text,
                start: s,
                end: e,
            }
        }
    };
    Ok(ReadData { tree, part })
}
