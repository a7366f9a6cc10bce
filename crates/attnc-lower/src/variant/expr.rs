//! Expression codegen: a mask or score modification evaluated per element, with the
//! exact semantics of `attnc_ir::eval` (32-bit wrapping ints, floor division and
//! modulo with x/0 = 0, clamped aux indices; an int aux tensor is read as i32, a float
//! one as f32). Floats are f32 on the GPU; the transcendental functions use the MUFU
//! approximations (their error is far below bf16/fp16 output precision).

use crate::llvm::kb::{Kb, R};
use attnc_ir::{AuxElem, BinOp, Expr, ExprKind, Func, Spec, UnOp, Var};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

/// A value of the expression language in registers.
#[derive(Clone, Copy, Debug)]
pub enum Val<'ctx> {
    /// i32
    Int(IntValue<'ctx>),
    /// f32
    Float(FloatValue<'ctx>),
    /// i1
    Bool(IntValue<'ctx>),
}

impl<'ctx> Val<'ctx> {
    pub fn int(self) -> IntValue<'ctx> {
        match self {
            Val::Int(v) | Val::Bool(v) => v,
            Val::Float(_) => unreachable_type("int"),
        }
    }
    pub fn float(self) -> FloatValue<'ctx> {
        match self {
            Val::Float(v) => v,
            _ => unreachable_type("float"),
        }
    }
}

fn unreachable_type(what: &str) -> ! {
    // The spec was type-checked before lowering; reaching this is a compiler bug.
    panic!("attnc internal error: expected a {what} value in a type-checked expression")
}

/// A launch-time aux tensor: its base address and resolved dimensions.
#[derive(Clone, Debug)]
pub struct AuxArg<'ctx> {
    pub addr: IntValue<'ctx>,
    pub dims: Vec<IntValue<'ctx>>,
}

/// Launch-time values an expression can read besides the per-element variables.
#[derive(Clone, Debug, Default)]
pub struct VariantArgs<'ctx> {
    /// Param values in declaration order (i32 or f32).
    pub params: Vec<Val<'ctx>>,
    pub aux: Vec<AuxArg<'ctx>>,
    /// The shard's place in its global sequence (variants that read positions): the
    /// expressions see global positions and lengths; tile bounds stay local.
    pub frame: Option<PositionFrame<'ctx>>,
}

/// Launch values that move local positions and lengths to global ones.
#[derive(Clone, Copy, Debug)]
pub enum PositionFrame<'ctx> {
    /// One frame for the whole launch (contiguous batches): shifts of the positions and
    /// lengths.
    Launch {
        q_offset: IntValue<'ctx>,
        k_offset: IntValue<'ctx>,
        seqlen_q_extra: IntValue<'ctx>,
        seqlen_k_extra: IntValue<'ctx>,
    },
    /// One frame per sequence (varlen batches): an i32 `[batch][4]` table of `q_offset`,
    /// `k_offset`, global `seqlen_q`, global `seqlen_k`.
    PerSequence { table: IntValue<'ctx> },
}

/// Which value of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameVar {
    Q,
    K,
    SeqlenQ,
    SeqlenK,
}

impl<'ctx> PositionFrame<'ctx> {
    /// The global value of `var` for batch entry `b` whose local value is `local` (i32).
    pub fn global(&self, kb: &Kb<'ctx>, var: FrameVar, b: IntValue<'ctx>, local: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        match *self {
            PositionFrame::Launch { q_offset, k_offset, seqlen_q_extra, seqlen_k_extra } => {
                let shift = match var {
                    FrameVar::Q => q_offset,
                    FrameVar::K => k_offset,
                    FrameVar::SeqlenQ => seqlen_q_extra,
                    FrameVar::SeqlenK => seqlen_k_extra,
                };
                kb.add(local, shift, "global")
            }
            PositionFrame::PerSequence { table } => {
                let column = match var {
                    FrameVar::Q => 0,
                    FrameVar::K => 1,
                    FrameVar::SeqlenQ => 2,
                    FrameVar::SeqlenK => 3,
                };
                // A pure read: repeated reads of one sequence's entry merge.
                let at = kb.add(kb.mul(kb.sext64(b, "")?, kb.i64c(16), "")?, kb.i64c(4 * column), "")?;
                let value = kb.ld_global_i32(kb.add(table, at, "")?, "frame")?;
                match var {
                    FrameVar::Q | FrameVar::K => kb.add(local, value, "global"),
                    FrameVar::SeqlenQ | FrameVar::SeqlenK => Ok(value),
                }
            }
        }
    }
}

