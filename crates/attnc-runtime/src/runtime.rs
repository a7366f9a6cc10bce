//! The runtime: a device, its kernel cache, tensors, and validated launches.

use crate::block_mask::{launch_seqlens, BlockMask, BuiltFor};
use crate::cache::{Cache, CacheConfig, CacheSource, CacheStats};
use crate::cuda::{ArgSlots, ArgValue};
use crate::cuda::{DeviceInfo, Gpu, Image, Queue, Stream};
use crate::error::RuntimeError;
use crate::jit::{kernel_key, KernelProducer, LoadedKernel};
use crate::launch_memo::{BackwardMemo, LaunchMemo, LaunchSignature};
use crate::params::Params;
use crate::receipt::{BlockMaskSource, KernelConfig, Receipt, Timings};
use crate::tensor::{contiguous_strides, ElemType, Element, IndexTensor, Tensor};
use crate::validate::{marshal, plan, CombineKind, KernelShape, LaunchDescs, LaunchPlan};
use crate::workspace::{Pools, Workspace};
use attnc_ir::block_mask::{BlockDims, Tiling};
use attnc_ir::{KvLayout, QueryRows, Spec, ONE_TILE_ROWS};
use attnc_lower::families::common::abi::{SPLIT_COUNTERS_PARAM, TILE_COUNTERS_PARAM};
use attnc_lower::{Arch, Direction, FamilyChoice, FamilyKind, Grid, KernelRole};
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) struct Inner {
    pub(crate) gpu: Gpu,
    pub(crate) kernels: Cache<LoadedKernel>,
    /// Per-stream workspaces and counters (`workspace::Pools`).
    pub(crate) pools: Pools,
}

/// One module [`Kernel::warm`] made ready.
#[derive(Clone, Debug)]
pub struct Warmed {
    pub what: &'static str,
    pub family: String,
    pub source: CacheSource,
}

/// A CUDA device with attnc's JIT. Cheap to clone (shared).
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Runtime({:?})", self.inner.gpu)
    }
}

impl Runtime {
    /// Opens CUDA device `device` with the cache configured from the environment
    /// ([`CacheConfig::from_env`]). Without an NVIDIA driver: [`RuntimeError::NoDriver`].
    pub fn new(device: usize) -> Result<Runtime, RuntimeError> {
        Runtime::with_cache(device, &CacheConfig::from_env())
    }

