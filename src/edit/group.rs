//! Commits of several files at once (a bulk update through the root `weights.safetensors`
//! of a `.pte` mounted with data files, `ptefs apply --data`): one commit, all old or all
//! new across every file it touches, also after a crash (docs/writes.md#commits-of-several-files).
//!
//! The commit: every re-laid-out file's new file is written, checked, named beside its
//! model and made durable; then every file gets a journal (`journal::begin_member`; none
//! for a file without changes), each holding the same group record: every member's path,
//! inode and size, and for a re-laid-out member its new file's name, inode and size; a
//! journal is named only once whole and durable. The commit point is the last journal
//! named: only then are bytes written into the files (fsynced) and new files renamed over
//! their models, and only once all of that is durable are the journals removed.
//!
//! Invariants: while every member's journal of a group is beside its file, whole and with
//! the same record, the files may hold a mix and recovery of any member finishes the whole
//! group (replays every journal, completes every rename) before it removes a journal; when
//! one is missing, torn or another commit's, the commit never reached its commit point or
//! had finished and was removing them, so every file holds all old or all new bytes, and
//! recovery only discards the journal of the file it recovers. A member that is missing or
//! is no longer the file the commit was written for refuses recovery: nothing is guessed or
//! changed. The record is bounded (`MAX_RECORD`) before it is read and parsed with checked
//! lengths; every member's journal is judged by the trust rules of `journal` against its
//! own file, and a new file is renamed only when it is the regular file of the model's
//! owner the record names (inode and size), which nobody else may write.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use super::beside::{Beside, NAME_MAX};
use super::journal::{self, examine, journal_name, Found, Layout, RangeRules, Recovery};
use super::plan::Change;
use super::relayout::{self, Prepared};
use super::{trust, FileWatcher};
use crate::content::Write;
use crate::error::{Error, Result};
use crate::format::layout::FileIndex;
use crate::format::{Model, ModelFile};

/// The largest group record a journal may declare: far more than any model's files need.
pub const MAX_RECORD: u64 = 1 << 20;
/// The most files one commit may change.
pub const MAX_MEMBERS: u32 = 4096;
/// The longest member path (Linux's `PATH_MAX`).
const PATH_MAX: usize = 4096;
const ID_LEN: usize = 16;

/// The files of one commit, as every member's journal records them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Random: tells this commit's journals from any other's.
    pub id: [u8; ID_LEN],
    pub members: Vec<Member>,
}

/// One file of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Absolute, through its directory's canonical path.
    pub path: PathBuf,
    /// The file's inode and size when the commit began.
    pub ino: u64,
    pub len: u64,
    /// For a file the commit re-lays out: the new file renamed over it.
    pub new: Option<NewFile>,
}

/// The new file of a re-laid-out member, beside it until it is renamed over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFile {
    pub name: OsString,
    pub ino: u64,
    pub len: u64,
}

impl Member {
    /// Whether a file of inode `ino` and size `len` is this member, before or after the
    /// commit.
    fn is(&self, ino: u64, len: u64) -> bool {
        (ino, len) == (self.ino, self.len)
            || self
                .new
                .as_ref()
                .is_some_and(|n| (ino, len) == (n.ino, n.len))
    }

    fn describe(&self) -> String {
        let mut s = format!("inode {}, {} bytes", self.ino, self.len);
        if let Some(n) = &self.new {
            s.push_str(&format!(
                ", or its re-laid-out file of inode {}, {} bytes",
                n.ino, n.len
            ));
        }
        s
    }
}

