//! Tile shapes, warp roles, register budgets and the shared-memory layout of the hopper
//! forward kernel.
//!
//! A CTA is one producer warpgroup (one thread issues the K/V TMA loads) and
//! `consumers` warpgroups of 64 query rows each (`wgmma` is m64). The K/V ring has
//! `stages` slots; K and V of a slot have their own full/empty mbarriers so a consumer
//! can release K as soon as `S = Q·Kᵀ` has read it, before `P·V` is done with V.

use attnc_ir::{KvLayout, QueryRows, Spec};

/// The tuning override from `ATTNC_HOPPER_TUNE` (dev sweeps: `stages=3,pingpong=0`).
/// It is part of the runtime's cache key, so tuned and default builds never mix.
pub fn tune_override() -> Option<String> {
    std::env::var("ATTNC_HOPPER_TUNE").ok().filter(|s| !s.trim().is_empty())
}

/// The backward's tuning override from `ATTNC_HOPPER_BWD_TUNE` (dev sweeps:
/// `producer_regs=40,consumer_regs=232`); part of the runtime's cache key too.
pub fn bwd_tune_override() -> Option<String> {
    std::env::var("ATTNC_HOPPER_BWD_TUNE").ok().filter(|s| !s.trim().is_empty())
}

/// Rows of Q per consumer warpgroup (the M of `wgmma.m64nNk16`).
pub const ROWS_PER_CONSUMER: u32 = 64;
/// Elements of the head dimension per TMA box and per 128-byte swizzle row.
pub const BOX_COLS: u32 = 64;
/// Bytes of one swizzled row (a `BOX_COLS` slice of a K/V/Q row).
pub const ROW_BYTES: u32 = 128;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Consumer warpgroups (block_m = 64 · consumers).
    pub consumers: u32,
    /// Keys per tile (the N of the S GEMM, the K of the P·V GEMM).
    pub block_n: u32,
    /// K/V ring slots.
    pub stages: u32,
    /// Intra-warpgroup overlap: issue the next tile's `S = Q·Kᵀ` and this tile's
    /// `O += P·V` together and run the softmax while both are in flight.
    pub overlap: bool,
    /// Inter-warpgroup ping-pong: consumer warpgroups take turns issuing their GEMMs
    /// (named barriers), so one's softmax runs under the other's GEMMs.
    pub pingpong: bool,
    /// ptxas scheduling aids (docs/hopper.md, "Keeping the softmax under P·V"); on by
    /// default, switchable for measurement: a real use of the in-flight P registers
    /// after the P·V wait, the rescale factor tied to the finished row sum, and a
    /// masked and an unmasked copy of each step instead of a branch inside it.
    pub keep_alive: bool,
    pub late_alpha: bool,
    pub split_mask: bool,
    /// The consumer index made warp-uniform by a shuffle from lane 0: ptxas then builds
    /// Q's wgmma descriptors in uniform registers instead of moving them there for each
    /// GEMM (ncu at d64: 8 `R2UR` per consumer warp and key tile; FA4 has none).
    pub uniform_consumer: bool,
    /// A consumer warpgroup whose 64 rows all lie past the sequence's end (the last query
    /// tile of a sequence that is not a multiple of `block_m`) skips Q, the key walk and
    /// its GEMMs: the empty barriers count only the CTA's working consumers. Without it
    /// the idle rows cost tensor-core time like valid ones (at seqlen 1k, 192-row tiles,
    /// two thirds of the last tile). Not with ping-pong, whose turns need both consumers.
    pub idle_consumers: bool,
    /// Under a causal or window mask, each consumer ends its own walk after the last key
    /// tile its 64 rows see (the CTA's last tiles are the diagonal of its lowest rows) and
    /// only waits for and releases the slots of the CTA's remaining tiles: with 192-row
    /// tiles and 128-key tiles the first consumers skipped 1-2 fully masked tiles' GEMMs
    /// per CTA. Not with ping-pong (its turns need every consumer's steps).
    pub own_walk_end: bool,
    /// The steady-state loop unrolled by two (`Kb::while_loop_twice`): P of one step is
    /// in flight as the P·V operand while the next step's softmax builds its successor,
    /// and with one loop body ptxas moves the new P into the operand registers at every
    /// back edge (ncu at d64: 34 `IMAD.MOV` per consumer warp and key tile).
    pub unroll_steps: bool,
    /// A persistent forward (`Grid::Persistent`): each CTA walks work tiles (m block,
    /// head, batch entry; `common::schedule`, LPT order under a causal mask) that its
    /// producer takes from a global counter as it goes (a static stride let the CTAs
    /// drift apart and lost the hardware order's L2 reuse), the ring carried from one
    /// tile to the next, so the producer loads the next tile's K/V while the consumers
    /// finish the last one and a CTA's setup is paid once per SM. Contiguous and varlen
    /// K/V without split-KV or ping-pong (`Config::runs_persistent`). The default under
    /// a causal mask and for plain attention with `d_v ≤ 128`.
    pub persistent: bool,
    /// The persistent producer takes its next tile from the counter (a relaxed atomic)
    /// before it issues the current tile's loads, the round trip under them, instead of
    /// after (acq_rel). H100, 2026-11-27 (docs/results/2026-11-27-h100-early-tile-fetch/):
    /// −1..−3% at 1k–2k, gains only at non-causal d128 4k–8k; off.
    pub early_tile_fetch: bool,
    /// A partial tile's mask is evaluated into bit words while its `S = Q·Kᵀ` is in
    /// flight, and the softmax only tests bits: a mask over aux tensors has its loads
    /// under the GEMM and their values dead before S arrives (at 128-key tiles, applied
    /// after S the 32 column reads per thread spilled 88 bytes); a causal or window mask
    /// is two bounds per row and a bit range per word (`variant::row_keys`).
    pub mask_bits: bool,
    /// A never-executed shared store of each row's rescale factor (it depends on the row
    /// sum, so on every exponential) just above the P·V wait. ptxas otherwise hoists that
    /// wait to the start of the softmax (it then packs the new P into the in-flight P's
    /// registers), and the exponentials run after P·V instead of under it; a memory
    /// operation is something it keeps the wait below.
    pub pin_pv_wait: bool,
    /// Diagnostics only (wrong results): skip the softmax, P = S, to time the GEMMs and
    /// the pipeline alone. Never set by `for_spec`; only `ATTNC_HOPPER_TUNE=diag_no_softmax=1`.
    pub diag_no_softmax: bool,
    /// Fraction of each row's exponentials computed by the FMA-pipe emulation when the
    /// spec leaves it to the family (its `exp2_emulation` is 0): FA4's remedy for a
    /// MUFU-bound softmax. The emulation's error is that of `ex2.approx` or smaller
    /// (docs/results/2026-11-22-blackwell-exp2-emulation-error.md).
    pub exp2_emulation: f64,
    /// `setmaxnreg` budgets: the producer warpgroup lowers to `producer_regs`, the
    /// consumers raise to `consumer_regs` (the pool is 64K registers per CTA).
    pub producer_regs: u32,
    pub consumer_regs: u32,
    /// K/V arrive by a cp.async gather from producer warps (paged KV of any page size,
    /// rows past the sequence zero-filled) instead of TMA: paged KV whose pages TMA
    /// boxes cannot follow.
    pub gather: bool,
    /// The gather's row loop kept a loop (`.pragma "nounroll"`) instead of the eight
    /// copies ptxas unrolls: less code, but each round's shuffle latency in series.
    pub gather_rolled: bool,
    /// The four gather warps run one copy of the producer code, each taking its tensor
    /// and half from its warp index (same head dims for K and V), instead of a copy each:
    /// with four copies the producers missed the instruction cache on short walks (ncu,
    /// page 1 b1 x 4k: a third of their stall samples `no_inst`,
    /// docs/results/2026-11-28-h100-decode-page1-ncu/); one copy is shared in it.
    pub gather_shared: bool,
    /// Which threads fence the split partials against the fused combine's count.
    pub merge_fences: crate::families::common::combine::MergeFences,
    /// The persistent forward's LPT order (causal): heads per section are those whose
    /// K and V fit this many MiB (`common::schedule`; FlashAttention uses 32). Fewer heads
    /// at a time keep more of the running tiles on each head's K/V in the H100's L2.
    pub lpt_section_mib: u32,
}