    pub fn with_cache(device: usize, cache: &CacheConfig) -> Result<Runtime, RuntimeError> {
        let gpu = Gpu::open(device)?;
        Ok(Runtime { inner: Arc::new(Inner { gpu, kernels: Cache::new(cache), pools: Pools::default() }) })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.inner.gpu.info
    }
    /// The arch kernels are compiled for.
    pub fn arch(&self) -> Arch {
        self.inner.gpu.arch
    }
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.kernels.stats()
    }
    /// The disk cache directory (None: memory only).
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.inner.kernels.disk().map(|d| d.dir())
    }
    /// Why the disk cache is off although one was configured.
    pub fn cache_warning(&self) -> Option<&str> {
        self.inner.kernels.disk_error()
    }
    /// Drops the in-memory modules (the next `kernel` call goes to disk).
    pub fn clear_memory_cache(&self) {
        self.inner.kernels.clear_memory();
    }
    /// The underlying device layer (bench helpers).
    pub fn gpu(&self) -> &Gpu {
        &self.inner.gpu
    }

    /// The kernel of `spec` for this device, with the family the dispatcher picks.
    pub fn kernel(&self, spec: &Spec) -> Result<Kernel, RuntimeError> {
        self.kernel_with(spec, FamilyChoice::Auto)
    }

    /// The kernel of `spec` with a family choice: compiled once, then served from the
    /// memory cache (same process) or the disk cache (any process).
    pub fn kernel_with(&self, spec: &Spec, family: FamilyChoice) -> Result<Kernel, RuntimeError> {
        let (loaded, source, key) = self.module(spec, family, Direction::Forward)?;
        let fwd = loaded.meta.forward().ok_or_else(|| RuntimeError::Abi("no forward kernel".into()))?;
        let shape = KernelShape {
            block_m: fwd.block_m,
            block_n: fwd.block_n,
            combine: if fwd.params.iter().any(|p| p.strip_suffix(":ptr") == Some(SPLIT_COUNTERS_PARAM)) {
                CombineKind::Fused
            } else {
                loaded.meta.combine().map_or(CombineKind::None, |c| CombineKind::Kernel { block_m: c.block_m })
            },
            ctas_per_sm: loaded.main_ctas_per_sm,
            persistent: fwd.grid == Grid::Persistent,
        };
        Ok(Kernel {
            rt: self.clone(),
            spec: spec.clone(),
            family,
            loaded,
            source,
            shape,
            mask_key: key.clone(),
            key,
            lse_forward: Arc::new(OnceLock::new()),
            backward: Arc::new(OnceLock::new()),
            memo: Arc::new(Mutex::new(None)),
            backward_memo: Arc::new(Mutex::new(None)),
            no_sink: Arc::new(OnceLock::new()),
            sharded: Arc::new(OnceLock::new()),
            one_tile: Arc::new(OnceLock::new()),
            interim: None,
        })
    }

    /// The loaded module of `direction` of `spec`: compiled once, then served from the
    /// memory or disk cache; with where it came from and its cache key (hex).
    pub(crate) fn module(
        &self,
        spec: &Spec,
        family: FamilyChoice,
        direction: Direction,
    ) -> Result<(Arc<LoadedKernel>, CacheSource, String), RuntimeError> {
        let gpu = &self.inner.gpu;
        let key = kernel_key(spec, gpu.arch.name(), family, direction, gpu.info.driver_version);
        let producer = KernelProducer { gpu, spec, family, direction };
        let (loaded, source) = self.inner.kernels.get_or_build(&key, &producer)?;
        Ok((loaded, source, key.hex()))
    }

    // ------------------------------------------------------------------ tensors

    /// An uninitialized tensor (row-major).
    pub fn alloc(&self, dtype: ElemType, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| RuntimeError::Other(format!("shape {shape:?} overflows")))?;
        let bytes =
            n.checked_mul(dtype.bytes()).ok_or_else(|| RuntimeError::Other(format!("shape {shape:?} overflows")))?;
        let buf = self.inner.gpu.alloc_bytes(bytes)?;
        Ok(Tensor::from_buffer(buf, dtype, shape))
    }

    /// Uploads row-major host data.
    pub fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(RuntimeError::Other(format!("upload: {} values for shape {shape:?}", data.len())));
        }
        let t = self.alloc(T::TYPE, shape)?;
        // SAFETY: T is a plain numeric type; reading its bytes is fine.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) };
        self.inner.gpu.htod(t.device_ptr(), bytes)?;
        Ok(t)
    }

    /// Uploads f64 values converted to `dtype` (round to nearest).
    pub fn upload_f64(&self, dtype: ElemType, data: &[f64], shape: &[usize]) -> Result<Tensor, RuntimeError> {
        match dtype {
            ElemType::Bf16 => self.upload(&data.iter().map(|&x| half::bf16::from_f64(x)).collect::<Vec<_>>(), shape),
            ElemType::F16 => self.upload(&data.iter().map(|&x| half::f16::from_f64(x)).collect::<Vec<_>>(), shape),
            ElemType::F32 => self.upload(&data.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape),
            ElemType::I32 => self.upload(&data.iter().map(|&x| x as i32).collect::<Vec<_>>(), shape),
        }
    }

    /// An i32 tensor that keeps its host copy (cu_seqlens, block tables, seqused_k).
    pub fn upload_index(&self, data: &[i32], shape: &[usize]) -> Result<IndexTensor, RuntimeError> {
        let tensor = self.upload(data, shape)?;
        Ok(IndexTensor { tensor, host: Arc::new(data.to_vec()) })
    }

    /// Downloads a tensor's elements in row-major order of its view.
    pub fn download<T: Element>(&self, t: &Tensor) -> Result<Vec<T>, RuntimeError> {
        if t.dtype() != T::TYPE {
            return Err(RuntimeError::Other(format!("download: tensor is {}, asked for {}", t.dtype(), T::TYPE)));
        }
        let span =
            usize::try_from(t.desc().span()).map_err(|_| RuntimeError::Other("download: view too large".into()))?;
        let mut raw = vec![T::default(); span];
        // SAFETY: plain numeric type; the view's span lies in its allocation (Tensor::view checks).
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(raw.as_mut_ptr() as *mut u8, std::mem::size_of_val(raw.as_slice()))
        };
        self.inner.gpu.dtoh(bytes, t.device_ptr())?;
        if t.is_contiguous() {
            return Ok(raw);
        }
        // Gather the view.
        let shape = t.shape();
        let strides = t.strides();
        let n = t.numel();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; shape.len()];
        for _ in 0..n {
            let off: usize = idx.iter().zip(strides).map(|(i, s)| i * s).sum();
            out.push(raw[off]);
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }

    /// Downloads any floating/int tensor as f64.
    pub fn download_f64(&self, t: &Tensor) -> Result<Vec<f64>, RuntimeError> {
        Ok(match t.dtype() {
            ElemType::Bf16 => self.download::<half::bf16>(t)?.into_iter().map(|x| x.to_f64()).collect(),
            ElemType::F16 => self.download::<half::f16>(t)?.into_iter().map(|x| x.to_f64()).collect(),
            ElemType::F32 => self.download::<f32>(t)?.into_iter().map(f64::from).collect(),
            ElemType::I32 => self.download::<i32>(t)?.into_iter().map(f64::from).collect(),
        })
    }

    /// Fills a tensor's whole allocation with NaN (poisoning outputs before a test).
    pub fn fill_nan(&self, t: &Tensor) -> Result<(), RuntimeError> {
        let buf = &t.buf;
        match t.dtype() {
            ElemType::Bf16 => self.inner.gpu.memset_d16(buf.ptr(), 0x7fc0, buf.bytes() / 2)?,
            ElemType::F16 => self.inner.gpu.memset_d16(buf.ptr(), 0x7e00, buf.bytes() / 2)?,
            ElemType::F32 | ElemType::I32 => self.inner.gpu.memset_d32(buf.ptr(), 0x7fc0_0000, buf.bytes() / 4)?,
        }
        Ok(())
    }

    /// Waits for all queued work; reports asynchronous kernel faults.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.inner.gpu.synchronize()
    }

    /// `count` zeroed u32 counters for a launch on `queue`'s stream, locked for the call
    /// (`Pools::counters`).
    pub(crate) fn counters(&self, count: usize, queue: &Queue) -> Result<Workspace<'_>, RuntimeError> {
        self.inner.pools.counters(&self.inner.gpu, count, queue)
    }

    /// `bytes` of workspace for a call queued on `queue` (`Pools::workspace`).
    pub(crate) fn workspace(
        &self,
        bytes: usize,
        queue: &Queue,
        given: Option<&Tensor>,
    ) -> Result<Workspace<'_>, RuntimeError> {
        self.inner.pools.workspace(&self.inner.gpu, bytes, queue, given)
    }

    /// The [`Stream`] of a cudarc stream, checked to be of this runtime's context.
    pub fn stream_of(&self, stream: &cudarc::driver::CudaStream) -> Result<Stream, RuntimeError> {
        if !self.inner.gpu.owns_context(stream.context()) {
            return Err(RuntimeError::Other(format!(
                "the stream is of another CUDA context than device {}'s primary context",
                self.inner.gpu.info.ordinal
            )));
        }
        Ok(Stream::of_cudarc(stream))
    }

    /// A tensor over a cudarc slice (`shape`, row-major), read by work queued on `stream`
    /// (pass `self.stream_of(stream)` in [`Params::on_stream`]): cudarc's stream ordering
    /// sees the read when the returned [`Borrowed`] drops, after the launch.
    pub fn borrow<'a, T: Element, S: cudarc::driver::DevicePtr<T>>(
        &self,
        slice: &'a S,
        stream: &'a cudarc::driver::CudaStream,
        shape: &[usize],
    ) -> Result<Borrowed<'a>, RuntimeError> {
        self.check_slice_context(slice.stream().context())?;
        let len = slice.len();
        let (ptr, sync) = slice.device_ptr(stream);
        self.borrowed::<T>(ptr, len, shape, sync)
    }

    /// [`Runtime::borrow`] for an output: the kernel writes the slice.
    pub fn borrow_mut<'a, T: Element, S: cudarc::driver::DevicePtrMut<T>>(
        &self,
        slice: &'a mut S,
        stream: &'a cudarc::driver::CudaStream,
        shape: &[usize],
    ) -> Result<Borrowed<'a>, RuntimeError> {
        self.check_slice_context(slice.stream().context())?;
        let len = slice.len();
        let (ptr, sync) = slice.device_ptr_mut(stream);
        self.borrowed::<T>(ptr, len, shape, sync)
    }

    /// The row-major `shape` view of `len` elements of a cudarc slice at `ptr`, holding
    /// cudarc's stream-ordering guard until the borrow ends.
    fn borrowed<'a, T: Element>(
        &self,
        ptr: u64,
        len: usize,
        shape: &[usize],
        sync: cudarc::driver::SyncOnDrop<'a>,
    ) -> Result<Borrowed<'a>, RuntimeError> {
        // SAFETY: `ptr` is the slice's, which holds `len` elements of T and outlives `'a`,
        // for which the caller's borrow keeps it (and `Borrowed` is tied to it).
        let tensor = unsafe {
            Tensor::from_raw_parts(self.inner.gpu.info.ordinal, ptr, T::TYPE, shape, &contiguous_strides(shape), len)?
        };
        Ok(Borrowed { tensor, _sync: sync })
    }

    fn check_slice_context(&self, ctx: &cudarc::driver::CudaContext) -> Result<(), RuntimeError> {
        if self.inner.gpu.owns_context(ctx) {
            return Ok(());
        }
        Err(RuntimeError::Other(format!(
            "the slice is of another CUDA context than device {}'s primary context",
            self.inner.gpu.info.ordinal
        )))
    }
}

