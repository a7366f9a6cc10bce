//! Concrete evaluation of expressions: the definition of what an expression means.
//! The reference executor and the mask-analysis property tests use it; generated code
//! must agree with it (ints wrap at 32 bits, floor division, clamped aux indices).

use crate::expr::{BinOp, Expr, ExprKind, Func, UnOp, Var};
use crate::spec::{AuxElem, Spec};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(i32),
    Float(f64),
    Bool(bool),
}

impl Value {
    pub fn as_int(self) -> i32 {
        match self {
            Value::Int(v) => v,
            Value::Float(v) => v as i32,
            Value::Bool(b) => b as i32,
        }
    }
    pub fn as_float(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::Float(v) => v,
            Value::Bool(b) => b as i32 as f64,
        }
    }
    pub fn as_bool(self) -> bool {
        match self {
            Value::Bool(b) => b,
            Value::Int(v) => v != 0,
            Value::Float(v) => v != 0.0,
        }
    }
}

/// The elements of a bound aux tensor: i32 for `int` tensors, f64 for `float` ones (the
/// reference computes in f64; kernels get f32).
#[derive(Clone, Debug, PartialEq)]
pub enum AuxData {
    Int(Vec<i32>),
    Float(Vec<f64>),
}

impl Default for AuxData {
    fn default() -> Self {
        AuxData::Int(Vec::new())
    }
}

impl AuxData {
    pub fn len(&self) -> usize {
        match self {
            AuxData::Int(v) => v.len(),
            AuxData::Float(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Which declaration this data fits.
    pub fn elem(&self) -> AuxElem {
        match self {
            AuxData::Int(_) => AuxElem::Int,
            AuxData::Float(_) => AuxElem::Float,
        }
    }
    pub fn ints(&self) -> Option<&[i32]> {
        match self {
            AuxData::Int(v) => Some(v),
            AuxData::Float(_) => None,
        }
    }
    pub fn ints_mut(&mut self) -> Option<&mut Vec<i32>> {
        match self {
            AuxData::Int(v) => Some(v),
            AuxData::Float(_) => None,
        }
    }
    pub fn floats(&self) -> Option<&[f64]> {
        match self {
            AuxData::Float(v) => Some(v),
            AuxData::Int(_) => None,
        }
    }
    pub fn floats_mut(&mut self) -> Option<&mut Vec<f64>> {
        match self {
            AuxData::Float(v) => Some(v),
            AuxData::Int(_) => None,
        }
    }
}

/// A bound aux tensor: row-major data with its resolved dimensions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuxTensor {
    pub dims: Vec<usize>,
    pub data: AuxData,
}

impl AuxTensor {
    pub fn int(dims: Vec<usize>, data: Vec<i32>) -> AuxTensor {
        AuxTensor { dims, data: AuxData::Int(data) }
    }
    pub fn float(dims: Vec<usize>, data: Vec<f64>) -> AuxTensor {
        AuxTensor { dims, data: AuxData::Float(data) }
    }

    /// The row-major offset of the element `index` reads, each index clamped into its
    /// dimension (the language's rule); `None` when that offset is not inside the data
    /// (a malformed tensor), which reads as 0.
    pub fn flat_index(&self, index: &[i32]) -> Option<usize> {
        let mut flat = 0usize;
        for (i, &n) in index.iter().zip(&self.dims) {
            // (dims beyond i32 must not make clamp's bounds cross, nor the offset overflow)
            let c = (*i).clamp(0, n.saturating_sub(1).min(i32::MAX as usize) as i32) as usize;
            flat = flat.checked_mul(n)?.checked_add(c)?;
        }
        (flat < self.data.len()).then_some(flat)
    }

    /// Reads with each index clamped into its dimension: `Value::Int` from an int tensor,
    /// `Value::Float` from a float one (0 of that type when the tensor is malformed).
    pub fn get(&self, index: &[i32]) -> Value {
        let at = self.flat_index(index);
        match &self.data {
            AuxData::Int(v) => Value::Int(at.and_then(|i| v.get(i).copied()).unwrap_or(0)),
            AuxData::Float(v) => Value::Float(at.and_then(|i| v.get(i).copied()).unwrap_or(0.0)),
        }
    }
}

/// The values the variables, params and aux tensors have at one (b, h, q, k).
#[derive(Clone, Debug, Default)]
pub struct Env<'a> {
    pub b: i32,
    pub h: i32,
    pub hkv: i32,
    pub q: i32,
    pub k: i32,
    pub score: f64,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub q_heads: i32,
    pub kv_heads: i32,
    /// Param values in declaration order.
    pub params: &'a [Value],
    /// Aux tensors in declaration order.
    pub aux: &'a [AuxTensor],
}

/// Floor division with x / 0 = 0 (wrapping on i32::MIN / -1).
pub fn floor_div(a: i32, b: i32) -> i32 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if a.wrapping_rem(b) != 0 && ((a < 0) != (b < 0)) {
        q.wrapping_sub(1)
    } else {
        q
    }
}

