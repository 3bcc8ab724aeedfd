//! A model: each file's bytes (from `crate::source`), its kind decided by the identifier,
//! parsed, and where every tensor, payload and blob keeps its bytes.
//!
//! Invariant: a `ModelFile` always holds a successfully parsed file; the bytes it parsed
//! stay readable through its source for as long as it lives.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::header::{detect_kind, FileKind};
use super::layout::{locate_ptd, locate_pte, FileIndex, Location, NamedBlob, PteLayout};
use super::ptd::{parse_ptd, parse_ptd_in, Ptd};
use super::pte::{parse_pte, parse_pte_in, Pte};
use super::range::ByteRange;
use super::sharing::SharedBytes;
use super::FormatError;
use crate::source::{stat_in, ByteSource, LocalFile, Memory};

#[derive(Debug, Clone)]
pub enum Kind {
    Pte(Box<Pte>),
    Ptd(Box<Ptd>),
}

/// The first bytes read to find a file's kind and header: more than any header needs.
const HEAD: u64 = 4096;

impl Kind {
    /// Parses bytes of either kind, chosen by the identifier at byte 4.
    pub fn parse(bytes: &[u8]) -> Result<Kind, FormatError> {
        Ok(match detect_kind(bytes)? {
            FileKind::Pte => Kind::Pte(Box::new(parse_pte(bytes)?)),
            FileKind::Ptd => Kind::Ptd(Box::new(parse_ptd(bytes)?)),
        })
    }

    /// Parses the file `source` holds: the whole file when it is in memory, else its header,
    /// then its flatbuffer, read as ranges (never the segments).
    pub fn parse_source(source: &dyn ByteSource) -> Result<Kind, FormatError> {
        if let Some(bytes) = source.mapped() {
            return Kind::parse(bytes);
        }
        let len = source.len();
        let read = |end: u64| {
            source
                .read(0..end)
                .map_err(|e| FormatError::new(format!("cannot read bytes 0..{end}: {e}")))
        };
        let head = read(len.min(HEAD))?;
        let kind = detect_kind(&head)?;
        let program_end = match kind {
            FileKind::Pte => super::header::parse_pte_header_in(&head, len)?.program_size(),
            FileKind::Ptd => super::header::parse_ptd_header_in(&head, len)?.program_size(),
        };
        let flat = if program_end <= head.len() as u64 {
            head
        } else {
            read(program_end)?
        };
        Ok(match kind {
            FileKind::Pte => Kind::Pte(Box::new(parse_pte_in(&flat, len)?)),
            FileKind::Ptd => Kind::Ptd(Box::new(parse_ptd_in(&flat, len)?)),
        })
    }

    pub fn file_kind(&self) -> FileKind {
        match self {
            Kind::Pte(_) => FileKind::Pte,
            Kind::Ptd(_) => FileKind::Ptd,
        }
    }
}

/// The URL `path` holds when it names a remote object (`https://…`, `s3://…`), not a
/// local file.
pub fn remote_name(path: &Path) -> Option<&str> {
    path.to_str()
        .filter(|s| crate::source::remote::is_remote(s))
}

/// A parsed `.pte` or `.ptd`, and where its bytes come from.
pub struct ModelFile {
    pub path: PathBuf,
    pub kind: Kind,
    /// The descriptor of a local file: commits write through it (when it was opened for
    /// writing), never through the path, which another process may repoint. None for
    /// bytes that are not a local file.
    pub file: Option<File>,
    /// The directory holding a local file, opened before it: files beside the model
    /// (journals, re-layout files) are created relative to it, and the file is opened
    /// again through it, never through its path.
    pub dir: Option<Arc<File>>,
    /// The file's name in `dir`, as bytes.
    pub name: OsString,
    /// Device and inode of `file`, to tell whether `path` still names it.
    pub identity: Option<(u64, u64)>,
    /// Whether `file` was opened for writing.
    pub writable: bool,
    source: Box<dyn ByteSource>,
    /// What the file looked like when ptefs last knew its bytes (at open, and after each
    /// commit of its own): a change by anyone else shows as a different stamp.
    stamp: Mutex<Option<Stamp>>,
}

