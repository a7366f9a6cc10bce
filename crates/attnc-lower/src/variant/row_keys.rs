//! The keys one query row may see, as one interval, for masks made only of a causal
//! bound and a window (no predicate): a partial tile's mask then is two bounds per row
//! and a bit range per word instead of a test per element.

use crate::llvm::kb::{Kb, R};
use attnc_ir::{Align, Spec};
use inkwell::values::IntValue;

/// A mask whose allowed keys for query `q` are `lo(q) ..= hi(q)` (and `k < seqlen_k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowKeys {
    causal: Option<Align>,
    left: Option<(u64, Align)>,
    right: Option<(u64, Align)>,
}

/// The largest window side taken as an interval (validation rejects larger ones): the
/// reference adds window sides to positions in wrapping i32 arithmetic, which an i64
/// interval matches only while no sum wraps.
const MAX_SIDE: u64 = attnc_ir::MAX_WINDOW;

impl RowKeys {
    /// The interval form of `spec`'s mask, when it has one: a causal bound and/or a window
    /// and nothing else, in kernels without a shard's frame (a context-parallel shard's
    /// masks see global positions; those keep the per-element test).
    pub fn of(spec: &Spec) -> Option<RowKeys> {
        let m = &spec.mask;
        if m.predicate.is_some() || (m.causal.is_none() && m.window.is_none()) || spec.shards {
            return None;
        }
        let w = m.window;
        if w.is_some_and(|w| w.left.is_some_and(|l| l > MAX_SIDE) || w.right.is_some_and(|r| r > MAX_SIDE)) {
            return None;
        }
        Some(RowKeys {
            causal: m.causal,
            left: w.and_then(|w| w.left.map(|l| (l, w.align))),
            right: w.and_then(|w| w.right.map(|r| (r, w.align))),
        })
    }

    /// The allowed keys of query `q`, `lo ..= hi` (i32; `lo` in `0 ..= seqlen_k`, `hi` in
    /// `−2 .. seqlen_k`, so differences of them and of key positions stay inside i32;
    /// empty when `hi < lo`).
    pub fn emit<'ctx>(
        &self,
        kb: &Kb<'ctx>,
        q: IntValue<'ctx>,
        seqlen_q: IntValue<'ctx>,
        seqlen_k: IntValue<'ctx>,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let q64 = kb.sext64(q, "q64")?;
        let sk = kb.sext64(seqlen_k, "")?;
        let shift = kb.sub(sk, kb.sext64(seqlen_q, "")?, "")?;
        let diag = |align: Align| -> R<IntValue<'ctx>> {
            match align {
                Align::TopLeft => Ok(q64),
                Align::BottomRight => kb.add(q64, shift, "diag"),
            }
        };
        let mut hi = kb.sub(sk, kb.i64c(1), "")?;
        if let Some(a) = self.causal {
            hi = kb.smin(hi, diag(a)?, "")?;
        }
        if let Some((r, a)) = self.right {
            hi = kb.smin(hi, kb.add(diag(a)?, kb.i64c(r as i64), "")?, "")?;
        }
        let mut lo = kb.i64c(0);
        if let Some((l, a)) = self.left {
            lo = kb.smax(lo, kb.sub(diag(a)?, kb.i64c(l as i64), "")?, "")?;
        }
        narrow(kb, lo, hi, sk)
    }

    /// The transposed interval: the queries that may see key `k`, `lo ..= hi` (the bounds
    /// are monotone in q, so they are one interval too; `hi` at most `seqlen_q − 1` and
    /// below `lo` when `k` is past `seqlen_k`; `lo` in `0 ..= seqlen_q`, `hi` ≥ −2).
    pub fn emit_queries<'ctx>(
        &self,
        kb: &Kb<'ctx>,
        k: IntValue<'ctx>,
        seqlen_q: IntValue<'ctx>,
        seqlen_k: IntValue<'ctx>,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let k64 = kb.sext64(k, "k64")?;
        let sq = kb.sext64(seqlen_q, "")?;
        let shift = kb.sub(kb.sext64(seqlen_k, "")?, sq, "")?;
        // diag(q) = q + shift(align): q as a function of a bound on diag.
        let q_of = |diag: IntValue<'ctx>, align: Align| -> R<IntValue<'ctx>> {
            match align {
                Align::TopLeft => Ok(diag),
                Align::BottomRight => kb.sub(diag, shift, "q_of_diag"),
            }
        };
        let mut lo = kb.i64c(0);
        let mut hi = kb.sub(sq, kb.i64c(1), "")?;
        if let Some(a) = self.causal {
            lo = kb.smax(lo, q_of(k64, a)?, "")?;
        }
        if let Some((r, a)) = self.right {
            lo = kb.smax(lo, q_of(kb.sub(k64, kb.i64c(r as i64), "")?, a)?, "")?;
        }
        if let Some((l, a)) = self.left {
            hi = kb.smin(hi, q_of(kb.add(k64, kb.i64c(l as i64), "")?, a)?, "")?;
        }
        // A key past seqlen_k sees no query.
        let outside = kb.icmp(inkwell::IntPredicate::SGE, k, seqlen_k, "key_outside")?;
        hi = kb.select_i(outside, kb.i64c(-2), hi, "")?;
        narrow(kb, lo, hi, sq)
    }
}

