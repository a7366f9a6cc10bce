//! Running NVIDIA's offline tools on generated PTX: `ptxas` (assemble, with `-v` for the
//! per-kernel resource report) and `nvdisasm` / `cuobjdump` (SASS text for instruction
//! checks).
//!
//! attnc does not need the CUDA toolkit to *generate* PTX; these tools are how CI proves
//! the PTX is valid for every arch and fits its budgets (zero spills, registers and shared
//! memory within limits). They come from PyPI wheels, so no CUDA install is needed:
//!
//! ```text
//! python3 -m venv .venv
//! .venv/bin/pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump
//! ```
//!
//! # Where the tools are looked for
//! 1. the environment variable (`ATTNC_PTXAS`, `ATTNC_NVDISASM`, `ATTNC_CUOBJDUMP`); for
//!    the disassemblers also the directory of `ATTNC_PTXAS`;
//! 2. a `.venv` with the wheels, in the current directory or any parent, in the directory
//!    of the running executable or any parent, and in this crate's source tree (so
//!    `cargo test` finds the repository's `.venv`);
//! 3. `$CUDA_HOME/bin`, `$CUDA_PATH/bin`, then `PATH`.

use crate::arch::Arch;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// One of the NVIDIA command-line tools attnc drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tool {
    Ptxas,
    Nvdisasm,
    Cuobjdump,
}

impl Tool {
    pub fn exe_name(self) -> &'static str {
        match self {
            Tool::Ptxas => "ptxas",
            Tool::Nvdisasm => "nvdisasm",
            Tool::Cuobjdump => "cuobjdump",
        }
    }
    /// The environment variable that names the executable.
    pub fn env_var(self) -> &'static str {
        match self {
            Tool::Ptxas => "ATTNC_PTXAS",
            Tool::Nvdisasm => "ATTNC_NVDISASM",
            Tool::Cuobjdump => "ATTNC_CUOBJDUMP",
        }
    }
    /// The PyPI wheel that ships it.
    pub fn wheel(self) -> &'static str {
        match self {
            Tool::Ptxas => "nvidia-cuda-nvcc",
            Tool::Nvdisasm => "nvidia-cuda-nvdisasm",
            Tool::Cuobjdump => "nvidia-cuda-cuobjdump",
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.exe_name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PtxasError {
    #[error(
        "{tool} not found. Install it with `python3 -m venv .venv && .venv/bin/pip install {wheel}` \
         in the repository (or run `bash scripts/setup.sh`), or set {env}=/path/to/{tool}{detail}"
    )]
    NotFound { tool: Tool, wheel: &'static str, env: &'static str, detail: String },
    #[error("{tool}: {context}: {source}")]
    Io {
        tool: Tool,
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} failed for {arch} ({status}):\n{log}")]
    Failed { tool: Tool, arch: String, status: String, log: String },
    #[error("could not read ptxas -v output: {0}")]
    Parse(String),
}

impl PtxasError {
    fn not_found(tool: Tool, detail: String) -> PtxasError {
        PtxasError::NotFound { tool, wheel: tool.wheel(), env: tool.env_var(), detail }
    }
    fn io(tool: Tool, context: impl Into<String>, source: std::io::Error) -> PtxasError {
        PtxasError::Io { tool, context: context.into(), source }
    }
    /// True when the tool is simply not installed (tests skip on this).
    pub fn is_not_found(&self) -> bool {
        matches!(self, PtxasError::NotFound { .. })
    }
}

// ---------------------------------------------------------------------------------------
// Locating the tools
// ---------------------------------------------------------------------------------------

/// Subdirectories of `site-packages/nvidia/` that hold the tools' `bin/` in the CUDA 13
/// (`cu13`) and CUDA 12 (`cuda_nvcc`, ...) wheels.
const WHEEL_DIRS: &[&str] = &["cu13", "cu12", "cuda_nvcc", "cuda_nvdisasm", "cuda_cuobjdump"];

fn is_executable_file(p: &Path) -> bool {
    p.is_file()
}

/// `<dir>/.venv/lib/python*/site-packages/nvidia/<wheel dir>/bin/<exe>`.
fn venv_candidates(dir: &Path, exe: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for venv in [".venv", "venv"] {
        let lib = dir.join(venv).join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for py in pythons {
            for w in WHEEL_DIRS {
                out.push(py.join("site-packages").join("nvidia").join(w).join("bin").join(exe));
            }
        }
    }
    out
}

