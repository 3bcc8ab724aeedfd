//! XNNPACK element types (`XNNDatatype`): names, element sizes, byte sizes of shapes and the
//! NumPy descriptors of their `.npy` files (docs/tree.md#xnnpack-delegates).
//!
//! Payloads may carry values this schema does not name, so a datatype is kept as its raw
//! `i16`; an unknown value has no name and no size.

use crate::backend::blob::tensor_nbytes;
use crate::error::Result;

/// An `XNNDatatype` value as stored in the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Datatype(pub i16);

impl Datatype {
    pub const INVALID: Datatype = Datatype(0);
    pub const FP32: Datatype = Datatype(1);
    pub const FP16: Datatype = Datatype(2);
    pub const QINT8: Datatype = Datatype(3);
    pub const QUINT8: Datatype = Datatype(4);
    pub const QINT32: Datatype = Datatype(5);
    pub const QCINT8: Datatype = Datatype(6);
    pub const QCINT32: Datatype = Datatype(7);
    pub const QCINT4: Datatype = Datatype(8);
    pub const QDINT8: Datatype = Datatype(9);
    pub const QBINT4: Datatype = Datatype(10);
    pub const QPINT8: Datatype = Datatype(11);
    pub const INT32: Datatype = Datatype(12);
    pub const PFP32: Datatype = Datatype(13);
    pub const BF16: Datatype = Datatype(14);

    /// The name without the schema's `xnn_datatype_` prefix: `"fp32"`, `"qbint4"`.
    pub fn short_name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "invalid",
            1 => "fp32",
            2 => "fp16",
            3 => "qint8",
            4 => "quint8",
            5 => "qint32",
            6 => "qcint8",
            7 => "qcint32",
            8 => "qcint4",
            9 => "qdint8",
            10 => "qbint4",
            11 => "qpint8",
            12 => "int32",
            13 => "pfp32",
            14 => "bf16",
            _ => return None,
        })
    }

    /// The schema's name: `"xnn_datatype_fp32"`.
    pub fn schema_name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "xnn_datatype_invalid",
            1 => "xnn_datatype_fp32",
            2 => "xnn_datatype_fp16",
            3 => "xnn_datatype_qint8",
            4 => "xnn_datatype_quint8",
            5 => "xnn_datatype_qint32",
            6 => "xnn_datatype_qcint8",
            7 => "xnn_datatype_qcint32",
            8 => "xnn_datatype_qcint4",
            9 => "xnn_datatype_qdint8",
            10 => "xnn_datatype_qbint4",
            11 => "xnn_datatype_qpint8",
            12 => "xnn_datatype_int32",
            13 => "xnn_datatype_pfp32",
            14 => "xnn_datatype_bf16",
            _ => return None,
        })
    }

    /// The short name, or the number when the value has none.
    pub fn display(self) -> String {
        self.short_name()
            .map_or_else(|| self.0.to_string(), str::to_string)
    }

    /// Bits per element (XNNPACK's `xnn_datatype_size_bits`). None for `invalid`, unknown
    /// values and `qpint8`, whose rows are packed with their quantization parameters.
    pub fn bits(self) -> Option<u64> {
        Some(match self.0 {
            8 | 10 => 4,
            3 | 4 | 6 | 9 => 8,
            2 | 14 => 16,
            1 | 5 | 7 | 12 | 13 => 32,
            _ => return None,
        })
    }

    /// Two elements per byte: `qcint4` and `qbint4`.
    pub fn is_4bit(self) -> bool {
        self.bits() == Some(4)
    }

    /// NumPy `descr` of the value's `.npy`: the raw element type; 4-bit types are their
    /// packed bytes (`|u1`) and bfloat16 is raw `|V2`.
    pub fn numpy_descr(self) -> Option<&'static str> {
        Some(match self.0 {
            1 | 13 => "<f4",
            2 => "<f2",
            14 => "|V2",
            5 | 7 | 12 => "<i4",
            3 | 6 | 9 => "|i1",
            4 | 8 | 10 => "|u1",
            _ => return None,
        })
    }

    /// Bytes the constant's data takes for `dims`. 4-bit rows are padded to a whole byte:
    /// ExecuTorch packs each row of a `qcint4`/`qbint4` filter separately (an odd last
    /// dimension gets a zero nibble), so the size is rows × ⌈last / 2⌉. That equals
    /// XNNPACK's own ⌈elements × 4 / 8⌉ whenever the last dimension is even, which
    /// `qbint4` guarantees (its group size is a multiple of 32 dividing that dimension).
    pub fn nbytes(self, dims: &[u32]) -> Result<u64> {
        let bits = self.bits();
        let packed = (bits == Some(4)).then_some((|last: u64| last.div_ceil(2)) as fn(u64) -> u64);
        tensor_nbytes(&self.display(), bits.map(|b| b / 8), dims, packed)
    }

    /// Shape of the `.npy`: `dims`, with the last dimension halved (rounded up) for the
    /// packed 4-bit types.
    pub fn npy_shape(self, dims: &[u32]) -> Vec<u64> {
        let mut shape: Vec<u64> = dims.iter().map(|&d| u64::from(d)).collect();
        if self.is_4bit() {
            match shape.last_mut() {
                Some(last) => *last = last.div_ceil(2),
                None => shape.push(1),
            }
        }
        shape
    }
}

/// Elements of `dims`, or None when the product overflows 64 bits.
pub fn element_count(dims: &[u32]) -> Option<u64> {
    dims.iter()
        .try_fold(1u64, |n, &d| n.checked_mul(u64::from(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_xnnpack_and_the_exporter() {
        assert_eq!(Datatype::FP32.nbytes(&[3, 4]), Ok(48));
        assert_eq!(Datatype::QCINT8.nbytes(&[3, 4]), Ok(12));
        assert_eq!(Datatype::BF16.nbytes(&[5]), Ok(10));
        assert_eq!(Datatype::QBINT4.nbytes(&[64, 64]), Ok(2048));
        // Odd rows are padded per row, not across rows.
        assert_eq!(Datatype::QCINT4.nbytes(&[3, 5]), Ok(9));
        assert_eq!(Datatype::QCINT4.nbytes(&[]), Ok(1));
        assert_eq!(Datatype::FP32.nbytes(&[]), Ok(4));
        assert!(Datatype::FP32
            .nbytes(&[u32::MAX, u32::MAX, u32::MAX])
            .is_err());
        assert!(Datatype::QPINT8.nbytes(&[4]).is_err());
        assert!(Datatype(99).nbytes(&[4]).is_err());
        assert_eq!(Datatype::QBINT4.npy_shape(&[64, 63]), vec![64, 32]);
        assert_eq!(Datatype::FP16.npy_shape(&[2, 3]), vec![2, 3]);
    }

    #[test]
    fn every_named_type_has_both_names() {
        for v in 0..=14 {
            let d = Datatype(v);
            let short = d.short_name().unwrap();
            assert_eq!(d.schema_name().unwrap(), format!("xnn_datatype_{short}"));
        }
        assert_eq!(Datatype(15).short_name(), None);
        assert_eq!(Datatype(-3).display(), "-3");
    }
}
