//! Cold compile time: `.attn` text -> PTX, in process, for sm_90a (the bench protocol's
//! "Cold: DSL text -> PTX"). Every iteration parses the text and compiles from scratch
//! (no caches exist below the runtime). One benchmark per `dsl-examples/*.attn`.
//!
//! Run: `cargo bench -p attnc --bench compile` (about 4 s per example, ~2 min for all). Examples that do
//! not compile yet are reported and skipped.

use attnc::{Arch, CompileOptions};
use criterion::{black_box, criterion_group, criterion_main, Criterion, SamplingMode};
use std::path::PathBuf;
use std::time::Duration;

fn examples() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../dsl-examples");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "attn")).collect()
        }
        Err(e) => {
            eprintln!("no examples: cannot read {}: {e}", dir.display());
            Vec::new()
        }
    };
    files.sort();
    files
}

fn cold_compile(c: &mut Criterion) {
    let arch = Arch::Sm90a;
    let opts = CompileOptions::new(arch);
    let mut group = c.benchmark_group(format!("cold_dsl_to_ptx/{arch}"));
    // One compile is ~50-150 ms on 2 cores: flat sampling, 10 samples, a short window.
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for path in examples() {
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{name}: SKIPPED, cannot read {}: {e}", path.display());
                continue;
            }
        };
        // One untimed run: skip (loudly) what does not compile, and report the family.
        let module = attnc::parse_spec(&name, &text)
            .map_err(|d| d.to_string())
            .and_then(|spec| attnc::compile(&spec, &opts).map_err(|e| e.to_string()));
        match module {
            Ok(m) => eprintln!("{name}: {} family, {} bytes of PTX", m.family, m.ptx.len()),
            Err(e) => {
                eprintln!("{name}: SKIPPED, does not compile for {arch}: {e}");
                continue;
            }
        }
        group.bench_function(name.as_str(), |b| {
            b.iter(|| {
                let spec = attnc::parse_spec(&name, black_box(&text)).map_err(|d| d.to_string())?;
                attnc::compile(&spec, &opts).map_err(|e| e.to_string())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cold_compile);
criterion_main!(benches);
