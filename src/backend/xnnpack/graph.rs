//! Decoding a payload into an owned, checked [`XnnGraph`].
//!
//! The flatbuffer is read with the runtime's schema (`schema/xnnpack_runtime.fbs`), as the
//! ExecuTorch runtime does for both `XN00` and `XN01`. Constant bytes are found the way
//! `XNNCompiler.cpp` finds them: with an `XH00` header, through `constant_data[idx]` (a
//! named-data key when `named_key` is present, else an offset into the header's constant
//! region); without one, through the inline `constant_buffer[idx]` of old payloads.

use std::collections::BTreeMap;
use std::fmt;

use super::datatype::Datatype;
use super::header::{parse_header, XnnHeader};
use super::nodes::{member_fields, FieldValue, Member, NodeField, NO_VALUE};
use crate::backend::blob::{BlobRef, KeyRole};
use crate::error::Error;
use crate::format::generated::xnn_fb;
use crate::format::pte::{describe_verifier_error, verifier_options_for};
use crate::format::range::{checked_range, ByteRange};
use crate::format::FormatError;

/// `XNN_VALUE_FLAG_EXTERNAL_INPUT` and `_OUTPUT`.
pub const FLAG_EXTERNAL_INPUT: u32 = 1;
pub const FLAG_EXTERNAL_OUTPUT: u32 = 2;

/// The flatbuffer's file identifier; the runtime accepts these two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identifier {
    /// The older runtime schema: inline `constant_buffer`, `dq_datatype`.
    Xn00,
    Xn01,
}

impl Identifier {
    pub fn as_str(self) -> &'static str {
        match self {
            Identifier::Xn00 => "XN00",
            Identifier::Xn01 => "XN01",
        }
    }
}

/// How scale values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleDtype {
    F32,
    Bf16,
    /// fp32 values that the runtime converts to bfloat16 before use: inline blockwise
    /// scales (`XNNCompiler.cpp`, `convertF32TensorToBF16`: ×1.00389105, then truncation).
    F32RoundedToBf16,
}

impl ScaleDtype {
    pub fn size(self) -> u64 {
        match self {
            ScaleDtype::Bf16 => 2,
            ScaleDtype::F32 | ScaleDtype::F32RoundedToBf16 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ScaleDtype::F32 | ScaleDtype::F32RoundedToBf16 => "fp32",
            ScaleDtype::Bf16 => "bf16",
        }
    }
}

/// Where a quantized value's scales live and how they are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleRef {
    pub bytes: BlobRef,
    pub dtype: ScaleDtype,
    /// Scales the graph declares (`num_scales`, or the inline vector's length).
    pub count: u64,
    /// The scales are in the flatbuffer itself (the `scale` field), not a constant buffer.
    pub inline: bool,
}

/// `XNNQuantParams`, with the scale location resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum QuantParams {
    PerChannel {
        scale: Option<Vec<f32>>,
        channel_dim: i32,
        scale_buffer_idx: u32,
        num_scales: u32,
        /// `scale_buffer_idx`'s bytes (fp32) when non-zero, else the inline `scale`.
        scales: Option<ScaleRef>,
    },
    PerTensor {
        scale: f32,
        zero_point: i32,
        /// The 4 bytes of the `scale` field inside the payload, when the table stores it.
        scale_field: Option<BlobRef>,
    },
    PerTokenDynamic {
        num_nonbatch_dims: i32,
    },
    PerChannelGroup {
        scale: Option<Vec<f32>>,
        channel_dim: i32,
        group_size: i32,
        scale_buffer_idx: u32,
        num_scales: u32,
        /// `scale_buffer_idx`'s bytes (bf16) when non-zero, else the inline fp32 `scale`.
        scales: Option<ScaleRef>,
    },
    /// A union type this schema does not name (0 is NONE).
    Unknown {
        type_code: u8,
    },
}

