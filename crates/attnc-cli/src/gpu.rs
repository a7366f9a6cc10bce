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
    /// and on each variant's first and largest shape the deterministic mode's
    /// repeatability; `=o` in the table: its ordered mode ran).
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
pub struct WarmArgs {
    /// .attn files or folders of them (default: dsl-examples).
    paths: Vec<PathBuf>,
    /// Kernel family: auto (what the dispatcher picks), portable, hopper or blackwell.
    #[arg(long, default_value = "auto")]
    family: String,
    /// Variants compiled at once (each module's ptxas is its own process).
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// A variant to time instead of the protocol's suites: its forward (and backward, when
    /// it trains) at --batch, --seqlen, with its params and aux tensors (contiguous layouts).
    file: Option<PathBuf>,
    /// Variant bench: batch size.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Variant bench: query (and, without --seqlen-k, key) length.
    #[arg(long, default_value_t = 8192)]
    seqlen: usize,
    /// Variant bench: key length.
    #[arg(long)]
    seqlen_k: Option<usize>,
    /// Variant bench: a param value, NAME=VALUE (repeatable; every declared param needs one).
    #[arg(long = "param", value_name = "NAME=VALUE")]
    params: Vec<String>,
    /// Variant bench: an aux tensor from a file of raw little-endian i32/f32, NAME=FILE
    /// (repeatable); others are filled deterministically (int: document ids).
    #[arg(long = "aux", value_name = "NAME=FILE")]
    aux: Vec<String>,
    /// Variant bench: document lengths of the int aux fill, MIN:MAX tokens.
    #[arg(long, default_value = "256:2816")]
    doc_len: String,
    /// Variant bench: kernel family (auto, portable, hopper, blackwell).
    #[arg(long, default_value = "auto")]
    family: String,
    /// Variant bench: timed runs.
    #[arg(long, default_value_t = 25)]
    iters: usize,
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
    /// Decode: also time each shape at these forced split counts (comma-separated), to
    /// tune the split heuristic against.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    decode_splits: Vec<u32>,
    /// Draw the report as an SVG (grouped bars per suite, head dim and mask; decode TB/s).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// The peers' JSON (the anchors' bench.py output) to plot beside attnc.
    #[arg(long, value_name = "PATH", requires = "plot")]
    peers: Option<PathBuf>,
    /// Plot a saved `attnc bench --json` report instead of running (no GPU needed).
    #[arg(long, value_name = "PATH", requires = "plot")]
    from_json: Option<PathBuf>,
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

pub fn warm(args: &WarmArgs) -> Result<(), Reported> {
    let files = attn_files(&args.paths)?;
    let specs = files.iter().map(|f| crate::load(f)).collect::<Result<Vec<_>, _>>()?;
    let family = args.family.parse::<attnc::FamilyChoice>().map_err(|e| {
        eprintln!("error: --family: {e}");
        Reported
    })?;
    let rt = runtime(args.device)?;
    if let Some(dir) = rt.cache_dir() {
        println!("cache: {}", dir.display());
    } else {
        eprintln!("warning: no disk cache configured: modules warm this process only");
    }
    let t0 = std::time::Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let lines = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..args.jobs.clamp(1, 64) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (Some(file), Some(spec)) = (files.get(i), specs.get(i)) else { break };
                let t = std::time::Instant::now();
                let result = rt.kernel_with(spec, family).and_then(|k| k.warm());
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if let Ok(mut l) = lines.lock() {
                    l.push((i, file.display().to_string(), ms, result));
                }
            });
        }
    });
    let mut lines = lines.into_inner().unwrap_or_default();
    lines.sort_by_key(|l| l.0);
    let (mut modules, mut failed) = (0, 0);
    for (_, file, ms, result) in &lines {
        match result {
            Ok(warmed) => {
                let what: Vec<String> =
                    warmed.iter().map(|w| format!("{} [{}, {}]", w.what, w.family, w.source)).collect();
                println!("{file}: {ms:.0} ms: {}", what.join("; "));
                modules += warmed.len();
            }
            Err(e) => {
                eprintln!("error: {file}: {e}");
                failed += 1;
            }
        }
    }
    println!(
        "{modules} modules of {} variants ready in {:.1} s{}",
        lines.len() - failed,
        t0.elapsed().as_secs_f64(),
        if failed > 0 { format!("; {failed} variants failed") } else { String::new() }
    );
    if failed > 0 {
        Err(Reported)
    } else {
        Ok(())
    }
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
    let mut bar = crate::output::ProgressBar::on_stderr();
    let report = selftest::run_observed(&rt, &specs, &opts, &mut |p| bar.case(&p));
    bar.finish();
    print!("{}", report.table());
    write_json(args.json.as_deref(), &report.to_json())?;
    if report.ok() {
        Ok(())
    } else {
        Err(Reported)
    }
}

