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

/// Bytes of the data of an array of `descr` (a type string such as `<f4` or `|V2`, whose
/// item size follows its first two characters) shaped `shape`; None when that overflows or
/// the type string has no item size.
pub fn data_nbytes(descr: &str, shape: &[u64]) -> Option<u64> {
    let itemsize: u64 = descr.get(2..)?.parse().ok()?;
    shape.iter().try_fold(itemsize, |n, &d| n.checked_mul(d))
}

/// The longest header text NumPy reads without `allow_pickle` (`max_header_size`).
pub const MAX_HEADER_TEXT: usize = 10_000;

/// The most bytes a `.npy` header that NumPy reads can take: magic, version, length and text.
pub const MAX_HEADER_LEN: u64 = 12 + MAX_HEADER_TEXT as u64;

/// The parts of a `.npy` header ptefs checks when a new one is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedHeader {
    /// The dtype as NumPy names it once read (`dtype.str`): `<f4` for `'f4'`, `'=f4'` and
    /// `'|f4'` on a little-endian machine, `|u1` for `'>u1'`, `|V2` for `'<V2'`.
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    /// Offset of the array data.
    pub data_offset: usize,
}

impl ParsedHeader {
    /// Whether the data in file order is the array in C order, which is how ptefs takes it:
    /// C order, or Fortran order of a shape with at most one dimension above 1 (or none at
    /// all: no data), where the two orders put the same bytes in the same places. Other
    /// Fortran-ordered data is refused rather than transposed: a tensor's bytes are written
    /// as they arrive, streamed from a staging file that may hold GiBs.
    pub fn is_c_order(&self) -> bool {
        !self.fortran_order
            || self.shape.contains(&0)
            || self.shape.iter().filter(|&&d| d > 1).count() <= 1
    }

    /// How many data bytes NumPy reads for this header (none when that overflows).
    pub fn nbytes(&self) -> Option<u64> {
        data_nbytes(&self.descr, &self.shape)
    }
}

/// Parses a `.npy` header (versions 1.0, 2.0 and 3.0) as NumPy's `read_array_header`
/// reads it, or says what is wrong with it. A header is accepted only when NumPy reads it
/// the same way: its text is the Python literal of a dict with exactly the keys `descr`
/// (a type string such as `'<f4'`), `fortran_order` and `shape`, each once. What NumPy
/// would read differently, or only through rules ptefs does not follow, is refused: keys
/// given twice (Python keeps the last), other keys, escapes, string prefixes and implicit
/// concatenation, comments, numbers other than plain decimals, parenthesized values,
/// structured and sub-array dtypes, and type strings other than a byte order, a kind and
/// an item size of a type with a fixed layout.
pub fn parse_header(bytes: &[u8]) -> Result<ParsedHeader, FormatError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(FormatError::new(
            "not a .npy file: expected the magic \\x93NUMPY at byte 0",
        ));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, start) = match (major, minor) {
        (1, 0) => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        (2 | 3, 0) => {
            if bytes.len() < 12 {
                return Err(FormatError::new("truncated .npy header"));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        (v, m) => {
            return Err(FormatError::new(format!(
                ".npy version {v}.{m} is not supported (expected 1.0, 2.0 or 3.0)"
            )))
        }
    };
    if len > MAX_HEADER_TEXT {
        return Err(FormatError::new(format!(
            ".npy header of {len} bytes: expected at most {MAX_HEADER_TEXT} (NumPy reads no longer one without allow_pickle)"
        )));
    }
    let end = start
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| {
            FormatError::new(format!(
                ".npy header says {len} bytes but the file has only {}",
                bytes.len() - start
            ))
        })?;
    let mut reader = Literal {
        text: &bytes[start..end],
        at: 0,
        base: start,
        python2_longs: major < 3,
    };
    let dict = reader.dict()?;
    let descr = dict.descr.ok_or_else(|| missing("descr"))?;
    Ok(ParsedHeader {
        descr: dtype_str(descr)
            .map_err(|m| FormatError::new(format!(".npy descr {descr:?}: {m}")))?,
        fortran_order: dict.fortran_order.ok_or_else(|| missing("fortran_order"))?,
        shape: dict.shape.ok_or_else(|| missing("shape"))?,
        data_offset: end,
    })
}

