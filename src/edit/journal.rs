//! Crash-safe in-place writes: the new bytes of every changed range go to one checksummed
//! journal beside the file (`begin`), written into an unnamed file (with direct I/O where the
//! file system allows: nothing reads it unless a crash interrupts the commit), fsynced, and
//! only then given its name; then the bytes go into the file through its descriptor
//! (fsynced), then the journal's name is removed (`Journaled::finish`). At mount, or by
//! `ptefs recover`, a whole journal is replayed and a torn one discarded, so after a crash at
//! any moment the file holds entirely the old or entirely the new bytes of every range of a
//! commit.
//!
//! Journal layout (little-endian): magic `PTEFSJ02`, u64 file size, u64 range count, per
//! range u64 offset and u64 length, then the bytes of every range in order, then a CRC-32 of
//! everything before it. (`PTEFSJ01`, one range, is the layout of earlier versions and is
//! still replayed.)
//!
//! Invariants: the journal is created with `O_EXCL | O_NOFOLLOW` (see `beside`) and removed
//! if writing it fails; at mount a journal is replayed only if it is a regular file owned by
//! the model's owner, not writable by others, exactly as long as its header declares, for a
//! file of the model's size, and covers only ranges an in-place commit may write; any other
//! journal refuses the mount and is left where it is.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::beside::{name_for, Beside};
use crate::content::Source;
use crate::error::{Error, Result};
use crate::format::range::ByteRange;
use crate::format::ModelFile;

const MAGIC: &[u8; 8] = b"PTEFSJ02";
const MAGIC_V1: &[u8; 8] = b"PTEFSJ01";
/// Magic, file size, range count.
const HEADER_LEN: u64 = 24;
const RANGE_LEN: u64 = 16;
const CRC_LEN: u64 = 4;

/// `.<name>.ptefs-journal`: the journal of file `name`.
pub fn journal_name(model_name: &OsStr) -> OsString {
    name_for(model_name, ".ptefs-journal")
}

/// The journal's path beside `path`.
pub fn journal_path(path: &Path) -> PathBuf {
    path.with_file_name(journal_name(path.file_name().unwrap_or_default()))
}

/// One range of a commit: its offset in the file and its new bytes.
pub type RangeWrite<'a> = (u64, Source<'a>);

fn encode_header(file_len: u64, writes: &[RangeWrite]) -> Vec<u8> {
    let mut h = Vec::with_capacity((HEADER_LEN + RANGE_LEN * writes.len() as u64) as usize);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&file_len.to_le_bytes());
    h.extend_from_slice(&(writes.len() as u64).to_le_bytes());
    for (offset, bytes) in writes {
        h.extend_from_slice(&offset.to_le_bytes());
        h.extend_from_slice(&bytes.len().to_le_bytes());
    }
    h
}

/// Checks that `writes` are sorted, disjoint ranges inside a file of `file_len` bytes.
fn check_ranges(writes: &[RangeWrite], file_len: u64, shown: &str) -> Result<()> {
    let mut end_of_previous = 0;
    for (offset, bytes) in writes {
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= file_len)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "write of {} bytes at {offset} reaches past the end of {shown} ({file_len} bytes)",
                    bytes.len()
                ))
            })?;
        if *offset < end_of_previous {
            return Err(Error::invalid(format!(
                "overlapping or unsorted ranges in one commit of {shown} (at {offset})"
            )));
        }
        end_of_previous = end;
    }
    Ok(())
}

/// Replaces the bytes of every range of `writes` (sorted, disjoint) in `model`'s file, which
/// must still be as long as it was mapped and still be named by its path. `exclusive()` is
/// held from the first byte written into the file until it is durable.
pub fn write_in_place<G>(
    model: &ModelFile, writes: &[RangeWrite], exclusive: impl FnOnce() -> G,
) -> Result<()> {
    begin(model, writes)?.finish(exclusive)
}

