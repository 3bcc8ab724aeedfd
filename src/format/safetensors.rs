//! The safetensors format (<https://github.com/huggingface/safetensors>): an 8-byte
//! little-endian header length, a JSON header, then the tensors' bytes, contiguous.
//!
//! Invariants: a generated header is deterministic (entries in the order given, keys in a
//! fixed order, padded with spaces to a multiple of 8 bytes) and describes exactly the bytes
//! that follow; a parsed file passed every check the format requires (header size and JSON,
//! known dtypes, shapes whose byte size matches the offsets, offsets inside the buffer,
//! contiguous, not overlapping, no duplicate names), or was refused with what and where.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::scalar_type;
use super::FormatError;

/// The largest JSON header accepted (the safetensors library's own limit).
pub const MAX_HEADER: u64 = 100_000_000;

/// Size in bytes of one element of a safetensors dtype.
pub fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E5M2FNUZ" | "F8_E4M3FNUZ" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" | "C64" => 8,
        _ => return None,
    })
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
    pub dtype: String,
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
    let mut at = 0u64;
    for (name, dtype, shape, nbytes) in tensors {
        map.insert(
            name.clone(),
            json!({ "dtype": dtype, "shape": shape, "data_offsets": [at, at + nbytes] }),
        );
        at += nbytes;
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

/// The header's JSON object as (key, value) pairs in file order, keeping duplicates so they
/// can be refused (a map would keep only the last).
struct Pairs(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Pairs, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Pairs, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The length of the header (the 8-byte length included) of a safetensors file of
/// `total` bytes that starts with `start` (at least 8 bytes).
pub fn header_len(start: &[u8], total: u64) -> Result<u64, FormatError> {
    if start.len() < 8 || total < 8 {
        return Err(FormatError::new(format!(
            "safetensors: {total} bytes: too short for the 8-byte header length"
        )));
    }
    let n = u64::from_le_bytes(start[..8].try_into().expect("8 bytes"));
    if n > MAX_HEADER || n > total - 8 {
        return Err(FormatError::new(format!(
            "safetensors: header length {n} at byte 0: expected at most {} (the file has {total} bytes, the limit is {MAX_HEADER})",
            (total - 8).min(MAX_HEADER)
        )));
    }
    Ok(8 + n)
}

/// A parsed safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Sorted by offset.
    pub tensors: Vec<TensorInfo>,
    pub metadata: Vec<(String, String)>,
    /// Where the data starts (the header's length, its 8-byte length included).
    pub data_start: u64,
}

/// Parses a safetensors header (`head` holds the first `header_len` bytes) of a file of
/// `total` bytes.
pub fn parse(head: &[u8], total: u64) -> Result<Header, FormatError> {
    let hlen = header_len(head, total)?;
    if (head.len() as u64) < hlen {
        return Err(FormatError::new(
            "safetensors: the header was not read whole",
        ));
    }
    let json = &head[8..hlen as usize];
    let err = |m: String| FormatError::new(format!("safetensors header: {m}"));
    let text = std::str::from_utf8(json).map_err(|e| err(format!("not UTF-8: {e}")))?;
    let Pairs(pairs) =
        serde_json::from_str(text).map_err(|e| err(format!("not a JSON object: {e}")))?;
    let mut tensors = Vec::new();
    let mut metadata = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, v) in pairs {
        if !seen.insert(name.clone()) {
            return Err(err(format!("\"{name}\" appears more than once")));
        }
        if name == "__metadata__" {
            let Value::Object(m) = v else {
                return Err(err("__metadata__: expected an object of strings".into()));
            };
            for (k, v) in m {
                let Value::String(s) = v else {
                    return Err(err(format!("__metadata__.{k}: expected a string")));
                };
                metadata.push((k, s));
            }
            continue;
        }
        tensors.push(tensor_info(&name, v)?);
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    let data_len = total - hlen;
    let mut at = 0;
    for t in &tensors {
        if t.begin != at {
            return Err(err(format!(
                "\"{}\": data_offsets start at {}, expected {at} (tensors must be contiguous and not overlap)",
                t.name, t.begin
            )));
        }
        at = t.end;
    }
    if at != data_len {
        return Err(err(format!(
            "the tensors cover {at} bytes of data, the file has {data_len} after its header"
        )));
    }
    Ok(Header {
        tensors,
        metadata,
        data_start: hlen,
    })
}

/// The entry of tensor `name` in a safetensors header.
fn tensor_info(name: &str, v: Value) -> Result<TensorInfo, FormatError> {
    let err = |m: String| FormatError::new(format!("safetensors header: \"{name}\": {m}"));
    let Value::Object(m) = v else {
        return Err(err("expected an object".into()));
    };
    for k in m.keys() {
        if !matches!(k.as_str(), "dtype" | "shape" | "data_offsets") {
            return Err(err(format!("unknown field \"{k}\"")));
        }
    }
    let dtype = m
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| err("dtype: expected a string".into()))?;
    let size = dtype_size(dtype).ok_or_else(|| err(format!("unknown dtype \"{dtype}\"")))?;
    let ints = |field: &str| -> Result<Vec<u64>, FormatError> {
        m.get(field)
            .and_then(Value::as_array)
            .ok_or_else(|| err(format!("{field}: expected an array")))?
            .iter()
            .map(|x| {
                x.as_u64().ok_or_else(|| {
                    err(format!(
                        "{field}: expected non-negative integers, found {x}"
                    ))
                })
            })
            .collect()
    };
    let shape = ints("shape")?;
    let offsets = ints("data_offsets")?;
    let [begin, end] = offsets[..] else {
        return Err(err("data_offsets: expected [begin, end]".into()));
    };
    if end < begin {
        return Err(err(format!(
            "data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    let nbytes = shape
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d))
        .ok_or_else(|| err(format!("the byte size of shape {shape:?} overflows")))?;
    if nbytes != end - begin {
        return Err(err(format!(
            "{dtype}{shape:?} needs {nbytes} bytes, data_offsets give {}",
            end - begin
        )));
    }
    Ok(TensorInfo {
        name: name.to_string(),
        dtype: dtype.to_string(),
        shape,
        begin,
        end,
    })
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
        let h = parse(&f, f.len() as u64).unwrap();
        let (parsed, meta) = (h.tensors, h.metadata);
        assert_eq!(meta, vec![("a".to_string(), "b".to_string())]);
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
        assert!(bad(
            r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}"#,
            1
        )
        .contains("unknown field"));
        assert!(bad(r#"[1]"#, 0).contains("JSON object"));
        assert!(bad(
            r#"{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
            1
        )
        .contains("non-negative"));
        let mut huge = (u64::MAX).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(parse(&huge, huge.len() as u64).is_err());
        assert!(parse(b"", 0).is_err());
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