fn missing(key: &str) -> FormatError {
    FormatError::new(format!(".npy header has no '{key}' entry"))
}

/// The header dict's values, each given at most once.
#[derive(Default)]
struct HeaderDict<'a> {
    descr: Option<&'a str>,
    fortran_order: Option<bool>,
    shape: Option<Vec<u64>>,
}

/// A reader of the Python literal a `.npy` header holds, over its ASCII text.
struct Literal<'a> {
    text: &'a [u8],
    at: usize,
    /// Where the text starts in the file, for messages.
    base: usize,
    /// Whether `3L` reads as 3: NumPy retries headers of versions 1.0 and 2.0 with the
    /// `L` of Python 2's long integers removed.
    python2_longs: bool,
}

impl<'a> Literal<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// "expected `what` at byte N, found ...".
    fn error(&self, what: &str) -> FormatError {
        let found = match self.peek() {
            None => "the end of the header".to_string(),
            Some(b) if b.is_ascii_graphic() || b == b' ' => format!("{:?}", b as char),
            Some(b) => format!("byte 0x{b:02x}"),
        };
        FormatError::new(format!(
            ".npy header: expected {what} at byte {}, found {found}",
            self.base + self.at
        ))
    }

    /// Skips the whitespace Python allows between the tokens of a bracketed literal.
    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8, what: &str) -> Result<(), FormatError> {
        self.space();
        if self.peek() != Some(c) {
            return Err(self.error(what));
        }
        self.at += 1;
        Ok(())
    }

    /// The dict, with nothing but NumPy's padding after it (spaces and one newline).
    fn dict(&mut self) -> Result<HeaderDict<'a>, FormatError> {
        // Python strips spaces and tabs before the literal; a line break there is refused.
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
        if self.peek() != Some(b'{') {
            return Err(self.error("'{' (a dict)"));
        }
        self.at += 1;
        let mut dict = HeaderDict::default();
        loop {
            self.space();
            if self.peek() == Some(b'}') {
                self.at += 1;
                break;
            }
            let key_at = self.base + self.at;
            let key = self.string("a key (a quoted string) or '}'")?;
            self.eat(b':', "':'")?;
            self.space();
            let twice = || {
                FormatError::new(format!(
                    ".npy header: '{key}' is given twice (the second at byte {key_at}); NumPy would keep the last"
                ))
            };
            match key {
                "descr" if dict.descr.is_some() => return Err(twice()),
                "fortran_order" if dict.fortran_order.is_some() => return Err(twice()),
                "shape" if dict.shape.is_some() => return Err(twice()),
                "descr" => dict.descr = Some(self.string("a type string such as '<f4'")?),
                "fortran_order" => dict.fortran_order = Some(self.boolean()?),
                "shape" => dict.shape = Some(self.tuple()?),
                other => {
                    return Err(FormatError::new(format!(
                        ".npy header: unexpected key {other:?} at byte {key_at} (expected only 'descr', 'fortran_order' and 'shape')"
                    )))
                }
            }
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {}
                _ => return Err(self.error("',' or '}'")),
            }
        }
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
        if self.text[self.at..].starts_with(b"\r\n") {
            self.at += 2;
        } else if self.peek() == Some(b'\n') {
            self.at += 1;
        }
        if self.at != self.text.len() {
            return Err(self.error("nothing but padding after the dict"));
        }
        Ok(dict)
    }

    /// A string literal in single or double quotes, without escapes, prefixes or line
    /// breaks (what a `.npy` writer writes), and not followed by another (which Python
    /// would concatenate).
    fn string(&mut self, what: &str) -> Result<&'a str, FormatError> {
        let quote = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(self.error(what)),
        };
        let start = self.at + 1;
        let len = self.text[start..]
            .iter()
            .position(|&b| b == quote || b == b'\\' || !(b.is_ascii_graphic() || b == b' '))
            .ok_or_else(|| {
                self.at = self.text.len();
                self.error("the end of a string")
            })?;
        self.at = start + len;
        if self.peek() != Some(quote) {
            return Err(self.error("a plain character of a string (no escapes or line breaks)"));
        }
        self.at += 1;
        if len == 0 && self.peek() == Some(quote) {
            self.at -= 1;
            return Err(self.error("a string (not a triple-quoted one)"));
        }
        let s = std::str::from_utf8(&self.text[start..start + len]).expect("ASCII");
        Ok(s)
    }

    /// `True` or `False`.
    fn boolean(&mut self) -> Result<bool, FormatError> {
        let rest = &self.text[self.at..];
        let word_len = rest
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
            .unwrap_or(rest.len());
        let value = match &rest[..word_len] {
            b"True" => true,
            b"False" => false,
            _ => return Err(self.error("True or False")),
        };
        self.at += word_len;
        Ok(value)
    }

    /// A tuple of dimensions: `()`, `(3,)`, `(2, 3)` or `(2, 3,)`.
    fn tuple(&mut self) -> Result<Vec<u64>, FormatError> {
        if self.peek() != Some(b'(') {
            return Err(self.error("a tuple such as (3, 4)"));
        }
        self.at += 1;
        let mut dims = Vec::new();
        let mut comma = false;
        loop {
            self.space();
            if self.peek() == Some(b')') {
                // `(3)` is 3, not a tuple.
                if dims.len() == 1 && !comma {
                    return Err(self.error("',' (a tuple of one needs a trailing comma)"));
                }
                self.at += 1;
                return Ok(dims);
            }
            if !dims.is_empty() && !comma {
                return Err(self.error("',' or ')'"));
            }
            dims.push(self.dimension()?);
            self.space();
            comma = self.peek() == Some(b',');
            if comma {
                self.at += 1;
            }
        }
    }

    /// A plain decimal integer (`0`, or digits not starting with 0), with Python 2's `L`
    /// where NumPy removes it.
    fn dimension(&mut self) -> Result<u64, FormatError> {
        let rest = &self.text[self.at..];
        let digits = rest
            .iter()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 || digits > 1 && rest[0] == b'0' {
            return Err(self.error("a dimension (a decimal integer)"));
        }
        let value = std::str::from_utf8(&rest[..digits])
            .expect("digits")
            .parse::<u64>()
            .map_err(|_| self.error("a dimension that fits in 64 bits"))?;
        self.at += digits;
        if self.python2_longs && self.peek() == Some(b'L') {
            self.at += 1;
        }
        if self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            return Err(self.error("',' or ')' after a dimension"));
        }
        Ok(value)
    }
}

