//! Random valid specs, for properties that must hold for *every* spec and not only the
//! examples: the DSL's print/parse round trip, and the sweep that compiles random specs for
//! every arch and holds them to zero spills.
//!
//! Expressions come from a sequence of choices (Hypothesis style): well typed by
//! construction, and a shorter sequence gives a smaller tree, so a shrinking test
//! framework can drive [`ExprGen`] with its own vectors; [`random_spec`] drives it from a
//! seeded [`Rng`] for reproducible sweeps.

use crate::check::{is_reserved, ExprContext, MAX_WINDOW};
use crate::expr::{BinOp, Expr, Func, Ty, UnOp, Var};
use crate::reference::Rng;
use crate::spec::{
    Align, AuxDecl, AuxDim, AuxElem, DType, KvLayout, Mask, ParamDecl, Scale, SoftmaxOptions, Spec, SplitKv, Window,
    SUPPORTED_HEAD_DIMS,
};

const INT_VARS: [Var; 9] =
    [Var::B, Var::H, Var::Hkv, Var::Q, Var::K, Var::SeqlenQ, Var::SeqlenK, Var::QHeads, Var::KvHeads];
const FLOAT_FUNCS: [Func; 8] =
    [Func::Abs, Func::Exp, Func::Exp2, Func::Log, Func::Log2, Func::Sqrt, Func::Tanh, Func::Sigmoid];
const SPECIAL_FLOATS: [f64; 12] =
    [0.0, -0.0, 1.0, -2.5, 0.1, 1e-7, 1e16, 5e-324, f32::MAX as f64, f32::MIN as f64, f64::MIN_POSITIVE, 50.0];

/// Builds expressions from a choice sequence; choices past the end read as 0, which
/// always selects a leaf.
pub struct ExprGen<'a> {
    choices: &'a [u32],
    i: usize,
    params: &'a [ParamDecl],
    aux: &'a [AuxDecl],
    ctx: ExprContext,
    /// Inside `int(...)` in a mask: no float aux reads (they may only be compared there).
    in_to_int: u32,
}

impl<'a> ExprGen<'a> {
    /// A builder reading `choices` for expressions over the spec's `params` and `aux`, in
    /// the context (mask or score modification) that decides which leaves exist.
    pub fn new(choices: &'a [u32], params: &'a [ParamDecl], aux: &'a [AuxDecl], ctx: ExprContext) -> Self {
        ExprGen { choices, i: 0, params, aux, ctx, in_to_int: 0 }
    }
    fn raw(&mut self) -> u32 {
        let c = self.choices.get(self.i).copied().unwrap_or(0);
        self.i += 1;
        c
    }
    fn pick(&mut self, n: usize) -> usize {
        self.raw() as usize % n.max(1)
    }
    fn done(&self) -> bool {
        self.i >= self.choices.len()
    }

    fn float_literal(&mut self) -> f64 {
        match self.pick(3) {
            0 => {
                let bits = (u64::from(self.raw()) << 32) | u64::from(self.raw());
                let v = f64::from_bits(bits);
                // The IR accepts finite literals within f32 range (kernels are f32).
                if v.is_finite() && v.abs() <= f32::MAX as f64 {
                    v
                } else {
                    1.5
                }
            }
            1 => f64::from(self.raw() % 100_000) / 64.0 - 500.0,
            _ => SPECIAL_FLOATS[self.pick(SPECIAL_FLOATS.len())],
        }
    }

    fn param_of(&mut self, ty: Ty) -> Option<Expr> {
        let ps: Vec<&ParamDecl> = self.params.iter().filter(|p| p.ty == ty).collect();
        if ps.is_empty() {
            None
        } else {
            Some(Expr::param(&ps[self.pick(ps.len())].name))
        }
    }

