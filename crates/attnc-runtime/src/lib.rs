//! attnc-runtime: the JIT runtime of attnc.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use attnc_runtime::{ElemType, Params, Runtime};
//! let rt = Runtime::new(0)?; // device 0; CUDA is loaded at run time
//! let mut spec = attnc_ir::Spec::new("causal", 128, 16);
//! spec.mask.causal = Some(attnc_ir::Align::TopLeft);
//! let kernel = rt.kernel(&spec)?; // compiled once, cached in memory and on disk
//! let (b, s) = (2, 1024);
//! let q = rt.alloc(ElemType::Bf16, &[b, s, 16, 128])?;
//! let k = rt.alloc(ElemType::Bf16, &[b, s, 16, 128])?;
//! let v = rt.alloc(ElemType::Bf16, &[b, s, 16, 128])?;
//! let mut out = rt.alloc(ElemType::Bf16, &[b, s, 16, 128])?;
//! let receipt = kernel.forward(&q, &k, &v, &mut out, &Params::default())?;
//! println!("{receipt}"); // which family ran, its config, fallback reason if any
//! # Ok(()) }
//! ```
//!
//! Memory the caller owns, on the caller's stream — here a cudarc program's (`f16` feature
//! for bf16 slices); the Python package does the same with PyTorch's tensors and current
//! stream. Once the kernel is cached (and the stream's workspace sized, for split-KV and
//! the backward) such a call allocates nothing and waits for nothing on the host, so it can
//! be captured in a CUDA graph:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use attnc_runtime::{Params, Runtime};
//! use half::bf16;
//! let cu = |e: cudarc::driver::DriverError| format!("{e:?}");
//! let rt = Runtime::new(0)?;
//! let ctx = cudarc::driver::CudaContext::new(0).map_err(cu)?; // device 0's primary context
//! let stream = ctx.new_stream().map_err(cu)?;
//! let kernel = rt.kernel(&attnc_ir::Spec::new("full", 128, 16))?;
//! let shape = [2, 1024, 16, 128];
//! let n: usize = shape.iter().product();
//! let zeros = || stream.alloc_zeros::<bf16>(n).map_err(cu);
//! let (q, k, v, mut o) = (zeros()?, zeros()?, zeros()?, zeros()?);
//! {
//!     let (tq, tk, tv) = (rt.borrow(&q, &stream, &shape)?, rt.borrow(&k, &stream, &shape)?, rt.borrow(&v, &stream, &shape)?);
//!     let mut to = rt.borrow_mut(&mut o, &stream, &shape)?;
//!     kernel.forward(&tq, &tk, &tv, &mut to, &Params::default().on_stream(rt.stream_of(&stream)?))?;
//! } // the borrows end: cudarc orders later uses of q, k, v, o after the kernel
//! let o_host: Vec<bf16> = stream.memcpy_dtov(&o).map_err(cu)?;
//! # Ok(()) }
//! ```
//!
//! - [`cache`] — the memory + disk artifact cache (generic; CPU-tested);
//! - [`cuda`] — the driver layer (context, stream, memory, modules, launches, events);
//! - [`jit`] — spec → PTX → cubin → module, cache keys and payloads;
//! - [`elem`] — element types;
//! - [`tensor`] — device tensors, views, descriptors;
//! - [`validate`] — launch validation (descriptor-level; CPU-tested);
//! - [`tensor_map`] — a TMA tensor map as data (encode arguments, rules, bytes);
//! - [`tma`] — TMA tensor maps: encode arguments and their checks (CPU-tested), the
//!   driver's `cuTensorMapEncodeTiled`;
//! - [`split`] — the split-KV heuristic;
//! - [`runtime`] — [`Runtime`], [`Kernel`], [`Params`];
//! - [`backward`] — [`Kernel::backward`]: its validation, workspace and kernel sequence;
//! - [`receipt`] — [`Receipt`];
//! - [`selftest`], [`bench`] — the library halves of `attnc selftest` and `attnc bench`;
//!   [`bench_plot`] — a bench report (and the peers') as an SVG.

pub mod backward;
pub mod bench;
pub mod bench_plot;
pub mod block_mask;
pub mod cache;
pub mod cuda;
pub mod dispatch;
pub mod elem;
pub mod error;
pub mod hash;
pub mod jit;
mod launch_memo;
mod params;
pub mod ready_first;
pub mod receipt;
pub mod runtime;
pub mod selftest;
pub mod split;
pub mod tensor;
pub mod tensor_map;
pub mod tma;
pub mod validate;
pub mod variant_bench;
mod workspace;

pub use backward::Gradients;
pub use block_mask::BlockMask;
pub use cache::{CacheConfig, CacheSource, CacheStats};
pub use cuda::{driver_present, DeviceInfo, Stream};
pub use error::{RuntimeError, ValidationError};
pub use params::Params;
pub use ready_first::PendingKernel;
pub use receipt::{BlockMaskSource, BlockMaskUse, KernelConfig, Receipt, Timings};
pub use runtime::{Borrowed, Kernel, Runtime, Warmed};
pub use tensor::{ElemType, Element, IndexTensor, Tensor, TensorDesc};
pub use validate::{LaunchPlan, ParamValue};

#[cfg(test)]
mod tests;