/// A [`Tensor`] over a cudarc slice for the length of the borrow ([`Runtime::borrow`]).
pub struct Borrowed<'a> {
    tensor: Tensor,
    _sync: cudarc::driver::SyncOnDrop<'a>,
}

impl std::ops::Deref for Borrowed<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl std::ops::DerefMut for Borrowed<'_> {
    fn deref_mut(&mut self) -> &mut Tensor {
        &mut self.tensor
    }
}

/// A compiled kernel of one spec on one device.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) rt: Runtime,
    pub(crate) spec: Spec,
    /// The family choice it was made with; the backward resolves its family with it.
    pub(crate) family: FamilyChoice,
    pub(crate) loaded: Arc<LoadedKernel>,
    source: CacheSource,
    shape: KernelShape,
    key: String,
    /// The key block masks are built and checked under: the module's own, or for the LSE
    /// twin of a spec (`forward_lse`), its parent's — the same mask, so a mask built with
    /// either kernel serves both (its tiling and shapes are checked as well).
    mask_key: String,
    /// Loaded on first use: the forward of the spec with `lse` on (training needs the
    /// LSE of specs that do not ask for it), and the backward module.
    lse_forward: Arc<OnceLock<Kernel>>,
    pub(crate) backward: Arc<OnceLock<(Arc<LoadedKernel>, CacheSource)>>,
    /// The last forward launch, replayed when a call repeats it exactly (`launch_memo`).
    memo: Arc<Mutex<Option<LaunchMemo>>>,
    /// The last backward launch, replayed the same way (`launch_memo::BackwardMemo`).
    pub(crate) backward_memo: Arc<Mutex<Option<BackwardMemo>>>,
    /// The sharded twin (`Spec::shards`) that runs launches on shards of longer
    /// sequences when the variant reads positions (loaded on first use).
    sharded: Arc<OnceLock<Kernel>>,
    /// The decode twin (`QueryRows::OneTile`) for launches of at most one query tile per
    /// batch entry and head, loaded on first use (`None`: it did not build, the kernel
    /// itself serves those launches).
    one_tile: Arc<OnceLock<Option<Kernel>>>,
    /// Sink logits of −∞ (`[q_heads]` f32), made on first use: what a shard that leaves
    /// the sink to another key shard passes instead of the caller's sinks.
    no_sink: Arc<OnceLock<Tensor>>,
    /// Why this kernel stands in for the dispatcher's (`Runtime::kernel_ready_first`):
    /// its receipts give it as the fallback reason, requested "auto".
    pub(crate) interim: Option<String>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({}, {:?}, {})", self.spec.name, self.loaded, self.source)
    }
}