    fn leaf(&mut self, ty: Ty) -> Expr {
        match ty {
            Ty::Int => match self.pick(4) {
                0 => Expr::int(i64::from(self.raw() as i32)),
                1 => Expr::int(i64::from(self.raw() % 20) - 5),
                2 => self.param_of(Ty::Int).unwrap_or_else(|| Expr::var(Var::Q)),
                _ => Expr::var(INT_VARS[self.pick(INT_VARS.len())]),
            },
            Ty::Float => match self.pick(3) {
                0 if self.ctx == ExprContext::ScoreMod => Expr::var(Var::Score),
                1 => self.param_of(Ty::Float).unwrap_or_else(|| Expr::float(2.0)),
                _ => Expr::float(self.float_literal()),
            },
            Ty::Bool => Expr::bool(self.pick(2) == 0),
        }
    }

    /// A read of an aux tensor of this element type, if one is declared.
    fn aux_read(&mut self, elem: AuxElem, d: u32) -> Option<Expr> {
        let of: Vec<&AuxDecl> = self.aux.iter().filter(|a| a.elem == elem).collect();
        if of.is_empty() {
            return None;
        }
        let a = of[self.pick(of.len())];
        let (name, n) = (a.name.clone(), a.dims.len());
        Some(Expr::aux(&name, (0..n).map(|_| self.expr(Ty::Int, d)).collect()))
    }

    /// A well-typed expression of type `ty`, at most `depth` levels deep.
    pub fn expr(&mut self, ty: Ty, depth: u32) -> Expr {
        if depth == 0 || self.done() || self.pick(4) == 0 {
            return self.leaf(ty);
        }
        let d = depth - 1;
        match ty {
            Ty::Int => match self.pick(7) {
                0 => {
                    let op = [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Rem][self.pick(5)];
                    Expr::binary(op, self.expr(Ty::Int, d), self.expr(Ty::Int, d))
                }
                1 => Expr::unary(UnOp::Neg, self.expr(Ty::Int, d)),
                2 => {
                    let f = [Func::Min, Func::Max][self.pick(2)];
                    Expr::call(f, vec![self.expr(Ty::Int, d), self.expr(Ty::Int, d)])
                }
                3 => Expr::call(Func::Abs, vec![self.expr(Ty::Int, d)]),
                4 => {
                    Expr::call(Func::Select, vec![self.expr(Ty::Bool, d), self.expr(Ty::Int, d), self.expr(Ty::Int, d)])
                }
                5 => {
                    let mask = self.ctx == ExprContext::Mask;
                    self.in_to_int += u32::from(mask);
                    let x = self.expr(Ty::Float, d);
                    self.in_to_int -= u32::from(mask);
                    Expr::call(Func::ToInt, vec![x])
                }
                _ => self.aux_read(AuxElem::Int, d).unwrap_or_else(|| self.leaf(Ty::Int)),
            },
            Ty::Float => match self.pick(7) {
                0 => {
                    let op = [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div][self.pick(4)];
                    Expr::binary(op, self.expr(Ty::Float, d), self.expr(Ty::Float, d))
                }
                1 => Expr::unary(UnOp::Neg, self.expr(Ty::Float, d)),
                2 => {
                    let f = [Func::Min, Func::Max, Func::Softcap][self.pick(3)];
                    Expr::call(f, vec![self.expr(Ty::Float, d), self.expr(Ty::Float, d)])
                }
                3 => {
                    let f = FLOAT_FUNCS[self.pick(FLOAT_FUNCS.len())];
                    Expr::call(f, vec![self.expr(Ty::Float, d)])
                }
                4 => Expr::call(
                    Func::Select,
                    vec![self.expr(Ty::Bool, d), self.expr(Ty::Float, d), self.expr(Ty::Float, d)],
                ),
                5 => Expr::call(Func::ToFloat, vec![self.expr(Ty::Int, d)]),
                _ if self.in_to_int == 0 => self.aux_read(AuxElem::Float, d).unwrap_or_else(|| self.leaf(Ty::Float)),
                _ => self.leaf(Ty::Float),
            },
            Ty::Bool => match self.pick(4) {
                0 => {
                    let op = [BinOp::Lt, BinOp::Le, BinOp::Gt, BinOp::Ge, BinOp::Eq, BinOp::Ne][self.pick(6)];
                    let t = [Ty::Int, Ty::Float][self.pick(2)];
                    Expr::binary(op, self.expr(t, d), self.expr(t, d))
                }
                1 => {
                    let op = [BinOp::And, BinOp::Or][self.pick(2)];
                    Expr::binary(op, self.expr(Ty::Bool, d), self.expr(Ty::Bool, d))
                }
                2 => Expr::unary(UnOp::Not, self.expr(Ty::Bool, d)),
                _ => {
                    let op = [BinOp::Eq, BinOp::Ne][self.pick(2)];
                    Expr::binary(op, self.expr(Ty::Bool, d), self.expr(Ty::Bool, d))
                }
            },
        }
    }
}