/// The per-element variables (all i32 except `score`).
#[derive(Clone, Copy, Debug)]
pub struct ElemVars<'ctx> {
    pub b: IntValue<'ctx>,
    pub h: IntValue<'ctx>,
    pub hkv: IntValue<'ctx>,
    pub q: IntValue<'ctx>,
    pub k: IntValue<'ctx>,
    pub seqlen_q: IntValue<'ctx>,
    pub seqlen_k: IntValue<'ctx>,
    pub score: Option<FloatValue<'ctx>>,
    /// `k` as `base + imm` with `imm` known when the kernel is built (a column of a
    /// thread's tile fragment), where the family knows it. `float(a ± k)` then converts
    /// `a ± base` once per row and adds `±imm` per element: an FP32 add instead of a
    /// conversion on the quarter-rate pipe the exponentials use (ALiBi's distance).
    pub k_split: Option<(IntValue<'ctx>, i64)>,
}

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

/// Whether one element of a partial tile is allowed: its key inside seqlen_k and the
/// spec's mask predicate (if any) true. What every family computes per element of a
/// tile the analysis could not classify as full.
pub fn allowed<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    predicate: Option<&Expr>,
    vars: &ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
) -> R<IntValue<'ctx>> {
    let inside = kb.icmp(inkwell::IntPredicate::SLT, vars.k, vars.seqlen_k, "k_in_bounds")?;
    match predicate {
        Some(p) => kb.and(inside, gen(kb, spec, p, vars, args)?.int(), "allowed"),
        None => Ok(inside),
    }
}

/// A raw score after the spec's score modification `m`, in log2 units:
/// `m(raw · scale) · log2 e`.
pub fn modded_score_log2<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    m: &Expr,
    raw: FloatValue<'ctx>,
    vars: ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
) -> R<FloatValue<'ctx>> {
    let score = kb.fmul(raw, kb.f32c(spec.scale_value()), "score")?;
    let modded = gen(kb, spec, m, &ElemVars { score: Some(score), ..vars }, args)?.float();
    kb.fmul(modded, kb.f32c(LOG2E), "s_log2")
}

/// A local position or length moved into the global sequence by the launch's frame.
fn global<'ctx>(
    kb: &Kb<'ctx>,
    args: &VariantArgs<'ctx>,
    var: FrameVar,
    b: IntValue<'ctx>,
    local: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    match &args.frame {
        Some(f) => f.global(kb, var, b, local),
        None => Ok(local),
    }
}

