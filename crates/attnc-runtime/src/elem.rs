//! Element types of device tensors and the host types that map to them. A leaf: the
//! error types and every layer above name element types through it.

use attnc_ir::DType;
use serde::Serialize;
use std::fmt;

/// Element types of device tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ElemType {
    Bf16,
    F16,
    F32,
    I32,
}

impl ElemType {
    pub fn bytes(self) -> usize {
        match self {
            ElemType::Bf16 | ElemType::F16 => 2,
            ElemType::F32 | ElemType::I32 => 4,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ElemType::Bf16 => "bf16",
            ElemType::F16 => "fp16",
            ElemType::F32 => "f32",
            ElemType::I32 => "i32",
        }
    }
    /// The storage type of Q, K, V and O for a spec's dtype.
    pub fn of(d: DType) -> ElemType {
        match d {
            DType::Bf16 => ElemType::Bf16,
            DType::Fp16 => ElemType::F16,
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Host types that map to an [`ElemType`].
pub trait Element: Copy + Default + Send + Sync + 'static {
    const TYPE: ElemType;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}

impl Element for half::bf16 {
    const TYPE: ElemType = ElemType::Bf16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
}
impl Element for half::f16 {
    const TYPE: ElemType = ElemType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
}
impl Element for f32 {
    const TYPE: ElemType = ElemType::F32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}
impl Element for i32 {
    const TYPE: ElemType = ElemType::I32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as i32
    }
}