/// A valid spec named `name`, drawn from `rng`: any supported head dims, heads and GQA
/// packing, dtype, params and aux tensors of every kind (int, float, learnable), causal
/// and window masks of either alignment, random mask predicates and score modifications
/// (depth ≤ 5, every function and operator, literals from the ordinary to the extreme),
/// scale, sinks, every KV layout, split-KV, LSE and softmax options. The draw is retried
/// until the spec validates (by construction it nearly always does).
pub fn random_spec(rng: &mut Rng, name: &str) -> Spec {
    loop {
        let spec = draw(rng, name);
        if crate::validate(&spec).is_ok() {
            return spec;
        }
    }
}

fn choices(rng: &mut Rng, max: i64) -> Vec<u32> {
    let n = rng.int_in(0, max);
    (0..n).map(|_| rng.next_u64() as u32).collect()
}

fn chance(rng: &mut Rng, p: f64) -> bool {
    rng.uniform() < p
}

fn aux_dim(rng: &mut Rng) -> AuxDim {
    match rng.int_in(0, 5) {
        0 => AuxDim::Batch,
        1 => AuxDim::MaxSeqlenQ,
        2 => AuxDim::MaxSeqlenK,
        3 => AuxDim::QHeads,
        4 => AuxDim::KvHeads,
        _ => AuxDim::Fixed(if chance(rng, 0.9) {
            rng.int_in(1, 64) as u64
        } else {
            rng.int_in(1, i32::MAX as i64) as u64
        }),
    }
}

