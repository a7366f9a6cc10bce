//! The CUDA driver layer (cudarc, loaded at run time): device context and stream, device
//! memory, modules (PTX → cubin → module with the JIT's logs), launches and events.
//!
//! cudarc's `dynamic-loading` opens libcuda on first use and panics when it is missing;
//! [`Gpu::open`] checks for the library first and also turns any panic of the driver
//! bindings into an error, so a machine without a driver gets
//! [`RuntimeError::NoDriver`], never a crash.

use crate::error::RuntimeError;
use crate::tensor_map::TensorMapArg;
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream};
use serde::Serialize;
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// One kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    /// An encoded TMA tensor map, passed by value (128 bytes, 64-byte aligned).
    TensorMap(TensorMapArg),
}

/// The SM count the current context may use (its execution affinity), when the driver
/// says: an MPS client limited to a share of the GPU sees fewer SMs than the device has.
fn usable_sms() -> Option<u32> {
    let mut p = std::mem::MaybeUninit::<sys::CUexecAffinityParam>::zeroed();
    // SAFETY: writes one affinity parameter for the current context (bound by the caller).
    let r =
        unsafe { sys::cuCtxGetExecAffinity(p.as_mut_ptr(), sys::CUexecAffinityType::CU_EXEC_AFFINITY_TYPE_SM_COUNT) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    // SAFETY: filled by the successful call; the SM-count member is the one asked for.
    let n = unsafe { p.assume_init().param.smCount.val };
    (n > 0).then_some(n)
}

/// Is libcuda loadable on this machine?
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library names.
    unsafe { sys::is_culib_present() }
}

fn code_name(r: CUresult) -> String {
    let e = result::DriverError(r);
    e.error_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{r:?}"))
}

fn code_message(r: CUresult) -> String {
    let e = result::DriverError(r);
    e.error_string().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}

/// A driver result as a runtime error naming the call.
pub(crate) fn check(call: &str, r: CUresult) -> Result<(), RuntimeError> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(RuntimeError::Cuda { call: call.into(), code: code_name(r), message: code_message(r) })
}

pub(crate) fn drv(call: &str, e: result::DriverError) -> RuntimeError {
    RuntimeError::Cuda { call: call.into(), code: code_name(e.0), message: code_message(e.0) }
}

/// What the runtime knows about its device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    /// The arch attnc compiles for (`sm_90a` on an H100).
    pub arch: String,
    pub sm_count: u32,
    /// The SMs this process's context may use (`cuCtxGetExecAffinity`): fewer than
    /// `sm_count` under an MPS client's active-thread limit. Plans that count resident
    /// CTAs use it: split counts, and the ordered deterministic backward, whose CTAs wait
    /// for each other and must all be resident at once.
    pub usable_sm_count: u32,
    /// Opt-in maximum of dynamic shared memory per block, bytes.
    pub max_smem_per_block: u32,
    pub l2_bytes: u64,
    pub total_mem_bytes: u64,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    pub sm_clock_khz: i32,
    pub mem_clock_khz: i32,
    pub mem_bus_width_bits: i32,
}

/// A device context with the runtime's stream. Every launch and copy of a runtime goes
/// through this one stream, in order.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub info: DeviceInfo,
    pub(crate) arch: attnc_lower::Arch,
}

/// This thread in the driver's relaxed stream-capture mode until dropped. In the global
/// mode (PyTorch's default for `torch.cuda.graph`) a `cuMemAlloc` while any stream is
/// being captured invalidates the capture; the first launch on a graph's capture stream
/// sizes that stream's pooled workspace (the persistent grid's tile counters, split-KV
/// partials). PyTorch's caching allocator allocates the same way.
struct RelaxedCapture(Option<sys::CUstreamCaptureMode>);

