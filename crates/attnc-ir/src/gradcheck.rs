//! Finite-difference checks of [`reference_backward`] against [`reference_forward`].
//!
//! The backward is the reference that GPU backward kernels are compared with, so it has
//! to be right on its own: this module differentiates the forward numerically (central
//! differences in f64 of the loss `L = Σ d_out ∘ O`) and compares. It lives in the
//! library, not in one test file, so every crate's tests can run it on their specs (the
//! DSL crate runs it on every example file).
//!
//! Per input tensor (each sequence's Q, K and V, the sinks, each learnable aux tensor)
//! [`check_gradients`] compares
//! - the directional derivative along random directions (every element at once:
//!   `(L(x + εr) − L(x − εr)) / 2ε` against `Σ ∂L/∂x · r`), and
//! - a few single elements chosen at random.
//!
//! Functions with kinks (a score modification with `abs`, `min`, `select` on the score)
//! are checked only away from the kinks by construction of the inputs: keep the tested
//! specs smooth in Q, K and the aux values, or expect mismatches where a perturbation
//! crosses one.

use crate::eval::AuxData;
use crate::reference::{reference_backward, reference_forward, Grads, Inputs, ReferenceError, Rng};
use crate::spec::Spec;

/// How thoroughly to check.
#[derive(Clone, Copy, Debug)]
pub struct GradCheckOptions {
    /// Random directions per tensor.
    pub directions: usize,
    /// Random single elements per tensor.
    pub elements: usize,
    /// Step of the central difference (inputs are about unit scale).
    pub step: f64,
    /// Relative tolerance.
    pub rtol: f64,
    pub seed: u64,
}

impl Default for GradCheckOptions {
    fn default() -> Self {
        GradCheckOptions { directions: 2, elements: 3, step: 1e-5, rtol: 1e-6, seed: 0x9e37 }
    }
}

/// The outcome: how many comparisons were made and every one that failed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GradCheck {
    pub comparisons: usize,
    /// `"what: analytic A, finite difference F"` per failed comparison.
    pub failures: Vec<String>,
    /// The largest finite `|analytic − fd| / tolerance` seen (≤ 1 when everything passed;
    /// NaN comparisons show in `failures` only).
    pub worst_ratio: f64,
}

/// `L = Σ_b Σ d_out[b] ∘ O[b]`.
pub fn loss(spec: &Spec, inputs: &Inputs, d_out: &[Vec<f64>]) -> Result<f64, ReferenceError> {
    let out = reference_forward(spec, inputs)?;
    Ok(out.iter().zip(d_out).map(|(o, d)| o.o.iter().zip(d).map(|(a, b)| a * b).sum::<f64>()).sum())
}

/// One tensor of the inputs that has a gradient.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Q(usize),
    K(usize),
    V(usize),
    Sinks,
    Aux(usize),
}

fn data_mut(inputs: &mut Inputs, slot: Slot) -> Option<&mut Vec<f64>> {
    match slot {
        Slot::Q(b) => inputs.seqs.get_mut(b).map(|s| &mut s.q),
        Slot::K(b) => inputs.seqs.get_mut(b).map(|s| &mut s.k),
        Slot::V(b) => inputs.seqs.get_mut(b).map(|s| &mut s.v),
        Slot::Sinks => inputs.sinks.as_mut(),
        Slot::Aux(a) => inputs.aux.get_mut(a).and_then(|t| t.data.floats_mut()),
    }
}

fn grad_of(g: &Grads, slot: Slot) -> Option<&[f64]> {
    match slot {
        Slot::Q(b) => g.seqs.get(b).map(|s| &s.dq[..]),
        Slot::K(b) => g.seqs.get(b).map(|s| &s.dk[..]),
        Slot::V(b) => g.seqs.get(b).map(|s| &s.dv[..]),
        Slot::Sinks => g.dsinks.as_deref(),
        Slot::Aux(a) => g.daux.get(a).and_then(|d| d.as_deref()),
    }
}

fn name(spec: &Spec, slot: Slot) -> String {
    match slot {
        Slot::Q(b) => format!("dq[seq {b}]"),
        Slot::K(b) => format!("dk[seq {b}]"),
        Slot::V(b) => format!("dv[seq {b}]"),
        Slot::Sinks => "dsinks".into(),
        Slot::Aux(a) => format!("daux[{}]", spec.aux.get(a).map_or("?", |d| d.name.as_str())),
    }
}

/// Compares [`reference_backward`] with central differences of [`loss`] (see the module
/// docs). Errors only when the reference itself refuses the inputs.
pub fn check_gradients(
    spec: &Spec,
    inputs: &Inputs,
    d_out: &[Vec<f64>],
    opts: &GradCheckOptions,
) -> Result<GradCheck, ReferenceError> {
    let grads = reference_backward(spec, inputs, d_out)?;
    let l0 = loss(spec, inputs, d_out)?;
    let mut slots: Vec<Slot> = (0..inputs.seqs.len()).flat_map(|b| [Slot::Q(b), Slot::K(b), Slot::V(b)]).collect();
    if spec.sinks {
        slots.push(Slot::Sinks);
    }
    for (a, (decl, t)) in spec.aux.iter().zip(&inputs.aux).enumerate() {
        if decl.learnable && matches!(t.data, AuxData::Float(_)) {
            slots.push(Slot::Aux(a));
        }
    }
    let mut rng = Rng::new(opts.seed);
    let mut report = GradCheck::default();
    let eps = opts.step;
    for slot in slots {
        let Some(g) = grad_of(&grads, slot).map(<[f64]>::to_vec) else {
            report.failures.push(format!("{}: no gradient returned", name(spec, slot)));
            continue;
        };
        let n = g.len();
        if n == 0 {
            continue;
        }
        // (direction, label) pairs: random directions, then unit vectors.
        let mut probes: Vec<(Vec<f64>, String)> = Vec::new();
        for d in 0..opts.directions {
            probes.push(((0..n).map(|_| rng.normal()).collect(), format!("direction {d}")));
        }
        for _ in 0..opts.elements {
            let e = (rng.next_u64() % n as u64) as usize;
            let mut r = vec![0.0; n];
            r[e] = 1.0;
            probes.push((r, format!("element {e}")));
        }
        for (r, label) in probes {
            let shifted = |sign: f64| -> Result<f64, ReferenceError> {
                let mut x = inputs.clone();
                if let Some(data) = data_mut(&mut x, slot) {
                    for (v, dr) in data.iter_mut().zip(&r) {
                        *v += sign * eps * dr;
                    }
                }
                loss(spec, &x, d_out)
            };
            let fd = (shifted(1.0)? - shifted(-1.0)?) / (2.0 * eps);
            let analytic: f64 = g.iter().zip(&r).map(|(a, b)| a * b).sum();
            // Relative to the derivative, plus the round-off of the difference quotient.
            let roundoff = 64.0 * f64::EPSILON * (l0.abs() + 1.0) / eps;
            let tol = opts.rtol * (1.0 + analytic.abs().max(fd.abs())) + roundoff;
            let ratio = (analytic - fd).abs() / tol;
            report.comparisons += 1;
            let passed = ratio <= 1.0; // false for NaN
            if !passed {
                report
                    .failures
                    .push(format!("{} {label}: analytic {analytic:e}, finite difference {fd:e}", name(spec, slot)));
            }
            report.worst_ratio = report.worst_ratio.max(ratio);
        }
    }
    Ok(report)
}
