//! What every family's launch ABI is made of: typed parameters in order. Each family
//! lists its kernels' parameters (`<family>/abi.rs`); `KernelInfo::params` carries them
//! as `name:type` strings, which the runtime marshals.

/// The machine type of a kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamTy {
    /// A 128-byte CUtensorMap passed by value (`.param .align 64 .b8 [128]`).
    TensorMap,
    /// A device address (u64); 0 where the tensor is absent.
    Ptr,
    I64,
    I32,
    F32,
}

impl ParamTy {
    pub fn name(self) -> &'static str {
        match self {
            ParamTy::TensorMap => "tensormap",
            ParamTy::Ptr => "ptr",
            ParamTy::I64 => "i64",
            ParamTy::I32 => "i32",
            ParamTy::F32 => "f32",
        }
    }
}

/// "name:type" strings for `KernelInfo::params`.
pub fn describe(params: &[(String, ParamTy)]) -> Vec<String> {
    params.iter().map(|(n, t)| format!("{n}:{}", t.name())).collect()
}

/// One TMA tensor map a kernel takes by value (`ParamTy::TensorMap`), as the runtime
/// must encode it with `cuTensorMapEncodeTiled` from the launch's tensor: rank 4 (or 5,
/// see `pack_group`) over
/// `[batch, seqlen, heads, d]`, innermost first (`{d, seqlen, heads, batch}`; with varlen
/// the packed `[total, heads, d]` tensor as batch 1), strides in bytes, elementStrides 1,
/// no interleave, out-of-bounds elements read as zero.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TmaBox {
    /// The kernel parameter that receives the map (e.g. `tmap_q`).
    pub param: String,
    /// The tensor it describes: `q`, `k`, `v` or `o`.
    pub tensor: String,
    /// Box extent along d, elements (× 2 bytes ≤ the swizzle span).
    pub box_cols: u32,
    /// Box extent along the sequence, rows (≤ 256).
    pub box_rows: u32,
    /// `CU_TENSOR_MAP_SWIZZLE_*` span in bytes: 0 (none), 32, 64 or 128.
    pub swizzle_bytes: u32,
    /// 1: the rank-4 map above. G > 1 (pack-GQA Q): rank 5 over
    /// `{d, G, seqlen, kv_heads, batch}` with the box `{box_cols, G, box_rows / G, 1, 1}`,
    /// so one box holds `box_rows / G` positions of all G heads of a KV group.
    #[serde(default = "one")]
    pub pack_group: u32,
}

fn one() -> u32 {
    1
}
