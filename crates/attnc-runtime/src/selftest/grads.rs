//! The selftest's gradient check: a case's backward on the device against the f64
//! reference (dQ, dK, dV, sink and learnable aux gradients), the deterministic mode's
//! repeatability, and the backward with a block mask built once and reused.

use super::*;

/// Each gradient's worst rel-L2 of one backward run.
struct GradErrors {
    dq: f64,
    dk: f64,
    dv: f64,
    dsinks: Option<f64>,
    daux: Vec<(String, f64)>,
    daux_exact: Vec<(String, f64)>,
    nonfinite: usize,
}

impl GradErrors {
    fn max(&self) -> f64 {
        [self.dq, self.dk, self.dv]
            .into_iter()
            .chain(self.dsinks)
            .chain(self.daux.iter().map(|a| a.1))
            .fold(0.0, f64::max)
    }
}

/// An aux gradient's error: `‖got − want‖ / max(‖want‖, ‖terms‖ / 10)`, where `terms` holds
/// each element's sum of term magnitudes. A gradient that is a cancelling sum (a learned
/// position bias whose per-row contributions nearly cancel) is far smaller than its terms,
/// and rounding errors scale with the terms: plain rel-L2 would then measure noise. For a
/// gradient not dominated by cancellation, `‖want‖` is the larger and this is rel-L2.
pub(super) fn aux_grad_error(got: &[f64], want: &[f64], terms: &[f64]) -> f64 {
    let norm = |x: &mut dyn Iterator<Item = f64>| x.map(|v| v * v).sum::<f64>().sqrt();
    let diff = norm(&mut got.iter().zip(want).map(|(g, w)| if g == w { 0.0 } else { g - w }));
    let scale = norm(&mut want.iter().copied()).max(norm(&mut terms.iter().copied()) / 10.0);
    if diff == 0.0 {
        0.0
    } else if scale == 0.0 || !diff.is_finite() {
        f64::INFINITY
    } else {
        diff / scale
    }
}

/// The largest rel-L2 of `got` against `want`, sequence by sequence (`rows(b)` gives a
/// sequence's element range in the device layout), and the count of non-finite values
/// where the reference is finite.
fn worst_rel(got: &[f64], want: &[&[f64]], rows: &dyn Fn(usize) -> (usize, usize)) -> (f64, usize) {
    let (mut worst, mut bad) = (0.0f64, 0usize);
    for (b, w) in want.iter().enumerate() {
        let (start, n) = rows(b);
        let g = &got[start..start + n];
        bad += g.iter().zip(w.iter()).filter(|(g, w)| !g.is_finite() && w.is_finite()).count();
        worst = worst.max(rel_l2(g, w));
    }
    (worst, bad)
}

