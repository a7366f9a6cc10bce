//! Tile classification at run time: the interval analysis of `attnc_ir::analysis`,
//! rule for rule, emitted as scalar code. A kernel evaluates it once per (q tile,
//! k tile) with the tile's index ranges and the launch's param values, so masks that
//! depend on runtime params (a prefix length, a window) still skip empty tiles and
//! drop per-element masking on full ones. For masks without params or seqlens the
//! code folds to constants.
//!
//! Ranges are i64 pairs; a result that leaves i32 becomes TOP, because ints wrap.

use super::expr::{FrameVar, PositionFrame, Val, VariantArgs};
use crate::llvm::kb::{Kb, R};
use attnc_ir::{AuxElem, BinOp, Expr, ExprKind, Func, Spec, Ty, UnOp, Var};
use inkwell::values::IntValue;
use inkwell::IntPredicate;

/// An inclusive i64 range of i32 values.
#[derive(Clone, Copy, Debug)]
pub struct Range<'ctx> {
    pub lo: IntValue<'ctx>,
    pub hi: IntValue<'ctx>,
}

/// Kleene truth: which outcomes are possible.
#[derive(Clone, Copy, Debug)]
pub struct Tri<'ctx> {
    pub can_true: IntValue<'ctx>,
    pub can_false: IntValue<'ctx>,
}

/// The index ranges of one tile (i32 values; converted to i64 here).
#[derive(Clone, Copy, Debug)]
pub struct TileRanges<'ctx> {
    pub b: (IntValue<'ctx>, IntValue<'ctx>),
    pub h: (IntValue<'ctx>, IntValue<'ctx>),
    pub hkv: (IntValue<'ctx>, IntValue<'ctx>),
    pub q: (IntValue<'ctx>, IntValue<'ctx>),
    pub k: (IntValue<'ctx>, IntValue<'ctx>),
    pub seqlen_q: IntValue<'ctx>,
    pub seqlen_k: IntValue<'ctx>,
}

/// The classification of a tile as two flags.
#[derive(Clone, Copy, Debug)]
pub struct TileClassVals<'ctx> {
    /// No element is allowed: skip the tile.
    pub empty: IntValue<'ctx>,
    /// Every element is allowed: no per-element mask.
    pub full: IntValue<'ctx>,
}

enum AVal<'ctx> {
    Int(Range<'ctx>),
    Bool(Tri<'ctx>),
    /// Floats are not analyzed.
    Float,
}

struct Ctx<'a, 'ctx> {
    kb: &'a Kb<'ctx>,
    spec: &'a Spec,
    tile: &'a TileRanges<'ctx>,
    args: &'a VariantArgs<'ctx>,
    /// Rule 4 with aux values: the scanned range of each int aux read (by node address).
    aux_ranges: &'a [(*const Expr, Range<'ctx>)],
}

