//! Decoding a payload into an owned, checked [`VkGraph`].
//!
//! Values are found the way `VulkanBackend.cpp` (`GraphBuilder::build_graph`) finds them: a
//! value's id is its position in `VkGraph.values`, and operator arguments, `input_ids`,
//! `output_ids` and `ValueList` items are such ids. A `VkTensor` with `constant_id >= 0` is a
//! constant whose bytes `constants[constant_id]` locates: named data under `named_key` when
//! the key is present and `offset` is `u64::MAX`, else `offset .. offset + length` of the
//! payload's bytes region (`GraphBuilder::add_tensor_to_graph`).

use std::fmt;

use super::datatype::{Datatype, MemoryLayout, StorageType};
use super::header::{parse_header, VkHeader};
pub use crate::backend::blob::BlobRef;
use crate::error::Error;
use crate::format::generated::vk_fb;
use crate::format::pte::{describe_verifier_error, verifier_options_for};
use crate::format::range::{checked_range, ByteRange};
use crate::format::FormatError;

/// `VkBytes.offset` of a constant kept as named data.
pub const NAMED_DATA_OFFSET: u64 = u64::MAX;

/// A `VkBytes` entry of `constants` or `shaders`, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BytesEntry {
    pub offset: u64,
    pub length: u64,
    /// None when the field is absent.
    pub named_key: Option<String>,
}

impl BytesEntry {
    /// Named data, as the runtime decides it: a key, and the offset that marks named data.
    pub fn is_named(&self) -> bool {
        self.named_key.is_some() && self.offset == NAMED_DATA_OFFSET
    }
}

/// A `VkTensor`, with its constant's location resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct VkTensor {
    pub datatype: Datatype,
    pub dims: Vec<u32>,
    /// Negative: not a constant.
    pub constant_id: i32,
    /// Negative: the tensor has memory of its own.
    pub mem_obj_id: i32,
    pub storage_type: StorageType,
    pub memory_layout: MemoryLayout,
    /// The type of the staging buffer that carries inputs and outputs (`UNSET`: `datatype`).
    pub staging_datatype: Datatype,
    /// The constant's bytes; None for tensors that are not constants.
    pub constant: Option<BlobRef>,
}

impl VkTensor {
    /// `"float32[4,8]"`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(u32::to_string).collect();
        format!("{}[{}]", self.datatype.display(), dims.join(","))
    }

    /// Bytes the tensor takes for its datatype and dims, so callers can report a constant
    /// whose bytes are a different size.
    pub fn expected_nbytes(&self) -> Result<u64, Error> {
        self.datatype.nbytes(&self.dims)
    }
}

/// The `GraphTypes` member a value holds, with its fields.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueKind {
    Null,
    Int(i64),
    Double(f64),
    Bool(bool),
    Tensor(VkTensor),
    IntList(Vec<i64>),
    DoubleList(Vec<f64>),
    BoolList(Vec<bool>),
    /// Ids of other values (checked to exist).
    ValueList(Vec<u32>),
    String(String),
    /// A symbolic integer's initial value.
    SymInt(i32),
}

impl ValueKind {
    /// The union member's name: `"VkTensor"`, `"IntList"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            ValueKind::Null => "Null",
            ValueKind::Int(_) => "Int",
            ValueKind::Double(_) => "Double",
            ValueKind::Bool(_) => "Bool",
            ValueKind::Tensor(_) => "VkTensor",
            ValueKind::IntList(_) => "IntList",
            ValueKind::DoubleList(_) => "DoubleList",
            ValueKind::BoolList(_) => "BoolList",
            ValueKind::ValueList(_) => "ValueList",
            ValueKind::String(_) => "String",
            ValueKind::SymInt(_) => "SymInt",
        }
    }
}

/// One argument of an operator call naming a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// Index of the call in `chain`.
    pub op: usize,
    /// Position among the call's `args` (the exporter appends the output last).
    pub arg: usize,
}

/// The graph input and output positions of a value: `input_ids[k]` is the delegate's `k`-th
/// input, `output_ids[k]` its `k`-th output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct External {
    pub input: Option<u32>,
    pub output: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VkValue {
    /// Position in `values`: the id arguments refer to.
    pub id: u32,
    pub kind: ValueKind,
    /// Every argument of every call that names this value, in chain order.
    pub used_by: Vec<Use>,
}