/// The gradients of the case's inputs on the device (with the forward's O and LSE from the
/// device, random dO) against the f64 reference backward; gradients poisoned first.
/// `deterministic` also runs the deterministic mode twice and compares the bits;
/// `block_mask` (a mask over aux tensors) compares deterministic runs with a block mask
/// passed in against one classified per call.
#[allow(clippy::too_many_arguments)]
pub(super) fn grad_check(
    rt: &Runtime,
    kernel: &crate::runtime::Kernel,
    s: &Spec,
    inputs: &Inputs,
    t: &CaseTensors,
    seed: u64,
    deterministic: bool,
    block_mask: bool,
) -> Result<GradResult, RuntimeError> {
    let dt = ElemType::of(s.dtype);
    let (qh, kvh) = (s.q_heads as usize, s.kv_heads as usize);
    let (dqk, dv) = (s.head_dim_qk as usize, s.head_dim_v as usize);
    let varlen = s.kv_layout == KvLayout::Varlen;
    let seqs = &inputs.seqs;
    let b = seqs.len();
    let max_sq = seqs.iter().map(|x| x.seqlen_q).max().unwrap_or(0);
    let max_sk = seqs.iter().map(|x| x.seqlen_k).max().unwrap_or(0);
    let tq: usize = seqs.iter().map(|x| x.seqlen_q).sum();

    // The forward with its LSE (what a training step keeps for the backward).
    let mut o = rt.alloc(dt, t.o.shape())?;
    let mut lse = if varlen { rt.alloc(ElemType::F32, &[qh, tq])? } else { rt.alloc(ElemType::F32, &[b, qh, max_sq])? };
    rt.fill_nan(&o)?;
    rt.fill_nan(&lse)?;
    let params = t.params();
    kernel.forward_lse(&t.q, &t.k, &t.v, &mut o, &mut lse, &params)?;

    // dO: random normal in the element type, one block per sequence.
    let mut rng = Rng::new(seed ^ 0x0d0_0d0);
    let d_out: Vec<Vec<f64>> = seqs
        .iter()
        .map(|x| (0..x.seqlen_q * qh * dv).map(|_| round_to_dtype(rng.normal(), s.dtype)).collect())
        .collect();
    let mut flat = Vec::new();
    for (x, d) in seqs.iter().zip(&d_out) {
        flat.extend_from_slice(d);
        if !varlen {
            flat.extend(std::iter::repeat_n(0.0, (max_sq - x.seqlen_q) * qh * dv));
        }
    }
    let do_t = rt.upload_f64(dt, &flat, t.o.shape())?;

    let t_ref = Instant::now();
    let want = attnc_ir::reference::reference_backward(s, inputs, &d_out)
        .map_err(|e| RuntimeError::Other(format!("reference backward: {e}")))?;
    let reference_ms = t_ref.elapsed().as_secs_f64() * 1e3;

    let learnable: Vec<(usize, &attnc_ir::AuxDecl)> =
        s.aux.iter().enumerate().filter(|(_, a)| a.learnable && a.elem == attnc_ir::AuxElem::Float).collect();
    // The aux gradients' reference: D from the O the device stored.
    let want_aux = if learnable.is_empty() {
        None
    } else {
        let o_host = rt.download_f64(&o)?;
        let per_seq: Vec<Vec<f64>> = seqs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let start: usize = if varlen { seqs[..i].iter().map(|x| x.seqlen_q).sum() } else { i * max_sq };
                o_host[start * qh * dv..][..x.seqlen_q * qh * dv].to_vec()
            })
            .collect();
        let t_ref = Instant::now();
        let g = attnc_ir::reference::reference_backward_with_output(s, inputs, &d_out, &per_seq)
            .map_err(|e| RuntimeError::Other(format!("reference backward (stored O): {e}")))?;
        Some((g.daux, g.daux_scale, t_ref.elapsed().as_secs_f64() * 1e3))
    };
    // A call's gradient outputs (dQ, dK, dV, dsinks, the learnable aux tensors'), poisoned.
    let outputs = || -> Result<GradOutputs, RuntimeError> {
        let out = GradOutputs {
            dq: rt.alloc(dt, t.q.shape())?,
            dk: rt.alloc(dt, t.k.shape())?,
            dv: rt.alloc(dt, t.v.shape())?,
            dsinks: if s.sinks { Some(rt.alloc(ElemType::F32, &[qh])?) } else { None },
            aux: learnable
                .iter()
                .map(|(i, a)| Ok((a.name.clone(), rt.alloc(ElemType::F32, &inputs.aux[*i].dims)?)))
                .collect::<Result<Vec<_>, RuntimeError>>()?,
        };
        for x in out.all() {
            rt.fill_nan(x)?;
        }
        Ok(out)
    };
    // A workspace of the call's size, poisoned too: the module must write (or zero) every
    // dq_accum element and row value it reads, not find zeros left by an earlier call.
    let workspace_for = |out: &mut GradOutputs, det: bool, timing: bool| -> Result<Tensor, RuntimeError> {
        let (grads, p) = out.call(t.params(), det, timing);
        let ws_bytes = kernel.backward_workspace_bytes(&t.q, &t.k, &t.v, &o, &lse, &do_t, grads, &p)?;
        let ws = rt.alloc(ElemType::F32, &[ws_bytes.div_ceil(4).max(1)])?;
        rt.fill_nan(&ws)?;
        Ok(ws)
    };
    let run = |det: bool, mask: Option<&crate::BlockMask>| -> Result<(Vec<Vec<f64>>, Receipt), RuntimeError> {
        let mut out = outputs()?;
        let ws = workspace_for(&mut out, det, true)?;
        let (grads, mut p) = out.call(t.params(), det, true);
        p.block_mask = mask;
        p.workspace = Some(&ws);
        let receipt = kernel.backward(&t.q, &t.k, &t.v, &o, &lse, &do_t, grads, &p)?;
        rt.synchronize()?;
        Ok((out.download(rt)?, receipt))
    };
    // The backward launch memo: an untimed call remembers its launch; the same call again
    // (every output and the workspace poisoned in between) replays it. `None` where the
    // memo does not serve the spec (per-call mask classification).
    let replayed = |det: bool| -> Result<Option<Vec<Vec<f64>>>, RuntimeError> {
        let mut out = outputs()?;
        let ws = workspace_for(&mut out, det, false)?;
        let (grads, mut p) = out.call(t.params(), det, false);
        p.workspace = Some(&ws);
        let this = kernel.for_launch(&p)?;
        if !this.backward_memo_serves(&p)? {
            return Ok(None);
        }
        kernel.backward(&t.q, &t.k, &t.v, &o, &lse, &do_t, grads, &p)?;
        for x in out.all().chain([&ws]) {
            rt.fill_nan(x)?;
        }
        let (grads, mut p) = out.call(t.params(), det, false);
        p.workspace = Some(&ws);
        let sig = crate::launch_memo::LaunchSignature::of_backward(
            &t.q,
            &t.k,
            &t.v,
            &o,
            &lse,
            &do_t,
            [&*grads.dq, &*grads.dk, &*grads.dv],
            &p,
        );
        if this.replay_backward(&sig, &p)?.is_none() {
            return Err(RuntimeError::Other("the backward launch memo did not replay a repeated call".into()));
        }
        rt.synchronize()?;
        Ok(Some(out.download(rt)?))
    };
    let measure = |got: &[Vec<f64>]| -> GradErrors {
        let q_rows = |i: usize| -> (usize, usize) {
            let start: usize = if varlen { seqs[..i].iter().map(|x| x.seqlen_q).sum() } else { i * max_sq };
            (start * qh * dqk, seqs[i].seqlen_q * qh * dqk)
        };
        let k_rows = |d: usize| {
            move |i: usize| -> (usize, usize) {
                let start: usize = if varlen { seqs[..i].iter().map(|x| x.seqlen_k).sum() } else { i * max_sk };
                (start * kvh * d, seqs[i].seqlen_k * kvh * d)
            }
        };
        let (edq, bq) = worst_rel(&got[0], &want.seqs.iter().map(|g| g.dq.as_slice()).collect::<Vec<_>>(), &q_rows);
        let (edk, bk) =
            worst_rel(&got[1], &want.seqs.iter().map(|g| g.dk.as_slice()).collect::<Vec<_>>(), &k_rows(dqk));
        let (edv, bv) = worst_rel(&got[2], &want.seqs.iter().map(|g| g.dv.as_slice()).collect::<Vec<_>>(), &k_rows(dv));
        let mut bad = bq + bk + bv;
        let mut next = 3;
        let esinks = want.dsinks.as_ref().map(|w| {
            let g = &got[next];
            next += 1;
            bad += g.iter().zip(w).filter(|(g, w)| !g.is_finite() && w.is_finite()).count();
            rel_l2(g, w)
        });
        let (mut eaux, mut eaux_exact) = (Vec::new(), Vec::new());
        let empty = Vec::new();
        let stored = want_aux.as_ref().map_or(&empty, |w| &w.0);
        let stored_scale = want_aux.as_ref().map_or(&empty, |w| &w.1);
        for (i, a) in &learnable {
            let pick =
                |d: &[Option<Vec<f64>>]| d.get(*i).and_then(|x| x.as_ref()).map(|x| x.to_vec()).unwrap_or_default();
            let (w, w_exact, scale) = (pick(stored), pick(&want.daux), pick(stored_scale));
            let g = &got[next];
            next += 1;
            bad += g.iter().zip(&w).filter(|(g, w)| !g.is_finite() && w.is_finite()).count();
            eaux.push((a.name.clone(), aux_grad_error(g, &w, &scale)));
            eaux_exact.push((a.name.clone(), rel_l2(g, &w_exact)));
        }
        GradErrors { dq: edq, dk: edk, dv: edv, dsinks: esinks, daux: eaux, daux_exact: eaux_exact, nonfinite: bad }
    };
    let (got, receipt) = run(false, None)?;
    let e = measure(&got);
    let same_bits = |a: &[Vec<f64>], b: &[Vec<f64>]| {
        a.iter().zip(b).all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()))
    };
    let (mut det_same, mut det_max, mut mask_same, mut det_mode) = (None, None, None, None);
    // Only where this backward classifies (its module has a classifier).
    let block_mask = block_mask && receipt.block_mask.is_some();
    if deterministic || block_mask {
        let (a, ra) = run(true, None)?;
        det_mode = ra.dq_accumulation;
        if deterministic {
            let (b2, _) = run(true, None)?;
            let e2 = measure(&a);
            // The launch memo's replay must give the same bits (where it serves).
            let replay_same = replayed(true)?.is_none_or(|r| same_bits(&a, &r));
            det_same = Some(same_bits(&a, &b2) && replay_same && e2.nonfinite == 0);
            det_max = Some(e2.max());
        }
        if block_mask {
            let mask = kernel.block_mask(&t.q, &t.k, &t.v, &t.o, &t.params())?;
            let (first, r1) = run(true, Some(&mask))?;
            let (second, r2) = run(true, Some(&mask))?;
            let source = |r: &Receipt| r.block_mask.as_ref().map(|m| m.source);
            mask_same = Some(
                same_bits(&a, &first)
                    && same_bits(&a, &second)
                    && source(&r1) == Some(crate::BlockMaskSource::PassedInBackwardBuiltNow)
                    && source(&r2) == Some(crate::BlockMaskSource::PassedIn),
            );
        }
    }
    let max = e.max();
    Ok(GradResult {
        dq: e.dq,
        dk: e.dk,
        dv: e.dv,
        dsinks: e.dsinks,
        daux: e.daux,
        daux_exact: e.daux_exact,
        max,
        nonfinite: e.nonfinite,
        deterministic_identical: det_same,
        deterministic_max: det_max,
        deterministic_accumulation: det_mode,
        block_mask_identical: mask_same,
        gpu_ms: receipt.timings.map(|t| t.total_ms),
        receipt: Some(receipt),
        reference_ms: reference_ms + want_aux.map_or(0.0, |w| w.2),
    })
}