/// A commit whose journal is written and durable beside the model, and whose bytes are not
/// in the model yet. `finish` writes them and removes the journal; dropping it instead leaves
/// the journal in place, as a crash at that moment would, for `recover` to replay.
pub struct Journaled<'a> {
    model: &'a ModelFile,
    writes: &'a [RangeWrite<'a>],
    target: &'a File,
    beside: Beside<'a>,
    name: OsString,
    journal: Journal,
}

/// The first half of `write_in_place`: checks the ranges and the file, then writes the
/// journal and makes it durable under its name (nothing has the name if that fails).
pub fn begin<'a>(model: &'a ModelFile, writes: &'a [RangeWrite<'a>]) -> Result<Journaled<'a>> {
    let shown = model.path.display().to_string();
    let file_len = model.len();
    check_ranges(writes, file_len, &shown)?;
    let target = model
        .file
        .as_ref()
        .filter(|_| model.writable)
        .ok_or_else(|| Error::new(libc::EACCES, format!("{shown} was not opened for writing")))?;
    let beside = Beside::of(model)?;
    beside.check_model_named()?;
    let now = target
        .metadata()
        .map_err(|e| Error::io(format!("stat {shown}"), e))?
        .len();
    if now != file_len {
        return Err(Error::new(
            libc::EIO,
            format!("{shown} changed size behind ptefs (expected {file_len} bytes, found {now}); not writing"),
        ));
    }

    let name = journal_name(beside.model_name());
    let journal = Journal::write(&beside, &name, file_len, writes)?;
    Ok(Journaled {
        model,
        writes,
        target,
        beside,
        name,
        journal,
    })
}

impl Journaled<'_> {
    /// The second half of `write_in_place`: writes the ranges into the model and fsyncs it,
    /// then removes the journal. If writing fails, the journal keeps its name for the next
    /// recovery.
    pub fn finish<G>(self, exclusive: impl FnOnce() -> G) -> Result<()> {
        let shown = self.model.path.display();
        {
            let _readers_wait = exclusive();
            let mut result = Ok(());
            let mut buf = Vec::new();
            for (offset, bytes) in self.writes {
                result = bytes.write_to(self.target, *offset, &mut buf);
                if result.is_err() {
                    break;
                }
            }
            result.and_then(|_| self.target.sync_data()).map_err(|e| {
                Error::io(
                    format!("write {} range(s) into {shown}", self.writes.len()),
                    e,
                )
            })?;
        }
        self.journal.retire(&self.beside, &self.name)
    }
}

/// A whole, durable journal under its name.
struct Journal {
    file: File,
}

impl Journal {
    /// Writes the journal of `writes` and makes it durable under `name`: written into an
    /// unnamed file, made durable, then named, so no torn journal ever has the name; where
    /// the file system has no unnamed files, written into a file created under `name`, which
    /// is removed again if writing fails.
    fn write(
        beside: &Beside, name: &OsStr, file_len: u64, writes: &[RangeWrite],
    ) -> Result<Journal> {
        let context = |e: Error| e.context(format!("journal {}", beside.shown(name)));
        // Where no unnamed file can be made, the named file below says why it cannot either.
        if let Some(file) = beside.create_unnamed().ok().flatten() {
            write_journal(&file, file_len, writes).map_err(context)?;
            if beside.link(&file, name).map_err(context)? {
                if let Err(e) = beside.sync() {
                    let _ = beside.remove(name);
                    return Err(context(e));
                }
                return Ok(Journal { file });
            }
        }
        let file = beside.create(name)?;
        let written = write_journal(&file, file_len, writes).and_then(|_| beside.sync());
        if let Err(e) = written {
            // A torn journal must not stay behind (it would only be discarded at the next
            // mount, and until then `ptefs check` reports it).
            let _ = beside.remove(name);
            return Err(context(e));
        }
        Ok(Journal { file })
    }

    /// Removes the journal's name once the commit is durable. The file itself is closed on
    /// another thread: freeing its blocks is the slow part of removing it, and nothing needs
    /// to wait for it (with no thread to be had, it is closed here).
    fn retire(self, beside: &Beside, name: &OsStr) -> Result<()> {
        beside.remove(name)?;
        let file = self.file;
        let _ = std::thread::Builder::new()
            .name("ptefs-journal-close".into())
            .spawn(move || drop(file));
        Ok(())
    }
}