/// Byte offsets in (1024-byte aligned) dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemLayout {
    /// Q of consumer `c` at `q + c · q_per_consumer`.
    pub q: u32,
    pub q_per_consumer: u32,
    /// K slot `s` at `k + s · k_per_stage`; V likewise.
    pub k: u32,
    pub k_per_stage: u32,
    pub v: u32,
    pub v_per_stage: u32,
    /// mbarriers: full_k[s], full_v[s], empty_k[s], empty_v[s] (8 bytes each).
    pub bars: u32,
    /// Paged K/V by TMA: the mbarrier the tail tile's V lands on before the producer
    /// zeroes its rows past seqlen_k (`None` otherwise).
    pub tail_v: Option<u32>,
    /// A persistent forward's tile ring: two tile indices (u32, 8 bytes), then
    /// tile_full[2] and tile_empty[2] (`None` for the tiled grid).
    pub work: Option<u32>,
    /// Bytes used from the aligned base.
    pub used: u32,
    /// Bytes to request at launch (`used` + alignment slack).
    pub request: u32,
}

/// Which ring mbarrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingBar {
    FullK,
    FullV,
    EmptyK,
    EmptyV,
}

impl Config {
    /// The configuration for a spec (the first measured choices; see docs/hopper.md).
    pub fn for_spec(spec: &Spec) -> Config {
        // Measured on the H100 (docs/results/2026-11-22-h100-hopper-ptxas-sweep.md):
        // ping-pong pays at d = 64 (460 vs 439 TFLOP/s at 8k) and costs at d = 128 (595
        // vs 661), where one warpgroup's softmax is already shorter than the other's GEMMs.
        let one_tile = spec.query_rows == QueryRows::OneTile;
        let mask_reads_aux = spec.mask.to_predicate().is_some_and(|p| p.uses_aux());
        let score_mod_reads_aux = spec.score_mod.as_ref().is_some_and(|m| m.uses_aux());
        // 64-key tiles where 128 spills (ptxas, 240 registers): d_v > 128 (O alone
        // is d_v/2 registers per thread) and score modifications that read aux
        // tensors (a read per score). Aux reads of the mask alone go to mask bits.
        let block_n = if one_tile || spec.head_dim_v > 128 || score_mod_reads_aux { 64 } else { 128 };
        // Paged KV: TMA boxes where they can follow the pages (`common::paged`); other
        // page sizes (1, or pages that neither hold whole tiles nor split a tile into
        // swizzle atoms) by producer warps that gather rows through the block table with
        // cp.async (its address arithmetic needs more than 24 registers).
        let gather = Self::gathers(spec, block_n);
        // d = 64: three consumer warpgroups (192 rows, 160 registers each). With a causal
        // mask they measured 473 vs 410 TFLOP/s at 8k (2026-11-22); without one, +8–16% at
        // 2k–16k with ptxas 13.5 (506.7 vs 437.6 at 8k, both defaults of the same run
        // around it: docs/results/2026-11-24-h100-d64-configs). Not beside the gather
        // producer, whose 56 registers leave no pool for three consumers of 160.
        let three = spec.head_dim_qk <= 64 && !gather;
        // Plain attention: no mask and no score modification.
        let plain = spec.mask.is_none() && spec.score_mod.is_none();
        // Decode (one query tile, TMA loads): a second consumer would hold no live row and
        // take turns at the tensor cores; one consumer with 64-key tiles was the fastest
        // of five configurations at every contiguous decode shape of the protocol, and at
        // batch 1 of the paged ones (docs/results/2026-11-24-h100-decode-round2/
        // 3-decode-configs); the runtime picks this twin for paged launches only at small
        // batch, where the gather measured faster that way too.
        let cfg = Config {
            consumers: if one_tile {
                1
            } else if three {
                3
            } else {
                2
            },
            block_n,
            stages: 2,
            overlap: true,
            pingpong: spec.head_dim_qk <= 64,
            keep_alive: true,
            late_alpha: true,
            // One step with the mask under a branch: as fast as a masked and an unmasked
            // copy of the step at d128 (sweep, ptxas 13.5; H100, 2026-11-27, causal, ALiBi,
            // softcap within ±2%) at 60% of the PTX and of ptxas's time (0.26 vs 0.43 s).
            // At d64 causal the copies pay: +2-7% at 1k-16k, four rounds
            // (docs/results/2026-11-27-h100-split-steps/); without a mask they cost 3-9%.
            // Windows (the same row bounds) not measured: causal only.
            split_mask: three && !one_tile && spec.mask.causal.is_some(),
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-fwd-loop-schedule/): d64
            // non-causal +3-10%, d128 within noise, but d64 causal -8..-12% at 4k-16k (the
            // mask's row positions then derive from the shuffled index): maskless only.
            uniform_consumer: spec.mask.is_none(),
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-fwd-idle-consumers/): d64's
            // 192-row tiles leave 64 or 128 rows idle at power-of-two lengths: non-causal 1k
            // +6.5%, causal 1k +9.5%, 2k-4k +4.5%, 8k +3%; decode unchanged. At d128 (128-row
            // tiles, idle rows only at odd lengths) the vote and branch cost 1-2% at 2k-4k.
            idle_consumers: three && !one_tile,
            own_walk_end: three && !one_tile,
            unroll_steps: false,
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-fwd-persistent/4-dynamic/):
            // causal d64 +9.5% at 1k-2k, +3% at 4k, d128 +7.5% / +4.5% / +3%, 8k-16k within
            // noise; non-causal d64 -5..-9% at 4k-16k then. With the P.V wait pinned
            // (docs/results/2026-11-27-h100-fwd-pv-wait/5-persistent/) plain attention
            // gains too: d64 +4-6% at 1k-2k, d128 +3-4% / +1-2% at 1k / 2k, 8k-16k within
            // noise (head dims above 128 not measured).
            persistent: spec.mask.causal.is_some() || (plain && spec.head_dim_v <= 128),
            early_tile_fetch: false,
            // Causal and window masks as two bounds per row and a bit range per word
            // (`variant::row_keys`): the partial tile's mask 271 -> 104 SASS instructions
            // between the waits at d64 causal; H100, 2026-11-27
            // (docs/results/2026-11-27-h100-fwd-row-keys/): d64 causal 1k +2%, the rest within noise.
            mask_bits: mask_reads_aux || crate::variant::row_keys::RowKeys::of(spec).is_some(),
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-fwd-pv-wait/): without a mask
            // or score mod d64 +3-7%, d128 +0-7% at every length; causal d128 16k -4..-10%,
            // causal + softcap / ALiBi 3-6% slower: plain attention only.
            pin_pv_wait: plain,
            diag_no_softmax: false,
            exp2_emulation: 0.0,
            // Measured with ptxas 13.5 (0 spills): the gather producer with causal, GQA
            // packing and split-KV tile walks needs 56; a 256-wide O needs 232 per consumer.
            producer_regs: match (gather, spec.head_dim_v > 128) {
                (false, _) => 24,
                (true, false) => 56,
                (true, true) => 40,
            },
            // One consumer leaves the pool room for 248 even beside the gather producer
            // (the paged d256 twin spills 40 bytes at 240).
            consumer_regs: match (three && !one_tile, gather && !one_tile, spec.head_dim_v > 128) {
                _ if one_tile => 248,
                (true, _, _) => 160,
                (false, true, false) => 224,
                (false, true, true) => 232,
                (false, false, _) => 240,
            },
            gather,
            // H100, 2026-11-28 (docs/results/2026-11-28-h100-gather-shared/): page-1 decode
            // GPU time b1 x 4k -8%, b8/b64 x 4k -1..-1.5%, 32k within 0.3%; rolled, the row
            // loop gains at b1 x 4k but loses 1-4% on the longer walks.
            gather_rolled: false,
            gather_shared: gather && spec.head_dim_qk == spec.head_dim_v,
            // H100, 2026-11-28 (docs/results/2026-11-28-h100-merge-fences/): both sides by
            // the counting thread, GPU time b1 x 4k -6% at every page size, b1 x 32k and
            // batch 8 -0.5..-2%, batch 64 unchanged.
            merge_fences: crate::families::common::combine::MergeFences::ByCounter,
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-lpt-sections/): 8 MiB
            // sections against FlashAttention's 32, six rounds each: d128 causal 4k / 8k /
            // 16k +1.2 / +1.2 / +3.4% (median), d64 within ±0.5%; 16, 4 and 2 no better.
            lpt_section_mib: 8,
        };
        // Paged K/V that arrives in pieces (the gather's rows, or one TMA box per page):
        // a third ring slot, where it fits. H100, 2026-11-27
        // (docs/results/2026-11-27-h100-decode-stages/): page 1 b1 x 32k -5%, b8/b64 x 32k
        // -1.5..-2% GPU time, page 16 -2..-2.5% at every shape but b1 x 4k; whole-tile
        // boxes (page 128) and contiguous K/V 0..+2% slower with it, 4 slots slower everywhere.
        // Measured at d128; d64's gather producer spilled 84 bytes with it (ptxas 13.5).
        let in_pieces = spec.head_dim_qk == 128 && (gather || cfg.paged_boxes(spec).is_some_and(|b| b.count() > 1));
        let three_slots = Config { stages: 3, ..cfg.clone() };
        let cfg = match in_pieces && three_slots.smem(spec).request <= crate::Arch::Sm90a.max_smem_per_block() {
            true => three_slots,
            false => cfg,
        };
        match tune_override() {
            Some(t) => cfg.tuned(&t),
            None => cfg,
        }
    }

    /// This configuration with `key=value,...` overrides applied (unknown keys and bad
    /// values are ignored): `block_n`, `stages`, `pingpong`, `producer_regs`,
    /// `consumer_regs`, `lpt_section_mib` and the others matched below.
    pub fn tuned(mut self, text: &str) -> Config {
        for kv in text.split(',') {
            let Some((k, v)) = kv.split_once('=') else { continue };
            let Ok(n) = v.trim().parse::<u32>() else { continue };
            match k.trim() {
                "block_n" => self.block_n = n,
                "consumers" => self.consumers = n,
                "gather" => self.gather = n != 0,
                "gather_rolled" => self.gather_rolled = n != 0,
                "gather_shared" => self.gather_shared = n != 0,
                "merge_fences" => {
                    use crate::families::common::combine::MergeFences;
                    self.merge_fences = match n {
                        0 => MergeFences::EveryThread,
                        1 => MergeFences::ReleaseByCounter,
                        _ => MergeFences::ByCounter,
                    }
                }
                "stages" => self.stages = n,
                "pingpong" => self.pingpong = n != 0,
                "keep_alive" => self.keep_alive = n != 0,
                "late_alpha" => self.late_alpha = n != 0,
                "split_mask" => self.split_mask = n != 0,
                "uniform_consumer" => self.uniform_consumer = n != 0,
                "idle_consumers" => self.idle_consumers = n != 0,
                "own_walk_end" => self.own_walk_end = n != 0,
                "unroll_steps" => self.unroll_steps = n != 0,
                "persistent" => self.persistent = n != 0,
                "early_tile_fetch" => self.early_tile_fetch = n != 0,
                "mask_bits" => self.mask_bits = n != 0,
                "pin_pv_wait" => self.pin_pv_wait = n != 0,
                "diag_no_softmax" => self.diag_no_softmax = n != 0,
                "emulate_pct" => self.exp2_emulation = f64::from(n.min(100)) / 100.0,
                "producer_regs" => self.producer_regs = n,
                "consumer_regs" => self.consumer_regs = n,
                "lpt_section_mib" => self.lpt_section_mib = n.clamp(1, 1024),
                _ => {}
            }
        }
        self
    }

    /// Whether paged K/V of `spec` in `block_n`-key tiles needs the cp.async gather
    /// producer (TMA boxes cannot follow its pages).
    pub fn gathers(spec: &Spec, block_n: u32) -> bool {
        matches!(spec.kv_layout, KvLayout::Paged { page_size }
            if !crate::families::common::paged::tma_pageable(page_size, block_n))
    }

    /// How TMA loads a key tile of paged K/V, or `None` (contiguous, varlen, gathered).
    pub fn paged_boxes(&self, spec: &Spec) -> Option<crate::families::common::paged::PagedBoxes> {
        match spec.kv_layout {
            KvLayout::Paged { page_size } if !self.gather => {
                crate::families::common::paged::PagedBoxes::of(page_size, self.block_n)
            }
            _ => None,
        }
    }

    /// Whether `spec`'s forward runs persistent with this configuration: asked for, and
    /// contiguous or varlen K/V (the paged producers keep per-CTA block-table state), no
    /// split-KV (the fused combine counts CTAs), no ping-pong (its turns pair steps).
    pub fn runs_persistent(&self, spec: &Spec) -> bool {
        self.persistent
            && matches!(spec.kv_layout, KvLayout::Contiguous | KvLayout::Varlen)
            && spec.split_kv == attnc_ir::SplitKv::None
            && !(self.pingpong && self.consumers == 2)
    }

    pub fn block_m(&self) -> u32 {
        ROWS_PER_CONSUMER * self.consumers
    }

    pub fn threads(&self) -> u32 {
        128 * (1 + self.consumers)
    }

    /// Column blocks (TMA boxes / swizzle rows) of a row of `d` elements.
    pub fn col_blocks(d: u32) -> u32 {
        d.div_ceil(BOX_COLS)
    }

    pub fn smem(&self, spec: &Spec) -> SmemLayout {
        let align = |x: u32| x.div_ceil(1024) * 1024;
        let q_per_consumer = Self::col_blocks(spec.head_dim_qk) * ROWS_PER_CONSUMER * ROW_BYTES;
        let q = 0;
        let k = align(q + q_per_consumer * self.consumers);
        let k_per_stage = Self::col_blocks(spec.head_dim_qk) * self.block_n * ROW_BYTES;
        let v = align(k + k_per_stage * self.stages);
        let v_per_stage = Self::col_blocks(spec.head_dim_v) * self.block_n * ROW_BYTES;
        let bars = v + v_per_stage * self.stages;
        let ring_end = bars + 8 * 4 * self.stages;
        let tail_v = self.paged_boxes(spec).map(|_| ring_end);
        let used = ring_end + if tail_v.is_some() { 8 } else { 0 };
        let work = self.runs_persistent(spec).then_some(used);
        let used = used + if work.is_some() { 8 + 4 * 8 } else { 0 };
        SmemLayout { q, q_per_consumer, k, k_per_stage, v, v_per_stage, bars, tail_v, work, used, request: used + 1024 }
    }

    /// Offset of ring barrier `which` of slot 0; slot `s` adds `8 · s`.
    pub fn ring_bar(&self, spec: &Spec, which: RingBar) -> u32 {
        let base = self.smem(spec).bars;
        let i = match which {
            RingBar::FullK => 0,
            RingBar::FullV => 1,
            RingBar::EmptyK => 2,
            RingBar::EmptyV => 3,
        };
        base + 8 * i * self.stages
    }

    /// Arrivals that complete a phase: the producer's one `arrive.expect_tx` for full
    /// barriers, one per consumer warp for empty ones.
    pub fn bar_count(&self, which: RingBar) -> u32 {
        match which {
            // TMA: the producer's one arrive.expect_tx; gather: one cp.async arrive per
            // lane of the two warps that copy the tensor.
            RingBar::FullK | RingBar::FullV => {
                if self.gather {
                    64
                } else {
                    1
                }
            }
            RingBar::EmptyK | RingBar::EmptyV => 4 * self.consumers,
        }
    }

    /// Why this configuration cannot run `spec`, or `None`.
    pub fn check(&self, spec: &Spec, max_smem: u32) -> Result<(), String> {
        if !matches!(
            (spec.head_dim_qk, spec.head_dim_v),
            (64, 64) | (96, 96) | (128, 128) | (192, 128) | (192, 192) | (256, 256)
        ) {
            return Err(format!(
                "head dims {}/{}: this family has tiles for 64, 96, 128, 192/128, 192 and 256",
                spec.head_dim_qk, spec.head_dim_v
            ));
        }
        if !crate::llvm::wgmma::WGMMA_NS.contains(&spec.head_dim_v) {
            return Err(format!("head_dim_v {} is not a wgmma N this family emits", spec.head_dim_v));
        }
        // N = 80 is there for the backward's 80-query tiles; the forward has never been
        // built or run with 80-key tiles.
        let block_n_built = crate::llvm::wgmma::WGMMA_NS.contains(&self.block_n) && self.block_n != 80;
        if !block_n_built || self.stages == 0 || self.consumers == 0 {
            return Err(format!(
                "block_n {} / stages {} / consumers {}: not a built shape",
                self.block_n, self.stages, self.consumers
            ));
        }
        let paged = matches!(spec.kv_layout, KvLayout::Paged { .. });
        if self.gather && !paged {
            return Err("the gather producer reads paged KV only".into());
        }
        if !self.gather && Self::gathers(spec, self.block_n) {
            return Err(format!(
                "paged KV of {:?} in {}-key tiles: TMA boxes cannot follow those pages (the gather producer can)",
                spec.kv_layout, self.block_n
            ));
        }
        let smem = self.smem(spec).request;
        if smem > max_smem {
            return Err(format!("needs {smem} bytes of shared memory, the limit is {max_smem}"));
        }
        // setmaxnreg only moves registers within what the CTA was launched with:
        // `launch_registers` per thread (ptxas's budget for `.maxntid`), not the SM's 64K.
        // A budget above it makes `setmaxnreg.inc` wait forever (the H100 hung at 64/224).
        let pool = 128 * self.producer_regs + 128 * self.consumers * self.consumer_regs;
        let launched = self.launch_registers() * self.threads();
        if pool > launched {
            return Err(format!(
                "register budgets need {pool} registers, the CTA is launched with {launched} ({} per thread)",
                self.launch_registers()
            ));
        }
        Ok(())
    }

    /// Registers per thread at launch: 64K over the CTA's threads, rounded down to the
    /// allocation granule of 8 (168 for 384 threads, 128 for 512).
    pub fn launch_registers(&self) -> u32 {
        (65536 / self.threads()) / 8 * 8
    }
}

