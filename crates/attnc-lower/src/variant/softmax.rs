//! Softmax numerics shared by the families: the exp2 emulation on the FMA pipe
//! (FA4 §3.1) and its constants. `exp2_emulated_model` is the bit-exact CPU model of the
//! emitted instruction sequence (same f32 operations in the same order), so its error
//! can be measured without a GPU.

use crate::llvm::kb::{Kb, R};
use inkwell::values::{FloatValue, IntValue};
use inkwell::FloatPredicate;

/// Coefficients of p(f) = 1 + f·(C1 + f·(C2 + f·C3)) ≈ 2^f on [0, 1): a relative-error
/// minimax fit with p(0) = 1 (Lawson iteration, rounded to f32); max relative error
/// ≈ 8.6e-5 before bf16 rounding, below bf16's half-ulp (2^-9).
pub const EXP2_POLY: [f32; 3] = [0.695_116_8, 0.227_644_85, 0.077_067_18];

/// The lowest exponent handled; below it the result is 0, as `ex2.approx.ftz` flushes
/// denormals to zero.
pub const EXP2_MIN_EXPONENT: f32 = -127.0;

/// 1.5·2^23: adding it to |x| < 2^22 leaves the integer part of x in the low mantissa
/// bits (the ulp at this magnitude is 1), so the rounding mode of the add picks floor.
pub const EXP2_ROUND_MAGIC: f32 = 12_582_912.0;

/// Emits the emulated 2^x: Cody-Waite split x = j + f (j = floor x), a degree-3
/// polynomial for 2^f in FMAs, and j added to the exponent field.
///
/// Every step stays off the conversion/MUFU pipe, which is the point of emulating: floor
/// comes from `add.rm` of 1.5·2^23 (FADD), the integer j is the low bits of that sum
/// (its `<< 23` drops the magic's own bits), and the underflow test is a float compare.
/// `cvt.rmi`/`cvt.rzi` would issue as FRND/F2I on the same quarter-rate pipe as MUFU.EX2
/// and cost two slow ops to save one.
pub fn exp2_emulated<'ctx>(kb: &Kb<'ctx>, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    let xc = kb.fmax(x, kb.f32c(EXP2_MIN_EXPONENT as f64), "exp2e.x")?;
    let t = kb.asm_f32_1("add.rm.f32 $0, $1, 0f4B400000;", xc, "exp2e.t")?;
    let j = kb.fsub(t, kb.f32c(EXP2_ROUND_MAGIC as f64), "exp2e.j")?;
    let f = kb.fsub(xc, j, "exp2e.f")?;
    let [c1, c2, c3] = EXP2_POLY;
    let p = kb.fma(kb.f32c(c3 as f64), f, kb.f32c(c2 as f64), "")?;
    let p = kb.fma(p, f, kb.f32c(c1 as f64), "")?;
    let p = kb.fma(p, f, kb.f32c(1.0), "exp2e.p")?;
    let exponent = kb.shl(kb.f_bits(t, "")?, kb.i32c(23), "exp2e.jexp")?;
    let bits = kb.add(kb.f_bits(p, "")?, exponent, "")?;
    let r = kb.bits_f(bits, "")?;
    let underflow = kb.fcmp(FloatPredicate::OLT, xc, kb.f32c(EXP2_MIN_EXPONENT as f64 + 1.0), "")?;
    kb.select_f(underflow, kb.f32c(0.0), r, "exp2e")
}

/// The new exponent bases of a thread's rows for one tile of the online softmax.
pub struct MaxUpdate<'ctx> {
    /// Per row: the base to subtract before exp2 (the chosen max, 0 when it is −∞).
    pub bases: Vec<FloatValue<'ctx>>,
    /// Per row: 2^(old max − base), the factor for O and the running sum.
    pub alphas: Vec<FloatValue<'ctx>>,
    /// The new running max per row (what the caller stores).
    pub maxes: Vec<FloatValue<'ctx>>,
    /// With conditional rescaling: whether the warp moved its bases (and O must be
    /// rescaled); `None` when it always does.
    pub rescale: Option<IntValue<'ctx>>,
}

