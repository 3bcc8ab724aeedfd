//! NumPy format 1.0 headers (the bytes that follow are the tensor's raw bytes, unchanged).
//!
//! Invariant: a header's length is a multiple of 64 and it ends with '\n'.

use std::io::Write;

use super::FormatError;

pub const MAGIC: &[u8] = b"\x93NUMPY";

/// Decimal digits of `n`.
fn digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

const DICT_START: &[u8] = b"{'descr': '";
const DICT_MIDDLE: &[u8] = b"', 'fortran_order': False, 'shape': ";
const DICT_END: &[u8] = b", }";

/// A complete `.npy` 1.0 header for a C-ordered array.
pub fn header(descr: &str, shape: &[u64]) -> Vec<u8> {
    header_from_dims(descr, shape.iter().copied())
}

/// `header` for the dims an iterator yields; it is walked twice (once to size the header),
/// so a tensor's physical shape need not be collected first. One allocation, of the final
/// size, because a tree holds one header per tensor.
pub fn header_from_dims<I>(descr: &str, dims: I) -> Vec<u8>
where
    I: Iterator<Item = u64> + Clone,
{
    // The shape is a Python tuple: "()", "(3,)" or "(2, 3, 4)".
    let (count, digit_sum) = dims
        .clone()
        .fold((0usize, 0usize), |(c, s), d| (c + 1, s + digits(d)));
    let tuple_len = match count {
        0 => 2,
        1 => 3 + digit_sum,
        n => 2 + digit_sum + 2 * (n - 1),
    };
    let dict_len = DICT_START.len() + descr.len() + DICT_MIDDLE.len() + tuple_len + DICT_END.len();
    let unpadded = MAGIC.len() + 2 + 2 + dict_len + 1;
    let total = unpadded.div_ceil(64) * 64;
    let header_len = total - MAGIC.len() - 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    // A 1.0 header length is a u16; a shape of 16 dims is far below that.
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(DICT_START);
    out.extend_from_slice(descr.as_bytes());
    out.extend_from_slice(DICT_MIDDLE);
    out.push(b'(');
    for (k, d) in dims.enumerate() {
        if k > 0 {
            out.extend_from_slice(b", ");
        }
        // Writing into a Vec cannot fail; its capacity is already the final size.
        let _ = write!(out, "{d}");
    }
    if count == 1 {
        out.push(b',');
    }
    out.push(b')');
    out.extend_from_slice(DICT_END);
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// The parts of a `.npy` header ptefs checks when a new one is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedHeader {
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    /// Offset of the array data.
    pub data_offset: usize,
}

/// Parses a `.npy` header (versions 1.0, 2.0 and 3.0), or says what is wrong with it.
pub fn parse_header(bytes: &[u8]) -> Result<ParsedHeader, FormatError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(FormatError::new(
            "not a .npy file: expected the magic \\x93NUMPY at byte 0",
        ));
    }
    let major = bytes[6];
    let (len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(FormatError::new("truncated .npy header"));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => {
            return Err(FormatError::new(format!(
                ".npy version {v}.{} is not supported (expected 1, 2 or 3)",
                bytes[7]
            )))
        }
    };
    let end = start
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| {
            FormatError::new(format!(
                ".npy header says {len} bytes but the file has only {}",
                bytes.len() - start
            ))
        })?;
    let text = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| FormatError::new(".npy header is not text"))?;
    let descr = dict_value(text, "descr")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"').to_string();
    let fortran = dict_value(text, "fortran_order")?;
    let fortran_order = match fortran.trim() {
        "False" => false,
        "True" => true,
        other => {
            return Err(FormatError::new(format!(
                ".npy fortran_order: expected True or False, found {other}"
            )))
        }
    };
    let shape_text = dict_value(text, "shape")?;
    let inner = shape_text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| {
            FormatError::new(format!(".npy shape: expected a tuple, found {shape_text}"))
        })?;
    let mut shape = Vec::new();
    for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let part = part.trim_end_matches('L');
        shape.push(
            part.parse::<u64>().map_err(|_| {
                FormatError::new(format!(".npy shape: {part:?} is not a dimension"))
            })?,
        );
    }
    Ok(ParsedHeader {
        descr,
        fortran_order,
        shape,
        data_offset: end,
    })
}

/// The raw text of `key`'s value in a Python dict literal; values here hold no nested braces
/// other than a tuple.
fn dict_value<'a>(text: &'a str, key: &str) -> Result<&'a str, FormatError> {
    let quoted = [format!("'{key}'"), format!("\"{key}\"")];
    let at = quoted
        .iter()
        .find_map(|q| text.find(q.as_str()).map(|i| i + q.len()))
        .ok_or_else(|| FormatError::new(format!(".npy header has no '{key}' entry")))?;
    let rest = text[at..].trim_start();
    let rest = rest
        .strip_prefix(':')
        .ok_or_else(|| FormatError::new(format!(".npy header: expected ':' after '{key}'")))?
        .trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else if let Some(q) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') {
        rest[1..].find(q).map(|i| i + 2)
    } else {
        rest.find([',', '}'])
    }
    .ok_or_else(|| FormatError::new(format!(".npy header: unterminated value for '{key}'")))?;
    Ok(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_padded_and_parses_back() {
        for shape in [vec![], vec![3], vec![2, 3, 4, 5]] {
            let h = header("<f4", &shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(*h.last().unwrap(), b'\n');
            let p = parse_header(&h).unwrap();
            assert_eq!(p.descr, "<f4");
            assert_eq!(p.shape, shape);
            assert!(!p.fortran_order);
            assert_eq!(p.data_offset, h.len());
        }
    }

    /// The same header built the plain way: the dict formatted as text, then padded.
    fn reference(descr: &str, shape: &[u64]) -> Vec<u8> {
        let tuple = match shape {
            [] => "()".to_string(),
            [one] => format!("({one},)"),
            many => format!(
                "({})",
                many.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}");
        let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
        let total = unpadded.div_ceil(64) * 64;
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&((total - MAGIC.len() - 4) as u16).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.resize(total - 1, b' ');
        out.push(b'\n');
        out
    }

    #[test]
    fn header_matches_the_formatted_dict() {
        let shapes: Vec<Vec<u64>> = vec![
            vec![],
            vec![0],
            vec![9],
            vec![10],
            vec![u64::MAX],
            vec![1, 2],
            vec![4096, 4096],
            vec![1, 0, 99, 100, 12345],
            vec![7; 16],
            vec![123_456_789; 9],
        ];
        for descr in ["<f4", "|b1", "<c16", "|V16"] {
            for s in &shapes {
                let h = header(descr, s);
                assert_eq!(h, reference(descr, s), "{descr} {s:?}");
                assert_eq!(h.capacity(), h.len());
            }
        }
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_header(b"hello world").is_err());
        let mut h = header("<f4", &[3]);
        h[8] = 0xff;
        assert!(parse_header(&h).is_err());
    }
}
