//! A CPU model of the blackwell backward's arithmetic (`backward/`), in its tile order,
//! checked against the f64 reference: no B200 is in reach, so this is how the schedule's
//! numerics are verified. What it follows from the kernel:
//!
//! - walks of 128 keys (one CTA) or 256 (the CTA pair at head dim 128) × 128-query tiles;
//!   a walk visits its query tiles starting at its own index (the walk's rotation), query
//!   heads of the KV group in order;
//! - Sᵀ and dPᵀ as f32 sums; P = 2^(s·scale·log2e − lse_log2) in f32 (lse_log2 the
//!   preprocess's f32), zero where the mask or the sequence bounds say so, rounded to the
//!   element type before dV and dS (the TMEM copy of Pᵀ is 16-bit);
//! - D = rowsum(dO ∘ O) in f32 from the O the forward stored (rounded to the element type);
//! - dS = P·(dP − D) rounded to the element type (both dK's TMEM operand and dQ's shared
//!   one); dV, dK accumulate in f32 over the walk; each tile's dQ partial (f32 over the
//!   walk's keys: the pair sums both CTAs' 256 inside its M = 128 MMA) is added into the
//!   f32 `dq_accum` in walk order (one slice: the deterministic mode's order; atomics
//!   reorder the adds, a difference of f32 rounding);
//! - dK·scale, dV, dQ = scale·dq_accum rounded to the element type.
//!
//! The f32 sums run in index order: the tensor cores' internal order is not documented, and
//! any order keeps the f32 error far below the element type's rounding.

use attnc_ir::eval::{eval, Env};
use attnc_ir::reference::{reference_forward, round_to_dtype, Grads, Inputs, SeqGrads};
use attnc_ir::Spec;

use super::backward_plan::cta_mode;

/// Queries per tile.
const TILE: usize = 128;

fn r16(spec: &Spec, x: f32) -> f32 {
    round_to_dtype(x as f64, spec.dtype) as f32
}