/// How the two consumer warpgroups of the backward share `dQ = dS·K` of a query tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DqSplit {
    /// Each computes half of dQ's columns over all the CTA's keys: both write their dSᵀ
    /// to shared memory and meet at a barrier per tile. d_qk 128 (a 64-column swizzle
    /// block each) or 64 (32 columns, N = 32).
    Columns,
    /// A 128-query tile: each computes all of dQ's columns for its 64 of the queries over
    /// all the CTA's keys (FA4's d64 split: N = d, one m64 GEMM per warpgroup, half the
    /// shared-memory reads of `Columns` at d64); the same barrier per tile.
    Rows,
    /// Each computes all of dQ's columns over its own 64 keys and both add into
    /// `dq_accum` (twice the atomics of `Columns`, no barrier between the warpgroups).
    Keys,
    /// dQᵀ = Kᵀ·dSᵀ (d_qk 128): each warpgroup 64 of dQ's columns as the wgmma M, the
    /// tile's queries as N and all the CTA's keys as K — FA4's SM90 d128 shape, for query
    /// tiles that are not a wgmma M (80). dS goes to shared memory as query rows of keys
    /// (K-major B, `stmatrix.trans`); the same barrier per tile as `Columns`. H100,
    /// 2026-11-28: 80-query tiles 0.96-1.03 of the default 64-query column split
    /// (docs/results/2026-11-28-h100-bwd-80-query-tiles/): a tune key only.
    Transposed,
}