impl Record {
    /// The record's bytes (docs/formats.md#journal-file-layout): the id, u32 member count,
    /// then per member u64 inode, u64 size, u8 kind (0 in place, 1 re-laid out; then u64
    /// new inode, u64 new size, u16 name length and the new file's name), u16 path length
    /// and the path; little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.id.to_vec();
        out.extend_from_slice(&(self.members.len() as u32).to_le_bytes());
        for m in &self.members {
            out.extend_from_slice(&m.ino.to_le_bytes());
            out.extend_from_slice(&m.len.to_le_bytes());
            match &m.new {
                None => out.push(0),
                Some(n) => {
                    out.push(1);
                    out.extend_from_slice(&n.ino.to_le_bytes());
                    out.extend_from_slice(&n.len.to_le_bytes());
                    out.extend_from_slice(&(n.name.len() as u16).to_le_bytes());
                    out.extend_from_slice(n.name.as_bytes());
                }
            }
            let path = m.path.as_os_str().as_bytes();
            out.extend_from_slice(&(path.len() as u16).to_le_bytes());
            out.extend_from_slice(path);
        }
        out
    }

    /// Parses a record, checking every length against the bytes there are; the error says
    /// what is wrong and where.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Record, String> {
        let mut c = Cursor { bytes, at: 0 };
        let id = c.take(ID_LEN, "the commit's id")?.try_into().expect("16");
        let count = c.u32("the member count")?;
        if !(2..=MAX_MEMBERS).contains(&count) {
            return Err(format!(
                "it declares {count} files, expected 2 to {MAX_MEMBERS}"
            ));
        }
        let mut members: Vec<Member> = Vec::new();
        for k in 0..count {
            let what = |field: &str| format!("file {k}'s {field}");
            let ino = c.u64(&what("inode"))?;
            let len = c.u64(&what("size"))?;
            let new = match c.take(1, &what("kind"))?[0] {
                0 => None,
                1 => {
                    let ino = c.u64(&what("new inode"))?;
                    let len = c.u64(&what("new size"))?;
                    let n = c.u16(&what("new name's length"))?;
                    let name = c.take(n.into(), &what("new name"))?;
                    Some(NewFile {
                        name: OsString::from_vec(name.to_vec()),
                        ino,
                        len,
                    })
                }
                other => {
                    return Err(format!(
                        "file {k} has kind {other}, expected 0 (in place) or 1 (re-laid out)"
                    ))
                }
            };
            let n = c.u16(&what("path's length"))?;
            let path = PathBuf::from(OsStr::from_bytes(c.take(n.into(), &what("path"))?));
            check_path(&path).map_err(|why| format!("file {k}: {why}"))?;
            if let Some(new) = &new {
                check_new_name(&path, &new.name).map_err(|why| format!("file {k}: {why}"))?;
            }
            if members.iter().any(|m| m.path == path) {
                return Err(format!("file {k}: {} is named twice", path.display()));
            }
            members.push(Member {
                path,
                ino,
                len,
                new,
            });
        }
        if c.at != bytes.len() {
            return Err(format!(
                "{} bytes follow its last file (it has {} bytes)",
                bytes.len() - c.at,
                bytes.len()
            ));
        }
        Ok(Record { id, members })
    }
}

/// A member's path: absolute, without `.` or `..`, with a file name, no NUL.
fn check_path(path: &Path) -> std::result::Result<(), String> {
    let raw = path.as_os_str().as_bytes();
    let shown = crate::quote::name(&String::from_utf8_lossy(raw));
    if raw.len() > PATH_MAX {
        return Err(format!(
            "a path of {} bytes, longer than {PATH_MAX}",
            raw.len()
        ));
    }
    if raw.contains(&0) {
        return Err(format!("the path {shown} holds a NUL byte"));
    }
    if !path.is_absolute()
        || path.file_name().is_none()
        || path
            .components()
            .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(format!(
            "the path {shown} is not an absolute path of a file without . or .."
        ));
    }
    Ok(())
}

/// A new file's name: one a re-layout of `path` gives (`.<name>.ptefs-new.` and 16
/// hexadecimal digits), in its directory.
fn check_new_name(path: &Path, name: &OsStr) -> std::result::Result<(), String> {
    let prefix = relayout::temp_prefix(path.file_name().unwrap_or_default());
    let raw = name.as_bytes();
    let ok = raw.len() == prefix.len() + 16
        && raw.len() <= NAME_MAX
        && raw.starts_with(&prefix)
        && raw[prefix.len()..].iter().all(u8::is_ascii_hexdigit);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "its new file {} is not a name a re-layout of {} gives",
            crate::quote::name(&String::from_utf8_lossy(raw)),
            path.display()
        ))
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "it ends inside {what} (byte {} of {}, {n} bytes needed)",
                self.at,
                self.bytes.len()
            ));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u16(&mut self, what: &str) -> std::result::Result<u16, String> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2"),
        ))
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }
}

/// `path` with its directory's canonical path: how a group record names a file.
fn absolute(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format!("{}: no file name", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::io(format!("the directory of {}", path.display()), e))?;
    Ok(dir.join(name))
}

/// The inode and size of the file open as `mf`.
fn identity(mf: &ModelFile) -> Result<(u64, u64)> {
    let meta = mf
        .file
        .as_ref()
        .ok_or_else(|| Error::invalid(format!("{} is not a local file", mf.path.display())))?
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", mf.path.display()), e))?;
    Ok((meta.ino(), meta.len()))
}

fn random_id() -> Result<[u8; ID_LEN]> {
    let mut id = [0u8; ID_LEN];
    // SAFETY: a buffer of the given length.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
    if n != id.len() as isize {
        return Err(Error::io("getrandom", std::io::Error::last_os_error()));
    }
    Ok(id)
}

