//! LLVM plumbing shared by all families: the NVPTX target machine, the optimization
//! pipeline and PTX emission, plus the kernel builder ([`kb`]) and PTX instruction
//! wrappers ([`ptx`]).

pub mod kb;
pub mod ptx;

use crate::arch::Arch;
use crate::families::LowerError;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};
use inkwell::OptimizationLevel;
use std::sync::Once;

static INIT: Once = Once::new();

fn target_machine(arch: Arch) -> Result<TargetMachine, LowerError> {
    INIT.call_once(|| Target::initialize_nvptx(&InitializationConfig::default()));
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let target = Target::from_triple(&triple).map_err(|e| LowerError::Llvm(format!("NVPTX target: {e}")))?;
    target
        .create_target_machine(
            &triple,
            arch.name(),
            arch.ptx_feature(),
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| LowerError::Llvm(format!("cannot create an NVPTX target machine for {arch}")))
}

/// Verifies and optimizes `module`, then returns (optimized LLVM IR, PTX).
pub fn emit_ptx(module: &Module<'_>, arch: Arch) -> Result<(String, String), LowerError> {
    module.verify().map_err(|e| LowerError::Llvm(format!("invalid LLVM IR: {e}")))?;
    let tm = target_machine(arch)?;
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let opts = PassBuilderOptions::create();
    opts.set_loop_unrolling(true);
    module
        .run_passes("default<O3>", &tm, opts)
        .map_err(|e| LowerError::Llvm(format!("optimization pipeline: {e}")))?;
    let ir = module.print_to_string().to_string();
    let buf = tm
        .write_to_memory_buffer(module, FileType::Assembly)
        .map_err(|e| LowerError::Llvm(format!("PTX emission: {e}")))?;
    let ptx = String::from_utf8_lossy(buf.as_slice()).trim_end_matches('\0').to_string();
    Ok((ir, ptx))
}
