//! Vulkan element types (`VkDataType`), storage types and memory layouts: names, element
//! sizes, byte sizes of shapes and the NumPy descriptors of their `.npy` files.
//!
//! Payloads may carry values this schema does not name, so each is kept as its raw stored
//! integer; an unknown value has no name and no size.

use crate::backend::blob::tensor_nbytes;
use crate::error::Result;
use crate::format::generated::vk_fb;

/// A `VkDataType` value as stored in the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Datatype(pub i8);

impl Datatype {
    pub const BOOL: Datatype = Datatype(0);
    pub const UINT8: Datatype = Datatype(1);
    pub const INT8: Datatype = Datatype(2);
    pub const INT32: Datatype = Datatype(3);
    pub const FLOAT16: Datatype = Datatype(4);
    pub const FLOAT32: Datatype = Datatype(5);
    pub const FLOAT64: Datatype = Datatype(6);
    pub const INT64: Datatype = Datatype(7);
    /// `staging_datatype`'s default: the tensor's own datatype applies.
    pub const UNSET: Datatype = Datatype(127);

    /// The schema's name: `"FLOAT32"`.
    pub fn schema_name(self) -> Option<&'static str> {
        vk_fb::VkDataType(self.0).variant_name()
    }

    /// The name in lower case, as `graph.txt` and `values/<id>.json` show it: `"float32"`.
    pub fn short_name(self) -> Option<&'static str> {
        Some(match self {
            Datatype::BOOL => "bool",
            Datatype::UINT8 => "uint8",
            Datatype::INT8 => "int8",
            Datatype::INT32 => "int32",
            Datatype::FLOAT16 => "float16",
            Datatype::FLOAT32 => "float32",
            Datatype::FLOAT64 => "float64",
            Datatype::INT64 => "int64",
            Datatype::UNSET => "unset",
            _ => return None,
        })
    }

    /// The short name, or the number when the value has none.
    pub fn display(self) -> String {
        self.short_name()
            .map_or_else(|| self.0.to_string(), str::to_string)
    }

    /// Bytes per element (the runtime's `vkapi::element_size`); None for `UNSET` and unknown
    /// values.
    pub fn element_size(self) -> Option<u64> {
        Some(match self {
            Datatype::BOOL | Datatype::UINT8 | Datatype::INT8 => 1,
            Datatype::FLOAT16 => 2,
            Datatype::INT32 | Datatype::FLOAT32 => 4,
            Datatype::FLOAT64 | Datatype::INT64 => 8,
            _ => return None,
        })
    }

    /// NumPy `descr` of the value's `.npy`: the stored element type. A 4-bit packed weight is
    /// a UINT8 tensor and so `|u1`, its dequantized view being the `.f32.npy`.
    pub fn numpy_descr(self) -> Option<&'static str> {
        Some(match self {
            Datatype::BOOL => "|b1",
            Datatype::UINT8 => "|u1",
            Datatype::INT8 => "|i1",
            Datatype::INT32 => "<i4",
            Datatype::FLOAT16 => "<f2",
            Datatype::FLOAT32 => "<f4",
            Datatype::FLOAT64 => "<f8",
            Datatype::INT64 => "<i8",
            _ => return None,
        })
    }

    /// Bytes a tensor of this type and `dims` takes: what the runtime reads for a constant in
    /// the payload's bytes region (element size × every dimension, overflow refused).
    pub fn nbytes(self, dims: &[u32]) -> Result<u64> {
        tensor_nbytes(&self.display(), self.element_size(), dims, None)
    }

    /// Shape of the `.npy`: `dims` as they are (no type here packs several elements a byte).
    pub fn npy_shape(self, dims: &[u32]) -> Vec<u64> {
        dims.iter().map(|&d| u64::from(d)).collect()
    }
}

/// A `VkStorageType` value as stored: what GPU resource holds the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StorageType(pub u8);

impl StorageType {
    pub const DEFAULT_STORAGE: StorageType = StorageType(255);

    /// `"TEXTURE_3D"`; None for values the schema does not name.
    pub fn schema_name(self) -> Option<&'static str> {
        vk_fb::VkStorageType(self.0).variant_name()
    }
}

/// A `VkMemoryLayout` value as stored: which dimension is packed into texels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryLayout(pub u8);

impl MemoryLayout {
    pub const DEFAULT_LAYOUT: MemoryLayout = MemoryLayout(255);

    /// `"TENSOR_WIDTH_PACKED"`; None for values the schema does not name.
    pub fn schema_name(self) -> Option<&'static str> {
        vk_fb::VkMemoryLayout(self.0).variant_name()
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
    fn sizes_follow_the_runtime() {
        assert_eq!(Datatype::FLOAT32.nbytes(&[3, 4]), Ok(48));
        assert_eq!(Datatype::FLOAT16.nbytes(&[3, 4]), Ok(24));
        assert_eq!(Datatype::UINT8.nbytes(&[4, 32]), Ok(128));
        assert_eq!(Datatype::INT64.nbytes(&[]), Ok(8));
        assert_eq!(Datatype::BOOL.nbytes(&[0, 5]), Ok(0));
        assert!(Datatype::FLOAT64
            .nbytes(&[u32::MAX, u32::MAX, u32::MAX])
            .is_err());
        assert!(Datatype::UNSET.nbytes(&[4]).is_err());
        assert!(Datatype(42).nbytes(&[4]).is_err());
        assert_eq!(Datatype::UINT8.npy_shape(&[4, 32]), vec![4, 32]);
    }

    #[test]
    fn every_named_type_has_its_names() {
        for v in (0..=7).chain([127]) {
            let d = Datatype(v);
            let short = d.short_name().unwrap();
            assert_eq!(d.schema_name().unwrap().to_lowercase(), short);
            assert_eq!(d.display(), short);
            assert_eq!(d.numpy_descr().is_some(), v != 127);
        }
        assert_eq!(Datatype(8).short_name(), None);
        assert_eq!(Datatype(-3).display(), "-3");
        assert_eq!(StorageType(1).schema_name(), Some("TEXTURE_3D"));
        assert_eq!(StorageType(7).schema_name(), None);
        assert_eq!(
            MemoryLayout(2).schema_name(),
            Some("TENSOR_CHANNELS_PACKED")
        );
        assert_eq!(MemoryLayout(7).schema_name(), None);
    }
}