/// Size, modification and change times of a file: what a change of its bytes changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Stamp {
    pub fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// What differs from `was`, for messages: `size 48 → 40, mtime changed`.
    pub fn changes_from(&self, was: &Stamp) -> String {
        let mut out = Vec::new();
        if self.size != was.size {
            out.push(format!("size {} → {}", was.size, self.size));
        }
        if self.mtime != was.mtime {
            out.push("modification time changed".to_string());
        }
        if self.ctime != was.ctime && self.mtime == was.mtime {
            out.push("change time changed".to_string());
        }
        out.join(", ")
    }
}

impl std::fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFile")
            .field("path", &self.path)
            .field("len", &self.len())
            .finish()
    }
}

impl ModelFile {
    /// Maps and parses `path`, read-only. Errors start with the path.
    pub fn open(path: &Path) -> Result<ModelFile, FormatError> {
        ModelFile::open_with(path, false)
    }

    /// Maps and parses `path`, keeping a descriptor that commits can write through (or a
    /// read-only one when the file cannot be opened for writing: commits then fail).
    pub fn open_writable(path: &Path) -> Result<ModelFile, FormatError> {
        ModelFile::open_with(path, true)
    }

    fn open_with(path: &Path, writable: bool) -> Result<ModelFile, FormatError> {
        if let Some(url) = remote_name(path) {
            return ModelFile::open_remote(url);
        }
        let local = LocalFile::open(path, writable)
            .map_err(|e| FormatError::new(format!("{}: cannot open: {e}", path.display())))?;
        ModelFile::from_local(local)
    }

    /// Opens the same file again, through the directory it was opened in (after a commit
    /// renamed a new file over its name).
    pub fn reopen(&self) -> Result<ModelFile, FormatError> {
        let Some(dir) = &self.dir else {
            return ModelFile::open_with(&self.path, self.writable);
        };
        let local = LocalFile::reopen(&self.path, dir, &self.name, self.writable)
            .map_err(|e| FormatError::new(format!("{}: cannot open: {e}", self.path.display())))?;
        ModelFile::from_local(local)
    }

    /// Maps and parses an open file known as `path` (tests and tools; no directory).
    pub fn from_file(path: PathBuf, file: File, writable: bool) -> Result<ModelFile, FormatError> {
        ModelFile::from_local(LocalFile::from_file(path, file, writable))
    }

    /// Maps and parses an opened local file.
    pub fn from_local(local: LocalFile) -> Result<ModelFile, FormatError> {
        let shown = local.path.display().to_string();
        let identity = local
            .identity()
            .map_err(|e| FormatError::new(format!("{shown}: {e}")))?;
        // Taken before the bytes are parsed, so a change while parsing shows too.
        let stamp = local.file.metadata().ok().map(|m| Stamp::of(&m));
        let source = local
            .map()
            .map_err(|e| FormatError::new(format!("{shown}: cannot map: {e}")))?;
        let kind =
            Kind::parse_source(&*source).map_err(|e| FormatError::new(format!("{shown}: {e}")))?;
        Ok(ModelFile {
            identity: Some(identity),
            path: local.path,
            kind,
            file: Some(local.file),
            dir: local.dir,
            name: local.name,
            writable: local.writable,
            source,
            stamp: Mutex::new(stamp),
        })
    }

    /// Opens and parses the remote object `url` names (read-only: no descriptor, nothing
    /// to write through). The model is known by the URL without its secrets.
    pub fn open_remote(url: &str) -> Result<ModelFile, FormatError> {
        let opened = crate::source::remote::open(url).map_err(|e| {
            let shown = crate::source::remote::Address::parse(url)
                .map(|a| a.shown)
                .unwrap_or_else(|_| "the URL".into());
            FormatError::new(format!("{shown}: {e}"))
        })?;
        let mut file =
            ModelFile::from_source(PathBuf::from(&opened.shown), Box::new(opened.source))?;
        file.name = opened.file_name.into();
        Ok(file)
    }