/// Writes the journal into the empty file `j` and makes its bytes durable. The bytes go
/// straight to the disk when the file system allows (nothing reads them unless a crash
/// interrupts the commit, so a copy in the page cache would be wasted work: measured, the
/// swap of a 64 MiB tensor took 1.8x less time), else through the page cache, from the
/// start again.
fn write_journal(j: &File, file_len: u64, writes: &[RangeWrite]) -> Result<()> {
    let header = encode_header(file_len, writes);
    let io = |e| Error::io("write", e);
    match write_direct(j, &header, writes) {
        Ok(()) => {}
        // A direct attempt writes a prefix of the same bytes: the rewrite covers it.
        Err(e) if super::direct::unsupported(&e) => {
            write_buffered(j, &header, writes).map_err(io)?
        }
        Err(e) => return Err(io(e)),
    }
    // Data and size; the file's times need not be durable.
    j.sync_data().map_err(|e| Error::io("fsync", e))
}

fn write_direct(j: &File, header: &[u8], writes: &[RangeWrite]) -> std::io::Result<()> {
    let mut crc = crc32fast::Hasher::new();
    let mut w = super::direct::DirectWriter::new(j)?;
    w.append(Source::Memory(header), Some(&mut crc))?;
    for (_, bytes) in writes {
        w.append(*bytes, Some(&mut crc))?;
    }
    w.append(Source::Memory(&crc.finalize().to_le_bytes()), None)?;
    w.finish().map(|_| ())
}

fn write_buffered(j: &File, header: &[u8], writes: &[RangeWrite]) -> std::io::Result<()> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(header);
    j.write_all_at(header, 0)?;
    let mut at = header.len() as u64;
    // One pass over each range: what is checksummed is what is written.
    let mut buf = Vec::new();
    for (_, bytes) in writes {
        bytes.for_each_chunk(&mut buf, |chunk| {
            crc.update(chunk);
            j.write_all_at(chunk, at)?;
            at += chunk.len() as u64;
            Ok(())
        })?;
    }
    j.write_all_at(&crc.finalize().to_le_bytes(), at)
}

/// What `recover` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    None,
    Replayed { ranges: usize, bytes: u64 },
    Discarded(String),
}

/// A parsed journal: the model size it was written for and its ranges.
struct Parsed {
    file_len: u64,
    ranges: Vec<ByteRange>,
    data_start: u64,
}

/// Why a journal is not replayed.
enum Verdict {
    /// Written by an interrupted commit that did not finish writing it: discard it.
    Torn(String),
    /// Not something a commit of this file can have written: leave it and refuse.
    Untrusted(String),
}

