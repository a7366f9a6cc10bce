//! Tile mask analysis: for a (q tile, k tile) decide whether the mask allows every
//! element ([`TileClass::Full`]), none ([`TileClass::Empty`]) or some ([`TileClass::Partial`]),
//! by interval arithmetic over the mask predicate ([`Mask::to_predicate`]).
//!
//! The analysis is *sound*: `Full` means every element of the tile is allowed and `Empty`
//! means none is, under the concrete semantics of [`crate::eval`] (32-bit wrapping ints,
//! floor division, `x / 0 = 0`, clamped aux reads). `Partial` is always a correct answer.
//! It is also *inclusion-monotone*: shrinking any range of a query can only turn
//! `Partial` into `Full`/`Empty`, never flip a definite answer.
//!
//! The GPU code generator mirrors these rules one by one, so they are deliberately simple.
//! An int range `[lo, hi]` is inclusive; every value is an i32. `TOP` is
//! `[i32::MIN, i32::MAX]` (nothing known). A bool is a [`Tri`] (Kleene logic). Float
//! expressions are not analyzed.
//!
//! **Int expressions** (`int_range`):
//! 1. literal `c`: `[c, c]` (`c` taken as i32, as `eval` does);
//! 2. variables `b, h, hkv, q, k, seqlen_q, seqlen_k`: the query's ranges;
//!    `q_heads`, `kv_heads`: the query's points;
//! 3. int param: its range in `TileQuery::params` (a point when known at launch), else TOP;
//! 4. element `t[i0, i1, ...]` of an int aux tensor: TOP, unless the caller supplies the
//!    tensor's values ([`AuxValues`], block classification at launch): then each index's
//!    range is clamped into its dimension (as `eval` clamps) and the result is the
//!    tensor's `[min, max]` over that index box (TOP when an index is not an int or the
//!    box is larger than the oracle scans); `int(float)`: TOP; an element of a float aux
//!    tensor is a float (not analyzed, so comparisons on it are Unknown, rule 11);
//! 5. `a + b`, `a - b`, `-a`, `a * b` (min/max of the 4 corner products): computed exactly
//!    in i64; if the result leaves i32 range → TOP (ints wrap);
//! 6. `a / b` (floor): divisor range contains 0 → TOP; otherwise min/max of the 4 corner
//!    floor divisions (sound because the divisor has one sign), computed in i64, TOP if
//!    that leaves i32 range (only `i32::MIN / -1` can);
//! 7. `a % b` (floor): divisor a point `c > 0`: if `floor_div(lo, c) == floor_div(hi, c)`
//!    then `[floor_rem(lo, c), floor_rem(hi, c)]` else `[0, c - 1]`; a point `c < 0`: the
//!    same test, else `[c + 1, 0]`; divisor range strictly positive `[y0, y1]`:
//!    `[0, y1 - 1]`; strictly negative: `[y0 + 1, 0]`; otherwise (contains 0) TOP;
//! 8. `min`, `max`: componentwise; `abs`: `lo ≥ 0` → same; `hi ≤ 0` → `[-hi, -lo]` (TOP if
//!    `lo == i32::MIN`); else `[0, max(-lo, hi)]` (TOP if `lo == i32::MIN`);
//! 9. `select(c, a, b)`: `c` True → range of `a`, False → range of `b`, Unknown → hull.
//!
//! **Bool expressions** (`truth`):
//! 10. int comparisons: `a < b`: True if `a.hi < b.lo`, False if `a.lo >= b.hi`;
//!     `a <= b`: True if `a.hi <= b.lo`, False if `a.lo > b.hi`; `>` and `>=` mirrored;
//!     `a == b`: True only if both are the same point, False if disjoint; `!=` is `!(==)`;
//!     otherwise Unknown;
//! 11. float comparisons: Unknown; literals `true`/`false`: True/False;
//! 12. `&&`, `||`, `!`, bool `==`/`!=`: Kleene logic (`&&` False if either is False, True if
//!     both are True; `||` dually; `==`/`!=` Unknown if either side is Unknown);
//! 13. `select` on bools: as for ints, the hull of two Tri values being the value if they
//!     agree and Unknown otherwise.
//!
//! **Tiles** ([`classify`]): no mask → Full; a tile with an empty b/h/hkv/q/k range → Empty
//! (it has no element); otherwise the predicate's Tri: True → Full, False → Empty,
//! Unknown → Partial.
//!
//! Ill-typed expressions (which [`crate::check`] rejects) never make the analysis panic:
//! any node whose operands are not of the types above is "nothing known" (TOP / Unknown),
//! which keeps the answer sound even for what `eval` does with them.
//! Query ranges are first clamped into i32; a reversed range (`lo > hi`) used in an
//! expression is taken as `[hi, lo]`.