impl QuantParams {
    /// The union member's table name (`"PerChannelGroupQuant"`), None for unknown types.
    pub fn type_name(&self) -> Option<&'static str> {
        Some(match self {
            QuantParams::PerChannel { .. } => "PerChannelQuant",
            QuantParams::PerTensor { .. } => "PerTensorQuant",
            QuantParams::PerTokenDynamic { .. } => "PerTokenDynamicQuant",
            QuantParams::PerChannelGroup { .. } => "PerChannelGroupQuant",
            QuantParams::Unknown { .. } => return None,
        })
    }

    /// Where the scales live: a blob, an inline vector, or the per-tensor scale field.
    pub fn scale_ref(&self) -> Option<ScaleRef> {
        match self {
            QuantParams::PerChannel { scales, .. }
            | QuantParams::PerChannelGroup { scales, .. } => scales.clone(),
            QuantParams::PerTensor { scale_field, .. } => {
                scale_field.clone().map(|bytes| ScaleRef {
                    bytes,
                    dtype: ScaleDtype::F32,
                    count: 1,
                    inline: true,
                })
            }
            QuantParams::PerTokenDynamic { .. } | QuantParams::Unknown { .. } => None,
        }
    }
}

/// The delegate argument a value is bound to: `external_id` indexes the `DelegateCall`'s
/// arguments (inputs first, then outputs), as `XNNExecutor::prepare_args` reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct External {
    pub input: Option<u32>,
    pub output: Option<u32>,
}

/// One use of a value by a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// Index of the node in `xnodes`.
    pub node: usize,
    /// The node's field name without `_id`: `"input1"`, `"filter"`, `"bias"`, `"output"`.
    pub role: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct XnnValue {
    /// `id_out`: the id nodes, `input_ids` and `output_ids` refer to.
    pub id: u32,
    /// Position in `xvalues`.
    pub index: usize,
    /// `XNNQuantizedTensorValue` rather than `XNNTensorValue`.
    pub quantized: bool,
    pub datatype: Datatype,
    pub num_dims: u32,
    pub dims: Vec<u32>,
    pub constant_buffer_idx: u32,
    pub external_id: u32,
    pub flags: u32,
    /// `XN00` only; 0 (invalid) when absent.
    pub dq_datatype: Datatype,
    /// Present on quantized values.
    pub quant: Option<QuantParams>,
    /// The constant's bytes; None for activations, inputs and outputs.
    pub constant: Option<BlobRef>,
    /// Every node field that names this value, in node order.
    pub used_by: Vec<Use>,
}

impl XnnValue {
    pub fn type_name(&self) -> &'static str {
        if self.quantized {
            "XNNQuantizedTensorValue"
        } else {
            "XNNTensorValue"
        }
    }

    pub fn external(&self) -> External {
        External {
            input: (self.flags & FLAG_EXTERNAL_INPUT != 0).then_some(self.external_id),
            output: (self.flags & FLAG_EXTERNAL_OUTPUT != 0).then_some(self.external_id),
        }
    }

    /// Bytes the constant should have for its datatype and dims (4-bit: half a byte per
    /// element, each row rounded up to a byte), so callers can report a size mismatch.
    pub fn expected_nbytes(&self) -> Result<u64, Error> {
        self.datatype.nbytes(&self.dims)
    }

    /// `"qbint4[64,64]"`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(u32::to_string).collect();
        format!("{}[{}]", self.datatype.display(), dims.join(","))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputMinMax {
    pub output_min: f32,
    pub output_max: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct XnnNode {
    /// The `XNodeUnion` type value.
    pub union_type: u8,
    /// Fields of the member table in schema order; empty for an unknown member.
    pub fields: Vec<NodeField>,
    pub debug_handle: u32,
    pub output_min_max: Option<OutputMinMax>,
}

impl XnnNode {
    /// The union member's name (`"XNNFullyConnected"`); None for values the schema lacks.
    pub fn op_name(&self) -> Option<&'static str> {
        xnn_fb::XNodeUnion(self.union_type).variant_name()
    }

    pub fn display_op(&self) -> String {
        self.op_name()
            .map_or_else(|| self.union_type.to_string(), str::to_string)
    }

    pub fn field(&self, name: &str) -> Option<&FieldValue> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .map(|f| &f.value)
    }
}

/// A `ConstantDataOffset` entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstantDataEntry {
    pub offset: u64,
    pub size: u64,
    /// None when the field is absent (an offset into the constant region).
    pub named_key: Option<String>,
}