/// Reads a journal's header, checking it against the model (a file of `file_len` bytes whose
/// in-place writable ranges are `writable`) and the journal's own size.
fn parse_header(
    j: &File, size: u64, file_len: u64, writable: &[ByteRange],
) -> std::result::Result<Parsed, Verdict> {
    let torn = |what: String| Verdict::Torn(what);
    let untrusted = |what: String| Verdict::Untrusted(what);
    let mut head = [0u8; HEADER_LEN as usize];
    if size < 8 {
        return Err(torn(format!("{size} bytes, no complete header")));
    }
    let n = j
        .read_at(&mut head, 0)
        .map_err(|e| untrusted(format!("cannot read it: {e}")))?;
    let magic = &head[..8];
    let v1 = magic == MAGIC_V1;
    if magic != MAGIC && !v1 {
        return Err(untrusted(format!(
            "it does not start with {} (found {})",
            String::from_utf8_lossy(MAGIC),
            crate::format::header::printable(magic)
        )));
    }
    if (n as u64) < HEADER_LEN {
        return Err(torn(format!("{size} bytes, no complete header")));
    }
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let journal_file_len = u64_at(&head, 8);
    if journal_file_len != file_len {
        return Err(untrusted(format!(
            "it is for a file of {journal_file_len} bytes, the model has {file_len}"
        )));
    }
    let mut ranges = Vec::new();
    let data_start;
    if v1 {
        // One range: offset at 16, length at 24.
        let mut rest = [0u8; 8];
        if size < 32
            || j.read_at(&mut rest, 24)
                .map_err(|e| untrusted(e.to_string()))?
                < 8
        {
            return Err(torn(format!("{size} bytes, no complete header")));
        }
        let (offset, len) = (u64_at(&head, 16), u64::from_le_bytes(rest));
        ranges.push((offset, len));
        data_start = 32;
    } else {
        let count = u64_at(&head, 16);
        // Ranges are disjoint and inside the file: there cannot be more than its bytes.
        if count > file_len.max(1) {
            return Err(untrusted(format!(
                "it declares {count} ranges for a file of {file_len} bytes"
            )));
        }
        let table_len = count * RANGE_LEN;
        data_start = HEADER_LEN + table_len;
        if size < data_start {
            return Err(torn(format!("{size} bytes, shorter than its range table")));
        }
        let mut table = vec![0u8; table_len as usize];
        j.read_exact_at(&mut table, HEADER_LEN)
            .map_err(|e| untrusted(format!("cannot read it: {e}")))?;
        for k in 0..count as usize {
            ranges.push((u64_at(&table, k * 16), u64_at(&table, k * 16 + 8)));
        }
    }
    let mut out = Vec::with_capacity(ranges.len());
    let mut data_len = 0u64;
    let mut end_of_previous = 0;
    for (offset, len) in ranges {
        let r = ByteRange::new(offset, len)
            .filter(|r| r.end() <= file_len && offset >= end_of_previous)
            .ok_or_else(|| {
                untrusted(format!(
                    "range {offset}+{len} is outside the file or out of order"
                ))
            })?;
        if !writable
            .iter()
            .any(|w| w.start() <= r.start() && r.end() <= w.end())
        {
            return Err(untrusted(format!(
                "range {offset}+{len} covers bytes no in-place commit writes (outside every segment and inline payload)"
            )));
        }
        end_of_previous = r.end();
        data_len += len;
        out.push(r);
    }
    let declared = data_start + data_len + CRC_LEN;
    if size > declared {
        return Err(untrusted(format!(
            "{size} bytes, more than the {declared} its header declares"
        )));
    }
    if size < declared {
        return Err(torn(format!("{size} bytes, expected {declared}")));
    }
    Ok(Parsed {
        file_len,
        ranges: out,
        data_start,
    })
}

/// What a journal beside a model file holds, found without changing anything.
#[derive(Debug, PartialEq, Eq)]
pub enum Pending {
    /// A whole journal, which `recover` (or a mount) replays.
    Whole { ranges: usize, bytes: u64 },
    /// A journal whose writing was interrupted, which `recover` discards.
    Torn(String),
}

/// A journal read and judged against the model file it sits beside.
enum Found {
    Whole { parsed: Parsed, all: Vec<u8> },
    Torn(String),
}