impl Kernel {
    pub fn spec(&self) -> &Spec {
        &self.spec
    }
    /// Where `Runtime::kernel` found it.
    pub fn source(&self) -> CacheSource {
        self.source
    }
    /// The cache key (hex).
    pub fn key(&self) -> &str {
        &self.key
    }
    pub fn family(&self) -> &str {
        &self.loaded.meta.family
    }
    /// Why the family that runs is not the first choice: an interim kernel's reason, or
    /// the dispatcher's.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.interim.as_deref().or(self.loaded.meta.fallback_reason.as_deref())
    }
    /// This interim kernel with another reason (e.g. the dispatcher's module failed to
    /// build and it stays); a kernel that is not interim is returned unchanged.
    pub fn with_interim_reason(&self, reason: String) -> Kernel {
        let mut k = self.clone();
        if k.interim.is_some() {
            k.interim = Some(reason);
        }
        k
    }
    /// The family request and fallback reason a receipt of `meta`'s module gives: an
    /// interim kernel's launches were asked for as `auto` and name why portable runs.
    pub(crate) fn receipt_choice(&self, meta: &crate::jit::ModuleMeta) -> (String, Option<String>) {
        match &self.interim {
            Some(why) => (FamilyChoice::Auto.name().to_string(), Some(why.clone())),
            None => (meta.requested.clone(), meta.fallback_reason.clone()),
        }
    }
    /// Whether this kernel stands in for the dispatcher's while that compiles
    /// (`Runtime::kernel_ready_first`).
    pub fn is_interim(&self) -> bool {
        self.interim.is_some()
    }
    pub fn ptx(&self) -> &str {
        &self.loaded.ptx
    }
    pub fn meta(&self) -> &crate::jit::ModuleMeta {
        &self.loaded.meta
    }
    pub fn build_times(&self) -> crate::jit::BuildTimes {
        self.loaded.times
    }
    pub fn image(&self) -> Image {
        self.loaded.image
    }
    pub fn shape(&self) -> KernelShape {
        self.shape
    }

    /// Attention forward: `out = attention(q, k, v)` with the layout of the spec.
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        params: &Params,
    ) -> Result<Receipt, RuntimeError> {
        self.run(q, k, v, out, None, params).map(Arc::unwrap_or_clone)
    }

    /// [`Kernel::forward`] that also writes the LSE, f32 `[batch, q_heads, seqlen_q]`
    /// (varlen `[q_heads, total_q]`): what [`Kernel::backward`] needs. For a spec without
    /// `lse`, the same spec with `lse` on is compiled (once, cached) and runs.
    pub fn forward_lse(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: &mut Tensor,
        params: &Params,
    ) -> Result<Receipt, RuntimeError> {
        self.forward_shared(q, k, v, out, Some(lse), params).map(Arc::unwrap_or_clone)
    }

    /// [`Kernel::forward`] (with the LSE when `lse` is given) whose receipt is shared with
    /// the launch memo: a repeated launch hands back the remembered receipt without copying
    /// it. For callers that launch per token (the Python package's eager path).
    pub fn forward_shared(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: Option<&mut Tensor>,
        params: &Params,
    ) -> Result<Arc<Receipt>, RuntimeError> {
        match lse {
            Some(lse) if !self.spec.lse => self.lse_forward()?.run(q, k, v, out, Some(lse), params),
            lse => self.run(q, k, v, out, lse, params),
        }
    }

    /// A shard that leaves the sink to another key shard (`ShardPositions::sinks` false)
    /// reads sink logits of −∞: its softmax takes no sink, and its sink gradient is 0.
    pub(crate) fn shard_sinks(&self, args: &mut [(String, ArgValue)], params: &Params) -> Result<(), RuntimeError> {
        if !self.spec.sinks || params.takes_sink() {
            return Ok(());
        }
        let no_sink = match self.no_sink.get() {
            Some(t) => t,
            None => {
                let t = self.rt.alloc(ElemType::F32, &[self.spec.q_heads as usize])?;
                self.rt.gpu().memset_d32(t.device_ptr(), f32::NEG_INFINITY.to_bits(), t.numel())?;
                // A racing caller may have set it first: either holds the same values.
                let _ = self.no_sink.set(t);
                self.no_sink.get().ok_or_else(|| RuntimeError::Other("the sink buffer did not initialize".into()))?
            }
        };
        for (n, v) in args.iter_mut() {
            if n == "sinks" {
                *v = ArgValue::Ptr(no_sink.device_ptr());
            }
        }
        Ok(())
    }

    /// The kernel that runs a launch with `params`: this one, or — for a launch on a shard
    /// of longer sequences (`Params::positions`) of a variant whose expressions read
    /// positions — its sharded twin, whose kernels take the shard's place as launch values
    /// (compiled once, cached; the variant itself pays nothing for it). Block masks built
    /// through either serve both (the twin's masks are keyed by the parent's key).
    pub(crate) fn for_launch(&self, params: &Params) -> Result<&Kernel, RuntimeError> {
        if !params.is_shard() || self.spec.shards || !self.spec.reads_positions() {
            return Ok(self);
        }
        if let Some(k) = self.sharded.get() {
            return Ok(k);
        }
        let mut spec = self.spec.clone();
        spec.shards = true;
        let mut k = self.rt.kernel_with(&spec, self.family)?;
        k.mask_key = format!("{} shards", self.mask_key);
        k.interim = self.interim.clone();
        // A racing caller may have set it first: either is the same module.
        let _ = self.sharded.set(k);
        self.sharded.get().ok_or_else(|| RuntimeError::Other("the sharded kernel did not load".into()))
    }

    /// The kernel that runs a forward of `q`'s shape: this one, or — when each batch entry
    /// has at most one query tile of packed rows (decode) and the module's family builds
    /// a smaller schedule for that (hopper: one consumer warpgroup, 64-key tiles) — the
    /// variant's one-tile twin (`QueryRows::OneTile`), compiled once and cached. The
    /// receipt's config shows which ran. A twin that does not build leaves every launch to
    /// this kernel.
    fn for_rows(&self, q: &Tensor) -> &Kernel {
        // K/V by TMA (contiguous, or pages TMA boxes follow) always; K/V gathered row by
        // row (paged KV of other page sizes) only for small launches (a quarter of the
        // SMs or fewer before splitting, where the split-KV walks are short): the gather
        // producer measured faster with the twin at batch 1 and slower at batch 8 and 64
        // (docs/hopper.md, "Decode").
        let heads = if self.spec.pack_gqa { self.spec.kv_heads } else { self.spec.q_heads } as usize;
        let ctas = q.shape().first().map_or(usize::MAX, |&b| b.saturating_mul(heads));
        let small = ctas.saturating_mul(4) <= self.rt.inner.gpu.info.usable_sm_count as usize;
        let group = if self.spec.pack_gqa { self.spec.group_size() as usize } else { 1 };
        let rows = q.shape().get(1).map_or(usize::MAX, |&s| s.saturating_mul(group));
        let fits = rows <= ONE_TILE_ROWS && (self.loaded.forward_loads_kv_by_tma || small);
        match fits.then(|| self.one_tile_twin()).flatten() {
            Some(twin) => twin,
            None => self,
        }
    }

    /// The one-tile twin of this kernel (loaded on first use), when its family builds one
    /// for the spec: hopper, contiguous or paged KV, no block mask, not itself a twin.
    fn one_tile_twin(&self) -> Option<&Kernel> {
        let eligible = self.spec.query_rows == QueryRows::Any
            && matches!(self.spec.kv_layout, KvLayout::Contiguous | KvLayout::Paged { .. })
            && !self.spec.shards
            && self.loaded.meta.family == FamilyKind::Hopper.name()
            && !attnc_ir::block_mask::needs_block_mask(&self.spec);
        if !eligible {
            return None;
        }
        self.one_tile
            .get_or_init(|| {
                let mut spec = self.spec.clone();
                spec.query_rows = QueryRows::OneTile;
                // Only a hopper twin: one that fell back to another family would be slower.
                self.rt.kernel_with(&spec, self.family).ok().filter(|k| k.loaded.meta.family == self.loaded.meta.family)
            })
            .as_ref()
    }

    /// Makes every module this kernel's launches may need ready now (compiled or loaded
    /// into the disk and memory caches): the forward, its one-tile decode twin, and for a
    /// variant that trains the LSE forward and the backward. `attnc warm` runs this over a
    /// folder of variants before deployment, so no first call pays a compile. Returns
    /// each module with where it came from.
    pub fn warm(&self) -> Result<Vec<Warmed>, RuntimeError> {
        let of = |what: &'static str, k: &Kernel| Warmed { what, family: k.family().to_string(), source: k.source() };
        let mut out = vec![of("forward", self)];
        if let Some(twin) = self.one_tile_twin() {
            out.push(of("forward, one-tile decode twin", twin));
        }
        if attnc_lower::compile::pass_unsupported_reason(&self.spec, Direction::Backward).is_none() {
            if !self.spec.lse {
                out.push(of("forward with LSE (training)", self.lse_forward()?));
            }
            let (loaded, source) = self.backward_module()?;
            out.push(Warmed { what: "backward", family: loaded.meta.family.clone(), source });
        }
        Ok(out)
    }

    /// The kernel of this spec with `lse` on (loaded on first use).
    fn lse_forward(&self) -> Result<&Kernel, RuntimeError> {
        if let Some(k) = self.lse_forward.get() {
            return Ok(k);
        }
        let mut spec = self.spec.clone();
        spec.lse = true;
        let mut k = self.rt.kernel_with(&spec, self.family)?;
        k.mask_key = self.mask_key.clone();
        k.memo = Arc::new(Mutex::new(None));
        k.backward_memo = Arc::new(Mutex::new(None));
        k.interim = self.interim.clone();
        // A racing caller may have set it first: either is the same module.
        let _ = self.lse_forward.set(k);
        self.lse_forward.get().ok_or_else(|| RuntimeError::Other("the LSE forward did not load".into()))
    }

    /// Classifies the mask's tiles for this launch (shapes, params, aux tensors) once, for
    /// every forward that shares them: pass the result in [`Params::block_mask`]. Errors
    /// for a spec whose mask needs no block mask (one whose module has no classifier).
    pub fn block_mask(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        params: &Params,
    ) -> Result<BlockMask, RuntimeError> {
        let this = self.for_launch(params)?;
        if !std::ptr::eq(this, self) {
            return this.block_mask(q, k, v, out, params);
        }
        let plan = self.plan_to_classify(q, k, v, out, params)?;
        self.build_block_mask(&plan, params, &self.rt.gpu().queue(params.stream), None)
    }

    /// Classifies again into `mask`'s own storage (the bench's GPU time of the
    /// classification alone, without an allocation): `mask` must serve this launch.
    pub(crate) fn reclassify(
        &self,
        mask: &BlockMask,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        params: &Params,
    ) -> Result<(), RuntimeError> {
        let this = self.for_launch(params)?;
        if !std::ptr::eq(this, self) {
            return this.reclassify(mask, q, k, v, out, params);
        }
        let plan = self.plan_to_classify(q, k, v, out, params)?;
        self.check_block_mask(mask, &plan, params)?;
        let queue = self.rt.gpu().queue(params.stream);
        self.build_block_mask(&plan, params, &queue, Some(mask.lists.device_ptr())).map(|_| ())
    }

    pub(crate) fn block_mask_built_for(&self, plan: &LaunchPlan, params: &Params) -> Result<BuiltFor, RuntimeError> {
        let kernel = self;
        let meta = kernel.meta();
        let classify = meta
            .kernel(KernelRole::BlockClassify)
            .ok_or_else(|| RuntimeError::Abi("this module has no block classifier".into()))?;
        let spec = kernel.spec();
        let tiling = Tiling { block_m: classify.block_m, block_n: classify.block_n, pack_gqa: spec.pack_gqa };
        let layout = match classify.grid {
            attnc_lower::Grid::BlockRows { layout } => layout,
            other => return Err(RuntimeError::Abi(format!("block classifier with grid {other:?}"))),
        };
        let dims = crate::block_mask::with_bit_slots(
            BlockDims::new(spec, tiling, plan.batch, plan.max_seqlen_q, plan.max_seqlen_k),
            layout,
        );
        let mut aux: Vec<(String, u64)> = params.aux.iter().map(|(n, t)| (n.clone(), t.device_ptr())).collect();
        aux.sort();
        let mut values: Vec<(String, String)> =
            params.values.iter().map(|(n, v)| (n.clone(), format!("{v:?}"))).collect();
        values.sort();
        // A shard's place in its sequence decides its tiles like a param.
        if let Some(p) = params.positions {
            values.push(("<positions>".into(), format!("{p:?}")));
        }
        if let Some((t, sink)) = params.sequence_positions {
            values.push(("<sequence positions>".into(), format!("{:?} {sink}", t.host())));
        }
        Ok(BuiltFor {
            module_key: kernel.mask_key.clone(),
            tiling,
            layout,
            dims,
            seqlens: launch_seqlens(plan, params.cu_seqlens_q, params.cu_seqlens_k, params.seqused_k),
            aux,
            params: values,
        })
    }

    /// Runs the classifier for a validated launch.
    /// Runs the classifier for a validated launch, into `storage` (a device address with
    /// room for the lists: a per-call mask in the call's workspace) or a new allocation (a
    /// mask the caller keeps).
    fn build_block_mask(
        &self,
        plan: &LaunchPlan,
        params: &Params,
        queue: &Queue,
        storage: Option<u64>,
    ) -> Result<BlockMask, RuntimeError> {
        let kernel = self;
        let bf = self.block_mask_built_for(plan, params)?;
        let meta = kernel.meta();
        let classify = meta
            .kernel(KernelRole::BlockClassify)
            .ok_or_else(|| RuntimeError::Abi("this module has no block classifier".into()))?;
        let f = kernel
            .loaded
            .function(KernelRole::BlockClassify)
            .ok_or_else(|| RuntimeError::Abi("the block classifier did not load".into()))?;
        let d = bf.dims;
        let words = bf.words().max(1);
        let lists = match storage {
            // SAFETY: the caller sized its workspace for `words` i32 from `ptr` and holds it
            // until the launches that read the lists are queued (they run before the
            // stream's next user of the workspace).
            Some(ptr) => unsafe {
                Tensor::from_raw_parts(
                    self.rt.device().ordinal,
                    ptr,
                    crate::elem::ElemType::I32,
                    &[words],
                    &[1],
                    words,
                )?
            },
            None => kernel.rt.alloc(crate::elem::ElemType::I32, &[words])?,
        };
        let mask = BlockMask::new(bf, lists);
        let layout = mask.layout();
        let mut extra = mask.args().to_vec();
        extra.extend(crate::block_mask::queue_arg(mask.lists.device_ptr(), d, layout).map(|(arg, _)| arg));
        let args = marshal(&classify.params, plan, &extra).map_err(RuntimeError::Abi)?;
        let gpu = kernel.rt.gpu();
        let launch = crate::block_mask::ClassifierLaunch::new(
            d,
            mask.tiling(),
            layout,
            mask.lists.device_ptr(),
            gpu.info.usable_sm_count,
        );
        // With bits, the kernel that evaluates the queued partial tiles.
        let bits = match meta.kernel(KernelRole::BlockBits) {
            Some(k) => {
                let f = kernel
                    .loaded
                    .function(KernelRole::BlockBits)
                    .ok_or_else(|| RuntimeError::Abi("the block mask bits kernel did not load".into()))?;
                Some((f, k, marshal(&k.params, plan, &extra).map_err(RuntimeError::Abi)?))
            }
            None => None,
        };
        let timing = params.timing;
        let events = if timing { Some((gpu.event()?, gpu.event()?)) } else { None };
        if let Some((a, _)) = &events {
            queue.record(a)?;
        }
        if d.batch > 0 && d.m_tiles > 0 {
            if let Some(count_at) = launch.queue_count {
                queue.memset_d32(count_at, 0, 1)?;
            }
            queue.launch(f, launch.grid, classify.threads_per_block, launch.smem, &args)?;
            if let Some((f, k, args)) = &bits {
                if !launch.bits_grid.contains(&0) {
                    queue.launch(f, launch.bits_grid, k.threads_per_block, k.dynamic_smem_bytes, args)?;
                }
            }
        }
        let mut mask = mask;
        if let Some((a, b)) = &events {
            queue.record(b)?;
            mask.classify_ms = Some(f64::from(gpu.elapsed_ms(a, b)?));
        }
        Ok(mask)
    }

    /// Checks that `mask` was built for this launch (typed error otherwise).
    pub(crate) fn check_block_mask(
        &self,
        mask: &BlockMask,
        plan: &LaunchPlan,
        params: &Params,
    ) -> Result<(), RuntimeError> {
        mask.built_for.check_serves(&self.block_mask_built_for(plan, params)?)
    }

    /// A block mask's row lists as the kernels read them (`[batch][slot][m_tiles][1 +
    /// n_tiles]`: count, then entries).
    pub fn block_mask_lists(&self, mask: &BlockMask) -> Result<Vec<u32>, RuntimeError> {
        Ok(self.rt.download::<i32>(&mask.lists)?.into_iter().map(|x| x as u32).collect())
    }

    /// Non-empty key tiles over the key tiles inside the sequences (downloads the lists).
    pub fn block_mask_live_fraction(&self, mask: &BlockMask) -> Result<f64, RuntimeError> {
        let group = if self.spec.pack_gqa { self.spec.group_size().max(1) as usize } else { 1 };
        Ok(mask.live_fraction_of(&self.block_mask_lists(mask)?, group))
    }

    /// The workspace bytes a forward with these arguments needs (split-KV partials, and the
    /// per-call tile lists of a mask over aux tensors without a [`Params::block_mask`]); pass
    /// a buffer of at least that in [`Params::workspace`] to keep the call off the pool.
    pub fn forward_workspace_bytes(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        params: &Params,
    ) -> Result<usize, RuntimeError> {
        // The kernel that will run this launch (a shard's twin, a decode twin) sizes it.
        let this = self.for_launch(params)?.for_rows(q);
        Ok(this.forward_workspace(&this.plan(q, k, v, out, None, params)?, params)?.bytes)
    }

    /// The forward's workspace: the split-KV partials `o_partial` (f32), `lse_partial` at
    /// `lse_off`, and — for a mask over aux tensors without a [`Params::block_mask`] — the
    /// per-call tile lists at `lists_off` (no allocation on the launch path). Offsets
    /// 256-byte aligned.
    fn forward_workspace(&self, plan: &LaunchPlan, params: &Params) -> Result<ForwardWorkspace, RuntimeError> {
        let (split_bytes, lse_off) = if plan.num_splits > 1 {
            let lse_off = (plan.o_partial_elems * 4).div_ceil(256) * 256;
            (lse_off + plan.lse_partial_elems * 4, lse_off)
        } else {
            (0, 0)
        };
        let takes_lists = self.loaded.forward_takes_lists;
        let list_bytes = match (takes_lists, params.block_mask) {
            (true, None) => self.block_mask_built_for(plan, params)?.words().max(1) * 4,
            _ => 0,
        };
        let lists_off = split_bytes.div_ceil(256) * 256;
        let bytes = if list_bytes > 0 { lists_off + list_bytes } else { split_bytes };
        Ok(ForwardWorkspace { bytes, lse_off, lists_off })
    }

    /// Validates a launch without running it.
    pub fn plan(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: Option<&Tensor>,
        params: &Params,
    ) -> Result<LaunchPlan, RuntimeError> {
        self.plan_for(&self.spec, q, k, v, out, lse, params)
    }

    /// The plan of a classification alone ([`Kernel::block_mask`]): every tensor checked
    /// as for the forward except the LSE, which the classifier does not read (a spec that
    /// writes the LSE would otherwise refuse a block mask built without one).
    fn plan_to_classify(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        params: &Params,
    ) -> Result<LaunchPlan, RuntimeError> {
        if !self.spec.lse {
            return self.plan(q, k, v, out, None, params);
        }
        let without_lse = Spec { lse: false, ..self.spec.clone() };
        self.plan_for(&without_lse, q, k, v, out, None, params)
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_for(
        &self,
        spec: &Spec,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: Option<&Tensor>,
        params: &Params,
    ) -> Result<LaunchPlan, RuntimeError> {
        let descs = LaunchDescs {
            q: q.desc(),
            k: k.desc(),
            v: v.desc(),
            o: out.desc(),
            lse: lse.map(|l| l.desc()),
            cu_seqlens_q: params.cu_seqlens_q.map(|t| t.host_index()),
            cu_seqlens_k: params.cu_seqlens_k.map(|t| t.host_index()),
            block_table: params.block_table.map(|t| t.host_index()),
            seqused_k: params.seqused_k.map(|t| t.host_index()),
            sinks: params.sinks.map(|t| t.desc()),
            aux: params.aux.iter().map(|(n, t)| (n.clone(), t.desc())).collect(),
            params: params.values.clone(),
            num_splits: params.num_splits,
            positions: params.positions,
            sequence_positions: params.sequence_positions.map(|(t, _)| t.host_index()),
        };
        let info = &self.rt.inner.gpu.info;
        let mut p = plan(spec, &self.shape, info.usable_sm_count, info.ordinal, &descs)?;
        self.shard_sinks(&mut p.args, params)?;
        // The forward kernel's tensor maps: every precondition of cuTensorMapEncodeTiled
        // is checked here, so a plan that passes encodes (the driver runs at launch).
        if !p.empty {
            if let Some(fwd) = self.loaded.meta.forward() {
                p.tensor_maps = crate::tma::plan_tensor_maps(&fwd.tensor_maps, &descs)?;
            }
        }
        Ok(p)
    }

    fn run(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Tensor,
        lse: Option<&mut Tensor>,
        params: &Params,
    ) -> Result<Arc<Receipt>, RuntimeError> {
        let this = self.for_launch(params)?;
        if !std::ptr::eq(this, self) {
            return this.run(q, k, v, out, lse, params);
        }
        let this = self.for_rows(q);
        if !std::ptr::eq(this, self) {
            return this.run(q, k, v, out, lse, params);
        }
        let lse = lse.map(|l| &*l);
        let gpu = &self.rt.inner.gpu;
        let meta = &self.loaded.meta;
        let fwd = meta.forward().ok_or_else(|| RuntimeError::Abi("no forward kernel".into()))?;
        let takes_lists = self.loaded.forward_takes_lists;
        let memo_serves = !params.timing && (!takes_lists || params.block_mask.is_some());
        let signature = memo_serves.then(|| LaunchSignature::of(q, k, v, out, lse, params));
        if let Some(sig) = &signature {
            if let Some(r) = self.replay(sig, params)? {
                return Ok(r);
            }
        }
        let plan = self.plan(q, k, v, out, lse, params)?;
        let (requested, fallback_reason) = self.receipt_choice(meta);
        let mut receipt = Receipt {
            spec: self.spec.name.clone(),
            direction: Direction::Forward,
            requested,
            executed: meta.family.clone(),
            arch: meta.arch.clone(),
            device: gpu.info.name.clone(),
            config: KernelConfig {
                kernel: fwd.name.clone(),
                block_m: fwd.block_m,
                block_n: fwd.block_n,
                threads: fwd.threads_per_block,
                smem_bytes: fwd.dynamic_smem_bytes,
                registers: self.loaded.main_regs,
                ctas_per_sm: self.loaded.main_ctas_per_sm,
            },
            image: match self.loaded.image {
                Image::Cubin => format!("cubin ({})", meta.compiler),
                Image::Ptx => "ptx (driver JIT at load)".into(),
            },
            kernel_source: self.source,
            batch: plan.batch,
            max_seqlen_q: plan.max_seqlen_q,
            max_seqlen_k: plan.max_seqlen_k,
            grid: plan.fwd_grid,
            num_splits: plan.num_splits,
            split_reason: plan.split_reason.clone(),
            combine_grid: plan.combine_grid,
            fallback_reason,
            skipped: None,
            deterministic: None,
            dq_accumulation: None,
            dq_accumulation_reason: None,
            block_mask: None,
            timings: None,
        };
        if plan.empty {
            receipt.skipped = Some("no batch entry or no query row: nothing to compute".into());
            return Ok(Arc::new(receipt));
        }

        let queue = gpu.queue(params.stream);
        let ForwardWorkspace { bytes: ws_bytes, lse_off, lists_off } = self.forward_workspace(&plan, params)?;
        let ws_guard = self.rt.workspace(ws_bytes, &queue, params.workspace)?;
        let ws = ws_guard.ptr();
        let maps = plan
            .tensor_maps
            .iter()
            .map(|e| Ok((e.param.as_str(), ArgValue::TensorMap(crate::tma::encode(gpu, e)?))))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let split = plan.num_splits > 1;
        let counters = self.rt.counters(plan.counters, &queue)?;
        let mut extra = vec![
            ("o_partial", ArgValue::Ptr(if split { ws } else { 0 })),
            ("lse_partial", ArgValue::Ptr(if split { ws + lse_off as u64 } else { 0 })),
            (SPLIT_COUNTERS_PARAM, ArgValue::Ptr(counters.ptr())),
            (TILE_COUNTERS_PARAM, ArgValue::Ptr(counters.ptr())),
        ];
        extra.extend(maps);
        // Block mask: the caller's (checked against this launch) or one built now.
        let per_call = match (takes_lists, params.block_mask) {
            (false, _) => None,
            (true, Some(m)) => {
                self.check_block_mask(m, &plan, params)?;
                None
            }
            (true, None) => Some(self.build_block_mask(&plan, params, &queue, Some(ws + lists_off as u64))?),
        };
        let mask = per_call.as_ref().or(params.block_mask).filter(|_| takes_lists);
        if let Some(m) = mask {
            extra.extend(m.args());
            let mut usage =
                m.usage(if per_call.is_some() { BlockMaskSource::BuiltPerCall } else { BlockMaskSource::PassedIn });
            if params.timing {
                usage.live_fraction = Some(self.block_mask_live_fraction(m)?);
            }
            receipt.block_mask = Some(usage);
        }
        let fwd_args = ArgSlots::pack(&marshal(&fwd.params, &plan, &extra).map_err(RuntimeError::Abi)?);
        let combine = match (plan.combine_grid, meta.combine(), self.loaded.function(KernelRole::Combine)) {
            (Some(grid), Some(cm), Some(cf)) => {
                Some((grid, cm, cf, ArgSlots::pack(&marshal(&cm.params, &plan, &extra).map_err(RuntimeError::Abi)?)))
            }
            (Some(_), _, _) => {
                return Err(RuntimeError::Abi("split-KV launch but the module has no combine kernel".into()))
            }
            _ => None,
        };

        let events = if params.timing { Some((gpu.event()?, gpu.event()?, gpu.event()?)) } else { None };
        if let Some((a, _, _)) = &events {
            queue.record(a)?;
        }
        let fwd_fn =
            self.loaded.function(KernelRole::Forward).ok_or_else(|| RuntimeError::Abi("no forward kernel".into()))?;
        queue.launch_packed(fwd_fn, plan.fwd_grid, fwd.threads_per_block, fwd.dynamic_smem_bytes, &fwd_args)?;
        if let Some((_, b, _)) = &events {
            queue.record(b)?;
        }
        if let Some((grid, cm, cf, args)) = &combine {
            queue.launch_packed(cf, *grid, cm.threads_per_block, cm.dynamic_smem_bytes, args)?;
        }
        if let Some((a, b, c)) = &events {
            queue.record(c)?;
            let f = f64::from(gpu.elapsed_ms(a, b)?);
            let total = f64::from(gpu.elapsed_ms(a, c)?);
            receipt.timings =
                Some(Timings { main_ms: f, combine_ms: combine.as_ref().map(|_| total - f), total_ms: total });
        }
        drop(ws_guard);
        let counters_ptr = counters.ptr();
        drop(counters);
        let receipt = Arc::new(receipt);
        if let Some(signature) = signature {
            let memo = LaunchMemo {
                signature,
                ws_bytes,
                ws_ptr: ws,
                counters: plan.counters,
                counters_ptr,
                fwd_args,
                combine_args: combine.map(|c| c.3),
                receipt: Arc::clone(&receipt),
            };
            *self.memo.lock().unwrap_or_else(|e| e.into_inner()) = Some(memo);
        }
        Ok(receipt)
    }

    /// Launches the remembered launch when `sig` is its signature and the workspace it
    /// used is still this call's; `None` otherwise.
    fn replay(&self, sig: &LaunchSignature, params: &Params) -> Result<Option<Arc<Receipt>>, RuntimeError> {
        let memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = memo.as_ref().filter(|m| m.signature == *sig) else { return Ok(None) };
        let meta = &self.loaded.meta;
        let (Some(fwd), Some(fwd_fn)) = (meta.forward(), self.loaded.function(KernelRole::Forward)) else {
            return Ok(None);
        };
        let queue = self.rt.inner.gpu.queue(params.stream);
        let ws_guard = self.rt.workspace(m.ws_bytes, &queue, params.workspace)?;
        if ws_guard.ptr() != m.ws_ptr {
            return Ok(None);
        }
        let counters = self.rt.counters(m.counters, &queue)?;
        if counters.ptr() != m.counters_ptr {
            return Ok(None);
        }
        queue.launch_packed(fwd_fn, m.receipt.grid, fwd.threads_per_block, fwd.dynamic_smem_bytes, &m.fwd_args)?;
        if let (Some(grid), Some(args), Some(cm), Some(cf)) =
            (m.receipt.combine_grid, &m.combine_args, meta.combine(), self.loaded.function(KernelRole::Combine))
        {
            queue.launch_packed(cf, grid, cm.threads_per_block, cm.dynamic_smem_bytes, args)?;
        }
        drop(counters);
        drop(ws_guard);
        Ok(Some(Arc::clone(&m.receipt)))
    }
}

/// Byte size and offsets of a forward's workspace ([`Kernel::forward_workspace`]).
struct ForwardWorkspace {
    bytes: usize,
    lse_off: usize,
    lists_off: usize,
}

/// Row-major strides (re-exported for callers building views).
pub fn strides_of(shape: &[usize]) -> Vec<usize> {
    contiguous_strides(shape)
}