/// A decoded XNNPACK payload. Every id, constant index and byte range in it was checked.
#[derive(Debug, Clone, PartialEq)]
pub struct XnnGraph {
    pub header: Option<XnnHeader>,
    pub identifier: Identifier,
    /// Where the flatbuffer is in the payload.
    pub flatbuffer: ByteRange,
    pub version: Option<String>,
    pub nodes: Vec<XnnNode>,
    pub values: Vec<XnnValue>,
    pub num_externs: u32,
    pub input_ids: Option<Vec<u32>>,
    pub output_ids: Option<Vec<u32>>,
    pub constant_data: Option<Vec<ConstantDataEntry>>,
    /// The inline `constant_buffer` (XN00): each entry's storage as a payload range.
    pub constant_buffer: Option<Vec<Option<ByteRange>>>,
    pub mem_buffer_sizes: Option<Vec<u32>>,
    by_id: BTreeMap<u32, usize>,
}

impl XnnGraph {
    /// The value whose `id_out` is `id`.
    pub fn value(&self, id: u32) -> Option<&XnnValue> {
        self.by_id.get(&id).map(|&i| &self.values[i])
    }

    /// The position in `values` of the value whose `id_out` is `id`.
    pub fn index_of(&self, id: u32) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    /// Values that hold constant bytes, in `xvalues` order.
    pub fn constants(&self) -> impl Iterator<Item = &XnnValue> {
        self.values.iter().filter(|v| v.constant.is_some())
    }

    /// Every named-data key the graph reads, with the value reading it and whether as its
    /// constant or its scales, in `xvalues` order: what `named_data/<key>.json` lists as
    /// `used_by`, and how a write finds a scale blob shared with another value.
    pub fn named_uses(&self) -> Vec<NamedUse<'_>> {
        let mut uses = Vec::new();
        for v in &self.values {
            if let Some(BlobRef::Named { key, .. }) = &v.constant {
                uses.push(NamedUse {
                    key,
                    value: v.id,
                    role: KeyRole::Constant,
                });
            }
            let scales = match &v.quant {
                Some(QuantParams::PerChannel { scales, .. })
                | Some(QuantParams::PerChannelGroup { scales, .. }) => scales.as_ref(),
                _ => None,
            };
            if let Some(ScaleRef {
                bytes: BlobRef::Named { key, .. },
                ..
            }) = scales
            {
                uses.push(NamedUse {
                    key,
                    value: v.id,
                    role: KeyRole::Scale,
                });
            }
        }
        uses
    }
}

/// One read of a named-data key by a value of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedUse<'a> {
    pub key: &'a str,
    /// The value's id (`id_out`).
    pub value: u32,
    pub role: KeyRole,
}

/// Offset of `part` (a sub-slice of `payload`) from the payload's first byte.
fn offset_in(payload: &[u8], part: &[u8]) -> u64 {
    (part.as_ptr() as usize - payload.as_ptr() as usize) as u64
}

/// How constant indices resolve in this payload.
struct Constants<'a> {
    header: Option<XnnHeader>,
    data: Option<&'a [ConstantDataEntry]>,
    buffers: Option<&'a [Option<ByteRange>]>,
}

impl Constants<'_> {
    fn resolve(
        &self, idx: u32, field: &str, place: &dyn fmt::Display,
    ) -> Result<BlobRef, FormatError> {
        let i = idx as usize;
        match self.header {
            Some(h) => {
                let data = self.data.unwrap_or_default();
                let entry = data.get(i).ok_or_else(|| {
                    FormatError::mismatch(
                        field,
                        place,
                        format!("< {} (the number of constant_data entries)", data.len()),
                        idx,
                    )
                })?;
                if let Some(key) = &entry.named_key {
                    return Ok(BlobRef::Named {
                        key: key.clone(),
                        size: entry.size,
                    });
                }
                let region = h.constant_range();
                let what = format!(
                    "{field} {idx} at {place}: constant_data[{idx}] (offset {}, size {}) in the constant region",
                    entry.offset, entry.size
                );
                let r = checked_range(
                    &what,
                    region.start(),
                    entry.offset,
                    entry.size,
                    region.end(),
                )?;
                Ok(BlobRef::Payload {
                    offset: r.start(),
                    size: r.len(),
                })
            }
            None => {
                let buffers = self.buffers.ok_or_else(|| {
                    FormatError::mismatch(
                        field,
                        place,
                        "0 (a payload without an XH00 header keeps constants in constant_buffer, which is absent)",
                        idx,
                    )
                })?;
                let storage = buffers.get(i).ok_or_else(|| {
                    FormatError::mismatch(
                        field,
                        place,
                        format!(
                            "< {} (the number of constant_buffer entries)",
                            buffers.len()
                        ),
                        idx,
                    )
                })?;
                let r = storage.ok_or_else(|| {
                    FormatError::mismatch(
                        "constant_buffer storage",
                        format!("constant_buffer[{idx}] ({field} of {place})"),
                        "a byte vector",
                        "none",
                    )
                })?;
                Ok(BlobRef::Payload {
                    offset: r.start(),
                    size: r.len(),
                })
            }
        }
    }
}