impl DqSplit {
    /// Both warpgroups' dQ of a tile is one shared staging tile (one bulk reduce per
    /// tile, the ordered deterministic mode possible); the key split adds per warpgroup.
    pub fn one_tile(self) -> bool {
        self != DqSplit::Keys
    }
}

/// The hopper backward main kernel's configuration: one producer warpgroup (TMA of K, V
/// once per key tile; Q, dO and their LSE/D rows through a ring) and two consumer
/// warpgroups of 64 keys each (`wgmma` is m64: Sᵀ = K·Qᵀ puts keys on M).
#[derive(Clone, Debug, PartialEq)]
pub struct BwdConfig {
    pub consumers: u32,
    /// Queries per tile (the N of Sᵀ and dPᵀ, the K of dV and dK).
    pub block_m: u32,
    /// Q/dO ring slots.
    pub stages: u32,
    pub dq_split: DqSplit,
    /// Issue dPᵀ = V·dOᵀ right after Sᵀ, in a wgmma group of its own that runs while P is
    /// computed (waited on before dS), or after P with dV (its accumulators then are not
    /// live during the mask and score-mod work).
    pub dp_with_s: bool,
    /// Issue dQ = dS·K before dK += dSᵀ·Q and add dQ into `dq_accum` while the dK GEMM
    /// is in flight (`wgmma.wait_group 1`), instead of waiting for every GEMM first.
    pub dq_under_dk: bool,
    /// Column split at d128: each warpgroup stages its own half of the dQ tile and hands
    /// it to a dQ writer warp (the producer warpgroup's warp 1) through a pair of 160-thread
    /// named barriers of its own, which adds it with one bulk reduce (FA4's SM90 dQ path),
    /// instead of both warpgroups meeting at a second 256-thread barrier and one consumer
    /// thread issuing the reduce. No ordered deterministic mode with it (deterministic
    /// launches take slices). H100, 2026-11-28: +0-2%, with `dq_under_dk` +2-3% at
    /// non-causal 1k and 16k only (docs/results/2026-11-28-h100-bwd-dq-writer/): off.
    pub dq_writer: bool,
    /// Every `exp2_emulate_every`-th exponential of P on the FMA pipe
    /// (`variant::softmax::exp2_emulated`) instead of `ex2.approx` (0: none): the softmax
    /// of a d64 tile is bound by the MUFU pipe.
    pub exp2_emulate_every: u32,
    /// Key tile `n` walks the query tiles from tile `n` (wrapping), so CTAs add their dQ
    /// into different rows at once (`QueryTiles::rotation`).
    pub rotate_walk: bool,
    /// dQ of a tile goes through shared memory and one bulk reduce-add per tile (FA3's
    /// way) instead of per-thread `red.global.add.v4.f32`.
    pub dq_bulk: bool,
    /// Build the ordered deterministic mode (`ordered_dq`); off in the step down, for
    /// specs where its few instructions in the consumers make them spill.
    pub ordered: bool,
    /// A partial tile's mask from the bits the classifier wrote (`BlockLayout::
    /// DenseWithBits`, key-major) where it has a slot, instead of evaluating it (masks over
    /// aux tensors).
    pub mask_bits: bool,
    /// Build learnable aux gradients (they need the f32 P next to dS). On at d64, where
    /// 64-query tiles with the column split keep P in registers without spills (ptxas
    /// 13.5; 128-query tiles spill 1564 bytes; docs/results/2026-11-27-h100-aux-grads-d64/).
    /// Off at d96/d128, whose variants train on portable: at d128 P parked in shared
    /// memory (`p_in_smem`) assembles without spills (in registers every configuration
    /// spilled 104-220 bytes) and passes the selftest, but its slope gradient for
    /// `alibi_learned` is 100-1000x further from the reference than portable's
    /// (docs/results/2026-11-27-h100-aux-grads-d128/); `ATTNC_HOPPER_BWD_TUNE=aux_grads=1`
    /// builds it.
    pub aux_grads: bool,
    /// With learnable aux gradients: each thread parks its tile's f32 P in shared memory
    /// between P and dS instead of keeping it in registers next to dK and dV (d128, where
    /// those registers spilled).
    pub p_in_smem: bool,
    /// dS from the f32 P kept in registers (as FA4 does) instead of the P packed for dV
    /// and unpacked again (two instructions per pair of elements).
    pub p_f32_for_ds: bool,
    /// The rows' lse_log2 and D read from shared memory while the GEMM each waits for
    /// (Sᵀ, dPᵀ) is in flight, instead of right before their use, where the loads queue
    /// behind the tensor cores' shared-memory reads (ncu: the first exponent's FFMA
    /// waiting on them, 5.6% of the d128 samples).
    pub rows_early: bool,
    /// A causal or window mask's partial tiles from one interval of queries per key row
    /// (`variant::row_keys`: a `bmsk` per key row and 32 elements) instead of the mask's
    /// expression per element.
    pub row_keys: bool,
    /// Under a causal mask, in the default (atomic dQ) mode: the CTAs take their (key
    /// tile, KV head, batch entry) in LPT order — heads in sections whose Q, dO and dQ
    /// accumulator fit this many MiB, and within a section key tile 0 (the longest walk)
    /// of every head first — instead of the grid's order, whose last heads' long walks
    /// start last (`scripts/dev/bwd_tail_model.py`). 0: the grid's order.
    pub lpt_sections_mib: u32,
    /// The ordered mode's dQ writer waits for each tile's turn and passes it on. Off
    /// (`ATTNC_HOPPER_BWD_TUNE=writer_turns=0`, measurement only): the deterministic launch
    /// then adds the tiles in whatever order they come, not deterministic but exact up to
    /// rounding, to time the hand-over to a writer warp apart from the waits for turns.
    pub writer_turns: bool,
    pub producer_regs: u32,
    pub consumer_regs: u32,
    /// Diagnostics only (wrong results; never set by `for_spec`, only through
    /// `ATTNC_HOPPER_BWD_TUNE`): what a tile costs without one of its parts.
    pub diag: BwdDiag,
}