impl VkValue {
    pub fn type_name(&self) -> &'static str {
        self.kind.type_name()
    }

    pub fn tensor(&self) -> Option<&VkTensor> {
        match &self.kind {
            ValueKind::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The constant's bytes, for constant tensors.
    pub fn constant(&self) -> Option<&BlobRef> {
        self.tensor().and_then(|t| t.constant.as_ref())
    }
}

/// An `OperatorCall` of `chain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorCall {
    pub node_id: u32,
    /// The operator (`"aten.linear.default"`, `"et_vk.linear_q4gsw.default"`).
    pub name: String,
    /// Value ids, each checked to exist; None when the field is absent.
    pub args: Option<Vec<u32>>,
}

impl OperatorCall {
    pub fn args(&self) -> &[u32] {
        self.args.as_deref().unwrap_or_default()
    }
}

/// A decoded Vulkan payload. Every id, constant reference and byte range in it was checked.
#[derive(Debug, Clone, PartialEq)]
pub struct VkGraph {
    pub header: Option<VkHeader>,
    /// Where the flatbuffer is in the payload.
    pub flatbuffer: ByteRange,
    /// Where the bytes region is in the payload, as the runtime reads it; None without a
    /// header.
    pub bytes_region: Option<ByteRange>,
    pub version: Option<String>,
    pub chain: Vec<OperatorCall>,
    pub values: Vec<VkValue>,
    pub input_ids: Option<Vec<u32>>,
    pub output_ids: Option<Vec<u32>>,
    pub constants: Option<Vec<BytesEntry>>,
    /// Custom shaders; recorded, never read (the exporter writes none, the runtime reads none).
    pub shaders: Option<Vec<BytesEntry>>,
    pub storage_type_override: StorageType,
    pub memory_layout_override: MemoryLayout,
}

/// One read of a named-data key: the constant tensor reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedUse<'a> {
    pub key: &'a str,
    /// The value's id.
    pub value: u32,
}

impl VkGraph {
    /// The value with id `id`.
    pub fn value(&self, id: u32) -> Option<&VkValue> {
        self.values.get(id as usize)
    }

    /// Constant tensors, in `values` order.
    pub fn constants(&self) -> impl Iterator<Item = &VkValue> {
        self.values.iter().filter(|v| v.constant().is_some())
    }

    /// Every named-data key the graph reads, with the value reading it, in `values` order:
    /// what `named_data/<key>.json` lists as `used_by`. Two values may read one key (equal
    /// bytes share a key).
    pub fn named_uses(&self) -> Vec<NamedUse<'_>> {
        self.values
            .iter()
            .filter_map(|v| match v.constant() {
                Some(BlobRef::Named { key, .. }) => Some(NamedUse { key, value: v.id }),
                _ => None,
            })
            .collect()
    }

    /// The first positions of `id` in `input_ids` and `output_ids`.
    pub fn external(&self, id: u32) -> External {
        let position = |ids: &Option<Vec<u32>>| {
            ids.as_ref()
                .and_then(|ids| ids.iter().position(|&i| i == id))
                .map(|k| k as u32)
        };
        External {
            input: position(&self.input_ids),
            output: position(&self.output_ids),
        }
    }
}

struct ValuePlace(usize);

impl fmt::Display for ValuePlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "values[{}]", self.0)
    }
}

/// How constant ids resolve in this payload.
struct Constants<'a> {
    entries: &'a [BytesEntry],
    region: Option<ByteRange>,
}

impl Constants<'_> {
    fn resolve(&self, t: &vk_fb::VkTensor, place: &ValuePlace) -> Result<BlobRef, FormatError> {
        let id = t.constant_id();
        let entry = usize::try_from(id)
            .ok()
            .and_then(|i| self.entries.get(i))
            .ok_or_else(|| {
                FormatError::mismatch(
                    "constant_id",
                    place,
                    format!("< {} (the number of constants)", self.entries.len()),
                    id,
                )
            })?;
        if entry.is_named() {
            return Ok(BlobRef::Named {
                key: entry.named_key.clone().unwrap_or_default(),
                size: entry.length,
            });
        }
        let region = self.region.ok_or_else(|| {
            FormatError::mismatch(
                "constant_id",
                place,
                format!("named data (constants[{id}] has offset {} in a bytes region, and a payload without a VH00 header has none)", entry.offset),
                id,
            )
        })?;
        let what = format!(
            "constant_id {id} at {place}: constants[{id}] (offset {}, length {}) in the bytes region",
            entry.offset, entry.length
        );
        let r = checked_range(
            &what,
            region.start(),
            entry.offset,
            entry.length,
            region.end(),
        )?;
        // The runtime reads element size × dims bytes from the offset, not `length`.
        if let Ok(extent) = Datatype(t.datatype().0).nbytes(
            &t.dims()
                .map(|d| d.iter().collect::<Vec<_>>())
                .unwrap_or_default(),
        ) {
            let what = format!(
                "constant_id {id} at {place}: the tensor's {extent} bytes from constants[{id}].offset {} in the bytes region",
                entry.offset
            );
            checked_range(&what, region.start(), entry.offset, extent, region.end())?;
        }
        Ok(BlobRef::Payload {
            offset: r.start(),
            size: r.len(),
        })
    }
}