fn search_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            roots.push(dir.to_path_buf());
        }
    }
    roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let mut unique: Vec<PathBuf> = Vec::new();
    for r in roots {
        if !unique.contains(&r) {
            unique.push(r);
        }
    }
    unique
}

fn exe_file_name(exe: &str) -> String {
    if cfg!(windows) {
        format!("{exe}.exe")
    } else {
        exe.to_string()
    }
}

/// Finds `tool`, or explains how to install it.
pub fn locate(tool: Tool) -> Result<PathBuf, PtxasError> {
    let exe = exe_file_name(tool.exe_name());
    let mut searched: Vec<String> = Vec::new();

    // 1. The environment.
    if let Some(v) = std::env::var_os(tool.env_var()).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(v);
        if is_executable_file(&p) {
            return Ok(p);
        }
        return Err(PtxasError::not_found(
            tool,
            format!(" ({}={} is set but is not a file)", tool.env_var(), p.display()),
        ));
    }
    if tool != Tool::Ptxas {
        if let Some(v) = std::env::var_os(Tool::Ptxas.env_var()).filter(|v| !v.is_empty()) {
            if let Some(dir) = Path::new(&v).parent() {
                let p = dir.join(&exe);
                if is_executable_file(&p) {
                    return Ok(p);
                }
                searched.push(dir.display().to_string());
            }
        }
    }

    // 2. A venv with the wheels, walking up from the usual places.
    for root in search_roots() {
        for dir in root.ancestors() {
            for cand in venv_candidates(dir, &exe) {
                if is_executable_file(&cand) {
                    return Ok(cand);
                }
            }
        }
        searched.push(format!("{}/.venv (and parents)", root.display()));
    }

    // 3. CUDA installs and PATH.
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(PathBuf::from(v).join("bin"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    for dir in dirs {
        let p = dir.join(&exe);
        if is_executable_file(&p) {
            return Ok(p);
        }
    }
    searched.push("$CUDA_HOME/bin, $CUDA_PATH/bin, PATH".into());
    Err(PtxasError::not_found(tool, format!(" (searched: {})", searched.join("; "))))
}

/// Finds ptxas.
pub fn find_ptxas() -> Result<PathBuf, PtxasError> {
    locate(Tool::Ptxas)
}

/// The tool's `--version` banner, last line (e.g. "Cuda compilation tools, release 13.0, V13.0.88").
pub fn version(tool: Tool) -> Result<String, PtxasError> {
    let path = locate(tool)?;
    let out = Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|e| PtxasError::io(tool, format!("running {} --version", path.display()), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .rev()
        .find(|l| l.contains("release") || l.contains(", V"))
        .or_else(|| text.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("")
        .trim()
        .to_string())
}

// ---------------------------------------------------------------------------------------
// Temporary files
// ---------------------------------------------------------------------------------------

/// A private directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tool: Tool) -> Result<TempDir, PtxasError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let base = std::env::temp_dir();
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = base.join(format!("attnc-{}-{}-{}-{}", tool, std::process::id(), n, nanos));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(TempDir(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(PtxasError::io(tool, format!("creating {}", dir.display()), e)),
            }
        }
        Err(PtxasError::io(
            tool,
            "creating a temporary directory",
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no free name"),
        ))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// ptxas -v
// ---------------------------------------------------------------------------------------

/// What `ptxas -v` says about one function.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FunctionResources {
    pub name: String,
    /// A kernel (`.entry`), as opposed to a device function (`.func`).
    pub entry: bool,
    pub registers: u32,
    pub barriers: u32,
    pub stack_frame_bytes: u64,
    pub spill_store_bytes: u64,
    pub spill_load_bytes: u64,
    /// Static shared memory (`.shared` declarations); dynamic smem is chosen at launch.
    pub smem_bytes: u64,
    /// Constant memory over all banks (`cmem[0]` holds the kernel parameters).
    pub cmem_bytes: u64,
    pub cumulative_stack_bytes: u64,
}

impl FunctionResources {
    pub fn spill_bytes(&self) -> u64 {
        self.spill_store_bytes + self.spill_load_bytes
    }
}

/// The parsed `ptxas -v` log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerboseLog {
    /// Kernels and device functions, in the order ptxas reports them.
    pub functions: Vec<FunctionResources>,
    /// `ptxas warning` lines, verbatim.
    pub warnings: Vec<String>,
}

