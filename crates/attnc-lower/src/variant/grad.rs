//! The backward's per-element variant code: the modded logit and its derivatives
//! (`attnc_ir::deriv`, derived from the `.attn` file), and the accumulation of learnable
//! aux tensors' gradients. Families decide when these run; this module decides what they
//! compute, so every family's backward agrees with the f64 reference.
//!
//! The logit and its derivatives are generated with one memo
//! ([`crate::variant::expr::Memo`]): the derivative expressions contain the forward's
//! subexpressions unchanged (softcap's `tanh`, `exp`, `sigmoid`), so each is computed once
//! per element for both.

use super::expr::{aux_flat_index, gen_memo, ElemVars, Memo, VariantArgs};
use crate::llvm::kb::{Kb, R};
use attnc_ir::deriv::{score_mod_grad, AuxGradTerm, ScoreModGrad};
use attnc_ir::{Expr, ExprKind, Spec, Var};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;

/// One learnable-aux read site and how the kernel treats it.
struct Term {
    term: AuxGradTerm,
    /// Slot among the spec's learnable aux tensors (output pointer, size, slice offset).
    learn: usize,
    /// Slot among all aux tensors (the launch dims).
    decl: usize,
    /// `d` reads the score: computed with the logit and kept until dS exists.
    d_uses_score: bool,
    /// The index depends on the query, key or score: one element per address;
    /// otherwise every element of a tile adds to one address.
    per_element: bool,
}

/// The backward's view of a spec's score modification.
pub struct ScoreGrad {
    grad: Option<ScoreModGrad>,
    terms: Vec<Term>,
}

/// One element's logit and what its gradient needs from the score.
pub struct ElemLogit<'ctx> {
    /// The modded logit in log2 units.
    pub s_log2: FloatValue<'ctx>,
    /// `∂m/∂score`; `None` when it is 1.
    pub slope: Option<FloatValue<'ctx>>,
    /// Per aux term: `∂m/∂element` when it reads the score (computed here), else `None`
    /// (computed later from the positions).
    pub aux_d: Vec<Option<FloatValue<'ctx>>>,
}

/// Where a CTA's learnable-aux contributions go.
pub struct AuxSink<'ctx> {
    /// i1: add into this (CTA, warp)'s slice of `aux_grad_ws` (every element has one
    /// writer, summed later in slice order) instead of atomics into the outputs.
    pub deterministic: IntValue<'ctx>,
    /// Per learnable aux tensor: its gradient output (f32, its shape).
    pub outputs: Vec<IntValue<'ctx>>,
    /// Per learnable aux tensor: its element count (i32).
    pub sizes: Vec<IntValue<'ctx>>,
    /// This (CTA, warp)'s slice of the workspace.
    pub slice_base: IntValue<'ctx>,
}

/// One element of a tile for the aux gradients: its variables, P, dS (the gradient of the
/// modded logit) and the aux derivatives computed with the logit.
pub type AuxElem<'ctx> = (ElemVars<'ctx>, FloatValue<'ctx>, FloatValue<'ctx>, Vec<Option<FloatValue<'ctx>>>);

/// The learnable aux tensors of a spec, in declaration order: each gets a gradient.
pub fn learnable_aux(spec: &Spec) -> Vec<&attnc_ir::AuxDecl> {
    spec.aux.iter().filter(|a| a.learnable && a.elem == attnc_ir::AuxElem::Float).collect()
}

fn uses(e: &Expr, v: Var) -> bool {
    e.any(&|x| matches!(x.kind, ExprKind::Var(y) if y == v))
}

impl ScoreGrad {
    pub fn new(spec: &Spec) -> ScoreGrad {
        let grad = score_mod_grad(spec);
        let learnable: Vec<&str> = learnable_aux(spec).iter().map(|a| a.name.as_str()).collect();
        let terms = grad
            .iter()
            .flat_map(|g| g.aux.iter())
            .filter_map(|t| {
                let learn = learnable.iter().position(|n| *n == t.aux)?;
                let decl = spec.aux_index(&t.aux)?;
                let per_element = t.index.iter().any(|i| uses(i, Var::Q) || uses(i, Var::K) || uses(i, Var::Score));
                Some(Term { term: t.clone(), learn, decl, d_uses_score: uses(&t.d, Var::Score), per_element })
            })
            .collect();
        ScoreGrad { grad, terms }
    }

    pub fn has_score_mod(&self) -> bool {
        self.grad.is_some()
    }
    /// Whether `∂m/∂score` is 1 everywhere (no score mod, or one that adds a bias: ALiBi,
    /// T5): dS then needs no per-element slope.
    pub fn slope_is_one(&self) -> bool {
        self.grad.as_ref().is_none_or(|g| matches!(g.d_score.kind, ExprKind::Float(1.0)))
    }
    pub fn has_aux_terms(&self) -> bool {
        !self.terms.is_empty()
    }