/// Emits `e` for one element, memoized when `memo` is given.
fn gen_with<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    e: &Expr,
    vars: &ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
    mut memo: Option<&mut Memo<'ctx>>,
) -> R<Val<'ctx>> {
    if let Some(v) = memo.as_deref().and_then(|m| m.get(e)) {
        return Ok(v);
    }
    let v = match &e.kind {
        ExprKind::Int(v) => Val::Int(kb.i32c(*v)),
        ExprKind::Float(v) => Val::Float(kb.f32c(*v)),
        ExprKind::Bool(v) => Val::Bool(kb.boolc(*v)),
        ExprKind::Var(v) => match v {
            Var::B => Val::Int(vars.b),
            Var::H => Val::Int(vars.h),
            Var::Hkv => Val::Int(vars.hkv),
            Var::Q => Val::Int(global(kb, args, FrameVar::Q, vars.b, vars.q)?),
            Var::K => Val::Int(global(kb, args, FrameVar::K, vars.b, vars.k)?),
            Var::SeqlenQ => Val::Int(global(kb, args, FrameVar::SeqlenQ, vars.b, vars.seqlen_q)?),
            Var::SeqlenK => Val::Int(global(kb, args, FrameVar::SeqlenK, vars.b, vars.seqlen_k)?),
            Var::QHeads => Val::Int(kb.i32c(spec.q_heads as i64)),
            Var::KvHeads => Val::Int(kb.i32c(spec.kv_heads as i64)),
            Var::Score => Val::Float(vars.score.unwrap_or_else(|| kb.f32c(0.0))),
        },
        ExprKind::Param(name) => {
            let i = spec.param_index(name).unwrap_or(usize::MAX);
            args.params.get(i).copied().unwrap_or(Val::Int(kb.i32c(0)))
        }
        ExprKind::Aux { name, index } => {
            let Some(aux) = spec.aux_index(name).and_then(|i| args.aux.get(i)) else {
                return Ok(match spec.aux_decl(name).map(|d| d.elem) {
                    Some(AuxElem::Float) => Val::Float(kb.f32c(0.0)),
                    _ => Val::Int(kb.i32c(0)),
                });
            };
            let flat = flat_index(kb, spec, aux, name, index, vars, args, memo.as_deref_mut())?;
            // i32 and f32 elements are both 4 bytes. A float element is read with the same
            // pure read-only load as an int one (no kernel writes an aux tensor: learnable
            // ones get their gradients in separate buffers), so repeated reads merge.
            let addr = kb.add(aux.addr, kb.mul(flat, kb.i64c(4), "")?, &format!("{name}.addr"))?;
            let bits = kb.ld_global_i32(addr, name)?;
            match spec.aux_decl(name).map(|d| d.elem) {
                Some(AuxElem::Float) => Val::Float(kb.bits_f(bits, name)?),
                _ => Val::Int(bits),
            }
        }
        ExprKind::Unary(op, a) => {
            let a = gen_with(kb, spec, a, vars, args, memo.as_deref_mut())?;
            match (op, a) {
                (UnOp::Neg, Val::Int(v)) => Val::Int(kb.sub(kb.i32c(0), v, "neg")?),
                (UnOp::Neg, Val::Float(v)) => Val::Float(kb.fneg(v, "neg")?),
                (_, v) => Val::Bool(kb.not(v.int(), "not")?),
            }
        }
        ExprKind::Binary(op, a, b) => {
            let a = gen_with(kb, spec, a, vars, args, memo.as_deref_mut())?;
            let b = gen_with(kb, spec, b, vars, args, memo.as_deref_mut())?;
            binary(kb, *op, a, b)?
        }
        ExprKind::Call(f, a) => {
            if let Some(v) = key_distance_to_float(kb, spec, *f, a, vars, args)? {
                return memoized(memo, e, v);
            }
            // A constant divisor in softcap becomes a multiply by its reciprocal.
            if let (Func::Softcap, Some(ExprKind::Float(c))) = (f, a.get(1).map(|x| &x.kind)) {
                let x = gen_with(kb, spec, &a[0], vars, args, memo.as_deref_mut())?.float();
                let t = kb.fmul(x, kb.f32c(1.0 / c), "")?;
                let th = tanh(kb, t)?;
                Val::Float(kb.fmul(th, kb.f32c(*c), "softcap")?)
            } else {
                let v: Vec<Val> =
                    a.iter().map(|x| gen_with(kb, spec, x, vars, args, memo.as_deref_mut())).collect::<R<_>>()?;
                call(kb, *f, &v)?
            }
        }
    };
    memoized(memo, e, v)
}

/// Emits `e` for one element.
pub fn gen<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    e: &Expr,
    vars: &ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
) -> R<Val<'ctx>> {
    gen_with(kb, spec, e, vars, args, None)
}

/// [`gen`] that reuses, through `memo`, the value of every compound subexpression
/// already emitted for the same element: the backward emits a score modification and
/// its derivatives, which contain the modification's own subexpressions (softcap's
/// tanh, an exp, an aux read), and computes each once.
pub fn gen_memo<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    e: &Expr,
    vars: &ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
    memo: &mut Memo<'ctx>,
) -> R<Val<'ctx>> {
    gen_with(kb, spec, e, vars, args, Some(memo))
}

/// Values of the compound subexpressions emitted for one element (structural equality:
/// spans are ignored). Valid only for the element and the basic block it was made in.
#[derive(Default)]
pub struct Memo<'ctx> {
    entries: Vec<(Expr, Val<'ctx>)>,
}

impl<'ctx> Memo<'ctx> {
    fn get(&self, e: &Expr) -> Option<Val<'ctx>> {
        if !Self::worth_keeping(e) {
            return None;
        }
        self.entries.iter().find(|(k, _)| k == e).map(|(_, v)| *v)
    }
    fn put(&mut self, e: &Expr, v: Val<'ctx>) {
        if Self::worth_keeping(e) && self.get(e).is_none() {
            self.entries.push((e.clone(), v));
        }
    }
    /// Leaves (literals, variables, params) cost nothing to re-emit.
    fn worth_keeping(e: &Expr) -> bool {
        matches!(e.kind, ExprKind::Aux { .. } | ExprKind::Unary(..) | ExprKind::Binary(..) | ExprKind::Call(..))
    }
}