use crate::eval::AuxTensor;
use crate::eval::{floor_div, floor_rem};
use crate::expr::{BinOp, Expr, ExprKind, Func, Ty, UnOp, Var};
use crate::spec::{AuxElem, Mask, Spec};

/// How much of a tile the mask allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileClass {
    /// No element is allowed: the tile can be skipped (not even loaded).
    Empty,
    /// Some may be allowed, some not: per-element masking is needed.
    Partial,
    /// Every element is allowed: no per-element masking.
    Full,
}

/// An inclusive range of i32 values, held in i64 so that bounds arithmetic is exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IntRange {
    pub lo: i64,
    pub hi: i64,
}

const MIN: i64 = i32::MIN as i64;
const MAX: i64 = i32::MAX as i64;

impl IntRange {
    /// Every i32 (nothing known).
    pub const TOP: IntRange = IntRange { lo: MIN, hi: MAX };

    pub const fn new(lo: i64, hi: i64) -> IntRange {
        IntRange { lo, hi }
    }
    pub const fn point(v: i64) -> IntRange {
        IntRange { lo: v, hi: v }
    }
    /// `[start, start + len - 1]`, e.g. the rows of a tile; empty when `len == 0`.
    pub const fn span(start: i64, len: i64) -> IntRange {
        IntRange { lo: start, hi: start + len - 1 }
    }
    pub const fn is_empty(&self) -> bool {
        self.lo > self.hi
    }
    pub const fn is_point(&self) -> bool {
        self.lo == self.hi
    }
    pub const fn contains(&self, v: i64) -> bool {
        self.lo <= v && v <= self.hi
    }
    /// The smallest range containing both.
    pub fn hull(self, other: IntRange) -> IntRange {
        IntRange { lo: self.lo.min(other.lo), hi: self.hi.max(other.hi) }
    }
    /// The range exactly, or TOP when it leaves i32 (the values would wrap).
    fn fit(lo: i64, hi: i64) -> IntRange {
        if lo < MIN || hi > MAX {
            IntRange::TOP
        } else {
            IntRange { lo, hi }
        }
    }
    /// Clamped into i32 and ordered (a reversed range is taken as its swap).
    fn sanitize(self) -> IntRange {
        let lo = self.lo.clamp(MIN, MAX);
        let hi = self.hi.clamp(MIN, MAX);
        IntRange { lo: lo.min(hi), hi: lo.max(hi) }
    }
}

/// A three-valued truth (Kleene logic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tri {
    True,
    False,
    Unknown,
}

impl Tri {
    pub fn from_bool(b: bool) -> Tri {
        if b {
            Tri::True
        } else {
            Tri::False
        }
    }
    pub fn and(self, o: Tri) -> Tri {
        match (self, o) {
            (Tri::False, _) | (_, Tri::False) => Tri::False,
            (Tri::True, Tri::True) => Tri::True,
            _ => Tri::Unknown,
        }
    }
    pub fn or(self, o: Tri) -> Tri {
        match (self, o) {
            (Tri::True, _) | (_, Tri::True) => Tri::True,
            (Tri::False, Tri::False) => Tri::False,
            _ => Tri::Unknown,
        }
    }
    /// Kleene equality of two bools.
    pub fn equals(self, o: Tri) -> Tri {
        match (self, o) {
            (Tri::Unknown, _) | (_, Tri::Unknown) => Tri::Unknown,
            (a, b) => Tri::from_bool(a == b),
        }
    }
    /// The value if both agree, else Unknown (the hull of `select`'s branches).
    pub fn join(self, o: Tri) -> Tri {
        if self == o {
            self
        } else {
            Tri::Unknown
        }
    }
    pub fn to_class(self) -> TileClass {
        match self {
            Tri::True => TileClass::Full,
            Tri::False => TileClass::Empty,
            Tri::Unknown => TileClass::Partial,
        }
    }
}

impl std::ops::Not for Tri {
    type Output = Tri;
    fn not(self) -> Tri {
        match self {
            Tri::True => Tri::False,
            Tri::False => Tri::True,
            Tri::Unknown => Tri::Unknown,
        }
    }
}