    /// The logit of one element from its raw dot product `raw`, the slope and the aux
    /// derivatives that read the score.
    pub fn logit<'ctx>(
        &self,
        kb: &Kb<'ctx>,
        spec: &Spec,
        raw: FloatValue<'ctx>,
        vars: ElemVars<'ctx>,
        args: &VariantArgs<'ctx>,
    ) -> R<ElemLogit<'ctx>> {
        let score = kb.fmul(raw, kb.f32c(spec.scale_value()), "score")?;
        let (Some(g), Some(m)) = (&self.grad, &spec.score_mod) else {
            return Ok(ElemLogit { s_log2: kb.fmul(score, kb.f32c(LOG2E), "s_log2")?, slope: None, aux_d: Vec::new() });
        };
        let vars = ElemVars { score: Some(score), ..vars };
        let mut memo = Memo::default();
        let modded = gen_memo(kb, spec, m, &vars, args, &mut memo)?.float();
        let s_log2 = kb.fmul(modded, kb.f32c(LOG2E), "s_log2")?;
        let slope = match self.slope_is_one() {
            true => None,
            false => Some(gen_memo(kb, spec, &g.d_score, &vars, args, &mut memo)?.float()),
        };
        let mut aux_d = Vec::new();
        for t in &self.terms {
            aux_d.push(if t.d_uses_score {
                Some(gen_memo(kb, spec, &t.term.d, &vars, args, &mut memo)?.float())
            } else {
                None
            });
        }
        Ok(ElemLogit { s_log2, slope, aux_d })
    }

    /// Adds `dS · ∂m/∂element` of every element of a warp's tile slice to each learnable
    /// aux term's element, elements in a fixed order. Elements with P = 0 (masked, or a
    /// logit of −∞) add nothing.
    pub fn accumulate_aux<'ctx>(
        &self,
        kb: &mut Kb<'ctx>,
        spec: &Spec,
        args: &VariantArgs<'ctx>,
        elems: &[AuxElem<'ctx>],
        sink: &AuxSink<'ctx>,
    ) -> R<()> {
        for (ti, t) in self.terms.iter().enumerate() {
            kb.section(&format!("aux gradient: {} (read site {ti})", t.term.aux))?;
            let aux =
                args.aux.get(t.decl).ok_or_else(|| crate::error::LowerError::Llvm("aux argument missing".into()))?;
            let mut contrib = Vec::new();
            for (vars, p, ds, pre) in elems {
                let d = match pre.get(ti).copied().flatten() {
                    Some(d) => d,
                    None => gen_memo(kb, spec, &t.term.d, vars, args, &mut Memo::default())?.float(),
                };
                let p_zero = kb.fcmp(FloatPredicate::OEQ, *p, kb.f32c(0.0), "")?;
                let v = kb.select_f(p_zero, kb.f32c(0.0), kb.fmul(*ds, d, "")?, "aux_contrib")?;
                contrib.push((vars, v));
            }
            // The slice offset of this tensor: the sizes of the learnable ones before it.
            let mut offset = kb.i32c(0);
            for s in &sink.sizes[..t.learn] {
                offset = kb.add(offset, *s, "")?;
            }
            let target = AuxTarget { sink, learn: t.learn, offset };
            if t.per_element {
                for (vars, v) in contrib {
                    let idx =
                        aux_flat_index(kb, spec, aux, &t.term.aux, &t.term.index, vars, args, &mut Memo::default())?;
                    target.add_scattered(kb, kb.trunc32(idx, "")?, v)?;
                }
            } else {
                // One address for the whole tile: sum the thread's elements, then the warp.
                let mut total = kb.f32c(0.0);
                for (_, v) in &contrib {
                    total = kb.fadd(total, *v, "")?;
                }
                let vars =
                    contrib.first().map(|c| *c.0).ok_or_else(|| crate::error::LowerError::Llvm("empty tile".into()))?;
                let idx = aux_flat_index(kb, spec, aux, &t.term.aux, &t.term.index, &vars, args, &mut Memo::default())?;
                target.add_uniform(kb, kb.trunc32(idx, "")?, total)?;
            }
        }
        Ok(())
    }
}

/// One learnable aux tensor's destination in an [`AuxSink`].
struct AuxTarget<'a, 'ctx> {
    sink: &'a AuxSink<'ctx>,
    learn: usize,
    /// Element offset of the tensor in a workspace slice.
    offset: IntValue<'ctx>,
}