struct ValuePlace(usize);

impl fmt::Display for ValuePlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "xvalues[{}]", self.0)
    }
}

fn inline_scales(
    payload: &[u8], scale: Option<flatbuffers::Vector<'_, f32>>, dtype: ScaleDtype,
) -> (Option<Vec<f32>>, Option<ScaleRef>) {
    match scale {
        None => (None, None),
        Some(v) => {
            let bytes = v.bytes();
            let r = ScaleRef {
                bytes: BlobRef::Payload {
                    offset: offset_in(payload, bytes),
                    size: bytes.len() as u64,
                },
                dtype,
                count: v.len() as u64,
                inline: true,
            };
            (Some(v.iter().collect()), Some(r))
        }
    }
}

fn decode_quant(
    payload: &[u8], q: &xnn_fb::XNNQuantizedTensorValue, constants: &Constants, place: &ValuePlace,
) -> Result<QuantParams, FormatError> {
    use xnn_fb::XNNQuantParams as Q;
    let missing = || {
        FormatError::mismatch(
            "quant_params",
            place,
            format!(
                "a {} table",
                q.quant_params_type().variant_name().unwrap_or("quant")
            ),
            "none",
        )
    };
    Ok(match q.quant_params_type() {
        Q::PerChannelQuant => {
            let p = q.quant_params_as_per_channel_quant().ok_or_else(missing)?;
            let (scale, inline) = inline_scales(payload, p.scale(), ScaleDtype::F32);
            let scales = match p.scale_buffer_idx() {
                0 => inline,
                idx => Some(ScaleRef {
                    bytes: constants.resolve(idx, "scale_buffer_idx", place)?,
                    dtype: ScaleDtype::F32,
                    count: u64::from(p.num_scales()),
                    inline: false,
                }),
            };
            QuantParams::PerChannel {
                scale,
                channel_dim: p.channel_dim(),
                scale_buffer_idx: p.scale_buffer_idx(),
                num_scales: p.num_scales(),
                scales,
            }
        }
        Q::PerChannelGroupQuant => {
            let p = q
                .quant_params_as_per_channel_group_quant()
                .ok_or_else(missing)?;
            let (scale, inline) = inline_scales(payload, p.scale(), ScaleDtype::F32RoundedToBf16);
            let scales = match p.scale_buffer_idx() {
                0 => inline,
                idx => Some(ScaleRef {
                    bytes: constants.resolve(idx, "scale_buffer_idx", place)?,
                    dtype: ScaleDtype::Bf16,
                    count: u64::from(p.num_scales()),
                    inline: false,
                }),
            };
            QuantParams::PerChannelGroup {
                scale,
                channel_dim: p.channel_dim(),
                group_size: p.group_size(),
                scale_buffer_idx: p.scale_buffer_idx(),
                num_scales: p.num_scales(),
                scales,
            }
        }
        Q::PerTensorQuant => {
            let p = q.quant_params_as_per_tensor_quant().ok_or_else(missing)?;
            let slot = p._tab.vtable().get(xnn_fb::PerTensorQuant::VT_SCALE);
            let scale_field = (slot != 0).then(|| BlobRef::Payload {
                offset: offset_in(payload, p._tab.buf())
                    + (p._tab.loc() + usize::from(slot)) as u64,
                size: 4,
            });
            QuantParams::PerTensor {
                scale: p.scale(),
                zero_point: p.zero_point(),
                scale_field,
            }
        }
        Q::PerTokenDynamicQuant => {
            let p = q
                .quant_params_as_per_token_dynamic_quant()
                .ok_or_else(missing)?;
            QuantParams::PerTokenDynamic {
                num_nonbatch_dims: p.num_nonbatch_dims(),
            }
        }
        other => QuantParams::Unknown { type_code: other.0 },
    })
}