/// The row-major flat index (i64) of `aux[index...]`, every index clamped into
/// `[0, dim − 1]`: where a read of the tensor goes, and where its gradient is added.
pub fn aux_flat_index<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    aux: &AuxArg<'ctx>,
    name: &str,
    index: &[Expr],
    vars: &ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
    memo: &mut Memo<'ctx>,
) -> R<IntValue<'ctx>> {
    flat_index(kb, spec, aux, name, index, vars, args, Some(memo))
}

fn flat_index<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    aux: &AuxArg<'ctx>,
    name: &str,
    index: &[Expr],
    vars: &ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
    mut memo: Option<&mut Memo<'ctx>>,
) -> R<IntValue<'ctx>> {
    let mut flat = kb.i64c(0);
    for (ie, dim) in index.iter().zip(&aux.dims) {
        let i = gen_with(kb, spec, ie, vars, args, memo.as_deref_mut())?.int();
        let hi = kb.sub(*dim, kb.i32c(1), "")?;
        let c = kb.smin(kb.smax(i, kb.i32c(0), "")?, hi, &format!("{name}.idx"))?;
        flat = kb.add(kb.mul(flat, kb.sext64(*dim, "")?, "")?, kb.sext64(c, "")?, "")?;
    }
    Ok(flat)
}

fn tanh<'ctx>(kb: &Kb<'ctx>, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    kb.asm_f32_1("tanh.approx.f32 $0, $1;", x, "tanh")
}

/// Floor division with x/0 = 0 and MIN/−1 wrapping, as in `attnc_ir::eval::floor_div`.
pub fn floor_div<'ctx>(kb: &Kb<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let zero = kb.i32c(0);
    let b_zero = kb.icmp(IntPredicate::EQ, b, zero, "")?;
    let b_m1 = kb.icmp(IntPredicate::EQ, b, kb.i32c(-1), "")?;
    let unsafe_b = kb.or(b_zero, b_m1, "")?;
    let bs = kb.select_i(unsafe_b, kb.i32c(1), b, "")?;
    let q = kb.b.build_int_signed_div(a, bs, "")?;
    let r = kb.b.build_int_signed_rem(a, bs, "")?;
    let r_nz = kb.icmp(IntPredicate::NE, r, zero, "")?;
    let sign_differs = kb.icmp(IntPredicate::SLT, kb.xor(r, bs, "")?, zero, "")?;
    let adjust = kb.and(r_nz, sign_differs, "")?;
    let q = kb.select_i(adjust, kb.sub(q, kb.i32c(1), "")?, q, "")?;
    let q = kb.select_i(b_m1, kb.sub(zero, a, "")?, q, "")?;
    kb.select_i(b_zero, zero, q, "floordiv")
}

/// Floor modulo with x%0 = 0, as in `attnc_ir::eval::floor_rem`.
pub fn floor_rem<'ctx>(kb: &Kb<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let zero = kb.i32c(0);
    let b_zero = kb.icmp(IntPredicate::EQ, b, zero, "")?;
    let b_m1 = kb.icmp(IntPredicate::EQ, b, kb.i32c(-1), "")?;
    let unsafe_b = kb.or(b_zero, b_m1, "")?;
    let bs = kb.select_i(unsafe_b, kb.i32c(1), b, "")?;
    let r = kb.b.build_int_signed_rem(a, bs, "")?;
    let r_nz = kb.icmp(IntPredicate::NE, r, zero, "")?;
    let sign_differs = kb.icmp(IntPredicate::SLT, kb.xor(r, bs, "")?, zero, "")?;
    let adjust = kb.and(r_nz, sign_differs, "")?;
    let r = kb.select_i(adjust, kb.add(r, bs, "")?, r, "")?;
    kb.select_i(unsafe_b, zero, r, "floorrem")
}

fn memoized<'ctx>(memo: Option<&mut Memo<'ctx>>, e: &Expr, v: Val<'ctx>) -> R<Val<'ctx>> {
    if let Some(m) = memo {
        m.put(e, v);
    }
    Ok(v)
}

/// `e` as `a + s·k` (`s` = ±1, `a` free of `k`), possibly inside one `abs`: the shape of
/// a key distance. The expression inside the `abs`, whether there is one, and `s`.
fn key_distance(e: &Expr) -> Option<(&Expr, bool, i64)> {
    match &e.kind {
        ExprKind::Call(Func::Abs, a) if a.len() == 1 => key_offset_sign(&a[0]).map(|s| (&a[0], true, s)),
        _ => key_offset_sign(e).map(|s| (e, false, s)),
    }
}

