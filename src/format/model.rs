//! Opening a model: map each file, decide its kind from the identifier, parse it, and resolve
//! where every tensor, payload and blob keeps its bytes.
//!
//! Invariant: a `ModelFile` always holds a successfully parsed file; the bytes it parsed stay
//! mapped for as long as it lives.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::header::{detect_kind, FileKind};
use super::layout::{locate_ptd, locate_pte, FileIndex, NamedBlob, PteLayout};
use super::ptd::{parse_ptd, Ptd};
use super::pte::{parse_pte, Pte};
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
    pub file: Option<File>,
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

impl ModelFile {
    /// Maps and parses `path`. Errors start with the path.
    pub fn open(path: &Path) -> Result<ModelFile, FormatError> {
        let shown = path.display();
        let file =
            File::open(path).map_err(|e| FormatError::new(format!("{shown}: cannot open: {e}")))?;
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
        Ok(ModelFile {
            // Absolute, so that xattrs and JSON name a path usable from any directory.
            path: path.canonicalize().unwrap_or_else(|_| path.to_path_buf()),
            kind,
            file: Some(file),
            backing,
        })
    }

    /// Parses bytes held in memory (tests, fuzzing, freshly written files).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<ModelFile, FormatError> {
        let kind = Kind::parse(&bytes)?;
        Ok(ModelFile {
            path: path.to_path_buf(),
            kind,
            file: None,
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
}

impl Model {
    /// Opens the mounted file and its attached `.ptd` files and resolves every byte range.
    pub fn open(path: &Path, data: &[impl AsRef<Path>]) -> Result<Model, FormatError> {
        let mut files = vec![ModelFile::open(path)?];
        for d in data {
            files.push(ModelFile::open(d.as_ref())?);
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
        Ok(Model {
            files,
            pte_layout,
            ptd_blobs,
        })
    }

    /// Opens the same files again (after a commit rewrote one of them).
    pub fn reopen(&self) -> Result<Model, FormatError> {
        let paths = self.paths();
        Model::open(&paths[0], &paths[1..])
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
