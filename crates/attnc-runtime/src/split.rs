//! The split-KV heuristic: how many CTAs share one (batch, head, m-block)'s KV sequence.
//!
//! FlashAttention's rule (flash-attention `num_splits_heuristic`), plus a minimum of KV
//! tiles per split:
//! - a launch that already has ≥ 80% of a wave of CTAs without splitting gets 1 split
//!   (splitting only adds the combine pass);
//! - otherwise, for each candidate `s` in `1..=max` (`max` = min(128, SMs, KV tiles / 4)),
//!   the wave efficiency is `w / ceil(w)` with `w = ctas · s / SMs`; the smallest `s`
//!   within 85% of the best efficiency wins. Candidates that give the same tiles per
//!   split as `s − 1` are skipped (they only add combine work).

use serde::Serialize;

/// The most splits the runtime launches (the combine kernel loops over them).
pub const MAX_SPLITS: u32 = 128;
/// Each split gets at least this many KV tiles (fewer and the partials cost more than
/// the parallelism brings). Two, from an H100 sweep of forced split counts over the
/// protocol's decode shapes: batch 1 × 4k keys ran fastest at 2 tiles per split, and no
/// shape was fastest below that (`docs/hopper.md`).
pub const MIN_TILES_PER_SPLIT: u32 = 2;

/// Why a number of splits was chosen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitChoice {
    pub num_splits: u32,
    pub reason: String,
}

/// The number of splits for a launch of `ctas` CTAs per split (grid x · y · batch), on a
/// device with `sm_count` CTA slots (SMs × resident CTAs per SM), where each CTA walks
/// `kv_tiles` KV tiles.
pub fn auto_num_splits(ctas: u64, sm_count: u32, kv_tiles: u32) -> SplitChoice {
    let sms = u64::from(sm_count.max(1));
    if ctas == 0 {
        return SplitChoice { num_splits: 1, reason: "auto: empty launch".into() };
    }
    if ctas * 10 >= sms * 8 {
        return SplitChoice {
            num_splits: 1,
            reason: format!(
                "auto: {ctas} CTAs already fill {:.0}% of {sms} CTA slots",
                100.0 * ctas as f64 / sms as f64
            ),
        };
    }
    let by_tiles = (kv_tiles / MIN_TILES_PER_SPLIT).max(1);
    let max = MAX_SPLITS.min(sm_count.max(1)).min(by_tiles);
    if max <= 1 {
        return SplitChoice {
            num_splits: 1,
            reason: format!("auto: {kv_tiles} KV tiles, fewer than 2 x {MIN_TILES_PER_SPLIT} per split"),
        };
    }
    let eligible = |s: u32| s == 1 || kv_tiles.div_ceil(s) != kv_tiles.div_ceil(s - 1);
    let eff: Vec<f64> = (1..=max)
        .map(|s| {
            if !eligible(s) {
                return 0.0;
            }
            let waves = (ctas * u64::from(s)) as f64 / sms as f64;
            waves / waves.ceil()
        })
        .collect();
    let best = eff.iter().cloned().fold(0.0, f64::max);
    let s = (1..=max).find(|&s| eligible(s) && eff[(s - 1) as usize] >= 0.85 * best).unwrap_or(1);
    SplitChoice {
        num_splits: s,
        reason: format!(
            "auto: {ctas} CTAs on {sms} CTA slots, {kv_tiles} KV tiles -> {s} splits ({:.0}% wave efficiency)",
            100.0 * eff[(s - 1) as usize]
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_launches_do_not_split() {
        // Prefill: batch 4 x 32 heads x 16 m-blocks.
        assert_eq!(auto_num_splits(4 * 32 * 16, 132, 64).num_splits, 1);
        assert_eq!(auto_num_splits(106, 132, 1000).num_splits, 1); // >= 80% of a wave
        assert_eq!(auto_num_splits(0, 132, 1000).num_splits, 1);
    }

    #[test]
    fn decode_fills_the_machine() {
        // Decode, batch 1, 8 KV heads (GQA packed), 32k keys in 64-key tiles.
        let c = auto_num_splits(8, 132, 512);
        assert!(c.num_splits >= 12 && c.num_splits <= 16, "{c:?}");
        assert!(8 * c.num_splits as u64 <= 132 + 8);
        // Batch 8 x 8 heads = 64 CTAs: 2 splits give one ~97% wave.
        assert_eq!(auto_num_splits(64, 132, 512).num_splits, 2);
        // One CTA, long KV: capped by the SM count.
        let c = auto_num_splits(1, 132, 100_000);
        assert!(c.num_splits <= MAX_SPLITS && c.num_splits >= 100, "{c:?}");
        assert!(c.reason.starts_with("auto:"));
    }

    #[test]
    fn short_kv_does_not_split() {
        assert_eq!(auto_num_splits(8, 132, 1).num_splits, 1);
        assert_eq!(auto_num_splits(8, 132, 3).num_splits, 1);
        // 16 tiles: at most 8 splits of 2 tiles.
        assert!(auto_num_splits(8, 132, 16).num_splits <= 8);
        // Decode, batch 1 x 8 KV heads over 4k keys in 128-key tiles: 16 splits of 2 tiles
        // (the H100 sweep's fastest, 14.9 us against 19.4 at 7 splits of 4-5 tiles).
        assert_eq!(auto_num_splits(8, 132, 32).num_splits, 16);
    }

    #[test]
    fn bounds_hold_everywhere() {
        for sms in [1u32, 16, 108, 132, 148] {
            for ctas in [1u64, 2, 3, 7, 8, 31, 64, 100, 1000] {
                for tiles in [0u32, 1, 3, 4, 8, 9, 63, 64, 65, 512, 4096, 1 << 20] {
                    let c = auto_num_splits(ctas, sms, tiles);
                    let s = c.num_splits;
                    assert!((1..=MAX_SPLITS).contains(&s) && s <= sms.max(1), "{ctas} {sms} {tiles}: {c:?}");
                    assert!(s == 1 || tiles / s >= MIN_TILES_PER_SPLIT, "{ctas} {sms} {tiles}: {c:?}");
                    if ctas * 10 >= u64::from(sms) * 8 {
                        assert_eq!(s, 1);
                    }
                }
            }
        }
    }
}
