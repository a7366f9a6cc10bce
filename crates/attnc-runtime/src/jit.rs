//! The JIT: spec → PTX (attnc-lower) → cubin (the driver's linker) → loaded module, and
//! the cache key and disk payload of a compiled kernel.
//!
//! **Image route.** The PTX is compiled to a cubin with `cuLinkCreate` /
//! `cuLinkAddData(PTX)` / `cuLinkComplete`, and the module is loaded from that cubin with
//! `cuModuleLoadDataEx`; the disk cache keeps the PTX *and* the cubin, so a disk hit skips
//! the driver's PTX compile (the expensive half of a cold compile). If the link route
//! fails (a driver without cuLink*, say) the PTX itself is loaded with
//! `cuModuleLoadDataEx` (the driver JITs it on every load) and only the PTX is stored;
//! the receipt says which image ran. A cached cubin that does not load is ignored and
//! the module rebuilt. Either way a JIT failure returns the driver's error log in
//! [`RuntimeError::Jit`].
//!
//! **Key.** Everything that decides the module: the normalized spec
//! ([`attnc_ir::Spec::cache_key`]), the arch, the requested family (the family and its
//! tile config follow from spec + arch + code), attnc's version, a fingerprint of the
//! code generator's sources (see `build.rs`), LLVM's version, the driver version (the
//! cubin comes from the driver's compiler) and the payload format.

use crate::cache::{pack_sections, unpack_sections, CacheKey, Producer};
use crate::cuda::{Function, Gpu, Image, Module};
use crate::dispatch::Resolved;
use crate::error::RuntimeError;
use attnc_ir::Spec;
use attnc_lower::{CompileOptions, Direction, FamilyChoice, FamilyKind, Grid, KernelInfo, KernelRole, TmaBox};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::Instant;

/// Version of the payload layout below.
/// 2: `KernelMeta::tensor_maps` (entries of format 1 are rebuilt, not misread).
/// 3: typed kernel roles and notes, the module's direction, typed grids.
pub const PAYLOAD_FORMAT: &str = "attnc-jit-payload-3";

/// attnc's version, as it enters cache keys.
pub const ATTNC_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Hash of the code generator's sources at build time.
pub const CODEGEN_FINGERPRINT: &str = env!("ATTNC_CODEGEN_FINGERPRINT");

/// LLVM's version (the one linked into attnc-lower), e.g. "22.1.0".
pub fn llvm_version() -> String {
    let (a, b, c) = inkwell::support::get_llvm_version();
    format!("{a}.{b}.{c}")
}

/// The cache key of `direction` of `spec` compiled for `arch` with `family`, loaded by
/// driver `driver_version`. Runs on every `Runtime::kernel` call (a memory-cache hit
/// included), so the parts fixed for the process are formatted once.
pub fn kernel_key(
    spec: &Spec,
    arch: &str,
    family: FamilyChoice,
    direction: Direction,
    driver_version: i32,
) -> CacheKey {
    static BUILD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let build = BUILD.get_or_init(|| {
        let mut t = String::new();
        for (k, v) in [
            ("format", PAYLOAD_FORMAT.to_string()),
            ("attnc", ATTNC_VERSION.to_string()),
            ("codegen", CODEGEN_FINGERPRINT.to_string()),
            ("llvm", llvm_version()),
        ] {
            let _ = writeln!(t, "{k}={v}");
        }
        t
    });
    let mut text = String::with_capacity(build.len() + 768);
    text.push_str(build);
    let parts = [
        ("arch", arch),
        ("family", family.name()),
        ("direction", direction.name()),
        ("driver", &driver_version.to_string()),
        ("spec", &spec.cache_key()),
        // A tuning override changes the code for the same spec (dev sweeps only): read
        // per call, as the lowering reads it.
        ("hopper_tune", &attnc_lower::families::hopper::config::tune_override().unwrap_or_default()),
        ("hopper_bwd_tune", &attnc_lower::families::hopper::config::bwd_tune_override().unwrap_or_default()),
        ("portable_bwd_tune", &attnc_lower::families::portable::config::bwd_tune_override().unwrap_or_default()),
        ("compiler", external_ptxas_identity().unwrap_or("driver")),
    ];
    for (k, v) in parts {
        let _ = writeln!(text, "{k}={v}");
    }
    CacheKey::from_text(text)
}

