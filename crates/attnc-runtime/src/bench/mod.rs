//! `attnc bench`: the benchmark protocol (docs/benchmarking.md).
//!
//! - **Prefill**: bf16, 32768 tokens (batch = 32768 / seqlen), hidden 2048 (heads =
//!   2048 / head_dim), head_dim 64 and 128, causal and not, seqlen 1k–16k. TFLOP/s with
//!   FLOPs = 4·B·H·S²·D (halved when causal).
//! - **Backward**: the prefill shapes; dQ, dK, dV from a given O, LSE and dO (the
//!   preprocess, main and dQ-convert kernels, not the forward), FLOPs = 2.5 × the forward's;
//!   the deterministic mode as its own rows. Checked against the f64 reference backward on
//!   one head (seqlen ≤ 1024) and for finite gradients everywhere.
//! - **Decode**: seqlen_q 1, 32 q heads, 8 KV heads, head_dim 128 (GQA packed, split-KV
//!   auto), batch 1/8/64, seqlen_k 4096/32768, contiguous and paged KV (page 1/16/128).
//!   TB/s = bytes of K and V read / time.
//! - **Compile time**: cold DSL text → PTX in-process, PTX → loaded module (driver link to
//!   a cubin + load, and a plain PTX load), memory-cache hit, disk-cache hit in a fresh
//!   runtime of this process and — when the caller gives a command that re-executes it —
//!   in a fresh process.
//! - **Ceilings**: a 2 GiB device-to-device copy (cuMemcpyDtoD, and a 16-byte-vector copy
//!   kernel JIT'ed from PTX text here; the faster counts), and an 8192³ bf16 GEMM through
//!   cuBLAS (libcublas is dlopen'ed; set LD_LIBRARY_PATH to its directory if it is not on
//!   the default path — without it the GEMM ceiling is reported as missing, with why).
//!
//! Every timing: CUDA events around each launch after warm-up, median of ≥ 20. Inputs are
//! random normal (generated on the GPU by a JIT'ed kernel). Every configuration's output
//! is checked against the f64 reference executor before it is timed: prefill on sampled
//! rows (each sampled row as a one-query sequence with a bottom-right causal mask, which is
//! exactly that row's keys), decode on whole sequences.

use crate::error::RuntimeError;
use crate::params::Params;
use crate::runtime::Runtime;
use crate::tensor::{ElemType, Tensor};
use attnc_ir::reference::{reference_forward, rel_l2, Inputs, Rng, Sequence};
use attnc_ir::{Align, KvLayout, Spec, SplitKv};
use serde::Serialize;
use std::time::Instant;

mod compile;
pub mod timing;
use compile::run_compile;
pub use compile::{disk_hit_probe, probe_line, CompileTimes, ProbeResult};
pub use timing::{time_gpu, time_gpu_queued, time_host_us, Helpers, HELPER_PTX, QUEUE_SPIN_NS};

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchOptions {
    pub warmup: usize,
    /// Timed runs per configuration (the protocol wants ≥ 20).
    pub iters: usize,
    pub prefill: bool,
    pub backward: bool,
    pub decode: bool,
    pub compile: bool,
    pub ceilings: bool,
    pub total_tokens: usize,
    pub hidden: usize,
    pub prefill_seqlens: Vec<usize>,
    /// (d_qk, d_v) pairs.
    pub prefill_head_dims: Vec<(u32, u32)>,
    /// Backward seqlens (the prefill shapes otherwise) and whether to time the
    /// deterministic mode too.
    pub backward_seqlens: Vec<usize>,
    pub backward_deterministic: bool,
    pub decode_batches: Vec<usize>,
    pub decode_seqlens_k: Vec<usize>,
    /// 0 = contiguous KV, else the page size.
    pub decode_page_sizes: Vec<u32>,
    /// Forced split counts to time each decode shape at as well (empty: none).
    pub decode_split_sweep: Vec<u32>,
    /// Check outputs against the reference before timing.
    pub check: bool,
    /// DSL text timed by the compile part (name, text); `None`: a built-in causal spec.
    pub compile_source: Option<(String, String)>,
    /// argv of a command that runs [`disk_hit_probe`] in a fresh process and prints its
    /// [`probe_line`] (the CLI passes itself, e.g. `attnc bench --disk-probe`).
    pub disk_probe_command: Option<Vec<String>>,
    pub progress: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            warmup: 5,
            iters: 25,
            prefill: true,
            backward: true,
            decode: true,
            compile: true,
            ceilings: true,
            total_tokens: 32768,
            hidden: 2048,
            prefill_seqlens: vec![1024, 2048, 4096, 8192, 16384],
            prefill_head_dims: vec![(64, 64), (128, 128)],
            backward_seqlens: vec![1024, 2048, 4096, 8192, 16384],
            backward_deterministic: true,
            decode_batches: vec![1, 8, 64],
            decode_seqlens_k: vec![4096, 32768],
            decode_page_sizes: vec![0, 1, 16, 128],
            decode_split_sweep: Vec::new(),
            check: true,
            compile_source: None,
            disk_probe_command: None,
            progress: true,
        }
    }
}

/// Median/min/max of timed runs, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TimeStats {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub runs: usize,
}