    /// Whether the bytes are a remote object's (no local file beside them).
    pub fn is_remote(&self) -> bool {
        remote_name(&self.path).is_some()
    }

    /// Parses the file `source` holds, known as `path` (bytes that are not a local file:
    /// no descriptor, nothing to write through).
    pub fn from_source(
        path: PathBuf, source: Box<dyn ByteSource>,
    ) -> Result<ModelFile, FormatError> {
        let kind = Kind::parse_source(&*source)
            .map_err(|e| FormatError::new(format!("{}: {e}", path.display())))?;
        Ok(ModelFile {
            name: path.file_name().unwrap_or_default().to_os_string(),
            path,
            kind,
            file: None,
            dir: None,
            identity: None,
            writable: false,
            source,
            stamp: Mutex::new(None),
        })
    }

    /// Whether `path` still names the file that was opened (another process may have
    /// renamed a different file over it); the error says what it names now.
    pub fn still_named(&self) -> Result<(), FormatError> {
        let (Some((dev, ino)), Some(dir)) = (self.identity, &self.dir) else {
            return Ok(());
        };
        match stat_in(dir, &self.name) {
            Ok((d, i)) if (d, i) == (dev, ino) => Ok(()),
            Ok((d, i)) => Err(FormatError::new(format!(
                "{} was replaced under the mount (it now names inode {i} on device {d}, the mount has inode {ino} on device {dev})",
                self.path.display()
            ))),
            Err(e) => Err(FormatError::new(format!(
                "{} no longer names the mounted file: {e}",
                self.path.display()
            ))),
        }
    }

    /// The byte ranges an in-place commit may write: every segment and every inline
    /// delegate payload (the parts of a file that writable tree files show).
    pub fn writable_ranges(&self) -> Vec<ByteRange> {
        match &self.kind {
            Kind::Pte(p) => p
                .segments
                .iter()
                .copied()
                .chain(p.inline_delegate_data.iter().flatten().copied())
                .collect(),
            Kind::Ptd(p) => p.segments.clone(),
        }
    }

