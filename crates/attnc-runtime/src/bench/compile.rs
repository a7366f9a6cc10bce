//! The compile-time part of the protocol: DSL text → PTX in-process, ptxas, PTX → loaded
//! module, `Runtime::kernel` on a cold cache, a memory hit, a disk hit in a fresh runtime and
//! (through a command that re-executes the caller) in a fresh process, and ready first.

use super::{BenchOptions, TimeStats};
use crate::cache::CacheConfig;
use crate::cuda::Image;
use crate::error::RuntimeError;
use crate::runtime::Runtime;
use serde::Serialize;
use std::time::Instant;

/// The compile-time part's results.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompileTimes {
    pub spec: String,
    /// DSL text → PTX in-process (parse + lower), median.
    pub dsl_to_ptx_ms: f64,
    /// Of one lowering: building the LLVM IR, LLVM's optimization, NVPTX codegen (ms).
    pub lower_stages_ms: [f64; 3],
    /// The external ptxas on the module's PTX, median of 3 (when one is configured).
    pub ptxas_ms: Option<f64>,
    /// PTX → cubin (driver linker) → loaded module.
    pub ptx_to_module_cubin_ms: f64,
    /// PTX → loaded module (driver JIT inside cuModuleLoadDataEx).
    pub ptx_to_module_direct_ms: f64,
    /// `Runtime::kernel` on a cold cache (lower + link + load + disk write).
    pub runtime_cold_ms: f64,
    /// `Runtime::kernel` on a memory hit, median, microseconds.
    pub memory_hit_us: f64,
    /// `Runtime::kernel` in a fresh runtime of this process (a disk hit).
    pub disk_hit_fresh_runtime_ms: f64,
    /// The same in a fresh process (when a probe command was given).
    pub disk_hit_fresh_process_ms: Option<f64>,
    /// `Runtime::kernel_ready_first` on a cold cache: until its first (interim, portable)
    /// kernel is loaded, and until the dispatcher's is (`None` when it served the
    /// dispatcher's kernel at once).
    pub ready_first_interim_ms: Option<f64>,
    pub ready_first_final_ms: Option<f64>,
    pub notes: Vec<String>,
}

pub(super) const DEFAULT_COMPILE_SOURCE: &str =
    "attention bench_compile_causal {\n  dtype bf16\n  head_dim 128\n  heads 32 kv 8\n  mask causal\n}\n";

/// What a fresh process reports back: the time of `Runtime::kernel` and where the kernel
/// came from.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct ProbeResult {
    pub ms: f64,
    pub source: String,
}

/// The line a probe prints (parsed by `bench::run`).
pub fn probe_line(p: &ProbeResult) -> String {
    format!("ATTNC_PROBE {}", serde_json::to_string(p).unwrap_or_default())
}

/// Env var naming the .attn file a probe process compiles.
pub const PROBE_SPEC_ENV: &str = "ATTNC_BENCH_PROBE_SPEC";

/// The child half of the fresh-process disk-hit measurement: opens a runtime (cache dir
/// from `ATTNC_CACHE_DIR`), times `Runtime::kernel` on the spec file named by
/// `ATTNC_BENCH_PROBE_SPEC`. The caller prints [`probe_line`] of the result.
pub fn disk_hit_probe() -> Result<ProbeResult, RuntimeError> {
    let path =
        std::env::var_os(PROBE_SPEC_ENV).ok_or_else(|| RuntimeError::Other(format!("{PROBE_SPEC_ENV} is not set")))?;
    let spec = attnc_dsl::parse_file(std::path::Path::new(&path)).map_err(|d| RuntimeError::Other(d.to_string()))?;
    let rt = Runtime::new(0)?;
    let t = Instant::now();
    let k = rt.kernel(&spec)?;
    Ok(ProbeResult { ms: t.elapsed().as_secs_f64() * 1e3, source: k.source().to_string() })
}

fn median_of(mut f: impl FnMut() -> Result<f64, RuntimeError>, n: usize) -> Result<f64, RuntimeError> {
    let v: Result<Vec<f64>, RuntimeError> = (0..n).map(|_| f()).collect();
    Ok(TimeStats::of(v?).median_ms)
}

