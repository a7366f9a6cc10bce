//! LLVM plumbing shared by all families: the NVPTX target machine, the optimization
//! pipeline and PTX emission, plus the kernel builder ([`kb`]) and PTX instruction
//! wrappers ([`ptx`]).

pub mod kb;
pub mod operand;
pub mod ptx;
pub mod tcgen05;
pub mod wgmma;

use crate::arch::Arch;
use crate::error::LowerError;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};
use inkwell::OptimizationLevel;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static INIT: Once = Once::new();

/// Whether compiled modules keep the text of their optimized LLVM IR
/// (`CompiledModule::llvm_ir`). Printing it is a sizeable part of a cold compile (a
/// megabyte or more per module) and only `attnc dump --emit llvm` and tests read it, so
/// it is off unless a tool asks.
static KEEP_LLVM_IR: AtomicBool = AtomicBool::new(false);

/// Keep (or stop keeping) the optimized LLVM IR text of modules compiled from now on in
/// this process.
pub fn keep_llvm_ir(on: bool) {
    KEEP_LLVM_IR.store(on, Ordering::Relaxed);
}

/// The function passes kernels need: promote slots to registers (SROA), then clean up
/// (CSE, instcombine, GVN, dead code, CFG). The schedules are already unrolled and
/// laid out by the families, and ptxas does the heavy scheduling, so `default<O3>`
/// buys nothing here: on every example it gave the same ptxas register counts (±3)
/// and no spills either way, at ~40% more compile time.
/// `no-verify-fixpoint`: instcombine's fixpoint check aborts the process otherwise.
const PIPELINE: &str = "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,gvn,instcombine<no-verify-fixpoint>,adce,simplifycfg)";

fn target_machine(arch: Arch, ptx_feature: &str) -> Result<TargetMachine, LowerError> {
    INIT.call_once(|| Target::initialize_nvptx(&InitializationConfig::default()));
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let target = Target::from_triple(&triple).map_err(|e| LowerError::Llvm(format!("NVPTX target: {e}")))?;
    target
        .create_target_machine(
            &triple,
            arch.name(),
            ptx_feature,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| LowerError::Llvm(format!("cannot create an NVPTX target machine for {arch}")))
}

/// Verifies and optimizes `module`, then returns (optimized LLVM IR — empty unless
/// [`keep_llvm_ir`] —, PTX) and the time spent optimizing and in code generation (ms).
pub fn emit_ptx(module: &Module<'_>, arch: Arch) -> Result<(String, String, f64, f64), LowerError> {
    emit_ptx_with(module, arch, arch.ptx_feature())
}

/// [`emit_ptx`] at a given PTX ISA version (`+ptx81`): a module that uses instructions
/// newer than the arch's baseline (e.g. vector `red` on sm_90a) asks for the ISA that
/// has them.
pub fn emit_ptx_with(
    module: &Module<'_>,
    arch: Arch,
    ptx_feature: &str,
) -> Result<(String, String, f64, f64), LowerError> {
    let t0 = std::time::Instant::now();
    module.verify().map_err(|e| LowerError::Llvm(format!("invalid LLVM IR: {e}")))?;
    let tm = target_machine(arch, ptx_feature)?;
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let opts = PassBuilderOptions::create();
    opts.set_loop_unrolling(true);
    module.run_passes(PIPELINE, &tm, opts).map_err(|e| LowerError::Llvm(format!("optimization pipeline: {e}")))?;
    let optimize_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = std::time::Instant::now();
    let ir = if KEEP_LLVM_IR.load(Ordering::Relaxed) { module.print_to_string().to_string() } else { String::new() };
    let buf = tm
        .write_to_memory_buffer(module, FileType::Assembly)
        .map_err(|e| LowerError::Llvm(format!("PTX emission: {e}")))?;
    let ptx = String::from_utf8_lossy(buf.as_slice()).trim_end_matches('\0').to_string();
    Ok((ir, ptx, optimize_ms, t1.elapsed().as_secs_f64() * 1e3))
}