impl RelaxedCapture {
    fn enter() -> RelaxedCapture {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges this thread's mode through a valid pointer.
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCapture((r == CUresult::CUDA_SUCCESS).then_some(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0 {
            // SAFETY: as in `enter`; restores the mode the thread had.
            unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({} #{})", self.info.name, self.info.ordinal)
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs driver code, turning a panic of the bindings (missing library or symbol) into an error.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, RuntimeError>) -> Result<T, RuntimeError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(RuntimeError::NoDriver(format!("{what}: {}", panic_text(p)))),
    }
}

impl Gpu {
    /// Opens device `ordinal`: loads libcuda, retains the primary context, creates a stream.
    pub fn open(ordinal: usize) -> Result<Gpu, RuntimeError> {
        if !driver_present() {
            return Err(RuntimeError::NoDriver(
                "libcuda.so could not be loaded (no NVIDIA driver installed, or it is not on the library path)".into(),
            ));
        }
        guarded("opening the CUDA device", || Gpu::open_inner(ordinal))
    }

    fn open_inner(ordinal: usize) -> Result<Gpu, RuntimeError> {
        result::init()
            .map_err(|e| RuntimeError::NoDevice { ordinal, detail: format!("cuInit: {}", code_name(e.0)) })?;
        let count = result::device::get_count().map_err(|e| drv("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(RuntimeError::NoDevice { ordinal, detail: format!("this machine has {count} CUDA device(s)") });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| RuntimeError::NoDevice {
            ordinal,
            detail: format!("{}: {}", code_name(e.0), code_message(e.0)),
        })?;
        let attr = |a: sys::CUdevice_attribute| ctx.attribute(a).map_err(|e| drv("cuDeviceGetAttribute", e));
        use sys::CUdevice_attribute as A;
        let cc = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let name = ctx.name().map_err(|e| drv("cuDeviceGetName", e))?;
        let arch = attnc_lower::Arch::from_compute_capability(cc.0.max(0) as u32, cc.1.max(0) as u32)
            .ok_or_else(|| RuntimeError::UnsupportedDevice { name: name.clone(), major: cc.0, minor: cc.1 })?;
        let mut driver_version = 0i32;
        // SAFETY: writes one int.
        check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut driver_version) })?;
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
        let usable_sm_count = usable_sms().map_or(sm_count, |n| n.clamp(1, sm_count));
        let info = DeviceInfo {
            ordinal,
            name,
            compute_capability: cc,
            arch: arch.name().to_string(),
            sm_count,
            usable_sm_count,
            max_smem_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as u32,
            l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as u64,
            total_mem_bytes: ctx.total_mem().map_err(|e| drv("cuDeviceTotalMem", e))? as u64,
            driver_version,
            sm_clock_khz: attr(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE).unwrap_or(0),
            mem_clock_khz: attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0),
            mem_bus_width_bits: attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0),
        };
        let stream = ctx.new_stream().map_err(|e| drv("cuStreamCreate", e))?;
        // The runtime orders all work on its one stream and manages its own buffers, so
        // cudarc's per-buffer event tracking is not needed.
        // SAFETY: no cudarc CudaSlice is used by the runtime.
        unsafe { ctx.disable_event_tracking() };
        Ok(Gpu { ctx, stream, info, arch })
    }

    pub(crate) fn bind(&self) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))
    }

    fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Allocates `bytes` (at least 256, so no allocation is empty; base addresses are
    /// 256-byte aligned). Also while a stream is being captured into a CUDA graph (a pooled
    /// workspace's first use on the capture stream): see [`RelaxedCapture`].
    pub fn alloc_bytes(&self, bytes: usize) -> Result<Arc<DeviceBuffer>, RuntimeError> {
        self.bind()?;
        let _relaxed = RelaxedCapture::enter();
        // SAFETY: plain allocation in the bound context.
        let ptr = unsafe { result::malloc_sync(bytes.max(256)) }
            .map_err(|e| drv(&format!("cuMemAlloc({bytes} bytes)"), e))?;
        Ok(Arc::new(DeviceBuffer { ptr, bytes, ordinal: self.info.ordinal, owner: Some(self.ctx.clone()) }))
    }

    /// Host → device, then waits for the copy.
    pub fn htod(&self, dst: u64, src: &[u8]) -> Result<(), RuntimeError> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` holds `src.len()` bytes (checked by callers); waits before `src` can move.
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }.map_err(|e| drv("cuMemcpyHtoDAsync", e))?;
        self.synchronize()
    }

    /// Device → host, waiting for the stream's earlier work and the copy.
    pub fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), RuntimeError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` holds `dst.len()` bytes (checked by callers); waits before returning.
        unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) }.map_err(|e| drv("cuMemcpyDtoHAsync", e))?;
        self.synchronize()
    }

    /// The runtime's own stream (`None`) or the caller's.
    pub fn queue(&self, stream: Option<Stream>) -> Queue<'_> {
        Queue { gpu: self, stream }
    }

    /// Device → device on the runtime's stream (asynchronous).
    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), RuntimeError> {
        self.queue(None).dtod(dst, src, bytes)
    }

    /// Fills `n` 32-bit words at `dst` with `value` on the runtime's stream (asynchronous).
    pub fn memset_d32(&self, dst: u64, value: u32, n: usize) -> Result<(), RuntimeError> {
        self.queue(None).memset_d32(dst, value, n)
    }

    /// Fills `n` 16-bit words on the runtime's stream (asynchronous).
    pub fn memset_d16(&self, dst: u64, value: u16, n: usize) -> Result<(), RuntimeError> {
        self.queue(None).memset_d16(dst, value, n)
    }

    /// Waits for everything queued on the runtime's stream; reports asynchronous kernel
    /// faults.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.bind()?;
        self.stream.synchronize().map_err(|e| drv("cuStreamSynchronize", e))
    }

    /// A timing event.
    pub fn event(&self) -> Result<CudaEvent, RuntimeError> {
        self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| drv("cuEventCreate", e))
    }
    pub fn record(&self, ev: &CudaEvent) -> Result<(), RuntimeError> {
        self.queue(None).record(ev)
    }
    /// Milliseconds between two recorded events (waits for the second).
    pub fn elapsed_ms(&self, a: &CudaEvent, b: &CudaEvent) -> Result<f32, RuntimeError> {
        a.elapsed_ms(b).map_err(|e| drv("cuEventElapsedTime", e))
    }

    /// Launches `f` on the runtime's stream with `args` in ABI order (see [`ArgSlots`]).
    pub fn launch(
        &self,
        f: &Function,
        grid: [u32; 3],
        block: u32,
        smem: u32,
        args: &[ArgValue],
    ) -> Result<(), RuntimeError> {
        self.queue(None).launch(f, grid, block, smem, args)
    }

    /// Is `ctx` this device's (primary) context?
    pub(crate) fn owns_context(&self, ctx: &CudaContext) -> bool {
        ctx.cu_ctx() == self.ctx.cu_ctx()
    }
}