/// One tile's max update, given each row's old running max and the max including the
/// tile (log2 units). With `threshold > 0` (FA4's conditional rescaling) the warp keeps
/// its old bases unless some row grew by more than the threshold or left −∞, decided
/// uniformly per warp (`vote.any`); otherwise every row takes its new max.
pub fn max_update<'ctx>(
    kb: &Kb<'ctx>,
    old: &[FloatValue<'ctx>],
    new: &[FloatValue<'ctx>],
    threshold: f64,
) -> R<MaxUpdate<'ctx>> {
    let ninf = kb.f32c(f64::NEG_INFINITY);
    let rescale = if threshold > 0.0 {
        let mut any = kb.boolc(false);
        for (o, m) in old.iter().zip(new) {
            let grew = kb.fcmp(FloatPredicate::OGT, *m, kb.fadd(*o, kb.f32c(threshold), "")?, "")?;
            let was_empty = kb.fcmp(FloatPredicate::OEQ, *o, ninf, "")?;
            let now_finite = kb.fcmp(FloatPredicate::ONE, *m, ninf, "")?;
            let grew = kb.or(grew, kb.and(was_empty, now_finite, "")?, "")?;
            any = kb.or(any, grew, "")?;
        }
        Some(kb.vote_any(any, "rescale_warp")?)
    } else {
        None
    };
    let mut out = MaxUpdate { bases: Vec::new(), alphas: Vec::new(), maxes: Vec::new(), rescale };
    for (o, m) in old.iter().zip(new) {
        let chosen = match rescale {
            Some(c) => kb.select_f(c, *m, *o, "m_base")?,
            None => *m,
        };
        let is_inf = kb.fcmp(FloatPredicate::OEQ, chosen, ninf, "")?;
        let base = kb.select_f(is_inf, kb.f32c(0.0), chosen, "m_safe")?;
        out.alphas.push(kb.ex2(kb.fsub(*o, base, "")?, "alpha")?);
        out.bases.push(base);
        out.maxes.push(chosen);
    }
    Ok(out)
}

/// The end of a row's online softmax: from the row sum `l` (relative to the base `m`,
/// log2 units; −∞ when no key was allowed) and an optional sink logit (log2 units, −∞
/// for none), the factor that normalizes O and the natural-log LSE. The sink joins the
/// denominator; a row with nothing (no key, no sink) gets O = 0 and LSE = −∞.
pub fn finalize_row<'ctx>(
    kb: &Kb<'ctx>,
    l: FloatValue<'ctx>,
    m: FloatValue<'ctx>,
    sink_log2: Option<FloatValue<'ctx>>,
) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
    let ninf = kb.f32c(f64::NEG_INFINITY);
    let m_inf = kb.fcmp(FloatPredicate::OEQ, m, ninf, "")?;
    let m_safe = kb.select_f(m_inf, kb.f32c(0.0), m, "")?;
    let (denom, weight, m_log2) = match sink_log2 {
        Some(sink2) => {
            let m2 = kb.fmax(m_safe, sink2, "")?;
            let m2 = kb.select_f(m_inf, sink2, m2, "")?;
            let m2_inf = kb.fcmp(FloatPredicate::OEQ, m2, ninf, "")?;
            let m2s = kb.select_f(m2_inf, kb.f32c(0.0), m2, "")?;
            let w = kb.ex2(kb.fsub(m_safe, m2s, "")?, "")?;
            let w = kb.select_f(m_inf, kb.f32c(0.0), w, "")?;
            let denom = kb.fma(l, w, kb.ex2(kb.fsub(sink2, m2s, "")?, "")?, "denom")?;
            (denom, w, m2s)
        }
        None => (l, kb.f32c(1.0), m_safe),
    };
    let empty = kb.fcmp(FloatPredicate::OEQ, denom, kb.f32c(0.0), "")?;
    let safe = kb.select_f(empty, kb.f32c(1.0), denom, "")?;
    let inv = kb.fdiv(weight, safe, "")?;
    let o_scale = kb.select_f(empty, kb.f32c(0.0), inv, "o_scale")?;
    let lse2 = kb.fadd(m_log2, kb.lg2(safe, "")?, "")?;
    let lse = kb.fmul(lse2, kb.f32c(std::f64::consts::LN_2), "")?;
    let lse = kb.select_f(empty, ninf, lse, "lse")?;
    Ok((o_scale, lse))
}