    /// Parses bytes held in memory (tests, fuzzing, freshly written files).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<ModelFile, FormatError> {
        let kind = Kind::parse(&bytes)?;
        Ok(ModelFile {
            path: path.to_path_buf(),
            kind,
            file: None,
            dir: None,
            name: path.file_name().unwrap_or_default().to_os_string(),
            identity: None,
            writable: false,
            source: Box::new(Memory(bytes)),
            stamp: Mutex::new(None),
        })
    }

    /// How the file changed since ptefs last knew its bytes, when it did: `None` while its
    /// size, modification and change times are those ptefs saw (files held in memory never
    /// change).
    pub fn changed_behind(&self) -> Option<String> {
        let was = (*self.stamp.lock().unwrap_or_else(|e| e.into_inner()))?;
        let now = match self.file.as_ref()?.metadata() {
            Ok(m) => Stamp::of(&m),
            Err(e) => return Some(format!("cannot stat it: {e}")),
        };
        (now != was).then(|| now.changes_from(&was))
    }

    /// Takes the file's stamp again: ptefs itself just changed its bytes (an in-place
    /// commit), so what it sees now is known.
    pub fn restamp(&self) {
        let now = self
            .file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map(|m| Stamp::of(&m));
        *self.stamp.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// Whether the file shrank under its mapping (its bytes can no longer be trusted).
    pub fn poisoned(&self) -> bool {
        self.source.poisoned()
    }

    /// The file's length as opened.
    pub fn len(&self) -> u64 {
        self.source.len()
    }

    /// Whether the file is empty (never true of a parsed file).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole file, when its bytes are in memory (a mapping): reads reply with slices.
    pub fn mapped(&self) -> Option<&[u8]> {
        self.source.mapped()
    }

    /// The bytes of `range` of the file: a slice of the mapping, or bytes read.
    pub fn read(&self, range: ByteRange) -> Result<Cow<'_, [u8]>, FormatError> {
        self.source
            .read(range.start()..range.end())
            .map_err(|e| FormatError::new(format!("{}: cannot read: {e}", self.path.display())))
    }

    /// The bytes of `range` of the file, for a reader of a file of the tree whose bytes end
    /// at `limit` (a remote source reads ahead no further).
    pub fn read_within(&self, range: ByteRange, limit: u64) -> Result<Cow<'_, [u8]>, FormatError> {
        self.source
            .read_within(range.start()..range.end(), limit)
            .map_err(|e| FormatError::new(format!("{}: cannot read: {e}", self.path.display())))
    }

    /// Whether the file's bytes are fetched from elsewhere when read (a remote object).
    pub fn fetched_on_demand(&self) -> bool {
        self.source.fetched_on_demand()
    }

    /// Gives back the memory that reading `range` took in this process, where the source
    /// can (the pages of a mapping); the bytes stay readable.
    pub fn release(&self, range: ByteRange) {
        self.source.release(range.start()..range.end());
    }

    /// The bytes at `location` (a location of this file).
    pub fn read_at(&self, location: &Location) -> Result<Cow<'_, [u8]>, FormatError> {
        self.read(location.range)
    }

    /// End of the flatbuffer region; bytes from here on are padding and segments.
    pub fn program_end(&self) -> u64 {
        match &self.kind {
            Kind::Pte(p) => p.header.program_size(),
            Kind::Ptd(p) => p.header.program_size(),
        }
    }

    /// The file stem used to name a data file's directory under `data/`.
    pub fn stem(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "data".to_string())
    }
}

/// The parsed files a mount shows, and where their bytes are.
///
/// Invariant: `files[0]` is the mounted file; `files[1..]` are `.ptd` files attached to a
/// `.pte` (never to a `.ptd`); `pte_layout` is resolved against exactly those files.
pub struct Model {
    pub files: Vec<ModelFile>,
    pub pte_layout: Option<PteLayout>,
    /// Named blobs of each `.ptd` among `files` (None for the `.pte`).
    pub ptd_blobs: Vec<Option<Vec<NamedBlob>>>,
    /// Every named-data key of every file: where its entries are (file, index in that
    /// file's named data), in file order.
    named_index: HashMap<String, Vec<(FileIndex, usize)>>,
    /// The byte ranges several tensors show, indexed at the first commit that asks.
    shared: OnceLock<SharedBytes>,
}

impl Model {
    /// The byte ranges several tensors show (`sharing`), computed once per opened model.
    pub fn shared_bytes(&self) -> &SharedBytes {
        self.shared.get_or_init(|| SharedBytes::of(self))
    }

    /// Opens the mounted file and its attached `.ptd` files, read-only, and resolves every
    /// byte range.
    pub fn open(path: &Path, data: &[impl AsRef<Path>]) -> Result<Model, FormatError> {
        Model::open_with(path, data, false)
    }

    /// `open`, with descriptors that commits write through.
    pub fn open_writable(path: &Path, data: &[impl AsRef<Path>]) -> Result<Model, FormatError> {
        Model::open_with(path, data, true)
    }

    fn open_with(
        path: &Path, data: &[impl AsRef<Path>], writable: bool,
    ) -> Result<Model, FormatError> {
        let open = |p: &Path| ModelFile::open_with(p, writable);
        let mut files = vec![open(path)?];
        for d in data {
            files.push(open(d.as_ref())?);
        }
        Model::from_files(files)
    }