/// The gradient outputs of one backward call.
struct GradOutputs {
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    dsinks: Option<Tensor>,
    /// The learnable aux tensors' gradients, by name.
    aux: Vec<(String, Tensor)>,
}

impl GradOutputs {
    fn all(&self) -> impl Iterator<Item = &Tensor> {
        [&self.dq, &self.dk, &self.dv].into_iter().chain(self.dsinks.iter()).chain(self.aux.iter().map(|(_, g)| g))
    }

    /// The gradients to write and params pointing the sink and aux gradients at these
    /// (the backward's mode and timing set; `base` the case's params).
    fn call<'a>(
        &'a mut self,
        base: Params<'a>,
        deterministic: bool,
        timing: bool,
    ) -> (crate::backward::Gradients<'a>, Params<'a>) {
        let GradOutputs { dq, dk, dv, dsinks, aux } = self;
        let mut p = base;
        p.dsinks = dsinks.as_ref();
        p.aux_grads = aux.iter().map(|(n, g)| (n.clone(), g)).collect();
        p.deterministic = deterministic;
        p.timing = timing;
        (crate::backward::Gradients { dq, dk, dv }, p)
    }

    /// dQ, dK, dV, then dsinks and the aux gradients where present.
    fn download(&self, rt: &Runtime) -> Result<Vec<Vec<f64>>, RuntimeError> {
        self.all().map(|x| rt.download_f64(x)).collect()
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aux_gradient_errors_are_relative_to_the_terms_when_they_cancel() {
        let want = [3.0, -4.0];
        let got = [3.03, -4.0];
        // Not dominated by cancellation: plain rel-L2.
        assert!((aux_grad_error(&got, &want, &[3.0, 4.0]) - rel_l2(&got, &want)).abs() < 1e-12);
        // Terms of magnitude 1000 summing to (3, -4): an error of 0.03 is small against them.
        assert!((aux_grad_error(&got, &want, &[600.0, 800.0]) - 0.03 / 100.0).abs() < 1e-12);
        assert_eq!(aux_grad_error(&want, &want, &[0.0, 0.0]), 0.0);
        assert!(aux_grad_error(&[f64::NAN, 0.0], &want, &[3.0, 4.0]).is_infinite());
    }
}