/// The sink logit of head `h` (`sinks[h]`, f32, natural log) in log2 units, for
/// [`finalize_row`]; −∞ where `is_split` holds at run time, because a split's partial
/// leaves the sink to the combine kernel, which adds it once.
pub fn sink_log2<'ctx>(
    kb: &Kb<'ctx>,
    sinks: IntValue<'ctx>,
    h: IntValue<'ctx>,
    is_split: Option<IntValue<'ctx>>,
) -> R<FloatValue<'ctx>> {
    let addr = kb.add(sinks, kb.mul(kb.sext64(h, "")?, kb.i64c(4), "")?, "")?;
    let sink = kb.ld_global_f32(addr, "sink")?;
    let sink2 = kb.fmul(sink, kb.f32c(std::f64::consts::LOG2_E), "")?;
    match is_split {
        Some(split) => kb.select_f(split, kb.f32c(f64::NEG_INFINITY), sink2, "sink_log2"),
        None => Ok(sink2),
    }
}

/// CPU model of [`exp2_emulated`], operation for operation in f32.
pub fn exp2_emulated_model(x: f32) -> f32 {
    // max.f32 ignores NaN like f32::max.
    let xc = x.max(EXP2_MIN_EXPONENT);
    // add.rm: the exact sum rounded toward -inf; for xc in [-127, 2^22) that is the
    // integer 1.5·2^23 + floor(xc), which f32 represents exactly.
    let t = EXP2_ROUND_MAGIC + xc.floor();
    let j = t - EXP2_ROUND_MAGIC;
    let f = xc - j;
    let [c1, c2, c3] = EXP2_POLY;
    let p = c3.mul_add(f, c2);
    let p = p.mul_add(f, c1);
    let p = p.mul_add(f, 1.0);
    let r = f32::from_bits(p.to_bits().wrapping_add(t.to_bits().wrapping_shl(23)));
    if xc < EXP2_MIN_EXPONENT + 1.0 {
        0.0
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulation_is_accurate_on_the_softmax_range() {
        let mut max_rel: f64 = 0.0;
        let n = 200_000;
        for i in 0..=n {
            let x = -126.0 + 126.0 * i as f64 / n as f64;
            let got = exp2_emulated_model(x as f32) as f64;
            let want = (x as f32 as f64).exp2();
            max_rel = max_rel.max((got - want).abs() / want);
        }
        assert!(max_rel < 1.0e-4, "max relative error {max_rel}");
    }

    /// The magic-number floor gives exactly what floor + float-to-int conversion gives
    /// (the sequence before, whose error table is in docs/results), on every input the
    /// softmax produces, including the conditional-rescaling headroom above 0.
    #[test]
    fn magic_floor_matches_conversion_floor() {
        let by_conversion = |x: f32| -> f32 {
            let xc = x.max(EXP2_MIN_EXPONENT);
            let j = xc.floor();
            let f = xc - j;
            let [c1, c2, c3] = EXP2_POLY;
            let p = c3.mul_add(f, c2).mul_add(f, c1).mul_add(f, 1.0);
            let ji = j as i32;
            if ji < -126 {
                0.0
            } else {
                f32::from_bits(p.to_bits().wrapping_add((ji as u32).wrapping_shl(23)))
            }
        };
        for i in 0..=1_000_000 {
            let x = -130.0 + 146.0 * i as f32 / 1.0e6;
            assert_eq!(exp2_emulated_model(x).to_bits(), by_conversion(x).to_bits(), "x = {x}");
        }
        for x in [-127.0f32, -126.0, -126.5, -0.0, 0.0, 8.0, f32::NAN, f32::NEG_INFINITY, -1e30] {
            assert_eq!(exp2_emulated_model(x).to_bits(), by_conversion(x).to_bits(), "x = {x}");
        }
    }

    #[test]
    fn emulation_edges() {
        assert_eq!(exp2_emulated_model(0.0), 1.0);
        assert_eq!(exp2_emulated_model(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp2_emulated_model(-200.0), 0.0);
        assert_eq!(exp2_emulated_model(-1.0), 0.5);
        assert!((exp2_emulated_model(8.0) - 256.0).abs() < 1e-3);
    }
}
