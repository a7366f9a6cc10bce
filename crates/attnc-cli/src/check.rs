//! `attnc check`: compile, assemble with `ptxas -v`, print the resource table, and fail on
//! anything that would not run well: spills, ptxas errors, shared memory over the arch's
//! limit, or a register file too small for one CTA.

use crate::{load, output, Pass, Reported};
use attnc::ptxas;
use attnc::{Arch, CompileOptions, Direction, FamilyChoice};
use std::path::PathBuf;

/// 32-bit registers per SM on sm_80, sm_90 and sm_100.
const REGISTER_FILE: u64 = 64 * 1024;
/// Registers are allocated per warp in units of 256 (8 per thread).
const REG_GRANULE_PER_THREAD: u64 = 8;

struct Row {
    file: String,
    arch: Arch,
    pass: Direction,
    family: String,
    kernel: String,
    threads: Option<u32>,
    registers: u32,
    spill_bytes: u64,
    static_smem: u64,
    dynamic_smem: Option<u32>,
    stack: u64,
    status: String,
}

pub fn run(files: &[PathBuf], archs: &[Arch], family: FamilyChoice, pass: Pass, verbose: bool) -> Result<(), Reported> {
    // Fail fast, with the install hint, when ptxas is missing.
    let ptxas_path = match ptxas::find_ptxas() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(Reported);
        }
    };
    if verbose {
        let v = ptxas::version(ptxas::Tool::Ptxas).unwrap_or_default();
        eprintln!("ptxas: {} ({v})", ptxas_path.display());
    }

    let mut rows: Vec<Row> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    for file in files {
        let Ok(spec) = load(file) else {
            problems.push(format!("{}: does not parse", file.display()));
            continue;
        };
        let fname =
            file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| file.display().to_string());
        let units: Vec<(Arch, Direction)> =
            archs.iter().flat_map(|&a| pass.directions(&spec).into_iter().map(move |d| (a, d))).collect();
        for (arch, direction) in units {
            let opts = CompileOptions::new(arch).family(family).direction(direction);
            // `fname [arch]` and, beside a forward, the pass: `fname [arch bwd]`.
            let at = if pass == Pass::Fwd { format!("[{arch}]") } else { format!("[{arch} {}]", direction.name()) };
            // The module that runs: a configuration that spills steps down to a smaller
            // one of its family where there is one (the runtime does the same).
            let (module, report) = match attnc::compile_without_spills(&spec, &opts, &ptxas_path) {
                Ok(c) => {
                    for why in c.module.fallback_reason.iter().chain(&c.module.config_note) {
                        if !c.stepped_down.is_empty() {
                            eprintln!("note: {fname} {at}: {why}");
                        }
                    }
                    (c.module, c.report)
                }
                Err(attnc::LowerError::Ptxas(e)) => {
                    eprintln!("error: {} {at}: {e}", file.display());
                    problems.push(format!("{fname} {at}: ptxas failed"));
                    continue;
                }
                Err(e) => {
                    eprintln!("error: {} {at}: {e}", file.display());
                    problems.push(format!("{fname} {at}: compile error"));
                    continue;
                }
            };
            if verbose {
                for w in &report.warnings {
                    eprintln!("{fname} {at}: {w}");
                }
                eprintln!("---- ptxas -v, {fname} {at} ----\n{}", report.log.trim_end());
            }
            for f in &report.functions {
                if f.spill_bytes() > 0 {
                    problems.push(format!("{fname} {at}: device function {} spills {} bytes", f.name, f.spill_bytes()));
                }
            }
            for k in &report.kernels {
                let info = module.kernels.iter().find(|i| i.name == k.name);
                let threads = info.map(|i| i.threads_per_block);
                let dynamic_smem = info.map(|i| i.dynamic_smem_bytes);
                let mut status: Vec<String> = Vec::new();
                if k.spill_bytes() > 0 {
                    status.push("SPILLS".into());
                    problems.push(format!(
                        "{fname} {at}: kernel {} spills ({} bytes stored, {} loaded)",
                        k.name, k.spill_store_bytes, k.spill_load_bytes
                    ));
                }
                // ptxas reports a serialized wgmma pipeline as an info line, not per
                // kernel; it costs the hopper family a third of its speed.
                if let Some(line) = report.wgmma_serialized(&k.name) {
                    status.push("WGMMA-SERIAL".into());
                    problems.push(format!("{fname} {at}: kernel {}: {}", k.name, line.trim()));
                }
                let smem = k.smem_bytes + dynamic_smem.unwrap_or(0) as u64;
                if smem > arch.max_smem_per_block() as u64 {
                    status.push("SMEM".into());
                    problems.push(format!(
                        "{fname} {at}: kernel {} needs {smem} bytes of shared memory, the limit is {}",
                        k.name,
                        arch.max_smem_per_block()
                    ));
                }
                if let Some(t) = threads {
                    let regs = (k.registers as u64).div_ceil(REG_GRANULE_PER_THREAD) * REG_GRANULE_PER_THREAD;
                    if regs * t as u64 > REGISTER_FILE {
                        status.push("REGS".into());
                        problems.push(format!(
                            "{fname} {at}: kernel {} needs {} registers x {t} threads > {REGISTER_FILE}: one CTA does not fit an SM",
                            k.name, k.registers
                        ));
                    }
                }
                if info.is_none() {
                    problems.push(format!(
                        "{fname} {at}: ptxas reports kernel {} that the compiled module does not describe",
                        k.name
                    ));
                    status.push("UNKNOWN".into());
                }
                rows.push(Row {
                    file: fname.clone(),
                    arch,
                    pass: direction,
                    family: module.family.to_string(),
                    kernel: k.name.clone(),
                    threads,
                    registers: k.registers,
                    spill_bytes: k.spill_bytes(),
                    static_smem: k.smem_bytes,
                    dynamic_smem,
                    stack: k.stack_frame_bytes,
                    status: if status.is_empty() { "ok".into() } else { status.join(",") },
                });
            }
            for info in &module.kernels {
                if report.kernel(&info.name).is_none() {
                    problems.push(format!("{fname} {at}: kernel {} is missing from the PTX", info.name));
                }
            }
        }
    }

    if !rows.is_empty() {
        output::stdout(&table(&rows))?;
    }
    if problems.is_empty() {
        return Ok(());
    }
    eprintln!("check failed:");
    for p in &problems {
        eprintln!("  - {p}");
    }
    Err(Reported)
}