fn draw(rng: &mut Rng, name: &str) -> Spec {
    let (hd_qk, hd_v) = SUPPORTED_HEAD_DIMS[rng.int_in(0, SUPPORTED_HEAD_DIMS.len() as i64 - 1) as usize];
    let kv = if chance(rng, 0.9) { rng.int_in(1, 16) } else { rng.int_in(1, 128) } as u32;
    let group = if chance(rng, 0.5) { 1 } else { rng.int_in(1, 8) as u32 };
    let q = (kv * group).min(1024);
    let kv = if q % kv == 0 { kv } else { q };
    let fp16 = chance(rng, 0.3);
    let mut spec = Spec::new(name, hd_qk, q);
    spec.head_dim_v = hd_v;
    spec.kv_heads = kv;
    spec.pack_gqa = q > kv && chance(rng, 0.5);
    spec.dtype = if fp16 { DType::Fp16 } else { DType::Bf16 };

    // Declarations share a namespace and avoid reserved words.
    let mut used: Vec<String> = Vec::new();
    let mut fresh = |n: String| {
        let mut n = if is_reserved(&n) { format!("{n}_") } else { n };
        while used.contains(&n) {
            n.push('_');
        }
        used.push(n.clone());
        n
    };
    spec.params = (0..rng.int_in(0, 4))
        .map(|i| ParamDecl { name: fresh(format!("p{i}")), ty: if chance(rng, 0.5) { Ty::Int } else { Ty::Float } })
        .collect();
    spec.aux = (0..rng.int_in(0, 2))
        .map(|i| {
            let dims = (0..rng.int_in(1, 4)).map(|_| aux_dim(rng)).collect();
            match rng.int_in(0, 3) {
                0 | 1 => AuxDecl::int(&fresh(format!("a{i}")), dims),
                k => AuxDecl::float(&fresh(format!("a{i}")), dims, k == 3),
            }
        })
        .collect();

    let align = |rng: &mut Rng| if chance(rng, 0.5) { Align::TopLeft } else { Align::BottomRight };
    let causal = chance(rng, 0.5).then(|| align(rng));
    let window = chance(rng, 0.3).then(|| {
        let bound = |rng: &mut Rng| match rng.int_in(0, 2) {
            0 => None,
            1 => Some(rng.int_in(0, 64) as u64),
            _ => Some(rng.int_in(0, MAX_WINDOW as i64) as u64),
        };
        let (l, r) = (bound(rng), bound(rng));
        let (left, right) = if l.is_none() && r.is_none() { (Some(0), None) } else { (l, r) };
        let right = if chance(rng, 0.5) { right } else { right.filter(|_| left.is_none()) };
        let own = align(rng);
        Window { left, right, align: causal.unwrap_or(own) }
    });
    let pred = chance(rng, 0.5).then(|| choices(rng, 48));
    let score = chance(rng, 0.5).then(|| choices(rng, 48));
    spec.mask = Mask {
        causal,
        window,
        predicate: pred.map(|c| ExprGen::new(&c, &spec.params, &spec.aux, ExprContext::Mask).expr(Ty::Bool, 5)),
    };
    spec.score_mod = score.map(|c| ExprGen::new(&c, &spec.params, &spec.aux, ExprContext::ScoreMod).expr(Ty::Float, 5));

    spec.scale = if chance(rng, 0.3) { Scale::Value(1e-4 + rng.uniform() * 10.0) } else { Scale::Default };
    spec.sinks = chance(rng, 0.2);
    spec.kv_layout = match rng.int_in(0, 3) {
        0 | 1 => KvLayout::Contiguous,
        2 => KvLayout::Varlen,
        _ => KvLayout::Paged { page_size: [1, 8, 16, 32, 64, 128, 256][rng.int_in(0, 6) as usize] },
    };
    spec.split_kv = match rng.int_in(0, 3) {
        0 | 1 => SplitKv::None,
        2 => SplitKv::Auto,
        _ => SplitKv::Fixed(rng.int_in(1, 16) as u32),
    };
    spec.lse = chance(rng, 0.5);
    let exp2_emulation = [0.0, 0.5, 1.0][rng.int_in(0, 2) as usize];
    let rescale_threshold = [0.0, 8.0, 64.0][rng.int_in(0, 2) as usize];
    // Conditional rescaling may let P grow to 2^threshold; fp16 overflows past 2^15.
    let rescale_threshold = if fp16 { f64::min(rescale_threshold, 15.0) } else { rescale_threshold };
    spec.softmax = SoftmaxOptions { exp2_emulation, rescale_threshold };
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_specs_are_valid_reproducible_and_varied() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let specs: Vec<Spec> = (0..300).map(|i| random_spec(&mut a, &format!("s{i}"))).collect();
        for (i, s) in specs.iter().enumerate() {
            assert_eq!(crate::validate(s), Ok(()));
            assert_eq!(&random_spec(&mut b, &format!("s{i}")), s, "same seed, same spec");
        }
        let count = |f: &dyn Fn(&Spec) -> bool| specs.iter().filter(|s| f(s)).count();
        assert!(count(&|s| s.mask.predicate.is_some()) > 50);
        assert!(count(&|s| s.score_mod.is_some()) > 50);
        assert!(count(&|s| s.aux.iter().any(|a| a.learnable)) > 10);
        assert!(count(&|s| matches!(s.kv_layout, KvLayout::Paged { .. })) > 20);
        assert!(count(&|s| s.split_kv != SplitKv::None) > 20);
        assert!(count(&|s| s.head_dim_qk != s.head_dim_v) > 10);
    }
}
