//! Runs the runtime's GPU paths outside the CLI (dev tool, and what the H100 runs use):
//!
//! ```text
//! gpu_run smoke   DSL_DIR                       # one launch per example, receipts
//! gpu_run selftest DSL_DIR OUT.json [--quick] [--filter NAME]
//! gpu_run bench   OUT.json [--quick]            # re-executes itself for the disk probe
//! gpu_run probe                                  # the disk-hit probe child
//! ```

use attnc_runtime::{bench, selftest, Runtime};
use std::path::Path;

fn specs(dir: &Path) -> Result<Vec<attnc_ir::Spec>, Box<dyn std::error::Error>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "attn")).collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        out.push(attnc_dsl::parse_file(&f).map_err(|d| d.to_string())?);
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let cmd = args.get(1).map(String::as_str).unwrap_or("");
    let flag = |f: &str| args.iter().any(|a| a == f);
    let value = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    match cmd {
        "probe" => {
            let p = bench::disk_hit_probe()?;
            println!("{}", bench::probe_line(&p));
        }
        "smoke" => {
            let rt = Runtime::new(0)?;
            eprintln!("device: {:?}", rt.device());
            let opts = selftest::SelftestOptions { quick: true, ..Default::default() };
            for s in specs(Path::new(&args[2]))? {
                let plan = selftest::plan_cases(&s, &opts).into_iter().next().ok_or("no case")?;
                let r = selftest::run(&rt, &[plan.spec.clone()], &selftest::SelftestOptions { quick: true, progress: false, ..Default::default() });
                let c = &r.cases[0];
                println!("{} {} {}", if c.ok { "PASS" } else { "FAIL" }, c.case, c.receipt.as_ref().map_or(c.error.clone().unwrap_or_default(), |r| r.to_string()));
            }
        }
        "selftest" => {
            let rt = Runtime::new(0)?;
            let opts = selftest::SelftestOptions { quick: flag("--quick"), filter: value("--filter"), ..Default::default() };
            let report = selftest::run(&rt, &specs(Path::new(&args[2]))?, &opts);
            std::fs::write(&args[3], report.to_json())?;
            print!("{}", report.table());
            if !report.ok() {
                std::process::exit(1);
            }
        }
        "bench" => {
            let rt = Runtime::new(0)?;
            let mut opts = bench::BenchOptions { disk_probe_command: Some(vec![args[0].clone(), "probe".into()]), ..Default::default() };
            if flag("--quick") {
                opts.prefill_seqlens = vec![1024, 8192];
                opts.decode_batches = vec![1, 64];
                opts.decode_seqlens_k = vec![32768];
            }
            if flag("--no-ceilings") {
                opts.ceilings = false;
            }
            let report = bench::run(&rt, &opts)?;
            std::fs::write(&args[2], report.to_json())?;
            print!("{}", report.table());
        }
        _ => {
            eprintln!("usage: gpu_run smoke DIR | selftest DIR OUT.json [--quick] [--filter X] | bench OUT.json [--quick] | probe");
            std::process::exit(2);
        }
    }
    Ok(())
}