fn table(rows: &[Row]) -> String {
    let header = [
        "file",
        "arch",
        "pass",
        "family",
        "kernel",
        "threads",
        "regs",
        "spill B",
        "smem B",
        "dyn smem B",
        "stack B",
        "status",
    ];
    let cells: Vec<[String; 12]> = rows
        .iter()
        .map(|r| {
            [
                r.file.clone(),
                r.arch.to_string(),
                r.pass.name().to_string(),
                r.family.clone(),
                r.kernel.clone(),
                r.threads.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                r.registers.to_string(),
                r.spill_bytes.to_string(),
                r.static_smem.to_string(),
                r.dynamic_smem.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                r.stack.to_string(),
                r.status.clone(),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(c.len());
        }
    }
    // Text columns left-aligned, numbers right-aligned.
    let numeric = [false, false, false, false, false, true, true, true, true, true, true, false];
    let fmt_row = |row: &[String]| -> String {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if numeric[i] {
                line.push_str(&format!("{c:>w$}", w = widths[i]));
            } else {
                line.push_str(&format!("{c:<w$}", w = widths[i]));
            }
        }
        line.trim_end().to_string() + "\n"
    };
    let mut out = fmt_row(&header.map(String::from));
    for row in &cells {
        out.push_str(&fmt_row(row));
    }
    out
}