/// A CUDA stream the caller owns (PyTorch's current stream, a cudarc stream). A call
/// with [`crate::Params::on_stream`] queues all its work there, ordered with the caller's
/// own work, and waits for nothing on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(usize);

impl Stream {
    /// A stream from its driver handle (`CUstream`; 0 is the legacy default stream).
    ///
    /// # Safety
    /// `handle` is a stream of the runtime device's primary context (the one PyTorch and
    /// cudarc use), alive until the work queued on it has run.
    pub unsafe fn from_raw(handle: usize) -> Stream {
        Stream(handle)
    }
    /// A cudarc stream's handle (its context is checked by [`crate::Runtime::stream_of`]).
    pub(crate) fn of_cudarc(stream: &CudaStream) -> Stream {
        Stream(stream.cu_stream() as usize)
    }
    pub fn handle(&self) -> usize {
        self.0
    }
    fn cu(&self) -> sys::CUstream {
        self.0 as sys::CUstream
    }
}

/// Where a call's work goes: the runtime's own stream or the caller's ([`Gpu::queue`]).
#[derive(Clone, Copy)]
pub struct Queue<'g> {
    gpu: &'g Gpu,
    stream: Option<Stream>,
}

impl Queue<'_> {
    fn cu_stream(&self) -> sys::CUstream {
        self.stream.map_or_else(|| self.gpu.cu_stream(), |s| s.cu())
    }
    /// The caller's stream, when the work goes there.
    pub fn caller_stream(&self) -> Option<Stream> {
        self.stream
    }

    /// Launches `f` with `args` in ABI order (see [`ArgSlots`]).
    pub fn launch(
        &self,
        f: &Function,
        grid: [u32; 3],
        block: u32,
        smem: u32,
        args: &[ArgValue],
    ) -> Result<(), RuntimeError> {
        self.launch_packed(f, grid, block, smem, &ArgSlots::pack(args))
    }

    /// Launches `f` with arguments packed before (a remembered launch packs them once).
    pub fn launch_packed(
        &self,
        f: &Function,
        grid: [u32; 3],
        block: u32,
        smem: u32,
        args: &ArgSlots,
    ) -> Result<(), RuntimeError> {
        let mut ptrs = args.pointers();
        self.gpu.bind()?;
        // SAFETY: `f` is a live function of a loaded module; one pointer per parameter, each
        // to a value of the parameter's size and alignment (tensor maps: 128 bytes,
        // 64-byte aligned); the slots outlive the call (the driver copies the values at
        // launch).
        unsafe {
            result::launch_kernel(
                f.f,
                (grid[0], grid[1], grid[2]),
                (block, 1, 1),
                smem,
                self.cu_stream(),
                ptrs.as_mut_slice(),
            )
        }
        .map_err(|e| drv(&format!("cuLaunchKernel({})", f.name), e))
    }

    /// Fills `n` 32-bit words at `dst` with `value` (asynchronous).
    pub fn memset_d32(&self, dst: u64, value: u32, n: usize) -> Result<(), RuntimeError> {
        self.gpu.bind()?;
        // SAFETY: `dst` holds `n` words (checked by callers).
        check("cuMemsetD32Async", unsafe { sys::cuMemsetD32Async(dst, value, n, self.cu_stream()) })
    }

    /// Fills `n` 16-bit words (asynchronous).
    pub fn memset_d16(&self, dst: u64, value: u16, n: usize) -> Result<(), RuntimeError> {
        self.gpu.bind()?;
        // SAFETY: `dst` holds `n` half-words (checked by callers).
        check("cuMemsetD16Async", unsafe { sys::cuMemsetD16Async(dst, value, n, self.cu_stream()) })
    }

    /// Device → device (asynchronous).
    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), RuntimeError> {
        self.gpu.bind()?;
        // SAFETY: both ranges hold `bytes` (checked by callers).
        check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.cu_stream()) })
    }

    /// Records a timing event.
    pub fn record(&self, ev: &CudaEvent) -> Result<(), RuntimeError> {
        self.gpu.bind()?;
        // SAFETY: a live event of this context on a live stream.
        check("cuEventRecord", unsafe { sys::cuEventRecord(ev.cu_event(), self.cu_stream()) })
    }

    /// Waits on the host for everything queued so far.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.gpu.bind()?;
        // SAFETY: a live stream.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.cu_stream()) })
    }
}