/// Parses the output of `ptxas -v` (ptxas prints it on stderr). Unknown lines are ignored,
/// so newer ptxas versions that add fields still parse.
pub fn parse_verbose(log: &str) -> VerboseLog {
    let mut out = VerboseLog::default();
    // Index into out.functions that "Used ..." and property lines refer to.
    let mut current: Option<usize> = None;

    fn index_of(funcs: &mut Vec<FunctionResources>, name: &str, entry: bool) -> usize {
        if let Some(i) = funcs.iter().position(|f| f.name == name) {
            funcs[i].entry |= entry;
            return i;
        }
        funcs.push(FunctionResources { name: name.to_string(), entry, ..Default::default() });
        funcs.len() - 1
    }

    for raw in log.lines() {
        let line = raw.trim();
        if line.starts_with("ptxas warning") {
            out.warnings.push(line.to_string());
            continue;
        }
        let body = match line.strip_prefix("ptxas info") {
            Some(rest) => rest.trim_start().trim_start_matches(':').trim(),
            None => line,
        };
        if let Some(rest) = body.strip_prefix("Compiling entry function") {
            if let Some(name) = quoted(rest) {
                current = Some(index_of(&mut out.functions, name, true));
            }
        } else if let Some(rest) = body.strip_prefix("Function properties for") {
            let name = rest.trim().trim_matches('\'');
            if !name.is_empty() {
                current = Some(index_of(&mut out.functions, name, false));
            }
        } else if let Some(rest) = body.strip_prefix("Used") {
            if let Some(i) = current {
                apply_fields(&mut out.functions[i], rest);
            }
        } else if body.contains("bytes stack frame") || body.contains("spill stores") {
            if let Some(i) = current {
                apply_fields(&mut out.functions[i], body);
            }
        }
    }
    out
}

/// The first `'...'` in `s`.
fn quoted(s: &str) -> Option<&str> {
    let start = s.find('\'')? + 1;
    let len = s[start..].find('\'')?;
    Some(&s[start..start + len])
}

/// Reads comma-separated `<number> <what>` pieces such as "10 registers",
/// "used 1 barriers", "1024 bytes smem", "372 bytes cmem[0]", "24 bytes spill stores".
fn apply_fields(f: &mut FunctionResources, text: &str) {
    for piece in text.split(',') {
        let piece = piece.trim();
        let piece = piece.strip_prefix("used ").unwrap_or(piece);
        let mut words = piece.split_whitespace();
        let Some(num) = words.next().and_then(|w| w.parse::<u64>().ok()) else {
            continue;
        };
        let rest: Vec<&str> = words.collect();
        let what = rest.join(" ");
        let what = what.strip_prefix("bytes ").unwrap_or(&what);
        match what {
            "registers" | "register" => f.registers = num as u32,
            "barriers" | "barrier" => f.barriers = num as u32,
            "stack frame" => f.stack_frame_bytes = num,
            "spill stores" => f.spill_store_bytes = num,
            "spill loads" => f.spill_load_bytes = num,
            "smem" => f.smem_bytes = num,
            "cumulative stack size" => f.cumulative_stack_bytes = num,
            w if w.starts_with("cmem") => f.cmem_bytes += num,
            _ => {}
        }
    }
}

/// The result of assembling one PTX module.
#[derive(Clone, Debug)]
pub struct PtxasReport {
    pub arch: Arch,
    /// The ptxas that ran.
    pub ptxas: PathBuf,
    /// Kernels (`.entry`), in ptxas's order.
    pub kernels: Vec<FunctionResources>,
    /// Device functions ptxas kept out of line (usually none).
    pub functions: Vec<FunctionResources>,
    pub warnings: Vec<String>,
    /// The full `-v` output.
    pub log: String,
    /// The assembled ELF (cubin), for [`disassemble`].
    pub cubin: Vec<u8>,
}

