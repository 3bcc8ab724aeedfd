//! One side of a comparison: a `.pte` (with the `.ptd` files attached to it), a `.ptd`, or a
//! safetensors checkpoint, opened read-only, with its tensors listed
//! (`catalog::tensors`) and its bytes readable by location.
//!
//! Invariants: what a file is comes from its bytes (an ExecuTorch identifier at byte 4, else
//! a safetensors header), never from its name; every location a side's tensors name lies
//! inside its files; a checkpoint's bytes are file 0 of the side.

use std::borrow::Cow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::tensors::{self, Tensor};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::safetensors::{self, Header};
use crate::format::{Model, ModelFile};
use crate::source::{ByteSource, LocalFile};

/// What a side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideKind {
    Pte,
    Ptd,
    Checkpoint,
}

impl SideKind {
    /// `"pte"`, `"ptd"` or `"safetensors"`, as the JSON report names it.
    pub fn as_str(self) -> &'static str {
        match self {
            SideKind::Pte => "pte",
            SideKind::Ptd => "ptd",
            SideKind::Checkpoint => "safetensors",
        }
    }
}

/// Where a side's bytes are.
pub enum Input {
    Model(Box<Catalog>),
    Checkpoint {
        source: Box<dyn ByteSource>,
        header: Header,
    },
}

/// An opened side and its tensors.
pub struct Side {
    pub path: PathBuf,
    pub kind: SideKind,
    /// The `.ptd` files attached to a `.pte`.
    pub data: Vec<PathBuf>,
    pub tensors: Vec<Tensor>,
    pub input: Input,
}

impl Side {
    /// Opens `path` (with `data` attached when it is a `.pte`).
    pub fn open(path: &Path, data: &[PathBuf]) -> Result<Side> {
        let shown = path.display();
        let local = LocalFile::open(path, false)
            .map_err(|e| Error::io(format!("{shown}: cannot open"), e))?;
        let mut head = [0u8; 8];
        let n = read_head(&local, &mut head).map_err(|e| Error::io(shown.to_string(), e))?;
        let head = &head[..n];
        let executorch = head.len() == 8 && (head[4..6] == *b"ET" || head[4..6] == *b"FT");
        if executorch {
            let mut files = vec![ModelFile::from_local(local)?];
            for d in data {
                files.push(ModelFile::open(d)?);
            }
            let model = Model::from_files(files)?;
            let kind = if model.pte().is_some() {
                SideKind::Pte
            } else {
                SideKind::Ptd
            };
            let catalog = Catalog::of(Arc::new(model));
            let tensors = tensors::of(&catalog);
            return Ok(Side {
                path: catalog.model.files[0].path.clone(),
                kind,
                data: catalog.model.paths()[1..].to_vec(),
                tensors,
                input: Input::Model(Box::new(catalog)),
            });
        }
        let full = local.path.clone();
        let source = local
            .map()
            .map_err(|e| Error::io(format!("{shown}: cannot map"), e))?;
        let header = checkpoint_header(&*source).map_err(|e| {
            Error::invalid(format!(
                "{shown}: neither an ExecuTorch file (bytes 4..8 are {:?}, expected \"ET12\" or \"FT01\") nor a safetensors checkpoint ({e})",
                String::from_utf8_lossy(head.get(4..).unwrap_or_default())
            ))
        })?;
        if !data.is_empty() {
            return Err(Error::invalid(format!(
                "{shown}: a safetensors checkpoint takes no data files (--data-a and --data-b attach .ptd files to a .pte)"
            )));
        }
        Ok(Side {
            path: full,
            kind: SideKind::Checkpoint,
            data: Vec::new(),
            tensors: tensors::of_checkpoint(&header),
            input: Input::Checkpoint { source, header },
        })
    }

    /// The model, for a `.pte` or `.ptd` side.
    pub fn catalog(&self) -> Option<&Catalog> {
        match &self.input {
            Input::Model(c) => Some(c),
            Input::Checkpoint { .. } => None,
        }
    }

    /// The bytes at `location` (a location of this side's tensors).
    pub fn read(&self, location: &Location) -> Result<Cow<'_, [u8]>> {
        match &self.input {
            Input::Model(c) => Ok(c.model.files[location.file].read_at(location)?),
            Input::Checkpoint { source, .. } => {
                let r = location.range;
                source
                    .read(r.start()..r.end())
                    .map_err(|e| Error::io(format!("{}: cannot read", self.path.display()), e))
            }
        }
    }

    /// Gives back the memory that reading `location` took (`ByteSource::release`).
    pub fn release(&self, location: &Location) {
        match &self.input {
            Input::Model(c) => c.model.files[location.file].release(location.range),
            Input::Checkpoint { source, .. } => {
                source.release(location.range.start()..location.range.end())
            }
        }
    }

    /// The size of each of the side's files, in order.
    pub fn file_sizes(&self) -> Vec<u64> {
        match &self.input {
            Input::Model(c) => c.model.files.iter().map(ModelFile::len).collect(),
            Input::Checkpoint { source, .. } => vec![source.len()],
        }
    }

    /// Whether a file of the side shrank under its mapping since it was opened (another
    /// process truncated it): then nothing read from it can be trusted.
    pub fn poisoned(&self) -> bool {
        match &self.input {
            Input::Model(c) => c.model.files.iter().any(ModelFile::poisoned),
            Input::Checkpoint { source, .. } => source.poisoned(),
        }
    }
}

/// The first bytes of the file, as many as it has up to `buf.len()`.
fn read_head(local: &LocalFile, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match local.file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The parsed header of a safetensors file.
fn checkpoint_header(source: &dyn ByteSource) -> std::result::Result<Header, String> {
    let total = source.len();
    let first = source
        .read(0..total.min(8))
        .map_err(|e| format!("cannot read: {e}"))?;
    let hlen = safetensors::header_len(&first, total, None).map_err(|e| e.to_string())?;
    let head = source
        .read(0..hlen)
        .map_err(|e| format!("cannot read its header: {e}"))?;
    safetensors::parse(&head, total).map_err(|e| e.to_string())
}
