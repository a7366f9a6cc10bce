//! Cross-crate test: every `dsl-examples/*.attn` goes DSL -> IR -> PTX for sm_80, sm_90a
//! and sm_100a, forward and (where the variant has one) backward, with the family the
//! dispatcher picks (`Auto`) and with the portable family; then, when ptxas is installed, every distinct PTX is assembled and must have
//! zero spills, shared memory within the arch's limit, and the SASS instructions its
//! family promises. The resource table is printed on stderr (uncaptured).
//!
//! Without ptxas the assembly test is skipped with a message, except when `CI` is set:
//! CI must have ptxas (`bash scripts/setup.sh` installs it).

use attnc::ptxas::{self, FunctionResources, PtxasReport};
use attnc::{Arch, CompileOptions, CompiledModule, Direction, FamilyChoice, FamilyKind, Spec};
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

const CHOICES: [FamilyChoice; 2] = [FamilyChoice::Auto, FamilyChoice::Exactly(FamilyKind::Portable)];

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../dsl-examples")
}

fn example_files() -> Vec<PathBuf> {
    // The examples, plus the GPU coverage specs (head dims and paged layouts no example
    // uses): both must compile cleanly everywhere.
    let gpu_specs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/gpu-specs");
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in [examples_dir(), gpu_specs] {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => panic!("cannot read {}: {e}", dir.display()),
        };
        let found: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "attn"))
            .collect();
        assert!(!found.is_empty(), "no .attn files in {}", dir.display());
        files.extend(found);
    }
    files.sort();
    files
}

fn stem(p: &std::path::Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

fn choice_name(c: FamilyChoice) -> String {
    match c {
        FamilyChoice::Auto => "auto".into(),
        FamilyChoice::Exactly(f) => f.to_string(),
    }
}

/// Writes past the test harness's output capture, so CI logs show it.
fn say(text: &str) {
    let _ = std::io::stderr().write_all(text.as_bytes());
}

type Parsed = Vec<(String, Result<Spec, String>)>;

fn parsed() -> &'static Parsed {
    static P: OnceLock<Parsed> = OnceLock::new();
    P.get_or_init(|| {
        example_files().into_iter().map(|p| (stem(&p), attnc::load_spec(&p).map_err(|d| d.to_string()))).collect()
    })
}

struct Compiled {
    example: String,
    arch: Arch,
    direction: Direction,
    choice: FamilyChoice,
    result: Result<CompiledModule, String>,
}

fn compiled() -> &'static Vec<Compiled> {
    static C: OnceLock<Vec<Compiled>> = OnceLock::new();
    C.get_or_init(|| {
        // The module checks include the LLVM IR text, which compiles keep only when asked.
        attnc::lower::llvm::keep_llvm_ir(true);
        let mut out = Vec::new();
        for (name, spec) in parsed() {
            let Ok(spec) = spec else { continue };
            let directions: Vec<Direction> = Direction::ALL
                .into_iter()
                .filter(|&d| attnc::lower::compile::pass_unsupported_reason(spec, d).is_none())
                .collect();
            for arch in Arch::ALL {
                for &direction in &directions {
                    for choice in CHOICES {
                        let opts = CompileOptions::new(arch).family(choice).direction(direction);
                        let result = attnc::compile(spec, &opts).map_err(|e| e.to_string());
                        out.push(Compiled { example: name.clone(), arch, direction, choice, result });
                    }
                }
            }
        }
        out
    })
}

#[test]
fn every_example_parses() {
    let failures: Vec<String> =
        parsed().iter().filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}.attn:\n{e}"))).collect();
    assert!(failures.is_empty(), "examples that do not parse:\n{}", failures.join("\n"));
}

/// Structural checks of a module that need no ptxas.
fn label(c: &Compiled) -> String {
    format!("{} [{} {} {}]", c.example, c.arch, c.direction.name(), choice_name(c.choice))
}