/// What a diagnostic build of the backward leaves out, to time the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BwdDiag {
    /// No red.global.add of dQ (the dQ GEMM still runs).
    pub no_dq_red: bool,
    /// No dQ at all: no dSᵀ store, barrier, GEMM or atomics.
    pub no_dq: bool,
    /// No softmax recompute or dS math: P = S, dS = dP (the GEMMs and the pipeline alone).
    pub no_softmax: bool,
    /// Bulk dQ (column split): only every other (key tile, query tile) pair adds its dQ
    /// tile — half the reduce volume, to see whether the time follows it.
    pub dq_half: bool,
    /// Bulk dQ: no staging stores (the reduce adds whatever the staging tile holds).
    pub dq_no_stage: bool,
    /// Bulk dQ: the next tile's staging does not wait for the last reduce to have read
    /// it (a race: timing only), to separate that wait from the reduce traffic.
    pub dq_no_wait: bool,
    /// Bulk dQ: no `fence.proxy.async` between the staging stores and the reduce (a
    /// race: timing only).
    pub dq_no_fence: bool,
    /// No dSᵀ stores to shared memory (dQ reads whatever is there; timing only).
    pub ds_no_store: bool,
}

/// Byte offsets of the backward's shared memory (from a 1024-byte aligned base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdSmem {
    pub k: u32,
    pub v: u32,
    /// Q slot `s` at `q + s · q_per_stage`; dO likewise.
    pub q: u32,
    pub q_per_stage: u32,
    pub d_o: u32,
    pub do_per_stage: u32,
    /// Per slot: `block_m` f32 of lse_log2, then `block_m` f32 of D.
    pub rowvals: u32,
    pub rowvals_per_stage: u32,
    /// dSᵀ (keys × queries, MN-major for dQ's A): `ds_buffers` buffers of `ds_per_buffer`.
    pub ds: u32,
    pub ds_per_buffer: u32,
    /// dQ staging (f32, row-major `[64][d_qk]`): one tile both warpgroups fill (column
    /// split) or one per warpgroup (key split); 0 bytes without `dq_bulk`.
    pub dq_stage: u32,
    pub dq_stage_per_wg: u32,
    /// mbarriers: kv_full, kv_empty, full[stages], empty[stages], dq_staged, dq_free.
    pub bars: u32,
    /// The ordered mode's hand-over from the dQ issuer to the dQ writer (24 bytes).
    pub dq_handoff: u32,
    /// `p_in_smem`: each consumer thread's f32 P of the tile, element `i` of thread `t`
    /// (both warpgroups, `t` < 256) at word `i · 256 + t` (a warp's store is 32
    /// consecutive words); 0 bytes otherwise.
    pub p_f32: u32,
    pub used: u32,
    pub request: u32,
}