impl TimeStats {
    pub fn of(mut v: Vec<f64>) -> TimeStats {
        if v.is_empty() {
            return TimeStats::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) };
        TimeStats { median_ms: median, min_ms: v[0], max_ms: v[n - 1], runs: n }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Ceilings {
    /// GB moved (read + written) per second / 1e12.
    pub copy_tb_s: Option<f64>,
    pub memcpy_tb_s: Option<f64>,
    pub copy_kernel_tb_s: Option<f64>,
    pub copy_bytes: u64,
    pub gemm_tflops: Option<f64>,
    pub gemm_note: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PrefillResult {
    pub head_dim: (u32, u32),
    pub causal: bool,
    pub seqlen: usize,
    pub batch: usize,
    pub heads: usize,
    pub time: TimeStats,
    pub tflops: f64,
    pub fraction_of_gemm: Option<f64>,
    pub check_rel_l2: Option<f64>,
    pub ok: bool,
    pub error: Option<String>,
    pub receipt: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BackwardResult {
    pub head_dim: (u32, u32),
    pub causal: bool,
    pub deterministic: bool,
    pub seqlen: usize,
    pub batch: usize,
    pub heads: usize,
    pub time: TimeStats,
    /// 2.5 × the forward's FLOPs / time.
    pub tflops: f64,
    pub fraction_of_gemm: Option<f64>,
    /// Worst rel-L2 of dQ, dK, dV of one head against the f64 reference (short seqlens).
    pub check_rel_l2: Option<f64>,
    /// The host's median time to enqueue one backward, µs (repeated calls: the launch
    /// memo's replay): the GPU idles that long after the protocol's start event.
    pub host_us: Option<f64>,
    pub ok: bool,
    pub error: Option<String>,
    pub receipt: Option<String>,
}

/// One launch of a kernel that does nothing (one thread, one parameter): the host's
/// enqueue time and the GPU's time between events around it, queued as decode's `gpu_us`
/// is. Decode at batch 1 sits a few microseconds above these.
#[derive(Clone, Debug, Serialize)]
pub struct LaunchFloor {
    pub host_us: f64,
    pub gpu_us: f64,
}

impl LaunchFloor {
    fn measure(rt: &Runtime, h: &Helpers, opts: &BenchOptions) -> Result<LaunchFloor, RuntimeError> {
        let gpu = rt.gpu();
        let host_us = time_host_us(gpu, opts.iters, || h.spin(gpu, 0))?;
        let gpu_us = time_gpu_queued(gpu, h, opts.warmup, opts.iters, || h.spin(gpu, 0))?.median_ms * 1e3;
        Ok(LaunchFloor { host_us, gpu_us })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct DecodeResult {
    pub batch: usize,
    pub seqlen_k: usize,
    /// 0 = contiguous.
    pub page_size: u32,
    pub num_splits: Option<u32>,
    /// The protocol's time: events around the call, the host's preparation included.
    pub time: TimeStats,
    /// The GPU's own time: the same call queued behind a spin kernel (`time_gpu_queued`).
    pub gpu_time: Option<TimeStats>,
    /// The host's median time to enqueue one call, µs.
    pub host_us: Option<f64>,
    /// The same through `Kernel::forward_shared` (the receipt shared with the launch
    /// memo, not copied; the Python package's path), µs.
    pub host_shared_us: Option<f64>,
    /// With `BenchOptions::decode_split_sweep`: the GPU's own time (ms) at forced split
    /// counts, to tune the split heuristic against.
    pub by_splits: Vec<(u32, f64)>,
    pub kv_bytes: u64,
    pub tb_s: f64,
    pub fraction_of_copy: Option<f64>,
    pub check_rel_l2: Option<f64>,
    pub ok: bool,
    pub error: Option<String>,
    pub receipt: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub device: crate::cuda::DeviceInfo,
    pub attnc_version: String,
    pub llvm_version: String,
    pub options: BenchOptions,
    pub ceilings: Ceilings,
    pub compile: Option<CompileTimes>,
    pub prefill: Vec<PrefillResult>,
    pub backward: Vec<BackwardResult>,
    pub decode: Vec<DecodeResult>,
    /// With the decode suite: what one launch costs with nothing to do (the floor under
    /// decode's microseconds).
    pub launch_floor: Option<LaunchFloor>,
    pub seconds: f64,
    pub notes: Vec<String>,
}

impl BenchReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
    /// Did every checked configuration pass its reference check?
    pub fn ok(&self) -> bool {
        self.prefill.iter().all(|p| p.ok) && self.backward.iter().all(|b| b.ok) && self.decode.iter().all(|d| d.ok)
    }
    pub fn table(&self) -> String {
        let mut s = String::new();
        let c = &self.ceilings;
        s.push_str(&format!(
            "device: {} ({}, {} SMs, driver {})\n",
            self.device.name, self.device.arch, self.device.sm_count, self.device.driver_version
        ));
        s.push_str(&format!(
            "ceilings: copy {} TB/s (memcpy {}, kernel {}), bf16 GEMM 8192^3 {} TFLOP/s{}\n",
            opt(c.copy_tb_s, 2),
            opt(c.memcpy_tb_s, 2),
            opt(c.copy_kernel_tb_s, 2),
            opt(c.gemm_tflops, 1),
            c.gemm_note.as_ref().map_or(String::new(), |n| format!(" ({n})"))
        ));
        if let Some(ct) = &self.compile {
            s.push_str(&format!(
                "compile ({}): DSL->PTX {:.2} ms (IR {:.1}, LLVM opt {:.1}, codegen {:.1}); ptxas {} ms; PTX->module {:.2} ms via cubin, {:.2} ms direct; runtime cold {:.2} ms; ready first {} ms (interim), {} ms (final); memory hit {:.2} us; disk hit {:.2} ms (fresh runtime), {} ms (fresh process)\n",
                ct.spec,
                ct.dsl_to_ptx_ms,
                ct.lower_stages_ms[0],
                ct.lower_stages_ms[1],
                ct.lower_stages_ms[2],
                opt(ct.ptxas_ms, 1),
                ct.ptx_to_module_cubin_ms,
                ct.ptx_to_module_direct_ms,
                ct.runtime_cold_ms,
                opt(ct.ready_first_interim_ms, 1),
                opt(ct.ready_first_final_ms, 1),
                ct.memory_hit_us,
                ct.disk_hit_fresh_runtime_ms,
                opt(ct.disk_hit_fresh_process_ms, 2)
            ));
        }
        if !self.prefill.is_empty() {
            s.push_str("\nprefill (bf16, 32k tokens, hidden 2048)\n");
            s.push_str(&format!(
                "{:>8} {:>6} {:>6} {:>5} {:>6} {:>10} {:>9} {:>7} {:>9}  ok\n",
                "hdim", "causal", "seqlen", "batch", "heads", "median_ms", "TFLOP/s", "%gemm", "check"
            ));
            for p in &self.prefill {
                s.push_str(&format!(
                    "{:>8} {:>6} {:>6} {:>5} {:>6} {:>10.4} {:>9.1} {:>7} {:>9}  {}\n",
                    format!("{}/{}", p.head_dim.0, p.head_dim.1),
                    p.causal,
                    p.seqlen,
                    p.batch,
                    p.heads,
                    p.time.median_ms,
                    p.tflops,
                    p.fraction_of_gemm.map_or("-".into(), |f| format!("{:.1}%", 100.0 * f)),
                    p.check_rel_l2.map_or("-".into(), |e| format!("{e:.1e}")),
                    if p.ok { "ok" } else { p.error.as_deref().unwrap_or("FAIL") }
                ));
            }
        }
        if !self.backward.is_empty() {
            s.push_str("\nbackward (bf16, 32k tokens, hidden 2048; dQ, dK, dV incl. preprocess; FLOPs 2.5x forward)\n");
            s.push_str(&format!(
                "{:>8} {:>6} {:>5} {:>6} {:>5} {:>6} {:>10} {:>9} {:>7} {:>9} {:>8}  ok\n",
                "hdim",
                "causal",
                "det",
                "seqlen",
                "batch",
                "heads",
                "median_ms",
                "TFLOP/s",
                "%gemm",
                "check",
                "host_us"
            ));
            for p in &self.backward {
                s.push_str(&format!(
                    "{:>8} {:>6} {:>5} {:>6} {:>5} {:>6} {:>10.4} {:>9.1} {:>7} {:>9} {:>8}  {}\n",
                    format!("{}/{}", p.head_dim.0, p.head_dim.1),
                    p.causal,
                    p.deterministic,
                    p.seqlen,
                    p.batch,
                    p.heads,
                    p.time.median_ms,
                    p.tflops,
                    p.fraction_of_gemm.map_or("-".into(), |f| format!("{:.1}%", 100.0 * f)),
                    p.check_rel_l2.map_or("-".into(), |e| format!("{e:.1e}")),
                    p.host_us.map_or("-".into(), |u| format!("{u:.1}")),
                    if p.ok { "ok" } else { p.error.as_deref().unwrap_or("FAIL") }
                ));
            }
        }
        if !self.decode.is_empty() {
            s.push_str("\ndecode (bf16, q 1, 32/8 heads, d 128)\n");
            s.push_str(&format!(
                "{:>5} {:>8} {:>6} {:>6} {:>10} {:>7} {:>7} {:>8} {:>8} {:>8} {:>9}  ok\n",
                "batch",
                "seqlen_k",
                "paged",
                "splits",
                "median_ms",
                "TB/s",
                "%copy",
                "gpu_us",
                "host_us",
                "shared",
                "check"
            ));
            for d in &self.decode {
                s.push_str(&format!(
                    "{:>5} {:>8} {:>6} {:>6} {:>10.4} {:>7.2} {:>7} {:>8} {:>8} {:>8} {:>9}  {}\n",
                    d.batch,
                    d.seqlen_k,
                    if d.page_size == 0 { "-".into() } else { d.page_size.to_string() },
                    d.num_splits.map_or("-".into(), |n| n.to_string()),
                    d.time.median_ms,
                    d.tb_s,
                    d.fraction_of_copy.map_or("-".into(), |f| format!("{:.1}%", 100.0 * f)),
                    d.gpu_time.as_ref().map_or("-".into(), |t| format!("{:.1}", t.median_ms * 1e3)),
                    d.host_us.map_or("-".into(), |u| format!("{u:.1}")),
                    d.host_shared_us.map_or("-".into(), |u| format!("{u:.1}")),
                    d.check_rel_l2.map_or("-".into(), |e| format!("{e:.1e}")),
                    if d.ok { "ok" } else { d.error.as_deref().unwrap_or("FAIL") }
                ));
                if !d.by_splits.is_empty() {
                    let cells: Vec<String> =
                        d.by_splits.iter().map(|(n, ms)| format!("{n}: {:.1}", ms * 1e3)).collect();
                    s.push_str(&format!("      gpu_us by splits  {}\n", cells.join("  ")));
                }
            }
            if let Some(f) = &self.launch_floor {
                s.push_str(&format!(
                    "launch floor (an empty kernel): host {:.1} us, gpu {:.1} us (shared: host_us through forward_shared)\n",
                    f.host_us, f.gpu_us
                ));
            }
        }
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        s
    }
}

fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.prec$}"))
}

// ---------------------------------------------------------------------------------------
// Ceilings.

fn copy_ceiling(rt: &Runtime, h: &Helpers, opts: &BenchOptions, c: &mut Ceilings) -> Result<(), RuntimeError> {
    let bytes: usize = 2 << 30;
    let gpu = rt.gpu();
    let src = gpu.alloc_bytes(bytes)?;
    let dst = gpu.alloc_bytes(bytes)?;
    gpu.memset_d32(src.ptr(), 0x3f80_0000, bytes / 4)?;
    let moved = 2.0 * bytes as f64;
    let t = time_gpu(gpu, opts.warmup.min(3), opts.iters, || gpu.dtod(dst.ptr(), src.ptr(), bytes))?;
    c.memcpy_tb_s = Some(moved / (t.median_ms * 1e-3) / 1e12);
    let t = time_gpu(gpu, opts.warmup.min(3), opts.iters, || h.copy(gpu, dst.ptr(), src.ptr(), bytes))?;
    c.copy_kernel_tb_s = Some(moved / (t.median_ms * 1e-3) / 1e12);
    c.copy_bytes = bytes as u64;
    c.copy_tb_s = [c.memcpy_tb_s, c.copy_kernel_tb_s].into_iter().flatten().reduce(f64::max);
    Ok(())
}

fn gemm_ceiling(rt: &Runtime, h: &Helpers, opts: &BenchOptions) -> Result<f64, String> {
    use cudarc::cublas::sys as cb;
    // SAFETY: only tries to dlopen the library names.
    if !unsafe { cb::is_culib_present() } {
        return Err(
            "libcublas not found on the library path (set LD_LIBRARY_PATH to the directory of libcublas.so.13)".into(),
        );
    }
    crate::cuda::guarded("cuBLAS", || {
        let e = |x: RuntimeError| x;
        let n: usize = 8192;
        let gpu = rt.gpu();
        let a = rt.alloc(ElemType::Bf16, &[n, n]).map_err(e)?;
        let b = rt.alloc(ElemType::Bf16, &[n, n]).map_err(e)?;
        let c = rt.alloc(ElemType::Bf16, &[n, n]).map_err(e)?;
        h.fill_normal(rt, &a, 11, 1.0)?;
        h.fill_normal(rt, &b, 12, 1.0)?;
        gpu.bind()?;
        let cublas_err = |what: &str, s: cb::cublasStatus_t| RuntimeError::Other(format!("{what}: {s:?}"));
        let mut handle: cb::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: plain cuBLAS calls on live device buffers of n*n bf16 each; the handle is
        // destroyed below.
        unsafe {
            let s = cb::cublasCreate_v2(&mut handle);
            if s != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(cublas_err("cublasCreate", s));
            }
            let s = cb::cublasSetStream_v2(handle, gpu.stream.cu_stream() as cb::cudaStream_t);
            if s != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                cb::cublasDestroy_v2(handle);
                return Err(cublas_err("cublasSetStream", s));
            }
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let gemm = || -> Result<(), RuntimeError> {
            // SAFETY: as above.
            let s = unsafe {
                cb::cublasGemmEx(
                    handle,
                    cb::cublasOperation_t::CUBLAS_OP_N,
                    cb::cublasOperation_t::CUBLAS_OP_N,
                    n as i32,
                    n as i32,
                    n as i32,
                    &alpha as *const f32 as *const std::ffi::c_void,
                    a.device_ptr() as *const std::ffi::c_void,
                    cb::cudaDataType::CUDA_R_16BF,
                    n as i32,
                    b.device_ptr() as *const std::ffi::c_void,
                    cb::cudaDataType::CUDA_R_16BF,
                    n as i32,
                    &beta as *const f32 as *const std::ffi::c_void,
                    c.device_ptr() as *mut std::ffi::c_void,
                    cb::cudaDataType::CUDA_R_16BF,
                    n as i32,
                    cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            };
            if s != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(cublas_err("cublasGemmEx", s));
            }
            Ok(())
        };
        let t = time_gpu(gpu, opts.warmup, opts.iters, gemm);
        // SAFETY: created above.
        unsafe { cb::cublasDestroy_v2(handle) };
        let t = t?;
        Ok(2.0 * (n as f64).powi(3) / (t.median_ms * 1e-3) / 1e12)
    })
    .map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// Prefill.

/// The prefill spec of the protocol.
pub fn prefill_spec(dqk: u32, dv: u32, heads: u32, causal: bool) -> Spec {
    let mut s = Spec::new(&format!("bench_prefill_d{dqk}_{}", if causal { "causal" } else { "full" }), dqk, heads);
    s.head_dim_v = dv;
    if causal {
        s.mask.causal = Some(Align::TopLeft);
    }
    s
}

/// The decode spec of the protocol (page_size 0: contiguous).
pub fn decode_spec(page_size: u32) -> Spec {
    let mut s = Spec::new(&format!("bench_decode_p{page_size}"), 128, 32);
    s.kv_heads = 8;
    s.pack_gqa = true;
    s.split_kv = SplitKv::Auto;
    s.mask.causal = Some(Align::BottomRight);
    if page_size > 0 {
        s.kv_layout = KvLayout::Paged { page_size };
    }
    s
}

/// Reads `count` consecutive rows (`row_elems` each) starting at row `row0` of a
/// row-major tensor, as f64.
fn read_rows(rt: &Runtime, t: &Tensor, row_elems: usize, row0: usize, count: usize) -> Result<Vec<f64>, RuntimeError> {
    let n = t.numel();
    let start = row0 * row_elems;
    let len = count * row_elems;
    if start + len > n {
        return Err(RuntimeError::Other("read_rows out of range".into()));
    }
    let view = t.view(&[len], &[1], t.offset() + start)?;
    rt.download_f64(&view)
}

fn check_prefill(
    rt: &Runtime,
    spec: &Spec,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    b_n: usize,
    s: usize,
) -> Result<f64, RuntimeError> {
    let (h_n, d, dv) = (spec.q_heads as usize, spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let causal = spec.mask.causal.is_some();
    let mut row_spec = Spec::new("row", spec.head_dim_qk, 1);
    row_spec.head_dim_v = spec.head_dim_v;
    row_spec.scale = spec.scale;
    if causal {
        row_spec.mask.causal = Some(Align::BottomRight);
    }
    let mut got = Vec::new();
    let mut want = Vec::new();
    let mut rng = Rng::new(7);
    for &b in &[0, b_n - 1] {
        // K and V of batch entry b: [s, h, d].
        let kb = read_rows(rt, k, h_n * d, b * s, s)?;
        let vb = read_rows(rt, v, h_n * dv, b * s, s)?;
        for &h in &[0, h_n - 1] {
            for p in [0, s / 2 + 1, s - 1, rng.int_in(0, s as i64 - 1) as usize] {
                let qrow = read_rows(rt, q, d, (b * s + p) * h_n + h, 1)?;
                let orow = read_rows(rt, o, dv, (b * s + p) * h_n + h, 1)?;
                let sk = if causal { p + 1 } else { s };
                let kk: Vec<f64> = (0..sk).flat_map(|j| kb[(j * h_n + h) * d..][..d].iter().copied()).collect();
                let vv: Vec<f64> = (0..sk).flat_map(|j| vb[(j * h_n + h) * dv..][..dv].iter().copied()).collect();
                let inputs = Inputs {
                    seqs: vec![Sequence { seqlen_q: 1, seqlen_k: sk, q: qrow, k: kk, v: vv }],
                    params: vec![],
                    aux: vec![],
                    sinks: None,
                    positions: Vec::new(),
                };
                let r = reference_forward(&row_spec, &inputs)
                    .map_err(|e| RuntimeError::Other(format!("reference: {e}")))?;
                want.extend(r.into_iter().flat_map(|x| x.o));
                got.extend(orow);
            }
        }
    }
    Ok(rel_l2(&got, &want))
}

fn run_prefill(rt: &Runtime, h: &Helpers, opts: &BenchOptions, gemm: Option<f64>, out: &mut Vec<PrefillResult>) {
    for &(dqk, dv) in &opts.prefill_head_dims {
        for causal in [false, true] {
            for &s in &opts.prefill_seqlens {
                let heads = opts.hidden / dqk as usize;
                let batch = (opts.total_tokens / s).max(1);
                let mut r = PrefillResult {
                    head_dim: (dqk, dv),
                    causal,
                    seqlen: s,
                    batch,
                    heads,
                    time: TimeStats::default(),
                    tflops: 0.0,
                    fraction_of_gemm: None,
                    check_rel_l2: None,
                    ok: false,
                    error: None,
                    receipt: None,
                };
                let res = (|| -> Result<(), RuntimeError> {
                    let spec = prefill_spec(dqk, dv, heads as u32, causal);
                    let kernel = rt.kernel(&spec)?;
                    let q = rt.alloc(ElemType::Bf16, &[batch, s, heads, dqk as usize])?;
                    let k = rt.alloc(ElemType::Bf16, &[batch, s, heads, dqk as usize])?;
                    let v = rt.alloc(ElemType::Bf16, &[batch, s, heads, dv as usize])?;
                    let mut o = rt.alloc(ElemType::Bf16, &[batch, s, heads, dv as usize])?;
                    h.fill_normal(rt, &q, 1, 1.0)?;
                    h.fill_normal(rt, &k, 2, 1.0)?;
                    h.fill_normal(rt, &v, 3, 1.0)?;
                    rt.fill_nan(&o)?;
                    let receipt = kernel.forward(&q, &k, &v, &mut o, &Params::default())?;
                    rt.synchronize()?;
                    r.receipt = Some(receipt.to_string());
                    // The time is taken even when the check fails (the row is then not
                    // ok): a diagnostic build that computes the wrong thing still times.
                    let mut failed = None;
                    if opts.check {
                        let e = check_prefill(rt, &spec, &q, &k, &v, &o, batch, s)?;
                        r.check_rel_l2 = Some(e);
                        if e.is_nan() || e > 1e-2 {
                            failed = Some(RuntimeError::Other(format!("reference check failed: rel_l2 {e:.3e}")));
                        }
                    }
                    let p = Params::default();
                    r.time = time_gpu(rt.gpu(), opts.warmup, opts.iters, || {
                        kernel.forward(&q, &k, &v, &mut o, &p).map(|_| ())
                    })?;
                    let flops = 4.0 * batch as f64 * heads as f64 * (s as f64).powi(2) * f64::from(dqk + dv) / 2.0
                        * if causal { 0.5 } else { 1.0 };
                    r.tflops = flops / (r.time.median_ms * 1e-3) / 1e12;
                    r.fraction_of_gemm = gemm.map(|g| r.tflops / g);
                    failed.map_or(Ok(()), Err)
                })();
                r.ok = res.is_ok();
                r.error = res.err().map(|e| e.to_string());
                if opts.progress {
                    eprintln!(
                        "prefill d={dqk}/{dv} causal={causal} seqlen={s}: {:.4} ms, {:.1} TFLOP/s{}",
                        r.time.median_ms,
                        r.tflops,
                        r.error.as_ref().map_or(String::new(), |e| format!(" ERROR {e}"))
                    );
                }
                out.push(r);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward.

/// dQ, dK, dV of head `h` of batch entry 0 against the f64 reference backward (the
/// spec's one-head twin: a causal or full mask does not mix heads).
#[allow(clippy::too_many_arguments)]
fn check_backward(
    rt: &Runtime,
    spec: &Spec,
    t: [&Tensor; 4],
    g: [&Tensor; 3],
    s: usize,
    h: usize,
) -> Result<f64, RuntimeError> {
    let [q, k, v, d_out] = t;
    let (h_n, d, dv) = (spec.q_heads as usize, spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let mut one = spec.clone();
    one.q_heads = 1;
    one.kv_heads = 1;
    // Head h of entry 0, as `[s, 1, d]`.
    let head = |t: &Tensor, dd: usize| -> Result<Vec<f64>, RuntimeError> {
        let all = read_rows(rt, t, h_n * dd, 0, s)?;
        Ok((0..s).flat_map(|i| all[(i * h_n + h) * dd..][..dd].to_vec()).collect())
    };
    let inputs = Inputs {
        seqs: vec![Sequence { seqlen_q: s, seqlen_k: s, q: head(q, d)?, k: head(k, d)?, v: head(v, dv)? }],
        params: vec![],
        aux: vec![],
        sinks: None,
        positions: Vec::new(),
    };
    let want = attnc_ir::reference::reference_backward(&one, &inputs, &[head(d_out, dv)?])
        .map_err(|e| RuntimeError::Other(format!("reference: {e}")))?;
    let w = &want.seqs[0];
    let e = [rel_l2(&head(g[0], d)?, &w.dq), rel_l2(&head(g[1], d)?, &w.dk), rel_l2(&head(g[2], dv)?, &w.dv)];
    Ok(e.into_iter().fold(0.0, f64::max))
}

fn run_backward(rt: &Runtime, h: &Helpers, opts: &BenchOptions, gemm: Option<f64>, out: &mut Vec<BackwardResult>) {
    let dets: &[bool] = if opts.backward_deterministic { &[false, true] } else { &[false] };
    for &(dqk, dv) in &opts.prefill_head_dims {
        for causal in [false, true] {
            for &s in &opts.backward_seqlens {
                for &det in dets {
                    let heads = opts.hidden / dqk as usize;
                    let batch = (opts.total_tokens / s).max(1);
                    let mut r = BackwardResult {
                        head_dim: (dqk, dv),
                        causal,
                        deterministic: det,
                        seqlen: s,
                        batch,
                        heads,
                        time: TimeStats::default(),
                        tflops: 0.0,
                        fraction_of_gemm: None,
                        check_rel_l2: None,
                        host_us: None,
                        ok: false,
                        error: None,
                        receipt: None,
                    };
                    let res = (|| -> Result<(), RuntimeError> {
                        let spec = prefill_spec(dqk, dv, heads as u32, causal);
                        let kernel = rt.kernel(&spec)?;
                        let shape_qk = [batch, s, heads, dqk as usize];
                        let shape_v = [batch, s, heads, dv as usize];
                        let q = rt.alloc(ElemType::Bf16, &shape_qk)?;
                        let k = rt.alloc(ElemType::Bf16, &shape_qk)?;
                        let v = rt.alloc(ElemType::Bf16, &shape_v)?;
                        let d_out = rt.alloc(ElemType::Bf16, &shape_v)?;
                        let mut o = rt.alloc(ElemType::Bf16, &shape_v)?;
                        let mut lse = rt.alloc(ElemType::F32, &[batch, heads, s])?;
                        h.fill_normal(rt, &q, 1, 1.0)?;
                        h.fill_normal(rt, &k, 2, 1.0)?;
                        h.fill_normal(rt, &v, 3, 1.0)?;
                        h.fill_normal(rt, &d_out, 4, 1.0)?;
                        kernel.forward_lse(&q, &k, &v, &mut o, &mut lse, &Params::default())?;
                        let mut dq = rt.alloc(ElemType::Bf16, &shape_qk)?;
                        let mut dk = rt.alloc(ElemType::Bf16, &shape_qk)?;
                        let mut dvt = rt.alloc(ElemType::Bf16, &shape_v)?;
                        for x in [&dq, &dk, &dvt] {
                            rt.fill_nan(x)?;
                        }
                        let p = Params::default().deterministic(det);
                        let grads = crate::backward::Gradients { dq: &mut dq, dk: &mut dk, dv: &mut dvt };
                        let receipt = kernel.backward(&q, &k, &v, &o, &lse, &d_out, grads, &p)?;
                        rt.synchronize()?;
                        r.receipt = Some(receipt.to_string());
                        let mut failed = None;
                        if opts.check {
                            let finite = [&dq, &dk, &dvt]
                                .into_iter()
                                .map(|x| rt.download::<half::bf16>(x).map(|v| v.iter().all(|e| e.is_finite())))
                                .collect::<Result<Vec<bool>, _>>()?;
                            if finite.contains(&false) {
                                failed = Some(RuntimeError::Other("non-finite gradients".into()));
                            } else if s <= 1024 {
                                let e =
                                    check_backward(rt, &spec, [&q, &k, &v, &d_out], [&dq, &dk, &dvt], s, heads - 1)?;
                                r.check_rel_l2 = Some(e);
                                if e.is_nan() || e > 2e-2 {
                                    failed =
                                        Some(RuntimeError::Other(format!("reference check failed: rel_l2 {e:.3e}")));
                                }
                            }
                        }
                        let mut call = || {
                            let grads = crate::backward::Gradients { dq: &mut dq, dk: &mut dk, dv: &mut dvt };
                            kernel.backward(&q, &k, &v, &o, &lse, &d_out, grads, &p).map(|_| ())
                        };
                        r.time = time_gpu(rt.gpu(), opts.warmup, opts.iters, &mut call)?;
                        r.host_us = Some(time_host_us(rt.gpu(), opts.iters, &mut call)?);
                        let fwd = 4.0 * batch as f64 * heads as f64 * (s as f64).powi(2) * f64::from(dqk + dv) / 2.0
                            * if causal { 0.5 } else { 1.0 };
                        r.tflops = 2.5 * fwd / (r.time.median_ms * 1e-3) / 1e12;
                        r.fraction_of_gemm = gemm.map(|g| r.tflops / g);
                        failed.map_or(Ok(()), Err)
                    })();
                    r.ok = res.is_ok();
                    r.error = res.err().map(|e| e.to_string());
                    if opts.progress {
                        eprintln!(
                            "backward d={dqk}/{dv} causal={causal} deterministic={det} seqlen={s}: {:.4} ms, {:.1} TFLOP/s{}",
                            r.time.median_ms,
                            r.tflops,
                            r.error.as_ref().map_or(String::new(), |e| format!(" ERROR {e}"))
                        );
                    }
                    out.push(r);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Decode.

fn check_decode(
    rt: &Runtime,
    spec: &Spec,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    page: Option<(&[i32], usize, usize)>,
    sk: usize,
    batch: usize,
) -> Result<f64, RuntimeError> {
    let (qh, kvh, d) = (spec.q_heads as usize, spec.kv_heads as usize, spec.head_dim_qk as usize);
    let row = kvh * d;
    let mut got = Vec::new();
    let mut want = Vec::new();
    for &b in &[0, batch - 1] {
        let (kb, vb) = match page {
            None => (read_rows(rt, k, row, b * sk, sk)?, read_rows(rt, v, row, b * sk, sk)?),
            Some((bt, max_pages, ps)) => {
                let (mut kb, mut vb) = (Vec::with_capacity(sk * row), Vec::with_capacity(sk * row));
                for p in 0..sk.div_ceil(ps) {
                    let pg = bt[b * max_pages + p] as usize;
                    let n = (sk - p * ps).min(ps);
                    kb.extend(read_rows(rt, k, row, pg * ps, n)?);
                    vb.extend(read_rows(rt, v, row, pg * ps, n)?);
                }
                (kb, vb)
            }
        };
        let qb = read_rows(rt, q, qh * d, b, 1)?;
        let inputs = Inputs {
            seqs: vec![Sequence { seqlen_q: 1, seqlen_k: sk, q: qb, k: kb, v: vb }],
            params: vec![],
            aux: vec![],
            sinks: None,
            positions: Vec::new(),
        };
        let mut ref_spec = spec.clone();
        ref_spec.kv_layout = KvLayout::Contiguous;
        let r = reference_forward(&ref_spec, &inputs).map_err(|e| RuntimeError::Other(format!("reference: {e}")))?;
        want.extend(r.into_iter().flat_map(|x| x.o));
        got.extend(read_rows(rt, o, qh * d, b, 1)?);
    }
    Ok(rel_l2(&got, &want))
}

fn run_decode(rt: &Runtime, h: &Helpers, opts: &BenchOptions, copy: Option<f64>, out: &mut Vec<DecodeResult>) {
    for &ps in &opts.decode_page_sizes {
        for &sk in &opts.decode_seqlens_k {
            for &batch in &opts.decode_batches {
                let spec = decode_spec(ps);
                let (qh, kvh, d) = (32usize, 8usize, 128usize);
                let kv_bytes = (2 * batch * sk * kvh * d * 2) as u64;
                let mut r = DecodeResult {
                    batch,
                    seqlen_k: sk,
                    page_size: ps,
                    num_splits: None,
                    time: TimeStats::default(),
                    gpu_time: None,
                    host_us: None,
                    host_shared_us: None,
                    by_splits: Vec::new(),
                    kv_bytes,
                    tb_s: 0.0,
                    fraction_of_copy: None,
                    check_rel_l2: None,
                    ok: false,
                    error: None,
                    receipt: None,
                };
                let res = (|| -> Result<(), RuntimeError> {
                    let kernel = rt.kernel(&spec)?;
                    let q = rt.alloc(ElemType::Bf16, &[batch, 1, qh, d])?;
                    let mut o = rt.alloc(ElemType::Bf16, &[batch, 1, qh, d])?;
                    h.fill_normal(rt, &q, 21, 1.0)?;
                    rt.fill_nan(&o)?;
                    let (k, v, bt_host, tables);
                    if ps == 0 {
                        k = rt.alloc(ElemType::Bf16, &[batch, sk, kvh, d])?;
                        v = rt.alloc(ElemType::Bf16, &[batch, sk, kvh, d])?;
                        bt_host = Vec::new();
                        tables = None;
                    } else {
                        let ps_u = ps as usize;
                        let per = sk.div_ceil(ps_u);
                        let pages = batch * per;
                        k = rt.alloc(ElemType::Bf16, &[pages, ps_u, kvh, d])?;
                        v = rt.alloc(ElemType::Bf16, &[pages, ps_u, kvh, d])?;
                        // A shuffled page order.
                        let mut perm: Vec<i32> = (0..pages as i32).collect();
                        let mut rng = Rng::new(99);
                        for i in (1..pages).rev() {
                            let j = rng.int_in(0, i as i64) as usize;
                            perm.swap(i, j);
                        }
                        bt_host = perm;
                        let bt = rt.upload_index(&bt_host, &[batch, per])?;
                        let su = rt.upload_index(&vec![sk as i32; batch], &[batch])?;
                        tables = Some((bt, su));
                    }
                    h.fill_normal(rt, &k, 22, 1.0)?;
                    h.fill_normal(rt, &v, 23, 1.0)?;
                    let params = match &tables {
                        Some((bt, su)) => Params::default().paged(bt, su),
                        None => Params::default(),
                    };
                    let receipt = kernel.forward(&q, &k, &v, &mut o, &params)?;
                    rt.synchronize()?;
                    r.num_splits = Some(receipt.num_splits);
                    r.receipt = Some(receipt.to_string());
                    if opts.check {
                        let page = (ps > 0).then(|| (bt_host.as_slice(), sk.div_ceil(ps as usize), ps as usize));
                        let e = check_decode(rt, &spec, &q, &k, &v, &o, page, sk, batch)?;
                        r.check_rel_l2 = Some(e);
                        if e.is_nan() || e > 1e-2 {
                            return Err(RuntimeError::Other(format!("reference check failed: rel_l2 {e:.3e}")));
                        }
                    }
                    r.time = time_gpu(rt.gpu(), opts.warmup, opts.iters, || {
                        kernel.forward(&q, &k, &v, &mut o, &params).map(|_| ())
                    })?;
                    r.tb_s = kv_bytes as f64 / (r.time.median_ms * 1e-3) / 1e12;
                    r.fraction_of_copy = copy.map(|c| r.tb_s / c);
                    let gpu = rt.gpu();
                    r.gpu_time = Some(time_gpu_queued(gpu, h, opts.warmup, opts.iters, || {
                        kernel.forward(&q, &k, &v, &mut o, &params).map(|_| ())
                    })?);
                    r.host_us = Some(time_host_us(gpu, opts.iters, || {
                        kernel.forward(&q, &k, &v, &mut o, &params).map(|_| ())
                    })?);
                    r.host_shared_us = Some(time_host_us(gpu, opts.iters, || {
                        kernel.forward_shared(&q, &k, &v, &mut o, None, &params).map(|_| ())
                    })?);
                    for &n in &opts.decode_split_sweep {
                        let forced = params.clone().splits(n);
                        // A count the launch refuses reads NaN; the row's own result stands.
                        let t = time_gpu_queued(gpu, h, opts.warmup, opts.iters, || {
                            kernel.forward(&q, &k, &v, &mut o, &forced).map(|_| ())
                        });
                        r.by_splits.push((n, t.map_or(f64::NAN, |t| t.median_ms)));
                    }
                    Ok(())
                })();
                r.ok = res.is_ok();
                r.error = res.err().map(|e| e.to_string());
                if opts.progress {
                    eprintln!(
                        "decode batch={batch} seqlen_k={sk} page={ps}: {:.4} ms, {:.2} TB/s, splits {}{}",
                        r.time.median_ms,
                        r.tb_s,
                        r.num_splits.unwrap_or(0),
                        r.error.as_ref().map_or(String::new(), |e| format!(" ERROR {e}"))
                    );
                }
                out.push(r);
            }
        }
    }
}

/// Runs the protocol.
pub fn run(rt: &Runtime, opts: &BenchOptions) -> Result<BenchReport, RuntimeError> {
    let t0 = Instant::now();
    let helpers = Helpers::load(rt.gpu())?;
    let mut notes = Vec::new();
    let mut ceilings = Ceilings::default();
    if opts.ceilings {
        if let Err(e) = copy_ceiling(rt, &helpers, opts, &mut ceilings) {
            notes.push(format!("copy ceiling failed: {e}"));
        }
        match gemm_ceiling(rt, &helpers, opts) {
            Ok(t) => ceilings.gemm_tflops = Some(t),
            Err(e) => ceilings.gemm_note = Some(e),
        }
        if opts.progress {
            eprintln!(
                "ceilings: copy {} TB/s, GEMM {} TFLOP/s {}",
                opt(ceilings.copy_tb_s, 2),
                opt(ceilings.gemm_tflops, 1),
                ceilings.gemm_note.clone().unwrap_or_default()
            );
        }
    }
    let compile = if opts.compile {
        match run_compile(rt, opts) {
            Ok(c) => {
                if opts.progress {
                    eprintln!("compile: {c:?}");
                }
                Some(c)
            }
            Err(e) => {
                notes.push(format!("compile-time part failed: {e}"));
                None
            }
        }
    } else {
        None
    };
    let mut prefill = Vec::new();
    if opts.prefill {
        run_prefill(rt, &helpers, opts, ceilings.gemm_tflops, &mut prefill);
    }
    let mut backward = Vec::new();
    if opts.backward {
        run_backward(rt, &helpers, opts, ceilings.gemm_tflops, &mut backward);
    }
    let mut decode = Vec::new();
    let mut launch_floor = None;
    if opts.decode {
        run_decode(rt, &helpers, opts, ceilings.copy_tb_s, &mut decode);
        launch_floor = match LaunchFloor::measure(rt, &helpers, opts) {
            Ok(f) => Some(f),
            Err(e) => {
                notes.push(format!("launch floor: {e}"));
                None
            }
        };
    }
    Ok(BenchReport {
        device: rt.device().clone(),
        attnc_version: crate::jit::ATTNC_VERSION.into(),
        llvm_version: crate::jit::llvm_version(),
        options: opts.clone(),
        ceilings,
        compile,
        prefill,
        backward,
        decode,
        launch_floor,
        seconds: t0.elapsed().as_secs_f64(),
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_median() {
        assert_eq!(TimeStats::of(vec![3.0, 1.0, 2.0]).median_ms, 2.0);
        assert_eq!(TimeStats::of(vec![4.0, 1.0, 2.0, 3.0]).median_ms, 2.5);
        assert_eq!(TimeStats::of(vec![]).runs, 0);
    }

    #[test]
    fn protocol_defaults() {
        let o = BenchOptions::default();
        assert!(o.iters >= 20);
        assert_eq!(o.prefill_seqlens, vec![1024, 2048, 4096, 8192, 16384]);
        let s = decode_spec(16);
        assert_eq!((s.q_heads, s.kv_heads, s.head_dim_qk), (32, 8, 128));
        assert!(attnc_ir::validate(&s).is_ok());
        assert!(attnc_ir::validate(&prefill_spec(64, 64, 32, true)).is_ok());
        assert!(attnc_dsl::parse_named("x.attn", compile::DEFAULT_COMPILE_SOURCE).is_ok());
    }
}