fn module_problems(c: &Compiled, m: &CompiledModule) -> Vec<String> {
    let mut p = Vec::new();
    let what = label(c);
    if m.direction != c.direction {
        p.push(format!("{what}: module says direction {}", m.direction));
    }
    if m.kernels.iter().any(|k| !k.role.belongs_to(c.direction)) {
        p.push(format!("{what}: a kernel's role belongs to the other direction"));
    }
    if m.arch != c.arch {
        p.push(format!("{what}: module says arch {}", m.arch));
    }
    if let FamilyChoice::Exactly(f) = c.choice {
        if m.family != f {
            p.push(format!("{what}: asked for {f}, got {}", m.family));
        }
        if m.fallback_reason.is_some() {
            p.push(format!("{what}: explicit family but a fallback reason is set"));
        }
    }
    if m.kernels.is_empty() {
        p.push(format!("{what}: no kernels"));
    }
    let target = format!(".target {}", c.arch.name());
    if !m.ptx.contains(&target) {
        p.push(format!("{what}: PTX lacks `{target}`"));
    }
    for k in &m.kernels {
        if !m.ptx.contains(&format!(".entry {}", k.name)) {
            p.push(format!("{what}: kernel {} has no .entry in the PTX", k.name));
        }
        if k.threads_per_block == 0 || k.threads_per_block > 1024 || k.threads_per_block % 32 != 0 {
            p.push(format!("{what}: kernel {} has {} threads per block", k.name, k.threads_per_block));
        }
        if k.dynamic_smem_bytes > c.arch.max_smem_per_block() {
            p.push(format!(
                "{what}: kernel {} asks for {} bytes of dynamic smem (limit {})",
                k.name,
                k.dynamic_smem_bytes,
                c.arch.max_smem_per_block()
            ));
        }
    }
    if m.llvm_ir.is_empty() {
        p.push(format!("{what}: empty LLVM IR"));
    }
    p
}

#[test]
fn every_example_compiles_for_every_arch() {
    let mut failures = Vec::new();
    for c in compiled() {
        match &c.result {
            Ok(m) => failures.extend(module_problems(c, m)),
            Err(e) => failures.push(format!("{}: {e}", label(c))),
        }
    }
    let total = compiled().len();
    assert!(failures.is_empty(), "{} of {total} compiles failed:\n{}", failures.len(), failures.join("\n"));
    assert!(total > 0, "nothing compiled (do the examples parse?)");
}

/// SASS opcodes each family's kernels must contain (the instructions it promises).
fn promised_sass(m: &CompiledModule) -> &'static [&'static str] {
    let tma = m.kernels.iter().any(|k| !k.tensor_maps.is_empty());
    match m.family {
        // mma.sync
        FamilyKind::Portable => &["HMMA"],
        // wgmma; TMA loads, or the cp.async gather of paged KV
        FamilyKind::Hopper if tma => &["HGMMA", "UTMALDG"],
        FamilyKind::Hopper => &["HGMMA", "LDGSTS"],
        // tcgen05.mma, TMA loads
        FamilyKind::Blackwell => &["UTCHMMA", "UTMALDG"],
    }
}

struct Assembled {
    label: String,
    family: FamilyKind,
    kernels: Vec<FunctionResources>,
    dyn_smem: Vec<u32>,
    problems: Vec<String>,
}