impl BwdConfig {
    pub fn for_spec(spec: &Spec) -> BwdConfig {
        // The column and row splits give each element of a query tile one add per key
        // tile (the key split two) and one staging tile for both warpgroups; d96's half
        // (48 columns) would start mid-way into a 16-byte swizzle chunk of K. H100,
        // 2026-11-27, d64: the column split +11-17% over the key split
        // (docs/results/2026-11-27-h100-bwd-d64-columns/), then at 128-query tiles the row
        // split (each warpgroup its 64 queries, N = 64) +2-4% over the column split
        // (docs/results/2026-11-27-h100-bwd-d64-rows/).
        // Learnable aux gradients (built at d64 only, see `aux_grads`) keep the f32 P live:
        // only 64-query tiles (the column split) have the registers for it.
        let learnable = !crate::variant::grad::learnable_aux(spec).is_empty();
        let tall = spec.head_dim_qk == 64 && !learnable;
        let dq_split = match spec.head_dim_qk {
            64 if tall => DqSplit::Rows,
            64 | 128 => DqSplit::Columns,
            _ => DqSplit::Keys,
        };
        BwdConfig {
            consumers: 2,
            // d64: 128 queries per tile (FA3's and FA4's d64 tile), half the per-tile waits,
            // barriers and bulk reduces per FLOP, N = 128 for Sᵀ and dPᵀ: +3-6% non-causal,
            // +9-16% causal on the H100 (docs/results/2026-11-27-h100-bwd-d64-block-m-128/).
            // d96/d128 keep 64: dK and dV of 64 keys take d/2 + d/2 registers there.
            block_m: if tall { 128 } else { 64 },
            stages: 2,
            dq_split,
            // dPᵀ issued right after Sᵀ runs while P is computed. H100, 2026-11-27
            // (docs/results/2026-11-27-h100-bwd-dp-with-s/): d64 +1-4% (non-causal +3-4%), d128
            // non-causal +1-2%, d128 causal -1..-4%. With a score mod or a mask over aux
            // tensors its accumulators spilled at d128 (8-192 bytes, ptxas 13.5); the step
            // down turns it off wherever it spills.
            dp_with_s: spec.score_mod.is_none()
                && !attnc_ir::block_mask::needs_block_mask(spec)
                && (spec.head_dim_qk == 64 || (spec.head_dim_qk == 128 && spec.mask.is_none())),
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-bwd-dq-fragments/6-dq-under-dk/,
            // docs/results/2026-11-27-h100-bwd-d64-columns/): +4-7% with the key split's
            // per-thread reds, +1-5% at d64 with the column split's bulk reduce, within
            // noise at d128 (-2.5..+1.5%), where dK then issues after the dS barrier.
            dq_under_dk: spec.head_dim_qk != 128,
            dq_writer: false,
            rotate_walk: true,
            exp2_emulate_every: 0,
            // H100, 2026-11-23 (docs/results/2026-11-23-h100-hopper-backward-bulk-dq/): the
            // bulk reduce-add gains 1-3% at d128 (one shared tile) and 5-10% deterministic,
            // but loses 6-14% at d64, where each warpgroup stages its own tile.
            dq_bulk: dq_split.one_tile(),
            ordered: true,
            mask_bits: true,
            aux_grads: spec.head_dim_qk == 64,
            p_in_smem: spec.head_dim_qk == 128,
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-bwd-instructions/): +0-7%
            // (d64 non-causal +3-6%, d128 causal +2-7%). Not with a score mod whose slope
            // is not 1 (the slope beside the live f32 P spills 96 bytes for grok_softcap;
            // bias mods such as ALiBi and T5 fit, and their dS then rounds like the plain
            // kernel's), nor for GQA at d64 without a mask, where it spills 8 bytes next to
            // the query-head walk's state (ptxas 13.5; GPU-checked by
            // tests/gpu-specs/gqa_d64.attn).
            p_f32_for_ds: crate::variant::grad::ScoreGrad::new(spec).slope_is_one()
                && !(spec.head_dim_qk == 64 && spec.kv_heads < spec.q_heads && spec.mask.is_none()),
            rows_early: false,
            // H100, 2026-11-27 (docs/results/2026-11-27-h100-bwd-row-keys/): d64 causal
            // +1-2.4% (1k +2.2%), non-causal unchanged (no interval); d128 causal -2..-3% at
            // 8k, the rest within noise, so d128 keeps the per-element mask.
            row_keys: spec.head_dim_qk == 64,
            lpt_sections_mib: 0,
            writer_turns: true,
            producer_regs: 24,
            consumer_regs: 240,
            diag: BwdDiag::default(),
        }
        .tuned(&bwd_tune_override().unwrap_or_default())
    }

    /// This configuration with `key=value,...` overrides (dev sweeps; unknown keys and bad
    /// values are ignored): `stages`, `block_m` (64, or 128 with a one-tile split, or a
    /// multiple of 16 from 64 to 128 with the transposed split),
    /// `producer_regs`, `consumer_regs`, `dq_split` (0 columns, 1 keys, 2 rows, 3 transposed),
    /// `dp_with_s`, `dq_under_dk`, `dq_writer`, `rotate_walk`, `exp2_emulate_every`, `dq_bulk`,
    /// `ordered`, `mask_bits`, `aux_grads`, `p_in_smem`, `p_f32_for_ds`, `rows_early`, `row_keys`,
    /// `lpt_sections_mib`, `writer_turns`, and the diagnostics
    /// `diag_no_dq_red`, `diag_no_dq`, `diag_no_softmax`, `diag_dq_half`, `diag_dq_no_stage`,
    /// `diag_dq_no_wait`, `diag_dq_no_fence`, `diag_ds_no_store`.
    pub fn tuned(mut self, text: &str) -> BwdConfig {
        for kv in text.split(',') {
            let Some((k, v)) = kv.split_once('=') else { continue };
            let Ok(n) = v.trim().parse::<u32>() else { continue };
            match k.trim() {
                "stages" => self.stages = n,
                "block_m" => self.block_m = n,
                "producer_regs" => self.producer_regs = n,
                "consumer_regs" => self.consumer_regs = n,
                "dq_split" => {
                    self.dq_split = match n {
                        0 => DqSplit::Columns,
                        1 => DqSplit::Keys,
                        2 => DqSplit::Rows,
                        _ => DqSplit::Transposed,
                    }
                }
                "dp_with_s" => self.dp_with_s = n != 0,
                "dq_under_dk" => self.dq_under_dk = n != 0,
                "dq_writer" => self.dq_writer = n != 0,
                "rotate_walk" => self.rotate_walk = n != 0,
                "exp2_emulate_every" => self.exp2_emulate_every = n,
                "dq_bulk" => self.dq_bulk = n != 0,
                "ordered" => self.ordered = n != 0,
                "mask_bits" => self.mask_bits = n != 0,
                "aux_grads" => self.aux_grads = n != 0,
                "p_in_smem" => self.p_in_smem = n != 0,
                "p_f32_for_ds" => self.p_f32_for_ds = n != 0,
                "rows_early" => self.rows_early = n != 0,
                "row_keys" => self.row_keys = n != 0,
                "lpt_sections_mib" => self.lpt_sections_mib = n.min(1024),
                "writer_turns" => self.writer_turns = n != 0,
                "diag_no_dq_red" => self.diag.no_dq_red = n != 0,
                "diag_no_dq" => self.diag.no_dq = n != 0,
                "diag_no_softmax" => self.diag.no_softmax = n != 0,
                "diag_dq_half" => self.diag.dq_half = n != 0,
                "diag_dq_no_stage" => self.diag.dq_no_stage = n != 0,
                "diag_dq_no_wait" => self.diag.dq_no_wait = n != 0,
                "diag_dq_no_fence" => self.diag.dq_no_fence = n != 0,
                "diag_ds_no_store" => self.diag.ds_no_store = n != 0,
                _ => {}
            }
        }
        self
    }

    /// Whether the kernel implements the ordered deterministic mode
    /// (`common::dq_order`): each tile's dQ is added by one bulk reduce (column or row split),
    /// which a dQ-writer thread of the producer warpgroup issues in turn. The key split's
    /// per-thread atomics from two warpgroups use the slice mode.
    pub fn ordered_dq(&self) -> bool {
        self.ordered
            && self.dq_bulk
            && !self.dq_writer
            && self.dq_split.one_tile()
            && self.rotate_walk
            && self.diag == BwdDiag::default()
    }

    /// How this configuration's main kernel lays out its dQ in `dq_accum`: the bulk
    /// staging tile in the storing threads' fragment order (bank-conflict-free stores;
    /// `common::backward::DqAccumLayout`: both warpgroups per 64 rows for the column
    /// split, one for the row split), row-major otherwise.
    pub fn dq_accum_layout(&self) -> crate::families::common::backward::DqAccumLayout {
        use crate::families::common::backward::DqAccumLayout;
        match (self.dq_bulk, self.dq_split) {
            (true, DqSplit::Columns) if self.dq_writer => DqAccumLayout::ConsumerHalves,
            (true, DqSplit::Columns) => DqAccumLayout::ConsumerFragments,
            (true, DqSplit::Rows) => DqAccumLayout::WarpgroupFragments,
            (true, DqSplit::Transposed) => DqAccumLayout::TransposedFragments { rows: self.block_m },
            _ => DqAccumLayout::RowMajor,
        }
    }

    /// The 64-query blocks a consumer warpgroup's dQ fragment covers (one m64 GEMM each):
    /// the whole tile's, but its own one for the row split.
    pub fn dq_query_blocks(&self) -> u32 {
        if matches!(self.dq_split, DqSplit::Rows | DqSplit::Transposed) {
            1
        } else {
            self.block_m / 64
        }
    }

    /// Keys per CTA: 64 per consumer warpgroup.
    pub fn block_n(&self) -> u32 {
        ROWS_PER_CONSUMER * self.consumers
    }

    pub fn threads(&self) -> u32 {
        128 * (1 + self.consumers)
    }

    pub fn smem(&self, spec: &Spec) -> BwdSmem {
        let align = |x: u32| x.div_ceil(1024) * 1024;
        let blocks = Config::col_blocks;
        let bn = self.block_n();
        let k = 0;
        let v = align(k + blocks(spec.head_dim_qk) * bn * ROW_BYTES);
        let q = align(v + blocks(spec.head_dim_v) * bn * ROW_BYTES);
        let q_per_stage = blocks(spec.head_dim_qk) * self.block_m * ROW_BYTES;
        let d_o = align(q + q_per_stage * self.stages);
        let do_per_stage = blocks(spec.head_dim_v) * self.block_m * ROW_BYTES;
        let ds = align(d_o + do_per_stage * self.stages);
        // dSᵀ rows are keys, each 64 queries = one 128-byte swizzle row (a 128-query tile:
        // two blocks of key rows); transposed, dS rows are queries, each 64 keys one row
        // (two blocks of query rows).
        let ds_per_buffer = match self.dq_split {
            DqSplit::Transposed => self.block_m * ROW_BYTES * bn.div_ceil(64),
            _ => bn * ROW_BYTES * self.block_m.div_ceil(64),
        };
        let ds_buffers = match self.dq_split {
            DqSplit::Columns | DqSplit::Rows | DqSplit::Transposed => 2,
            DqSplit::Keys => 1,
        };
        let dq_stage = ds + ds_per_buffer * ds_buffers;
        let dq_tile = self.block_m * spec.head_dim_qk * 4;
        let (dq_stage_per_wg, dq_stage_bytes) = match (self.dq_bulk, self.dq_split) {
            (false, _) => (0, 0),
            (true, DqSplit::Columns | DqSplit::Rows | DqSplit::Transposed) => (0, dq_tile),
            (true, DqSplit::Keys) => (dq_tile, dq_tile * self.consumers),
        };
        let rowvals = dq_stage + dq_stage_bytes;
        let rowvals_per_stage = 2 * self.block_m * 4;
        let bars = rowvals + rowvals_per_stage * self.stages;
        let dq_handoff = bars + 8 * (4 + 2 * self.stages);
        // The ordered mode's hand-over (6 words), or the dQ writer's (4 words a warpgroup).
        let handoff_bytes = if self.dq_writer { 16 * self.consumers } else { 24 };
        let p_f32 = (dq_handoff + handoff_bytes).div_ceil(16) * 16;
        let used = if self.p_in_smem_used(spec) {
            p_f32 + 128 * self.consumers * (self.block_m / 2) * 4
        } else {
            dq_handoff + handoff_bytes
        };
        BwdSmem {
            k,
            v,
            q,
            q_per_stage,
            d_o,
            do_per_stage,
            rowvals,
            rowvals_per_stage,
            ds,
            ds_per_buffer,
            dq_stage,
            dq_stage_per_wg,
            bars,
            dq_handoff,
            p_f32,
            used,
            request: used + 1024,
        }
    }

    /// Whether the kernel parks P in shared memory: `p_in_smem` for a spec with learnable
    /// aux tensors whose gradients this configuration builds.
    pub fn p_in_smem_used(&self, spec: &Spec) -> bool {
        self.p_in_smem && self.aux_grads && !crate::variant::grad::learnable_aux(spec).is_empty()
    }

    /// Why this configuration cannot run the backward of `spec`, or `None`.
    pub fn check(&self, spec: &Spec, max_smem: u32) -> Result<(), String> {
        if spec.head_dim_qk != spec.head_dim_v || ![64, 96, 128].contains(&spec.head_dim_qk) {
            return Err(format!(
                "head dims {}/{}: the hopper backward has tiles for 64, 96 and 128 (a consumer \
                 warpgroup holds dK and dV of its 64 keys in registers: d/2 + d/2 per thread)",
                spec.head_dim_qk, spec.head_dim_v
            ));
        }
        if let Some(a) = crate::variant::grad::learnable_aux(spec).first().filter(|_| !self.aux_grads) {
            return Err(format!(
                "learnable aux tensor `{}` at head dim {}: its gradient keeps the f32 P live next to dK \
                 and dV, which spills in this family's registers (it fits at head dim 64)",
                a.name, spec.head_dim_qk
            ));
        }
        // 128 queries per tile: the column or row split's staging (two 64-row fragment
        // tiles) only; the per-thread reds address 64 rows.
        // The transposed split: any multiple of 16 queries from 64 to 128 (N of Sᵀ, dPᵀ
        // and dQᵀ; K of dV and dK).
        let transposed = self.dq_split == DqSplit::Transposed;
        let block_m_built = self.block_m == 64
            || (self.block_m == 128 && self.dq_bulk && self.dq_split.one_tile())
            || (transposed && self.block_m % 16 == 0 && (64..=128).contains(&self.block_m));
        if !block_m_built || self.consumers != 2 || self.stages == 0 {
            return Err(format!(
                "block_m {} / consumers {} / stages {}: not a built shape",
                self.block_m, self.consumers, self.stages
            ));
        }
        if self.dq_split == DqSplit::Rows && (self.block_m != 128 || !self.dq_bulk) {
            return Err("the row split of dQ needs 128-query tiles and the bulk reduce".into());
        }
        if self.dq_writer && (self.dq_split != DqSplit::Columns || !self.dq_bulk || spec.head_dim_qk != 128) {
            return Err("the dQ writer warp needs the column split at d_qk = 128 and the bulk reduce".into());
        }
        if transposed && (spec.head_dim_qk != 128 || !self.dq_bulk) {
            return Err("the transposed split of dQ needs d_qk = 128 and the bulk reduce".into());
        }
        if self.mask_bits && attnc_ir::block_mask::needs_block_mask(spec) && self.block_m % 64 != 0 {
            return Err(format!(
                "block_m {}: the classifier's mask bits are read as rows of 2 or 4 words (block_m 64 or 128)",
                self.block_m
            ));
        }
        if self.dq_split == DqSplit::Columns && ![64, 128].contains(&spec.head_dim_qk) {
            return Err("the column split of dQ needs d_qk = 64 or 128".into());
        }
        let smem = self.smem(spec).request;
        if smem > max_smem {
            return Err(format!("needs {smem} bytes of shared memory, the limit is {max_smem}"));
        }
        let pool = 128 * self.producer_regs + 128 * self.consumers * self.consumer_regs;
        let launched = (65536 / self.threads()) / 8 * 8 * self.threads();
        if pool > launched {
            return Err(format!("register budgets need {pool} registers, the CTA is launched with {launched}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_d128_two_stages() {
        let s = Spec::new("x", 128, 4);
        // The tiled grid's layout (plain attention runs persistent by default, which adds
        // the work-tile ring after the mbarriers).
        let c = Config::for_spec(&s).tuned("persistent=0");
        let l = c.smem(&s);
        // Q: 2 consumers × 2 column blocks × 64 rows × 128 B = 32 KiB; K, V: 2 stages ×
        // 2 blocks × 128 rows × 128 B = 64 KiB each; then 8 mbarriers (full/empty × K/V × 2 slots).
        assert_eq!(
            (l.q, l.q_per_consumer, l.k, l.k_per_stage, l.v, l.v_per_stage),
            (0, 16384, 32768, 32768, 98304, 32768)
        );
        assert_eq!(l.bars, 163840);
        assert_eq!(l.used, 163840 + 64);
        assert_eq!(c.threads(), 384);
        assert_eq!(c.block_m(), 128);
        assert!(c.check(&s, 227 * 1024).is_ok());
        // Every operand tile starts on a 1024-byte swizzle atom.
        for off in [l.q, l.q_per_consumer, l.k, l.k_per_stage, l.v, l.v_per_stage] {
            assert_eq!(off % 1024, 0);
        }
    }

    /// Pages TMA boxes can follow load by TMA (with the tail tile's V barrier after the
    /// ring's); the others gather. Either way the configuration checks.
    #[test]
    fn paged_kv_loads_by_tma_where_boxes_follow_the_pages() {
        use crate::families::common::paged::PagedBoxes;
        for (page, rows, boxes) in [
            (16, QueryRows::Any, Some(PagedBoxes::PerPage { boxes: 8 })),
            (16, QueryRows::OneTile, Some(PagedBoxes::PerPage { boxes: 4 })),
            (128, QueryRows::Any, Some(PagedBoxes::InsidePage)),
            (256, QueryRows::OneTile, Some(PagedBoxes::InsidePage)),
            (1, QueryRows::Any, None),
            (48, QueryRows::Any, None),
        ] {
            let mut s = Spec::new("x", 128, 4);
            s.kv_layout = KvLayout::Paged { page_size: page };
            s.query_rows = rows;
            let c = Config::for_spec(&s);
            assert_eq!(c.paged_boxes(&s), boxes, "page {page}, {rows:?}");
            assert_eq!(c.gather, boxes.is_none(), "page {page}");
            let l = c.smem(&s);
            assert_eq!(l.tail_v, boxes.map(|_| l.bars + 32 * c.stages), "page {page}");
            assert!(c.check(&s, 227 * 1024).is_ok(), "page {page}");
        }
        // d64 paged by TMA keeps three consumers (the gather's producer registers do not).
        let mut s = Spec::new("x", 64, 4);
        s.kv_layout = KvLayout::Paged { page_size: 128 };
        assert_eq!(Config::for_spec(&s).consumers, 3);
        s.kv_layout = KvLayout::Paged { page_size: 1 };
        assert_eq!(Config::for_spec(&s).consumers, 2);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let mut s = Spec::new("x", 128, 4);
        s.kv_layout = KvLayout::Paged { page_size: 1 };
        let mut c = Config::for_spec(&s);
        assert!(c.gather && c.check(&s, 227 * 1024).is_ok());
        c.gather = false;
        assert!(c.check(&s, 227 * 1024).unwrap_err().contains("TMA boxes cannot follow"));
        s = Spec::new("x", 128, 4);
        let mut c = Config::for_spec(&s);
        c.gather = true;
        assert!(c.check(&s, 227 * 1024).unwrap_err().contains("paged KV only"));
        s = Spec::new("x", 128, 4);
        let mut c = Config::for_spec(&s);
        c.consumer_regs = 256;
        assert!(c.check(&s, 227 * 1024).unwrap_err().contains("registers"));
        // 64 + 2 x 224 registers fit the SM but not the 168 x 384 the CTA is launched with.
        c = Config::for_spec(&s);
        c.producer_regs = 64;
        c.consumer_regs = 224;
        assert!(c.check(&s, 227 * 1024).unwrap_err().contains("launched with 64512"));
        c = Config::for_spec(&s);
        c.block_n = 100;
        assert!(c.check(&s, 227 * 1024).unwrap_err().contains("not a built shape"));
    }

    #[test]
    fn every_supported_head_dim_has_a_config_that_fits() {
        for &(dqk, dv) in attnc_ir::spec::SUPPORTED_HEAD_DIMS {
            let mut s = Spec::new("x", dqk, 4);
            s.head_dim_v = dv;
            let c = Config::for_spec(&s);
            assert_eq!(c.check(&s, 227 * 1024), Ok(()), "d={dqk}/{dv}: {c:?}");
            // Every operand tile on a 1024-byte swizzle atom.
            let l = c.smem(&s);
            for off in [l.q_per_consumer, l.k, l.k_per_stage, l.v, l.v_per_stage] {
                assert_eq!(off % 1024, 0, "d={dqk}/{dv}");
            }
        }
    }
}