/// What is known about the variables over one tile (or any set of elements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileQuery {
    pub b: IntRange,
    pub h: IntRange,
    pub hkv: IntRange,
    pub q: IntRange,
    pub k: IntRange,
    pub seqlen_q: IntRange,
    pub seqlen_k: IntRange,
    pub q_heads: i32,
    pub kv_heads: i32,
    /// Per declared param (declaration order): `Some(range)` for an int param (a point
    /// when known at launch), `None` when unknown or for float params.
    pub params: Vec<Option<IntRange>>,
}

impl TileQuery {
    /// Nothing known but what always holds: b, q, k, seqlens in `[0, i32::MAX]`,
    /// h in `[0, q_heads - 1]`, hkv in `[0, kv_heads - 1]`, params unknown.
    pub fn unbounded(spec: &Spec) -> TileQuery {
        let qh = i32::try_from(spec.q_heads).unwrap_or(i32::MAX);
        let kvh = i32::try_from(spec.kv_heads).unwrap_or(i32::MAX);
        let nonneg = IntRange::new(0, MAX);
        TileQuery {
            b: nonneg,
            h: IntRange::new(0, (qh as i64 - 1).max(0)),
            hkv: IntRange::new(0, (kvh as i64 - 1).max(0)),
            q: nonneg,
            k: nonneg,
            seqlen_q: nonneg,
            seqlen_k: nonneg,
            q_heads: qh,
            kv_heads: kvh,
            params: vec![None; spec.params.len()],
        }
    }

    /// One tile of one (batch entry, q head) with known seqlens: `q` and `k` are the
    /// tile's position ranges; hkv is derived from `h`; params unknown (set `params`).
    pub fn tile(spec: &Spec, b: i64, h: i64, q: IntRange, k: IntRange, seqlen_q: i64, seqlen_k: i64) -> TileQuery {
        let mut t = TileQuery::unbounded(spec);
        let g = spec.group_size().max(1) as i64;
        t.b = IntRange::point(b);
        t.h = IntRange::point(h);
        t.hkv = IntRange::point(h.div_euclid(g));
        t.q = q;
        t.k = k;
        t.seqlen_q = IntRange::point(seqlen_q);
        t.seqlen_k = IntRange::point(seqlen_k);
        t
    }
}

/// The abstract value of a node, following `eval`'s dynamic types.
#[derive(Clone, Copy, Debug, PartialEq)]
enum AVal {
    Int(IntRange),
    Bool(Tri),
    Float,
    /// Any value of any type (ill-typed input).
    Any,
}

impl AVal {
    fn join(self, o: AVal) -> AVal {
        match (self, o) {
            (AVal::Int(a), AVal::Int(b)) => AVal::Int(a.hull(b)),
            (AVal::Bool(a), AVal::Bool(b)) => AVal::Bool(a.join(b)),
            (AVal::Float, AVal::Float) => AVal::Float,
            _ => AVal::Any,
        }
    }
}

/// Floor division in i64 (the divisor is never 0 here; 0 gives 0 like `eval`).
fn fdiv(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if a.wrapping_rem(b) != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// Interval of `a + b`, `a - b`, `a * b`, `a / b`, `a % b` (rules 5–7); other ops give TOP.
/// Operands are clamped into i32 and ordered first.
pub fn arith(op: BinOp, a: IntRange, b: IntRange) -> IntRange {
    let (a, b) = (a.sanitize(), b.sanitize());
    match op {
        BinOp::Add => IntRange::fit(a.lo + b.lo, a.hi + b.hi),
        BinOp::Sub => IntRange::fit(a.lo - b.hi, a.hi - b.lo),
        BinOp::Mul => {
            let c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi];
            IntRange::fit(min4(c), max4(c))
        }
        BinOp::Div => {
            if b.contains(0) {
                IntRange::TOP
            } else {
                let c = [fdiv(a.lo, b.lo), fdiv(a.lo, b.hi), fdiv(a.hi, b.lo), fdiv(a.hi, b.hi)];
                IntRange::fit(min4(c), max4(c))
            }
        }
        BinOp::Rem => rem_range(a, b),
        _ => IntRange::TOP,
    }
}

