//! Opening a model: map each file, decide its kind from the identifier, parse it, and resolve
//! where every tensor, payload and blob keeps its bytes.
//!
//! Invariant: a `ModelFile` always holds a successfully parsed file; the bytes it parsed stay
//! mapped for as long as it lives.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use memmap2::Mmap;

use super::header::{detect_kind, FileKind};
use super::layout::{locate_ptd, locate_pte, FileIndex, Location, NamedBlob, PteLayout};
use super::ptd::{parse_ptd, Ptd};
use super::pte::{parse_pte, Pte};
use super::range::ByteRange;
use super::sharing::SharedBytes;
use super::FormatError;

#[derive(Debug, Clone)]
pub enum Kind {
    Pte(Box<Pte>),
    Ptd(Box<Ptd>),
}

impl Kind {
    /// Parses bytes of either kind, chosen by the identifier at byte 4.
    pub fn parse(bytes: &[u8]) -> Result<Kind, FormatError> {
        Ok(match detect_kind(bytes)? {
            FileKind::Pte => Kind::Pte(Box::new(parse_pte(bytes)?)),
            FileKind::Ptd => Kind::Ptd(Box::new(parse_ptd(bytes)?)),
        })
    }

    pub fn file_kind(&self) -> FileKind {
        match self {
            Kind::Pte(_) => FileKind::Pte,
            Kind::Ptd(_) => FileKind::Ptd,
        }
    }
}

enum Backing {
    /// The watch is declared first so it is dropped (unregistered) before the unmap.
    Map(crate::guard::Watch, Mmap),
    Owned(Vec<u8>),
}

/// A mapped and parsed `.pte` or `.ptd`.
pub struct ModelFile {
    pub path: PathBuf,
    pub kind: Kind,
    /// The descriptor the file was mapped from: commits write through it (when it was
    /// opened for writing), never through the path, which another process may repoint.
    pub file: Option<File>,
    /// The directory holding the file, opened before it (the file is opened relative to it,
    /// so the two always go together): files beside the model (journals, re-layout files)
    /// are created relative to it, and the file is opened again through it, never through
    /// its path.
    pub dir: Option<Arc<File>>,
    /// The file's name in `dir`, as bytes.
    pub name: OsString,
    /// Device and inode of `file`, to tell whether `path` still names it.
    pub identity: Option<(u64, u64)>,
    /// Whether `file` was opened for writing.
    pub writable: bool,
    backing: Backing,
}

impl std::fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFile")
            .field("path", &self.path)
            .field("len", &self.bytes().len())
            .finish()
    }
}

/// Device and inode of `name` in `dir`, without following a link.
pub fn stat_in(dir: &File, name: &OsStr) -> std::io::Result<(u64, u64)> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL in the name"))?;
    // SAFETY: zeroed memory is a valid stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid directory descriptor, C string and stat buffer.
    if unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// Opens `name` in directory `dir` without following a link.
fn open_in(dir: &File, name: &OsStr, writable: bool) -> std::io::Result<File> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL in the name"))?;
    let access = if writable {
        libc::O_RDWR
    } else {
        libc::O_RDONLY
    };
    // SAFETY: a valid directory descriptor and C string.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            access | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned here alone.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens `name` in `dir` for writing when `writable` and allowed, else for reading; says
/// which it got.
fn open_in_best(dir: &File, name: &OsStr, writable: bool) -> std::io::Result<(File, bool)> {
    if !writable {
        return open_in(dir, name, false).map(|f| (f, false));
    }
    match open_in(dir, name, true) {
        Ok(f) => Ok((f, true)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS)) => {
            open_in(dir, name, false).map(|f| (f, false))
        }
        Err(e) => Err(e),
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
        let shown = path.display();
        let cannot = |e: std::io::Error| FormatError::new(format!("{shown}: cannot open: {e}"));
        // Absolute, so that xattrs and JSON name a path usable from any directory.
        let path = path.canonicalize().map_err(cannot)?;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(FormatError::new(format!("{shown}: not a file")));
        };
        // The directory first, then the file in it: another process swapping a directory
        // of the path in between cannot make the two disagree.
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(parent)
            .map_err(cannot)?;
        let (file, writable) = open_in_best(&dir, name, writable).map_err(cannot)?;
        let name = name.to_os_string();
        ModelFile::from_file(path, file, Some((Arc::new(dir), name)), writable)
    }

    /// Opens the same file again, through the directory it was opened in (after a commit
    /// renamed a new file over its name).
    pub fn reopen(&self) -> Result<ModelFile, FormatError> {
        let Some(dir) = &self.dir else {
            return ModelFile::open_with(&self.path, self.writable);
        };
        let shown = self.path.display();
        let (file, writable) = open_in_best(dir, &self.name, self.writable)
            .map_err(|e| FormatError::new(format!("{shown}: cannot open: {e}")))?;
        ModelFile::from_file(
            self.path.clone(),
            file,
            Some((dir.clone(), self.name.clone())),
            writable,
        )
    }

    /// Maps and parses an open file known as `path` (name `.1` in directory `.0`).
    pub fn from_file(
        path: PathBuf, file: File, dir: Option<(Arc<File>, OsString)>, writable: bool,
    ) -> Result<ModelFile, FormatError> {
        let shown = path.display();
        let meta = file
            .metadata()
            .map_err(|e| FormatError::new(format!("{shown}: cannot stat: {e}")))?;
        if !meta.is_file() {
            return Err(FormatError::new(format!("{shown}: not a regular file")));
        }
        let backing = if meta.len() == 0 {
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only; a concurrent truncation by another process
            // is handled by `crate::guard` (reads check the size, SIGBUS is caught).
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| FormatError::new(format!("{shown}: cannot map: {e}")))?;
            Backing::Map(crate::guard::Watch::new(map.as_ptr(), map.len()), map)
        };
        let bytes: &[u8] = match &backing {
            Backing::Map(_, m) => m,
            Backing::Owned(v) => v,
        };
        let kind = Kind::parse(bytes).map_err(|e| FormatError::new(format!("{shown}: {e}")))?;
        let (dir, name) = match dir {
            Some((d, n)) => (Some(d), n),
            None => (None, path.file_name().unwrap_or_default().to_os_string()),
        };
        Ok(ModelFile {
            identity: Some((meta.dev(), meta.ino())),
            path,
            kind,
            file: Some(file),
            dir,
            name,
            writable,
            backing,
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
            backing: Backing::Owned(bytes),
        })
    }

    /// Whether the file shrank under its mapping (its bytes can no longer be trusted).
    pub fn poisoned(&self) -> bool {
        match &self.backing {
            Backing::Map(watch, _) => watch.poisoned(),
            Backing::Owned(_) => false,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Map(_, m) => m,
            Backing::Owned(v) => v,
        }
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
                return Err(FormatError::mismatch(
                    "--data file",
                    f.path.display(),
                    "a .ptd (identifier FT01)",
                    "a .pte (identifier ET12)",
                ));
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