impl<'ctx> Ctx<'_, 'ctx> {
    fn c(&self, v: i64) -> IntValue<'ctx> {
        self.kb.i64c(v)
    }
    fn top(&self) -> Range<'ctx> {
        Range { lo: self.c(i32::MIN as i64), hi: self.c(i32::MAX as i64) }
    }
    fn unknown(&self) -> Tri<'ctx> {
        Tri { can_true: self.kb.boolc(true), can_false: self.kb.boolc(true) }
    }
    /// The i32 range `(lo, hi)` of `var` in the global frame (i64 bounds).
    fn framed(&self, var: FrameVar, (lo, hi): (IntValue<'ctx>, IntValue<'ctx>)) -> R<Range<'ctx>> {
        let Some(f) = &self.args.frame else {
            return if var == FrameVar::Q || var == FrameVar::K { self.pair((lo, hi)) } else { self.point(lo) };
        };
        let b = self.tile.b.0;
        match (var, f) {
            // A launch frame shifts by a launch value (the same i64 arithmetic as before).
            (FrameVar::Q | FrameVar::K, PositionFrame::Launch { q_offset, k_offset, .. }) => {
                let r = self.pair((lo, hi))?;
                let by = self.kb.sext64(if var == FrameVar::Q { *q_offset } else { *k_offset }, "")?;
                Ok(Range { lo: self.kb.add(r.lo, by, "")?, hi: self.kb.add(r.hi, by, "")? })
            }
            (FrameVar::SeqlenQ | FrameVar::SeqlenK, PositionFrame::Launch { seqlen_q_extra, seqlen_k_extra, .. }) => {
                let r = self.point(lo)?;
                let by =
                    self.kb.sext64(if var == FrameVar::SeqlenQ { *seqlen_q_extra } else { *seqlen_k_extra }, "")?;
                Ok(Range { lo: self.kb.add(r.lo, by, "")?, hi: self.kb.add(r.hi, by, "")? })
            }
            // A sequence's frame: its offset read once, added to both bounds.
            (FrameVar::Q | FrameVar::K, PositionFrame::PerSequence { .. }) => {
                let by = self.kb.sext64(f.global(self.kb, var, b, self.kb.i32c(0))?, "")?;
                let r = self.pair((lo, hi))?;
                Ok(Range { lo: self.kb.add(r.lo, by, "")?, hi: self.kb.add(r.hi, by, "")? })
            }
            (_, PositionFrame::PerSequence { .. }) => self.point(f.global(self.kb, var, b, lo)?),
        }
    }
    fn point(&self, v: IntValue<'ctx>) -> R<Range<'ctx>> {
        let v = self.kb.sext64(v, "")?;
        Ok(Range { lo: v, hi: v })
    }
    fn pair(&self, p: (IntValue<'ctx>, IntValue<'ctx>)) -> R<Range<'ctx>> {
        Ok(Range { lo: self.kb.sext64(p.0, "")?, hi: self.kb.sext64(p.1, "")? })
    }
    fn min(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.kb.smin(a, b, "")
    }
    fn max(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.kb.smax(a, b, "")
    }
    /// TOP when either bound left the i32 range.
    fn norm(&self, r: Range<'ctx>) -> R<Range<'ctx>> {
        let kb = self.kb;
        let lo_bad = kb.icmp(IntPredicate::SLT, r.lo, self.c(i32::MIN as i64), "")?;
        let hi_bad = kb.icmp(IntPredicate::SGT, r.hi, self.c(i32::MAX as i64), "")?;
        let lo_bad2 = kb.icmp(IntPredicate::SGT, r.lo, self.c(i32::MAX as i64), "")?;
        let hi_bad2 = kb.icmp(IntPredicate::SLT, r.hi, self.c(i32::MIN as i64), "")?;
        let bad = kb.or(kb.or(lo_bad, hi_bad, "")?, kb.or(lo_bad2, hi_bad2, "")?, "")?;
        let t = self.top();
        Ok(Range { lo: kb.select_i(bad, t.lo, r.lo, "")?, hi: kb.select_i(bad, t.hi, r.hi, "")? })
    }
    fn corners(&self, vals: [IntValue<'ctx>; 4]) -> R<Range<'ctx>> {
        let lo = self.min(self.min(vals[0], vals[1])?, self.min(vals[2], vals[3])?)?;
        let hi = self.max(self.max(vals[0], vals[1])?, self.max(vals[2], vals[3])?)?;
        self.norm(Range { lo, hi })
    }
    fn select_range(&self, c: IntValue<'ctx>, a: Range<'ctx>, b: Range<'ctx>) -> R<Range<'ctx>> {
        Ok(Range { lo: self.kb.select_i(c, a.lo, b.lo, "")?, hi: self.kb.select_i(c, a.hi, b.hi, "")? })
    }
    /// Floor division of i64 values known to be i32 with a non-zero divisor.
    fn fdiv64(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let kb = self.kb;
        let zero = self.c(0);
        let q = kb.b.build_int_signed_div(a, b, "")?;
        let r = kb.b.build_int_signed_rem(a, b, "")?;
        let adjust = kb.and(
            kb.icmp(IntPredicate::NE, r, zero, "")?,
            kb.icmp(IntPredicate::SLT, kb.xor(r, b, "")?, zero, "")?,
            "",
        )?;
        kb.select_i(adjust, kb.sub(q, self.c(1), "")?, q, "")
    }
    fn frem64(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let q = self.fdiv64(a, b)?;
        self.kb.sub(a, self.kb.mul(q, b, "")?, "")
    }

    fn tri(&self, e: &Expr) -> R<Tri<'ctx>> {
        match self.eval(e)? {
            AVal::Bool(t) => Ok(t),
            _ => Ok(self.unknown()),
        }
    }

    fn eval(&self, e: &Expr) -> R<AVal<'ctx>> {
        let kb = self.kb;
        let t = self.tile;
        Ok(match &e.kind {
            ExprKind::Int(v) => AVal::Int(Range { lo: self.c(*v), hi: self.c(*v) }),
            ExprKind::Float(_) => AVal::Float,
            ExprKind::Bool(v) => AVal::Bool(Tri { can_true: kb.boolc(*v), can_false: kb.boolc(!*v) }),
            ExprKind::Var(v) => AVal::Int(match v {
                Var::B => self.pair(t.b)?,
                Var::H => self.pair(t.h)?,
                Var::Hkv => self.pair(t.hkv)?,
                // Global positions and lengths (the launch's frame), as the expressions see;
                // a tile is one batch entry (`t.b` a point).
                Var::Q => self.framed(FrameVar::Q, t.q)?,
                Var::K => self.framed(FrameVar::K, t.k)?,
                Var::SeqlenQ => self.framed(FrameVar::SeqlenQ, (t.seqlen_q, t.seqlen_q))?,
                Var::SeqlenK => self.framed(FrameVar::SeqlenK, (t.seqlen_k, t.seqlen_k))?,
                Var::QHeads => Range { lo: self.c(self.spec.q_heads as i64), hi: self.c(self.spec.q_heads as i64) },
                Var::KvHeads => Range { lo: self.c(self.spec.kv_heads as i64), hi: self.c(self.spec.kv_heads as i64) },
                Var::Score => return Ok(AVal::Float),
            }),
            ExprKind::Param(name) => {
                let p = self.spec.param_index(name).and_then(|i| self.args.params.get(i).copied());
                match (self.spec.param(name).map(|d| d.ty), p) {
                    (Some(Ty::Int), Some(Val::Int(v))) => AVal::Int(self.point(v)?),
                    (Some(Ty::Int), _) => AVal::Int(self.top()),
                    _ => AVal::Float,
                }
            }
            // Float aux elements are not analyzed (comparisons on them are Unknown); an
            // int one is TOP unless the block classifier scanned its index box.
            ExprKind::Aux { name, .. } => match self.spec.aux_decl(name).map(|d| d.elem) {
                Some(AuxElem::Float) => AVal::Float,
                _ => AVal::Int(
                    self.aux_ranges.iter().find(|(at, _)| std::ptr::eq(*at, e)).map_or_else(|| self.top(), |(_, r)| *r),
                ),
            },
            ExprKind::Unary(UnOp::Neg, a) => match self.eval(a)? {
                AVal::Int(r) => {
                    let z = self.c(0);
                    AVal::Int(self.norm(Range { lo: kb.sub(z, r.hi, "")?, hi: kb.sub(z, r.lo, "")? })?)
                }
                _ => AVal::Float,
            },
            ExprKind::Unary(UnOp::Not, a) => {
                let x = self.tri(a)?;
                AVal::Bool(Tri { can_true: x.can_false, can_false: x.can_true })
            }
            ExprKind::Binary(op, a, b) => self.binary(*op, a, b)?,
            ExprKind::Call(f, args) => self.call(*f, args)?,
        })
    }

    fn binary(&self, op: BinOp, a: &Expr, b: &Expr) -> R<AVal<'ctx>> {
        let kb = self.kb;
        let (va, vb) = (self.eval(a)?, self.eval(b)?);
        Ok(match (va, vb) {
            (AVal::Int(x), AVal::Int(y)) => match op {
                BinOp::Add => AVal::Int(self.norm(Range { lo: kb.add(x.lo, y.lo, "")?, hi: kb.add(x.hi, y.hi, "")? })?),
                BinOp::Sub => AVal::Int(self.norm(Range { lo: kb.sub(x.lo, y.hi, "")?, hi: kb.sub(x.hi, y.lo, "")? })?),
                BinOp::Mul => AVal::Int(self.corners([
                    kb.mul(x.lo, y.lo, "")?,
                    kb.mul(x.lo, y.hi, "")?,
                    kb.mul(x.hi, y.lo, "")?,
                    kb.mul(x.hi, y.hi, "")?,
                ])?),
                BinOp::Div => {
                    // Divisor range containing 0 → TOP; else the corners (one sign).
                    let has_zero = kb.and(
                        kb.icmp(IntPredicate::SLE, y.lo, self.c(0), "")?,
                        kb.icmp(IntPredicate::SGE, y.hi, self.c(0), "")?,
                        "",
                    )?;
                    let one = self.c(1);
                    let ylo = kb.select_i(has_zero, one, y.lo, "")?;
                    let yhi = kb.select_i(has_zero, one, y.hi, "")?;
                    let r = self.corners([
                        self.fdiv64(x.lo, ylo)?,
                        self.fdiv64(x.lo, yhi)?,
                        self.fdiv64(x.hi, ylo)?,
                        self.fdiv64(x.hi, yhi)?,
                    ])?;
                    AVal::Int(self.select_range(has_zero, self.top(), r)?)
                }
                BinOp::Rem => AVal::Int(self.rem(x, y)?),
                BinOp::And | BinOp::Or => AVal::Bool(self.unknown()),
                cmp => AVal::Bool(self.compare(cmp, x, y)?),
            },
            (AVal::Bool(x), AVal::Bool(y)) => match op {
                BinOp::And => AVal::Bool(Tri {
                    can_true: kb.and(x.can_true, y.can_true, "")?,
                    can_false: kb.or(x.can_false, y.can_false, "")?,
                }),
                BinOp::Or => AVal::Bool(Tri {
                    can_true: kb.or(x.can_true, y.can_true, "")?,
                    can_false: kb.and(x.can_false, y.can_false, "")?,
                }),
                BinOp::Eq | BinOp::Ne => {
                    let same = kb.or(kb.and(x.can_true, y.can_true, "")?, kb.and(x.can_false, y.can_false, "")?, "")?;
                    let diff = kb.or(kb.and(x.can_true, y.can_false, "")?, kb.and(x.can_false, y.can_true, "")?, "")?;
                    if op == BinOp::Eq {
                        AVal::Bool(Tri { can_true: same, can_false: diff })
                    } else {
                        AVal::Bool(Tri { can_true: diff, can_false: same })
                    }
                }
                _ => AVal::Bool(self.unknown()),
            },
            (AVal::Float, _) | (_, AVal::Float) => {
                if op.is_comparison() {
                    AVal::Bool(self.unknown())
                } else {
                    AVal::Float
                }
            }
            _ => AVal::Bool(self.unknown()),
        })
    }

    fn rem(&self, x: Range<'ctx>, y: Range<'ctx>) -> R<Range<'ctx>> {
        let kb = self.kb;
        let zero = self.c(0);
        let one = self.c(1);
        let point = kb.icmp(IntPredicate::EQ, y.lo, y.hi, "")?;
        let pos = kb.icmp(IntPredicate::SGT, y.lo, zero, "")?;
        let neg = kb.icmp(IntPredicate::SLT, y.hi, zero, "")?;
        let nonzero = kb.or(pos, neg, "")?;
        // Point divisor c ≠ 0: exact when x stays within one block of c.
        let c = kb.select_i(nonzero, y.lo, one, "")?;
        let same_block = kb.icmp(IntPredicate::EQ, self.fdiv64(x.lo, c)?, self.fdiv64(x.hi, c)?, "")?;
        let exact = Range { lo: self.frem64(x.lo, c)?, hi: self.frem64(x.hi, c)? };
        let pos_general = Range { lo: zero, hi: kb.sub(y.hi, one, "")? };
        let neg_general = Range { lo: kb.add(y.lo, one, "")?, hi: zero };
        let general = self.select_range(pos, pos_general, neg_general)?;
        let point_ok = kb.and(kb.and(point, nonzero, "")?, same_block, "")?;
        let r = self.select_range(point_ok, exact, general)?;
        self.select_range(nonzero, r, self.top())
    }

    fn compare(&self, op: BinOp, x: Range<'ctx>, y: Range<'ctx>) -> R<Tri<'ctx>> {
        let kb = self.kb;
        let lt = |a, b| kb.icmp(IntPredicate::SLT, a, b, "");
        let le = |a, b| kb.icmp(IntPredicate::SLE, a, b, "");
        // `definitely`, `definitely_not` for each comparison.
        let (yes, no) = match op {
            BinOp::Lt => (lt(x.hi, y.lo)?, le(y.hi, x.lo)?),
            BinOp::Le => (le(x.hi, y.lo)?, lt(y.hi, x.lo)?),
            BinOp::Gt => (lt(y.hi, x.lo)?, le(x.hi, y.lo)?),
            BinOp::Ge => (le(y.hi, x.lo)?, lt(x.hi, y.lo)?),
            BinOp::Eq | BinOp::Ne => {
                let eq_point = kb.and(
                    kb.and(kb.icmp(IntPredicate::EQ, x.lo, x.hi, "")?, kb.icmp(IntPredicate::EQ, y.lo, y.hi, "")?, "")?,
                    kb.icmp(IntPredicate::EQ, x.lo, y.lo, "")?,
                    "",
                )?;
                let disjoint = kb.or(lt(x.hi, y.lo)?, lt(y.hi, x.lo)?, "")?;
                if op == BinOp::Eq {
                    (eq_point, disjoint)
                } else {
                    (disjoint, eq_point)
                }
            }
            _ => (kb.boolc(false), kb.boolc(false)),
        };
        Ok(Tri { can_true: kb.not(no, "")?, can_false: kb.not(yes, "")? })
    }

    fn call(&self, f: Func, args: &[Expr]) -> R<AVal<'ctx>> {
        let kb = self.kb;
        Ok(match f {
            Func::Min | Func::Max => match (self.eval(&args[0])?, self.eval(&args[1])?) {
                (AVal::Int(x), AVal::Int(y)) => {
                    if f == Func::Min {
                        AVal::Int(Range { lo: self.min(x.lo, y.lo)?, hi: self.min(x.hi, y.hi)? })
                    } else {
                        AVal::Int(Range { lo: self.max(x.lo, y.lo)?, hi: self.max(x.hi, y.hi)? })
                    }
                }
                _ => AVal::Float,
            },
            Func::Abs => match self.eval(&args[0])? {
                AVal::Int(x) => {
                    let zero = self.c(0);
                    let nonneg = kb.icmp(IntPredicate::SGE, x.lo, zero, "")?;
                    let nonpos = kb.icmp(IntPredicate::SLE, x.hi, zero, "")?;
                    let negated = Range { lo: kb.sub(zero, x.hi, "")?, hi: kb.sub(zero, x.lo, "")? };
                    let mixed = Range { lo: zero, hi: self.max(kb.sub(zero, x.lo, "")?, x.hi)? };
                    let r = self.select_range(nonpos, negated, mixed)?;
                    let r = self.select_range(nonneg, x, r)?;
                    AVal::Int(self.norm(r)?)
                }
                _ => AVal::Float,
            },
            Func::Select => {
                let c = self.tri(&args[0])?;
                let only_true = kb.not(c.can_false, "")?;
                let only_false = kb.not(c.can_true, "")?;
                match (self.eval(&args[1])?, self.eval(&args[2])?) {
                    (AVal::Int(a), AVal::Int(b)) => {
                        let hull = Range { lo: self.min(a.lo, b.lo)?, hi: self.max(a.hi, b.hi)? };
                        let r = self.select_range(only_true, a, hull)?;
                        AVal::Int(self.select_range(only_false, b, r)?)
                    }
                    (AVal::Bool(a), AVal::Bool(b)) => AVal::Bool(Tri {
                        can_true: kb.or(
                            kb.and(c.can_true, a.can_true, "")?,
                            kb.and(c.can_false, b.can_true, "")?,
                            "",
                        )?,
                        can_false: kb.or(
                            kb.and(c.can_true, a.can_false, "")?,
                            kb.and(c.can_false, b.can_false, "")?,
                            "",
                        )?,
                    }),
                    (AVal::Float, _) | (_, AVal::Float) => AVal::Float,
                    _ => AVal::Bool(self.unknown()),
                }
            }
            Func::ToInt => AVal::Int(self.top()),
            _ => AVal::Float,
        })
    }
}