impl<'ctx> AuxTarget<'_, 'ctx> {
    fn out_addr(&self, kb: &Kb<'ctx>, idx: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.add(self.sink.outputs[self.learn], kb.mul(kb.zext64(idx, "")?, kb.i64c(4), "")?, "aux_grad_addr")
    }
    fn slice_addr(&self, kb: &Kb<'ctx>, idx: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let e = kb.zext64(kb.add(self.offset, idx, "")?, "")?;
        kb.add(self.sink.slice_base, kb.mul(e, kb.i64c(4), "")?, "aux_slice_addr")
    }

    /// Adds `v` at `idx`, the same address in every lane: the warp's sum (a fixed
    /// butterfly), added by lane 0.
    fn add_uniform(&self, kb: &mut Kb<'ctx>, idx: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        let s = kb.warp_sum_f32(v)?;
        let lane = kb.and(kb.sreg("laneid", "")?, kb.i32c(31), "")?;
        let first = kb.icmp(IntPredicate::EQ, lane, kb.i32c(0), "")?;
        kb.if_then(first, "aux_add", |kb| self.add_one(kb, idx, s))
    }

    /// Lane 0's (or a group leader's) add: an atomic into the output, or a
    /// read-modify-write of the warp's own slice (deterministic).
    fn add_one(&self, kb: &mut Kb<'ctx>, idx: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        kb.if_else(
            self.sink.deterministic,
            "aux_det",
            |kb| {
                let a = self.slice_addr(kb, idx)?;
                let old = kb.ld_global_f32(a, "aux_old")?;
                kb.st_global_f32(a, kb.fadd(old, v, "")?)
            },
            |kb| kb.red_global_add_f32(self.out_addr(kb, idx)?, v),
        )
    }

    /// Adds each lane's `v` at its own `idx`. Lanes that share an address are summed
    /// first: all of them by a butterfly when the whole warp shares one (the common case
    /// of an index that varies slowly), else, in deterministic mode, each group in lane
    /// order by its lowest lane; atomics take any mix otherwise.
    fn add_scattered(&self, kb: &mut Kb<'ctx>, idx: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        let group = kb.match_any_b32(idx, "same_addr")?;
        let whole = kb.icmp(IntPredicate::EQ, group, kb.i32c(-1), "warp_uniform")?;
        kb.if_else(
            whole,
            "aux_uniform",
            |kb| self.add_uniform(kb, idx, v),
            |kb| {
                kb.if_else(
                    self.sink.deterministic,
                    "aux_groups",
                    |kb| {
                        // Every lane sums its group's values in lane order (all lanes run
                        // the 32 shuffles); the group's lowest lane adds the sum.
                        let mut acc = kb.f32c(0.0);
                        for j in 0..32 {
                            let x = kb.shfl_idx_f32(v, kb.i32c(j), "")?;
                            let bit = kb.and(kb.b.build_right_shift(group, kb.i32c(j), false, "")?, kb.i32c(1), "")?;
                            let member = kb.icmp(IntPredicate::NE, bit, kb.i32c(0), "")?;
                            acc = kb.select_f(member, kb.fadd(acc, x, "")?, acc, "")?;
                        }
                        let below = kb.and(group, kb.sreg("lanemask_lt", "")?, "")?;
                        let leader = kb.icmp(IntPredicate::EQ, below, kb.i32c(0), "group_leader")?;
                        kb.if_then(leader, "aux_group_add", |kb| self.add_one(kb, idx, acc))
                    },
                    |kb| {
                        let nz = kb.fcmp(FloatPredicate::ONE, v, kb.f32c(0.0), "")?;
                        kb.if_then(nz, "aux_atomic", |kb| kb.red_global_add_f32(self.out_addr(kb, idx)?, v))
                    },
                )
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(body: &str) -> Spec {
        let src = format!("attention v {{\n dtype bf16\n head_dim 128\n heads 8\n{body}}}\n");
        attnc_dsl::parse_named("v.attn", &src).expect("parses")
    }

    /// A bias (ALiBi, a T5 table) leaves `∂m/∂score` at 1; a softcap does not.
    #[test]
    fn a_bias_has_slope_one_and_a_softcap_does_not() {
        assert!(ScoreGrad::new(&spec("")).slope_is_one());
        assert!(ScoreGrad::new(&spec(" score score - 0.5 * float(abs(q - k))\n")).slope_is_one());
        assert!(!ScoreGrad::new(&spec(" score 30.0 * tanh(score / 30.0)\n")).slope_is_one());
        assert!(!ScoreGrad::new(&spec(" score 2.0 * score\n")).slope_is_one());
    }
}
