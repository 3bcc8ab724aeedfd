//! The safetensors format (<https://github.com/huggingface/safetensors>): an 8-byte
//! little-endian header length, a JSON header, then the tensors' bytes, contiguous.
//!
//! Invariants:
//! - A generated header is deterministic (entries in the order given, keys in a fixed
//!   order, padded with spaces to a multiple of 8 bytes) and describes exactly the bytes
//!   that follow.
//! - A header is accepted exactly when the reference library (the `safetensors` crate 0.8,
//!   which the Python package wraps) accepts it, with the same meaning, but for one
//!   refusal of ours: a tensor named twice (the library keeps the last entry). Those rules:
//!   at most 100 MB of UTF-8 JSON, an object; `__metadata__` at most once, null or an object
//!   of strings (a key repeated in it is harmless: nothing reads it); every other key a
//!   tensor, whose entry (an object, or an array in field order) gives `dtype`, `shape` and
//!   `data_offsets` once each, other fields being ignored but still read as JSON values
//!   (nesting depth, escapes, number ranges); a known dtype; a whole number of bytes, as
//!   many as the offsets span; offsets contiguous from 0, covering the data exactly.
//! - Memory: parsing keeps only the typed tensor entries (metadata and ignored fields are
//!   checked as they are read, never held), so it allocates in proportion to the header;
//!   and a header is read at all only once its declared length is within what the target
//!   can need (`HeaderBound`), checked from its first 8 bytes.

use std::fmt;

use serde::de::{self, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::scalar_type;
use super::FormatError;
use crate::quote;

/// The largest JSON header accepted (the safetensors library's own limit).
pub const MAX_HEADER: u64 = 100_000_000;

/// Every dtype the library knows, with the bits of one element.
const DTYPES: [(&str, u64); 22] = [
    ("BOOL", 8),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("F8_E4M3FNUZ", 8),
    ("F8_E5M2FNUZ", 8),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("C64", 64),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
];

/// The dtype named `name`, as the table spells it, and the bits of one element.
fn dtype_named(name: &str) -> Option<(&'static str, u64)> {
    DTYPES.iter().copied().find(|(n, _)| *n == name)
}

/// Size in bytes of one element of a safetensors dtype (none for the sub-byte ones).
pub fn dtype_size(dtype: &str) -> Option<u64> {
    let (_, bits) = dtype_named(dtype)?;
    (bits % 8 == 0).then_some(bits / 8)
}
/// The safetensors dtype of an ExecuTorch scalar type, and how many bytes of one element
/// make one safetensors element (1 when the types correspond; the element size when the
/// element is shown as raw `U8` bytes, in an extra last dimension).
pub fn dtype_of(scalar_type: i8) -> Option<(&'static str, u64)> {
    Some(match scalar_type {
        0 | 13 => ("U8", 1),
        1 | 12 => ("I8", 1),
        2 => ("I16", 1),
        3 | 14 => ("I32", 1),
        4 => ("I64", 1),
        5 => ("F16", 1),
        6 => ("F32", 1),
        7 => ("F64", 1),
        9 => ("C64", 1),
        11 => ("BOOL", 1),
        15 => ("BF16", 1),
        22 | 27 => ("U16", 1),
        23 => ("F8_E5M2", 1),
        24 => ("F8_E4M3", 1),
        25 => ("F8_E5M2FNUZ", 1),
        26 => ("F8_E4M3FNUZ", 1),
        28 => ("U32", 1),
        29 => ("U64", 1),
        other => ("U8", scalar_type::element_size(other)?),
    })
}

/// The safetensors dtype of a little-endian (or byte-sized) NumPy `descr`, when there is
/// one: what `weights.safetensors` calls a payload constant whose `.npy` has that dtype.
pub fn dtype_of_descr(descr: &str) -> Option<&'static str> {
    Some(match descr {
        "<f4" => "F32",
        "<f2" => "F16",
        "<f8" => "F64",
        "<i8" => "I64",
        "<i4" => "I32",
        "<i2" => "I16",
        "|i1" => "I8",
        "|u1" => "U8",
        "|b1" => "BOOL",
        _ => return None,
    })
}

