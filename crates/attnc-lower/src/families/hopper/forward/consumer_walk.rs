//! Which key tiles each consumer warpgroup of a CTA walks: consumers whose rows all lie
//! past the sequence's end sit the walk out, and under a causal or window mask each ends
//! at its own rows' last key tile and drains the CTA's remaining slots.

use super::super::config::{RingBar, ROWS_PER_CONSUMER};
use super::{Cta, Kernel, StepEnv};
use crate::llvm::kb::{Kb, Slot, R};
use crate::variant::layout::row_tile_ranges;
use crate::variant::tiles::KeyTiles;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

impl<'ctx> Kernel<'_, 'ctx> {
    /// Whether consumers with no valid rows sit the key walk out (`Config::idle_consumers`).
    pub(super) fn idle_consumers(&self) -> bool {
        self.cfg.idle_consumers && self.cfg.consumers > 1 && !self.pingpong()
    }

    /// Whether the empty barriers count only the CTA's working consumers: a persistent
    /// CTA's count is fixed for its life, so its idle consumers drain instead.
    pub(super) fn counts_working_consumers(&self) -> bool {
        self.idle_consumers() && !self.persistent()
    }

    /// Whether each consumer ends its walk at its own rows' last key tile
    /// (`Config::own_walk_end`): only where a mask makes tiles empty and the walk is
    /// over tile indices (a block mask's list already holds the CTA's tiles).
    pub(super) fn own_walk_end(&self, tiles: &KeyTiles<'_, 'ctx>) -> bool {
        self.cfg.own_walk_end
            && self.cfg.consumers > 1
            && !self.pingpong()
            && !self.spec.mask.is_none()
            && tiles.list.is_none()
    }

    /// One past the last key tile in `[begin, end)` that this consumer's rows see (the
    /// CTA's classification narrowed to its 64 rows; clamped to a valid row for a
    /// consumer past the end, which walks nothing anyway).
    pub(super) fn consumer_walk_end(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        tiles: &KeyTiles<'_, 'ctx>,
        consumer: IntValue<'ctx>,
        (begin, end): (IntValue<'ctx>, IntValue<'ctx>),
    ) -> R<IntValue<'ctx>> {
        let per = ROWS_PER_CONSUMER as i64;
        let last_valid = kb.sub(cta.rows_total, kb.i32c(1), "")?;
        let first = kb.smin(kb.add(cta.row0, kb.mul(consumer, kb.i32c(per), "")?, "")?, last_valid, "")?;
        let last = kb.smin(kb.add(first, kb.i32c(per - 1), "")?, last_valid, "")?;
        let (q, h) =
            row_tile_ranges(kb, self.spec.pack_gqa, self.spec.group_size() as i64, first, last, cta.head_idx, cta.hkv)?;
        let mine = KeyTiles { q, h, list: None, ..*tiles };
        let own = mine.prev_nonempty(kb, begin, end, "")?;
        // The same in every lane, but ptxas must see it: a loop bound it thinks divergent
        // around the GEMMs serializes every wgmma (C7519).
        kb.shfl_idx_i32(own, kb.i32c(0), "own_walk_end")
    }

    /// Consumers with at least one valid row: ceil((rows_total - row0) / 64), at most
    /// `consumers` (the CTA has a valid row, so at least 1).
    pub(super) fn working_consumers(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>) -> R<IntValue<'ctx>> {
        let rows = kb.sub(cta.rows_total, cta.row0, "")?;
        let per = ROWS_PER_CONSUMER as i64;
        let n = kb.udiv(kb.add(rows, kb.i32c(per - 1), "")?, kb.i32c(per), "")?;
        kb.smin(n, kb.i32c(self.cfg.consumers as i64), "working_consumers")
    }

    /// The CTA's tiles after this consumer's own walk: wait for each slot to fill (so
    /// the arrival counts toward its tile's phase, not an earlier one that a slower
    /// consumer still holds) and release it. Before the epilogue: the fused combine's
    /// barrier would otherwise hold this consumer while the others wait for the slots.
    pub(super) fn drain(
        &self,
        kb: &mut Kb<'ctx>,
        env: &StepEnv<'_, 'ctx>,
        tiles: &KeyTiles<'_, 'ctx>,
        (pos, tile): (Slot<'ctx>, Slot<'ctx>),
        end: IntValue<'ctx>,
    ) -> R<()> {
        let (cta, ltid) = (env.cta, env.ltid);
        kb.section("drain: release the slots of the CTA's tiles past this consumer's rows")?;
        kb.while_loop(
            "drain",
            |kb| {
                let t = kb.get_i(tile, "")?;
                kb.icmp(IntPredicate::SLT, t, end, "")
            },
            |kb| {
                let p = kb.get_i(pos, "drain_pos")?;
                let (slot, parity) = self.ring(kb, p)?;
                for (full, empty) in [(RingBar::FullK, RingBar::EmptyK), (RingBar::FullV, RingBar::EmptyV)] {
                    self.wait_full(kb, cta, full, slot, parity)?;
                    self.release(kb, cta, empty, slot, ltid)?;
                }
                kb.set(pos, kb.add(p, kb.i32c(1), "")?)?;
                let t = kb.get_i(tile, "")?;
                let n = tiles.next_nonempty(kb, kb.add(t, kb.i32c(1), "")?, end, "drain_next")?;
                kb.set(tile, n)
            },
        )
    }
}