/// The sign of `k` in `e` when `e` is `a ± k` with `a` free of `k`.
fn key_offset_sign(e: &Expr) -> Option<i64> {
    let has_k = |x: &Expr| x.uses_var(Var::K);
    match &e.kind {
        ExprKind::Var(Var::K) => Some(1),
        ExprKind::Unary(UnOp::Neg, a) => key_offset_sign(a).map(|s| -s),
        ExprKind::Binary(BinOp::Add, a, b) => match (has_k(a), has_k(b)) {
            (true, false) => key_offset_sign(a),
            (false, true) => key_offset_sign(b),
            _ => None,
        },
        ExprKind::Binary(BinOp::Sub, a, b) => match (has_k(a), has_k(b)) {
            (true, false) => key_offset_sign(a),
            (false, true) => key_offset_sign(b).map(|s| -s),
            _ => None,
        },
        _ => None,
    }
}

/// `float(e)` for a key distance `e` (`key_distance`) when the family split `k` as
/// `base + imm`: `e` at `k = base` — the same for every element of a row, so converted
/// once per row after CSE — plus `s·imm` in FP32, through the `abs` when there is one.
/// Equal to converting `e` while `|e|` stays below 2^24; beyond, within an ulp or two of
/// it (relative 1e-7). `None` for any other call.
fn key_distance_to_float<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    f: Func,
    a: &[Expr],
    vars: &ElemVars<'ctx>,
    args: &VariantArgs<'ctx>,
) -> R<Option<Val<'ctx>>> {
    let (Func::ToFloat, [e], Some((base, imm))) = (f, a, vars.k_split) else { return Ok(None) };
    let Some((inner, abs, sign)) = key_distance(e) else { return Ok(None) };
    let at_base = ElemVars { k: base, k_split: None, ..*vars };
    // No memo: the memo holds this element's values, not the row's.
    let row_value = gen_with(kb, spec, inner, &at_base, args, None)?.int();
    let row_f = kb.si_to_f(row_value, "key_dist_row")?;
    let v = kb.fadd(row_f, kb.f32c((sign * imm) as f64), "key_dist")?;
    Ok(Some(Val::Float(if abs { kb.asm_f32_1("abs.f32 $0, $1;", v, "key_dist_abs")? } else { v })))
}

fn binary<'ctx>(kb: &Kb<'ctx>, op: BinOp, a: Val<'ctx>, b: Val<'ctx>) -> R<Val<'ctx>> {
    Ok(match (a, b) {
        (Val::Int(x), Val::Int(y)) => match op {
            BinOp::Add => Val::Int(kb.add(x, y, "add")?),
            BinOp::Sub => Val::Int(kb.sub(x, y, "sub")?),
            BinOp::Mul => Val::Int(kb.mul(x, y, "mul")?),
            BinOp::Div => Val::Int(floor_div(kb, x, y)?),
            BinOp::Rem => Val::Int(floor_rem(kb, x, y)?),
            BinOp::And | BinOp::Or => {
                let xb = kb.icmp(IntPredicate::NE, x, kb.i32c(0), "")?;
                let yb = kb.icmp(IntPredicate::NE, y, kb.i32c(0), "")?;
                return binary(kb, op, Val::Bool(xb), Val::Bool(yb));
            }
            cmp => Val::Bool(kb.icmp(int_pred(cmp), x, y, "cmp")?),
        },
        (Val::Bool(x), Val::Bool(y)) => match op {
            BinOp::And => Val::Bool(kb.and(x, y, "and")?),
            BinOp::Or => Val::Bool(kb.or(x, y, "or")?),
            BinOp::Eq => Val::Bool(kb.icmp(IntPredicate::EQ, x, y, "eq")?),
            BinOp::Ne => Val::Bool(kb.icmp(IntPredicate::NE, x, y, "ne")?),
            _ => {
                let xi = kb.zext32(x, "")?;
                let yi = kb.zext32(y, "")?;
                return binary(kb, op, Val::Int(xi), Val::Int(yi));
            }
        },
        (Val::Float(x), Val::Float(y)) => match op {
            BinOp::Add => Val::Float(kb.fadd(x, y, "fadd")?),
            BinOp::Sub => Val::Float(kb.fsub(x, y, "fsub")?),
            BinOp::Mul => Val::Float(kb.fmul(x, y, "fmul")?),
            BinOp::Div => Val::Float(kb.fdiv(x, y, "fdiv")?),
            BinOp::Rem => Val::Float(kb.b.build_float_rem(x, y, "frem")?),
            BinOp::And | BinOp::Or => {
                let xb = kb.fcmp(FloatPredicate::UNE, x, kb.f32c(0.0), "")?;
                let yb = kb.fcmp(FloatPredicate::UNE, y, kb.f32c(0.0), "")?;
                return binary(kb, op, Val::Bool(xb), Val::Bool(yb));
            }
            cmp => Val::Bool(kb.fcmp(float_pred(cmp), x, y, "fcmp")?),
        },
        _ => unreachable_type("matching operand"),
    })
}

