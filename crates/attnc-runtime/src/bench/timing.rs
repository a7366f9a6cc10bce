//! The bench's GPU helpers and clocks: helper kernels JIT'ed from PTX text (a random
//! fill, a copy, a spin), and the three ways a call is timed — the protocol's events
//! around the call, the GPU's own time behind a spin kernel, and the host's enqueue time.

use super::TimeStats;
use crate::cuda::{Function, Gpu, Image, Module};
use crate::error::RuntimeError;
use crate::runtime::Runtime;
use crate::tensor::{ElemType, Tensor};
use std::time::Instant;

/// A random-normal fill (hash-based, Box-Muller; bf16/fp16/f32) and a 16-byte copy.
pub const HELPER_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry attnc_fill_normal(
    .param .u64 p_dst,
    .param .u64 p_n,
    .param .u64 p_seed,
    .param .f32 p_scale,
    .param .u32 p_kind
)
{
    .reg .pred %p<4>;
    .reg .b16 %h<2>;
    .reg .b32 %r<8>;
    .reg .f32 %f<12>;
    .reg .b64 %rd<16>;

    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_n];
    ld.param.u64 %rd3, [p_seed];
    ld.param.f32 %f1, [p_scale];
    ld.param.u32 %r1, [p_kind];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mul.wide.u32 %rd4, %r2, %r3;
    cvt.u64.u32 %rd5, %r4;
    add.u64 %rd4, %rd4, %rd5;
    mov.u32 %r5, %nctaid.x;
    mul.wide.u32 %rd6, %r5, %r3;
$Lfill_loop:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra $Lfill_done;
    add.u64 %rd7, %rd4, 1;
    mul.lo.u64 %rd7, %rd7, -7046029254386353131;
    add.u64 %rd7, %rd7, %rd3;
    shr.u64 %rd8, %rd7, 30;
    xor.b64 %rd7, %rd7, %rd8;
    mul.lo.u64 %rd7, %rd7, -4658895280553007687;
    shr.u64 %rd8, %rd7, 27;
    xor.b64 %rd7, %rd7, %rd8;
    mul.lo.u64 %rd7, %rd7, -7723592293110705685;
    shr.u64 %rd8, %rd7, 31;
    xor.b64 %rd7, %rd7, %rd8;
    shr.u64 %rd9, %rd7, 40;
    cvt.rn.f32.u64 %f2, %rd9;
    add.f32 %f2, %f2, 0f3F800000;
    mul.f32 %f2, %f2, 0f33800000;
    and.b64 %rd10, %rd7, 16777215;
    cvt.rn.f32.u64 %f3, %rd10;
    mul.f32 %f3, %f3, 0f33800000;
    lg2.approx.f32 %f4, %f2;
    mul.f32 %f4, %f4, 0fBFB17218;
    sqrt.approx.f32 %f5, %f4;
    mul.f32 %f6, %f3, 0f40C90FDB;
    cos.approx.f32 %f7, %f6;
    mul.f32 %f8, %f5, %f7;
    mul.f32 %f8, %f8, %f1;
    setp.eq.u32 %p2, %r1, 2;
    @%p2 bra $Lfill_f32;
    setp.eq.u32 %p3, %r1, 1;
    @%p3 bra $Lfill_f16;
    cvt.rn.bf16.f32 %h1, %f8;
    bra $Lfill_store16;
$Lfill_f16:
    cvt.rn.f16.f32 %h1, %f8;
$Lfill_store16:
    shl.b64 %rd11, %rd4, 1;
    add.u64 %rd11, %rd1, %rd11;
    st.global.b16 [%rd11], %h1;
    bra $Lfill_next;
$Lfill_f32:
    shl.b64 %rd11, %rd4, 2;
    add.u64 %rd11, %rd1, %rd11;
    st.global.f32 [%rd11], %f8;
$Lfill_next:
    add.u64 %rd4, %rd4, %rd6;
    bra $Lfill_loop;
$Lfill_done:
    ret;
}

.visible .entry attnc_copy16(
    .param .u64 p_dst,
    .param .u64 p_src,
    .param .u64 p_n16
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_src];
    ld.param.u64 %rd3, [p_n16];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd6, %r4, %r2;
$Lcopy_loop:
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra $Lcopy_done;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd2, %rd7;
    ld.global.nc.v4.u32 {%r5, %r6, %r7, %r8}, [%rd8];
    add.u64 %rd9, %rd1, %rd7;
    st.global.v4.u32 [%rd9], {%r5, %r6, %r7, %r8};
    add.u64 %rd4, %rd4, %rd6;
    bra $Lcopy_loop;
$Lcopy_done:
    ret;
}

.visible .entry attnc_spin(
    .param .u64 p_ns
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [p_ns];
    mov.u64 %rd2, %globaltimer;
$Lspin:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $Lspin;
    ret;
}
"#;

/// The helper kernels, loaded.
pub struct Helpers {
    _module: Module,
    fill: Function,
    copy: Function,
    spin: Function,
}