/// An i64 interval of positions `0 .. len` into i32 without changing its meaning there:
/// `lo` at most `len`, `hi` at least −2, so differences of them and of positions stay
/// inside i32.
fn narrow<'ctx>(
    kb: &Kb<'ctx>,
    lo: IntValue<'ctx>,
    hi: IntValue<'ctx>,
    len: IntValue<'ctx>,
) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    let lo = kb.smin(lo, len, "")?;
    let hi = kb.smax(hi, kb.i64c(-2), "")?;
    Ok((kb.trunc32(lo, "interval_lo")?, kb.trunc32(hi, "interval_hi")?))
}

/// The bits `j` (0..32) of a word whose column `base + j` lies in `lo ..= hi` (all i32,
/// `hi − lo` and `lo − base`, `hi − base` inside i32).
pub fn range_word<'ctx>(
    kb: &Kb<'ctx>,
    base: IntValue<'ctx>,
    lo: IntValue<'ctx>,
    hi: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let start = kb.smax(kb.sub(lo, base, "")?, kb.i32c(0), "bits_start")?;
    let end = kb.sub(kb.add(hi, kb.i32c(1), "")?, base, "")?;
    let width = kb.smax(kb.sub(end, start, "")?, kb.i32c(0), "bits_width")?;
    kb.bmsk_clamp(start, width, "range_word")
}

/// The wgmma accumulator's columns of one row, as a thread holds them: element `t` (the
/// `t`-th of the row in fragment order) is column `8 (t / 2) + t % 2` past the thread's
/// first (pairs of adjacent columns, 8 apart). Monotone in `t`, so the elements whose
/// columns lie in an interval are an interval of `t`.
pub fn pair_column(t: u32) -> u32 {
    8 * (t / 2) + t % 2
}

/// How many of a row's fragment elements ([`pair_column`]) have a column below `x` (x ≥ 0).
fn pair_count<'ctx>(kb: &Kb<'ctx>, x: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let groups = kb.lshr(x, kb.i32c(3), "")?;
    let rest = kb.smin(kb.and(x, kb.i32c(7), "")?, kb.i32c(2), "")?;
    kb.add(kb.shl(groups, kb.i32c(1), "")?, rest, "pair_count")
}