/// `expect_mma`: false for a mask that allows nothing anywhere (every tile empty: the
/// kernels do no matrix math, and LLVM rightly deletes it).
fn assemble_one(c: &Compiled, m: &CompiledModule, ptxas_path: &std::path::Path, expect_mma: bool) -> Assembled {
    let label = label(c);
    let mut a = Assembled {
        label: label.clone(),
        family: m.family,
        kernels: Vec::new(),
        dyn_smem: Vec::new(),
        problems: Vec::new(),
    };
    let report: PtxasReport = match ptxas::assemble_with(ptxas_path, &m.ptx, c.arch) {
        Ok(r) => r,
        Err(e) => {
            a.problems.push(format!("{label}: {e}"));
            return a;
        }
    };
    // wgmma pipelines that ptxas serializes (C7513: a non-wgmma instruction writes a
    // wgmma input in flight; C7515/C7517: accumulators touched / a wait injected; C7519:
    // a branch it takes for divergent around the GEMMs) cost the hopper family a third of
    // its speed on the H100: a defect, like a spill.
    for code in ptxas::WGMMA_SERIALIZED {
        if report.log.contains(code) {
            a.problems.push(format!(
                "{label}: ptxas serializes wgmma ({code}): {}",
                report.log.lines().find(|l| l.contains(code)).unwrap_or("").trim()
            ));
        }
    }
    for f in report.kernels.iter().chain(&report.functions) {
        if f.spill_bytes() > 0 {
            a.problems.push(format!(
                "{label}: {} spills ({} bytes stored, {} loaded)",
                f.name, f.spill_store_bytes, f.spill_load_bytes
            ));
        }
    }
    for info in &m.kernels {
        match report.kernel(&info.name) {
            None => a.problems.push(format!("{label}: ptxas did not report kernel {}", info.name)),
            Some(k) => {
                let smem = k.smem_bytes + info.dynamic_smem_bytes as u64;
                if smem > c.arch.max_smem_per_block() as u64 {
                    a.problems.push(format!(
                        "{label}: {} uses {smem} bytes of smem (limit {})",
                        k.name,
                        c.arch.max_smem_per_block()
                    ));
                }
                let regs = (k.registers as u64).div_ceil(8) * 8;
                if regs * info.threads_per_block as u64 > 64 * 1024 {
                    a.problems.push(format!(
                        "{label}: {} needs {} registers x {} threads, more than an SM's 65536",
                        k.name, k.registers, info.threads_per_block
                    ));
                }
                a.kernels.push(k.clone());
                a.dyn_smem.push(info.dynamic_smem_bytes);
            }
        }
    }
    match report.disassemble() {
        Ok(sass) => {
            let ops = ptxas::sass_opcode_counts(&sass);
            for op in promised_sass(m).iter().filter(|_| expect_mma) {
                if !ops.contains_key(*op) {
                    a.problems.push(format!("{label}: the {} family promises {op}, the SASS has none", m.family));
                }
            }
        }
        Err(e) if e.is_not_found() => {
            if std::env::var_os("CI").is_some() {
                a.problems.push(format!("{label}: CI must have nvdisasm or cuobjdump: {e}"));
            }
        }
        Err(e) => a.problems.push(format!("{label}: disassembly failed: {e}")),
    }
    a
}

#[test]
fn every_example_assembles_without_spills() {
    let ptxas_path = match ptxas::find_ptxas() {
        Ok(p) => p,
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but ptxas is missing: {e}");
            }
            say(&format!("SKIPPED every_example_assembles_without_spills: {e}\n"));
            return;
        }
    };
    // Auto often falls back to portable: assemble each distinct PTX once.
    let mut jobs: Vec<(&Compiled, &CompiledModule)> = Vec::new();
    for c in compiled() {
        if let Ok(m) = &c.result {
            if !jobs.iter().any(|(j, jm)| j.arch == c.arch && jm.ptx == m.ptx) {
                jobs.push((c, m));
            }
        }
    }
    assert!(!jobs.is_empty(), "nothing compiled, nothing to assemble");

    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).min(8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<(usize, Assembled)>> = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((c, m)) = jobs.get(i) else { break };
                let a = assemble_one(c, m, &ptxas_path, true);
                if let Ok(mut r) = results.lock() {
                    r.push((i, a));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|(i, _)| *i);

    let mut table = String::from("\nptxas resources per example (ptxas -v):\n");
    table.push_str(&format!(
        "{:<44} {:<9} {:<40} {:>5} {:>8} {:>9} {:>9}\n",
        "example [arch pass choice]", "family", "kernel", "regs", "spill B", "smem B", "dyn smem"
    ));
    let mut problems = Vec::new();
    for (_, a) in &results {
        for (k, dynamic) in a.kernels.iter().zip(&a.dyn_smem) {
            table.push_str(&format!(
                "{:<44} {:<9} {:<40} {:>5} {:>8} {:>9} {:>9}\n",
                a.label,
                a.family.to_string(),
                k.name,
                k.registers,
                k.spill_bytes(),
                k.smem_bytes,
                dynamic
            ));
        }
        problems.extend(a.problems.iter().cloned());
    }
    say(&table);
    assert_eq!(results.len(), jobs.len(), "an assembly worker died");
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// Paged KV and split-KV are inference layouts: asking for their backward is an error that
/// names the layout, never a kernel.
#[test]
fn inference_layouts_have_no_backward() {
    let mut checked = 0;
    for (name, spec) in parsed() {
        let Ok(spec) = spec else { continue };
        let Some(why) = attnc::lower::compile::pass_unsupported_reason(spec, Direction::Backward) else { continue };
        let opts = CompileOptions::new(Arch::Sm90a).direction(Direction::Backward);
        match attnc::compile(spec, &opts) {
            Ok(_) => panic!("{name}: a backward compiled for an inference layout"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("no backward pass") && msg.contains(&why), "{name}: {msg}");
            }
        }
        checked += 1;
    }
    assert!(checked >= 2, "the examples should include paged or split-KV variants");
}