/// Emits the classification of one tile for the spec's mask. Without a mask every tile
/// is full.
pub fn classify_tile<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    tile: &TileRanges<'ctx>,
    args: &VariantArgs<'ctx>,
) -> R<TileClassVals<'ctx>> {
    let Some(pred) = spec.mask.to_predicate() else {
        return Ok(TileClassVals { empty: kb.boolc(false), full: kb.boolc(true) });
    };
    let cx = Ctx { kb, spec, tile, args, aux_ranges: &[] };
    let t = cx.tri(&pred)?;
    Ok(TileClassVals { empty: kb.not(t.can_true, "tile.empty")?, full: kb.not(t.can_false, "tile.full")? })
}

/// [`classify_tile`] with the analysis' rule 4 in its block-classification form: each int
/// aux read whose indices are int ranges over the tile gets the tensor's `[min, max]` over
/// that index box (clamped into the dims, as reads clamp), scanned here when the box has
/// at most `attnc_ir::analysis::AUX_SCAN_LIMIT` elements, TOP otherwise. Reads nested in
/// another read's index stay TOP. Sound like the analysis; exact answers for the
/// undecided tiles come from evaluating their elements (the block classifier).
///
/// With `lanes`, an aligned group of that many lanes (a power of two ≤ 32, the same tile
/// in each) shares each scan: lane `sub` of the group reads elements `sub, sub + L, ...`
/// of the innermost index and the group combines its minima and maxima by shuffles, so a
/// tile's aux range costs `1/L` of the serial reads. Every lane of the warp must reach
/// this call (the shuffles), lanes of a group with the same tile.
pub fn classify_tile_scanning_aux<'ctx>(
    kb: &mut Kb<'ctx>,
    spec: &Spec,
    tile: &TileRanges<'ctx>,
    args: &VariantArgs<'ctx>,
    lanes: Option<LaneGroup<'ctx>>,
    known: Option<&KnownAuxRanges<'ctx>>,
) -> R<TileClassVals<'ctx>> {
    let Some(pred) = spec.mask.to_predicate() else {
        return Ok(TileClassVals { empty: kb.boolc(false), full: kb.boolc(true) });
    };
    let mut reads = Vec::new();
    collect_int_aux_reads(spec, &pred, &mut reads);
    let mut ranges = Vec::new();
    for (j, read) in reads.into_iter().enumerate() {
        let range = match known.and_then(|k| k.0.get(j).copied().flatten()) {
            Some(r) => Some(r),
            None => scan_read(kb, spec, tile, args, read, lanes)?,
        };
        if let Some(r) = range {
            ranges.push((read as *const Expr, r));
        }
    }
    let cx = Ctx { kb, spec, tile, args, aux_ranges: &ranges };
    let t = cx.tri(&pred)?;
    Ok(TileClassVals { empty: kb.not(t.can_true, "tile.empty")?, full: kb.not(t.can_false, "tile.full")? })
}