/// One tensor of the `weights.safetensors` of a model file: its name there, its dtype and
/// shape, and where its bytes are in the model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub location: super::layout::Location,
    /// The tree path that shows the tensor (`plans/forward/values/0`), for `__metadata__`.
    pub path: String,
    /// The tensor, so that a write keeps it apart from distinct tensors sharing its bytes.
    pub of: super::sharing::TensorId,
}

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    /// Byte range relative to the start of the data (after the header).
    pub begin: u64,
    pub end: u64,
}

/// A safetensors header for `tensors` (laid out in this order, back to back) and
/// `metadata`; the returned bytes are the 8-byte length and the padded JSON.
pub fn header(tensors: &[(String, &str, Vec<u64>, u64)], metadata: &[(String, String)]) -> Vec<u8> {
    let mut map = Map::new();
    if !metadata.is_empty() {
        let meta: Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        map.insert("__metadata__".into(), Value::Object(meta));
    }
    // Offsets saturate rather than wrap: tensors of a real file cannot add up past 2^64
    // bytes, and a file claiming they do gets a header no reader accepts, never a panic.
    let mut at = 0u64;
    for (name, dtype, shape, nbytes) in tensors {
        let end = at.saturating_add(*nbytes);
        map.insert(
            name.clone(),
            json!({ "dtype": dtype, "shape": shape, "data_offsets": [at, end] }),
        );
        at = end;
    }
    let mut text = serde_json::to_vec(&Value::Object(map)).expect("JSON of strings and numbers");
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    out
}

/// The most header an update of a model's tensors can need: each tensor once, its name
/// escaped as JSON writers escape it at most (`\uXXXX` for control and non-ASCII
/// characters), with room for its dtype, every digit of its shape and offsets, and
/// whitespace; metadata naming each tensor's tree path (as this tree's own
/// `weights.safetensors` does); and a fixed allowance for other metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderBound {
    pub bytes: u64,
    /// How many tensors the bound is for, for messages.
    pub tensors: usize,
}

/// Room for metadata of the writer's own, braces and padding.
const BOUND_FIXED: u64 = 64 << 10;
/// Room for one tensor's entry but its name and dims: keys, dtype, two 20-digit offsets,
/// punctuation and indentation.
const BOUND_PER_TENSOR: u64 = 256;
/// Room for one dimension: 20 digits, a separator and indentation.
const BOUND_PER_DIM: u64 = 32;
/// Room for one metadata pair but its strings.
const BOUND_PER_METADATA: u64 = 16;

/// The longest a JSON writer makes `s` as a string's content.
fn escaped_len(s: &str) -> u64 {
    s.chars()
        .map(|c| match c {
            '"' | '\\' => 2,
            '\0'..='\u{1f}' => 6,
            c if c.is_ascii() => 1,
            c if (c as u32) < 0x1_0000 => 6,
            _ => 12,
        })
        .sum()
}

impl HeaderBound {
    /// The bound for updates of `entries` (never beyond the format's own limit).
    pub fn of(entries: &[Entry]) -> HeaderBound {
        let bytes = entries.iter().fold(BOUND_FIXED, |n, e| {
            let name = escaped_len(&e.name);
            let entry = BOUND_PER_TENSOR + BOUND_PER_DIM * e.shape.len() as u64 + name;
            let metadata = BOUND_PER_METADATA + name + escaped_len(&e.path);
            n.saturating_add(entry + metadata)
        });
        HeaderBound {
            bytes: bytes.min(MAX_HEADER),
            tensors: entries.len(),
        }
    }