fn int_pred(op: BinOp) -> IntPredicate {
    match op {
        BinOp::Lt => IntPredicate::SLT,
        BinOp::Le => IntPredicate::SLE,
        BinOp::Gt => IntPredicate::SGT,
        BinOp::Ge => IntPredicate::SGE,
        BinOp::Eq => IntPredicate::EQ,
        _ => IntPredicate::NE,
    }
}

fn float_pred(op: BinOp) -> FloatPredicate {
    // Ordered comparisons (false on NaN) match Rust's f64 operators; != is unordered.
    match op {
        BinOp::Lt => FloatPredicate::OLT,
        BinOp::Le => FloatPredicate::OLE,
        BinOp::Gt => FloatPredicate::OGT,
        BinOp::Ge => FloatPredicate::OGE,
        BinOp::Eq => FloatPredicate::OEQ,
        _ => FloatPredicate::UNE,
    }
}

fn call<'ctx>(kb: &Kb<'ctx>, f: Func, v: &[Val<'ctx>]) -> R<Val<'ctx>> {
    let x = v[0];
    Ok(match f {
        Func::Min | Func::Max => match (x, v[1]) {
            (Val::Int(a), Val::Int(b)) => {
                Val::Int(if f == Func::Min { kb.smin(a, b, "min")? } else { kb.smax(a, b, "max")? })
            }
            (a, b) => {
                let (a, b) = (a.float(), b.float());
                Val::Float(if f == Func::Min { kb.fmin(a, b, "fmin")? } else { kb.fmax(a, b, "fmax")? })
            }
        },
        Func::Abs => match x {
            Val::Int(a) => {
                let neg = kb.icmp(IntPredicate::SLT, a, kb.i32c(0), "")?;
                Val::Int(kb.select_i(neg, kb.sub(kb.i32c(0), a, "")?, a, "abs")?)
            }
            a => Val::Float(kb.asm_f32_1("abs.f32 $0, $1;", a.float(), "fabs")?),
        },
        Func::Select => {
            let c = x.int();
            match (v[1], v[2]) {
                (Val::Float(a), Val::Float(b)) => Val::Float(kb.select_f(c, a, b, "select")?),
                (Val::Bool(a), Val::Bool(b)) => Val::Bool(kb.select_i(c, a, b, "select")?),
                (a, b) => Val::Int(kb.select_i(c, a.int(), b.int(), "select")?),
            }
        }
        Func::ToFloat => Val::Float(kb.si_to_f(x.int(), "tofloat")?),
        Func::ToInt => Val::Int(kb.f_to_si(x.float(), "toint")?),
        Func::Exp => Val::Float(kb.ex2(kb.fmul(x.float(), kb.f32c(LOG2E), "")?, "exp")?),
        Func::Exp2 => Val::Float(kb.ex2(x.float(), "exp2")?),
        Func::Log => Val::Float(kb.fmul(kb.lg2(x.float(), "")?, kb.f32c(LN2), "log")?),
        Func::Log2 => Val::Float(kb.lg2(x.float(), "log2")?),
        Func::Sqrt => Val::Float(kb.asm_f32_1("sqrt.rn.f32 $0, $1;", x.float(), "sqrt")?),
        Func::Tanh => Val::Float(tanh(kb, x.float())?),
        Func::Sigmoid => {
            let e = kb.ex2(kb.fmul(x.float(), kb.f32c(-LOG2E), "")?, "")?;
            Val::Float(kb.fdiv(kb.f32c(1.0), kb.fadd(kb.f32c(1.0), e, "")?, "sigmoid")?)
        }
        Func::Softcap => {
            let (a, c) = (x.float(), v[1].float());
            let t = tanh(kb, kb.fdiv(a, c, "")?)?;
            Val::Float(kb.fmul(t, c, "softcap")?)
        }
    })
}
