//! Errors of the runtime. Launch arguments are checked before anything reaches the GPU;
//! each [`ValidationError`] names the argument at fault.

use crate::elem::ElemType;
use crate::tensor_map::{TmaEncode, TmaRule};

/// Anything that can go wrong in the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// libcuda could not be loaded (no NVIDIA driver on this machine).
    #[error("the CUDA driver is not available: {0}")]
    NoDriver(String),
    #[error("CUDA device {ordinal} is not usable: {detail}")]
    NoDevice { ordinal: usize, detail: String },
    #[error("{name} (compute capability {major}.{minor}) is not supported: attnc generates code for sm_80, sm_90a and sm_100a")]
    UnsupportedDevice { name: String, major: i32, minor: i32 },
    /// A driver call failed.
    #[error("{call} failed: {code} ({message})")]
    Cuda { call: String, code: String, message: String },
    /// The driver's JIT rejected PTX (or could not load a cubin); `log` is its error log.
    #[error("the CUDA JIT could not compile/load {what}: {code}\n{log}")]
    Jit { what: String, code: String, log: String },
    #[error(transparent)]
    Lower(#[from] attnc_lower::LowerError),
    #[error("invalid launch: {0}")]
    Validation(#[from] ValidationError),
    /// The driver's `cuTensorMapEncodeTiled` refused a tensor map; `args` holds every
    /// argument passed (and names the tensor and the kernel parameter).
    #[error("cuTensorMapEncodeTiled failed for {} (tensor map `{}`): {code} ({message}); arguments: {args}", .args.tensor, .args.param)]
    TensorMapEncode { code: String, message: String, args: Box<TmaEncode> },
    /// The compiled module's parameter list is not what the runtime knows how to fill.
    #[error("kernel ABI mismatch: {0}")]
    Abi(String),
    /// A block mask passed to a launch it was not built for.
    #[error("block mask: {0}")]
    BlockMask(String),
    #[error("{0}")]
    Other(String),
}

/// A launch argument that does not fit the kernel's spec. Checked on the host, before
/// launch; an accepted launch cannot read or write out of bounds.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("{arg}: missing ({why})")]
    Missing { arg: String, why: String },
    #[error("{arg}: not expected ({why})")]
    Unexpected { arg: String, why: String },
    #[error("{arg}: dtype is {found}, expected {expected}")]
    DType { arg: String, expected: ElemType, found: ElemType },
    #[error("{arg}: rank {found}, expected {expected} ({layout})")]
    Rank { arg: String, expected: usize, found: usize, layout: String },
    #[error("{arg}: dim {dim} ({dim_name}) is {found}, expected {expected}")]
    Dim { arg: String, dim: usize, dim_name: String, expected: usize, found: usize },
    #[error("{arg}: shape {shape:?} and strides {strides:?} do not match")]
    BadView { arg: String, shape: Vec<usize>, strides: Vec<usize> },
    #[error("{arg}: the last dimension must have unit stride, found stride {stride}")]
    InnerStride { arg: String, stride: usize },
    #[error("{arg}: {what} is {value}, not a multiple of {align} bytes")]
    Alignment { arg: String, what: String, value: u64, align: u64 },
    #[error("{arg}: the view reaches {needed} elements from its start, its allocation holds {capacity}")]
    OutOfBounds { arg: String, needed: u128, capacity: u64 },
    #[error("{arg}: on device {found}, the kernel runs on device {expected}")]
    WrongDevice { arg: String, expected: usize, found: usize },
    #[error("{a} and {b} overlap in device memory (outputs must not alias other tensors)")]
    Overlap { a: String, b: String },
    #[error("GQA: q has {q_heads} heads and k/v {kv_heads}; the spec needs {spec_q} and {spec_kv} (group of {group})")]
    GqaRatio { q_heads: usize, kv_heads: usize, spec_q: u32, spec_kv: u32, group: u32 },
    #[error("{arg}: {detail}")]
    CuSeqlens { arg: String, detail: String },
    #[error("block_table[{batch}][{page}] = {entry} is outside 0..{num_pages} (k/v have {num_pages} pages)")]
    PageIndex { batch: usize, page: usize, entry: i32, num_pages: usize },
    #[error("seqused_k[{batch}] = {value}: {detail}")]
    SequsedK { batch: usize, value: i32, detail: String },
    #[error("aux tensor `{name}`: {detail}")]
    Aux { name: String, detail: String },
    #[error("param `{name}`: {detail}")]
    Param { name: String, detail: String },
    #[error("sinks: {detail}")]
    Sinks { detail: String },
    #[error("positions: {detail}")]
    Positions { detail: String },
    #[error("{what} = {value} is too large (limit {limit})")]
    TooLarge { what: String, value: u64, limit: u64 },
    #[error("workspace: {detail}")]
    Workspace { detail: String },
    #[error("num_splits: {detail}")]
    Splits { detail: String },
    /// A tensor that a kernel reads or writes through a TMA tensor map breaks a
    /// precondition of `cuTensorMapEncodeTiled` (checked before any driver call).
    #[error("{arg} (tensor map `{param}`): {what} is {value}; TMA needs {rule}")]
    TensorMap { arg: String, param: String, rule: TmaRule, what: String, value: u64 },
}