    /// The bound for updates of tensors named `names`, each with its number of dims (as a
    /// checkpoint names them, with metadata of its own no larger than the names).
    pub fn of_names<'n>(names: impl Iterator<Item = (&'n str, usize)>) -> HeaderBound {
        let mut tensors = 0;
        let bytes = names.fold(BOUND_FIXED, |n, (name, dims)| {
            tensors += 1;
            let name = escaped_len(name);
            let entry = BOUND_PER_TENSOR + BOUND_PER_DIM * dims as u64 + name;
            n.saturating_add(entry + BOUND_PER_METADATA + 2 * name)
        });
        HeaderBound {
            bytes: bytes.min(MAX_HEADER),
            tensors,
        }
    }
}

/// `n` bytes for a message: exact when small, else in KiB or MiB.
fn size_text(n: u64) -> String {
    match n {
        0..10_240 => format!("{n} bytes"),
        10_240..10_485_760 => format!("{} KiB", n.div_ceil(1 << 10)),
        _ => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
    }
}

/// The length of the header (the 8-byte length included) of a safetensors file of `total`
/// bytes that starts with `start` (at least 8 bytes), checked against the format's limit
/// and, when given, against `bound`; nothing past the first 8 bytes is needed.
pub fn header_len(
    start: &[u8], total: u64, bound: Option<&HeaderBound>,
) -> Result<u64, FormatError> {
    let Some(first) = start.get(..8).filter(|_| total >= 8) else {
        return Err(FormatError::new(format!(
            "not a safetensors file: {total} bytes, too short for the 8-byte header length"
        )));
    };
    let n = u64::from_le_bytes(first.try_into().expect("8 bytes"));
    if n > MAX_HEADER {
        let text = first
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace());
        return Err(FormatError::new(if text {
            format!(
                "not a safetensors file: it starts with text ({:?}) where the 8-byte header length should be",
                String::from_utf8_lossy(first)
            )
        } else {
            format!(
                "not a safetensors file: the 8-byte header length at byte 0 says {n} bytes, more than the format's limit of {MAX_HEADER}"
            )
        }));
    }
    if let Some(bound) = bound.filter(|b| n > b.bytes) {
        return Err(FormatError::new(format!(
            "the header declares {}, more than this model's {} tensor(s) can need (at most {})",
            size_text(n),
            bound.tensors,
            size_text(bound.bytes)
        )));
    }
    if n > total - 8 {
        return Err(FormatError::new(format!(
            "safetensors: the header length at byte 0 says {n} bytes, but only {} follow it: the file is cut short",
            total - 8
        )));
    }
    Ok(8 + n)
}

/// A parsed safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Sorted by offset.
    pub tensors: Vec<TensorInfo>,
    /// Where the data starts (the header's length, its 8-byte length included).
    pub data_start: u64,
}

/// Parses a safetensors header (`head` holds the first `header_len` bytes) of a file of
/// `total` bytes.
pub fn parse(head: &[u8], total: u64) -> Result<Header, FormatError> {
    parse_for(head, Some(total)).map(|(h, _)| h)
}

/// Parses the header at the start of a safetensors file whose length is not known yet
/// (`head` holds at least the whole header): the header, and the length of the data its
/// tensors declare. The checks are `parse`'s, but the data's length.
pub fn parse_declared(head: &[u8]) -> Result<(Header, u64), FormatError> {
    parse_for(head, None)
}