impl Helpers {
    pub fn load(gpu: &Gpu) -> Result<Helpers, RuntimeError> {
        let module = gpu.load_module(HELPER_PTX.as_bytes(), Image::Ptx, "attnc bench helpers")?;
        let fill = module.function("attnc_fill_normal")?;
        let copy = module.function("attnc_copy16")?;
        let spin = module.function("attnc_spin")?;
        Ok(Helpers { _module: module, fill, copy, spin })
    }

    /// Fills the whole allocation of `t` with N(0, scale²) values (its dtype; not i32).
    pub fn fill_normal(&self, rt: &Runtime, t: &Tensor, seed: u64, scale: f32) -> Result<(), RuntimeError> {
        use crate::cuda::ArgValue as A;
        let kind = match t.dtype() {
            ElemType::Bf16 => 0,
            ElemType::F16 => 1,
            ElemType::F32 => 2,
            ElemType::I32 => return Err(RuntimeError::Other("fill_normal: i32 tensor".into())),
        };
        let n = (t.buf.bytes() / t.dtype().bytes()) as u64;
        let gpu = rt.gpu();
        let blocks = (n.div_ceil(256)).clamp(1, u64::from(gpu.info.sm_count) * 16) as u32;
        let args = [A::Ptr(t.buf.ptr()), A::Ptr(n), A::Ptr(seed), A::F32(scale), A::I32(kind)];
        gpu.launch(&self.fill, [blocks, 1, 1], 256, 0, &args)
    }

    /// Copies `bytes` (a multiple of 16) from `src` to `dst` with 16-byte vectors.
    pub fn copy(&self, gpu: &Gpu, dst: u64, src: u64, bytes: usize) -> Result<(), RuntimeError> {
        use crate::cuda::ArgValue as A;
        let n16 = (bytes / 16) as u64;
        let blocks = (u64::from(gpu.info.sm_count) * 8).max(1) as u32;
        gpu.launch(&self.copy, [blocks, 1, 1], 512, 0, &[A::Ptr(dst), A::Ptr(src), A::Ptr(n16)])
    }
}

impl Helpers {
    /// Keeps the stream busy for `ns` nanoseconds (one thread reading the global timer).
    pub fn spin(&self, gpu: &Gpu, ns: u64) -> Result<(), RuntimeError> {
        use crate::cuda::ArgValue as A;
        gpu.launch(&self.spin, [1, 1, 1], 1, 0, &[A::Ptr(ns)])
    }
}

/// How long the GPU spins before each `time_gpu_queued` run: longer than any host path
/// of one call, so the call's launches are all queued when the first event fires.
pub const QUEUE_SPIN_NS: u64 = 300_000;

/// Times `f` with the host's part hidden: each run's launches are queued behind a spin
/// kernel, so the events measure the GPU's own time (the kernels and the gaps between
/// them), not the host's preparation. The protocol's `time_gpu` includes the host (as the
/// peers' harness does); at microsecond sizes the two differ, and both are reported.
pub fn time_gpu_queued(
    gpu: &Gpu,
    h: &Helpers,
    warmup: usize,
    iters: usize,
    f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<TimeStats, RuntimeError> {
    time_events(gpu, warmup, iters, || h.spin(gpu, QUEUE_SPIN_NS), f)
}

/// `iters` runs of `f` between two events after `warmup` untimed ones, each run preceded
/// (outside the events) by `before`.
fn time_events(
    gpu: &Gpu,
    warmup: usize,
    iters: usize,
    mut before: impl FnMut() -> Result<(), RuntimeError>,
    mut f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<TimeStats, RuntimeError> {
    for _ in 0..warmup {
        f()?;
    }
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(iters);
    let (a, b) = (gpu.event()?, gpu.event()?);
    for _ in 0..iters.max(1) {
        before()?;
        gpu.record(&a)?;
        f()?;
        gpu.record(&b)?;
        times.push(f64::from(gpu.elapsed_ms(&a, &b)?));
    }
    Ok(TimeStats::of(times))
}

/// The host's median wall time to enqueue `f` (no synchronization inside the timed part).
pub fn time_host_us(
    gpu: &Gpu,
    iters: usize,
    mut f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f64, RuntimeError> {
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        gpu.synchronize()?;
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    gpu.synchronize()?;
    Ok(TimeStats::of(times).median_ms)
}

/// Times `f` (which enqueues GPU work) with CUDA events, after `warmup` untimed runs.
pub fn time_gpu(
    gpu: &Gpu,
    warmup: usize,
    iters: usize,
    f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<TimeStats, RuntimeError> {
    time_events(gpu, warmup, iters, || Ok(()), f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_ptx_is_ascii_and_assembles() {
        assert!(HELPER_PTX.is_ascii());
        // With ptxas available (CI), the helper kernels must assemble for sm_90a.
        let Some(ptxas) = std::env::var_os("ATTNC_PTXAS") else { return };
        let dir = std::env::temp_dir().join(format!("attnc-helper-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("h.ptx");
        std::fs::write(&f, HELPER_PTX).expect("write");
        let out = std::process::Command::new(ptxas)
            .args(["-arch=sm_90a", "-o"])
            .arg(dir.join("h.cubin"))
            .arg(&f)
            .output()
            .expect("ptxas");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}
