//! A persistent forward's work tiles (`Config::persistent`): which tile each role of a
//! CTA runs next. The TMA thread takes tiles from a global counter and hands each to the
//! consumer warpgroups through a two-slot ring in shared memory; the tiled grid runs its
//! one tile.

use super::Kernel;
use crate::families::common::abi as cabi;
use crate::families::common::schedule::{emit_section_heads, emit_tile_coords};
use crate::llvm::kb::{Kb, R};
use inkwell::values::IntValue;
use inkwell::IntPredicate;

/// Which side of a persistent CTA's tile ring a role is on.
#[derive(Clone, Copy)]
pub(super) enum TileRole {
    /// The TMA thread: takes tiles from the global counter and hands them over.
    Producer,
    /// A consumer warpgroup: takes each tile from the ring.
    Consumer,
}

/// A persistent CTA's current work tile (`common::schedule`): its m block (already in
/// LPT order), head (the KV head with pack_gqa) and batch entry.
#[derive(Clone, Copy)]
pub(super) struct WorkAt<'ctx> {
    pub(super) m_block: IntValue<'ctx>,
    pub(super) head_idx: IntValue<'ctx>,
    pub(super) z: IntValue<'ctx>,
}

impl<'ctx> Kernel<'_, 'ctx> {
    /// Whether this forward runs persistent (`Config::runs_persistent`).
    pub(super) fn persistent(&self) -> bool {
        self.cfg.runs_persistent(self.spec)
    }

    /// Runs `body` for each of the CTA's work tiles: its own (`None`) in the tiled grid;
    /// in the persistent grid (`common::schedule`'s order: m block fastest, or LPT
    /// sections under a causal mask) tile ctaid.x first, then whichever the producer
    /// takes next from the global counter (nctaid.x + the counter's old value). The
    /// producer hands each tile index to the consumers through a two-slot ring in shared
    /// memory (its own full/empty mbarriers), the last one past the end; the last CTA to
    /// finish taking tiles sets the counters back to 0 for the next launch.
    pub(super) fn for_each_tile(
        &self,
        kb: &mut Kb<'ctx>,
        role: TileRole,
        mut body: impl FnMut(&mut Kb<'ctx>, Option<WorkAt<'ctx>>) -> R<()>,
    ) -> R<()> {
        let Some(work) = self.cfg.smem(self.spec).work else {
            return body(kb, None);
        };
        let spec = self.spec;
        let la = self.args.layout()?;
        let rows = match spec.pack_gqa {
            true => kb.mul(la.seqlen_q, kb.i32c(spec.group_size() as i64), "")?,
            false => la.seqlen_q,
        };
        let num_m = kb.ceil_div(rows, kb.i32c(self.cfg.block_m() as i64), "num_m")?;
        let heads = if spec.pack_gqa { spec.kv_heads } else { spec.q_heads };
        let batch = self.args.int("batch")?;
        let total = kb.mul(kb.mul(num_m, kb.i32c(heads as i64), "")?, batch, "work_tiles")?;
        let lpt = spec.mask.causal.is_some();
        let section = match lpt {
            true => emit_section_heads(
                kb,
                la.seqlen_k,
                i64::from(spec.head_dim_qk + spec.head_dim_v) * 2,
                heads,
                i64::from(self.cfg.lpt_section_mib) << 20,
            )?,
            false => kb.i32c(1),
        };
        let smem = self.smem_base(kb)?;
        let ids = kb.add(smem, kb.i32c(work as i64), "tile_ids")?;
        let full = kb.add(smem, kb.i32c(work as i64 + 8), "tile_full")?;
        let empty = kb.add(smem, kb.i32c(work as i64 + 24), "tile_empty")?;
        // Slot and parity of the tile ring's position `k`.
        let at = |kb: &Kb<'ctx>, k: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
            let slot = kb.and(k, kb.i32c(1), "")?;
            let parity = kb.and(kb.lshr(k, kb.i32c(1), "")?, kb.i32c(1), "")?;
            Ok((kb.mul(slot, kb.i32c(8), "")?, parity))
        };
        let mut run = |kb: &mut Kb<'ctx>, t: IntValue<'ctx>| -> R<()> {
            let wt = emit_tile_coords(kb, t, num_m, heads, lpt, section, la.seqlen_q, la.seqlen_k)?;
            body(kb, Some(WorkAt { m_block: wt.m, head_idx: wt.h, z: wt.b }))
        };
        let k = kb.slot_i32("tile_ring_pos", kb.i32c(0))?;
        // The producer's first tile is its CTA's; a consumer's comes through the ring.
        let tile = kb.slot_i32("work_tile", kb.i32c(0))?;
        let more = |kb: &mut Kb<'ctx>| {
            let t = kb.get_i(tile, "")?;
            kb.icmp(IntPredicate::SLT, t, total, "")
        };
        match role {
            TileRole::Producer => {
                let counters = self.args.int(cabi::TILE_COUNTERS_PARAM)?;
                let ctas = kb.sreg("nctaid.x", "")?;
                kb.set(tile, kb.sreg("ctaid.x", "")?)?;
                // Hands tile `t` to the consumers at ring position `k`.
                let publish = |kb: &mut Kb<'ctx>, t: IntValue<'ctx>| -> R<()> {
                    let kk = kb.get_i(k, "")?;
                    let (off, parity) = at(kb, kk)?;
                    kb.mbar_wait(kb.add(empty, off, "")?, kb.xor(parity, kb.i32c(1), "")?)?;
                    kb.st_shared_b32(kb.add(ids, kb.lshr(off, kb.i32c(1), "")?, "")?, t)?;
                    kb.mbar_arrive(kb.add(full, off, "")?)?;
                    kb.set(k, kb.add(kk, kb.i32c(1), "")?)
                };
                kb.while_loop("work_tiles", more, |kb| {
                    let t = kb.get_i(tile, "work_tile")?;
                    publish(kb, t)?;
                    let taken = match self.cfg.early_tile_fetch {
                        // Relaxed: an acquire would hold the tile's TMA loads behind
                        // the atomic's round trip. The counters' reset orders itself
                        // through `done` (acq_rel) below.
                        true => {
                            let taken = kb.atom_add_relaxed_gpu_u32(counters, kb.i32c(1), "tile_counter")?;
                            run(kb, t)?;
                            taken
                        }
                        false => {
                            run(kb, t)?;
                            kb.atom_add_acq_rel_gpu_u32(counters, kb.i32c(1), "tile_counter")?
                        }
                    };
                    kb.set(tile, kb.add(ctas, taken, "next_tile")?)
                })?;
                // Past the end: the consumers stop at it.
                let t = kb.get_i(tile, "")?;
                publish(kb, t)?;
                let done_addr = kb.add(counters, kb.i64c(4), "")?;
                let done = kb.atom_add_acq_rel_gpu_u32(done_addr, kb.i32c(1), "ctas_done")?;
                let last = kb.icmp(IntPredicate::EQ, done, kb.sub(ctas, kb.i32c(1), "")?, "")?;
                kb.if_then(last, "reset_tile_counters", |kb| {
                    kb.st_relaxed_gpu_u32(counters, kb.i32c(0))?;
                    kb.st_relaxed_gpu_u32(done_addr, kb.i32c(0))
                })
            }
            TileRole::Consumer => {
                let lane = kb.and(kb.sreg("tid.x", "")?, kb.i32c(31), "")?;
                // Takes the tile at ring position `k`: every lane reads it, then the warp
                // frees the slot. Shuffled from lane 0 so ptxas sees it warp-uniform (a
                // loop bound it thinks divergent serializes the wgmmas, C7519).
                let receive = |kb: &mut Kb<'ctx>| -> R<()> {
                    let kk = kb.get_i(k, "")?;
                    let (off, parity) = at(kb, kk)?;
                    kb.mbar_wait(kb.add(full, off, "")?, parity)?;
                    let t = kb.ld_shared_b32(kb.add(ids, kb.lshr(off, kb.i32c(1), "")?, "")?, "")?;
                    kb.warp_sync()?;
                    kb.mbar_arrive_lane0(kb.add(empty, off, "")?, lane)?;
                    kb.set(k, kb.add(kk, kb.i32c(1), "")?)?;
                    kb.set(tile, kb.shfl_idx_i32(t, kb.i32c(0), "work_tile")?)
                };
                receive(kb)?;
                kb.while_loop("work_tiles", more, |kb| {
                    let t = kb.get_i(tile, "")?;
                    run(kb, t)?;
                    receive(kb)
                })
            }
        }
    }
}
