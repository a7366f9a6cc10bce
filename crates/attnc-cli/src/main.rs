//! `attnc`: the command-line face of the attention-kernel compiler.
//!
//! - `attnc dump FILE.attn --arch sm_90a [--family auto] [--pass fwd|bwd|all] [--emit ir|llvm|ptx]`
//! - `attnc check FILE.attn... --arch sm_80|sm_90a|sm_100a|all [--family auto] [--pass fwd|bwd|all]`
//! - `attnc selftest [FILES|DIRS] [--quick] [--json OUT]` (GPU): every variant against
//!   the f64 reference over a matrix of shapes
//! - `attnc bench [--quick] [--suites ...] [--json OUT]` (GPU): the benchmark protocol
//! - `attnc bench FILE.attn [--batch N] [--seqlen N] [--param ..] [--aux ..]` (GPU): one
//!   variant's forward and backward at one shape
//! - `attnc report FILE.attn --arch sm_100a [--json]`: the blackwell family's schedule
//!   (FA4 cycle model per tile, TMEM column map, warp roles, shared memory, mbarriers)
//!
//! Exit codes: 0 success, 1 a diagnostic (parse, compile, ptxas, budget), 2 usage.

mod check;
mod gpu;
mod output;
mod summary;

use attnc::{Arch, CompileOptions, Direction, FamilyChoice};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};

use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "attnc",
    version,
    about = "attnc: a compiler for GPU attention kernels (.attn -> LLVM -> PTX)",
    long_about = None,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print what attnc generates for a .attn file: the IR and its summary, the LLVM IR or the PTX.
    Dump(DumpArgs),
    /// Assemble the generated PTX with ptxas and report registers, spills and shared memory
    /// per kernel; fails on spills, ptxas errors or blown budgets.
    Check(CheckArgs),
    /// Run every variant on the GPU against the f64 reference over a matrix of shapes
    /// (odd lengths, seqlen_q != seqlen_k, varlen, GQA, page sizes, splits), forward and,
    /// for variants that train, the gradients; prints a table, optionally JSON; fails if
    /// any case fails.
    Selftest(gpu::SelftestArgs),
    /// The benchmark protocol on the GPU: copy/GEMM ceilings, prefill and backward
    /// TFLOP/s, decode TB/s, compile times; table and JSON. With FILE: that variant's
    /// forward (and backward, when it trains) at one shape, with its density of allowed
    /// pairs and, for masks over aux tensors, the block mask's cost.
    Bench(Box<gpu::BenchArgs>),
    /// Fill the kernel cache ahead of deployment: compile (or load) every module the
    /// variants in the given files or folders may need on this GPU — the forward, its
    /// decode twin, and for variants that train the LSE forward and the backward — so no
    /// first call pays a compile.
    Warm(gpu::WarmArgs),
    /// The blackwell family's schedule for a variant: the FA4 cycle model per tile (MMA,
    /// shared memory, exponentials), the TMEM column map, warp roles with register
    /// budgets, shared memory and mbarriers; or why the family falls back.
    Report(ReportArgs),
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// The .attn file.
    file: PathBuf,
    /// Target architecture (the report models sm_100a's FA4 pipeline).
    #[arg(long, value_parser = parse_arch, value_name = "ARCH", default_value = "sm_100a")]
    arch: Arch,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Which pass: `fwd` (the forward's schedule) or `bwd` (the backward's resource plan:
    /// TMEM map, shared memory, warp roles, barriers and cycle model of the built kernel,
    /// one CTA per key tile or, at head dim 128, a CTA pair).
    #[arg(long, default_value = "fwd", value_parser = ["fwd", "bwd"])]
    pass: String,
}

#[derive(Args, Debug)]
struct DumpArgs {
    /// The .attn file.
    file: PathBuf,
    /// Target architecture: sm_80, sm_90a or sm_100a.
    #[arg(long, value_parser = parse_arch, value_name = "ARCH")]
    arch: Arch,
    /// Kernel family: auto (what the dispatcher would pick), portable, hopper or blackwell.
    #[arg(long, default_value = "auto", value_parser = parse_family, value_name = "FAMILY")]
    family: FamilyChoice,
    /// Which pass: the forward, the backward, or all (the forward, then the backward
    /// where the variant has one; each module printed after a comment line naming it).
    #[arg(long, value_enum, default_value_t = Pass::All)]
    pass: Pass,
    /// What to print.
    #[arg(long, value_enum, default_value_t = Emit::Ptx)]
    emit: Emit,
    /// Write to this file instead of stdout.
    #[arg(short, long, value_name = "PATH")]
    output: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// The parsed variant, printed back as .attn, plus the compile summary (family,
    /// kernels, launch shapes, mask facts).
    Ir,
    /// The optimized LLVM IR.
    Llvm,
    /// The PTX.
    Ptx,
}

/// The `--pass` of `dump` and `check`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pass {
    /// The forward.
    Fwd,
    /// The backward.
    Bwd,
    /// The forward, and the backward where the variant has one.
    All,
}