/// `compile_directions` (a thread per direction) gives what `compile` gives for each
/// direction, in the order asked, and the backward of an inference layout as its error.
#[test]
fn compile_directions_matches_compile() {
    let spec = |name: &str| {
        parsed()
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, s)| s.as_ref().ok())
            .unwrap_or_else(|| panic!("example {name} parses"))
    };
    let base = CompileOptions::new(Arch::Sm90a);
    let dirs = [Direction::Backward, Direction::Forward];
    let s = spec("alibi_learned");
    let both = attnc::compile_directions(s, &base, &dirs);
    assert_eq!(both.len(), 2);
    for (d, m) in dirs.iter().zip(&both) {
        let m = m.as_ref().unwrap_or_else(|e| panic!("{d}: {e}"));
        let alone = attnc::compile(s, &base.clone().direction(*d)).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!(m.direction, *d);
        assert_eq!(m.ptx, alone.ptx, "{d}: the PTX depends on the thread it was built on");
    }
    let paged = attnc::compile_directions(spec("gqa_decode_paged"), &base, &dirs);
    assert!(paged[0].is_err() && paged[1].is_ok());
}

/// Every *valid* spec, not only the examples, compiles for every arch in both directions
/// (where it has them), with the dispatcher's family and with portable (the fallback
/// everywhere), and assembles with zero spills and within its budgets — after stepping
/// down to a smaller configuration where the default spills, as the runtime does
/// (`compile_without_spills`). Random specs from
/// `attnc_ir::generate`: `ATTNC_SPEC_SWEEP` of them (default 12, what CI runs) from seed
/// `ATTNC_SPEC_SWEEP_SEED` (default fixed), on `ATTNC_SPEC_SWEEP_JOBS` threads (default:
/// the cores, at most 8). A failure prints each failing spec as `.attn`.
#[test]
fn random_specs_compile_and_assemble_without_spills() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let count = env("ATTNC_SPEC_SWEEP", 12) as usize;
    let seed = env("ATTNC_SPEC_SWEEP_SEED", 0x5eed_a77c);
    let mut rng = attnc::ir::reference::Rng::new(seed);
    let specs: Vec<Spec> =
        (0..count).map(|i| attnc::ir::generate::random_spec(&mut rng, &format!("random_{seed:x}_{i}"))).collect();
    sweep(&specs, &format!("random specs: {count} specs (seed {seed:#x})"));
}

/// The random specs that earlier sweeps found problems in (`tests/sweep-specs/`, one
/// file each, named after the seed and index that generated them), through the sweep's
/// checks: each must now assemble without spills in every arch, direction and choice.
#[test]
fn sweep_regressions_compile_and_assemble_without_spills() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/sweep-specs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .collect();
    files.sort();
    let specs: Vec<Spec> =
        files.iter().map(|p| attnc::load_spec(p).unwrap_or_else(|d| panic!("{}: {d}", p.display()))).collect();
    assert!(!specs.is_empty(), "no specs in {}", dir.display());
    sweep(&specs, &format!("sweep regressions: {} specs", specs.len()));
}