fn rem_range(a: IntRange, b: IntRange) -> IntRange {
    if b.is_point() && b.lo != 0 {
        let c = b.lo as i32;
        let (lo, hi) = (a.lo as i32, a.hi as i32);
        if floor_div(lo, c) == floor_div(hi, c) {
            return IntRange::new(floor_rem(lo, c) as i64, floor_rem(hi, c) as i64);
        }
        return if c > 0 { IntRange::new(0, c as i64 - 1) } else { IntRange::new(c as i64 + 1, 0) };
    }
    if b.lo > 0 {
        IntRange::new(0, b.hi - 1)
    } else if b.hi < 0 {
        IntRange::new(b.lo + 1, 0)
    } else {
        IntRange::TOP
    }
}

fn min4(c: [i64; 4]) -> i64 {
    c[0].min(c[1]).min(c[2]).min(c[3])
}
fn max4(c: [i64; 4]) -> i64 {
    c[0].max(c[1]).max(c[2]).max(c[3])
}

/// Interval of `-a` (rule 5).
pub fn neg(a: IntRange) -> IntRange {
    let a = a.sanitize();
    IntRange::fit(-a.hi, -a.lo)
}

/// Interval of `abs(a)` (rule 8; `abs(i32::MIN)` wraps to `i32::MIN`).
pub fn abs(a: IntRange) -> IntRange {
    let a = a.sanitize();
    if a.lo >= 0 {
        a
    } else if a.lo == MIN {
        IntRange::TOP
    } else if a.hi <= 0 {
        IntRange::new(-a.hi, -a.lo)
    } else {
        IntRange::new(0, (-a.lo).max(a.hi))
    }
}

/// Tri of an int comparison (rule 10).
pub fn compare(op: BinOp, a: IntRange, b: IntRange) -> Tri {
    let (a, b) = (a.sanitize(), b.sanitize());
    let decide = |t: bool, f: bool| {
        if t {
            Tri::True
        } else if f {
            Tri::False
        } else {
            Tri::Unknown
        }
    };
    let eq = || decide(a.is_point() && b.is_point() && a.lo == b.lo, a.hi < b.lo || b.hi < a.lo);
    match op {
        BinOp::Lt => decide(a.hi < b.lo, a.lo >= b.hi),
        BinOp::Le => decide(a.hi <= b.lo, a.lo > b.hi),
        BinOp::Gt => decide(a.lo > b.hi, a.hi <= b.lo),
        BinOp::Ge => decide(a.lo >= b.hi, a.hi < b.lo),
        BinOp::Eq => eq(),
        BinOp::Ne => !eq(),
        _ => Tri::Unknown,
    }
}

/// The values of the launch's aux tensors, for rule 4: the `[min, max]` of aux tensor
/// `aux` (declaration order) over an index box already clamped into its dimensions, or
/// `None` when not known (e.g. the box is larger than the implementation scans).
pub trait AuxValues {
    /// The resolved dimensions of aux tensor `aux`.
    fn dims(&self, aux: usize) -> Option<&[usize]>;
    fn range(&self, aux: usize, index_box: &[IntRange]) -> Option<IntRange>;
}

/// The largest index box [`AuxTensor`]'s [`AuxValues`] scans (the GPU classifier's limit).
pub const AUX_SCAN_LIMIT: i64 = 4096;

/// Host aux tensors (declaration order) as [`AuxValues`]: a scan of the box.
#[derive(Clone, Copy, Debug)]
pub struct HostAux<'a>(pub &'a [AuxTensor]);

impl AuxValues for HostAux<'_> {
    fn dims(&self, aux: usize) -> Option<&[usize]> {
        self.0.get(aux).map(|t| t.dims.as_slice())
    }
    fn range(&self, aux: usize, index_box: &[IntRange]) -> Option<IntRange> {
        let t = self.0.get(aux)?;
        let ints = t.data.ints()?;
        if index_box.len() != t.dims.len() || index_box.iter().any(IntRange::is_empty) {
            return None;
        }
        let size = index_box.iter().try_fold(1i64, |acc, r| acc.checked_mul(r.hi - r.lo + 1))?;
        if size > AUX_SCAN_LIMIT {
            return None;
        }
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        let mut idx: Vec<i32> = index_box.iter().map(|r| r.lo as i32).collect();
        for _ in 0..size {
            let v = t.flat_index(&idx).and_then(|f| ints.get(f).copied()).unwrap_or(0) as i64;
            lo = lo.min(v);
            hi = hi.max(v);
            // Odometer over the box, last index fastest.
            for d in (0..idx.len()).rev() {
                if (idx[d] as i64) < index_box[d].hi {
                    idx[d] += 1;
                    break;
                }
                idx[d] = index_box[d].lo as i32;
            }
        }
        Some(IntRange::new(lo, hi))
    }
}