/// The modelled backward of `spec` (masks of any kind; no score mod, sinks or aux
/// gradients: those are the shared code's, checked on the H100 through hopper).
pub fn model_backward(spec: &Spec, inputs: &Inputs, d_out: &[Vec<f64>]) -> Grads {
    let fwd = reference_forward(spec, inputs).expect("reference forward");
    let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let group = qh / kvh;
    let scale = spec.scale_value() as f32;
    let log2e = std::f32::consts::LOG2_E;
    let predicate = spec.mask.to_predicate();
    let mut out = Grads::default();
    for (b, seq) in inputs.seqs.iter().enumerate() {
        let (sq, sk) = (seq.seqlen_q, seq.seqlen_k);
        let q = |i: usize, h: usize, c: usize| seq.q[(i * qh + h) * dqk + c] as f32;
        let k = |j: usize, h: usize, c: usize| seq.k[(j * kvh + h) * dqk + c] as f32;
        let v = |j: usize, h: usize, c: usize| seq.v[(j * kvh + h) * dv + c] as f32;
        let d_o = |i: usize, h: usize, c: usize| d_out[b][(i * qh + h) * dv + c] as f32;
        // The preprocess: lse in log2 units (+∞ where no key contributed) and D from the
        // stored O, both f32.
        let o16 = |i: usize, h: usize, c: usize| r16(spec, fwd[b].o[(i * qh + h) * dv + c] as f32);
        let lse2 = |h: usize, i: usize| {
            let l = fwd[b].lse[h * sq + i];
            if l == f64::NEG_INFINITY {
                f32::INFINITY
            } else {
                (l * std::f64::consts::LOG2_E) as f32
            }
        };
        let dsum: Vec<f32> = (0..qh * sq)
            .map(|x| {
                let (h, i) = (x / sq, x % sq);
                (0..dv).map(|c| d_o(i, h, c) * o16(i, h, c)).sum()
            })
            .collect();
        let allowed = |h: usize, hkv: usize, i: usize, j: usize| {
            predicate.as_ref().is_none_or(|p| {
                let env = Env {
                    b: b as i32,
                    h: h as i32,
                    hkv: hkv as i32,
                    q: i as i32,
                    k: j as i32,
                    score: 0.0,
                    seqlen_q: sq as i32,
                    seqlen_k: sk as i32,
                    q_heads: qh as i32,
                    kv_heads: kvh as i32,
                    params: &inputs.params,
                    aux: &inputs.aux,
                };
                eval(spec, p, &env).as_bool()
            })
        };
        let mut g =
            SeqGrads { dq: vec![0.0; sq * qh * dqk], dk: vec![0.0; sk * kvh * dqk], dv: vec![0.0; sk * kvh * dv] };
        let mut dq_accum = vec![0f32; sq * qh * dqk];
        // Keys of one walk: a CTA's 128, or a pair's 256.
        let walk = cta_mode(spec).map(|m| m.walk_keys() as usize).unwrap_or(TILE);
        let (n_tiles, m_tiles) = (sk.div_ceil(walk), sq.div_ceil(TILE));
        for hkv in 0..kvh {
            for n in 0..n_tiles {
                let keys = n * walk..((n + 1) * walk).min(sk);
                let mut dk_acc = vec![0f32; walk * dqk];
                let mut dv_acc = vec![0f32; walk * dv];
                for hg in 0..group {
                    let h = hkv * group + hg;
                    for w in 0..m_tiles {
                        let m = (w + n) % m_tiles;
                        let queries = m * TILE..((m + 1) * TILE).min(sq);
                        // P and dS of the tile, keys on rows (Sᵀ), in the element type.
                        let mut p = vec![0f32; walk * TILE];
                        let mut ds = vec![0f32; walk * TILE];
                        for j in keys.clone() {
                            for i in queries.clone() {
                                if !allowed(h, hkv, i, j) {
                                    continue;
                                }
                                let s: f32 = (0..dqk).map(|c| k(j, hkv, c) * q(i, h, c)).sum();
                                let pv = r16(spec, (s * (scale * log2e) - lse2(h, i)).exp2());
                                let dp: f32 = (0..dv).map(|c| v(j, hkv, c) * d_o(i, h, c)).sum();
                                let (jj, ii) = (j - n * walk, i - m * TILE);
                                p[jj * TILE + ii] = pv;
                                ds[jj * TILE + ii] = r16(spec, pv * (dp - dsum[h * sq + i]));
                            }
                        }
                        for j in keys.clone() {
                            let jj = j - n * walk;
                            for i in queries.clone() {
                                let ii = i - m * TILE;
                                let (pv, dsv) = (p[jj * TILE + ii], ds[jj * TILE + ii]);
                                for c in 0..dv {
                                    dv_acc[jj * dv + c] += pv * d_o(i, h, c);
                                }
                                for c in 0..dqk {
                                    dk_acc[jj * dqk + c] += dsv * q(i, h, c);
                                }
                            }
                        }
                        // The tile's dQ partial (f32 in TMEM), then one add per element.
                        for i in queries.clone() {
                            let ii = i - m * TILE;
                            for c in 0..dqk {
                                let part: f32 =
                                    keys.clone().map(|j| ds[(j - n * walk) * TILE + ii] * k(j, hkv, c)).sum();
                                dq_accum[(i * qh + h) * dqk + c] += part;
                            }
                        }
                    }
                }
                for j in keys {
                    let jj = j - n * walk;
                    for c in 0..dqk {
                        g.dk[(j * kvh + hkv) * dqk + c] = r16(spec, dk_acc[jj * dqk + c] * scale) as f64;
                    }
                    for c in 0..dv {
                        g.dv[(j * kvh + hkv) * dv + c] = r16(spec, dv_acc[jj * dv + c]) as f64;
                    }
                }
            }
        }
        for (x, a) in g.dq.iter_mut().zip(&dq_accum) {
            *x = r16(spec, scale * a) as f64;
        }
        out.seqs.push(g);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::reference::{random_inputs, reference_backward, rel_l2, Rng};
    use attnc_ir::Align;

    /// The selftest's gradient bound (rel-L2 per sequence).
    const TOL: f64 = 2e-2;

    /// Odd sizes, seqlen_q ≠ seqlen_k, several key and query tiles (the rotation wraps),
    /// GQA, bf16 and fp16, causal and a mask over positions: the modelled schedule's
    /// gradients against the f64 reference, with the same rounded inputs.
    #[test]
    fn the_blackwell_schedules_arithmetic_matches_the_reference() {
        let mut specs = Vec::new();
        let mut c = Spec::new("causal_gqa", 64, 4);
        c.kv_heads = 2;
        c.mask.causal = Some(Align::BottomRight);
        specs.push(c);
        let mut w = Spec::new("window_fp16", 96, 2);
        w.dtype = attnc_ir::DType::Fp16;
        w.mask.window = Some(attnc_ir::Window { left: Some(100), right: Some(20), align: Align::TopLeft });
        specs.push(w);
        // Head dim 128: the CTA pair's walks of 256 keys (333 keys: a full and a partial pair).
        specs.push(Spec::new("full_d128", 128, 2));
        let mut cw = Spec::new("causal_gqa_d128", 128, 4);
        cw.kv_heads = 2;
        cw.mask.causal = Some(Align::TopLeft);
        specs.push(cw);
        let mut worst = Vec::new();
        for (s, spec) in specs.iter().enumerate() {
            let seqlens = [(261, 333), (130, 97)];
            let inputs = random_inputs(spec, &seqlens, 7 + s as u64);
            let mut rng = Rng::new(99 + s as u64);
            let d_out: Vec<Vec<f64>> = seqlens
                .iter()
                .map(|&(sq, _)| {
                    (0..sq * spec.q_heads as usize * spec.head_dim_v as usize)
                        .map(|_| round_to_dtype(rng.normal(), spec.dtype))
                        .collect()
                })
                .collect();
            let want = reference_backward(spec, &inputs, &d_out).expect("reference backward");
            let got = model_backward(spec, &inputs, &d_out);
            for (b, (g, w)) in got.seqs.iter().zip(&want.seqs).enumerate() {
                for (what, x, y) in [("dq", &g.dq, &w.dq), ("dk", &g.dk, &w.dk), ("dv", &g.dv, &w.dv)] {
                    let e = rel_l2(x, y);
                    worst.push(format!("{} b{b} {what}: {e:.2e}", spec.name));
                    assert!(e <= TOL, "{} b{b} {what}: rel-L2 {e:.3e} > {TOL}", spec.name);
                }
            }
        }
        eprintln!("{}", worst.join("\n"));
    }

    /// The check is not vacuous: with K changed after the reference was computed (signs
    /// flipped in places), the modelled gradients miss the bound.
    #[test]
    fn a_wrong_step_fails_the_bound() {
        let spec = Spec::new("full", 64, 2);
        let seqlens = [(200, 150)];
        let mut inputs = random_inputs(&spec, &seqlens, 3);
        let mut rng = Rng::new(5);
        let d_out = vec![(0..200 * 2 * 64).map(|_| round_to_dtype(rng.normal(), spec.dtype)).collect::<Vec<f64>>()];
        let want = reference_backward(&spec, &inputs, &d_out).expect("reference");
        // Perturb K after the reference: the model now differentiates other logits.
        for x in inputs.seqs[0].k.iter_mut().step_by(7) {
            *x = -*x;
        }
        let got = model_backward(&spec, &inputs, &d_out);
        assert!(rel_l2(&got.seqs[0].dv, &want.seqs[0].dv) > TOL);
    }
}