/// Reads the journal of `model` (known as `path`) through `beside`, if there is one. An
/// error is a refusal: the journal is not one this file's commits can have written.
fn examine(path: &Path, model: &ModelFile, beside: &Beside) -> Result<Option<Found>> {
    let name = journal_name(beside.model_name());
    let shown = beside.shown(&name);
    let refuse = |why: String| {
        Error::new(
            libc::EPERM,
            format!("{shown}: not replayed: {why}; it was left in place (remove it if it is not from an interrupted ptefs commit)"),
        )
    };
    let Some(j) = beside
        .open_existing(&name)
        .map_err(|e| refuse(e.message().to_string()))?
    else {
        return Ok(None);
    };
    let meta = j
        .metadata()
        .map_err(|e| Error::io(format!("stat {shown}"), e))?;
    if !meta.file_type().is_file() {
        return Err(refuse("it is not a regular file".into()));
    }
    let model_meta = model
        .file
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .ok_or_else(|| Error::new(libc::EIO, format!("cannot stat {}", path.display())))?;
    if meta.uid() != model_meta.uid() {
        return Err(refuse(format!(
            "it belongs to uid {}, the model to uid {}",
            meta.uid(),
            model_meta.uid()
        )));
    }
    if meta.mode() & 0o002 != 0 {
        return Err(refuse(format!(
            "anyone may write it (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    let file_len = model.len();
    let parsed = match parse_header(&j, meta.len(), file_len, &model.writable_ranges()) {
        Ok(p) => p,
        Err(Verdict::Untrusted(why)) => return Err(refuse(why)),
        Err(Verdict::Torn(why)) => return Ok(Some(Found::Torn(format!("torn journal: {why}")))),
    };
    // Bounded: the header was checked against the file's size above.
    let mut all = Vec::with_capacity(meta.len() as usize);
    (&j).take(meta.len())
        .read_to_end(&mut all)
        .map_err(|e| Error::io(format!("read {shown}"), e))?;
    if all.len() as u64 != meta.len() {
        return Ok(Some(Found::Torn(
            "torn journal: it changed while being read".into(),
        )));
    }
    let body_end = all.len() - CRC_LEN as usize;
    let sum = u32::from_le_bytes(all[body_end..].try_into().expect("4 bytes"));
    if crc32fast::hash(&all[..body_end]) != sum {
        return Ok(Some(Found::Torn("torn journal: checksum mismatch".into())));
    }
    Ok(Some(Found::Whole { parsed, all }))
}

/// The journal beside `path`, judged as `recover` would judge it, without writing: `None`
/// when there is none, an error when `recover` would refuse it (naming it and why).
pub fn pending(path: &Path) -> Result<Option<Pending>> {
    if std::fs::symlink_metadata(journal_path(path)).is_err() {
        return Ok(None);
    }
    let model = ModelFile::open(path)
        .map_err(|e| Error::from(e).context("cannot check the journal of an interrupted commit"))?;
    let beside = Beside::of(&model)?;
    Ok(match examine(path, &model, &beside)? {
        None => None,
        Some(Found::Torn(why)) => Some(Pending::Torn(why)),
        Some(Found::Whole { parsed, .. }) => Some(Pending::Whole {
            ranges: parsed.ranges.len(),
            bytes: parsed.ranges.iter().map(|r| r.len()).sum(),
        }),
    })
}

/// Replays or discards a journal left beside `path` by an interrupted commit, or refuses
/// (an error naming the journal and why) when it is not one this file's commits wrote.
pub fn recover(path: &Path) -> Result<Recovery> {
    if std::fs::symlink_metadata(journal_path(path)).is_err() {
        return Ok(Recovery::None);
    }
    let model = ModelFile::open_writable(path)
        .map_err(|e| Error::from(e).context("cannot check the journal of an interrupted commit"))?;
    let beside = Beside::of(&model)?;
    let name = journal_name(beside.model_name());
    let shown = beside.shown(&name);
    let (parsed, all) = match examine(path, &model, &beside)? {
        None => return Ok(Recovery::None),
        Some(Found::Torn(why)) => return discard(&beside, &name, why),
        Some(Found::Whole { parsed, all }) => (parsed, all),
    };
    let target = model
        .file
        .as_ref()
        .filter(|_| model.writable)
        .ok_or_else(|| {
            Error::new(
                libc::EACCES,
                format!("{} cannot be opened for writing", path.display()),
            )
        })?;
    debug_assert_eq!(parsed.file_len, model.len());
    let mut at = parsed.data_start as usize;
    let mut bytes = 0;
    for r in &parsed.ranges {
        let data = &all[at..at + r.len() as usize];
        target
            .write_all_at(data, r.start())
            .map_err(|e| Error::io(format!("replay {shown} into {}", path.display()), e))?;
        at += r.len() as usize;
        bytes += r.len();
    }
    target
        .sync_data()
        .map_err(|e| Error::io(format!("fsync {}", path.display()), e))?;
    beside.remove(&name)?;
    beside.sync()?;
    Ok(Recovery::Replayed {
        ranges: parsed.ranges.len(),
        bytes,
    })
}

fn discard(beside: &Beside, name: &OsStr, why: String) -> Result<Recovery> {
    beside.remove(name)?;
    beside.sync()?;
    Ok(Recovery::Discarded(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real model file (the fixture) copied into a temporary directory.
    fn model_copy() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pte");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/linear.pte");
        std::fs::copy(src, &p).unwrap();
        (dir, p)
    }

    fn journal_bytes(file_len: u64, writes: &[RangeWrite]) -> Vec<u8> {
        let mut j = encode_header(file_len, writes);
        for (_, b) in writes {
            j.extend_from_slice(&b.head(b.len()).unwrap());
        }
        let sum = crc32fast::hash(&j);
        j.extend_from_slice(&sum.to_le_bytes());
        j
    }

    fn segment(p: &Path) -> ByteRange {
        ModelFile::open(p).unwrap().writable_ranges()[0]
    }

    #[test]
    fn in_place_write_leaves_no_journal() {
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let model = ModelFile::open_writable(&p).unwrap();
        let before = std::fs::read(&p).unwrap();
        write_in_place(&model, &[(seg.start(), Source::Memory(&[7u8; 4]))], || ()).unwrap();
        let got = std::fs::read(&p).unwrap();
        assert_eq!(
            &got[seg.start() as usize..seg.start() as usize + 4],
            &[7u8; 4]
        );
        assert_eq!(got.len(), before.len());
        assert!(std::fs::symlink_metadata(journal_path(&p)).is_err());
        assert_eq!(recover(&p).unwrap(), Recovery::None);
    }

    #[test]
    fn whole_journal_is_replayed_and_torn_one_discarded() {
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let len = std::fs::metadata(&p).unwrap().len();
        let original = std::fs::read(&p).unwrap();
        let new = [9u8; 4];
        let j = journal_bytes(len, &[(seg.start(), Source::Memory(&new))]);
        for cut in 0..j.len() {
            std::fs::write(journal_path(&p), &j[..cut]).unwrap();
            assert!(
                matches!(recover(&p).unwrap(), Recovery::Discarded(_)),
                "cut {cut}"
            );
            assert_eq!(std::fs::read(&p).unwrap(), original);
            assert!(std::fs::symlink_metadata(journal_path(&p)).is_err());
        }
        std::fs::write(journal_path(&p), &j).unwrap();
        assert_eq!(
            recover(&p).unwrap(),
            Recovery::Replayed {
                ranges: 1,
                bytes: 4
            }
        );
        let s = seg.start() as usize;
        assert_eq!(&std::fs::read(&p).unwrap()[s..s + 4], &new);
        assert!(std::fs::symlink_metadata(journal_path(&p)).is_err());
    }

    #[test]
    fn untrusted_journals_refuse_and_stay() {
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let len = std::fs::metadata(&p).unwrap().len();
        let original = std::fs::read(&p).unwrap();
        let jp = journal_path(&p);
        let refused = |why: &str| {
            let e = recover(&p).unwrap_err();
            assert!(e.message().contains(why), "{e}");
            assert!(std::fs::symlink_metadata(&jp).is_ok(), "{why}: removed");
            assert_eq!(std::fs::read(&p).unwrap(), original, "{why}: replayed");
            let _ = std::fs::remove_file(&jp);
        };
        // The header of the file itself: not a range any commit writes.
        std::fs::write(&jp, journal_bytes(len, &[(0, Source::Memory(&[0u8; 8]))])).unwrap();
        refused("no in-place commit writes");
        // Longer than declared.
        let mut long = journal_bytes(len, &[(seg.start(), Source::Memory(&[1u8; 4]))]);
        long.extend_from_slice(&[0; 100]);
        std::fs::write(&jp, long).unwrap();
        refused("more than");
        // Another file size.
        std::fs::write(
            &jp,
            journal_bytes(len + 1, &[(seg.start(), Source::Memory(&[1u8; 4]))]),
        )
        .unwrap();
        refused("the model has");
        // Not ours.
        std::fs::write(&jp, b"something else entirely").unwrap();
        refused("does not start with");
        // World-writable.
        std::fs::write(
            &jp,
            journal_bytes(len, &[(seg.start(), Source::Memory(&[1u8; 4]))]),
        )
        .unwrap();
        std::fs::set_permissions(&jp, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        refused("anyone may write");
        // A link to another file, and a FIFO (which must not hang the mount).
        std::os::unix::fs::symlink("/dev/zero", &jp).unwrap();
        refused("symbolic link");
        let c = std::ffi::CString::new(jp.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        refused("not a regular file");
    }

    #[test]
    fn a_planted_journal_name_blocks_the_commit_and_is_not_written() {
        let (d, p) = model_copy();
        let seg = segment(&p);
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, journal_path(&p)).unwrap();
        let model = ModelFile::open_writable(&p).unwrap();
        let before = std::fs::read(&p).unwrap();
        let e =
            write_in_place(&model, &[(seg.start(), Source::Memory(&[7u8; 4]))], || ()).unwrap_err();
        assert_eq!(e.errno(), libc::EEXIST, "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&p).unwrap(), before);
    }

    #[test]
    fn refuses_when_the_file_was_replaced_or_changed_size() {
        let (d, p) = model_copy();
        let seg = segment(&p);
        let model = ModelFile::open_writable(&p).unwrap();
        // Same size, other file, renamed over the model's name.
        let other = d.path().join("other");
        std::fs::copy(&p, &other).unwrap();
        std::fs::rename(&other, &p).unwrap();
        let e =
            write_in_place(&model, &[(seg.start(), Source::Memory(&[1u8; 4]))], || ()).unwrap_err();
        assert_eq!(e.errno(), libc::ESTALE, "{e}");
        let model = ModelFile::open_writable(&p).unwrap();
        let f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.set_len(model.len() + 10).unwrap();
        let e =
            write_in_place(&model, &[(seg.start(), Source::Memory(&[1u8; 4]))], || ()).unwrap_err();
        assert!(e.message().contains("changed size"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Any bytes where a journal would be: recovery never panics, never writes outside
        /// the ranges a commit may write, and removes only journals it replayed or found
        /// torn.
        #[test]
        fn any_journal_bytes_are_replayed_discarded_or_refused(
            flips in proptest::collection::vec((0usize..200, proptest::prelude::any::<u8>()), 0..6),
            cut in proptest::option::of(0usize..200),
            garbage in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120)),
        ) {
            let (_d, p) = model_copy();
            let seg = segment(&p);
            let len = std::fs::metadata(&p).unwrap().len();
            let original = std::fs::read(&p).unwrap();
            let mut j = match garbage {
                Some(g) => g,
                None => journal_bytes(len, &[(seg.start(), Source::Memory(&[5u8; 4]))]),
            };
            for (at, x) in flips {
                if let Some(b) = j.get_mut(at) {
                    *b ^= x;
                }
            }
            if let Some(c) = cut {
                j.truncate(c);
            }
            std::fs::write(journal_path(&p), &j).unwrap();
            let result = recover(&p);
            let now = std::fs::read(&p).unwrap();
            let present = std::fs::symlink_metadata(journal_path(&p)).is_ok();
            match result {
                Ok(Recovery::Replayed { .. }) => {
                    proptest::prop_assert!(!present);
                    for (i, (a, b)) in original.iter().zip(&now).enumerate() {
                        if a != b {
                            proptest::prop_assert!(seg.start() <= i as u64 && (i as u64) < seg.end());
                        }
                    }
                }
                Ok(_) => {
                    proptest::prop_assert!(!present);
                    proptest::prop_assert_eq!(&now, &original);
                }
                Err(_) => {
                    proptest::prop_assert!(present);
                    proptest::prop_assert_eq!(&now, &original);
                }
            }
        }
    }
}