fn bytes_entries(
    v: Option<flatbuffers::Vector<'_, flatbuffers::ForwardsUOffset<vk_fb::VkBytes<'_>>>>,
) -> Option<Vec<BytesEntry>> {
    v.map(|v| {
        v.iter()
            .map(|b| BytesEntry {
                offset: b.offset(),
                length: b.length(),
                named_key: b.named_key().map(str::to_string),
            })
            .collect()
    })
}

fn decode_value(
    index: usize, v: vk_fb::VkValue, constants: &Constants,
) -> Result<ValueKind, FormatError> {
    use vk_fb::GraphTypes as G;
    let place = ValuePlace(index);
    let ty = v.value_type();
    let missing = || {
        FormatError::mismatch(
            "VkValue.value",
            &place,
            format!("a {} table", ty.variant_name().unwrap_or("value")),
            "none",
        )
    };
    Ok(match ty {
        G::Null => ValueKind::Null,
        G::Int => ValueKind::Int(v.value_as_int().ok_or_else(missing)?.int_val()),
        G::Double => ValueKind::Double(v.value_as_double().ok_or_else(missing)?.double_val()),
        G::Bool => ValueKind::Bool(v.value_as_bool().ok_or_else(missing)?.bool_val()),
        G::VkTensor => {
            let t = v.value_as_vk_tensor().ok_or_else(missing)?;
            let constant = if t.constant_id() >= 0 {
                Some(constants.resolve(&t, &place)?)
            } else {
                None
            };
            ValueKind::Tensor(VkTensor {
                datatype: Datatype(t.datatype().0),
                dims: t.dims().map(|d| d.iter().collect()).unwrap_or_default(),
                constant_id: t.constant_id(),
                mem_obj_id: t.mem_obj_id(),
                storage_type: StorageType(t.storage_type().0),
                memory_layout: MemoryLayout(t.memory_layout().0),
                staging_datatype: Datatype(t.staging_datatype().0),
                constant,
            })
        }
        G::IntList => ValueKind::IntList(
            v.value_as_int_list()
                .ok_or_else(missing)?
                .items()
                .map(|i| i.iter().collect())
                .unwrap_or_default(),
        ),
        G::DoubleList => ValueKind::DoubleList(
            v.value_as_double_list()
                .ok_or_else(missing)?
                .items()
                .map(|i| i.iter().collect())
                .unwrap_or_default(),
        ),
        G::BoolList => ValueKind::BoolList(
            v.value_as_bool_list()
                .ok_or_else(missing)?
                .items()
                .map(|i| i.iter().collect())
                .unwrap_or_default(),
        ),
        G::ValueList => {
            let items = v.value_as_value_list().ok_or_else(missing)?.items();
            // Checked against the number of values once all are read.
            let ids = items
                .map(|i| {
                    i.iter()
                        .enumerate()
                        .map(|(k, id)| {
                            u32::try_from(id).map_err(|_| {
                                FormatError::mismatch(
                                    "ValueList.items",
                                    format!("values[{index}].items[{k}]"),
                                    "the id of a value",
                                    id,
                                )
                            })
                        })
                        .collect::<Result<Vec<u32>, FormatError>>()
                })
                .transpose()?;
            ValueKind::ValueList(ids.unwrap_or_default())
        }
        G::String => ValueKind::String(
            v.value_as_string()
                .ok_or_else(missing)?
                .string_val()
                .unwrap_or_default()
                .to_string(),
        ),
        G::SymInt => ValueKind::SymInt(v.value_as_sym_int().ok_or_else(missing)?.value()),
        other => {
            return Err(FormatError::mismatch(
                "VkValue.value type",
                &place,
                "a GraphTypes member (1..=11: Null, Int, Double, Bool, VkTensor, IntList, DoubleList, BoolList, ValueList, String, SymInt)",
                other.0,
            ))
        }
    })
}