struct Analyzer<'a> {
    spec: &'a Spec,
    query: &'a TileQuery,
    aux: Option<&'a dyn AuxValues>,
}

impl Analyzer<'_> {
    /// Rule 4 with aux values: the index box, clamped into the dims, through the oracle.
    fn aux_range(&self, name: &str, index: &[Expr]) -> Option<IntRange> {
        let values = self.aux?;
        let i = self.spec.aux_index(name)?;
        let dims = values.dims(i)?;
        if dims.len() != index.len() || dims.contains(&0) {
            return None;
        }
        let mut bx = Vec::with_capacity(index.len());
        for (e, &n) in index.iter().zip(dims) {
            let AVal::Int(r) = self.value(e) else { return None };
            let top = (n as i64 - 1).min(MAX);
            bx.push(IntRange::new(r.lo.clamp(0, top), r.hi.clamp(0, top)));
        }
        values.range(i, &bx)
    }

    fn var(&self, v: Var) -> AVal {
        let q = self.query;
        let r = match v {
            Var::B => q.b,
            Var::H => q.h,
            Var::Hkv => q.hkv,
            Var::Q => q.q,
            Var::K => q.k,
            Var::SeqlenQ => q.seqlen_q,
            Var::SeqlenK => q.seqlen_k,
            Var::QHeads => IntRange::point(q.q_heads as i64),
            Var::KvHeads => IntRange::point(q.kv_heads as i64),
            Var::Score => return AVal::Float,
        };
        AVal::Int(r.sanitize())
    }

    fn value(&self, e: &Expr) -> AVal {
        match &e.kind {
            ExprKind::Int(c) => AVal::Int(IntRange::point(*c as i32 as i64)),
            ExprKind::Float(_) => AVal::Float,
            ExprKind::Bool(b) => AVal::Bool(Tri::from_bool(*b)),
            ExprKind::Var(v) => self.var(*v),
            ExprKind::Param(name) => match self.spec.param_index(name) {
                Some(i) => match self.spec.params[i].ty {
                    Ty::Int => AVal::Int(
                        self.query.params.get(i).copied().flatten().map(IntRange::sanitize).unwrap_or(IntRange::TOP),
                    ),
                    Ty::Float => AVal::Float,
                    Ty::Bool => AVal::Any,
                },
                None => AVal::Any,
            },
            ExprKind::Aux { name, index } => match self.spec.aux_decl(name).map(|d| d.elem) {
                Some(AuxElem::Float) => AVal::Float,
                _ => AVal::Int(self.aux_range(name, index).unwrap_or(IntRange::TOP)),
            },
            ExprKind::Unary(op, a) => match (op, self.value(a)) {
                (UnOp::Neg, AVal::Int(r)) => AVal::Int(neg(r)),
                (UnOp::Neg, AVal::Float) => AVal::Float,
                (UnOp::Neg, _) => AVal::Any,
                (UnOp::Not, AVal::Bool(t)) => AVal::Bool(!t),
                (UnOp::Not, _) => AVal::Bool(Tri::Unknown),
            },
            ExprKind::Binary(op, ea, eb) => {
                let (a, b) = (self.value(ea), self.value(eb));
                match op {
                    BinOp::And | BinOp::Or => match (a, b) {
                        (AVal::Bool(x), AVal::Bool(y)) => {
                            AVal::Bool(if *op == BinOp::And { x.and(y) } else { x.or(y) })
                        }
                        _ => AVal::Bool(Tri::Unknown),
                    },
                    _ if op.is_comparison() => match (a, b) {
                        // An integer compared with itself (after simplification: `p - 0`
                        // is `p`) is decided whatever its range, which intervals alone
                        // lose. Floats are left out (NaN is not equal to itself).
                        (AVal::Int(x), AVal::Int(y)) => AVal::Bool(match compare(*op, x, y) {
                            Tri::Unknown if crate::deriv::simplify(ea).same_as(&crate::deriv::simplify(eb)) => {
                                Tri::from_bool(matches!(op, BinOp::Le | BinOp::Ge | BinOp::Eq))
                            }
                            t => t,
                        }),
                        (AVal::Bool(x), AVal::Bool(y)) if *op == BinOp::Eq => AVal::Bool(x.equals(y)),
                        (AVal::Bool(x), AVal::Bool(y)) if *op == BinOp::Ne => AVal::Bool(!x.equals(y)),
                        _ => AVal::Bool(Tri::Unknown),
                    },
                    _ => match (a, b) {
                        (AVal::Int(x), AVal::Int(y)) => AVal::Int(arith(*op, x, y)),
                        (AVal::Float, AVal::Float) => AVal::Float,
                        _ => AVal::Any,
                    },
                }
            }
            ExprKind::Call(f, args) => {
                if args.len() != f.arity() {
                    return AVal::Any;
                }
                match f {
                    Func::Min | Func::Max => match (self.value(&args[0]), self.value(&args[1])) {
                        (AVal::Int(x), AVal::Int(y)) => AVal::Int(if *f == Func::Min {
                            IntRange::new(x.lo.min(y.lo), x.hi.min(y.hi))
                        } else {
                            IntRange::new(x.lo.max(y.lo), x.hi.max(y.hi))
                        }),
                        (AVal::Float, AVal::Float) => AVal::Float,
                        _ => AVal::Any,
                    },
                    Func::Abs => match self.value(&args[0]) {
                        AVal::Int(x) => AVal::Int(abs(x)),
                        AVal::Float => AVal::Float,
                        _ => AVal::Any,
                    },
                    Func::Select => {
                        let c = match self.value(&args[0]) {
                            AVal::Bool(t) => t,
                            _ => Tri::Unknown,
                        };
                        match c {
                            Tri::True => self.value(&args[1]),
                            Tri::False => self.value(&args[2]),
                            Tri::Unknown => self.value(&args[1]).join(self.value(&args[2])),
                        }
                    }
                    Func::ToInt => AVal::Int(IntRange::TOP),
                    _ => AVal::Float,
                }
            }
        }
    }
}

