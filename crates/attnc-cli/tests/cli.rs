//! Runs the built `attnc` binary: output, diagnostics and exit codes
//! (0 ok, 1 diagnostic, 2 usage).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn attnc() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_attnc"));
    c.current_dir(repo());
    c
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const EXAMPLE: &str = "dsl-examples/causal.attn";

fn run(args: &[&str]) -> Output {
    match attnc().args(args).output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run attnc: {e}"),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(o: &Output) -> String {
    format!("status {:?}\n--- stdout\n{}\n--- stderr\n{}", o.status.code(), text(&o.stdout), text(&o.stderr))
}

fn tmp(name: &str, contents: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    if let Err(e) = std::fs::write(&p, contents) {
        panic!("cannot write {}: {e}", p.display());
    }
    p
}

fn read_example() -> String {
    let p = repo().join(EXAMPLE);
    match std::fs::read_to_string(&p) {
        Ok(s) => s,
        Err(e) => panic!("cannot read {}: {e}", p.display()),
    }
}

// ---- usage errors: exit 2 ----

#[test]
fn no_arguments_is_usage_error() {
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("Usage"), "{}", show(&o));
}

#[test]
fn unknown_arch_is_usage_error() {
    let o = run(&["dump", EXAMPLE, "--arch", "sm_75"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("unknown arch `sm_75`") && err.contains("sm_90a"), "{}", show(&o));

    let o = run(&["check", EXAMPLE, "--arch", "sm_75"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("sm_80, sm_90a, sm_100a or all"), "{}", show(&o));
}

#[test]
fn dump_takes_one_arch() {
    let o = run(&["dump", EXAMPLE, "--arch", "all"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
}

#[test]
fn unknown_family_and_emit_are_usage_errors() {
    let o = run(&["dump", EXAMPLE, "--arch", "sm_90a", "--family", "volta"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("unknown family `volta`"), "{}", show(&o));
    let o = run(&["dump", EXAMPLE, "--arch", "sm_90a", "--emit", "sass"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
}

#[test]
fn arch_is_required() {
    let o = run(&["dump", EXAMPLE]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("--arch"), "{}", show(&o));
}

#[test]
fn help_and_version_exit_zero() {
    let o = run(&["--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(text(&o.stdout).contains("dump") && text(&o.stdout).contains("check"));
    let o = run(&["--version"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(text(&o.stdout).starts_with("attnc "), "{}", show(&o));
}

// ---- diagnostics: exit 1 ----

#[test]
fn missing_file() {
    for sub in ["dump", "check"] {
        let o = run(&[sub, "no/such/file.attn", "--arch", "sm_80"]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = text(&o.stderr);
        assert!(err.contains("no/such/file.attn"), "{}", show(&o));
        assert!(!err.contains("panicked"), "{}", show(&o));
    }
}

#[test]
fn directory_instead_of_file() {
    let o = run(&["dump", "dsl-examples", "--arch", "sm_80"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("cannot read"), "{}", show(&o));
}

/// A syntax error is reported rustc-style: `file:line:col`, the line, and a caret.
#[test]
fn bad_file_shows_location_and_caret() {
    let mut src = read_example();
    if !src.ends_with('\n') {
        src.push('\n');
    }
    src.push_str("$$$ not attn\n");
    let bad_line = src.lines().count();
    let path = tmp("bad_syntax.attn", &src);
    let o =
        attnc().args(["dump", &path.to_string_lossy(), "--arch", "sm_90a"]).output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(o.stdout.is_empty(), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains(&format!("bad_syntax.attn:{bad_line}:1")), "{}", show(&o));
    assert!(err.contains("$$$ not attn"), "the source line is shown\n{}", show(&o));
    assert!(
        err.lines().any(|l| l.trim_start().trim_start_matches('|').trim_start().starts_with('^')),
        "a caret\n{}",
        show(&o)
    );
    assert!(!err.contains("panicked"), "{}", show(&o));
}

#[test]
fn binary_garbage_is_a_diagnostic_not_a_panic() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("garbage.attn");
    std::fs::write(&path, [0xffu8, 0xfe, 0x00, 0x41, 0x0a, 0xc3]).unwrap_or_else(|e| panic!("{e}"));
    let o =
        attnc().args(["dump", &path.to_string_lossy(), "--arch", "sm_80"]).output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(!text(&o.stderr).contains("panicked"), "{}", show(&o));
}

// ---- the happy path (needs codegen) ----

#[test]
fn dump_ptx() {
    let o = run(&["dump", EXAMPLE, "--arch", "sm_90a"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(out.contains(".target sm_90a"), "{}", show(&o));
    assert!(out.contains(".entry"), "{}", show(&o));
}

#[test]
fn dump_llvm_and_ir() {
    let o = run(&["dump", EXAMPLE, "--arch", "sm_80", "--emit", "llvm"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(text(&o.stdout).contains("nvptx64"), "{}", show(&o));

    let o = run(&["dump", EXAMPLE, "--arch", "sm_100a", "--family", "portable", "--emit", "ir"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(out.contains("attnc summary: forward pass for sm_100a"), "{}", show(&o));
    assert!(out.contains("family: portable (requested: portable)"), "{}", show(&o));
    assert!(out.contains("mask: causal"), "{}", show(&o));
    assert!(out.contains("threads, block_m"), "{}", show(&o));
}

#[test]
fn dump_to_file() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("causal_sm80.ptx");
    let o = run(&["dump", EXAMPLE, "--arch", "sm_80", "-o", &out.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(o.stdout.is_empty());
    let ptx = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(ptx.contains(".target sm_80"), "{ptx}");
}

/// `attnc dump ... | head` must not panic when the reader closes the pipe.
#[test]
fn closed_stdout_is_not_a_panic() {
    let mut child = attnc()
        .args(["dump", EXAMPLE, "--arch", "sm_90a", "--emit", "llvm"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut first = [0u8; 16];
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read(&mut first);
        // `out` dropped here: the pipe closes.
    }
    let o = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    assert!(!text(&o.stderr).contains("panicked"), "{}", show(&o));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

#[test]
fn check_all_archs() {
    let o = run(&["check", EXAMPLE, "--arch", "all"]);
    if text(&o.stderr).contains("ptxas not found") {
        if std::env::var_os("CI").is_some() {
            panic!("CI is set but ptxas is missing\n{}", show(&o));
        }
        eprintln!("skipping: ptxas is not installed");
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = text(&o.stdout);
    for arch in ["sm_80", "sm_90a", "sm_100a"] {
        assert!(out.contains(arch), "{arch} missing\n{}", show(&o));
    }
    assert!(out.lines().next().is_some_and(|h| h.contains("regs") && h.contains("spill")), "{}", show(&o));
}

/// Without ptxas, check explains how to install it and exits 1.
#[test]
fn check_without_ptxas_explains() {
    let o = attnc()
        .args(["check", EXAMPLE, "--arch", "sm_80"])
        .env("ATTNC_PTXAS", "/nonexistent/ptxas")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("pip install nvidia-cuda-nvcc"), "{}", show(&o));
    assert!(err.contains("ATTNC_PTXAS"), "{}", show(&o));
}

// ---- GPU subcommands without a GPU: clear errors, never a panic ----

fn has_cuda_driver() -> bool {
    ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"]
        .iter()
        .any(|p| Path::new(p).exists())
}

#[test]
fn selftest_without_a_driver_says_so() {
    if has_cuda_driver() {
        return;
    }
    let o = run(&["selftest", "--quick", EXAMPLE]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("cannot start the CUDA runtime"), "{}", show(&o));
}

#[test]
fn selftest_reports_a_bad_file_before_touching_the_gpu() {
    let bad = tmp("selftest_bad.attn", "attention x {\n  head_dim 100\n  heads 4\n}\n");
    let o = run(&["selftest", bad.to_str().unwrap_or_default()]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("unsupported head_dim 100"), "{}", show(&o));
}

#[test]
fn warm_checks_its_files_and_family_before_touching_the_gpu() {
    let bad = tmp("warm_bad.attn", "attention x {\n  head_dim 100\n  heads 4\n}\n");
    let o = run(&["warm", bad.to_str().unwrap_or_default()]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("unsupported head_dim 100"), "{}", show(&o));
    let o = run(&["warm", "--family", "fastest", EXAMPLE]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("--family"), "{}", show(&o));
    if !has_cuda_driver() {
        let o = run(&["warm", EXAMPLE]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        assert!(text(&o.stderr).contains("cannot start the CUDA runtime"), "{}", show(&o));
    }
}

#[test]
fn bench_rejects_unknown_suites() {
    let o = run(&["bench", "--suites", "prefill,nope"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("unknown suite `nope`"), "{}", show(&o));
}

// ---- report (blackwell schedule) ----

#[test]
fn report_prints_the_cycle_model_column_map_and_roles() {
    let o = run(&["report", EXAMPLE, "--arch", "sm_100a"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = text(&o.stdout);
    for needle in ["cycles per 128x128 tile", "TMEM columns (512 allocated)", "warp roles", "MMA issue", "mbarriers"] {
        assert!(out.contains(needle), "no `{needle}` in\n{out}");
    }
    let j = run(&["report", EXAMPLE, "--json"]);
    assert_eq!(j.status.code(), Some(0), "{}", show(&j));
    assert!(text(&j.stdout).trim_start().starts_with('{'), "{}", show(&j));
}

/// Every valid spec runs on the blackwell family now (nothing left to explain as a
/// fallback): the report refuses only other architectures.
#[test]
fn report_models_sm100a_only() {
    let o = run(&["report", EXAMPLE, "--arch", "sm_90a"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("sm_100a"), "{}", show(&o));
    for f in ["tests/gpu-specs/paged_page1_d64.attn", "dsl-examples/gemma2.attn", "dsl-examples/mqa_falcon.attn"] {
        let o = run(&["report", f]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", show(&o));
    }
}

/// `--pass bwd`: the backward's resource plan, or why a head dim has none.
#[test]
fn report_pass_bwd_prints_the_backward_plan_or_why_not() {
    let o = run(&["report", EXAMPLE, "--pass", "bwd"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = text(&o.stdout);
    for needle in ["blackwell backward plan", "cycles per tile", "TMEM (512 of 512", "dQ", "shared memory", "warps:"] {
        assert!(out.contains(needle), "no `{needle}` in\n{out}");
    }
    let j = run(&["report", EXAMPLE, "--pass", "bwd", "--json"]);
    assert_eq!(j.status.code(), Some(0), "{}", show(&j));
    assert!(text(&j.stdout).contains("\"tmem\""), "{}", show(&j));
    let g = run(&["report", "dsl-examples/gemma2.attn", "--pass", "bwd"]);
    assert_eq!(g.status.code(), Some(1), "{}", show(&g));
    assert!(text(&g.stderr).contains("TMEM columns"), "{}", show(&g));
}
