//! Kernel families and the choice between them.

use crate::arch::Arch;
use attnc_ir::Spec;
use serde::Serialize;
use std::fmt;

pub mod abi;
pub mod blackwell;
pub mod hopper;
pub mod portable;
pub mod sw128;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum FamilyKind {
    /// FlashAttention-2-style: mma.sync m16n8k16, ldmatrix, cp.async. Runs on sm_80+.
    Portable,
    /// Warp-specialized wgmma/TMA (sm_90a).
    Hopper,
    /// FA4 pipeline with tcgen05/TMEM (sm_100a).
    Blackwell,
}

impl FamilyKind {
    pub fn name(self) -> &'static str {
        match self {
            FamilyKind::Portable => "portable",
            FamilyKind::Hopper => "hopper",
            FamilyKind::Blackwell => "blackwell",
        }
    }
}

impl fmt::Display for FamilyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FamilyChoice {
    /// The family the dispatcher would pick on the arch.
    #[default]
    Auto,
    Exactly(FamilyKind),
}

impl std::str::FromStr for FamilyChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => FamilyChoice::Auto,
            "portable" => FamilyChoice::Exactly(FamilyKind::Portable),
            "hopper" => FamilyChoice::Exactly(FamilyKind::Hopper),
            "blackwell" => FamilyChoice::Exactly(FamilyKind::Blackwell),
            _ => return Err(format!("unknown family `{s}`: expected auto, portable, hopper or blackwell")),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    pub arch: Arch,
    pub family: FamilyChoice,
}

impl CompileOptions {
    pub fn new(arch: Arch) -> Self {
        CompileOptions { arch, family: FamilyChoice::Auto }
    }
}

/// One `.entry` of a module and how to launch it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelInfo {
    /// The PTX entry name.
    pub name: String,
    /// What it does, e.g. "forward" or "split-KV combine".
    pub role: String,
    pub threads_per_block: u32,
    /// Dynamic shared memory to request at launch, bytes.
    pub dynamic_smem_bytes: u32,
    /// Rows of Q (packed rows with pack_gqa) one CTA handles.
    pub block_m: u32,
    /// Keys per inner-loop tile.
    pub block_n: u32,
    /// The kernel's parameter list in order (documentation and runtime ABI check).
    pub params: Vec<String>,
    /// How to encode each `tensormap` parameter (empty for kernels without TMA).
    pub tensor_maps: Vec<abi::TmaBox>,
    /// A persistent kernel walks the work tiles (`ceil(rows / block_m) x heads x batch`)
    /// itself: its grid is `[min(tiles, SMs x CTAs per SM), 1, 1]`, not one CTA a tile.
    pub persistent: bool,
}

/// The result of lowering one spec for one arch.
#[derive(Clone, Debug)]
pub struct CompiledModule {
    pub family: FamilyKind,
    pub arch: Arch,
    /// Why the requested family was not used (auto or explicit fallback).
    pub fallback_reason: Option<String>,
    pub kernels: Vec<KernelInfo>,
    /// The optimized LLVM IR, as text.
    pub llvm_ir: String,
    pub ptx: String,
    /// Where the compile time went.
    pub timings: CompileTimings,
}

/// Wall-clock time of each lowering phase, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CompileTimings {
    /// Building the LLVM IR (the family's schedule and the variant code).
    pub build_ms: f64,
    /// LLVM's optimization pipeline.
    pub optimize_ms: f64,
    /// NVPTX instruction selection, register allocation and PTX printing.
    pub codegen_ms: f64,
}

impl CompileTimings {
    pub fn total_ms(&self) -> f64 {
        self.build_ms + self.optimize_ms + self.codegen_ms
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    #[error("the {family} family cannot compile this variant for {arch}: {reason}")]
    Unsupported { family: FamilyKind, arch: Arch, reason: String },
    #[error("LLVM error: {0}")]
    Llvm(String),
}

/// Which families could run on `arch`, fastest first.
pub fn candidates(arch: Arch) -> &'static [FamilyKind] {
    match arch {
        Arch::Sm80 => &[FamilyKind::Portable],
        Arch::Sm90a => &[FamilyKind::Hopper, FamilyKind::Portable],
        Arch::Sm100a => &[FamilyKind::Blackwell, FamilyKind::Portable],
    }
}

/// Why `family` cannot compile `spec` for `arch`, or `None` when it can.
pub fn unsupported_reason(family: FamilyKind, spec: &Spec, arch: Arch) -> Option<String> {
    match family {
        FamilyKind::Portable => portable::unsupported_reason(spec, arch),
        FamilyKind::Hopper => hopper::unsupported_reason(spec, arch),
        FamilyKind::Blackwell => blackwell::unsupported_reason(spec, arch),
    }
}

/// Lowers a spec to PTX with the chosen (or best available) family. Fails closed: an
/// explicitly requested family that cannot compile the spec is an error, `Auto` falls
/// back along [`candidates`] and records why.
pub fn compile(spec: &Spec, opts: &CompileOptions) -> Result<CompiledModule, LowerError> {
    if let Err(errors) = attnc_ir::validate(spec) {
        let msgs: Vec<String> = errors.iter().map(|e| e.message.clone()).collect();
        return Err(LowerError::InvalidSpec(msgs.join("; ")));
    }
    let arch = opts.arch;
    let (family, fallback_reason) = match opts.family {
        FamilyChoice::Exactly(f) => {
            if let Some(reason) = unsupported_reason(f, spec, arch) {
                return Err(LowerError::Unsupported { family: f, arch, reason });
            }
            (f, None)
        }
        FamilyChoice::Auto => {
            let mut reasons = Vec::new();
            let mut chosen = None;
            for &f in candidates(arch) {
                match unsupported_reason(f, spec, arch) {
                    None => {
                        chosen = Some(f);
                        break;
                    }
                    Some(r) => reasons.push(format!("{f}: {r}")),
                }
            }
            let Some(f) = chosen else {
                return Err(LowerError::Unsupported { family: FamilyKind::Portable, arch, reason: reasons.join("; ") });
            };
            (f, if reasons.is_empty() { None } else { Some(reasons.join("; ")) })
        }
    };
    let mut module = match family {
        FamilyKind::Portable => portable::compile(spec, arch)?,
        FamilyKind::Hopper => hopper::compile(spec, arch)?,
        FamilyKind::Blackwell => blackwell::compile(spec, arch)?,
    };
    module.fallback_reason = fallback_reason;
    Ok(module)
}