/// One kernel argument's storage: 128 bytes, 64-byte aligned, so the largest parameter
/// (a by-value `CUtensorMap`, `.param .align 64 .b8 [128]`) fits and every smaller one
/// (`u64`/`i64`/`i32`/`f32`, stored at offset 0) is aligned too.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct ArgSlot(pub [u8; 128]);

/// The argument storage of one launch: one [`ArgSlot`] per parameter, in order;
/// `cuLaunchKernel` gets one pointer per slot.
#[derive(Clone)]
pub struct ArgSlots(Vec<ArgSlot>);

impl std::fmt::Debug for ArgSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArgSlots({} parameters)", self.0.len())
    }
}

impl ArgSlots {
    pub fn pack(args: &[ArgValue]) -> ArgSlots {
        ArgSlots(
            args.iter()
                .map(|a| {
                    let mut s = [0u8; 128];
                    match *a {
                        ArgValue::Ptr(p) => s[..8].copy_from_slice(&p.to_ne_bytes()),
                        ArgValue::I64(v) => s[..8].copy_from_slice(&v.to_ne_bytes()),
                        ArgValue::I32(v) => s[..4].copy_from_slice(&v.to_ne_bytes()),
                        ArgValue::F32(v) => s[..4].copy_from_slice(&v.to_ne_bytes()),
                        ArgValue::TensorMap(m) => s.copy_from_slice(&m.to_bytes()),
                    }
                    ArgSlot(s)
                })
                .collect(),
        )
    }
    pub fn slots(&self) -> &[ArgSlot] {
        &self.0
    }
    /// One pointer per parameter, what `cuLaunchKernel` takes (valid while `self` lives;
    /// the driver only reads through them). On the stack for the usual parameter counts:
    /// a remembered launch builds this table on every call.
    pub fn pointers(&self) -> PointerTable {
        let mut t = match self.0.len() {
            n if n <= POINTERS_ON_STACK => PointerTable::Stack([std::ptr::null_mut(); POINTERS_ON_STACK], n),
            n => PointerTable::Heap(vec![std::ptr::null_mut(); n]),
        };
        for (p, s) in t.as_mut_slice().iter_mut().zip(&self.0) {
            *p = s.0.as_ptr() as *mut c_void;
        }
        t
    }
}

