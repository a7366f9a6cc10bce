//! Runs the runtime's GPU paths outside the CLI (dev tool, and what the H100 runs use):
//!
//! ```text
//! gpu_run smoke   DSL_DIR                       # one launch per example, receipts
//! gpu_run selftest DSL_DIR OUT.json [--quick] [--filter NAME]
//! gpu_run bench   OUT.json [--quick]            # re-executes itself for the disk probe
//! gpu_run probe                                  # the disk-hit probe child
//! ```

use attnc_runtime::{bench, selftest, Runtime};
use std::path::Path;

fn specs(dir: &Path) -> Result<Vec<attnc_ir::Spec>, Box<dyn std::error::Error>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "attn"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        out.push(attnc_dsl::parse_file(&f).map_err(|d| d.to_string())?);
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let cmd = args.get(1).map(String::as_str).unwrap_or("");
    let flag = |f: &str| args.iter().any(|a| a == f);
    let value = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    match cmd {
        "probe" => {
            let p = bench::disk_hit_probe()?;
            println!("{}", bench::probe_line(&p));
        }
        "smoke" => {
            let rt = Runtime::new(0)?;
            eprintln!("device: {:?}", rt.device());
            let opts = selftest::SelftestOptions { quick: true, ..Default::default() };
            for s in specs(Path::new(&args[2]))? {
                let plan = selftest::plan_cases(&s, &opts).into_iter().next().ok_or("no case")?;
                let r = selftest::run(
                    &rt,
                    std::slice::from_ref(&plan.spec),
                    &selftest::SelftestOptions { quick: true, progress: false, ..Default::default() },
                );
                let c = &r.cases[0];
                println!(
                    "{} {} {}",
                    if c.ok { "PASS" } else { "FAIL" },
                    c.case,
                    c.receipt.as_ref().map_or(c.error.clone().unwrap_or_default(), |r| r.to_string())
                );
            }
        }
        "checks" => checks()?,
        "selftest" => {
            let rt = Runtime::new(0)?;
            let opts =
                selftest::SelftestOptions { quick: flag("--quick"), filter: value("--filter"), ..Default::default() };
            let report = selftest::run(&rt, &specs(Path::new(&args[2]))?, &opts);
            std::fs::write(&args[3], report.to_json())?;
            print!("{}", report.table());
            if !report.ok() {
                std::process::exit(1);
            }
        }
        "bench" => {
            let rt = Runtime::new(0)?;
            let mut opts = bench::BenchOptions {
                disk_probe_command: Some(vec![args[0].clone(), "probe".into()]),
                ..Default::default()
            };
            if flag("--quick") {
                opts.prefill_seqlens = vec![1024, 8192];
                opts.decode_batches = vec![1, 64];
                opts.decode_seqlens_k = vec![32768];
            }
            if flag("--decode-only") {
                opts.prefill = false;
                opts.compile = false;
            }
            if flag("--no-ceilings") {
                opts.ceilings = false;
            }
            let report = bench::run(&rt, &opts)?;
            std::fs::write(&args[2], report.to_json())?;
            print!("{}", report.table());
        }
        _ => {
            eprintln!("usage: gpu_run smoke DIR | selftest DIR OUT.json [--quick] [--filter X] | bench OUT.json [--quick] | probe");
            std::process::exit(2);
        }
    }
    Ok(())
}