/// ptxas's info codes for a wgmma pipeline it serialized (each wgmma waits for the last):
/// registers of an in-flight wgmma reused or read by other instructions (C7512–C7517: C7514
/// is the accumulators of a wgmma in flight across a loop's back edge), or a branch it
/// takes for divergent around the GEMMs (C7519). Any of them costs a hopper kernel a third
/// of its speed.
pub const WGMMA_SERIALIZED: [&str; 6] = ["C7512", "C7513", "C7514", "C7515", "C7517", "C7519"];

impl PtxasReport {
    pub fn kernel(&self, name: &str) -> Option<&FunctionResources> {
        self.kernels.iter().find(|k| k.name == name)
    }
    /// The first line of the log reporting a serialized wgmma pipeline in `kernel`.
    pub fn wgmma_serialized(&self, kernel: &str) -> Option<&str> {
        self.log.lines().find(|l| WGMMA_SERIALIZED.iter().any(|c| l.contains(c)) && l.contains(kernel))
    }
    /// Spill bytes (stores + loads) over every kernel and device function.
    pub fn total_spill_bytes(&self) -> u64 {
        self.kernels.iter().chain(&self.functions).map(|f| f.spill_bytes()).sum()
    }
    pub fn has_spills(&self) -> bool {
        self.total_spill_bytes() > 0
    }
    /// SASS text of the cubin.
    pub fn disassemble(&self) -> Result<String, PtxasError> {
        disassemble(&self.cubin)
    }
}

/// Assembles `ptx` for `arch` with the ptxas [`locate`] finds.
pub fn assemble(ptx: &str, arch: Arch) -> Result<PtxasReport, PtxasError> {
    let ptxas = find_ptxas()?;
    assemble_with(&ptxas, ptx, arch)
}

/// Assembles `ptx` for `arch` with a given ptxas:
/// `ptxas -arch=<arch> -v [-split-compile=N] -o kernel.cubin kernel.ptx` in a private temp
/// directory. A module of several kernels has ptxas compile them on up to one thread each
/// (`-split-compile`, where this ptxas has it): the same SASS, the cold compile of a
/// backward or block-mask module shorter (document mask, 2 cores: forward 474 → 405 ms,
/// backward 371 → 291 ms).
pub fn assemble_with(ptxas: &Path, ptx: &str, arch: Arch) -> Result<PtxasReport, PtxasError> {
    let tool = Tool::Ptxas;
    let tmp = TempDir::new(tool)?;
    let ptx_path = tmp.path().join("kernel.ptx");
    let cubin_path = tmp.path().join("kernel.cubin");
    std::fs::write(&ptx_path, ptx).map_err(|e| PtxasError::io(tool, format!("writing {}", ptx_path.display()), e))?;
    let mut cmd = Command::new(ptxas);
    cmd.current_dir(tmp.path()).arg(format!("-arch={}", arch.name())).arg("-v");
    if let Some(threads) = split_compile_threads(ptxas, ptx) {
        cmd.arg(format!("-split-compile={threads}"));
    }
    let out = cmd
        .arg("-o")
        .arg("kernel.cubin")
        .arg("kernel.ptx")
        .output()
        .map_err(|e| PtxasError::io(tool, format!("running {}", ptxas.display()), e))?;
    let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        log.push_str(&stdout);
    }
    if !out.status.success() {
        return Err(PtxasError::Failed {
            tool,
            arch: arch.name().to_string(),
            status: out.status.to_string(),
            log: annotate_errors(&log, ptx),
        });
    }
    let cubin =
        std::fs::read(&cubin_path).map_err(|e| PtxasError::io(tool, format!("reading {}", cubin_path.display()), e))?;
    let parsed = parse_verbose(&log);
    let (kernels, functions): (Vec<_>, Vec<_>) = parsed.functions.into_iter().partition(|f| f.entry);
    if kernels.is_empty() && ptx.contains(".entry") {
        return Err(PtxasError::Parse(format!(
            "the PTX has kernels but `ptxas -v` reported none; its output was:\n{log}"
        )));
    }
    Ok(PtxasReport { arch, ptxas: ptxas.to_path_buf(), kernels, functions, warnings: parsed.warnings, log, cubin })
}

