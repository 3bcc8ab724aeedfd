//! ExecuTorch scalar types as raw integers: names, element sizes, NumPy descriptors.
//!
//! Files may carry values the schema does not declare (e.g. 15 before BFLOAT16 was named), so
//! types are kept as `i8` and looked up here; an unknown value has no element size.

/// Schema or runtime name of a scalar type value.
pub fn name(value: i8) -> Option<&'static str> {
    Some(match value {
        0 => "BYTE",
        1 => "CHAR",
        2 => "SHORT",
        3 => "INT",
        4 => "LONG",
        5 => "HALF",
        6 => "FLOAT",
        7 => "DOUBLE",
        8 => "COMPLEXHALF",
        9 => "COMPLEXFLOAT",
        10 => "COMPLEXDOUBLE",
        11 => "BOOL",
        12 => "QINT8",
        13 => "QUINT8",
        14 => "QINT32",
        15 => "BFLOAT16",
        16 => "QUINT4X2",
        17 => "QUINT2X4",
        18 => "BITS1X8",
        19 => "BITS2X4",
        20 => "BITS4X2",
        21 => "BITS8",
        22 => "BITS16",
        23 => "FLOAT8E5M2",
        24 => "FLOAT8E4M3FN",
        25 => "FLOAT8E5M2FNUZ",
        26 => "FLOAT8E4M3FNUZ",
        27 => "UINT16",
        28 => "UINT32",
        29 => "UINT64",
        _ => return None,
    })
}

/// The name, or the number when the value has none (docs/tree.md#json-files).
pub fn display(value: i8) -> String {
    name(value).map_or_else(|| value.to_string(), str::to_string)
}

/// `sizeof` of the C++ type the runtime maps the value to (docs/formats.md#scalar-types).
pub fn element_size(value: i8) -> Option<u64> {
    Some(match value {
        0 | 1 | 11 | 12 | 13 | 16 | 17 | 18..=21 | 23..=26 => 1,
        2 | 5 | 15 | 22 | 27 => 2,
        3 | 14 | 28 | 8 => 4,
        4 | 7 | 29 | 9 => 8,
        6 => 4,
        10 => 16,
        _ => return None,
    })
}

/// NumPy `descr` for the `.npy` header. Types NumPy lacks become raw `|V<n>`.
pub fn numpy_descr(value: i8) -> Option<String> {
    numpy_descr_str(value).map(str::to_string)
}

/// `numpy_descr` without an allocation, for building one header per tensor.
pub fn numpy_descr_str(value: i8) -> Option<&'static str> {
    Some(match value {
        0 | 13 => "|u1",
        1 | 12 => "|i1",
        2 => "<i2",
        3 | 14 => "<i4",
        4 => "<i8",
        5 => "<f2",
        6 => "<f4",
        7 => "<f8",
        8 => "|V4",
        9 => "<c8",
        10 => "<c16",
        11 => "|b1",
        27 => "<u2",
        28 => "<u4",
        29 => "<u8",
        _ => match element_size(value)? {
            1 => "|V1",
            2 => "|V2",
            4 => "|V4",
            8 => "|V8",
            16 => "|V16",
            _ => return None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_type_has_a_size_and_descr() {
        for v in 0..30i8 {
            assert!(name(v).is_some());
            let size = element_size(v).unwrap();
            let descr = numpy_descr(v).unwrap();
            let digits: String = descr.chars().filter(|c| c.is_ascii_digit()).collect();
            assert_eq!(digits.parse::<u64>().unwrap(), size, "{v} {descr}");
        }
        // Every type without a NumPy equivalent is raw bytes of its element size.
        for v in i8::MIN..=i8::MAX {
            match (numpy_descr_str(v), element_size(v)) {
                (Some(d), Some(n)) if d.starts_with("|V") => assert_eq!(d, format!("|V{n}")),
                (Some(_), Some(_)) | (None, None) => {}
                (d, n) => panic!("{v}: descr {d:?}, element size {n:?}"),
            }
        }
        assert_eq!(name(30), None);
        assert_eq!(element_size(-1), None);
        assert_eq!(display(99), "99");
    }
}