/// An aligned group of `size` lanes (a power of two ≤ 32) sharing one scan; this lane is
/// `sub` (`0..size`) of it. Both values are the same in every lane of a warp for `size`.
#[derive(Clone, Copy)]
pub struct LaneGroup<'ctx> {
    pub sub: IntValue<'ctx>,
    pub size: IntValue<'ctx>,
}

/// The `[min, max]` of one int aux read over the tile's index box (clamped into the dims),
/// or `None` for a read the rule does not cover (an index that reads aux, an index
/// without an int range).
fn scan_read<'ctx>(
    kb: &mut Kb<'ctx>,
    spec: &Spec,
    tile: &TileRanges<'ctx>,
    args: &VariantArgs<'ctx>,
    read: &Expr,
    lanes: Option<LaneGroup<'ctx>>,
) -> R<Option<Range<'ctx>>> {
    let ExprKind::Aux { name, index } = &read.kind else { return Ok(None) };
    let (Some(i), true) = (spec.aux_index(name), !index.iter().any(|e| e.uses_aux())) else { return Ok(None) };
    let Some(aux) = args.aux.get(i) else { return Ok(None) };
    // The index box, from the tile's ranges (read-only pass), clamped into the dims.
    let mut bx = Vec::new();
    {
        let cx = Ctx { kb, spec, tile, args, aux_ranges: &[] };
        for (ie, dim) in index.iter().zip(&aux.dims) {
            let AVal::Int(r) = cx.eval(ie)? else { break };
            let top = kb.sub(kb.sext64(*dim, "")?, cx.c(1), "")?;
            let lo = cx.min(cx.max(r.lo, cx.c(0))?, top)?;
            let hi = cx.min(cx.max(r.hi, cx.c(0))?, top)?;
            bx.push((lo, hi, *dim));
        }
    }
    if bx.len() != index.len() {
        return Ok(None);
    }
    Ok(Some(scan_box(kb, aux.addr, &bx, name, lanes)?))
}