fn parse_for(head: &[u8], total: Option<u64>) -> Result<(Header, u64), FormatError> {
    let hlen = header_len(head, total.unwrap_or(head.len() as u64), None)?;
    let json = head
        .get(8..hlen as usize)
        .ok_or_else(|| FormatError::new("safetensors: the header was not read whole"))?;
    let err = |m: String| FormatError::new(format!("safetensors header: {m}"));
    let text = std::str::from_utf8(json).map_err(|e| err(format!("not UTF-8: {e}")))?;
    let mut tensors = Vec::new();
    let mut reading = None;
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_map(TopLevel {
        tensors: &mut tensors,
        reading: &mut reading,
    })
    .and_then(|()| de.end())
    .map_err(|e| {
        // serde's messages quote what they read, which may be megabytes.
        let said = e.to_string();
        let said = quote::clipped(&said);
        match &reading {
            Some(name) => err(format!("{}: {said}", quote::name(name))),
            None if e.is_syntax() || e.is_eof() => err(format!("not a JSON object: {said}")),
            None => err(said.into_owned()),
        }
    })?;
    drop(reading);

    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(format!("{} appears more than once", quote::name(w[0]))));
    }
    drop(names);
    for t in &tensors {
        t.check_size()
            .map_err(|m| err(format!("{}: {m}", quote::name(&t.name))))?;
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut at = 0;
    for t in &tensors {
        if t.begin != at {
            return Err(err(format!(
                "{}: data_offsets start at {}, expected {at} (tensors must be contiguous and not overlap)",
                quote::name(&t.name),
                t.begin
            )));
        }
        at = t.end;
    }
    if let Some(data_len) = total.map(|t| t - hlen) {
        if at != data_len {
            return Err(err(format!(
                "the tensors cover {at} bytes of data, the file has {data_len} after its header"
            )));
        }
    }
    Ok((
        Header {
            tensors,
            data_start: hlen,
        },
        at,
    ))
}

impl TensorInfo {
    /// Whether the offsets span exactly the bytes the dtype and shape need (the element
    /// count and bit count computed as the library does, overflow being an error).
    fn check_size(&self) -> Result<(), String> {
        let (dtype, shape) = (self.dtype, &self.shape);
        if self.end < self.begin {
            return Err(format!(
                "data_offsets [{}, {}] end before they begin",
                self.begin, self.end
            ));
        }
        let bits = dtype_named(dtype).map_or(8, |(_, b)| b);
        let nbits = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(bits))
            .ok_or_else(|| format!("the size of {dtype}{shape:?} overflows"))?;
        if nbits % 8 != 0 {
            return Err(format!(
                "{dtype}{shape:?} is {nbits} bits, not a whole number of bytes"
            ));
        }
        if nbits / 8 != self.end - self.begin {
            return Err(format!(
                "{dtype}{shape:?} needs {} bytes, data_offsets give {}",
                nbits / 8,
                self.end - self.begin
            ));
        }
        Ok(())
    }
}

/// The header's object: `__metadata__` checked and dropped, every other entry a tensor.
/// `reading` names the tensor whose entry is being read, for messages.
struct TopLevel<'a> {
    tensors: &'a mut Vec<TensorInfo>,
    reading: &'a mut Option<String>,
}

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut metadata = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                if metadata {
                    return Err(de::Error::duplicate_field("__metadata__"));
                }
                metadata = true;
                map.next_value::<Option<Metadata>>()?;
                continue;
            }
            *self.reading = Some(key);
            let RawEntry {
                dtype,
                shape,
                offsets: (begin, end),
            } = map.next_value()?;
            let name = self.reading.take().expect("set above");
            self.tensors.push(TensorInfo {
                name,
                dtype,
                shape,
                begin,
                end,
            });
        }
        Ok(())
    }
}

/// `__metadata__`'s object of strings, read and dropped.
struct Metadata;

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Metadata, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Metadata, A::Error> {
                while m.next_key::<Text>()?.is_some() {
                    m.next_value::<Text>()?;
                }
                Ok(Metadata)
            }
        }
        d.deserialize_map(V)
    }
}

/// A JSON string, read and dropped.
struct Text;

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Text, E> {
                Ok(Text)
            }
        }
        d.deserialize_str(V)
    }
}

/// Any JSON value, read whole as a kept one would be (so its depth, escapes and numbers are
/// checked as the library checks the fields it ignores, which it reads as values) and
/// dropped.
struct Ignored;