pub(super) fn run_compile(rt: &Runtime, opts: &BenchOptions) -> Result<CompileTimes, RuntimeError> {
    let (name, text) = opts
        .compile_source
        .clone()
        .unwrap_or_else(|| ("bench_compile_causal.attn".into(), DEFAULT_COMPILE_SOURCE.into()));
    let spec = attnc_dsl::parse_named(&name, &text).map_err(|d| RuntimeError::Other(d.to_string()))?;
    let mut ct = CompileTimes { spec: spec.name.clone(), ..Default::default() };
    let copts = attnc_lower::CompileOptions::new(rt.arch());
    ct.dsl_to_ptx_ms = median_of(
        || {
            let t = Instant::now();
            let s = attnc_dsl::parse_named(&name, &text).map_err(|d| RuntimeError::Other(d.to_string()))?;
            attnc_lower::compile(&s, &copts)?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        },
        7,
    )?;
    let module = attnc_lower::compile(&spec, &copts)?;
    ct.lower_stages_ms = [module.timings.build_ms, module.timings.optimize_ms, module.timings.codegen_ms];
    if let Some((ptxas, _)) = crate::jit::external_ptxas() {
        ct.ptxas_ms = Some(median_of(
            || {
                let t = Instant::now();
                attnc_lower::ptxas::assemble_with(&ptxas, &module.ptx, rt.arch())
                    .map_err(|e| RuntimeError::Other(e.to_string()))?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            },
            3,
        )?);
    }
    let gpu = rt.gpu();
    ct.ptx_to_module_cubin_ms = median_of(
        || {
            let t = Instant::now();
            let cubin = gpu.link_ptx(&module.ptx, &spec.name)?;
            let _m = gpu.load_module(&cubin, Image::Cubin, &spec.name)?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        },
        5,
    )?;
    ct.ptx_to_module_direct_ms = median_of(
        || {
            let t = Instant::now();
            let _m = gpu.load_module(module.ptx.as_bytes(), Image::Ptx, &spec.name)?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        },
        5,
    )?;
    // Through the runtime, on a fresh cache directory.
    let dir = std::env::temp_dir().join(format!("attnc-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = CacheConfig::with_dir(&dir);
    let rt1 = Runtime::with_cache(rt.device().ordinal, &cfg)?;
    let t = Instant::now();
    let k = rt1.kernel(&spec)?;
    ct.runtime_cold_ms = t.elapsed().as_secs_f64() * 1e3;
    if k.source() != crate::CacheSource::Built {
        ct.notes.push(format!("cold call came from {}", k.source()));
    }
    let mut hits = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let _k = rt1.kernel(&spec)?;
        hits.push(t.elapsed().as_secs_f64() * 1e6);
    }
    ct.memory_hit_us = TimeStats::of(hits).median_ms;
    let rt2 = Runtime::with_cache(rt.device().ordinal, &cfg)?;
    let t = Instant::now();
    let k2 = rt2.kernel(&spec)?;
    ct.disk_hit_fresh_runtime_ms = t.elapsed().as_secs_f64() * 1e3;
    if k2.source() != crate::CacheSource::Disk {
        ct.notes.push(format!("fresh runtime: kernel came from {}, not the disk cache", k2.source()));
    }
    if let Some(cmd) = &opts.disk_probe_command {
        match probe_fresh_process(cmd, &dir, &name, &text) {
            Ok(p) => {
                ct.disk_hit_fresh_process_ms = Some(p.ms);
                if p.source != crate::CacheSource::Disk.to_string() {
                    ct.notes.push(format!("fresh process: kernel came from {}", p.source));
                }
            }
            Err(e) => ct.notes.push(format!("fresh-process probe failed: {e}")),
        }
    } else {
        ct.notes.push("no probe command: disk hit in a fresh process not measured".into());
    }
    // Ready first, on a fresh cache directory again.
    let _ = std::fs::remove_dir_all(&dir);
    let rt3 = Runtime::with_cache(rt.device().ordinal, &cfg)?;
    let t = Instant::now();
    let (interim, pending) = rt3.kernel_ready_first(&spec)?;
    let interim_ms = t.elapsed().as_secs_f64() * 1e3;
    match pending {
        Some(p) => {
            let fast = p.wait()?;
            ct.ready_first_interim_ms = Some(interim_ms);
            ct.ready_first_final_ms = Some(t.elapsed().as_secs_f64() * 1e3);
            // The thread goes on to warm the decode twin (and a backward): not under the
            // suites timed next.
            p.join();
            ct.notes.push(format!(
                "ready first: {} at once ({}), then {}",
                interim.family(),
                interim.fallback_reason().unwrap_or_default(),
                fast.family()
            ));
        }
        None => ct.notes.push(format!("ready first served {} at once (no interim)", interim.family())),
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ct)
}

fn probe_fresh_process(cmd: &[String], cache: &std::path::Path, name: &str, text: &str) -> Result<ProbeResult, String> {
    let (exe, args) = cmd.split_first().ok_or("empty probe command")?;
    let file = cache.join(if name.ends_with(".attn") { name.to_string() } else { format!("{name}.attn") });
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(exe)
        .args(args)
        .env("ATTNC_CACHE_DIR", cache)
        .env(PROBE_SPEC_ENV, &file)
        .output()
        .map_err(|e| format!("cannot run {exe}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("ATTNC_PROBE ")).ok_or_else(|| {
        format!("no ATTNC_PROBE line (exit {:?}): {}", out.status.code(), String::from_utf8_lossy(&out.stderr))
    })?;
    serde_json::from_str(line).map_err(|e| e.to_string())
}
