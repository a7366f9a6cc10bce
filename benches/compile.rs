//! Cold compile time: `.attn` text -> PTX, in process, for sm_90a (the bench protocol's
//! "Cold: DSL text -> PTX"). Every iteration parses the text and compiles from scratch
//! (no caches exist below the runtime). One benchmark per `dsl-examples/*.attn`, the
//! forward alone and the forward plus the backward (`compile_directions`: a thread each).
//!
//! Run: `cargo bench -p attnc --bench compile` (about 4 s per example, ~2 min for all). Examples that do
//! not compile yet are reported and skipped.

use attnc::{Arch, CompileOptions, Direction};
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
    let fwd = CompileOptions::new(arch);
    let bwd = CompileOptions::new(arch).direction(Direction::Backward);
    for (group_name, directions) in
        [("cold_dsl_to_ptx", vec![fwd.clone()]), ("cold_dsl_to_ptx_fwd_bwd", vec![fwd.clone(), bwd])]
    {
        let mut group = c.benchmark_group(format!("{group_name}/{arch}"));
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
            // One untimed run: skip (loudly) what does not compile (inference layouts have
            // no backward), and report the family.
            let modules: Result<Vec<_>, String> =
                attnc::parse_spec(&name, &text).map_err(|d| d.to_string()).and_then(|spec| {
                    directions.iter().map(|o| attnc::compile(&spec, o).map_err(|e| e.to_string())).collect()
                });
            match modules {
                Ok(ms) => {
                    for m in ms {
                        eprintln!("{name}: {} {}, {} bytes of PTX", m.family, m.direction, m.ptx.len());
                    }
                }
                Err(e) => {
                    eprintln!("{name}: SKIPPED in {group_name}, does not compile for {arch}: {e}");
                    continue;
                }
            }
            group.bench_function(name.as_str(), |b| {
                b.iter(|| {
                    let spec = attnc::parse_spec(&name, black_box(&text)).map_err(|d| d.to_string())?;
                    let dirs: Vec<Direction> = directions.iter().map(|o| o.direction).collect();
                    attnc::compile_directions(&spec, &fwd, &dirs)
                        .into_iter()
                        .map(|m| m.map_err(|e| e.to_string()))
                        .collect::<Result<Vec<_>, _>>()
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, cold_compile);
criterion_main!(benches);