const POINTERS_ON_STACK: usize = 64;

/// The pointer table of an [`ArgSlots`] (see [`ArgSlots::pointers`]).
// The large variant is the point: no allocation per launch.
#[allow(clippy::large_enum_variant)]
pub enum PointerTable {
    Stack([*mut c_void; POINTERS_ON_STACK], usize),
    Heap(Vec<*mut c_void>),
}

impl PointerTable {
    pub fn as_mut_slice(&mut self) -> &mut [*mut c_void] {
        match self {
            PointerTable::Stack(a, n) => &mut a[..*n],
            PointerTable::Heap(v) => v,
        }
    }
}

/// Device memory a [`crate::Tensor`] views: an allocation of the runtime's (freed on drop)
/// or a range the caller owns (never freed here; see [`crate::Tensor::from_raw_parts`]).
pub struct DeviceBuffer {
    pub(crate) ptr: u64,
    pub(crate) bytes: usize,
    pub(crate) ordinal: usize,
    /// The context that allocated it, when the runtime did.
    owner: Option<Arc<CudaContext>>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl DeviceBuffer {
    /// Memory the caller owns: `bytes` from `ptr` on device `ordinal`.
    pub(crate) fn borrowed(ptr: u64, bytes: usize, ordinal: usize) -> DeviceBuffer {
        DeviceBuffer { ptr, bytes, ordinal, owner: None }
    }
    /// Does the runtime own (and free) it?
    pub fn is_owned(&self) -> bool {
        self.owner.is_some()
    }
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let Some(ctx) = &self.owner else { return };
        if ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `alloc_bytes`, freed once. cuMemFree synchronizes with
            // work that may still use the buffer.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A loaded module, unloaded on drop.
pub struct Module {
    module: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: driver module handles may be used from any thread (with the context bound).
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by `load_module`, unloaded once.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// A kernel of a [`Module`] (keep the module alive while using it).
#[derive(Clone, Debug)]
pub struct Function {
    pub(crate) f: sys::CUfunction,
    pub name: String,
}

// SAFETY: as for Module.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Module {
    pub fn function(&self, name: &str) -> Result<Function, RuntimeError> {
        let c = CString::new(name).map_err(|_| RuntimeError::Abi(format!("kernel name `{name}` has a NUL")))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: live module, NUL-terminated name.
        check(&format!("cuModuleGetFunction({name})"), unsafe {
            sys::cuModuleGetFunction(&mut f, self.module, c.as_ptr())
        })?;
        Ok(Function { f, name: name.to_string() })
    }
}

impl Function {
    /// Allows `bytes` of dynamic shared memory (needed above 48 KiB).
    pub fn set_max_dynamic_smem(&self, bytes: u32) -> Result<(), RuntimeError> {
        // SAFETY: live function.
        check(&format!("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {bytes}, {})", self.name), unsafe {
            sys::cuFuncSetAttribute(
                self.f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        })
    }
    /// CTAs of `threads` threads with `smem` bytes of dynamic shared memory that fit on
    /// one SM at once.
    pub fn max_active_blocks_per_sm(&self, threads: u32, smem: u32) -> Option<u32> {
        let mut n = 0i32;
        // SAFETY: live function, writes one int.
        let r =
            unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.f, threads as i32, smem as usize) };
        (r == CUresult::CUDA_SUCCESS && n > 0).then_some(n as u32)
    }
    /// Registers per thread, from the loaded code.
    pub fn num_regs(&self) -> Option<i32> {
        let mut v = 0i32;
        // SAFETY: live function, writes one int.
        let r =
            unsafe { sys::cuFuncGetAttribute(&mut v, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS, self.f) };
        (r == CUresult::CUDA_SUCCESS).then_some(v)
    }
}

const LOG_BYTES: usize = 64 * 1024;

/// Log buffers and the option arrays that point at them.
struct JitLogs {
    error: Vec<u8>,
    info: Vec<u8>,
    opts: Vec<sys::CUjit_option>,
    vals: Vec<*mut c_void>,
}

impl JitLogs {
    fn new() -> JitLogs {
        let mut l =
            JitLogs { error: vec![0u8; LOG_BYTES], info: vec![0u8; LOG_BYTES], opts: Vec::new(), vals: Vec::new() };
        use sys::CUjit_option as O;
        l.opts = vec![
            O::CU_JIT_ERROR_LOG_BUFFER,
            O::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            O::CU_JIT_INFO_LOG_BUFFER,
            O::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        ];
        l.vals = vec![
            l.error.as_mut_ptr() as *mut c_void,
            LOG_BYTES as *mut c_void,
            l.info.as_mut_ptr() as *mut c_void,
            LOG_BYTES as *mut c_void,
        ];
        l
    }
    fn text(buf: &[u8]) -> String {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim().to_string()
    }
    fn error_text(&self) -> String {
        let (e, i) = (JitLogs::text(&self.error), JitLogs::text(&self.info));
        match (e.is_empty(), i.is_empty()) {
            (true, true) => "(the JIT left no log)".into(),
            (false, true) => e,
            (true, false) => i,
            (false, false) => format!("{e}\n{i}"),
        }
    }
}

fn jit_error(what: &str, r: CUresult, logs: &JitLogs) -> RuntimeError {
    RuntimeError::Jit { what: what.into(), code: code_name(r), log: logs.error_text() }
}

/// What a module image is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    Ptx,
    Cubin,
}