/// The bits `t` (0..32) of a row's fragment elements `32 w + t` (in [`pair_column`] order)
/// whose column past the thread's first lies in `lo ..= hi` (relative, any i32 with
/// `hi − lo` inside i32): one word holds 32 elements, 128 columns, where a word of
/// columns ([`range_word`]) holds 32 columns and 8 elements.
pub fn pair_word<'ctx>(kb: &Kb<'ctx>, w: u32, lo: IntValue<'ctx>, hi: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    // Clamped into 0 ..= 256 (a row has at most 64 elements, columns below 256).
    let clamp = |x: IntValue<'ctx>| -> R<IntValue<'ctx>> { kb.smin(kb.smax(x, kb.i32c(0), "")?, kb.i32c(256), "") };
    let first = pair_count(kb, clamp(lo)?)?;
    let end = pair_count(kb, clamp(kb.add(hi, kb.i32c(1), "")?)?)?;
    let start = kb.smax(kb.sub(first, kb.i32c(32 * w as i64), "")?, kb.i32c(0), "pair_start")?;
    let stop = kb.sub(end, kb.i32c(32 * w as i64), "")?;
    let width = kb.smax(kb.sub(stop, start, "")?, kb.i32c(0), "pair_width")?;
    kb.bmsk_clamp(start, width, "pair_word")
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::eval::{eval, Env};
    use attnc_ir::{Mask, Window};

    impl RowKeys {
        /// [`RowKeys::emit`]'s arithmetic on the host.
        fn host(&self, q: i32, seqlen_q: i32, seqlen_k: i32) -> (i32, i32) {
            let (q, sk) = (i64::from(q), i64::from(seqlen_k));
            let diag = |a: Align| match a {
                Align::TopLeft => q,
                Align::BottomRight => q + sk - i64::from(seqlen_q),
            };
            let mut hi = sk - 1;
            if let Some(a) = self.causal {
                hi = hi.min(diag(a));
            }
            if let Some((r, a)) = self.right {
                hi = hi.min(diag(a) + r as i64);
            }
            let mut lo = 0;
            if let Some((l, a)) = self.left {
                lo = lo.max(diag(a) - l as i64);
            }
            (lo.min(sk) as i32, hi.max(-2) as i32)
        }

        /// [`RowKeys::emit_queries`]'s arithmetic on the host.
        fn host_queries(&self, k: i32, seqlen_q: i32, seqlen_k: i32) -> (i32, i32) {
            let (k, sq) = (i64::from(k), i64::from(seqlen_q));
            let shift = i64::from(seqlen_k) - sq;
            let q_of = |diag: i64, a: Align| match a {
                Align::TopLeft => diag,
                Align::BottomRight => diag - shift,
            };
            let (mut lo, mut hi) = (0, sq - 1);
            if let Some(a) = self.causal {
                lo = lo.max(q_of(k, a));
            }
            if let Some((r, a)) = self.right {
                lo = lo.max(q_of(k - r as i64, a));
            }
            if let Some((l, a)) = self.left {
                hi = hi.min(q_of(k + l as i64, a));
            }
            if k >= i64::from(seqlen_k) {
                hi = -2;
            }
            (lo.min(sq) as i32, hi.max(-2) as i32)
        }
    }

    /// `bmsk.clamp.b32` as the PTX ISA defines it.
    fn bmsk_clamp(a: u32, b: u32) -> u32 {
        let a1 = a & 31;
        let b1 = b & 31;
        let mask0 = if a >= 32 { 0 } else { u32::MAX << a1 };
        let sum = a1 + b1;
        let mask1 = if sum >= 32 || b >= 32 {
            0
        } else if b1 == 0 {
            u32::MAX
        } else {
            u32::MAX << sum
        };
        mask0 & !mask1
    }

    /// [`pair_word`]'s arithmetic on the host, through the instruction's definition.
    fn pair_word_model(w: u32, lo: i32, hi: i32) -> u32 {
        let count = |x: i32| 2 * (x >> 3) + (x & 7).min(2);
        let first = count(lo.clamp(0, 256));
        let end = count((hi + 1).clamp(0, 256));
        let start = (first - 32 * w as i32).max(0);
        let width = (end - 32 * w as i32 - start).max(0);
        bmsk_clamp(start as u32, width as u32)
    }

    /// A pair word has exactly the bits of the elements whose column is inside the
    /// interval, for both words of a 64-element row.
    #[test]
    fn a_pair_word_sets_the_elements_inside_the_interval() {
        for w in 0..2u32 {
            for lo in -20..280 {
                for hi in [lo - 2, lo - 1, lo, lo + 1, lo + 6, lo + 8, lo + 9, lo + 30, lo + 200, 300, -5] {
                    let want = (0..32u32)
                        .filter(|&t| (lo..=hi).contains(&(pair_column(32 * w + t) as i32)))
                        .fold(0u32, |acc, t| acc | 1 << t);
                    assert_eq!(pair_word_model(w, lo, hi), want, "w {w} lo {lo} hi {hi}");
                }
            }
        }
    }

    /// [`range_word`]'s arithmetic on the host, through the instruction's definition.
    fn range_word_model(base: i32, lo: i32, hi: i32) -> u32 {
        let start = (lo - base).max(0);
        let width = (hi + 1 - base - start).max(0);
        bmsk_clamp(start as u32, width as u32)
    }

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Each word has exactly the bits of the columns inside the interval, for intervals
    /// before, across and past the word, empty ones included.
    #[test]
    fn a_range_word_sets_the_columns_inside_the_interval() {
        for base in [0, 5, 32, 96, 1000] {
            for lo in base - 40..base + 70 {
                for hi in [lo - 2, lo - 1, lo, lo + 1, lo + 7, lo + 31, lo + 32, lo + 100, base + 31, base - 1] {
                    let want = (0..32).filter(|&j| (lo..=hi).contains(&(base + j))).fold(0u32, |w, j| w | 1 << j);
                    assert_eq!(range_word_model(base, lo, hi), want, "base {base} lo {lo} hi {hi}");
                }
            }
        }
    }

    /// Key k is in a row's interval exactly when the mask's reference predicate allows it
    /// (and k < seqlen_k), for causal bounds, windows and both, either alignment.
    #[test]
    fn row_intervals_allow_what_the_reference_mask_allows() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let side = |rng: &mut Rng| match rng.below(3) {
            0 => None,
            _ => Some(rng.below(40)),
        };
        let align = |rng: &mut Rng| if rng.below(2) == 0 { Align::TopLeft } else { Align::BottomRight };
        let mut checked = 0;
        for _ in 0..400 {
            let mut spec = Spec::new("row_keys", 64, 4);
            let causal = if rng.below(2) == 0 { Some(align(&mut rng)) } else { None };
            let (left, right) = (side(&mut rng), side(&mut rng));
            let window = (left.is_some() || right.is_some()).then(|| Window { left, right, align: align(&mut rng) });
            spec.mask = Mask { causal, window, predicate: None };
            let Some(keys) = RowKeys::of(&spec) else {
                assert!(spec.mask.is_none());
                continue;
            };
            let pred = spec.mask.to_predicate().expect("a mask");
            let (sq, sk) = (1 + rng.below(70) as i32, 1 + rng.below(70) as i32);
            // Keys and queries up to 3 past their lengths: the transposed interval must
            // exclude both, the row interval the keys (rows past seqlen_q are not masked).
            for q in 0..sq + 3 {
                let (lo, hi) = keys.host(q, sq, sk);
                for k in 0..sk + 3 {
                    let env = Env {
                        b: 0,
                        h: 0,
                        hkv: 0,
                        q,
                        k,
                        score: 0.0,
                        seqlen_q: sq,
                        seqlen_k: sk,
                        q_heads: 4,
                        kv_heads: 4,
                        params: &[],
                        aux: &[],
                    };
                    let allowed = k < sk && eval(&spec, &pred, &env).as_bool();
                    if q < sq {
                        assert_eq!((lo..=hi).contains(&k), allowed, "{:?} sq {sq} sk {sk} q {q} k {k}", spec.mask);
                    }
                    let (qlo, qhi) = keys.host_queries(k, sq, sk);
                    let seen = allowed && q < sq;
                    assert_eq!((qlo..=qhi).contains(&q), seen, "{:?} sq {sq} sk {sk} q {q} k {k} (queries)", spec.mask);
                    checked += 1;
                }
            }
        }
        assert!(checked > 100_000);
    }

    /// Predicates, huge windows and shards keep the per-element test.
    #[test]
    fn only_causal_and_window_masks_are_intervals() {
        let mut spec = Spec::new("row_keys", 64, 4);
        assert_eq!(RowKeys::of(&spec), None);
        spec.mask.window = Some(Window { left: Some(1 << 31), right: None, align: Align::TopLeft });
        assert_eq!(RowKeys::of(&spec), None);
        spec.mask.window = Some(Window { left: Some(4096), right: Some(0), align: Align::TopLeft });
        assert!(RowKeys::of(&spec).is_some());
        // A shard's kernels see global positions through its frame.
        spec.shards = true;
        assert_eq!(RowKeys::of(&spec), None);
        spec.shards = false;
        spec.mask.predicate = Some(attnc_ir::Expr::binary(
            attnc_ir::BinOp::Lt,
            attnc_ir::Expr::var(attnc_ir::Var::K),
            attnc_ir::Expr::int(7),
        ));
        assert_eq!(RowKeys::of(&spec), None);
    }
}