/// The ptxas that compiles PTX to cubins, with its version, or `None` for the driver's
/// JIT (`ATTNC_JIT=driver` forces that). A ptxas from the toolkit the code was verified
/// with is preferred: the driver's built-in compiler is as old as the driver, and the
/// one of the H100's 580 driver (CUDA 13.0) spilled and serialized every wgmma of the
/// hopper kernel that ptxas 13.5 compiles cleanly (docs/hopper.md). Resolved once per
/// process.
pub fn external_ptxas() -> Option<(std::path::PathBuf, String)> {
    static FOUND: std::sync::OnceLock<Option<(std::path::PathBuf, String)>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let path = external_ptxas_path()?;
            let version = attnc_lower::ptxas::version(attnc_lower::ptxas::Tool::Ptxas).ok()?;
            Some((path, version))
        })
        .clone()
}

/// Where [`external_ptxas`] would find ptxas (a search of the file system, no run).
fn external_ptxas_path() -> Option<std::path::PathBuf> {
    if std::env::var("ATTNC_JIT").is_ok_and(|v| v == "driver") {
        return None;
    }
    attnc_lower::ptxas::find_ptxas().ok()
}

/// The compiler as the cache key names it: the external ptxas by path, size and
/// modification time, or `None` for the driver's JIT. A `stat`, not a run: naming it by
/// its `--version` cost a disk-cache hit in a fresh process 6.6 ms (H100 host,
/// docs/results/2026-11-27-h100-side-by-side-6/), of which the hit itself takes 0.6. A
/// ptxas that cannot be read (or that fails `--version` at build time) is keyed as found
/// here; the build then takes the driver's route, as before. Resolved once per process.
pub fn external_ptxas_identity() -> Option<&'static str> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| external_ptxas_path().map(|p| file_identity("ptxas", &p))).as_deref()
}

/// `tool` at `path` by its path, size and modification time.
fn file_identity(tool: &str, path: &std::path::Path) -> String {
    let meta = std::fs::metadata(path).ok();
    let len = meta.as_ref().map_or(0, |m| m.len());
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("{tool} {} ({len} bytes, modified {mtime} ns)", path.display())
}

/// A kernel's launch facts (a serializable copy of [`KernelInfo`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelMeta {
    pub name: String,
    pub role: KernelRole,
    /// The family's note on this kernel (see `KernelInfo::note`).
    #[serde(default)]
    pub note: Option<String>,
    pub threads_per_block: u32,
    pub dynamic_smem_bytes: u32,
    pub block_m: u32,
    pub block_n: u32,
    pub params: Vec<String>,
    /// How to encode each `tensormap` parameter (`cuTensorMapEncodeTiled`, see
    /// [`crate::tma`]); empty for kernels without TMA.
    #[serde(default)]
    pub tensor_maps: Vec<TmaBox>,
    /// How its grid follows from the launch (see `attnc_lower::Grid`).
    pub grid: Grid,
}

impl From<&KernelInfo> for KernelMeta {
    fn from(k: &KernelInfo) -> Self {
        KernelMeta {
            name: k.name.clone(),
            role: k.role,
            note: k.note.clone(),
            threads_per_block: k.threads_per_block,
            dynamic_smem_bytes: k.dynamic_smem_bytes,
            block_m: k.block_m,
            block_n: k.block_n,
            params: k.params.clone(),
            tensor_maps: k.tensor_maps.clone(),
            grid: k.grid,
        }
    }
}

/// What was compiled: the family that the dispatcher chose and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleMeta {
    pub requested: String,
    pub family: String,
    pub direction: Direction,
    pub arch: String,
    pub fallback_reason: Option<String>,
    pub kernels: Vec<KernelMeta>,
    /// What turned the PTX into machine code: `ptxas <version>` or `driver JIT`.
    #[serde(default)]
    pub compiler: String,
}

