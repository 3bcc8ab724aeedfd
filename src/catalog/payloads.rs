//! The decoded delegate payloads of a model, of every backend ptefs decodes, and which
//! values read each named-data key (for `used_by`, for `weights.safetensors`' types, and
//! for refusing writes that another value reads too).
//!
//! Invariants: a delegate whose payload does not decode, or whose backend has no decoder,
//! has no entry (its directory shows only `delegate.json` and `processed.bin`); every
//! `Decoded::payload` lies inside its file (it came from the model's layout).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::backend::{
    decode_payload, locate, Blob, BlobRef, FloatView, KeyRole, NotDecoded, Payload, ResolvedBytes,
};
use crate::format::layout::Location;
use crate::format::{FormatError, Model};

/// A payload that decoded, and where it is.
#[derive(Debug)]
pub struct Decoded {
    pub payload: Box<dyn Payload>,
    pub location: Location,
    /// The bytes of the payload its tree reads: all of them, or, for a large payload of a
    /// file that is not in memory (a remote one), its header and flatbuffer.
    read: Location,
}

/// Past this size, a payload of a file that is not in memory is read up to the end of its
/// flatbuffer only: its data region (constants) is read when a file shows it.
const READ_WHOLE: u64 = 1 << 20;

/// The bytes of the payload at `location` to decode: the whole payload, or, when the file
/// is not in memory and the payload is large and has a header (`XH00`, `VH00`), its header
/// and flatbuffer, in a buffer of the payload's size whose other bytes are zeros that are
/// never read (the decoders check the data region's bounds only; the operating system
/// gives such pages no memory until they are written). And which bytes those are.
fn payload_bytes<'m>(
    model: &'m Model, location: &Location,
) -> Result<(Cow<'m, [u8]>, Location), FormatError> {
    let file = &model.files[location.file];
    let len = location.range.len();
    if file.mapped().is_some() || len <= READ_WHOLE {
        return Ok((file.read_at(location)?, *location));
    }
    let head = file.read(location.range.slice_from(0, 30))?;
    let u32_at = |at: usize| {
        u64::from(u32::from_le_bytes([
            head[at],
            head[at + 1],
            head[at + 2],
            head[at + 3],
        ]))
    };
    let flatbuffer_end = match &head[4..8] {
        // Never less than the header itself.
        b"XH00" | b"VH00" => (u32_at(10) + u32_at(14)).max(head.len() as u64),
        _ => len,
    };
    if flatbuffer_end >= len {
        return Ok((file.read_at(location)?, *location));
    }
    let prefix = Location {
        file: location.file,
        range: location.range.slice_from(0, flatbuffer_end),
    };
    let mut bytes = vec![0u8; len as usize];
    bytes[..flatbuffer_end as usize].copy_from_slice(&file.read_at(&prefix)?);
    Ok((Cow::Owned(bytes), prefix))
}

impl Decoded {
    /// The bytes the payload's renderings read (its header and flatbuffer at least).
    pub fn bytes<'m>(&self, model: &'m Model) -> Result<Cow<'m, [u8]>, FormatError> {
        model.files[self.read.file].read_at(&self.read)
    }

    /// Where the bytes a reference of this payload names are.
    pub fn locate(&self, model: &Model, r: &BlobRef) -> Option<Location> {
        locate(model, self.location, r)
    }

    /// The float32 view of value `k`, placed in `model`.
    pub fn float_view(&self, model: &Model, k: usize) -> Option<FloatView> {
        self.payload.float_view(k, &|r| self.locate(model, r))
    }

    /// The values constant `k` stands for, placed in `model` (docs/tree.md#histograms).
    pub fn value_view(&self, model: &Model, k: usize) -> Option<FloatView> {
        self.payload.value_view(k, &|r| self.locate(model, r))
    }

    /// `values/<k>.json` of this payload.
    pub fn value_json(&self, model: &Model, k: usize) -> Value {
        let resolve = |r: &BlobRef| {
            let l = self.locate(model, r)?;
            Some(ResolvedBytes {
                file: file_name(model, l.file),
                file_offset: l.range.start(),
                nbytes: l.range.len(),
            })
        };
        self.payload.value_json(k, &resolve)
    }

    /// `graph.json` of this payload.
    pub fn graph_json(&self, model: &Model) -> Value {
        match self.bytes(model) {
            Ok(bytes) => self.payload.graph_json(&bytes),
            Err(e) => json!({ "error": e.to_string() }),
        }
    }

    /// Every blob the payload reads, with where it is.
    pub fn placed_blobs(&self, model: &Model) -> Vec<(Blob, BlobAt)> {
        self.payload
            .blobs()
            .into_iter()
            .map(|b| {
                let at = self.locate(model, &b.bytes).ok_or_else(|| match &b.bytes {
                    BlobRef::Named { key, size } => Some((key.clone(), *size)),
                    BlobRef::Payload { .. } => None,
                });
                (b, at)
            })
            .collect()
    }
}

