//! The f64 reference backward of every `.attn` file the project ships (`dsl-examples/`
//! and `tests/gpu-specs/`) against central finite differences of the forward: dQ, dK,
//! dV, sinks and learnable aux tensors (`attnc_ir::gradcheck`).
//!
//! Each spec keeps its mask, score modification, sinks, params and aux tensors; its
//! sizes shrink so finite differences stay cheap: head dims 6 (qk) and 4 or 6 (v), at
//! most 2 KV heads and 3 query heads per KV head (GQA stays GQA, MQA stays MQA).
//! Sequences have odd lengths with seqlen_q ≠ seqlen_k: one length per batch for
//! contiguous and paged KV (paged is an inference layout with no backward kernel; the
//! reference's math does not depend on the layout, so it is checked like contiguous),
//! different lengths per sequence for varlen.

use super::examples::examples_dir;
use crate::parse_file;
use attnc_ir::gradcheck::{check_gradients, GradCheckOptions};
use attnc_ir::reference::{random_inputs, reference_backward, Rng};
use attnc_ir::{KvLayout, Spec};
use std::path::PathBuf;

fn spec_files() -> Vec<PathBuf> {
    let gpu_specs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/gpu-specs");
    let mut files: Vec<PathBuf> = [examples_dir(), gpu_specs]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect::<Vec<_>>()))
        .flatten()
        .filter(|p| p.extension().is_some_and(|e| e == "attn"))
        .collect();
    files.sort();
    files
}

/// The spec with small head dims and head counts.
fn shrink(mut s: Spec) -> Spec {
    let group = s.group_size().min(3);
    s.kv_heads = s.kv_heads.min(2);
    s.q_heads = s.kv_heads * group;
    s.pack_gqa &= s.q_heads > s.kv_heads;
    s.head_dim_v = if s.head_dim_qk == s.head_dim_v { 6 } else { 4 };
    s.head_dim_qk = 6;
    s
}

#[test]
fn every_spec_file_has_a_backward_that_matches_finite_differences() {
    let files = spec_files();
    assert!(files.len() >= 20, "only {} spec files", files.len());
    let mut learnable = Vec::new();
    for (n, path) in files.iter().enumerate() {
        let spec = match parse_file(path) {
            Ok(s) => shrink(s),
            Err(d) => panic!("{d}"),
        };
        let seqlens: &[(usize, usize)] = match spec.kv_layout {
            KvLayout::Varlen => &[(5, 7), (3, 4), (7, 2)],
            _ => &[(5, 7), (5, 7)],
        };
        let seed = 1000 + n as u64;
        let inputs = random_inputs(&spec, seqlens, seed);
        let mut rng = Rng::new(seed + 1);
        let dv = (spec.q_heads * spec.head_dim_v) as usize;
        let d_out: Vec<Vec<f64>> = seqlens.iter().map(|s| (0..s.0 * dv).map(|_| rng.normal()).collect()).collect();
        let opts = GradCheckOptions { directions: 2, elements: 3, seed, ..GradCheckOptions::default() };
        let r = check_gradients(&spec, &inputs, &d_out, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            r.failures.is_empty(),
            "{}: {} of {} comparisons failed:\n{}",
            path.display(),
            r.failures.len(),
            r.comparisons,
            r.failures.join("\n")
        );
        if spec.has_learnable_aux() {
            // The aux gradient is there and not trivially zero.
            let g = reference_backward(&spec, &inputs, &d_out).unwrap_or_else(|e| panic!("{e}"));
            for (decl, d) in spec.aux.iter().zip(&g.daux) {
                if decl.learnable {
                    assert!(d.as_ref().is_some_and(|d| d.iter().any(|x| *x != 0.0)), "{}: d{}", spec.name, decl.name);
                }
            }
            learnable.push(spec.name.clone());
        }
    }
    learnable.sort();
    assert_eq!(learnable, vec!["alibi_learned", "t5_bias"]);
}