fn split_pair<'a>(what: &str, s: &'a str, sep: char) -> Result<(&'a str, &'a str), Reported> {
    s.split_once(sep).ok_or_else(|| {
        eprintln!("error: {what} `{s}`: expected two parts separated by `{sep}`");
        Reported
    })
}

fn variant_bench(file: &Path, args: &BenchArgs) -> Result<(), Reported> {
    use attnc::runtime::validate::ParamValue;
    use attnc::runtime::variant_bench::{bench_variant, VariantBenchOptions};
    let spec = crate::load(file)?;
    let mut opts = VariantBenchOptions {
        batch: args.batch,
        seqlen_q: args.seqlen,
        seqlen_k: args.seqlen_k.unwrap_or(args.seqlen),
        iters: args.iters,
        ..Default::default()
    };
    opts.family = args.family.parse().map_err(|e| {
        eprintln!("error: --family: {e}");
        Reported
    })?;
    for p in &args.params {
        let (name, value) = split_pair("--param", p, '=')?;
        let Some(decl) = spec.param(name) else {
            eprintln!("error: --param {name}: `{}` declares no param `{name}`", spec.name);
            return Err(Reported);
        };
        let v = if decl.ty == attnc::ir::Ty::Float {
            value.parse::<f32>().ok().map(ParamValue::Float)
        } else {
            value.parse::<i32>().ok().map(ParamValue::Int)
        };
        let Some(v) = v else {
            eprintln!("error: --param {name}={value}: not a valid {} value", decl.ty);
            return Err(Reported);
        };
        opts.params.push((name.to_string(), v));
    }
    for a in &args.aux {
        let (name, path) = split_pair("--aux", a, '=')?;
        if spec.aux_decl(name).is_none() {
            eprintln!("error: --aux {name}: `{}` declares no aux tensor `{name}`", spec.name);
            return Err(Reported);
        }
        opts.aux_files.push((name.to_string(), PathBuf::from(path)));
    }
    let (lo, hi) = split_pair("--doc-len", &args.doc_len, ':')?;
    match (lo.parse::<usize>(), hi.parse::<usize>()) {
        (Ok(lo), Ok(hi)) if 0 < lo && lo <= hi => opts.doc_len = (lo, hi),
        _ => {
            eprintln!("error: --doc-len {}: expected MIN:MAX with 0 < MIN <= MAX", args.doc_len);
            return Err(Reported);
        }
    }
    let rt = runtime(args.device)?;
    let r = bench_variant(&rt, &spec, &opts).map_err(|e| {
        eprintln!("error: bench {}: {e}", file.display());
        Reported
    })?;
    println!("{}", r.line());
    println!("{}", r.receipt);
    let json = serde_json::to_string_pretty(&r).map_err(|e| {
        eprintln!("error: JSON: {e}");
        Reported
    })?;
    write_json(args.json.as_deref(), &json)
}

fn read_json(what: &str, path: &Path) -> Result<serde_json::Value, Reported> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        eprintln!("error: {what} {}: {e}", path.display());
        Reported
    })?;
    serde_json::from_str(&text).map_err(|e| {
        eprintln!("error: {what} {}: not JSON: {e}", path.display());
        Reported
    })
}

/// `--plot`: the report (`report_json`, or `--from-json`'s) and the peers' as an SVG.
fn plot(args: &BenchArgs, report_json: Option<&str>) -> Result<(), Reported> {
    let Some(out) = &args.plot else { return Ok(()) };
    let report = match (&args.from_json, report_json) {
        (Some(p), _) => read_json("--from-json", p)?,
        (None, Some(text)) => serde_json::from_str(text).map_err(|e| {
            eprintln!("error: --plot: the report is not JSON: {e}");
            Reported
        })?,
        (None, None) => return Ok(()),
    };
    let peers = args.peers.as_deref().map(|p| read_json("--peers", p)).transpose()?;
    let svg = attnc::runtime::bench_plot::bench_svg(&report, peers.as_ref());
    std::fs::write(out, svg).map_err(|e| {
        eprintln!("error: --plot {}: {e}", out.display());
        Reported
    })?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

pub fn bench(args: &BenchArgs) -> Result<(), Reported> {
    if args.from_json.is_some() {
        return plot(args, None);
    }
    if let Some(file) = &args.file {
        return variant_bench(file, args);
    }
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
        decode_split_sweep: args.decode_splits.clone(),
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
    let json = report.to_json();
    write_json(args.json.as_deref(), &json)?;
    plot(args, Some(&json))?;
    if report.ok() {
        Ok(())
    } else {
        Err(Reported)
    }
}