/// The interval of an int expression over the query (TOP for anything not an int).
pub fn int_range(spec: &Spec, e: &Expr, query: &TileQuery) -> IntRange {
    match (Analyzer { spec, query, aux: None }).value(e) {
        AVal::Int(r) => r,
        _ => IntRange::TOP,
    }
}

/// The tri-state truth of a bool expression over the query (Unknown for anything not a bool).
pub fn truth(spec: &Spec, e: &Expr, query: &TileQuery) -> Tri {
    truth_with_aux(spec, e, query, None)
}

/// [`truth`] with the launch's aux values (rule 4's block-classification form).
pub fn truth_with_aux(spec: &Spec, e: &Expr, query: &TileQuery, aux: Option<&dyn AuxValues>) -> Tri {
    match (Analyzer { spec, query, aux }).value(e) {
        AVal::Bool(t) => t,
        _ => Tri::Unknown,
    }
}

/// [`classify`] with the launch's aux values: what the block classification's interval
/// pass decides before it evaluates the undecided tiles element by element.
pub fn classify_with_aux(spec: &Spec, query: &TileQuery, aux: &dyn AuxValues) -> TileClass {
    let Some(pred) = spec.mask.to_predicate() else {
        return TileClass::Full;
    };
    if [query.b, query.h, query.hkv, query.q, query.k].iter().any(IntRange::is_empty) {
        return TileClass::Empty;
    }
    truth_with_aux(spec, &pred, query, Some(aux)).to_class()
}

/// Classifies the tile described by `query` under `spec`'s mask.
pub fn classify(spec: &Spec, query: &TileQuery) -> TileClass {
    classify_mask(spec, &spec.mask, query)
}

/// [`classify`] for a mask other than the spec's own (params and aux still resolve
/// through `spec`).
pub fn classify_mask(spec: &Spec, mask: &Mask, query: &TileQuery) -> TileClass {
    let Some(pred) = mask.to_predicate() else {
        return TileClass::Full;
    };
    if [query.b, query.h, query.hkv, query.q, query.k].iter().any(IntRange::is_empty) {
        return TileClass::Empty;
    }
    truth(spec, &pred, query).to_class()
}

/// Static facts about a spec's mask, used by code generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MaskFacts {
    /// The spec has a mask at all (causal, window or predicate).
    pub has_mask: bool,
    /// Some tile may classify as Partial, so kernels need per-element masking code.
    /// False only when the mask is absent or decided (always True/False) even with
    /// nothing known ([`TileQuery::unbounded`]); by monotonicity every tile then gets
    /// that answer.
    pub needs_elementwise: bool,
    /// The answer for every tile when `!needs_elementwise` (Full when there is no mask).
    pub constant: Option<TileClass>,
    /// The mask reads `q` / `k`.
    pub uses_q: bool,
    pub uses_k: bool,
    /// The mask reads `b`.
    pub uses_batch: bool,
    /// The mask reads `h` or `hkv` (so a packed-GQA tile may mix answers across rows).
    pub uses_head: bool,
    /// The mask reads an aux tensor (analysis gives TOP for those: per-element masking
    /// or run-time block-sparse metadata).
    pub reads_aux: bool,
    /// The mask reads a param (tile classes depend on launch values).
    pub reads_params: bool,
    /// The mask reads `seqlen_q` / `seqlen_k` (e.g. bottom-right alignment).
    pub depends_on_seqlens: bool,
}