/// Commits `relayouts` and the same-size `writes` (of other files) as one: see the module
/// comment. `exclusive` is held while a file's bytes change in place; `watcher` is told of
/// every new file before the commit point, and may still abandon the commit.
pub fn commit<G>(
    model: &Model, relayouts: &[(FileIndex, Change)], writes: &[Write], exclusive: &impl Fn() -> G,
    watcher: &dyn FileWatcher,
) -> Result<()> {
    let mut files: Vec<FileIndex> = relayouts
        .iter()
        .map(|(f, _)| *f)
        .chain(writes.iter().map(|w| w.location.file))
        .collect();
    files.sort_unstable();
    files.dedup();
    if files.len() != relayouts.len() + count_files(writes) {
        return Err(Error::invalid(
            "a commit both re-lays out a file and writes into it in place",
        ));
    }
    if files.len() > MAX_MEMBERS as usize {
        return Err(Error::invalid(format!(
            "a commit of {} files: at most {MAX_MEMBERS} change together",
            files.len()
        )));
    }
    let mut prepared: Vec<(FileIndex, Prepared)> = Vec::new();
    let abandon = |prepared: Vec<(FileIndex, Prepared)>| {
        for (_, p) in prepared {
            p.abandon();
        }
    };
    for (file, change) in relayouts {
        match relayout::prepare(model, *file, change)
            .and_then(|p| p.sync_name().and_then(|_| p.announce(watcher)).map(|_| p))
        {
            Ok(p) => prepared.push((*file, p)),
            Err(e) => {
                abandon(prepared);
                return Err(e);
            }
        }
    }
    let record = match record_of(model, &files, &prepared) {
        Ok(r) => r.encode(),
        Err(e) => {
            abandon(prepared);
            return Err(e);
        }
    };
    let ranges: Vec<Vec<journal::RangeWrite>> = files
        .iter()
        .map(|&f| {
            writes
                .iter()
                .filter(|w| w.location.file == f)
                .map(|w| (w.location.range.start(), w.bytes.source()))
                .collect()
        })
        .collect();
    let mut journals = Vec::with_capacity(files.len());
    for (k, &f) in files.iter().enumerate() {
        match journal::begin_member(&model.files[f], &ranges[k], Some((k as u64, &record))) {
            Ok(j) => journals.push(j),
            Err(e) => {
                for j in journals {
                    let _ = j.abandon();
                }
                abandon(prepared);
                return Err(e);
            }
        }
    }
    // The commit point: every journal is whole and named. From here on a failure leaves
    // them for the next recovery, which finishes the commit.
    for j in &journals {
        j.apply(exclusive)?;
    }
    for (_, p) in prepared {
        p.replace()?;
    }
    for j in journals {
        j.retire()?;
    }
    Ok(())
}

fn count_files(writes: &[Write]) -> usize {
    let mut files: Vec<FileIndex> = writes.iter().map(|w| w.location.file).collect();
    files.sort_unstable();
    files.dedup();
    files.len()
}