/// Floor modulo (sign of the divisor) with x % 0 = 0.
pub fn floor_rem(a: i32, b: i32) -> i32 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && ((r < 0) != (b < 0)) {
        r.wrapping_add(b)
    } else {
        r
    }
}

/// Evaluates a type-checked expression. Params and aux are looked up by declaration
/// index in `spec`; an unchecked expression evaluates to something, never panics.
pub fn eval(spec: &Spec, e: &Expr, env: &Env) -> Value {
    match &e.kind {
        ExprKind::Int(v) => Value::Int(*v as i32),
        ExprKind::Float(v) => Value::Float(*v),
        ExprKind::Bool(v) => Value::Bool(*v),
        ExprKind::Var(v) => match v {
            Var::B => Value::Int(env.b),
            Var::H => Value::Int(env.h),
            Var::Hkv => Value::Int(env.hkv),
            Var::Q => Value::Int(env.q),
            Var::K => Value::Int(env.k),
            Var::Score => Value::Float(env.score),
            Var::SeqlenQ => Value::Int(env.seqlen_q),
            Var::SeqlenK => Value::Int(env.seqlen_k),
            Var::QHeads => Value::Int(env.q_heads),
            Var::KvHeads => Value::Int(env.kv_heads),
        },
        ExprKind::Param(name) => {
            spec.param_index(name).and_then(|i| env.params.get(i).copied()).unwrap_or(Value::Int(0))
        }
        ExprKind::Aux { name, index } => {
            let idx: Vec<i32> = index.iter().map(|i| eval(spec, i, env).as_int()).collect();
            let decl = spec.aux_index(name);
            match decl.and_then(|i| env.aux.get(i)) {
                Some(t) => t.get(&idx),
                None if decl.is_some_and(|i| spec.aux[i].elem == AuxElem::Float) => Value::Float(0.0),
                None => Value::Int(0),
            }
        }
        ExprKind::Unary(op, a) => {
            let a = eval(spec, a, env);
            match (op, a) {
                (UnOp::Neg, Value::Int(v)) => Value::Int(v.wrapping_neg()),
                (UnOp::Neg, Value::Float(v)) => Value::Float(-v),
                (_, v) => Value::Bool(!v.as_bool()),
            }
        }
        ExprKind::Binary(op, a, b) => {
            // && and || do not short-circuit observably (no side effects), but avoid
            // evaluating the right side needlessly.
            let a = eval(spec, a, env);
            if let (BinOp::And, false) | (BinOp::Or, true) = (op, a.as_bool()) {
                if matches!(a, Value::Bool(_)) {
                    return a;
                }
            }
            let b = eval(spec, b, env);
            binary(*op, a, b)
        }
        ExprKind::Call(f, args) => {
            let v: Vec<Value> = args.iter().map(|a| eval(spec, a, env)).collect();
            call(*f, &v)
        }
    }
}

fn binary(op: BinOp, a: Value, b: Value) -> Value {
    use Value::*;
    match (a, b) {
        (Int(x), Int(y)) => match op {
            BinOp::Add => Int(x.wrapping_add(y)),
            BinOp::Sub => Int(x.wrapping_sub(y)),
            BinOp::Mul => Int(x.wrapping_mul(y)),
            BinOp::Div => Int(floor_div(x, y)),
            BinOp::Rem => Int(floor_rem(x, y)),
            BinOp::Lt => Bool(x < y),
            BinOp::Le => Bool(x <= y),
            BinOp::Gt => Bool(x > y),
            BinOp::Ge => Bool(x >= y),
            BinOp::Eq => Bool(x == y),
            BinOp::Ne => Bool(x != y),
            BinOp::And => Bool(x != 0 && y != 0),
            BinOp::Or => Bool(x != 0 || y != 0),
        },
        (Bool(x), Bool(y)) => match op {
            BinOp::And => Bool(x && y),
            BinOp::Or => Bool(x || y),
            BinOp::Eq => Bool(x == y),
            BinOp::Ne => Bool(x != y),
            _ => binary(op, Int(x as i32), Int(y as i32)),
        },
        _ => {
            let (x, y) = (a.as_float(), b.as_float());
            match op {
                BinOp::Add => Float(x + y),
                BinOp::Sub => Float(x - y),
                BinOp::Mul => Float(x * y),
                BinOp::Div => Float(x / y),
                BinOp::Rem => Float(x % y),
                BinOp::Lt => Bool(x < y),
                BinOp::Le => Bool(x <= y),
                BinOp::Gt => Bool(x > y),
                BinOp::Ge => Bool(x >= y),
                BinOp::Eq => Bool(x == y),
                BinOp::Ne => Bool(x != y),
                BinOp::And => Bool(x != 0.0 && y != 0.0),
                BinOp::Or => Bool(x != 0.0 || y != 0.0),
            }
        }
    }
}

