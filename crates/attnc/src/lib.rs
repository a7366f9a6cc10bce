//! attnc: a compiler for attention kernels.
//!
//! This facade re-exports the public API of the workspace crates:
//!
//! - [`ir`] (`attnc-ir`): what an attention variant *is* ([`Spec`]), the expression
//!   language of masks and score modifications, validation, the reference semantics;
//! - [`dsl`] (`attnc-dsl`): the `.attn` language, parser, printer and diagnostics;
//! - [`lower`] (`attnc-lower`): kernel families and codegen to PTX ([`compile`]), and
//!   the ptxas / nvdisasm driver ([`ptxas`]);
//! - [`runtime`] (`attnc-runtime`): the JIT runtime (CUDA driver, caches, launches).
//!
//! ```no_run
//! let spec = attnc::load_spec("dsl-examples/causal.attn").map_err(|d| d.to_string())?;
//! let module = attnc::compile(&spec, &attnc::CompileOptions::new(attnc::Arch::Sm90a))?;
//! println!("{}", module.ptx);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

pub use attnc_dsl as dsl;
pub use attnc_ir as ir;
pub use attnc_lower as lower;
pub use attnc_runtime as runtime;

pub use attnc_ir::{
    mask_facts, validate, Align, DType, Expr, KvLayout, Mask, MaskFacts, Scale, SoftmaxOptions, Spec, SpecError,
    SplitKv, TileClass, Window,
};
pub use attnc_lower::ptxas::{self, PtxasError, PtxasReport};
pub use attnc_lower::{
    compile, compile_directions, compile_without_spills, Arch, CompileOptions, CompiledModule, Direction, FamilyChoice,
    FamilyKind, KernelInfo, KernelRole, LowerError,
};

pub use attnc_dsl::{Diagnostic, Diagnostics};

/// Parses a `.attn` file into a validated [`Spec`]. The error's `Display` is rustc-like:
/// `file:line:col`, the source line and a caret.
pub fn load_spec(path: impl AsRef<Path>) -> Result<Spec, Diagnostics> {
    attnc_dsl::parse_file(path.as_ref())
}

/// Parses `.attn` text; diagnostics call the file `file_name`.
pub fn parse_spec(file_name: &str, src: &str) -> Result<Spec, Diagnostics> {
    attnc_dsl::parse_named(file_name, src)
}

/// Prints a spec back as `.attn` text (canonical form; it parses back to the same spec).
pub fn print_spec(spec: &Spec) -> String {
    attnc_dsl::print(spec)
}

/// Anything that can go wrong between a `.attn` file and PTX.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file does not parse or the spec is invalid (the message has file:line:col).
    #[error("{0}")]
    Dsl(Diagnostics),
    #[error(transparent)]
    Lower(#[from] LowerError),
    #[error(transparent)]
    Ptxas(#[from] PtxasError),
}

impl From<Diagnostics> for Error {
    fn from(d: Diagnostics) -> Error {
        Error::Dsl(d)
    }
}

/// `.attn` file → PTX module in one call.
pub fn compile_file(path: impl AsRef<Path>, opts: &CompileOptions) -> Result<CompiledModule, Error> {
    let spec = load_spec(path)?;
    Ok(compile(&spec, opts)?)
}