fn record_of(
    model: &Model, files: &[FileIndex], prepared: &[(FileIndex, Prepared)],
) -> Result<Record> {
    let members = files
        .iter()
        .map(|&f| {
            let mf = &model.files[f];
            let (ino, len) = identity(mf)?;
            let new = match prepared.iter().find(|(p, _)| *p == f) {
                None => None,
                Some((_, p)) => {
                    let (ino, len) = p.identity()?;
                    Some(NewFile {
                        name: p.name.clone(),
                        ino,
                        len,
                    })
                }
            };
            let path = absolute(&mf.path)?;
            if path.as_os_str().len() > PATH_MAX {
                return Err(Error::invalid(format!(
                    "{}: a path longer than {PATH_MAX} bytes",
                    path.display()
                )));
            }
            Ok(Member {
                path,
                ino,
                len,
                new,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let record = Record {
        id: random_id()?,
        members,
    };
    if record.encode().len() as u64 > MAX_RECORD {
        return Err(Error::invalid(format!(
            "the paths of {} files do not fit the {MAX_RECORD} bytes of a journal's group record",
            files.len()
        )));
    }
    Ok(record)
}

/// The refusal of journal `shown`: it is not replayed, for `why`, and left in place.
fn refusal(shown: &str, why: String) -> Error {
    Error::new(
        libc::EPERM,
        format!("{shown}: not replayed: {why}; {}", journal::LEFT_IN_PLACE),
    )
    .with_level(log::Level::Error)
}

/// The other files of the commit whose journal, beside `path`, is `layout` (none for a
/// journal of one file); an error when its record is not one ptefs writes.
pub(super) fn others(beside: &Beside, layout: &Layout) -> Result<Vec<PathBuf>> {
    let Some((index, bytes)) = &layout.group else {
        return Ok(Vec::new());
    };
    let shown = beside.shown(&journal_name(beside.model_name()));
    let record = Record::parse(bytes).map_err(|why| {
        refusal(
            &shown,
            format!("its group record is not one ptefs writes: {why}"),
        )
    })?;
    Ok(record
        .members
        .into_iter()
        .enumerate()
        .filter(|(k, _)| *k as u64 != *index)
        .map(|(_, m)| m.path)
        .collect())
}

/// A member whose journal is whole and of this commit, ready to be finished.
struct Ready {
    layout: Layout,
    journal: File,
}

/// Recovers the commit of several files whose journal beside `path` (the file `model`,
/// through `beside`) is `layout`, `journal`: finishes every file when every journal of the
/// commit is there, else discards this file's journal (see the module comment).
pub(super) fn recover(
    path: &Path, model: &ModelFile, beside: &Beside, layout: Layout, journal: File,
) -> Result<Recovery> {
    let name = journal_name(beside.model_name());
    let shown = beside.shown(&name);
    let refuse = |why: String| refusal(&shown, why);
    let (index, bytes) = layout.group.clone().expect("a journal of a group");
    let record = Record::parse(&bytes)
        .map_err(|why| refuse(format!("its group record is not one ptefs writes: {why}")))?;
    let n = record.members.len();
    let index = usize::try_from(index)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| {
            refuse(format!(
                "it says it is file {index} of a commit of {n} files"
            ))
        })?;
    let own = &record.members[index];
    let here = absolute(path)?;
    if own.path != here {
        return Err(refuse(format!(
            "its group record names {} as this file, but it is beside {}",
            own.path.display(),
            here.display()
        )));
    }
    let (ino, len) = identity(model)?;
    if !own.is(ino, len) {
        return Err(refuse(format!(
            "{} is inode {ino}, {len} bytes, not the file its commit was written for ({})",
            path.display(),
            own.describe()
        )));
    }
    check_shape(own, &layout).map_err(&refuse)?;

    // Every other file, opened and judged; the first whose journal is not this commit's
    // decides that the commit is not to be finished.
    let mut opened: Vec<Option<ModelFile>> = (0..n).map(|_| None).collect();
    let mut ready: Vec<Option<Ready>> = (0..n).map(|_| None).collect();
    ready[index] = Some(Ready { layout, journal });
    let mut missing = None;
    for (k, m) in record.members.iter().enumerate() {
        if k == index {
            continue;
        }
        let other = ModelFile::open_writable(&m.path).map_err(|e| {
            refuse(format!(
                "file {k} of its commit of {n} files, {}, cannot be opened ({e}): moved or deleted? Whether the commit finished cannot be told without it, so nothing was changed (put it back where it was, then recover again)",
                m.path.display()
            ))
        })?;
        // Opening resolves links: a member is its path itself, never what a link points to.
        if other.path != m.path {
            return Err(refuse(format!(
                "file {k} of its commit of {n} files, {}, now leads to {} (a symbolic link?), not the file the commit was written for; nothing was changed",
                m.path.display(),
                other.path.display()
            )));
        }
        let (ino, len) = identity(&other)?;
        if !m.is(ino, len) {
            return Err(refuse(format!(
                "file {k} of its commit of {n} files, {}, is inode {ino}, {len} bytes, not the file the commit was written for ({}); nothing was changed",
                m.path.display(),
                m.describe()
            )));
        }
        let other_beside = Beside::of(&other)?;
        let found = examine(&m.path, &other, &other_beside).map_err(|e| {
            refuse(format!(
                "the journal of {}, another file of its commit, is refused: {}",
                m.path.display(),
                e.message()
            ))
        })?;
        match found {
            None => missing = missing.or(Some(format!("{} has no journal", m.path.display()))),
            Some(Found::Torn(why)) => {
                missing = missing.or(Some(format!(
                    "the journal of {} is {why}",
                    m.path.display()
                )))
            }
            Some(Found::Whole { layout, journal }) => {
                if layout.group.as_ref() == Some(&(k as u64, bytes.clone())) {
                    check_shape(m, &layout).map_err(&refuse)?;
                    ready[k] = Some(Ready { layout, journal });
                } else {
                    missing = missing.or(Some(format!(
                        "the journal of {} is another commit's",
                        m.path.display()
                    )))
                }
            }
        }
        opened[k] = Some(other);
    }
    if let Some(why) = missing {
        beside.remove(&name)?;
        beside.sync()?;
        return Ok(Recovery::GroupDiscarded(format!(
            "it was one of {n} files of a commit, and {why}: the commit never reached the point where its files change, or had changed them all and was removing its journals, so every file holds all its old or all its new bytes"
        )));
    }

    // Every journal is there: the commit reached its commit point. Finish every file, make
    // it durable, and only then remove the journals.
    let file = |k: usize| opened[k].as_ref().unwrap_or(model);
    let mut said = Vec::new();
    for (k, m) in record.members.iter().enumerate() {
        let mf = file(k);
        let r = ready[k].as_ref().expect("every journal is ready");
        said.push(finish_member(mf, m, r).map_err(|e| {
            e.context(format!(
                "{shown}: finishing file {k} of its commit of {n} files"
            ))
        })?);
    }
    for (k, m) in record.members.iter().enumerate() {
        let mf = file(k);
        let b = Beside::of(mf)?;
        let jname = journal_name(b.model_name());
        match b.remove(&jname) {
            Ok(()) => {}
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => {
                let r = ready[k].as_ref().expect("ready");
                return Err(journal::unremovable(
                    &m.path,
                    &b,
                    &b.shown(&jname),
                    &r.journal,
                    &r.layout,
                    true,
                    e,
                ));
            }
        }
        b.sync()?;
    }
    Ok(Recovery::GroupFinished(said))
}

/// A member's journal matches its kind: ranges for a file changed in place, none for one
/// re-laid out.
fn check_shape(m: &Member, layout: &Layout) -> std::result::Result<(), String> {
    match (&m.new, layout.ranges) {
        (None, 0) => Err(format!(
            "the journal of {}, changed in place by its commit, has no ranges",
            m.path.display()
        )),
        (None, _) if layout.file_len != m.len => Err(format!(
            "the journal of {} is for a file of {} bytes, its group record says {}",
            m.path.display(),
            layout.file_len,
            m.len
        )),
        (Some(_), r) if r > 0 => Err(format!(
            "the journal of {}, re-laid out by its commit, has {r} ranges",
            m.path.display()
        )),
        _ => Ok(()),
    }
}

/// Finishes one member of a commit that reached its commit point: its journal's ranges
/// written (and fsynced), or its new file renamed over it; returns what was done.
fn finish_member(mf: &ModelFile, m: &Member, r: &Ready) -> Result<String> {
    let shown = m.path.display();
    let Some(new) = &m.new else {
        let target = mf.file.as_ref().filter(|_| mf.writable).ok_or_else(|| {
            Error::new(
                libc::EACCES,
                format!("{shown} cannot be opened for writing"),
            )
        })?;
        let rules = RangeRules::new(mf.len(), &mf.writable_ranges());
        journal::replay(&r.journal, &r.layout, rules, target)?;
        target
            .sync_data()
            .map_err(|e| Error::io(format!("fsync {shown}"), e))?;
        return Ok(format!(
            "{shown}: {} bytes in {} range(s)",
            r.layout.data_len, r.layout.ranges
        ));
    };
    let (ino, _) = identity(mf)?;
    if ino == new.ino {
        return Ok(format!("{shown}: already re-laid out"));
    }
    let beside = Beside::of(mf)?;
    let new_shown = beside.shown(&new.name);
    let f = beside.open_existing(&new.name)?.ok_or_else(|| {
        Error::new(
            libc::ENOENT,
            format!("its re-laid-out file {new_shown} is missing; nothing was renamed"),
        )
        .with_level(log::Level::Error)
    })?;
    let meta = f
        .metadata()
        .map_err(|e| Error::io(format!("stat {new_shown}"), e))?;
    let owner = mf
        .file
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map(|m| m.uid());
    let wrong = if !meta.is_file() || Some(meta.uid()) != owner {
        Some(format!("it is {}", trust::describe(&meta)))
    } else if (meta.ino(), meta.len()) != (new.ino, new.len) {
        Some(format!(
            "it is inode {}, {} bytes, the commit wrote inode {}, {} bytes",
            meta.ino(),
            meta.len(),
            new.ino,
            new.len
        ))
    } else {
        trust::others_may_write(&f, &meta)
    };
    if let Some(why) = wrong {
        return Err(Error::new(
            libc::EPERM,
            format!(
                "{new_shown} is not the file its commit re-laid out ({why}); nothing was renamed"
            ),
        )
        .with_level(log::Level::Error));
    }
    beside.replace_model(&new.name)?;
    Ok(format!("{shown}: renamed its re-laid-out file over it"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::{Bytes, Source};
    use crate::edit::journal::{begin_member, journal_path, recover as recover_one};
    use crate::edit::{Plan, Unwatched};
    use crate::format::layout::Location;
    use crate::format::range::ByteRange;

    const FILES: [&str; 3] = [
        "llama_lora.pte",
        "llama_lora.foundation.ptd",
        "llama_lora.lora.ptd",
    ];

    /// The three files of the LoRA fixture copied into a temporary directory.
    fn copies() -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let paths = FILES
            .iter()
            .map(|f| {
                let p = dir.path().canonicalize().unwrap().join(f);
                std::fs::copy(src.join(f), &p).unwrap();
                p
            })
            .collect();
        (dir, paths)
    }

    fn open(paths: &[PathBuf]) -> Model {
        Model::open_writable(&paths[0], &paths[1..]).unwrap()
    }

    /// 64 bytes at the start of each file's first writable range.
    fn ranges(model: &Model) -> Vec<Location> {
        model
            .files
            .iter()
            .enumerate()
            .map(|(file, f)| Location {
                file,
                range: ByteRange::new(
                    f.writable_ranges()
                        .iter()
                        .find(|r| r.len() >= 64)
                        .unwrap()
                        .start(),
                    64,
                )
                .unwrap(),
            })
            .collect()
    }

    fn read_all(paths: &[PathBuf]) -> Vec<Vec<u8>> {
        paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
    }

    /// Whether every file holds all old bytes (`Some(false)`) or all new ones
    /// (`Some(true)`): the new bytes are `fill` in every range.
    fn state(paths: &[PathBuf], old: &[Vec<u8>], at: &[Location], fill: u8) -> Option<bool> {
        let now = read_all(paths);
        let new: Vec<bool> = at
            .iter()
            .map(|l| now[l.file][l.range.as_usize()].iter().all(|&b| b == fill))
            .collect();
        for (k, l) in at.iter().enumerate() {
            let mut expect = old[k].clone();
            if new[k] {
                expect[l.range.as_usize()].fill(fill);
            }
            assert_eq!(
                now[k],
                expect,
                "{}: other bytes changed",
                paths[k].display()
            );
        }
        if new.iter().all(|&n| n) {
            Some(true)
        } else if new.iter().all(|&n| !n) {
            Some(false)
        } else {
            None
        }
    }

    /// Journals of a commit of every file writing `fill`, for the members `keep` only,
    /// left beside the files as a crash would leave them; the first `applied` are written.
    fn crash_after_journals(paths: &[PathBuf], keep: &[usize], applied: usize, fill: u8) {
        let model = open(paths);
        let at = ranges(&model);
        let files: Vec<FileIndex> = (0..paths.len()).collect();
        let record = record_of(&model, &files, &[]).unwrap().encode();
        let new = vec![fill; 64];
        let writes: Vec<Vec<journal::RangeWrite>> = at
            .iter()
            .map(|l| vec![(l.range.start(), Source::Memory(&new))])
            .collect();
        let mut journals = Vec::new();
        for &k in keep {
            journals.push(
                begin_member(&model.files[k], &writes[k], Some((k as u64, &record))).unwrap(),
            );
        }
        for j in journals.iter().take(applied) {
            j.apply(|| ()).unwrap();
        }
    }

    #[test]
    fn a_commit_of_three_files_changes_them_all_and_leaves_no_journal() {
        let (_d, paths) = copies();
        let old = read_all(&paths);
        let model = open(&paths);
        let at = ranges(&model);
        let writes = at
            .iter()
            .map(|l| Write {
                location: *l,
                bytes: Bytes::Owned(vec![0xab; 64]),
                of: None,
            })
            .collect();
        super::super::commit_plan(&model, Plan::InPlace { writes }, || (), &Unwatched).unwrap();
        assert_eq!(state(&paths, &old, &at, 0xab), Some(true));
        for p in &paths {
            assert!(!journal_path(p).exists());
        }
    }

    /// A member written as a new copy (an update of most of its file,
    /// docs/writes.md#large-updates-as-a-new-copy) is one commit with the members written in
    /// place: the copy is renamed over its file (a new inode), the others written, and
    /// nothing is left beside any of them.
    #[test]
    fn a_member_written_as_a_new_copy_commits_with_the_others() {
        use std::os::unix::fs::MetadataExt;
        let (_d, paths) = copies();
        let old = read_all(&paths);
        let model = open(&paths);
        let at = ranges(&model);
        let ino = std::fs::metadata(&paths[1]).unwrap().ino();
        let copied = vec![(
            1,
            Change::OwnBytes {
                own: Vec::new(),
                patches: vec![(at[1].range, Bytes::Owned(vec![0xcd; 64]))],
            },
        )];
        let writes: Vec<Write> = [0, 2]
            .iter()
            .map(|&k| Write {
                location: at[k],
                bytes: Bytes::Owned(vec![0xcd; 64]),
                of: None,
            })
            .collect();
        commit(&model, &copied, &writes, &|| (), &Unwatched).unwrap();
        assert_eq!(state(&paths, &old, &at, 0xcd), Some(true));
        assert_ne!(std::fs::metadata(&paths[1]).unwrap().ino(), ino);
        for p in &paths {
            assert!(!journal_path(p).exists());
            assert!(relayout::leftovers(p).is_empty());
        }
    }

    #[test]
    fn every_journal_whole_finishes_the_whole_commit_from_any_one_file() {
        for (first, applied) in [(1, 0), (2, 1), (0, 2), (2, 3)] {
            let (_d, paths) = copies();
            let old = read_all(&paths);
            let at = ranges(&open(&paths));
            crash_after_journals(&paths, &[0, 1, 2], applied, 0x5a);
            // Recovering one data file alone finishes the program and the other file too.
            match recover_one(&paths[first]).unwrap() {
                Recovery::GroupFinished(said) => assert_eq!(said.len(), 3, "{said:?}"),
                other => panic!("{other:?}"),
            }
            assert_eq!(state(&paths, &old, &at, 0x5a), Some(true));
            for p in &paths {
                assert!(!journal_path(p).exists(), "{}", p.display());
                assert_eq!(recover_one(p).unwrap(), Recovery::None);
            }
        }
    }

    #[test]
    fn a_missing_or_torn_member_journal_discards_each_file_alone() {
        let (_d, paths) = copies();
        let old = read_all(&paths);
        let at = ranges(&open(&paths));
        // The crash came before the last journal was named.
        crash_after_journals(&paths, &[0, 1], 0, 0x33);
        for p in &paths[..2] {
            let got = recover_one(p).unwrap();
            assert!(
                matches!(&got, Recovery::GroupDiscarded(why) if why.contains("has no journal")),
                "{got:?}"
            );
            assert_eq!(state(&paths, &old, &at, 0x33), Some(false));
        }
        // A torn one (a file system without unnamed files) is no journal either.
        crash_after_journals(&paths, &[0, 1, 2], 0, 0x33);
        let j = journal_path(&paths[2]);
        let len = std::fs::metadata(&j).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&j)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        let got = recover_one(&paths[0]).unwrap();
        assert!(
            matches!(&got, Recovery::GroupDiscarded(why) if why.contains("torn")),
            "{got:?}"
        );
        assert!(journal_path(&paths[1]).exists());
        assert_eq!(state(&paths, &old, &at, 0x33), Some(false));
    }

    #[test]
    fn a_member_missing_replaced_or_a_link_refuses_and_changes_nothing() {
        let (d, paths) = copies();
        let at = ranges(&open(&paths));
        crash_after_journals(&paths, &[0, 1, 2], 1, 0x44);
        let before = read_all(&paths);
        let journals: Vec<Vec<u8>> = paths
            .iter()
            .map(|p| std::fs::read(journal_path(p)).unwrap())
            .collect();
        let unchanged = || {
            assert_eq!(read_all(&paths), before);
            for (p, j) in paths.iter().zip(&journals) {
                assert_eq!(&std::fs::read(journal_path(p)).unwrap(), j);
            }
        };
        let refused = |says: &str| {
            let e = recover_one(&paths[0]).expect_err(says);
            assert!(e.message().contains(says), "{e}");
            assert!(e.message().contains(journal::LEFT_IN_PLACE), "{e}");
            assert_eq!(e.level(), log::Level::Error);
        };
        // Moved away.
        let away = d.path().join("away.ptd");
        std::fs::rename(&paths[2], &away).unwrap();
        refused("moved or deleted?");
        std::fs::rename(&away, &paths[2]).unwrap();
        unchanged();
        // Replaced by a link to itself, moved.
        std::fs::rename(&paths[2], &away).unwrap();
        std::os::unix::fs::symlink(&away, &paths[2]).unwrap();
        refused("now leads to");
        std::fs::remove_file(&paths[2]).unwrap();
        // Replaced by a copy: another inode.
        std::fs::copy(&away, &paths[2]).unwrap();
        refused("not the file the commit was written for");
        std::fs::rename(&away, &paths[2]).unwrap();
        unchanged();
        // Its journal replaced by a link to itself.
        let j2 = journal_path(&paths[2]);
        let kept = d.path().join("kept");
        std::fs::rename(&j2, &kept).unwrap();
        std::os::unix::fs::symlink(&kept, &j2).unwrap();
        refused("symbolic link");
        std::fs::remove_file(&j2).unwrap();
        std::fs::rename(&kept, &j2).unwrap();
        unchanged();
        // Now whole again: finished.
        assert!(matches!(
            recover_one(&paths[1]).unwrap(),
            Recovery::GroupFinished(_)
        ));
        assert_eq!(state(&paths, &read_all(&paths), &at, 0x44), Some(true));
    }

    #[test]
    fn a_journal_naming_another_member_as_itself_is_refused() {
        let (_d, paths) = copies();
        let model = open(&paths);
        let at = ranges(&model);
        let record = record_of(&model, &[0, 1, 2], &[]).unwrap().encode();
        let new = [1u8; 64];
        let w = [(at[0].range.start(), Source::Memory(&new))];
        // The program's journal, saying it is file 1 (the foundation .ptd).
        drop(begin_member(&model.files[0], &w, Some((1, &record))).unwrap());
        let e = recover_one(&paths[0]).unwrap_err();
        assert!(
            e.message().contains("as this file, but it is beside"),
            "{e}"
        );
        assert!(journal_path(&paths[0]).exists());
        std::fs::remove_file(journal_path(&paths[0])).unwrap();
        drop(begin_member(&model.files[0], &w, Some((7, &record))).unwrap());
        let e = recover_one(&paths[0]).unwrap_err();
        assert!(e.message().contains("file 7 of a commit of 3 files"), "{e}");
    }

    #[test]
    fn a_re_laid_out_member_is_renamed_over_its_file_by_recovery_or_removed() {
        for committed in [true, false] {
            let (_d, paths) = copies();
            let model = open(&paths);
            let at = ranges(&model);
            let lora = &model.files[2];
            let seg = match &lora.kind {
                crate::format::Kind::Ptd(p) => p.segments[0],
                _ => unreachable!(),
            };
            let mut bytes = lora.read(seg).unwrap().to_vec();
            bytes[..4].copy_from_slice(&[9, 9, 9, 9]);
            let change = Change::Segment {
                index: 0,
                data: Source::Memory(&bytes),
            };
            let p = relayout::prepare(&model, 2, &change).unwrap();
            p.sync_name().unwrap();
            let prepared = vec![(2, p)];
            let record = record_of(&model, &[0, 1, 2], &prepared).unwrap().encode();
            let new = [7u8; 64];
            let w: Vec<Vec<journal::RangeWrite>> = at[..2]
                .iter()
                .map(|l| vec![(l.range.start(), Source::Memory(&new))])
                .collect();
            let members = if committed { 3 } else { 2 };
            let mut js = Vec::new();
            let none: &[journal::RangeWrite] = &[];
            let per_file = w.iter().map(Vec::as_slice).chain([none]);
            for (k, ranges) in per_file.take(members).enumerate() {
                js.push(begin_member(&model.files[k], ranges, Some((k as u64, &record))).unwrap());
            }
            drop(js);
            std::mem::forget(prepared);
            let old = read_all(&paths);
            let lora_before = std::fs::read(&paths[2]).unwrap();
            let got = crate::edit::recovery::finish(&paths[0]).unwrap();
            let lora_now = std::fs::read(&paths[2]).unwrap();
            assert_eq!(
                state(&paths[..2], &old[..2], &at[..2], 7),
                Some(committed),
                "{got:?}"
            );
            if committed {
                assert!(
                    got[0].contains("finished an interrupted commit of 3 files"),
                    "{got:?}"
                );
                assert!(
                    got[0].contains("renamed its re-laid-out file over it"),
                    "{got:?}"
                );
                let s = seg.start() as usize;
                assert_ne!(lora_now, lora_before);
                assert_eq!(
                    &ModelFile::open(&paths[2]).unwrap().read(seg).unwrap()[..4],
                    &[9, 9, 9, 9],
                    "{s}"
                );
                for p in &paths {
                    assert!(!journal_path(p).exists());
                    assert!(relayout::leftovers(p).is_empty(), "{}", p.display());
                }
            } else {
                assert!(got[0].contains("discarded"), "{got:?}");
                assert_eq!(lora_now, lora_before);
                // The data file's own recovery discards its journal and its new file.
                let got = crate::edit::recovery::finish(&paths[1]).unwrap();
                assert!(got[0].contains("discarded"), "{got:?}");
                assert!(!journal_path(&paths[2]).exists());
                assert_eq!(relayout::leftovers(&paths[2]).len(), 1);
                crate::edit::recovery::finish(&paths[2]).unwrap();
                assert!(relayout::leftovers(&paths[2]).is_empty());
                assert_eq!(std::fs::read(&paths[2]).unwrap(), lora_before);
            }
        }
    }

    fn sample() -> Record {
        Record {
            id: [7; ID_LEN],
            members: vec![
                Member {
                    path: "/m/a.pte".into(),
                    ino: 5,
                    len: 100,
                    new: None,
                },
                Member {
                    path: "/m/b.ptd".into(),
                    ino: 6,
                    len: 200,
                    new: Some(NewFile {
                        name: ".b.ptd.ptefs-new.0123456789abcdef".into(),
                        ino: 9,
                        len: 300,
                    }),
                },
            ],
        }
    }

    #[test]
    fn records_round_trip_and_every_cut_is_refused() {
        let r = sample();
        let bytes = r.encode();
        assert_eq!(Record::parse(&bytes).unwrap(), r);
        for cut in 0..bytes.len() {
            let e = Record::parse(&bytes[..cut]).unwrap_err();
            assert!(e.contains("it ends inside"), "cut {cut}: {e}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            Record::parse(&long).unwrap_err(),
            format!("1 bytes follow its last file (it has {} bytes)", long.len())
        );
    }

    #[test]
    fn hostile_records_are_refused_saying_why() {
        let refused = |r: &Record, says: &str| {
            let e = Record::parse(&r.encode()).unwrap_err();
            assert!(e.contains(says), "{e}");
        };
        let mut r = sample();
        r.members.truncate(1);
        refused(&r, "it declares 1 files, expected 2 to 4096");
        let mut r = sample();
        r.members[1].path = "b.ptd".into();
        refused(&r, "file 1: the path \"b.ptd\" is not an absolute path");
        r.members[1].path = "/m/../etc/b.ptd".into();
        refused(&r, "not an absolute path of a file without . or ..");
        r.members[1].path = "/m/b.ptd".into();
        r.members[0].path = "/m/b.ptd".into();
        refused(&r, "file 1: /m/b.ptd is named twice");
        let mut r = sample();
        r.members[1].new.as_mut().unwrap().name = "../../etc/passwd".into();
        refused(
            &r,
            "file 1: its new file \"../../etc/passwd\" is not a name a re-layout of /m/b.ptd gives",
        );
        r.members[1].new.as_mut().unwrap().name = ".a.pte.ptefs-new.0123456789abcdef".into();
        refused(&r, "is not a name a re-layout of /m/b.ptd gives");
        let mut bytes = sample().encode();
        // The first member's kind byte.
        bytes[ID_LEN + 4 + 16] = 2;
        assert_eq!(
            Record::parse(&bytes).unwrap_err(),
            "file 0 has kind 2, expected 0 (in place) or 1 (re-laid out)"
        );
        let mut bytes = sample().encode();
        bytes[ID_LEN..ID_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Record::parse(&bytes)
            .unwrap_err()
            .contains("4294967295 files"));
    }
}
