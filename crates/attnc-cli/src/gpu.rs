//! `attnc selftest` and `attnc bench`: the GPU subcommands, thin wrappers over
//! `attnc::runtime::{selftest, bench}` (which hold the matrix and the protocol).

use crate::Reported;
use attnc::runtime::{bench, selftest, Runtime};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct SelftestArgs {
    /// .attn files or folders of them (default: dsl-examples).
    paths: Vec<PathBuf>,
    /// A smaller matrix (one shape per layout, fewer splits).
    #[arg(long)]
    quick: bool,
    /// Only variants whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Kernel family: auto (what the dispatcher picks), portable, hopper or blackwell.
    #[arg(long, default_value = "auto")]
    family: String,
    /// Skip the gradient check (by default every case of a variant with a backward also
    /// checks dQ, dK, dV, dsinks and learnable aux gradients against the f64 reference,
    /// and each variant's first shape the deterministic mode's repeatability).
    #[arg(long)]
    no_grads: bool,
    /// Also write the report as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Also write the report as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Fewer shapes (prefill 1k and 8k, decode batch 1 and 64 at 32k).
    #[arg(long)]
    quick: bool,
    /// Parts to run, comma-separated: ceilings, prefill, backward, decode, compile.
    #[arg(long, value_delimiter = ',', default_value = "ceilings,prefill,backward,decode,compile")]
    suites: Vec<String>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Internal: the fresh-process half of the disk-cache measurement.
    #[arg(long, hide = true)]
    disk_probe: bool,
}

fn runtime(device: usize) -> Result<Runtime, Reported> {
    Runtime::new(device).map_err(|e| {
        eprintln!("error: cannot start the CUDA runtime on device {device}: {e}");
        Reported
    })
}

fn write_json(path: Option<&Path>, json: &str) -> Result<(), Reported> {
    if let Some(p) = path {
        std::fs::write(p, json).map_err(|e| {
            eprintln!("error: cannot write {}: {e}", p.display());
            Reported
        })?;
    }
    Ok(())
}

/// The .attn files named by `paths` (folders expand to their `*.attn`, sorted).
fn attn_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Reported> {
    let defaults = [PathBuf::from("dsl-examples")];
    let paths = if paths.is_empty() { &defaults[..] } else { paths };
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|e| {
                eprintln!("error: cannot read {}: {e}", p.display());
                Reported
            })?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "attn"))
                .collect();
            files.sort();
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    if out.is_empty() {
        eprintln!("error: no .attn files found");
        return Err(Reported);
    }
    Ok(out)
}

pub fn selftest(args: &SelftestArgs) -> Result<(), Reported> {
    let specs = attn_files(&args.paths)?.iter().map(|f| crate::load(f)).collect::<Result<Vec<_>, _>>()?;
    let rt = runtime(args.device)?;
    let opts = selftest::SelftestOptions {
        quick: args.quick,
        filter: args.filter.clone(),
        family: args.family.clone(),
        grads: !args.no_grads,
        ..Default::default()
    };
    let report = selftest::run(&rt, &specs, &opts);
    print!("{}", report.table());
    write_json(args.json.as_deref(), &report.to_json())?;
    if report.ok() {
        Ok(())
    } else {
        Err(Reported)
    }
}

pub fn bench(args: &BenchArgs) -> Result<(), Reported> {
    if args.disk_probe {
        let probe = bench::disk_hit_probe().map_err(|e| {
            eprintln!("error: disk probe: {e}");
            Reported
        })?;
        println!("{}", bench::probe_line(&probe));
        return Ok(());
    }
    let known = ["ceilings", "prefill", "backward", "decode", "compile"];
    if let Some(bad) = args.suites.iter().find(|s| !known.contains(&s.as_str())) {
        eprintln!("error: unknown suite `{bad}`: expected {}", known.join(", "));
        return Err(Reported);
    }
    let has = |s: &str| args.suites.iter().any(|x| x == s);
    let rt = runtime(args.device)?;
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "attnc".into());
    let mut opts = bench::BenchOptions {
        disk_probe_command: Some(vec![exe, "bench".into(), "--disk-probe".into()]),
        ceilings: has("ceilings"),
        prefill: has("prefill"),
        backward: has("backward"),
        decode: has("decode"),
        compile: has("compile"),
        ..Default::default()
    };
    if args.quick {
        opts.prefill_seqlens = vec![1024, 8192];
        opts.backward_seqlens = vec![1024, 8192];
        opts.decode_batches = vec![1, 64];
        opts.decode_seqlens_k = vec![32768];
    }
    let report = bench::run(&rt, &opts).map_err(|e| {
        eprintln!("error: bench: {e}");
        Reported
    })?;
    print!("{}", report.table());
    write_json(args.json.as_deref(), &report.to_json())?;
    if report.ok() {
        Ok(())
    } else {
        Err(Reported)
    }
}