/// Float to int as `cvt.rzi.s32.f32` does it: toward zero, saturating, NaN → 0.
pub fn float_to_int(x: f64) -> i32 {
    x as i32
}

fn call(f: Func, v: &[Value]) -> Value {
    use Value::*;
    let x = v.first().copied().unwrap_or(Int(0));
    let y = v.get(1).copied().unwrap_or(Int(0));
    let fl = |g: fn(f64) -> f64| Float(g(x.as_float()));
    match f {
        Func::Min => match (x, y) {
            (Int(a), Int(b)) => Int(a.min(b)),
            _ => Float(x.as_float().min(y.as_float())),
        },
        Func::Max => match (x, y) {
            (Int(a), Int(b)) => Int(a.max(b)),
            _ => Float(x.as_float().max(y.as_float())),
        },
        Func::Abs => match x {
            Int(a) => Int(a.wrapping_abs()),
            _ => Float(x.as_float().abs()),
        },
        Func::Select => {
            if x.as_bool() {
                y
            } else {
                v.get(2).copied().unwrap_or(Int(0))
            }
        }
        Func::ToFloat => Float(x.as_int() as f64),
        Func::ToInt => Int(float_to_int(x.as_float())),
        Func::Exp => fl(f64::exp),
        Func::Exp2 => fl(f64::exp2),
        Func::Log => fl(f64::ln),
        Func::Log2 => fl(f64::log2),
        Func::Sqrt => fl(f64::sqrt),
        Func::Tanh => fl(f64::tanh),
        Func::Sigmoid => fl(|t| 1.0 / (1.0 + (-t).exp())),
        Func::Softcap => {
            let c = y.as_float();
            Float(c * (x.as_float() / c).tanh())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_division_and_modulo() {
        assert_eq!(floor_div(7, 2), 3);
        assert_eq!(floor_div(-7, 2), -4);
        assert_eq!(floor_div(7, -2), -4);
        assert_eq!(floor_div(5, 0), 0);
        assert_eq!(floor_div(i32::MIN, -1), i32::MIN);
        assert_eq!(floor_rem(-7, 2), 1);
        assert_eq!(floor_rem(7, -2), -1);
        assert_eq!(floor_rem(7, 0), 0);
        for a in -20..20 {
            for b in [-7, -3, -1, 1, 2, 5] {
                assert_eq!(floor_div(a, b) * b + floor_rem(a, b), a);
            }
        }
    }

    #[test]
    fn aux_indices_clamp() {
        let t = AuxTensor::int(vec![2, 3], (0..6).collect());
        assert_eq!(t.get(&[1, 2]), Value::Int(5));
        assert_eq!(t.get(&[-4, 9]), Value::Int(2));
        assert_eq!(t.get(&[7, -1]), Value::Int(3));
        assert_eq!(t.flat_index(&[7, -1]), Some(3));
        let f = AuxTensor::float(vec![2, 3], (0..6).map(|x| x as f64 * 0.5).collect());
        assert_eq!(f.get(&[1, 2]), Value::Float(2.5));
        assert_eq!(f.get(&[-1, 7]), Value::Float(1.0));
        // absurd dims or short data never panic
        let huge = AuxTensor::int(vec![usize::MAX / 3, usize::MAX], vec![]);
        assert_eq!(huge.get(&[5, 7]), Value::Int(0));
        assert_eq!(huge.flat_index(&[5, 7]), None);
        let short = AuxTensor::float(vec![4], vec![1.0]);
        assert_eq!(short.get(&[3]), Value::Float(0.0));
    }
}