/// The dtype NumPy makes of type string `descr`, named as NumPy names it (`dtype.str`),
/// for the types with a fixed layout a tensor can have: booleans, integers, floats up to
/// 64 bits, complex and raw bytes.
fn dtype_str(descr: &str) -> Result<String, &'static str> {
    let (order, rest) = match descr.as_bytes().first() {
        Some(o @ (b'<' | b'>' | b'=' | b'|')) => (*o, &descr[1..]),
        _ => (b'=', descr),
    };
    let mut chars = rest.chars();
    let kind = chars.next().ok_or("expected a type string such as '<f4'")?;
    let size = chars.as_str();
    let plain =
        !size.is_empty() && size.bytes().all(|b| b.is_ascii_digit()) && !size.starts_with('0');
    let size: u64 = size
        .parse()
        .ok()
        .filter(|_| plain)
        .ok_or("expected a byte order, a kind and an item size, such as '<f4'")?;
    let known = match kind {
        'b' => size == 1,
        'i' | 'u' => matches!(size, 1 | 2 | 4 | 8),
        'f' => matches!(size, 2 | 4 | 8),
        'c' => matches!(size, 8 | 16),
        'V' => true,
        _ => false,
    };
    if !known {
        return Err("not a type a tensor can have (booleans, integers, floats up to f8, complex c8 or c16, raw V<n>)");
    }
    // One-byte and raw types have no byte order; '=', '|' and none mean this machine's.
    let order = match order {
        _ if size == 1 || kind == 'V' => '|',
        b'>' => '>',
        b'<' => '<',
        _ if cfg!(target_endian = "big") => '>',
        _ => '<',
    };
    Ok(format!("{order}{kind}{size}"))
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

    /// A 1.0 `.npy` header around `dict` (padded as NumPy pads).
    fn with_dict(dict: &str) -> Vec<u8> {
        let total = (MAGIC.len() + 4 + dict.len() + 1).div_ceil(64) * 64;
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&((total - 10) as u16).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.resize(total - 1, b' ');
        out.push(b'\n');
        out
    }

    #[test]
    fn reads_the_dtype_as_numpy_names_it() {
        let native = if cfg!(target_endian = "big") {
            '>'
        } else {
            '<'
        };
        for (written, read) in [
            ("<f4", "<f4".to_string()),
            (">f4", ">f4".to_string()),
            ("f4", format!("{native}f4")),
            ("=f4", format!("{native}f4")),
            ("|f4", format!("{native}f4")),
            (">u1", "|u1".to_string()),
            ("b1", "|b1".to_string()),
            ("<V2", "|V2".to_string()),
            (">c16", ">c16".to_string()),
        ] {
            let h = with_dict(&format!(
                "{{'descr': '{written}', 'fortran_order': False, 'shape': (2, 3), }}"
            ));
            assert_eq!(parse_header(&h).unwrap().descr, read, "{written}");
        }
        // NumPy reads these as other types, or as no type a tensor has: refused.
        for descr in [
            "f16", "f04", "float32", "f", "2f4", "<f4,<f4", "S4", "O", "V0", "i3",
        ] {
            let h = with_dict(&format!(
                "{{'descr': '{descr}', 'fortran_order': False, 'shape': (2,), }}"
            ));
            assert!(parse_header(&h).is_err(), "{descr}");
        }
    }

    #[test]
    fn accepts_the_literals_writers_write() {
        for (dict, shape) in [
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
                vec![],
            ),
            (
                r#"{"descr":"<f4","fortran_order":False,"shape":(3,)}"#,
                vec![3],
            ),
            (
                "{'shape': (2, 3,), 'fortran_order': False, 'descr': '<f4'}",
                vec![2, 3],
            ),
            (
                "{'descr': '<f4',\n 'fortran_order': False,\n 'shape': (0,)}",
                vec![0],
            ),
            (
                "  {'descr':'<f4','fortran_order':False,'shape':(2,3)}",
                vec![2, 3],
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }",
                vec![2, 3],
            ),
        ] {
            let p = parse_header(&with_dict(dict)).unwrap_or_else(|e| panic!("{dict}: {e}"));
            assert_eq!(p.shape, shape, "{dict}");
        }
    }

    #[test]
    fn refuses_what_numpy_reads_otherwise_or_refuses() {
        let dicts = [
            // Keys twice: Python keeps the last, which a first-match reader missed.
            "{'descr': '<f4', 'descr': '>f4', 'fortran_order': False, 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'fortran_order': True, 'shape': (2, 3)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'shape': (3,)}",
            // A key inside another string is no key.
            r#"{"descr": "|u1", 'fortran_order': False, 'shape': (3,), 'x': "'descr': '<f4'"}"#,
            // Other keys, missing keys.
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'extra': 1}",
            "{'descr': '<f4', 'shape': (3,)}",
            // Python syntax the writers do not use, read by rules ptefs does not follow.
            r"{'descr': '<f\x34', 'fortran_order': False, 'shape': (3,)}",
            "{'de' 'scr': '<f4', 'fortran_order': False, 'shape': (3,)}",
            "{u'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
            "{'descr': '''<f4''', 'fortran_order': False, 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} # c",
            "{'descr': '<f4', 'fortran_order': (False), 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': [3]}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (03,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (0x3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (True,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1_0,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551616,)}",
            "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}}",
        ];
        for dict in dicts {
            assert!(parse_header(&with_dict(dict)).is_err(), "{dict}");
        }
        // Python 2's `L` is removed only for versions 1.0 and 2.0.
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3L,)}\n";
        let mut v3 = MAGIC.to_vec();
        v3.extend_from_slice(&[3, 0]);
        v3.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        v3.extend_from_slice(dict.as_bytes());
        assert!(parse_header(&v3).is_err());
        v3[6] = 2;
        assert_eq!(parse_header(&v3).unwrap().shape, [3]);
        // Minor versions other than 0 do not exist.
        let mut h = header("<f4", &[3]);
        h[7] = 1;
        assert!(parse_header(&h).is_err());
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_header(b"hello world").is_err());
        let mut h = header("<f4", &[3]);
        h[8] = 0xff;
        assert!(parse_header(&h).is_err());
    }
}