fn decode_value(
    payload: &[u8], index: usize, v: xnn_fb::XValue, constants: &Constants,
) -> Result<XnnValue, FormatError> {
    use xnn_fb::XValueUnion as V;
    let place = ValuePlace(index);
    let missing_table = |what: &str| FormatError::mismatch(what, &place, "a table", "none");
    let (tv, quant_table) = match v.xvalue_union_type() {
        V::XNNTensorValue => (
            v.xvalue_union_as_xnntensor_value()
                .ok_or_else(|| missing_table("XNNTensorValue"))?,
            None,
        ),
        V::XNNQuantizedTensorValue => {
            let q = v
                .xvalue_union_as_xnnquantized_tensor_value()
                .ok_or_else(|| missing_table("XNNQuantizedTensorValue"))?;
            let tv = q
                .tensor_value()
                .ok_or_else(|| missing_table("XNNQuantizedTensorValue.tensor_value"))?;
            (tv, Some(q))
        }
        other => {
            return Err(FormatError::mismatch(
                "xvalue_union type",
                &place,
                "XNNTensorValue (1) or XNNQuantizedTensorValue (2)",
                other.0,
            ))
        }
    };
    let quant = match &quant_table {
        Some(q) => Some(decode_quant(payload, q, constants, &place)?),
        None => None,
    };
    let constant = match tv.constant_buffer_idx() {
        0 => None,
        idx => Some(constants.resolve(idx, "constant_buffer_idx", &place)?),
    };
    Ok(XnnValue {
        id: tv.id_out(),
        index,
        quantized: quant_table.is_some(),
        datatype: Datatype(tv.datatype().0),
        num_dims: tv.num_dims(),
        dims: tv.dims().map(|d| d.iter().collect()).unwrap_or_default(),
        constant_buffer_idx: tv.constant_buffer_idx(),
        external_id: tv.external_id(),
        flags: tv.flags(),
        dq_datatype: Datatype(tv.dq_datatype().0),
        quant,
        constant,
        used_by: Vec::new(),
    })
}