/// Threads for `-split-compile`: one per kernel of `ptx`, at most the CPUs this process
/// may use; `None` for a single kernel or a ptxas without the option (asked once per
/// ptxas path: `ptxas --help`).
fn split_compile_threads(ptxas: &Path, ptx: &str) -> Option<usize> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    let kernels =
        ptx.lines().filter(|l| l.trim_start().starts_with(".visible .entry") || l.starts_with(".entry")).count();
    if kernels < 2 {
        return None;
    }
    static HAS_OPTION: OnceLock<Mutex<HashMap<PathBuf, bool>>> = OnceLock::new();
    let cache = HAS_OPTION.get_or_init(|| Mutex::new(HashMap::new()));
    let known = cache.lock().unwrap_or_else(|e| e.into_inner()).get(ptxas).copied();
    let has = match known {
        Some(h) => h,
        None => {
            let h = Command::new(ptxas)
                .arg("--help")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("--split-compile"))
                .unwrap_or(false);
            cache.lock().unwrap_or_else(|e| e.into_inner()).insert(ptxas.to_path_buf(), h);
            h
        }
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (has && cpus > 1).then(|| kernels.min(cpus))
}

/// Adds the PTX source line under each `ptxas kernel.ptx, line N; error : ...` message.
fn annotate_errors(log: &str, ptx: &str) -> String {
    let src: Vec<&str> = ptx.lines().collect();
    let mut out = String::new();
    for line in log.lines() {
        out.push_str(line);
        out.push('\n');
        if let Some(n) = line
            .split_once(", line ")
            .and_then(|(_, rest)| rest.split(';').next())
            .and_then(|n| n.trim().parse::<usize>().ok())
        {
            if let Some(text) = n.checked_sub(1).and_then(|i| src.get(i)) {
                out.push_str(&format!("    {n:>5} | {}\n", text.trim_end()));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// SASS
// ---------------------------------------------------------------------------------------

/// SASS text of a cubin: `nvdisasm -c` (code sections only), or `cuobjdump -sass` when
/// nvdisasm is not installed.
pub fn disassemble(cubin: &[u8]) -> Result<String, PtxasError> {
    let (tool, path) = match locate(Tool::Nvdisasm) {
        Ok(p) => (Tool::Nvdisasm, p),
        Err(nv_err) => match locate(Tool::Cuobjdump) {
            Ok(p) => (Tool::Cuobjdump, p),
            Err(_) => return Err(nv_err),
        },
    };
    let tmp = TempDir::new(tool)?;
    let cubin_path = tmp.path().join("kernel.cubin");
    std::fs::write(&cubin_path, cubin)
        .map_err(|e| PtxasError::io(tool, format!("writing {}", cubin_path.display()), e))?;
    let mut cmd = Command::new(&path);
    cmd.current_dir(tmp.path());
    match tool {
        Tool::Cuobjdump => cmd.arg("-sass"),
        _ => cmd.arg("-c"),
    };
    let out =
        cmd.arg("kernel.cubin").output().map_err(|e| PtxasError::io(tool, format!("running {}", path.display()), e))?;
    if !out.status.success() {
        return Err(PtxasError::Failed {
            tool,
            arch: "cubin".into(),
            status: out.status.to_string(),
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The part of disassembly text that belongs to function `name` (from its
/// `.section .text.<name>` to the next section), or `None` when it is not there.
pub fn sass_function<'s>(sass: &'s str, name: &str) -> Option<&'s str> {
    let header = format!(".text.{name},");
    let start = sass.find(&header)?;
    let rest = &sass[start + header.len()..];
    let end = rest.find("\t.section").or_else(|| rest.find(" .section")).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// SASS opcodes (the mnemonic before the first `.`, e.g. `HMMA`, `LDGSTS`, `UTMALDG`) in
/// disassembly text, with how often each occurs.
pub fn sass_opcode_counts(sass: &str) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for line in sass.lines() {
        let line = line.trim();
        // Instruction lines start with an address comment: `/*0040*/  LDG.E R0, [R2.64] ;`
        let Some(rest) = line.strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r) else {
            continue;
        };
        let mut rest = rest.trim();
        if rest.is_empty() || rest.starts_with("/*") {
            continue;
        }
        // Predicated instruction: `@P0 BRA ...` / `@!P1 ...`.
        if rest.starts_with('@') {
            rest = rest.split_once(char::is_whitespace).map(|(_, r)| r.trim()).unwrap_or("");
        }
        let mnemonic = rest.split(|c: char| c.is_whitespace() || c == ';').next().unwrap_or("");
        let base = mnemonic.split('.').next().unwrap_or("");
        if !base.is_empty() && base.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
            *counts.entry(base.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real `ptxas -v` output (CUDA 13, PyPI nvidia-cuda-nvcc) for the kernels below.
    const SM80_TWO_KERNELS: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'with_local' for 'sm_80'
ptxas info    : Function properties for with_local
    256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 256 bytes cumulative stack size, 364 bytes cmem[0]
ptxas info    : Compile time = 2.332 ms
ptxas info    : Compiling entry function 'add_one' for 'sm_80'
ptxas info    : Function properties for add_one
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 1024 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 0.885 ms
";

    const SM90A_TWO_KERNELS: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'with_local' for 'sm_90a'
ptxas info    : Function properties for with_local
    256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 256 bytes cumulative stack size
ptxas info    : Compile time = 2.312 ms
ptxas info    : Compiling entry function 'add_one' for 'sm_90a'
ptxas info    : Function properties for add_one
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 1024 bytes smem
ptxas info    : Compile time = 1.200 ms
";

    // 40 live floats under `.maxnreg 16`.
    const SM80_SPILLS: &str = "\
ptxas warning : For entry spilly adjusting per thread register count of 16 to lower bound of 24
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spilly' for 'sm_80'
ptxas info    : Function properties for spilly
    24 bytes stack frame, 24 bytes spill stores, 24 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 24 bytes cumulative stack size, 360 bytes cmem[0]
ptxas info    : Compile time = 3.180 ms
";

    // A kernel calling a `.func` that ptxas kept out of line.
    const SM80_DEVICE_FUNCTION: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'calls' for 'sm_80'
ptxas info    : Function properties for calls
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.194 ms
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";

    const TWO_KERNELS_PTX: &str = r#".version 8.0
.target sm_80
.address_size 64

.visible .entry add_one(
	.param .u64 p_out,
	.param .u64 p_in,
	.param .u32 n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<3>;
	.reg .b64 %rd<8>;
	.shared .align 4 .b8 tile[1024];

	ld.param.u64 %rd1, [p_out];
	ld.param.u64 %rd2, [p_in];
	ld.param.u32 %r1, [n];
	mov.u32 %r2, %tid.x;
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mad.lo.s32 %r5, %r3, %r4, %r2;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd3, %rd2;
	mul.wide.u32 %rd4, %r5, 4;
	add.s64 %rd5, %rd3, %rd4;
	ld.global.f32 %f1, [%rd5];
	add.f32 %f2, %f1, 0f3F800000;
	cvta.to.global.u64 %rd6, %rd1;
	add.s64 %rd7, %rd6, %rd4;
	st.global.f32 [%rd7], %f2;
DONE:
	ret;
}

.visible .entry with_local(
	.param .u64 p_out,
	.param .u32 idx
)
{
	.local .align 4 .b8 buf[256];
	.reg .b32 %r<4>;
	.reg .b64 %rd<6>;
	ld.param.u64 %rd1, [p_out];
	ld.param.u32 %r1, [idx];
	mov.u64 %rd2, buf;
	mul.wide.u32 %rd3, %r1, 4;
	add.s64 %rd4, %rd2, %rd3;
	st.local.u32 [%rd4], %r1;
	ld.local.u32 %r2, [buf+4];
	cvta.to.global.u64 %rd5, %rd1;
	st.global.u32 [%rd5], %r2;
	ret;
}
"#;

    /// A module of several kernels assembles on several threads (`-split-compile`) into
    /// the same SASS as on one; a single kernel never asks for it.
    #[test]
    fn several_kernels_split_the_compile_into_the_same_sass() {
        let Ok(ptxas) = find_ptxas() else {
            assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
            return;
        };
        let kernel = |name: &str| {
            format!(
                ".visible .entry {name}(.param .u64 p)\n{{\n.reg .b64 %rd<3>;\n.reg .b32 %r<3>;\n\
                 ld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd2, %rd1;\nmov.u32 %r1, %tid.x;\n\
                 mul.lo.s32 %r2, %r1, 3;\nst.global.u32 [%rd2], %r2;\nret;\n}}\n"
            )
        };
        let head = ".version 8.0\n.target sm_90a\n.address_size 64\n";
        let two = format!("{head}{}{}", kernel("k_a"), kernel("k_b"));
        let one = format!("{head}{}", kernel("k_a"));
        assert_eq!(split_compile_threads(&ptxas, &one), None);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let help = Command::new(&ptxas).arg("--help").output().expect("ptxas --help");
        if cpus > 1 && String::from_utf8_lossy(&help.stdout).contains("--split-compile") {
            assert_eq!(split_compile_threads(&ptxas, &two), Some(2));
        }
        let split = assemble_with(&ptxas, &two, Arch::Sm90a).expect("assembles");
        assert_eq!(split.kernels.len(), 2);
        // The same module on one thread, by hand.
        let dir = std::env::temp_dir().join(format!("attnc-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("k.ptx"), &two).expect("write");
        let st = Command::new(&ptxas)
            .current_dir(&dir)
            .args(["-arch=sm_90a", "-o", "k.cubin", "k.ptx"])
            .status()
            .expect("ptxas runs");
        assert!(st.success());
        let plain = std::fs::read(dir.join("k.cubin")).expect("cubin");
        let _ = std::fs::remove_dir_all(&dir);
        if let (Ok(a), Ok(b)) = (disassemble(&split.cubin), disassemble(&plain)) {
            assert_eq!(a, b, "split and single-threaded SASS differ");
        }
    }

    #[test]
    fn parses_two_kernels_sm80() {
        let log = parse_verbose(SM80_TWO_KERNELS);
        assert!(log.warnings.is_empty());
        assert_eq!(log.functions.len(), 2);
        let wl = &log.functions[0];
        assert_eq!(wl.name, "with_local");
        assert!(wl.entry);
        assert_eq!(wl.registers, 8);
        assert_eq!(wl.stack_frame_bytes, 256);
        assert_eq!(wl.cumulative_stack_bytes, 256);
        assert_eq!(wl.spill_bytes(), 0);
        assert_eq!(wl.smem_bytes, 0);
        assert_eq!(wl.cmem_bytes, 364);
        let add = &log.functions[1];
        assert_eq!(
            add,
            &FunctionResources {
                name: "add_one".into(),
                entry: true,
                registers: 10,
                barriers: 0,
                stack_frame_bytes: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
                smem_bytes: 1024,
                cmem_bytes: 372,
                cumulative_stack_bytes: 0,
            }
        );
    }

    #[test]
    fn parses_sm90a_without_cmem() {
        let log = parse_verbose(SM90A_TWO_KERNELS);
        assert_eq!(log.functions.len(), 2);
        assert_eq!(log.functions[1].name, "add_one");
        assert_eq!(log.functions[1].registers, 10);
        assert_eq!(log.functions[1].smem_bytes, 1024);
        assert_eq!(log.functions[1].cmem_bytes, 0);
    }

    #[test]
    fn parses_spills_and_warnings() {
        let log = parse_verbose(SM80_SPILLS);
        assert_eq!(log.warnings.len(), 1);
        assert!(log.warnings[0].contains("adjusting per thread register count"));
        let f = &log.functions[0];
        assert_eq!(f.name, "spilly");
        assert_eq!(f.registers, 24);
        assert_eq!(f.barriers, 1);
        assert_eq!(f.spill_store_bytes, 24);
        assert_eq!(f.spill_load_bytes, 24);
        assert_eq!(f.spill_bytes(), 48);
        assert_eq!(f.stack_frame_bytes, 24);
    }

    #[test]
    fn separates_device_functions() {
        let log = parse_verbose(SM80_DEVICE_FUNCTION);
        assert_eq!(log.functions.len(), 2);
        assert!(log.functions[0].entry);
        assert_eq!(log.functions[0].registers, 10);
        assert_eq!(log.functions[1].name, "helper");
        assert!(!log.functions[1].entry);
        // The `Used` line of `calls` must not leak into `helper`.
        assert_eq!(log.functions[1].registers, 0);
    }

    #[test]
    fn ignores_garbage() {
        let log = parse_verbose("ptxas info : Used banana registers\nhello\n, , ,\nptxas info    : Used 7\n");
        assert!(log.functions.is_empty());
    }

    #[test]
    fn annotates_error_lines() {
        let log = "ptxas kernel.ptx, line 2; error   : Unknown modifier '.bar'\nptxas fatal   : Ptx assembly aborted due to errors\n";
        let out = annotate_errors(log, "a\nfoo.bar %r1;\nc\n");
        assert!(out.contains("    2 | foo.bar %r1;"), "{out}");
    }

    #[test]
    fn sass_opcodes() {
        let sass = "\
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;
        /*0040*/                   LDG.E R0, [R2.64] ;
        /*0050*/               @P0 EXIT ;
        /*0060*/               @!P0 BRA `(.L_x_1) ;
        /*0070*/                   STG.E [R2.64], R7 ;
.L_x_1:
        /*0080*/                   EXIT ;
";
        let c = sass_opcode_counts(sass);
        assert_eq!(c.get("IMAD"), Some(&1));
        assert_eq!(c.get("LDG"), Some(&1));
        assert_eq!(c.get("BRA"), Some(&1));
        assert_eq!(c.get("EXIT"), Some(&2));
    }

    /// Real nvdisasm lines (CUDA 13) of hand-written wgmma / TMA (sm_90a) and tcgen05
    /// (sm_100a) kernels: the opcodes the hopper and blackwell families promise.
    #[test]
    fn sass_opcodes_of_hopper_and_blackwell() {
        let sass = "\
        /*0100*/               @P0 ELECT P1, URZ, PT ;
        /*0110*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0140*/               @P0 BRA.U.ANY `(.L_x_0) ;
        /*0150*/                   WARPGROUP.ARRIVE ;
        /*0170*/              @!P0 BRA `(.L_x_1) ;
        /*0190*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*01a0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0330*/                   UTCHMMA gdesc[UR12], gdesc[UR14], tmem[UR6], tmem[UR4], idesc[UR5], !UPT ;
        /*0390*/                   UTCBAR [UR9], URZ ;
";
        let c = sass_opcode_counts(sass);
        for (op, n) in
            [("UTMALDG", 1), ("HGMMA", 1), ("UTCHMMA", 1), ("UTCBAR", 1), ("WARPGROUP", 2), ("BRA", 2), ("ELECT", 1)]
        {
            assert_eq!(c.get(op), Some(&n), "{op}: {c:?}");
        }
    }

    #[test]
    fn not_found_message_says_how_to_install() {
        let e = PtxasError::not_found(Tool::Ptxas, String::new());
        let msg = e.to_string();
        assert!(msg.contains("python3 -m venv .venv && .venv/bin/pip install nvidia-cuda-nvcc"), "{msg}");
        assert!(msg.contains("ATTNC_PTXAS"), "{msg}");
        assert!(e.is_not_found());
    }

    /// Runs the real ptxas when it is installed (skips otherwise).
    #[test]
    fn assembles_with_real_ptxas() {
        let ptxas = match find_ptxas() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skipping: {e}");
                return;
            }
        };
        let report = match assemble_with(&ptxas, TWO_KERNELS_PTX, Arch::Sm80) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(report.kernels.len(), 2);
        let add = report.kernel("add_one").expect("add_one reported");
        assert_eq!(add.smem_bytes, 1024);
        assert!(add.registers > 0);
        assert!(!report.has_spills());
        assert!(!report.cubin.is_empty());
        match report.disassemble() {
            Ok(sass) => {
                let ops = sass_opcode_counts(&sass);
                assert!(ops.contains_key("EXIT"), "{sass}");
                assert!(ops.contains_key("LDG"), "{sass}");
            }
            Err(e) if e.is_not_found() => eprintln!("skipping SASS: {e}"),
            Err(e) => panic!("{e}"),
        }
        // Errors come back with the offending PTX line.
        let bad = TWO_KERNELS_PTX.replace("add.f32 %f2", "frobnicate.f32 %f2");
        match assemble_with(&ptxas, &bad, Arch::Sm80) {
            Err(PtxasError::Failed { log, .. }) => {
                assert!(log.contains("| \tfrobnicate") || log.contains("frobnicate"), "{log}")
            }
            other => panic!("expected a ptxas failure, got {other:?}"),
        }
    }
}