/// Where a blob is: its bytes, else the named key no attached file holds with the size the
/// graph records (None for bytes of the payload itself that do not fit in it).
pub type BlobAt = std::result::Result<Location, Option<(String, u64)>>;

/// What `file` holds in generated JSON: the model file's name in its directory (what the
/// command line named, without the directory). Never the directory: two mounts of equal
/// copies in different directories render equal bytes, so `diff -r` of them is empty. The
/// absolute path is in the `user.ptefs.file` xattr; with `file_offset`, the name is what
/// `xxd -s` reads from the model's directory.
pub fn file_name(model: &Model, file: usize) -> String {
    model.files[file].name.to_string_lossy().into_owned()
}

/// One read of a named-data key by a value of a decoded payload.
#[derive(Debug, Clone)]
pub struct KeyUse {
    pub plan: usize,
    pub delegate: usize,
    /// The directory of the backend's tree (`xnnpack`).
    pub backend_dir: &'static str,
    /// The backend's name in reports (`XNNPACK`).
    pub backend_name: &'static str,
    pub blob: Blob,
}

impl KeyUse {
    /// What the key holds for this reader: `XNNPACK qbint4`, or `XNNPACK qbint4 scales`.
    pub fn describe(&self) -> String {
        match self.blob.role {
            KeyRole::Constant => format!("{} {}", self.backend_name, self.blob.datatype),
            KeyRole::Scale => format!("{} {} scales", self.backend_name, self.blob.datatype),
        }
    }
}

/// Every decoded delegate payload of a model, why the others of a known backend do not
/// decode, and which values read each named key.
#[derive(Debug, Default)]
pub struct Payloads {
    decoded: BTreeMap<(usize, usize), Arc<Decoded>>,
    refused: BTreeMap<(usize, usize), FormatError>,
    uses: HashMap<String, Vec<KeyUse>>,
}

impl Payloads {
    /// Decodes every delegate payload of `model` that a backend decoder reads.
    pub fn decode(model: &Model) -> Payloads {
        let mut out = Payloads::default();
        let (Some(pte), Some(layout)) = (model.pte(), &model.pte_layout) else {
            return out;
        };
        let plans = pte.program.execution_plan.as_deref().unwrap_or_default();
        for (p, plan) in plans.iter().enumerate() {
            for (j, d) in plan.delegates.iter().flatten().enumerate() {
                let Some(Ok(location)) = layout.plans[p].delegates.get(j) else {
                    continue;
                };
                let (bytes, read) = match payload_bytes(model, location) {
                    Ok(b) => b,
                    Err(e) => {
                        out.refused.insert((p, j), e);
                        continue;
                    }
                };
                let payload = match decode_payload(d.id.as_deref().unwrap_or(""), &bytes) {
                    Ok(payload) => payload,
                    Err(NotDecoded::NoDecoder) => continue,
                    Err(NotDecoded::Invalid(e)) => {
                        out.refused.insert((p, j), e);
                        continue;
                    }
                };
                let backend = payload.backend();
                for blob in payload.blobs() {
                    let BlobRef::Named { key, .. } = &blob.bytes else {
                        continue;
                    };
                    out.uses.entry(key.clone()).or_default().push(KeyUse {
                        plan: p,
                        delegate: j,
                        backend_dir: backend.dir_name(),
                        backend_name: backend.display_name(),
                        blob,
                    });
                }
                out.decoded.insert(
                    (p, j),
                    Arc::new(Decoded {
                        payload,
                        location: *location,
                        read,
                    }),
                );
            }
        }
        out
    }

    /// Every decoded payload, by (plan, delegate).
    pub fn iter(&self) -> impl Iterator<Item = (&(usize, usize), &Arc<Decoded>)> {
        self.decoded.iter()
    }

    pub fn get(&self, plan: usize, delegate: usize) -> Option<&Arc<Decoded>> {
        self.decoded.get(&(plan, delegate))
    }

    /// Why the payload of delegate (`plan`, `delegate`) does not decode, when its backend
    /// has a decoder that refused it.
    pub fn refusal(&self, plan: usize, delegate: usize) -> Option<&FormatError> {
        self.refused.get(&(plan, delegate))
    }

    /// The values that read named-data key `key`, in plan, delegate and value order.
    pub fn uses_of(&self, key: &str) -> &[KeyUse] {
        self.uses.get(key).map_or(&[], Vec::as_slice)
    }
}

/// `used_by` of `named_data/<key>.json`: the values that read the key, with the tree path
/// of each (`plan_dirs` names the plans' directories).
pub fn used_by_json(uses: &[KeyUse], plan_dirs: &[String]) -> Value {
    Value::Array(
        uses.iter()
            .map(|u| {
                json!({
                    "path": format!(
                        "plans/{}/delegates/{}/{}/values/{}",
                        plan_dirs[u.plan], u.delegate, u.backend_dir, u.blob.value
                    ),
                    "role": u.blob.role.as_str(),
                    "datatype": u.blob.datatype,
                    "dims": u.blob.dims,
                })
            })
            .collect(),
    )
}
