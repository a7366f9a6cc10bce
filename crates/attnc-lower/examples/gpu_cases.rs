//! Dev tool: writes GPU correctness cases for `scripts/dev/gpu_check.py`, an
//! independent check of the generated kernels on a GPU through PyTorch + CuPy (used
//! before and beside the Rust runtime's `attnc selftest`).
//!
//! For each `dsl-examples/*.attn` and a few shapes it writes `<out>/<case>/case.json`
//! (spec facts, launch ABI, params, aux), `inputs.bin` (Q/K/V per sequence as f32) and
//! `expected.bin` (O and LSE from the f64 reference executor, as f32), and one PTX per
//! spec. Usage: `cargo run --release -p attnc-lower --example gpu_cases -- OUT_DIR [ARCH]`.

use attnc_ir::reference::{random_inputs, reference_forward};
use attnc_ir::{KvLayout, Spec, SplitKv, Ty};
use attnc_lower::{compile, Arch, CompileOptions, FamilyChoice, FamilyKind};
use std::io::Write;
use std::path::Path;

fn f32_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect()
}

/// Inputs are already rounded to the element type, so 16 bits hold them exactly.
fn half_bytes(v: &[f64], dtype: attnc_ir::DType) -> Vec<u8> {
    v.iter()
        .flat_map(|x| {
            let bits: u16 = match dtype {
                attnc_ir::DType::Bf16 => ((*x as f32).to_bits() >> 16) as u16,
                attnc_ir::DType::Fp16 => half::f16::from_f64(*x).to_bits(),
            };
            bits.to_le_bytes()
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let out = Path::new(args.get(1).map(String::as_str).unwrap_or("gpu_cases"));
    let arch: Arch = args.get(2).map(|a| a.parse()).transpose()?.unwrap_or(Arch::Sm90a);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dsl-examples");
    std::fs::create_dir_all(out)?;
    let mut files: Vec<_> = std::fs::read_dir(&root)?.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    files.sort();
    if args.get(3).map(String::as_str) == Some("--perf-configs") {
        return perf_configs(&root, out, arch);
    }
    let mut index = Vec::new();
    for path in files.iter().filter(|p| p.extension().is_some_and(|e| e == "attn")) {
        let mut spec = attnc_dsl::parse_file(path).map_err(|d| d.to_string())?;
        // Fewer heads (same group size) keep the case files small; the code paths are
        // the same.
        let group = spec.group_size();
        spec.kv_heads = spec.kv_heads.min(2);
        spec.q_heads = spec.kv_heads * group;
        let module = compile(&spec, &CompileOptions::new(arch).family(FamilyChoice::Exactly(FamilyKind::Portable)))?;
        std::fs::write(out.join(format!("{}.ptx", spec.name)), &module.ptx)?;
        if args.get(3).map(String::as_str) == Some("--ptx-only") {
            let t = module.timings;
            eprintln!(
                "{:24} build {:6.1} ms  optimize {:6.1} ms  codegen {:6.1} ms",
                spec.name, t.build_ms, t.optimize_ms, t.codegen_ms
            );
            continue;
        }
        for (ci, (seqlens, splits)) in shapes(&spec).into_iter().enumerate() {
            let case = format!("{}_{ci}", spec.name);
            let dir = out.join(&case);
            std::fs::create_dir_all(&dir)?;
            let inputs = random_inputs(&spec, &seqlens, 1000 + ci as u64);
            let expected = reference_forward(&spec, &inputs)?;
            let mut inp = std::fs::File::create(dir.join("inputs.bin"))?;
            for s in &inputs.seqs {
                inp.write_all(&half_bytes(&s.q, spec.dtype))?;
                inp.write_all(&half_bytes(&s.k, spec.dtype))?;
                inp.write_all(&half_bytes(&s.v, spec.dtype))?;
            }
            let mut exp = std::fs::File::create(dir.join("expected.bin"))?;
            for o in &expected {
                exp.write_all(&f32_bytes(&o.o))?;
                exp.write_all(&f32_bytes(&o.lse))?;
            }
            let params: Vec<serde_json::Value> = spec
                .params
                .iter()
                .zip(&inputs.params)
                .map(|(p, v)| {
                    serde_json::json!({"name": p.name, "ty": if p.ty == Ty::Float {"f32"} else {"i32"},
                        "value": match v { attnc_ir::eval::Value::Float(f) => *f, other => other.as_int() as f64 }})
                })
                .collect();
            let aux: Vec<serde_json::Value> = spec
                .aux
                .iter()
                .zip(&inputs.aux)
                .map(|(a, t)| {
                    let data = match &t.data {
                        attnc_ir::AuxData::Int(d) => serde_json::json!(d),
                        attnc_ir::AuxData::Float(d) => serde_json::json!(d),
                    };
                    serde_json::json!({"name": a.name, "elem": a.elem.name(), "dims": t.dims, "data": data})
                })
                .collect();
            let meta = serde_json::json!({
                "case": case,
                "spec": spec.name,
                "ptx": format!("{}.ptx", spec.name),
                "dtype": spec.dtype.name(),
                "d_qk": spec.head_dim_qk, "d_v": spec.head_dim_v,
                "q_heads": spec.q_heads, "kv_heads": spec.kv_heads, "pack_gqa": spec.pack_gqa,
                "layout": match spec.kv_layout { KvLayout::Contiguous => "contiguous", KvLayout::Varlen => "varlen", KvLayout::Paged{..} => "paged" },
                "page_size": match spec.kv_layout { KvLayout::Paged{page_size} => page_size, _ => 0 },
                "sinks": inputs.sinks,
                "lse": spec.lse,
                "num_splits": splits,
                "seqlens": seqlens,
                "params": params,
                "aux": aux,
                "kernels": module.kernels,
            });
            std::fs::write(dir.join("case.json"), serde_json::to_vec_pretty(&meta)?)?;
            index.push(case);
        }
    }
    std::fs::write(out.join("index.json"), serde_json::to_vec(&index)?)?;
    eprintln!("{} cases in {}", index.len(), out.display());
    Ok(())
}

/// Shapes per spec: odd lengths, seqlen_q ≠ seqlen_k, several sequences, splits.
fn shapes(spec: &Spec) -> Vec<(Vec<(usize, usize)>, u32)> {
    let split = if spec.split_kv != SplitKv::None { 3 } else { 1 };
    match spec.kv_layout {
        KvLayout::Contiguous => vec![(vec![(77, 77), (77, 77)], split), (vec![(37, 211)], split), (vec![(130, 49)], 1)],
        KvLayout::Varlen => vec![(vec![(37, 37), (1, 120), (150, 150)], split)],
        KvLayout::Paged { .. } => {
            vec![(vec![(1, 300), (1, 17)], split), (vec![(5, 1000), (5, 64)], 1), (vec![(3, 257)], 8)]
        }
    }
}

/// Tuning mode: the prefill examples under several tile configurations, for
/// `scripts/dev/gpu_perf.py`.
fn perf_configs(root: &Path, out: &Path, arch: Arch) -> Result<(), Box<dyn std::error::Error>> {
    use attnc_lower::families::portable::{compile_with_config, config::Config};
    let configs = [(4, 1, 64), (4, 2, 64), (8, 1, 64), (4, 2, 32), (8, 1, 128), (4, 1, 128)];
    for name in ["mha", "causal"] {
        let spec = attnc_dsl::parse_file(&root.join(format!("{name}.attn"))).map_err(|d| d.to_string())?;
        for (warps, m_tiles, block_n) in configs {
            let cfg = Config { warps, m_tiles, block_n, stages: 2 };
            let m = compile_with_config(&spec, arch, &cfg)?;
            let tag = format!("{name}_w{warps}m{m_tiles}n{block_n}");
            std::fs::write(out.join(format!("{tag}.ptx")), &m.ptx)?;
            let meta = serde_json::json!({"spec": name, "d_qk": spec.head_dim_qk, "causal": spec.mask.causal.is_some(), "kernels": m.kernels});
            std::fs::write(out.join(format!("{tag}.json")), serde_json::to_vec_pretty(&meta)?)?;
        }
    }
    Ok(())
}