impl ModuleMeta {
    /// The kernel with `role`.
    pub fn kernel(&self, role: KernelRole) -> Option<&KernelMeta> {
        self.kernels.iter().find(|k| k.role == role)
    }
    /// The kernel that does the direction's main work (its grid and registers are what a
    /// receipt reports): the forward, or the backward main loop.
    pub fn main_role(&self) -> KernelRole {
        match self.direction {
            Direction::Forward => KernelRole::Forward,
            Direction::Backward => KernelRole::BackwardMain,
        }
    }
    pub fn main(&self) -> Option<&KernelMeta> {
        self.kernel(self.main_role())
    }
    pub fn forward(&self) -> Option<&KernelMeta> {
        self.kernel(KernelRole::Forward)
    }
    pub fn combine(&self) -> Option<&KernelMeta> {
        self.kernel(KernelRole::Combine)
    }
}

/// Times of a build, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct BuildTimes {
    /// Spec → PTX in-process (attnc-lower: LLVM codegen).
    pub lower_ms: f64,
    /// PTX → cubin by the driver (0 when not built now).
    pub link_ms: f64,
    /// Image → loaded module.
    pub load_ms: f64,
}

/// A compiled, loaded kernel module (what the memory cache holds).
pub struct LoadedKernel {
    pub meta: ModuleMeta,
    pub ptx: String,
    /// Which image the module was loaded from.
    pub image: Image,
    pub times: BuildTimes,
    _module: Module,
    /// Every kernel of the module, by role (the order of `meta.kernels`).
    functions: Vec<(KernelRole, Function)>,
    /// Registers per thread of the main kernel (`ModuleMeta::main`).
    pub main_regs: Option<i32>,
    /// Resident main-kernel CTAs per SM (driver occupancy calculator; 1 when unknown).
    pub main_ctas_per_sm: u32,
    /// The forward kernel walks tile lists (`block_lists:*` parameters: a mask over aux
    /// tensors): read once here, not per launch.
    pub forward_takes_lists: bool,
    /// Its forward loads K and V by TMA (contiguous, varlen, or pages TMA boxes follow),
    /// not by a cp.async row gather.
    pub forward_loads_kv_by_tma: bool,
}

impl LoadedKernel {
    /// The loaded kernel with `role`.
    pub(crate) fn function(&self, role: KernelRole) -> Option<&Function> {
        self.functions.iter().find(|(r, _)| *r == role).map(|(_, f)| f)
    }
}

impl std::fmt::Debug for LoadedKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoadedKernel({} {} {} {:?})", self.meta.family, self.meta.direction, self.meta.arch, self.image)
    }
}

/// Loads `image`, looks up the kernels and raises their dynamic shared-memory limit.
fn instantiate(
    gpu: &Gpu,
    meta: ModuleMeta,
    ptx: String,
    image: &[u8],
    kind: Image,
    times: BuildTimes,
) -> Result<LoadedKernel, RuntimeError> {
    let t = Instant::now();
    let main_meta = meta
        .main()
        .ok_or_else(|| RuntimeError::Abi(format!("the {} module has no {} kernel", meta.direction, meta.main_role())))?
        .clone();
    let module = gpu.load_module(image, kind, &main_meta.name)?;
    let mut functions = Vec::with_capacity(meta.kernels.len());
    for k in &meta.kernels {
        let f = module.function(&k.name)?;
        if k.dynamic_smem_bytes > 48 * 1024 {
            f.set_max_dynamic_smem(k.dynamic_smem_bytes)?;
        }
        functions.push((k.role, f));
    }
    let main = functions
        .iter()
        .find(|(r, _)| *r == main_meta.role)
        .map(|(_, f)| f)
        .ok_or_else(|| RuntimeError::Abi("main kernel not loaded".into()))?;
    let main_regs = main.num_regs();
    let main_ctas_per_sm =
        main.max_active_blocks_per_sm(main_meta.threads_per_block, main_meta.dynamic_smem_bytes).unwrap_or(1).max(1);
    let times = BuildTimes { load_ms: t.elapsed().as_secs_f64() * 1e3, ..times };
    let forward_takes_lists = meta.forward().is_some_and(|f| f.params.iter().any(|p| p.starts_with("block_lists:")));
    let forward_loads_kv_by_tma = meta.forward().is_some_and(|f| f.tensor_maps.iter().any(|b| b.tensor == "k"));
    Ok(LoadedKernel {
        meta,
        ptx,
        image: kind,
        times,
        _module: module,
        functions,
        main_regs,
        main_ctas_per_sm,
        forward_takes_lists,
        forward_loads_kv_by_tma,
    })
}