/// `id` as a value id of a graph with `count` values, or the error naming `what` at `place`.
fn value_id(
    id: i64, count: usize, what: &str, place: impl fmt::Display,
) -> Result<u32, FormatError> {
    u32::try_from(id)
        .ok()
        .filter(|&i| (i as usize) < count)
        .ok_or_else(|| {
            FormatError::mismatch(what, place, format!("the id of a value (0..{count})"), id)
        })
}

/// Decodes a Vulkan delegate payload: the `VH00` header (or a bare flatbuffer), the verified
/// `VkGraph`, and every reference in it. Errors name what, where, expected and found. Never
/// reads outside `payload`; what it allocates is bounded by the verifier's apparent-size
/// limit, a small multiple of the payload's size.
pub fn decode(payload: &[u8]) -> Result<VkGraph, FormatError> {
    let header = parse_header(payload)?;
    let len = payload.len() as u64;
    let flatbuffer = header.map_or(ByteRange::new(0, len).expect("a slice's length"), |h| {
        h.flatbuffer_range()
    });
    let bytes_region = header.map(|h| h.bytes_range(len));
    let flat = &payload[flatbuffer.as_usize()];
    if flat.len() < 8 {
        return Err(FormatError::mismatch(
            "VkGraph flatbuffer size",
            format!("payload bytes {}..{}", flatbuffer.start(), flatbuffer.end()),
            "at least 8 bytes (a root offset and an identifier)",
            format!("{} bytes", flat.len()),
        ));
    }
    if &flat[4..8] != vk_fb::VK_GRAPH_IDENTIFIER.as_bytes() {
        return Err(FormatError::mismatch(
            "VkGraph identifier",
            format!("payload byte {}", flatbuffer.start() + 4),
            "VK00",
            format!("{:?}", String::from_utf8_lossy(&flat[4..8])),
        ));
    }
    let root =
        flatbuffers::root_with_opts::<vk_fb::VkGraph>(&verifier_options_for(flat.len()), flat)
            .map_err(|e| describe_verifier_error("VkGraph flatbuffer", &e))?;

    let constants = bytes_entries(root.constants());
    let resolver = Constants {
        entries: constants.as_deref().unwrap_or_default(),
        region: bytes_region,
    };
    let mut values = Vec::new();
    for (i, v) in root.values().iter().flatten().enumerate() {
        values.push(VkValue {
            id: i as u32,
            kind: decode_value(i, v, &resolver)?,
            used_by: Vec::new(),
        });
    }
    let count = values.len();
    for v in &values {
        if let ValueKind::ValueList(items) = &v.kind {
            for (k, &id) in items.iter().enumerate() {
                value_id(
                    i64::from(id),
                    count,
                    "ValueList.items",
                    format!("values[{}].items[{k}]", v.id),
                )?;
            }
        }
    }

    let mut chain = Vec::new();
    for (k, op) in root.chain().iter().flatten().enumerate() {
        let name = op.name().ok_or_else(|| {
            FormatError::mismatch(
                "OperatorCall.name",
                format!("chain[{k}]"),
                "a string",
                "none",
            )
        })?;
        let args = op
            .args()
            .map(|args| {
                args.iter()
                    .enumerate()
                    .map(|(a, id)| {
                        value_id(
                            i64::from(id),
                            count,
                            "OperatorCall.args",
                            format!("chain[{k}] ({name}) args[{a}]"),
                        )
                    })
                    .collect::<Result<Vec<u32>, FormatError>>()
            })
            .transpose()?;
        for (a, &id) in args.iter().flatten().enumerate() {
            values[id as usize].used_by.push(Use { op: k, arg: a });
        }
        chain.push(OperatorCall {
            node_id: op.node_id(),
            name: name.to_string(),
            args,
        });
    }

    let id_list = |v: Option<flatbuffers::Vector<'_, u32>>, what: &str| {
        v.map(|ids| {
            ids.iter()
                .enumerate()
                .map(|(i, id)| value_id(i64::from(id), count, what, format!("{what}[{i}]")))
                .collect::<Result<Vec<u32>, FormatError>>()
        })
        .transpose()
    };
    let input_ids = id_list(root.input_ids(), "input_ids")?;
    let output_ids = id_list(root.output_ids(), "output_ids")?;

    Ok(VkGraph {
        header,
        flatbuffer,
        bytes_region,
        version: root.version().map(str::to_string),
        chain,
        values,
        input_ids,
        output_ids,
        constants,
        shaders: bytes_entries(root.shaders()),
        storage_type_override: StorageType(root.storage_type_override().0),
        memory_layout_override: MemoryLayout(root.memory_layout_override().0),
    })
}