/// Int aux reads' ranges known before a tile is classified, by each read's place in the
/// mask (the order [`classify_tile_scanning_aux`] visits them): a read whose index does
/// not involve the key has the same box for every key tile and key column of a row tile,
/// so a classifier scans it once per row tile ([`key_invariant_aux_ranges`]).
pub struct KnownAuxRanges<'ctx>(Vec<Option<Range<'ctx>>>);

/// The ranges of the mask's key-invariant int aux reads over `tile`'s rows (its key
/// range is not read), `lanes` sharing each scan as in [`classify_tile_scanning_aux`].
pub fn key_invariant_aux_ranges<'ctx>(
    kb: &mut Kb<'ctx>,
    spec: &Spec,
    tile: &TileRanges<'ctx>,
    args: &VariantArgs<'ctx>,
    lanes: Option<LaneGroup<'ctx>>,
) -> R<KnownAuxRanges<'ctx>> {
    let Some(pred) = spec.mask.to_predicate() else { return Ok(KnownAuxRanges(Vec::new())) };
    let mut reads = Vec::new();
    collect_int_aux_reads(spec, &pred, &mut reads);
    let mut known = Vec::with_capacity(reads.len());
    for read in reads {
        let ExprKind::Aux { index, .. } = &read.kind else {
            known.push(None);
            continue;
        };
        let key_invariant = !index.iter().any(|e| e.uses_var(Var::K));
        known.push(if key_invariant { scan_read(kb, spec, tile, args, read, lanes)? } else { None });
    }
    Ok(KnownAuxRanges(known))
}