impl Pass {
    /// The directions to compile for `spec`: `All` leaves out a backward the variant
    /// does not have (an inference layout); `Bwd` keeps it, so compiling it reports why.
    pub fn directions(self, spec: &attnc::Spec) -> Vec<Direction> {
        match self {
            Pass::Fwd => vec![Direction::Forward],
            Pass::Bwd => vec![Direction::Backward],
            Pass::All => Direction::ALL
                .into_iter()
                .filter(|&d| attnc::lower::compile::pass_unsupported_reason(spec, d).is_none())
                .collect(),
        }
    }
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// One or more .attn files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Target architecture: sm_80, sm_90a, sm_100a, or all (the three).
    #[arg(long, value_parser = parse_arch_sel, value_name = "ARCH")]
    arch: ArchSel,
    /// Kernel family: auto, portable, hopper or blackwell.
    #[arg(long, default_value = "auto", value_parser = parse_family, value_name = "FAMILY")]
    family: FamilyChoice,
    /// Which pass: the forward, the backward (an error for a variant without one), or all
    /// (the forward, and the backward where the variant has one).
    #[arg(long, value_enum, default_value_t = Pass::All)]
    pass: Pass,
    /// Also print ptxas warnings and the full `ptxas -v` log.
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ArchSel {
    One(Arch),
    All,
}

impl ArchSel {
    fn archs(self) -> Vec<Arch> {
        match self {
            ArchSel::One(a) => vec![a],
            ArchSel::All => Arch::ALL.to_vec(),
        }
    }
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    s.parse::<Arch>()
}

fn parse_arch_sel(s: &str) -> Result<ArchSel, String> {
    if s == "all" {
        return Ok(ArchSel::All);
    }
    s.parse::<Arch>()
        .map(ArchSel::One)
        .map_err(|_| format!("unknown arch `{s}`: expected sm_80, sm_90a, sm_100a or all"))
}

fn parse_family(s: &str) -> Result<FamilyChoice, String> {
    s.parse::<FamilyChoice>()
}

/// A failure already explained on stderr; maps to exit code 1.
pub struct Reported;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Usage errors exit 2, --help/--version exit 0 (clap's own codes).
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Dump(args) => dump(&args),
        Command::Check(args) => check::run(&args.files, &args.arch.archs(), args.family, args.pass, args.verbose),
        Command::Selftest(args) => gpu::selftest(&args),
        Command::Bench(args) => gpu::bench(&args),
        Command::Warm(args) => gpu::warm(&args),
        Command::Report(args) => report(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Reported) => ExitCode::from(1),
    }
}

/// Reads and parses a .attn file, reporting failures on stderr.
pub fn load(path: &Path) -> Result<attnc::Spec, Reported> {
    // attnc-dsl reports unreadable files (missing, a directory, not UTF-8) as diagnostics.
    attnc::load_spec(path).map_err(|diag| {
        eprintln!("{}", diag.to_string().trim_end());
        Reported
    })
}

fn dump(args: &DumpArgs) -> Result<(), Reported> {
    let spec = load(&args.file)?;
    let directions = args.pass.directions(&spec);
    let several = directions.len() > 1;
    let mut text = String::new();
    if args.emit == Emit::Ir {
        text = attnc::print_spec(&spec);
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    let mut failed = Vec::new();
    let base = CompileOptions::new(args.arch).family(args.family);
    if args.emit == Emit::Llvm {
        attnc::lower::llvm::keep_llvm_ir(true);
    }
    let modules = attnc::compile_directions(&spec, &base, &directions);
    for (direction, compiled) in directions.into_iter().zip(modules) {
        let opts = base.clone().direction(direction);
        match args.emit {
            // `--emit ir` prints the spec and summary even when codegen fails; the error
            // still fails the run.
            Emit::Ir => text.push_str(&summary::summary(&spec, &opts, compiled.as_ref().ok())),
            Emit::Llvm | Emit::Ptx => {
                if let Ok(m) = &compiled {
                    if several {
                        text.push_str(&format!("// ==== attnc {direction} module ====\n"));
                    }
                    text.push_str(if args.emit == Emit::Llvm { &m.llvm_ir } else { &m.ptx });
                }
            }
        }
        if let Err(e) = compiled {
            failed.push(e);
        }
    }
    if args.emit == Emit::Ir || failed.is_empty() {
        output::emit(&text, args.output.as_deref())?;
    }
    if failed.is_empty() {
        return Ok(());
    }
    for e in failed {
        eprintln!("error: {}: {e}", args.file.display());
    }
    Err(Reported)
}

fn report(args: &ReportArgs) -> Result<(), Reported> {
    if args.arch != Arch::Sm100a {
        eprintln!("error: the report models the blackwell family, which targets sm_100a (asked for {})", args.arch);
        return Err(Reported);
    }
    let spec = load(&args.file)?;
    if args.pass == "bwd" {
        use attnc::lower::families::blackwell::backward_plan::kernel_plan;
        return match kernel_plan(&spec) {
            Ok(plan) => {
                let text = if args.json {
                    let both = serde_json::json!({ "kernel": plan });
                    serde_json::to_string_pretty(&both).map(|j| j + "\n").map_err(|e| {
                        eprintln!("error: {e}");
                        Reported
                    })?
                } else {
                    plan.to_string()
                };
                output::emit(&text, None)
            }
            Err(reason) => {
                eprintln!("error: {}: no blackwell backward plan ({reason})", args.file.display());
                Err(Reported)
            }
        };
    }
    match attnc::lower::families::blackwell::report::report(&spec) {
        Ok(r) => {
            let text = if args.json {
                match serde_json::to_string_pretty(&r) {
                    Ok(j) => j + "\n",
                    Err(e) => {
                        eprintln!("error: {e}");
                        return Err(Reported);
                    }
                }
            } else {
                r.to_string()
            };
            output::emit(&text, None)
        }
        Err(reason) => {
            eprintln!(
                "error: {}: the blackwell family does not run this variant ({reason}); the dispatcher falls back to portable",
                args.file.display()
            );
            Err(Reported)
        }
    }
}