/// GPU-side checks of runtime behaviour beyond numerics.
fn checks() -> Result<(), Box<dyn std::error::Error>> {
    use attnc_ir::reference::{random_inputs, reference_forward, rel_l2};
    use attnc_runtime::{CacheConfig, ElemType, Params, RuntimeError, ValidationError};
    let mut fails = 0;
    let mut report = |name: &str, ok: bool, detail: String| {
        println!("{} {name}: {detail}", if ok { "PASS" } else { "FAIL" });
        if !ok {
            fails += 1;
        }
    };

    // 1. Many threads ask for the same new kernel: one compile.
    let dir = std::env::temp_dir().join(format!("attnc-checks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = Runtime::with_cache(0, &CacheConfig::with_dir(&dir))?;
    let mut spec = attnc_ir::Spec::new("checks_causal", 128, 4);
    spec.mask.causal = Some(attnc_ir::Align::TopLeft);
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (rt, spec) = (rt.clone(), spec.clone());
            std::thread::spawn(move || rt.kernel(&spec).map(|k| k.source()))
        })
        .collect();
    let sources: Vec<_> =
        handles.into_iter().map(|h| h.join().map_err(|_| "thread panicked")).collect::<Result<Vec<_>, _>>()?;
    let st = rt.cache_stats();
    report("8 threads, same key", st.builds == 1 && sources.iter().all(|s| s.is_ok()), format!("{st:?}"));

    // 2. A fused QKV tensor [B, S, 3, H, D] with Q/K/V as strided views.
    let (b, s, h, d) = (2usize, 77usize, 4usize, 128usize);
    let k = rt.kernel(&spec)?;
    let inputs = random_inputs(&spec, &vec![(s, s); b], 5);
    let expected = reference_forward(&spec, &inputs)?;
    let mut fused = vec![0f64; b * s * 3 * h * d];
    for (bi, sq) in inputs.seqs.iter().enumerate() {
        for t in 0..s {
            for (which, src) in [&sq.q, &sq.k, &sq.v].into_iter().enumerate() {
                let dst = ((bi * s + t) * 3 + which) * h * d;
                fused[dst..dst + h * d].copy_from_slice(&src[t * h * d..(t + 1) * h * d]);
            }
        }
    }
    let qkv = rt.upload_f64(ElemType::Bf16, &fused, &[b, s, 3, h, d])?;
    let st5 = [s * 3 * h * d, 3 * h * d, d, 1];
    let q = qkv.view(&[b, s, h, d], &st5, 0)?;
    let kk = qkv.view(&[b, s, h, d], &st5, h * d)?;
    let v = qkv.view(&[b, s, h, d], &st5, 2 * h * d)?;
    let mut o = rt.alloc(ElemType::Bf16, &[b, s, h, d])?;
    rt.fill_nan(&o)?;
    let r = k.forward(&q, &kk, &v, &mut o, &Params::default())?;
    let got = rt.download_f64(&o)?;
    let want: Vec<f64> = expected.iter().flat_map(|e| e.o.iter().copied()).collect();
    let e = rel_l2(&got, &want);
    report("fused QKV strided views", e <= 1e-2, format!("rel_l2 {e:.2e}; {r}"));

    // 3. Launch errors come back typed, before anything runs.
    let mut bad = rt.alloc(ElemType::Bf16, &[b, s, h, d])?;
    let err = k.forward(&q, &kk, &v, &mut bad.clone(), &Params::default().splits(2));
    report(
        "split on a non-split spec",
        matches!(err, Err(RuntimeError::Validation(ValidationError::Splits { .. }))),
        format!("{err:?}"),
    );
    let err = k.forward(&q, &kk, &v, &mut q.clone(), &Params::default());
    report(
        "output aliasing q",
        matches!(err, Err(RuntimeError::Validation(ValidationError::Overlap { .. }))),
        format!("{err:?}"),
    );
    let mis = qkv.view(&[b, s, h, d], &st5, 4)?;
    let err = k.forward(&mis, &kk, &v, &mut bad, &Params::default());
    report(
        "misaligned q",
        matches!(err, Err(RuntimeError::Validation(ValidationError::Alignment { .. }))),
        format!("{err:?}"),
    );
    let mut paged = spec.clone();
    paged.name = "checks_paged".into();
    paged.kv_layout = attnc_ir::KvLayout::Paged { page_size: 16 };
    let kp = rt.kernel(&paged)?;
    let pool = rt.alloc(ElemType::Bf16, &[4, 16, h, d])?;
    let bt = rt.upload_index(&[0, 1, 2, 9, 3, 0, 1, 2], &[2, 4])?;
    let su = rt.upload_index(&[64, 16], &[2])?;
    let q1 = rt.alloc(ElemType::Bf16, &[2, 1, h, d])?;
    let mut o1 = rt.alloc(ElemType::Bf16, &[2, 1, h, d])?;
    let err = kp.forward(&q1, &pool, &pool, &mut o1, &Params::default().paged(&bt, &su));
    report(
        "block table entry out of range",
        matches!(err, Err(RuntimeError::Validation(ValidationError::PageIndex { entry: 9, .. }))),
        format!("{err:?}"),
    );
    rt.synchronize()?;

    // 4. Empty launch.
    let q0 = rt.alloc(ElemType::Bf16, &[0, s, h, d])?;
    let mut o0 = rt.alloc(ElemType::Bf16, &[0, s, h, d])?;
    let k0 = rt.alloc(ElemType::Bf16, &[0, s, h, d])?;
    let r = k.forward(&q0, &k0, &k0, &mut o0, &Params::default())?;
    report("empty batch", r.skipped.is_some(), r.to_string());

    // 5. The JIT's error log comes back in the error.
    let err = rt.gpu().load_module(
        b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry broken() { bogus.instruction; }\n",
        attnc_runtime::cuda::Image::Ptx,
        "broken",
    );
    let ok = matches!(&err, Err(RuntimeError::Jit { log, .. }) if !log.is_empty());
    report(
        "JIT error log",
        ok,
        match err {
            Err(e) => e.to_string(),
            Ok(_) => "loaded".into(),
        },
    );
    let err = rt.gpu().link_ptx(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry broken() { bogus.instruction; }\n",
        "broken",
    );
    let ok = matches!(&err, Err(RuntimeError::Jit { log, .. }) if !log.is_empty());
    report(
        "link error log",
        ok,
        match err {
            Err(e) => e.to_string(),
            Ok(_) => "linked".into(),
        },
    );

    // 6. Corrupt disk entry: discarded and rebuilt by a fresh runtime.
    for e in std::fs::read_dir(&dir)?.flatten() {
        if e.path().extension().is_some_and(|x| x == "attnc") {
            let mut bytes = std::fs::read(e.path())?;
            let n = bytes.len();
            bytes[n / 2] ^= 0xff;
            std::fs::write(e.path(), bytes)?;
        }
    }
    let rt2 = Runtime::with_cache(0, &CacheConfig::with_dir(&dir))?;
    let k2 = rt2.kernel(&spec)?;
    let st = rt2.cache_stats();
    report("corrupt entry rebuilt", st.discarded == 1 && st.builds == 1, format!("{:?} {st:?}", k2.source()));
    let _ = std::fs::remove_dir_all(&dir);
    println!("{fails} failed");
    if fails > 0 {
        std::process::exit(1);
    }
    Ok(())
}