/// The loop nest of [`scan_box`]: one loop per index, the flat offset built as the loops
/// descend (no divisions), the innermost loop 16 loads at a time (latency-bound; the
/// last group repeats the last index, which leaves a min/max unchanged), a lane group's
/// lanes interleaved along it.
struct BoxScan<'b, 'ctx> {
    addr: IntValue<'ctx>,
    lanes: Option<LaneGroup<'ctx>>,
    /// `(lo, hi, dim)` per index: i64 bounds inside `[0, dim)`.
    bx: &'b [(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)],
    lo_slot: crate::llvm::kb::Slot<'ctx>,
    hi_slot: crate::llvm::kb::Slot<'ctx>,
    name: &'b str,
}

impl<'ctx> BoxScan<'_, 'ctx> {
    fn dims(&self, kb: &mut Kb<'ctx>, d: usize, flat: IntValue<'ctx>) -> R<()> {
        let (lo, hi, dim) = self.bx[d];
        let (lo, hi) = (kb.trunc32(lo, "")?, kb.trunc32(hi, "")?);
        let base = kb.mul(flat, kb.sext64(dim, "")?, "")?;
        if d + 1 < self.bx.len() {
            let end = kb.add(hi, kb.i32c(1), "")?;
            return kb.for_range(lo, end, &format!("{}.dim{d}", self.name), |kb, i| {
                let flat = kb.add(base, kb.zext64(i, "")?, "")?;
                self.dims(kb, d + 1, flat)
            });
        }
        const UNROLL: i64 = 16;
        let n = kb.add(kb.sub(hi, lo, "")?, kb.i32c(1), "")?;
        // This lane's elements: lo + sub + L·j (j < ceil(n / L)).
        let (sub, step) = match self.lanes {
            Some(g) => (g.sub, g.size),
            None => (kb.i32c(0), kb.i32c(1)),
        };
        let per_lane = kb.ceil_div(n, step, "")?;
        let groups = kb.ceil_div(per_lane, kb.i32c(UNROLL), "")?;
        kb.for_range(kb.i32c(0), groups, &format!("{}.dim{d}", self.name), |kb, g| {
            let first = kb.add(lo, kb.add(sub, kb.mul(kb.mul(g, kb.i32c(UNROLL), "")?, step, "")?, "")?, "")?;
            let mut vals = Vec::with_capacity(UNROLL as usize);
            for j in 0..UNROLL {
                let i = kb.smin(kb.add(first, kb.mul(kb.i32c(j), step, "")?, "")?, hi, "")?;
                let flat = kb.add(base, kb.zext64(i, "")?, "")?;
                vals.push(kb.ld_global_i32(kb.add(self.addr, kb.mul(flat, kb.i64c(4), "")?, "")?, "aux_value")?);
            }
            let mut lo_v = kb.get_i(self.lo_slot, "")?;
            let mut hi_v = kb.get_i(self.hi_slot, "")?;
            for v in vals {
                lo_v = kb.smin(lo_v, v, "")?;
                hi_v = kb.smax(hi_v, v, "")?;
            }
            kb.set(self.lo_slot, lo_v)?;
            kb.set(self.hi_slot, hi_v)
        })
    }
}