/// Whether a module whose every configuration spills gives way to portable: only a
/// family `auto` chose, and never portable itself (the family of last resort runs as
/// assembled).
fn spill_fallback(choice: FamilyChoice, resolved: &Resolved) -> bool {
    choice == FamilyChoice::Auto && resolved.family != FamilyKind::Portable
}

/// The cache's producer of kernels.
pub struct KernelProducer<'a> {
    pub gpu: &'a Gpu,
    pub spec: &'a Spec,
    pub family: FamilyChoice,
    pub direction: Direction,
}

impl Producer for KernelProducer<'_> {
    type Output = LoadedKernel;
    type Error = RuntimeError;

    fn decode(&self, payload: &[u8]) -> Result<LoadedKernel, String> {
        let sections = unpack_sections(payload)?;
        let get = |n: &str| sections.iter().find(|s| s.0 == n).map(|s| s.1);
        let meta: ModuleMeta = serde_json::from_slice(get("meta").ok_or("no meta")?).map_err(|e| e.to_string())?;
        let ptx = String::from_utf8(get("ptx").ok_or("no ptx")?.to_vec()).map_err(|e| e.to_string())?;
        let times = BuildTimes::default();
        match get("cubin") {
            Some(cubin) => instantiate(self.gpu, meta, ptx, cubin, Image::Cubin, times).map_err(|e| e.to_string()),
            None => {
                let bytes = ptx.clone().into_bytes();
                instantiate(self.gpu, meta, ptx, &bytes, Image::Ptx, times).map_err(|e| e.to_string())
            }
        }
    }

    fn build(&self) -> Result<(LoadedKernel, Option<Vec<u8>>), RuntimeError> {
        let resolved = crate::dispatch::resolve(self.spec, self.gpu.arch, self.family, self.direction)?;
        self.build_resolved(resolved)
    }
}