impl Gpu {
    /// Has the driver compile PTX to a cubin for this device (cuLinkCreate /
    /// cuLinkAddData / cuLinkComplete); the JIT's error log comes back in the error.
    pub fn link_ptx(&self, ptx: &str, name: &str) -> Result<Vec<u8>, RuntimeError> {
        self.bind()?;
        let mut data = ptx.as_bytes().to_vec();
        data.push(0);
        let cname = CString::new(name.replace('\0', "")).unwrap_or_default();
        let mut logs = JitLogs::new();
        let mut state: sys::CUlinkState = std::ptr::null_mut();
        // SAFETY: option arrays of equal length pointing at live buffers; `state` is
        // destroyed on every path below.
        unsafe {
            let r = sys::cuLinkCreate_v2(
                logs.opts.len() as u32,
                logs.opts.as_mut_ptr(),
                logs.vals.as_mut_ptr(),
                &mut state,
            );
            if r != CUresult::CUDA_SUCCESS {
                return Err(jit_error(&format!("{name} (cuLinkCreate)"), r, &logs));
            }
            let r = sys::cuLinkAddData_v2(
                state,
                sys::CUjitInputType::CU_JIT_INPUT_PTX,
                data.as_mut_ptr() as *mut c_void,
                data.len(),
                cname.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            if r != CUresult::CUDA_SUCCESS {
                let e = jit_error(&format!("{name} (PTX -> cubin)"), r, &logs);
                sys::cuLinkDestroy(state);
                return Err(e);
            }
            let mut cubin: *mut c_void = std::ptr::null_mut();
            let mut size = 0usize;
            let r = sys::cuLinkComplete(state, &mut cubin, &mut size);
            if r != CUresult::CUDA_SUCCESS || cubin.is_null() {
                let e = jit_error(&format!("{name} (link)"), r, &logs);
                sys::cuLinkDestroy(state);
                return Err(e);
            }
            // The image belongs to the link state: copy it before destroying the state.
            let out = std::slice::from_raw_parts(cubin as *const u8, size).to_vec();
            sys::cuLinkDestroy(state);
            Ok(out)
        }
    }

    /// Loads a module from PTX (JIT-compiled by the driver) or a cubin, through
    /// cuModuleLoadDataEx; the JIT's error log comes back in the error.
    pub fn load_module(&self, image: &[u8], kind: Image, name: &str) -> Result<Module, RuntimeError> {
        self.bind()?;
        let mut data = image.to_vec();
        if kind == Image::Ptx {
            data.push(0);
        }
        let mut logs = JitLogs::new();
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: option arrays of equal length pointing at live buffers; `data` outlives the call.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                data.as_ptr() as *const c_void,
                logs.opts.len() as u32,
                logs.opts.as_mut_ptr(),
                logs.vals.as_mut_ptr(),
            )
        };
        if r != CUresult::CUDA_SUCCESS {
            let what = match kind {
                Image::Ptx => format!("{name} (PTX)"),
                Image::Cubin => format!("{name} (cubin)"),
            };
            return Err(jit_error(&what, r, &logs));
        }
        Ok(Module { module, ctx: self.ctx.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tma::TensorMapArg;

    #[test]
    fn launch_slots_hold_a_tensor_map_by_value_64_aligned() {
        let mut words = [0u64; 16];
        for (i, w) in words.iter_mut().enumerate() {
            *w = 0x1111_1111_1111_1111u64.wrapping_mul(i as u64 + 1);
        }
        let map = TensorMapArg(words);
        let args = [
            ArgValue::Ptr(0xdead_beef_0000),
            ArgValue::TensorMap(map),
            ArgValue::I32(-7),
            ArgValue::F32(1.5),
            ArgValue::I64(-3),
        ];
        let slots = ArgSlots::pack(&args);
        let mut table = slots.pointers();
        let ptrs = table.as_mut_slice();
        assert_eq!(ptrs.len(), args.len());
        for (p, s) in ptrs.iter().zip(slots.slots()) {
            assert_eq!(*p as usize % 64, 0, "every slot is 64-byte aligned");
            assert_eq!(*p as *const u8, s.0.as_ptr());
        }
        let s = slots.slots();
        assert_eq!(s[0].0[..8], 0xdead_beef_0000u64.to_ne_bytes());
        assert_eq!(s[1].0, map.to_bytes(), "all 128 bytes of the map");
        assert_eq!(s[2].0[..4], (-7i32).to_ne_bytes());
        assert_eq!(s[3].0[..4], 1.5f32.to_ne_bytes());
        assert_eq!(s[4].0[..8], (-3i64).to_ne_bytes());
        // Reading the slot back as a u64 gives the pointer (what the driver copies).
        // SAFETY: the slot is 128 bytes, 64-byte aligned.
        assert_eq!(unsafe { *(ptrs[0] as *const u64) }, 0xdead_beef_0000);
    }
}