fn collect_int_aux_reads<'e>(spec: &Spec, e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match &e.kind {
        ExprKind::Aux { name, index } => {
            if spec.aux_decl(name).is_some_and(|d| d.elem == AuxElem::Int) {
                out.push(e);
            }
            index.iter().for_each(|i| collect_int_aux_reads(spec, i, out));
        }
        ExprKind::Unary(_, a) => collect_int_aux_reads(spec, a, out),
        ExprKind::Binary(_, a, b) => {
            collect_int_aux_reads(spec, a, out);
            collect_int_aux_reads(spec, b, out);
        }
        ExprKind::Call(_, args) => args.iter().for_each(|a| collect_int_aux_reads(spec, a, out)),
        _ => {}
    }
}

/// `[min, max]` of an i32 tensor over an index box (`(lo, hi, dim)` per index, i64
/// bounds already inside `[0, dim)`), TOP when the box is larger than the scan limit.
fn scan_box<'ctx>(
    kb: &mut Kb<'ctx>,
    addr: IntValue<'ctx>,
    bx: &[(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)],
    name: &str,
    lanes: Option<LaneGroup<'ctx>>,
) -> R<Range<'ctx>> {
    kb.section(&format!("block classification: min/max of {name} over the tile's index box"))?;
    let mut size = kb.i64c(1);
    let mut too_big = kb.boolc(false);
    let limit = kb.i64c(attnc_ir::analysis::AUX_SCAN_LIMIT);
    for &(lo, hi, _) in bx {
        let ext = kb.add(kb.sub(hi, lo, "")?, kb.i64c(1), "")?;
        // Checked before multiplying: every factor is at most the limit, so no overflow.
        too_big = kb.or(too_big, kb.icmp(IntPredicate::SGT, ext, limit, "")?, "")?;
        let ext = kb.select_i(too_big, kb.i64c(1), ext, "")?;
        size = kb.mul(size, ext, "")?;
        too_big = kb.or(too_big, kb.icmp(IntPredicate::SGT, size, limit, "")?, "")?;
    }
    let lo_slot = kb.slot_i32(&format!("{name}.min"), kb.i32c(i32::MAX as i64))?;
    let hi_slot = kb.slot_i32(&format!("{name}.max"), kb.i32c(i32::MIN as i64))?;
    let fits = kb.not(too_big, "")?;
    let bx = bx.to_vec();
    let scan = BoxScan { addr, lanes, bx: &bx, lo_slot, hi_slot, name };
    kb.if_then(fits, &format!("{name}.scan"), |kb| scan.dims(kb, 0, kb.i64c(0)))?;
    let (mut lo, mut hi) = (kb.get_i(lo_slot, "")?, kb.get_i(hi_slot, "")?);
    if let Some(g) = lanes {
        // The group's minimum and maximum: butterfly steps below the group size (the
        // partner lane is in the same aligned group).
        for m in [1u32, 2, 4, 8, 16] {
            let inside = kb.icmp(IntPredicate::ULT, kb.i32c(m as i64), g.size, "")?;
            let (lo_p, hi_p) = (kb.shfl_xor_i32(lo, m, "")?, kb.shfl_xor_i32(hi, m, "")?);
            lo = kb.select_i(inside, kb.smin(lo, lo_p, "")?, lo, &format!("{name}.group_min"))?;
            hi = kb.select_i(inside, kb.smax(hi, hi_p, "")?, hi, &format!("{name}.group_max"))?;
        }
    }
    let lo = kb.sext64(lo, "")?;
    let hi = kb.sext64(hi, "")?;
    let top = Range { lo: kb.i64c(i32::MIN as i64), hi: kb.i64c(i32::MAX as i64) };
    Ok(Range { lo: kb.select_i(too_big, top.lo, lo, "")?, hi: kb.select_i(too_big, top.hi, hi, "")? })
}
