//! A TMA tensor map as data: every argument of one `cuTensorMapEncodeTiled` call
//! ([`TmaEncode`]), the driver's preconditions on them ([`TmaRule`]) and the 128 encoded
//! bytes a kernel takes by value ([`TensorMapArg`]). A leaf below the error types and the
//! driver layer; `crate::tma` checks and encodes.

use std::fmt;

/// Bytes of a `CUtensorMap`.
pub const TENSOR_MAP_BYTES: usize = 128;
/// Alignment of a tensor-map kernel parameter (`.param .align 64 .b8 [128]`).
pub const TENSOR_MAP_ALIGN: usize = 64;
/// Largest box extent in any dimension.
pub const MAX_BOX_DIM: u32 = 256;
/// Global strides must stay below 2^40 bytes.
pub const MAX_GLOBAL_STRIDE: u64 = 1 << 40;
/// Global dims must lie in `1..=2^32`.
pub const MAX_GLOBAL_DIM: u64 = 1 << 32;

/// An encoded `CUtensorMap`: 128 opaque bytes, 64-byte aligned, passed to the kernel by
/// value.
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorMapArg(pub [u64; 16]);

impl TensorMapArg {
    /// The 128 bytes as the driver wrote them.
    pub fn to_bytes(&self) -> [u8; TENSOR_MAP_BYTES] {
        let mut b = [0u8; TENSOR_MAP_BYTES];
        for (chunk, w) in b.chunks_exact_mut(8).zip(self.0) {
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        b
    }
}

impl fmt::Debug for TensorMapArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorMapArg(")?;
        for (i, w) in self.0.iter().enumerate() {
            write!(f, "{}{w:016x}", if i == 0 { "" } else { " " })?;
        }
        write!(f, ")")
    }
}

/// `CU_TENSOR_MAP_DATA_TYPE_*` of the tensors attnc maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaDataType {
    Bfloat16,
    Float16,
}

/// `CU_TENSOR_MAP_SWIZZLE_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaSwizzle {
    None,
    B32,
    B64,
    B128,
}

impl TmaSwizzle {
    /// From a span in bytes (0, 32, 64, 128).
    pub fn from_bytes(bytes: u32) -> Option<TmaSwizzle> {
        match bytes {
            0 => Some(TmaSwizzle::None),
            32 => Some(TmaSwizzle::B32),
            64 => Some(TmaSwizzle::B64),
            128 => Some(TmaSwizzle::B128),
            _ => None,
        }
    }
    /// The span in bytes (0 for none).
    pub fn bytes(self) -> u32 {
        match self {
            TmaSwizzle::None => 0,
            TmaSwizzle::B32 => 32,
            TmaSwizzle::B64 => 64,
            TmaSwizzle::B128 => 128,
        }
    }
}

/// Which precondition of `cuTensorMapEncodeTiled` a tensor breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaRule {
    /// 16-bit float elements (bf16 or fp16).
    DataType,
    /// Rank 4 `[batch, seqlen, heads, d]` or rank 3 `[total, heads, d]`.
    Rank,
    /// The global address 16-byte aligned.
    BaseAlignment,
    /// Every global stride a multiple of 16 bytes.
    StrideMultiple,
    /// Every global stride below 2^40 bytes.
    StrideRange,
    /// Every global dim in `1..=2^32`.
    DimRange,
    /// Every box dim in `1..=256`.
    BoxDim,
    /// `box_cols × element bytes` a multiple of 16.
    BoxColsBytes,
    /// `box_cols × element bytes` within the swizzle span.
    SwizzleSpan,
    /// A swizzle span of 0, 32, 64 or 128 bytes.
    Swizzle,
}

impl fmt::Display for TmaRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TmaRule::DataType => "16-bit float elements (bf16 or fp16)",
            TmaRule::Rank => "rank 4 [batch, seqlen, heads, d] or rank 3 [total, heads, d]",
            TmaRule::BaseAlignment => "a 16-byte aligned global address",
            TmaRule::StrideMultiple => "every global stride a multiple of 16 bytes",
            TmaRule::StrideRange => "every global stride below 2^40 bytes",
            TmaRule::DimRange => "every global dim in 1..=2^32",
            TmaRule::BoxDim => "every box dim in 1..=256",
            TmaRule::BoxColsBytes => "box_cols x element bytes a multiple of 16",
            TmaRule::SwizzleSpan => "box_cols x element bytes within the swizzle span",
            TmaRule::Swizzle => "a swizzle span of 0, 32, 64 or 128 bytes",
        })
    }
}

/// Every argument of one `cuTensorMapEncodeTiled` call (interleave NONE, L2 promotion
/// 256 B and OOB fill NONE are fixed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaEncode {
    /// The kernel parameter that receives the map.
    pub param: String,
    /// The tensor it describes (`q`, `k`, `v`, `o`; `do` for the backward).
    pub tensor: String,
    pub data_type: TmaDataType,
    pub global_address: u64,
    /// 4, or 5 for a pack-GQA Q map. The arrays below hold `rank` (strides: `rank - 1`)
    /// entries; the rest are unused.
    pub rank: u32,
    /// `{d, seqlen, heads, batch}`; rank 5: `{d, G, seqlen, kv_heads, batch}`.
    pub global_dims: [u64; 5],
    /// Bytes: `{row, head, batch}`; rank 5: `{head, row, G x head, batch}`.
    pub global_strides: [u64; 4],
    /// `{box_cols, box_rows, 1, 1}`; rank 5: `{box_cols, G, box_rows / G, 1, 1}`.
    pub box_dims: [u32; 5],
    pub element_strides: [u32; 5],
    pub swizzle: TmaSwizzle,
}

impl TmaEncode {
    /// The used part of each array (for display and tests).
    pub fn dims(&self) -> (&[u64], &[u64], &[u32]) {
        let r = self.rank as usize;
        (&self.global_dims[..r], &self.global_strides[..r - 1], &self.box_dims[..r])
    }
}

impl fmt::Display for TmaEncode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dt = match self.data_type {
            TmaDataType::Bfloat16 => "BFLOAT16",
            TmaDataType::Float16 => "FLOAT16",
        };
        let sw = match self.swizzle {
            TmaSwizzle::None => "NONE",
            TmaSwizzle::B32 => "32B",
            TmaSwizzle::B64 => "64B",
            TmaSwizzle::B128 => "128B",
        };
        let (dims, strides, boxes) = self.dims();
        write!(
            f,
            "tensorDataType={dt} tensorRank={} globalAddress={:#x} globalDim={:?} globalStrides={:?} boxDim={:?} \
             elementStrides={:?} interleave=NONE swizzle={sw} l2Promotion=L2_256B oobFill=NONE",
            self.rank,
            self.global_address,
            dims,
            strides,
            boxes,
            &self.element_strides[..self.rank as usize]
        )
    }
}
