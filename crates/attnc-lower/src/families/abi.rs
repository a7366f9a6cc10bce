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