impl<'de> Deserialize<'de> for Ignored {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ignored, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ignored;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Ignored, E> {
                Ok(Ignored)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Ignored, E> {
                Ok(Ignored)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Ignored, E> {
                Ok(Ignored)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Ignored, E> {
                Ok(Ignored)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Ignored, E> {
                Ok(Ignored)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Ignored, E> {
                Ok(Ignored)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Ignored, A::Error> {
                while s.next_element::<Ignored>()?.is_some() {}
                Ok(Ignored)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Ignored, A::Error> {
                while m.next_key::<Ignored>()?.is_some() {
                    m.next_value::<Ignored>()?;
                }
                Ok(Ignored)
            }
        }
        d.deserialize_any(V)
    }
}

/// A dtype as the library reads one: its name as a string, or an enum's object form
/// (`{"F32": null}`).
struct DtypeName(&'static str);

impl<'de> Deserialize<'de> for DtypeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DtypeName, D::Error> {
        /// The name alone.
        struct Known(&'static str);
        impl<'de> Deserialize<'de> for Known {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Known, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = Known;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a dtype name")
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<Known, E> {
                        let names = DTYPES.map(|(n, _)| n).join(", ");
                        dtype_named(s).map(|(n, _)| Known(n)).ok_or_else(|| {
                            E::custom(format!(
                                "unknown dtype {} (expected one of {names})",
                                quote::name(s)
                            ))
                        })
                    }
                }
                d.deserialize_identifier(V)
            }
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DtypeName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a dtype")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<DtypeName, A::Error> {
                let (Known(name), variant) = data.variant()?;
                variant.unit_variant()?;
                Ok(DtypeName(name))
            }
        }
        const NAMES: [&str; 22] = {
            let mut names = [""; 22];
            let mut i = 0;
            while i < 22 {
                names[i] = DTYPES[i].0;
                i += 1;
            }
            names
        };
        d.deserialize_enum("Dtype", &NAMES, V)
    }
}

/// A tensor's entry: an object of its fields, or an array of them in this order.
struct RawEntry {
    dtype: &'static str,
    shape: Vec<u64>,
    offsets: (u64, u64),
}

const FIELDS: &[&str] = &["dtype", "shape", "data_offsets"];

impl<'de> Deserialize<'de> for RawEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawEntry, D::Error> {
        enum Field {
            Dtype,
            Shape,
            Offsets,
            Other,
        }
        impl<'de> Deserialize<'de> for Field {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Field, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = Field;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a field name")
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<Field, E> {
                        Ok(match s {
                            "dtype" => Field::Dtype,
                            "shape" => Field::Shape,
                            "data_offsets" => Field::Offsets,
                            _ => Field::Other,
                        })
                    }
                }
                d.deserialize_identifier(V)
            }
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a tensor entry (dtype, shape, data_offsets)")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<RawEntry, A::Error> {
                let missing = |i| de::Error::invalid_length(i, &"3 fields");
                let DtypeName(dtype) = s.next_element()?.ok_or_else(|| missing(0))?;
                let shape = s.next_element()?.ok_or_else(|| missing(1))?;
                let offsets = s.next_element()?.ok_or_else(|| missing(2))?;
                Ok(RawEntry {
                    dtype,
                    shape,
                    offsets,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RawEntry, A::Error> {
                let (mut dtype, mut shape, mut offsets) = (None, None, None);
                while let Some(field) = m.next_key::<Field>()? {
                    match field {
                        Field::Dtype if dtype.is_some() => {
                            return Err(de::Error::duplicate_field("dtype"))
                        }
                        Field::Shape if shape.is_some() => {
                            return Err(de::Error::duplicate_field("shape"))
                        }
                        Field::Offsets if offsets.is_some() => {
                            return Err(de::Error::duplicate_field("data_offsets"))
                        }
                        Field::Dtype => dtype = Some(m.next_value::<DtypeName>()?.0),
                        Field::Shape => shape = Some(m.next_value()?),
                        Field::Offsets => offsets = Some(m.next_value()?),
                        Field::Other => {
                            m.next_value::<Ignored>()?;
                        }
                    }
                }
                Ok(RawEntry {
                    dtype: dtype.ok_or_else(|| de::Error::missing_field("dtype"))?,
                    shape: shape.ok_or_else(|| de::Error::missing_field("shape"))?,
                    offsets: offsets.ok_or_else(|| de::Error::missing_field("data_offsets"))?,
                })
            }
        }
        d.deserialize_struct("TensorInfo", FIELDS, V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensors: &[(String, &str, Vec<u64>, u64)]) -> Vec<u8> {
        let mut f = header(tensors, &[("a".into(), "b".into())]);
        let n: u64 = tensors.iter().map(|t| t.3).sum();
        f.extend(std::iter::repeat_n(7u8, n as usize));
        f
    }

    #[test]
    fn generated_headers_parse_back() {
        let t = vec![
            ("w".to_string(), "F32", vec![3, 4], 48),
            ("b".to_string(), "F32", vec![3], 12),
            ("s".to_string(), "I64", vec![], 8),
        ];
        let f = file(&t);
        assert_eq!((f.len() - 8 - 68) % 8, 0);
        let parsed = parse(&f, f.len() as u64).unwrap().tensors;
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[1].name, "b");
        assert_eq!((parsed[1].begin, parsed[1].end), (48, 60));
    }

    #[test]
    fn refuses_what_the_format_forbids() {
        let bad = |json: &str, data: usize| {
            let mut f = (json.len() as u64).to_le_bytes().to_vec();
            f.extend_from_slice(json.as_bytes());
            f.extend(std::iter::repeat_n(0u8, data));
            parse(&f, f.len() as u64).unwrap_err().to_string()
        };
        assert!(bad(
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
            4
        )
        .contains("needs 8"));
        assert!(bad(
            r#"{"w":{"dtype":"X9","shape":[1],"data_offsets":[0,1]}}"#,
            1
        )
        .contains("unknown dtype"));
        assert!(bad(
            r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            2
        )
        .contains("contiguous"));
        assert!(bad(
            r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
            2
        )
        .contains("cover"));
        assert!(bad(r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#, 2).contains("more than once"));
        // A field twice: the library's serde refuses it; a map would keep the last.
        assert!(bad(
            r#"{"w":{"dtype":"I8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
            1
        )
        .contains("duplicate field `dtype`"));
        assert!(bad(
            r#"{"__metadata__":{},"__metadata__":{},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
            1
        )
        .contains("duplicate field `__metadata__`"));
        assert!(bad(
            r#"{"__metadata__":{"a":1},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
            1
        )
        .contains("expected a string"));
        assert!(
            bad(r#"{"w":{"dtype":"U8","shape":[1]}}"#, 1).contains("missing field `data_offsets`")
        );
        assert!(bad(
            r#"{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
            2
        )
        .contains("not a whole number of bytes"));
        // An ignored field is still read as a JSON value, depth limit included.
        let deep = format!(
            r#"{{"w":{{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{}{}}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert!(bad(&deep, 1).contains("recursion limit"));
        assert!(bad(r#"[1]"#, 0).contains("JSON object"));
        assert!(bad(
            r#"{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
            1
        )
        .contains("invalid value: integer `-1`"));
        let mut huge = (u64::MAX).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(parse(&huge, huge.len() as u64).is_err());
        assert!(parse(b"", 0).is_err());
    }

    /// What the library also accepts: ignored fields, the array form of an entry, the
    /// object form of a dtype, null metadata, a key repeated inside the metadata, escapes.
    #[test]
    fn accepts_what_the_library_accepts() {
        let ok = |json: &str, data: usize| {
            let mut f = (json.len() as u64).to_le_bytes().to_vec();
            f.extend_from_slice(json.as_bytes());
            f.extend(std::iter::repeat_n(0u8, data));
            parse(&f, f.len() as u64)
                .unwrap_or_else(|e| panic!("{json}: {e}"))
                .tensors
        };
        let t = ok(
            r#"{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[{"y":null}]}}"#,
            2,
        );
        assert_eq!((t[0].dtype, &t[0].shape[..]), ("U8", &[2][..]));
        let t = ok(r#"{"w":["I16",[3],[0,6]]}"#, 6);
        assert_eq!((t[0].dtype, t[0].end), ("I16", 6));
        let t = ok(
            r#"{"w":{"dtype":{"F32":null},"shape":[],"data_offsets":[0,4]}}"#,
            4,
        );
        assert_eq!(t[0].dtype, "F32");
        ok(r#"{"__metadata__":null}"#, 0);
        ok(r#"{"__metadata__":{"a":"1","a":"2"}}"#, 0);
        let t = ok(
            r#"{"w":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}"#,
            2,
        );
        assert_eq!((t[0].name.as_str(), t[0].dtype), ("w", "F4"));
    }

    #[test]
    fn a_header_beyond_the_bound_is_refused_from_its_length_alone() {
        let bound = HeaderBound {
            bytes: 4096,
            tensors: 12,
        };
        // Only the 8 bytes of the length are there: nothing more is needed to refuse.
        let e = header_len(&99_000_000u64.to_le_bytes(), 1 << 40, Some(&bound)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the header declares 94.4 MiB, more than this model's 12 tensor(s) can need (at most 4096 bytes)"
        );
        assert_eq!(
            header_len(&4096u64.to_le_bytes(), 8 + 4096, Some(&bound)).unwrap(),
            8 + 4096
        );
        let e = header_len(b"hello world", 11, Some(&bound)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("not a safetensors file: it starts with text (\"hello wo\")"),
            "{e}"
        );
        let e = header_len(&[0xff; 8], 100, None).unwrap_err();
        assert!(e.to_string().starts_with("not a safetensors file"), "{e}");
    }

    /// The bound covers this tree's own `weights.safetensors` header (its metadata
    /// included), whatever the names hold, so a file read and written back always fits.
    #[test]
    fn the_bound_covers_the_generated_header() {
        use crate::format::layout::Location;
        use crate::format::range::ByteRange;
        use crate::format::sharing::TensorId;
        let names = ["w", "a\"quoted\\name", "ctl\u{1}\u{7f}", "ünïcödé", "𝔘", ""];
        for count in [0usize, 1, 6, 500] {
            let entries: Vec<Entry> = (0..count)
                .map(|i| Entry {
                    name: format!("{}{i}", names[i % names.len()].repeat(1 + i % 40)),
                    dtype: "F8_E4M3FNUZ",
                    shape: vec![u64::MAX; i % 17],
                    location: Location {
                        file: 0,
                        range: ByteRange::new(0, u64::MAX / 2).unwrap(),
                    },
                    path: format!("plans/forward/values/{}{i}", names[i % names.len()]),
                    of: TensorId::key(0, i),
                })
                .collect();
            let tensors: Vec<(String, &str, Vec<u64>, u64)> = entries
                .iter()
                .map(|e| (e.name.clone(), e.dtype, e.shape.clone(), u64::MAX / 2))
                .collect();
            let metadata: Vec<(String, String)> = entries
                .iter()
                .map(|e| (e.name.clone(), e.path.clone()))
                .collect();
            let generated = header(&tensors, &metadata).len() as u64 - 8;
            let bound = HeaderBound::of(&entries);
            assert!(
                generated <= bound.bytes,
                "{count}: {generated} > {}",
                bound.bytes
            );
            assert_eq!(bound.tensors, count);
        }
    }

    #[test]
    fn every_scalar_type_with_bytes_has_a_dtype() {
        for v in 0..30i8 {
            let (dtype, factor) = dtype_of(v).unwrap();
            let size = dtype_size(dtype).unwrap();
            assert_eq!(size * factor, scalar_type::element_size(v).unwrap(), "{v}");
        }
    }
}