/// The sweep's checks over `specs`: every arch, direction (where the layout has one) and
/// choice (`auto`, portable) through `compile_without_spills` when ptxas is there, then
/// the module checks, ptxas's spills and budgets and the SASS promises; panics with every
/// problem and the failing specs' text. `ATTNC_SPEC_SWEEP_JOBS` sets the threads. The
/// summary starts a line of its own (the harness has printed `test … ` before it).
fn sweep(specs: &[Spec], what: &str) {
    // The module checks include the LLVM IR text, which compiles keep only when asked.
    attnc::lower::llvm::keep_llvm_ir(true);
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let ptxas_path = match ptxas::find_ptxas() {
        Ok(p) => Some(p),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but ptxas is missing: {e}");
            }
            say(&format!("{what}: compiling only (no ptxas: {e})\n"));
            None
        }
    };
    let mut units = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        for arch in Arch::ALL {
            for d in Direction::ALL {
                if attnc::lower::compile::pass_unsupported_reason(spec, d).is_none() {
                    units.extend(CHOICES.iter().map(|&c| (i, arch, d, c)));
                }
            }
        }
    }
    let t0 = std::time::Instant::now();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).min(8);
    let workers = (env("ATTNC_SPEC_SWEEP_JOBS", cores as u64) as usize).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed: std::sync::Mutex<Vec<(usize, String)>> = std::sync::Mutex::new(Vec::new());
    let assembled = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let u = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(i, arch, direction, choice)) = units.get(u) else { break };
                let spec = &specs[i];
                let opts = CompileOptions::new(arch).family(choice).direction(direction);
                // The module that would run: with ptxas, a configuration that spills steps
                // down to a smaller one of its family (and `auto` to portable), as the
                // runtime does; what still spills after that is a problem.
                let result = match &ptxas_path {
                    Some(p) => attnc::compile_without_spills(spec, &opts, p).map(|c| c.module),
                    None => attnc::compile(spec, &opts),
                };
                let c = Compiled {
                    example: spec.name.clone(),
                    arch,
                    direction,
                    choice,
                    result: result.map_err(|e| e.to_string()),
                };
                let mut problems = match &c.result {
                    Ok(m) => module_problems(&c, m),
                    Err(e) => vec![format!("{}: {e}", label(&c))],
                };
                if let (Ok(m), Some(p)) = (&c.result, &ptxas_path) {
                    // Auto's PTX is portable's when it falls back: assemble it once.
                    let duplicate = choice != FamilyChoice::Auto && m.fallback_reason.is_none() && {
                        let auto = CompileOptions::new(arch).direction(direction);
                        attnc::compile_without_spills(spec, &auto, p).is_ok_and(|a| a.module.ptx == m.ptx)
                    };
                    if !duplicate {
                        let expect_mma = attnc::mask_facts(spec).constant != Some(attnc::TileClass::Empty);
                        problems.extend(assemble_one(&c, m, p, expect_mma).problems);
                        assembled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                if let Ok(mut f) = failed.lock() {
                    f.extend(problems.into_iter().map(|p| (i, p)));
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap_or_default();
    say(&format!(
        "\n{what}, {} compiles, {} assembled, {} problems in {} specs, {workers} threads, {:.0} s\n",
        units.len(),
        assembled.into_inner(),
        failed.len(),
        failed.iter().map(|(i, _)| *i).collect::<std::collections::BTreeSet<_>>().len(),
        t0.elapsed().as_secs_f64()
    ));
    if !failed.is_empty() {
        let mut bad: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
        bad.sort_unstable();
        bad.dedup();
        let mut msg = String::new();
        for (_, p) in &failed {
            msg.push_str(&format!("{p}\n"));
        }
        for i in bad {
            msg.push_str(&format!("\n---- {}\n{}", specs[i].name, attnc::print_spec(&specs[i])));
        }
        panic!("{what}: {} problems:\n{msg}", failed.len());
    }
}

/// Specs the random sweep found spilling in a family's default configuration compile,
/// through `compile_without_spills`, to a smaller configuration of the same family that
/// does not spill, and say so; a named family that cannot fit keeps its spills (no
/// silent switch of family), while `auto` moves to portable.
#[test]
fn spilling_defaults_step_down_to_smaller_configurations() {
    let Ok(ptxas_path) = ptxas::find_ptxas() else {
        assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
        return;
    };
    let gqa_sinks = "attention gqa_sinks {\n  dtype bf16\n  head_dim 128\n  heads 14 kv 7\n  param p0: int\n  \
                     aux a0: int[seqlen_q, seqlen_k, 25, 37]\n  mask true\n  sinks\n  lse\n  \
                     softmax exp2_emulation=1.0 rescale_threshold=8.0\n}\n";
    let mla_window = "attention mla_window {\n  dtype bf16\n  head_dim 192/128\n  heads 4 kv 1 pack_gqa\n  \
                      param p0: int\n  mask causal && window(left=22)\n  split 4\n  lse\n  \
                      softmax rescale_threshold=64.0\n}\n";
    // The sharded twin of chunked_local (shard positions as launch values): the persistent
    // grid's walk state spilled 16 bytes (ptxas 13.5).
    let sharded_chunks = "attention sharded_chunks {\n  dtype bf16\n  head_dim 128\n  heads 40 kv 8\n  shards\n  \
                          mask causal && q / 8192 == k / 8192\n}\n";
    for (src, arch, direction, family, gave_up) in [
        (gqa_sinks, Arch::Sm80, Direction::Backward, FamilyKind::Portable, "8 warps over 64 keys"),
        (mla_window, Arch::Sm100a, Direction::Forward, FamilyKind::Blackwell, "one Q tile per CTA"),
        (
            sharded_chunks,
            Arch::Sm90a,
            Direction::Forward,
            FamilyKind::Hopper,
            "the tiled grid instead of the persistent one",
        ),
    ] {
        let spec = attnc::parse_spec("sweep.attn", src).expect("parses");
        let opts = CompileOptions::new(arch).family(FamilyChoice::Exactly(family)).direction(direction);
        let default = attnc::compile(&spec, &opts).expect("compiles");
        let spills = ptxas::assemble_with(&ptxas_path, &default.ptx, arch).expect("assembles").has_spills();
        let c = attnc::compile_without_spills(&spec, &opts, &ptxas_path).expect("compiles");
        if !spills {
            // A newer ptxas may fit the default: then nothing steps down.
            assert!(c.stepped_down.is_empty() && c.module.config_note.is_none());
            continue;
        }
        assert!(!c.report.has_spills(), "{}: still spills:\n{}", spec.name, c.report.log);
        assert_eq!(c.module.family, family);
        let note = c.module.config_note.clone().unwrap_or_default();
        assert!(note.contains("the default configuration spilled") && note.contains(gave_up), "{note}");
        assert!(c.module.fallback_reason.is_none(), "a named family does not fall back");
    }
}

/// The runtime's decode twin (`QueryRows::OneTile`) of every example it would serve
/// (contiguous or paged layout, no block mask) builds through hopper for sm_90a with one consumer
/// warpgroup and 64-key tiles, and assembles without spills.
#[test]
fn decode_twins_build_one_consumer_hopper_forwards_without_spills() {
    let ptxas_path = ptxas::find_ptxas().ok();
    if ptxas_path.is_none() && std::env::var_os("CI").is_some() {
        panic!("CI is set but ptxas is missing");
    }
    let mut n = 0;
    for (name, spec) in parsed() {
        let Ok(spec) = spec else { continue };
        if spec.kv_layout == attnc::ir::KvLayout::Varlen || attnc::ir::block_mask::needs_block_mask(spec) {
            continue;
        }
        let mut twin = spec.clone();
        twin.query_rows = attnc::ir::QueryRows::OneTile;
        let opts = CompileOptions::new(Arch::Sm90a).direction(Direction::Forward);
        let m = attnc::compile(&twin, &opts).unwrap_or_else(|e| panic!("{name}: decode twin: {e}"));
        if m.family != FamilyKind::Hopper {
            continue; // the parent does not run on hopper either: the runtime never asks.
        }
        let fwd = m.kernels.iter().find(|k| k.role == attnc::lower::KernelRole::Forward).expect("forward kernel");
        assert_eq!((fwd.threads_per_block, fwd.block_m, fwd.block_n), (256, 64, 64), "{name}: decode twin shape");
        if let Some(p) = &ptxas_path {
            let c = Compiled {
                example: format!("{name} (decode twin)"),
                arch: Arch::Sm90a,
                direction: Direction::Forward,
                choice: FamilyChoice::Auto,
                result: Err(String::new()),
            };
            let a = assemble_one(&c, &m, p, true);
            assert!(a.problems.is_empty(), "{}", a.problems.join("\n"));
        }
        n += 1;
    }
    assert!(n >= 5, "only {n} decode twins checked");
}