/// Computes [`MaskFacts`] for `spec`'s mask.
pub fn mask_facts(spec: &Spec) -> MaskFacts {
    let Some(pred) = spec.mask.to_predicate() else {
        return MaskFacts {
            has_mask: false,
            needs_elementwise: false,
            constant: Some(TileClass::Full),
            uses_q: false,
            uses_k: false,
            uses_batch: false,
            uses_head: false,
            reads_aux: false,
            reads_params: false,
            depends_on_seqlens: false,
        };
    };
    let t = truth(spec, &pred, &TileQuery::unbounded(spec));
    MaskFacts {
        has_mask: true,
        needs_elementwise: t == Tri::Unknown,
        constant: if t == Tri::Unknown { None } else { Some(t.to_class()) },
        uses_q: pred.uses_var(Var::Q),
        uses_k: pred.uses_var(Var::K),
        uses_batch: pred.uses_var(Var::B),
        uses_head: pred.uses_var(Var::H) || pred.uses_var(Var::Hkv),
        reads_aux: pred.uses_aux(),
        reads_params: pred.uses_params(),
        depends_on_seqlens: pred.uses_var(Var::SeqlenQ) || pred.uses_var(Var::SeqlenK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(lo: i64, hi: i64) -> IntRange {
        IntRange::new(lo, hi)
    }

    #[test]
    fn arithmetic_overflow_goes_to_top() {
        assert_eq!(arith(BinOp::Add, r(MAX - 1, MAX), r(0, 1)), IntRange::TOP);
        assert_eq!(arith(BinOp::Add, r(MAX - 1, MAX - 1), r(0, 1)), r(MAX - 1, MAX));
        assert_eq!(arith(BinOp::Sub, r(MIN, 0), r(0, 1)), IntRange::TOP);
        assert_eq!(arith(BinOp::Mul, r(-3, 2), r(-5, 7)), r(-21, 15));
        assert_eq!(arith(BinOp::Mul, r(1 << 16, 1 << 16), r(1 << 15, 1 << 15)), IntRange::TOP);
        assert_eq!(neg(r(MIN, 0)), IntRange::TOP);
        assert_eq!(neg(r(-3, 5)), r(-5, 3));
    }

    #[test]
    fn division_rules() {
        assert_eq!(arith(BinOp::Div, r(0, 100), r(-1, 1)), IntRange::TOP);
        assert_eq!(arith(BinOp::Div, r(-7, 9), r(2, 4)), r(-4, 4));
        assert_eq!(arith(BinOp::Div, r(-7, 9), r(-2, -2)), r(-5, 3));
        assert_eq!(arith(BinOp::Div, r(MIN, MIN), r(-1, -1)), IntRange::TOP);
        assert_eq!(arith(BinOp::Div, r(64, 127), r(64, 64)), r(1, 1));
    }

    #[test]
    fn remainder_rules() {
        assert_eq!(arith(BinOp::Rem, r(66, 70), r(64, 64)), r(2, 6));
        assert_eq!(arith(BinOp::Rem, r(60, 70), r(64, 64)), r(0, 63));
        assert_eq!(arith(BinOp::Rem, r(-3, -1), r(5, 5)), r(2, 4));
        assert_eq!(arith(BinOp::Rem, r(1, 3), r(-5, -5)), r(-4, -2));
        assert_eq!(arith(BinOp::Rem, r(-1, 3), r(-5, -5)), r(-4, 0));
        assert_eq!(arith(BinOp::Rem, r(0, 100), r(3, 9)), r(0, 8));
        assert_eq!(arith(BinOp::Rem, r(0, 100), r(-9, -3)), r(-8, 0));
        assert_eq!(arith(BinOp::Rem, r(0, 100), r(0, 0)), IntRange::TOP);
        assert_eq!(arith(BinOp::Rem, r(0, 100), r(-1, 1)), IntRange::TOP);
        assert_eq!(arith(BinOp::Rem, IntRange::TOP, r(MIN, MIN)), r(MIN + 1, 0));
    }

    #[test]
    fn abs_rules() {
        assert_eq!(abs(r(2, 5)), r(2, 5));
        assert_eq!(abs(r(-5, -2)), r(2, 5));
        assert_eq!(abs(r(-5, 3)), r(0, 5));
        assert_eq!(abs(r(MIN, -2)), IntRange::TOP);
        assert_eq!(abs(r(MIN, 2)), IntRange::TOP);
    }

    #[test]
    fn comparisons() {
        assert_eq!(compare(BinOp::Lt, r(0, 3), r(4, 9)), Tri::True);
        assert_eq!(compare(BinOp::Lt, r(4, 9), r(0, 4)), Tri::False);
        assert_eq!(compare(BinOp::Lt, r(0, 4), r(4, 9)), Tri::Unknown);
        assert_eq!(compare(BinOp::Le, r(0, 4), r(4, 9)), Tri::True);
        assert_eq!(compare(BinOp::Gt, r(5, 9), r(0, 4)), Tri::True);
        assert_eq!(compare(BinOp::Ge, r(0, 3), r(4, 9)), Tri::False);
        assert_eq!(compare(BinOp::Eq, r(3, 3), r(3, 3)), Tri::True);
        assert_eq!(compare(BinOp::Eq, r(3, 4), r(3, 4)), Tri::Unknown);
        assert_eq!(compare(BinOp::Ne, r(0, 2), r(3, 4)), Tri::True);
    }

    #[test]
    fn no_mask_is_full_and_facts() {
        let s = Spec::new("t", 128, 4);
        assert_eq!(classify(&s, &TileQuery::unbounded(&s)), TileClass::Full);
        let f = mask_facts(&s);
        assert!(!f.has_mask && !f.needs_elementwise);
        let mut s = s;
        s.mask.causal = Some(crate::spec::Align::BottomRight);
        let f = mask_facts(&s);
        assert!(f.has_mask && f.needs_elementwise && f.depends_on_seqlens && f.uses_q && f.uses_k);
        assert!(!f.reads_aux && !f.reads_params && !f.uses_batch && !f.uses_head);
        s.mask.causal = None;
        s.mask.predicate = Some(Expr::bool(true).and(Expr::binary(BinOp::Ge, Expr::var(Var::Q), Expr::int(0))));
        let f = mask_facts(&s);
        assert!(f.has_mask && !f.needs_elementwise);
        assert_eq!(f.constant, Some(TileClass::Full));
    }

    /// An integer compared with itself is decided whatever its range (the 2026-11-26
    /// sweep's `random_10_4`: `false == p0 <= p0 - select(true == true, 0, 0)` allows
    /// nothing, and LLVM folds the kernels' matrix math away); a float is not (NaN).
    #[test]
    fn an_integer_compared_with_itself_is_decided() {
        let mut s = Spec::new("t", 128, 4);
        s.params.push(crate::spec::ParamDecl { name: "p0".into(), ty: Ty::Int });
        let p0 = || Expr::param("p0");
        let zero = Expr::call(
            crate::expr::Func::Select,
            vec![Expr::binary(BinOp::Eq, Expr::bool(true), Expr::bool(true)), Expr::int(0), Expr::int(0)],
        );
        let le = Expr::binary(BinOp::Le, p0(), Expr::binary(BinOp::Sub, p0(), zero));
        let q = TileQuery::unbounded(&s);
        assert_eq!(truth(&s, &le, &q), Tri::True);
        assert_eq!(truth(&s, &Expr::binary(BinOp::Lt, p0(), p0()), &q), Tri::False);
        assert_eq!(truth(&s, &Expr::binary(BinOp::Ne, Expr::var(Var::Q), Expr::var(Var::Q)), &q), Tri::False);
        assert_eq!(truth(&s, &Expr::binary(BinOp::Le, Expr::var(Var::Q), Expr::var(Var::K)), &q), Tri::Unknown);
        s.mask.predicate = Some(Expr::binary(BinOp::Eq, Expr::bool(false), le));
        assert_eq!(mask_facts(&s).constant, Some(TileClass::Empty));
        let f = || Expr::call(crate::expr::Func::ToFloat, vec![p0()]);
        assert_eq!(truth(&s, &Expr::binary(BinOp::Le, f(), f()), &q), Tri::Unknown);
    }
}