    pub fn from_files(files: Vec<ModelFile>) -> Result<Model, FormatError> {
        if files.len() > 1 {
            if let Kind::Ptd(_) = files[0].kind {
                return Err(FormatError::new(format!(
                    "{}: --data attaches .ptd files to a .pte, but this file is a .ptd",
                    files[0].path.display()
                )));
            }
        }
        for f in &files[1..] {
            if let Kind::Pte(_) = f.kind {
                // Like every refusal of a file, it starts with the file's path.
                return Err(FormatError::new(format!(
                    "{}: attached with --data, so expected a .ptd (identifier FT01), found a .pte (identifier ET12)",
                    f.path.display()
                )));
            }
        }
        let ptd_blobs: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, f)| match &f.kind {
                Kind::Ptd(p) => Some(locate_ptd(p, i)),
                Kind::Pte(_) => None,
            })
            .collect();
        let pte_layout = match &files[0].kind {
            Kind::Pte(pte) => {
                let data: Vec<_> = files[1..]
                    .iter()
                    .filter_map(|f| match &f.kind {
                        Kind::Ptd(p) => Some(&**p),
                        Kind::Pte(_) => None,
                    })
                    .collect();
                Some(locate_pte(pte, &data))
            }
            Kind::Ptd(_) => None,
        };
        let mut model = Model {
            files,
            pte_layout,
            ptd_blobs,
            named_index: HashMap::new(),
            shared: OnceLock::new(),
        };
        let mut index: HashMap<String, Vec<(FileIndex, usize)>> = HashMap::new();
        for f in 0..model.files.len() {
            for (k, key) in model.named_data_keys(f).into_iter().enumerate() {
                index.entry(key.to_string()).or_default().push((f, k));
            }
        }
        model.named_index = index;
        Ok(model)
    }

    /// Opens the same files again, as they were opened and through the same directories
    /// (after a commit rewrote one).
    pub fn reopen(&self) -> Result<Model, FormatError> {
        let files = self
            .files
            .iter()
            .map(ModelFile::reopen)
            .collect::<Result<Vec<_>, _>>()?;
        Model::from_files(files)
    }

    /// The paths of the files, in their order.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    pub fn pte(&self) -> Option<&Pte> {
        match &self.files[0].kind {
            Kind::Pte(p) => Some(p),
            Kind::Ptd(_) => None,
        }
    }

    /// The tensor facts of value `i` of plan `p`, when it is a tensor.
    pub fn value_tensor(&self, p: usize, i: usize) -> Option<&crate::format::layout::TensorData> {
        self.pte_layout
            .as_ref()?
            .plans
            .get(p)?
            .tensors
            .get(i)?
            .as_deref()
    }

    pub fn ptd(&self, file: FileIndex) -> Option<&Ptd> {
        match &self.files.get(file)?.kind {
            Kind::Ptd(p) => Some(p),
            Kind::Pte(_) => None,
        }
    }

    /// Where the named-data entry `key` is, looking in the mounted file first, then in the
    /// attached files in order (the runtime's order): its file, its index there, and its
    /// bytes (or why they cannot be located).
    pub fn named_blob(
        &self, key: &str,
    ) -> Option<(FileIndex, usize, Result<Location, FormatError>)> {
        let &(file, k) = self.named_index.get(key)?.first()?;
        let location = match &self.files[file].kind {
            Kind::Pte(_) => self.pte_layout.as_ref()?.named_data.get(k)?.clone(),
            Kind::Ptd(_) => self.ptd_blobs[file].as_ref()?.get(k)?.location.clone(),
        };
        Some((file, k, location))
    }

    /// Keys of the named blobs of file `file`, in table order.
    pub fn named_data_keys(&self, file: FileIndex) -> Vec<&str> {
        match &self.files[file].kind {
            Kind::Pte(p) => p
                .program
                .named_data
                .iter()
                .flatten()
                .map(|n| n.key.as_deref().unwrap_or_default())
                .collect(),
            Kind::Ptd(_) => self.ptd_blobs[file]
                .iter()
                .flatten()
                .map(|b| b.key.as_str())
                .collect(),
        }
    }
}