impl KernelProducer<'_> {
    /// Compiles, assembles and loads the family `resolved` names. Fails closed on spills:
    /// when the dispatcher chose the family (`auto`) and ptxas reports local-memory
    /// spills in its module, the portable family runs instead and the receipt's fallback
    /// reason says which kernel spilled how much. A family the caller named runs as
    /// assembled (`attnc check` reports its spills).
    fn build_resolved(&self, resolved: Resolved) -> Result<(LoadedKernel, Option<Vec<u8>>), RuntimeError> {
        let t = Instant::now();
        let opts =
            CompileOptions::new(self.gpu.arch).family(FamilyChoice::Exactly(resolved.family)).direction(self.direction);
        // Route 1: an external ptxas (see `external_ptxas`), through the family's
        // configurations until one does not spill; a ptxas failure falls through to the
        // driver, with the reason kept for the error message.
        let mut ptxas_err = None;
        let external = external_ptxas();
        let mut assembled = None;
        if let Some((path, _)) = &external {
            // Every configuration spilling: portable, when `auto` chose the family.
            let to_portable = spill_fallback(self.family, &resolved);
            match attnc_lower::compile_without_spills_or_portable(self.spec, &opts, path, to_portable) {
                Ok(c) => assembled = Some(c),
                Err(attnc_lower::LowerError::Ptxas(e)) => ptxas_err = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        let (module, report) = match assembled {
            Some(c) => (c.module, Some(c.report)),
            None => (attnc_lower::compile(self.spec, &opts)?, None),
        };
        let lower_ms = module.timings.build_ms + module.timings.optimize_ms + module.timings.codegen_ms;
        let mut meta = ModuleMeta {
            requested: self.family.name().to_string(),
            family: module.family.name().to_string(),
            direction: module.direction,
            arch: module.arch.name().to_string(),
            // Why not the requested family (the dispatcher's reason, then spills), then
            // why not its default configuration.
            fallback_reason: {
                let why: Vec<&str> = [&resolved.fallback_reason, &module.fallback_reason, &module.config_note]
                    .into_iter()
                    .flatten()
                    .map(String::as_str)
                    .collect();
                (!why.is_empty()).then(|| why.join("; "))
            },
            kernels: module.kernels.iter().map(KernelMeta::from).collect(),
            compiler: String::new(),
        };
        let name = meta.main().map(|k| k.name.clone()).unwrap_or_default();
        if let (Some(report), Some((path, version))) = (report, &external) {
            meta.compiler = format!("ptxas {version}");
            let meta_json = serde_json::to_vec(&meta)
                .map_err(|e| RuntimeError::Other(format!("serializing module metadata: {e}")))?;
            let link_ms = (t.elapsed().as_secs_f64() * 1e3 - lower_ms).max(0.0);
            let times = BuildTimes { lower_ms, link_ms, load_ms: 0.0 };
            match instantiate(self.gpu, meta.clone(), module.ptx.clone(), &report.cubin, Image::Cubin, times) {
                Ok(k) => {
                    let payload = pack_sections(&[
                        ("meta", &meta_json),
                        ("ptx", module.ptx.as_bytes()),
                        ("cubin", &report.cubin),
                    ]);
                    return Ok((k, Some(payload)));
                }
                Err(e) => ptxas_err = Some(format!("the cubin of {} did not load: {e}", path.display())),
            }
        }
        meta.compiler = "driver JIT".into();
        let meta_json =
            serde_json::to_vec(&meta).map_err(|e| RuntimeError::Other(format!("serializing module metadata: {e}")))?;
        let t = Instant::now();
        match self.gpu.link_ptx(&module.ptx, &name) {
            Ok(cubin) => {
                let times = BuildTimes { lower_ms, link_ms: t.elapsed().as_secs_f64() * 1e3, load_ms: 0.0 };
                let payload = pack_sections(&[("meta", &meta_json), ("ptx", module.ptx.as_bytes()), ("cubin", &cubin)]);
                let k = instantiate(self.gpu, meta, module.ptx, &cubin, Image::Cubin, times)?;
                Ok((k, Some(payload)))
            }
            Err(link_err) => {
                // The PTX route: the driver JITs at load. If that fails too, its log is
                // the error (the link's log is kept beside it).
                let payload = pack_sections(&[("meta", &meta_json), ("ptx", module.ptx.as_bytes())]);
                let bytes = module.ptx.clone().into_bytes();
                let times = BuildTimes { lower_ms, link_ms: 0.0, load_ms: 0.0 };
                match instantiate(self.gpu, meta, module.ptx, &bytes, Image::Ptx, times) {
                    Ok(k) => Ok((k, Some(payload))),
                    Err(RuntimeError::Jit { what, code, log }) => {
                        let mut log = format!("{log}\n(the cuLink route failed first: {link_err})");
                        if let Some(p) = &ptxas_err {
                            log.push_str(&format!("\n(and before it the external ptxas: {p})"));
                        }
                        Err(RuntimeError::Jit { what, code, log })
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spills send an `auto` choice to portable; a named family, and portable itself, run
    /// as assembled.
    #[test]
    fn only_an_auto_choice_falls_back_on_spills() {
        let hopper = Resolved { family: FamilyKind::Hopper, fallback_reason: None };
        let portable = Resolved { family: FamilyKind::Portable, fallback_reason: None };
        assert!(spill_fallback(FamilyChoice::Auto, &hopper));
        assert!(!spill_fallback(FamilyChoice::Exactly(FamilyKind::Hopper), &hopper));
        assert!(!spill_fallback(FamilyChoice::Auto, &portable));
    }

    /// The cache key's compiler changes with the compiler file (replaced by one of
    /// another size or time), without running it.
    #[test]
    fn a_compiler_is_keyed_by_its_file() {
        let dir = std::env::temp_dir().join(format!("attnc-ptxas-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("ptxas");
        std::fs::write(&path, b"one").expect("write");
        let a = file_identity("ptxas", &path);
        assert!(a.contains("ptxas") && a.contains("3 bytes"), "{a}");
        assert_eq!(a, file_identity("ptxas", &path), "stable while the file is");
        std::fs::write(&path, b"other").expect("write");
        assert_ne!(a, file_identity("ptxas", &path), "a replaced compiler is another key");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