/// Decodes an XNNPACK delegate payload: the `XH00` header (or a bare flatbuffer), the
/// verified `XNNGraph`, and every reference in it. Errors name what, where, expected and
/// found. Never reads outside `payload`; what it allocates is bounded by the verifier's
/// apparent-size limit, a small multiple of the payload's size.
pub fn decode(payload: &[u8]) -> Result<XnnGraph, FormatError> {
    let header = parse_header(payload)?;
    let flatbuffer = header.map_or(
        ByteRange::new(0, payload.len() as u64).expect("a slice's length"),
        |h| h.flatbuffer_range(),
    );
    let flat = &payload[flatbuffer.as_usize()];
    if flat.len() < 8 {
        return Err(FormatError::mismatch(
            "XNNGraph flatbuffer size",
            format!("payload bytes {}..{}", flatbuffer.start(), flatbuffer.end()),
            "at least 8 bytes (a root offset and an identifier)",
            format!("{} bytes", flat.len()),
        ));
    }
    let identifier = match &flat[4..8] {
        b"XN00" => Identifier::Xn00,
        b"XN01" => Identifier::Xn01,
        other => {
            return Err(FormatError::mismatch(
                "XNNGraph identifier",
                format!("payload byte {}", flatbuffer.start() + 4),
                "XN00 or XN01",
                format!("{:?}", String::from_utf8_lossy(other)),
            ))
        }
    };
    let root =
        flatbuffers::root_with_opts::<xnn_fb::XNNGraph>(&verifier_options_for(flat.len()), flat)
            .map_err(|e| describe_verifier_error("XNNGraph flatbuffer", &e))?;

    let constant_data: Option<Vec<ConstantDataEntry>> = root.constant_data().map(|v| {
        v.iter()
            .map(|c| ConstantDataEntry {
                offset: c.offset(),
                size: c.size(),
                named_key: c.named_key().map(str::to_string),
            })
            .collect()
    });
    let constant_buffer: Option<Vec<Option<ByteRange>>> = root.constant_buffer().map(|v| {
        v.iter()
            .map(|b| {
                b.storage().map(|s| {
                    ByteRange::new(offset_in(payload, s.bytes()), s.len() as u64)
                        .expect("a slice of the payload ends inside it")
                })
            })
            .collect()
    });
    let constants = Constants {
        header,
        data: constant_data.as_deref(),
        buffers: constant_buffer.as_deref(),
    };

    let num_externs = root.num_externs();
    let mut values = Vec::new();
    let mut by_id = BTreeMap::new();
    for (i, v) in root.xvalues().iter().flatten().enumerate() {
        let value = decode_value(payload, i, v, &constants)?;
        if let Some(&first) = by_id.get(&value.id) {
            return Err(FormatError::mismatch(
                "id_out",
                format!("xvalues[{i}]"),
                "an id no other value has",
                format!("{}, the id of xvalues[{first}]", value.id),
            ));
        }
        if value.flags & (FLAG_EXTERNAL_INPUT | FLAG_EXTERNAL_OUTPUT) != 0
            && value.external_id >= num_externs
        {
            return Err(FormatError::mismatch(
                "external_id",
                format!("xvalues[{i}] (an external input or output)"),
                format!("< {num_externs} (num_externs)"),
                value.external_id,
            ));
        }
        by_id.insert(value.id, i);
        values.push(value);
    }

    let mut nodes = Vec::new();
    for (k, n) in root.xnodes().iter().flatten().enumerate() {
        let fields = match member_fields(&n) {
            Member::Fields(f) => f,
            Member::Unknown => Vec::new(),
            Member::MissingTable => {
                return Err(FormatError::mismatch(
                    "xnode_union",
                    format!("xnodes[{k}]"),
                    format!(
                        "a {} table",
                        xnn_fb::XNodeUnion(n.xnode_union_type().0)
                            .variant_name()
                            .unwrap_or("node")
                    ),
                    "none",
                ))
            }
        };
        let node = XnnNode {
            union_type: n.xnode_union_type().0,
            fields,
            debug_handle: n.debug_handle(),
            output_min_max: n.output_min_max().map(|m| OutputMinMax {
                output_min: m.output_min(),
                output_max: m.output_max(),
            }),
        };
        for field in &node.fields {
            let (id, optional) = match field.value {
                FieldValue::Input(id) => (id, true),
                FieldValue::Output(id) => (id, false),
                _ => continue,
            };
            if optional && id == NO_VALUE {
                continue;
            }
            let &index = by_id.get(&id).ok_or_else(|| {
                FormatError::mismatch(
                    field.name,
                    format!("xnodes[{k}] ({})", node.display_op()),
                    "the id_out of a value",
                    id,
                )
            })?;
            values[index].used_by.push(Use {
                node: k,
                role: field.role(),
            });
        }
        nodes.push(node);
    }

    let id_list = |v: Option<flatbuffers::Vector<'_, u32>>, what: &str| {
        v.map(|ids| {
            ids.iter()
                .enumerate()
                .map(|(i, id)| {
                    if by_id.contains_key(&id) {
                        Ok(id)
                    } else {
                        Err(FormatError::mismatch(
                            what,
                            format!("{what}[{i}]"),
                            "the id_out of a value",
                            id,
                        ))
                    }
                })
                .collect::<Result<Vec<u32>, FormatError>>()
        })
        .transpose()
    };
    let input_ids = id_list(root.input_ids(), "input_ids")?;
    let output_ids = id_list(root.output_ids(), "output_ids")?;

    Ok(XnnGraph {
        header,
        identifier,
        flatbuffer,
        version: root.version().map(str::to_string),
        nodes,
        values,
        num_externs,
        input_ids,
        output_ids,
        constant_data,
        constant_buffer,
        mem_buffer_sizes: root.mem_buffer_sizes().map(|v| v.iter().collect()),
        by_id,
    })
}
