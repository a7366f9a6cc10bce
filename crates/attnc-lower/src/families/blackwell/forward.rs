//! The blackwell forward kernel: FlashAttention-4's warp-specialized pipeline.
//!
//! A persistent CTA of 16 warps loops over work tiles (256 query rows = two Q tiles of
//! 128, one head, one batch entry; see [`super::schedule`]). Per work tile the key tiles
//! that the mask does not rule out are walked from the last to the first, and the roles
//! hand them along through mbarriers (`config::Bar`):
//!
//! ```text
//! load warp     Q0,Q1 ─► K0 V0 K1 V1 ...   (TMA into a ring of kv_slots, SW128)
//! MMA thread    S0=Q0K0ᵀ S1=Q1K0ᵀ | O0+=P0V0 S0=Q0K1ᵀ O1+=P1V0 S1=Q1K1ᵀ | ... | O0+=P0Vn O1+=P1Vn
//! softmax i     ld S_i ─ max ─ α→TMEM ─[exp, exclusive with the other WG]─ st P_i (bf16, over S_i)
//! correction    α_i ─ O_i *= α_i in TMEM when a row of the warp moved its base ─ ... ─ O_i/l ─► global
//! ```
//! Every hand-off is an mbarrier: TMA completes transactions, `tcgen05.commit` arrives
//! when the MMAs issued before it have completed, threads arrive after a
//! `tcgen05.wait::st` + `tcgen05.fence::before_thread_sync`; waiters issue
//! `tcgen05.fence::after_thread_sync` before touching TMEM.

mod epilogue;
mod softmax;

use super::abi;
use super::config::{
    Bar, Config, PvOrder, BAR_EPILOGUE, BAR_EXP, BLOCK_M, BLOCK_N, THREADS, TMA_BOX_BYTES, TMA_BOX_COLS,
};
use super::desc::{DFormat, InstrDesc, SmemDesc};
use crate::error::LowerError;
use crate::families::common::abi::{describe, ParamTy};
use crate::families::common::schedule::{emit_section_heads, emit_tile_coords, WorkTile};
use crate::families::common::sw128::{emit_chunk_addr, k_major_step_offset, mn_major_step_offset};
use crate::llvm::kb::{Kb, Slot, R};
use crate::llvm::operand::Major;
use crate::llvm::tcgen05::{Acc, SmemOperand};
use crate::module::{Grid, KernelInfo, KernelRole};
use crate::variant::expr::{self as vexpr, ElemVars, VariantArgs};
use crate::variant::interval::{classify_tile, TileClassVals, TileRanges};
use crate::variant::softmax::exp2_emulated;
use crate::variant::tiles::{classes_of, BlockListArgs, BLOCK_LIST_PARAMS};
use attnc_ir::block_mask::{needs_block_mask, HeadSlots};
use attnc_ir::{KvLayout, Spec};
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// Columns of O the correction warpgroup moves per tcgen05.ld/st (its budget is small).
const CORR_CHUNK: u32 = 16;

/// How many of a row's `BLOCK_N` exponentials use the polynomial emulation.
pub fn emulated_per_row(spec: &Spec) -> u32 {
    ((spec.softmax.exp2_emulation * BLOCK_N as f64).round() as u32).min(BLOCK_N)
}

/// Whether column `c` of a row is emulated: the `e` emulated columns spread evenly
/// (Bresenham), so FMA-pipe and MUFU work interleave.
pub fn is_emulated(c: u32, e: u32) -> bool {
    (c + 1) * e / BLOCK_N != c * e / BLOCK_N
}

struct Fwd<'a, 'ctx> {
    spec: &'a Spec,
    cfg: &'a Config,
    kernel: String,
    names: Vec<String>,
    values: Vec<BasicValueEnum<'ctx>>,
    va: VariantArgs<'ctx>,
    /// The block mask's class table (a mask over aux tensors): read instead of the
    /// interval classification.
    classes: Option<BlockListArgs<'ctx>>,
    smem: IntValue<'ctx>,
    tmem: IntValue<'ctx>,
    tid: IntValue<'ctx>,
    warp: IntValue<'ctx>,
    seqlen_q: IntValue<'ctx>,
    seqlen_k: IntValue<'ctx>,
    batch: IntValue<'ctx>,
    /// The launch's work-tile count, or `None` where the role recomputes it at each
    /// persistent-loop check (the gather warps: kept live, it is the register they spill).
    total: Option<IntValue<'ctx>>,
}

pub fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, cfg: &Config, name: &str) -> R<KernelInfo> {
    let params = abi::forward_params(spec);
    let decl: Vec<(BasicMetadataTypeEnum, String)> = params
        .iter()
        .map(|(n, t)| {
            let ty: BasicMetadataTypeEnum = match t {
                ParamTy::TensorMap => kb.ctx.ptr_type(AddressSpace::default()).into(),
                ParamTy::Ptr | ParamTy::I64 => kb.ctx.i64_type().into(),
                ParamTy::I32 => kb.ctx.i32_type().into(),
                ParamTy::F32 => kb.ctx.f32_type().into(),
            };
            (ty, n.clone())
        })
        .collect();
    let values = kb.begin_kernel(name, &decl)?;
    for (i, (_, t)) in params.iter().enumerate() {
        if *t == ParamTy::TensorMap {
            kb.mark_tensor_map_param(i as u32)?;
        }
    }
    kb.set_launch_bounds(THREADS)?;
    kb.section(&format!(
        "attnc blackwell forward: {} (persistent, 2x{BLOCK_M} rows x {BLOCK_N} keys, 16 warps, {} kv slots)",
        spec.name, cfg.kv_slots
    ))?;
    let f = Fwd::setup(kb, spec, cfg, name, params.iter().map(|p| p.0.clone()).collect(), values)?;
    f.run(kb)?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::Forward,
        note: Some("persistent: grid.x = min(SMs, work tiles), see docs/blackwell.md".into()),
        threads_per_block: THREADS,
        dynamic_smem_bytes: cfg.smem().request,
        block_m: cfg.tile_rows(),
        block_n: BLOCK_N,
        params: describe(&params),
        tensor_maps: abi::tma_boxes(spec),
        grid: Grid::Persistent,
    })
}

impl<'a, 'ctx> Fwd<'a, 'ctx> {
    fn setup(
        kb: &mut Kb<'ctx>,
        spec: &'a Spec,
        cfg: &'a Config,
        kernel: &str,
        names: Vec<String>,
        values: Vec<BasicValueEnum<'ctx>>,
    ) -> R<Fwd<'a, 'ctx>> {
        let get = |n: &str| -> R<BasicValueEnum<'ctx>> {
            names
                .iter()
                .position(|x| x == n)
                .map(|i| values[i])
                .ok_or_else(|| LowerError::Llvm(format!("kernel has no parameter `{n}`")))
        };
        let va = crate::families::common::abi::variant_args(spec, &get)?;
        let seqlen_q = get("seqlen_q")?.into_int_value();
        let seqlen_k = get("seqlen_k")?.into_int_value();
        let batch = get("batch")?.into_int_value();
        let classes = if needs_block_mask(spec) {
            let v = |i: usize| get(BLOCK_LIST_PARAMS[i]).map(|x| x.into_int_value());
            Some(BlockListArgs {
                lists: v(0)?,
                slots: v(1)?,
                m_tiles: v(2)?,
                n_tiles: v(3)?,
                bits: v(4)?,
                bits_per_row: v(5)?,
            })
        } else {
            None
        };

        let tid = kb.sreg("tid.x", "tid")?;
        let warp = kb.udiv(tid, kb.i32c(32), "warp")?;

        // Dynamic shared memory, rounded up to 1024 bytes (128-byte swizzle atoms).
        let g = kb.module.add_global(kb.ctx.i8_type().array_type(0), Some(AddressSpace::from(3u16)), "attnc_smem");
        g.set_alignment(1024);
        g.set_linkage(inkwell::module::Linkage::External);
        let raw = kb.trunc32(kb.b.build_ptr_to_int(g.as_pointer_value(), kb.ctx.i64_type(), "")?, "smem_raw")?;
        let smem = kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")?;

        let layout = cfg.smem();
        kb.section("setup: mbarriers (thread 0), TMEM allocation (MMA warp)")?;
        let is_t0 = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
        kb.if_then(is_t0, "init_barriers", |kb| {
            let scal = kb.add(smem, kb.i32c(layout.scalars as i64), "")?;
            kb.st_shared_b32(scal, seqlen_q)?;
            kb.st_shared_b32(kb.add(scal, kb.i32c(4), "")?, seqlen_k)?;
            for (i, b) in cfg.mbarriers().into_iter().enumerate() {
                let addr = kb.add(smem, kb.i32c((layout.bars + 8 * i as u32) as i64), "")?;
                kb.mbar_init(addr, cfg.bar_count(b))?;
            }
            kb.fence_mbarrier_init()
        })?;
        let is_mma_warp = kb.icmp(IntPredicate::EQ, warp, kb.i32c(12), "")?;
        let slot = kb.add(smem, kb.i32c(layout.tmem_slot as i64), "tmem_slot")?;
        kb.if_then(is_mma_warp, "tmem_alloc", |kb| {
            kb.tmem_alloc(slot, cfg.tmem().alloc)?;
            kb.tmem_relinquish()
        })?;
        kb.tcgen05_fence_before()?;
        kb.cta_barrier()?;
        kb.tcgen05_fence_after()?;
        let tmem = kb.ld_shared_b32(slot, "tmem_base")?;
        // Each role re-derives the thread index, shared and TMEM bases after its
        // setmaxnreg (`rederive`), so nothing computed here stays live across the
        // register reallocation.
        Ok(Fwd {
            spec,
            cfg,
            kernel: kernel.to_string(),
            names,
            values,
            va,
            classes,
            smem,
            tmem,
            tid,
            warp,
            seqlen_q,
            seqlen_k,
            batch,
            total: None,
        })
    }

    /// This state with every derived value recomputed at the current point (opaque
    /// thread index, TMEM base re-read from shared memory, tile counts from params).
    fn rederive(&self, kb: &mut Kb<'ctx>) -> R<Fwd<'a, 'ctx>> {
        let spec = self.spec;
        let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
        let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
        let g = kb.module.get_global("attnc_smem").ok_or_else(|| LowerError::Llvm("no attnc_smem".into()))?;
        let raw = kb.trunc32(kb.b.build_ptr_to_int(g.as_pointer_value(), kb.ctx.i64_type(), "")?, "smem_raw")?;
        let smem = kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")?;
        let slot = kb.add(smem, kb.i32c(self.cfg.smem().tmem_slot as i64), "tmem_slot")?;
        let tmem = kb.ld_shared_b32(slot, "tmem_base")?;
        let mut f = Fwd {
            spec,
            cfg: self.cfg,
            kernel: self.kernel.clone(),
            names: self.names.clone(),
            values: self.values.clone(),
            va: self.va.clone(),
            classes: self.classes,
            smem,
            tmem,
            tid,
            warp,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            batch: self.batch,
            total: None,
        };
        f.total = Some(f.work_tiles_from_params(kb)?);
        Ok(f)
    }

    /// [`Fwd::rederive`] without the work-tile count (recomputed at each loop check).
    fn rederive_lean(&self, kb: &mut Kb<'ctx>) -> R<Fwd<'a, 'ctx>> {
        let mut f = self.rederive(kb)?;
        f.total = None;
        Ok(f)
    }

    fn arg(&self, n: &str) -> R<IntValue<'ctx>> {
        self.names
            .iter()
            .position(|x| x == n)
            .map(|i| self.values[i].into_int_value())
            .ok_or_else(|| LowerError::Llvm(format!("kernel has no parameter `{n}`")))
    }

    fn param_symbol(&self, n: &str) -> R<String> {
        let i = self
            .names
            .iter()
            .position(|x| x == n)
            .ok_or_else(|| LowerError::Llvm(format!("kernel has no parameter `{n}`")))?;
        Ok(format!("{}_param_{i}", self.kernel))
    }

    /// Shared address of mbarrier `b`.
    fn bar(&self, kb: &Kb<'ctx>, b: Bar) -> R<IntValue<'ctx>> {
        let off = self.cfg.smem().bars + 8 * self.cfg.bar_index(b);
        kb.add(self.smem, kb.i32c(off as i64), "mbar")
    }

    /// Shared address of per-stage mbarrier `make(stage)` for a runtime stage (0/1).
    fn bar_stage(&self, kb: &Kb<'ctx>, make: fn(u32) -> Bar, stage: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let b0 = self.cfg.bar_index(make(0));
        // One Q tile: the stage is always 0 and tile 1's barriers do not exist.
        let stride = if self.cfg.q_tiles == 2 { self.cfg.bar_index(make(1)) - b0 } else { 0 };
        let off = kb.add(
            kb.i32c((self.cfg.smem().bars + 8 * b0) as i64),
            kb.mul(stage, kb.i32c(8 * stride as i64), "")?,
            "",
        )?;
        kb.add(self.smem, off, "mbar")
    }

    /// Shared address of ring mbarrier `make(slot)` for a runtime slot.
    fn bar_slot(&self, kb: &Kb<'ctx>, make: fn(u32) -> Bar, slot: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let b0 = self.cfg.bar_index(make(0));
        let off = kb.add(kb.i32c((self.cfg.smem().bars + 8 * b0) as i64), kb.mul(slot, kb.i32c(8), "")?, "")?;
        kb.add(self.smem, off, "mbar")
    }

    fn parity(&self, kb: &Kb<'ctx>, count: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.and(count, kb.i32c(1), "parity")
    }

    /// (slot, parity) of ring position `pos`.
    fn ring(&self, kb: &Kb<'ctx>, pos: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let s = self.cfg.kv_slots;
        let slot = kb.and(pos, kb.i32c((s - 1) as i64), "kv_slot")?;
        let par = kb.and(
            kb.b.build_right_shift(pos, kb.i32c(s.trailing_zeros() as i64), false, "")?,
            kb.i32c(1),
            "kv_parity",
        )?;
        Ok((slot, par))
    }

    /// Query rows per work tile (`Config::tile_rows`).
    fn tile_rows(&self) -> i64 {
        self.cfg.tile_rows() as i64
    }

    fn group(&self) -> i64 {
        self.spec.group_size() as i64
    }

    fn run(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let regs = self.cfg.regs;
        let wg = kb.udiv(self.warp, kb.i32c(4), "warpgroup")?;
        // Softmax warpgroups: both with two Q tiles; with one, warpgroup 1 has no tile
        // and joins the small-budget roles (its registers go to warpgroup 0).
        let is_softmax = kb.icmp(IntPredicate::ULT, wg, kb.i32c(self.cfg.q_tiles as i64), "")?;
        kb.if_else(
            is_softmax,
            "role_softmax",
            |kb| {
                kb.setmaxnreg_inc(regs.softmax)?;
                let f = self.rederive(kb)?;
                let wg = kb.udiv(f.warp, kb.i32c(4), "warpgroup")?;
                f.softmax(kb, wg)
            },
            |kb| {
                let is_corr = kb.icmp(IntPredicate::EQ, wg, kb.i32c(2), "")?;
                kb.if_else(
                    is_corr,
                    "role_correction",
                    |kb| {
                        kb.setmaxnreg_dec(regs.correction)?;
                        self.rederive(kb)?.correction(kb)
                    },
                    |kb| {
                        kb.setmaxnreg_dec(regs.other)?;
                        let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
                        let lane0 = kb.icmp(IntPredicate::EQ, kb.and(tid, kb.i32c(31), "")?, kb.i32c(0), "")?;
                        let warp = kb.udiv(tid, kb.i32c(32), "")?;
                        let mma = kb.and(kb.icmp(IntPredicate::EQ, warp, kb.i32c(12), "")?, lane0, "")?;
                        kb.if_then(mma, "role_mma", |kb| self.rederive(kb)?.mma(kb))?;
                        let load = kb.and(kb.icmp(IntPredicate::EQ, warp, kb.i32c(13), "")?, lane0, "")?;
                        kb.if_then(load, "role_load", |kb| self.rederive(kb)?.producer(kb))?;
                        if !self.cfg.gather {
                            return Ok(());
                        }
                        for (w, is_v) in [(14, false), (15, true)] {
                            let mine = kb.icmp(IntPredicate::EQ, warp, kb.i32c(w), "")?;
                            kb.if_then(mine, "role_gather", |kb| self.rederive_lean(kb)?.gather(kb, is_v))?;
                        }
                        Ok(())
                    },
                )
            },
        )?;
        kb.section("teardown: every role done, the MMA warp frees TMEM")?;
        kb.tcgen05_fence_before()?;
        kb.cta_barrier()?;
        let f = self.rederive(kb)?;
        let is_mma_warp = kb.icmp(IntPredicate::EQ, f.warp, kb.i32c(12), "")?;
        kb.if_then(is_mma_warp, "tmem_dealloc", |kb| {
            kb.warp_sync()?;
            kb.tcgen05_fence_after()?;
            kb.tmem_dealloc(f.tmem, f.cfg.tmem().alloc)
        })
    }

    // ------------------------------------------------------------ iteration

    /// `for t in (ctaid.x..total).step_by(nctaid.x) { body(tile(t)) }`.
    fn persistent(&self, kb: &mut Kb<'ctx>, body: impl FnOnce(&mut Kb<'ctx>, WorkTile<'ctx>) -> R<()>) -> R<()> {
        let first = kb.sreg("ctaid.x", "")?;
        let t = kb.slot_i32("work_tile", first)?;
        kb.while_loop(
            "persistent",
            |kb| {
                let tt = kb.get_i(t, "")?;
                let total = match self.total {
                    Some(t) => t,
                    None => self.work_tiles(kb)?,
                };
                kb.icmp(IntPredicate::SLT, tt, total, "")
            },
            |kb| {
                let tt = kb.get_i(t, "t")?;
                // Sequence lengths re-read from shared memory (volatile) every work tile:
                // ptxas cannot hoist what is derived from them (tile-walk bounds, the
                // scheduler's divisions) out of the loop and keep it live in registers the
                // small-budget roles do not have.
                let scal = kb.add(self.smem, kb.i32c(self.cfg.smem().scalars as i64), "")?;
                let seqlen_q = kb.ld_volatile_shared_b32(scal, "seqlen_q")?;
                let seqlen_k = kb.ld_volatile_shared_b32(kb.add(scal, kb.i32c(4), "")?, "seqlen_k")?;
                let g = kb.i32c(self.packed_group());
                let num_m = kb.ceil_div(kb.mul(seqlen_q, g, "")?, kb.i32c(self.tile_rows()), "num_m_blocks")?;
                let heads = self.tile_heads();
                let section = if self.cfg.lpt {
                    emit_section_heads(
                        kb,
                        seqlen_k,
                        i64::from(self.spec.head_dim_qk + self.spec.head_dim_v) * 2,
                        heads,
                        crate::families::common::schedule::L2_SECTION_BYTES,
                    )?
                } else {
                    kb.i32c(1)
                };
                let (inner, split) = match self.num_splits()? {
                    Some(ns) => (kb.udiv(tt, ns, "tile_inner")?, kb.urem(tt, ns, "tile_split")?),
                    None => (tt, kb.i32c(0)),
                };
                let mut wt = emit_tile_coords(kb, inner, num_m, heads, self.cfg.lpt, section, seqlen_q, seqlen_k)?;
                wt.split = split;
                if self.spec.kv_layout == KvLayout::Varlen {
                    // Packed sequences: this entry's lengths and first rows; the tensor
                    // maps span all rows (batch coordinate 0).
                    let at = |kb: &Kb<'ctx>, base: IntValue<'ctx>, i: IntValue<'ctx>, n: &str| -> R<IntValue<'ctx>> {
                        let a = kb.add(base, kb.mul(kb.sext64(i, "")?, kb.i64c(4), "")?, "")?;
                        kb.ld_global_i32(a, n)
                    };
                    let (cq, ck) = (self.arg("cu_seqlens_q")?, self.arg("cu_seqlens_k")?);
                    let b1 = kb.add(wt.b, kb.i32c(1), "")?;
                    let (q0, q1) = (at(kb, cq, wt.b, "q_start")?, at(kb, cq, b1, "q_end")?);
                    let (k0, k1) = (at(kb, ck, wt.b, "k_start")?, at(kb, ck, b1, "k_end")?);
                    wt.seqlen_q = kb.sub(q1, q0, "seqlen_q.b")?;
                    wt.seqlen_k = kb.sub(k1, k0, "seqlen_k.b")?;
                    wt.q_start = q0;
                    wt.k_start = k0;
                    wt.tma_b = kb.i32c(0);
                }
                if let KvLayout::Paged { .. } = self.spec.kv_layout {
                    // Keys of this entry's cache; K/V coordinates are (page, row in page).
                    let su = self.arg("seqused_k")?;
                    let a = kb.add(su, kb.mul(kb.sext64(wt.b, "")?, kb.i64c(4), "")?, "")?;
                    wt.seqlen_k = kb.ld_global_i32(a, "seqlen_k.b")?;
                }
                wt.rows = kb.mul(wt.seqlen_q, g, "rows")?;
                body(kb, wt)?;
                let step = kb.sreg("nctaid.x", "")?;
                let tt = kb.get_i(t, "")?;
                kb.set(t, kb.add(tt, step, "")?)
            },
        )
    }

    /// Work tiles of the launch from the volatile seqlen_q copy in shared memory (not
    /// hoistable: computed where it is needed, it holds no register across the loop).
    fn work_tiles(&self, kb: &Kb<'ctx>) -> R<IntValue<'ctx>> {
        let scal = kb.add(self.smem, kb.i32c(self.cfg.smem().scalars as i64), "")?;
        let seqlen_q = kb.ld_volatile_shared_b32(scal, "seqlen_q")?;
        self.work_tiles_for(kb, seqlen_q)
    }

    /// Work tiles of the launch from the seqlen_q parameter.
    fn work_tiles_from_params(&self, kb: &Kb<'ctx>) -> R<IntValue<'ctx>> {
        self.work_tiles_for(kb, self.seqlen_q)
    }

    /// m blocks × tile heads × batch (× splits) for `seqlen_q`.
    fn work_tiles_for(&self, kb: &Kb<'ctx>, seqlen_q: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let rows = kb.mul(seqlen_q, kb.i32c(self.packed_group()), "")?;
        let num_m = kb.ceil_div(rows, kb.i32c(self.tile_rows()), "num_m_blocks")?;
        let total = kb.mul(kb.mul(num_m, kb.i32c(self.tile_heads() as i64), "")?, self.batch, "work_tiles")?;
        match self.num_splits()? {
            Some(ns) => kb.mul(total, ns, "work_tiles_split"),
            None => Ok(total),
        }
    }

    /// The runtime split count, when the spec has split-KV (1 means: write O itself).
    fn num_splits(&self) -> R<Option<IntValue<'ctx>>> {
        if self.spec.split_kv == attnc_ir::SplitKv::None {
            return Ok(None);
        }
        Ok(Some(self.arg("num_splits")?))
    }

    fn hkv(&self, kb: &Kb<'ctx>, wt: &WorkTile<'ctx>) -> R<IntValue<'ctx>> {
        if self.spec.pack_gqa {
            return Ok(wt.h);
        }
        kb.udiv(wt.h, kb.i32c(self.group()), "hkv")
    }

    /// Rows per query position: G with pack_gqa, else 1.
    fn packed_group(&self) -> i64 {
        if self.spec.pack_gqa {
            self.group()
        } else {
            1
        }
    }

    /// The head dimension of the tile grid: KV heads with pack_gqa, else query heads.
    fn tile_heads(&self) -> u32 {
        if self.spec.pack_gqa {
            self.spec.kv_heads
        } else {
            self.spec.q_heads
        }
    }

    /// Packed row `pr` of `wt` → (query position, query head).
    fn row_qh(&self, kb: &Kb<'ctx>, wt: &WorkTile<'ctx>, pr: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        if !self.spec.pack_gqa {
            return Ok((pr, wt.h));
        }
        let g = kb.i32c(self.group());
        let q = kb.udiv(pr, g, "q_pos")?;
        let h = kb.add(kb.mul(wt.h, g, "")?, kb.urem(pr, g, "")?, "head")?;
        Ok((q, h))
    }

    /// Classification of key tile `j` for (packed) rows [q_lo, q_hi] of work tile `wt`.
    fn classify(
        &self,
        kb: &Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        q_lo: IntValue<'ctx>,
        q_hi: IntValue<'ctx>,
        j: IntValue<'ctx>,
    ) -> R<TileClassVals<'ctx>> {
        if let Some(c) = &self.classes {
            return self.classify_from_table(kb, c, wt, q_lo, q_hi, j);
        }
        let n0 = kb.mul(j, kb.i32c(BLOCK_N as i64), "n0")?;
        let k_hi = kb.sub(kb.smin(kb.add(n0, kb.i32c(BLOCK_N as i64), "")?, wt.seqlen_k, "")?, kb.i32c(1), "")?;
        let hkv = self.hkv(kb, wt)?;
        let (q, h) = if self.spec.pack_gqa {
            let g = kb.i32c(self.group());
            let h_lo = kb.mul(hkv, g, "")?;
            ((kb.udiv(q_lo, g, "")?, kb.udiv(q_hi, g, "")?), (h_lo, kb.add(h_lo, kb.i32c(self.group() - 1), "")?))
        } else {
            ((q_lo, q_hi), (wt.h, wt.h))
        };
        let tile = TileRanges {
            b: (wt.b, wt.b),
            h,
            hkv: (hkv, hkv),
            q,
            k: (n0, k_hi),
            seqlen_q: wt.seqlen_q,
            seqlen_k: wt.seqlen_k,
        };
        classify_tile(kb, self.spec, &tile, &self.va)
    }

    /// [`Fwd::classify`] from the block mask's class table (128 packed rows × 128 keys per
    /// entry): rows `[q_lo, q_hi]` span one or two row tiles; the range is empty when
    /// every row tile is, full when every one is.
    fn classify_from_table(
        &self,
        kb: &Kb<'ctx>,
        c: &BlockListArgs<'ctx>,
        wt: &WorkTile<'ctx>,
        q_lo: IntValue<'ctx>,
        q_hi: IntValue<'ctx>,
        j: IntValue<'ctx>,
    ) -> R<TileClassVals<'ctx>> {
        let slots = HeadSlots::for_spec(self.spec, self.spec.pack_gqa);
        let slot = BlockListArgs::head_slot(kb, slots, wt.h, self.hkv(kb, wt)?);
        let lo = c.class_code(kb, wt.b, slot, kb.udiv(q_lo, kb.i32c(BLOCK_M as i64), "")?, j)?;
        let hi = c.class_code(kb, wt.b, slot, kb.udiv(q_hi, kb.i32c(BLOCK_M as i64), "")?, j)?;
        classes_of(kb, &[lo, hi])
    }

    /// Walks the key tiles of `wt` that the mask does not rule out for its 256 rows,
    /// last to first, within the work tile's split share; `body(j, idx)` gets the tile
    /// index and its position among the non-empty ones. Returns how many there were.
    /// Every role runs the same walk.
    fn for_each_kv_tile(
        &self,
        kb: &mut Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        body: impl FnOnce(&mut Kb<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>,
    ) -> R<IntValue<'ctx>> {
        let (lo, hi) = self.kv_range(kb, wt)?;
        let j = kb.slot_i32("kv_tile", kb.sub(hi, kb.i32c(1), "")?)?;
        let idx = kb.slot_i32("kv_idx", kb.i32c(0))?;
        let masked = self.spec.mask.to_predicate().is_some();
        kb.while_loop(
            "kv_tiles",
            |kb| {
                let jj = kb.get_i(j, "")?;
                kb.icmp(IntPredicate::SGE, jj, lo, "")
            },
            |kb| {
                let jj = kb.get_i(j, "j")?;
                let run = |kb: &mut Kb<'ctx>| -> R<()> {
                    let i = kb.get_i(idx, "idx")?;
                    body(kb, jj, i)?;
                    let i = kb.get_i(idx, "")?;
                    kb.set(idx, kb.add(i, kb.i32c(1), "")?)
                };
                if masked {
                    let live = kb.not(self.tile_empty(kb, wt, jj)?, "tile_live")?;
                    kb.if_then(live, "kv_tile_live", run)?;
                } else {
                    run(kb)?;
                }
                let jj = kb.get_i(j, "")?;
                kb.set(j, kb.sub(jj, kb.i32c(1), "")?)
            },
        )?;
        kb.get_i(idx, "kv_count")
    }

    /// Whether the mask rules out key tile `j` for all 256 rows of `wt`.
    fn tile_empty(&self, kb: &Kb<'ctx>, wt: &WorkTile<'ctx>, j: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let row0 = kb.mul(wt.m, kb.i32c(self.tile_rows()), "row0")?;
        let q_hi = kb.sub(kb.smin(kb.add(row0, kb.i32c(self.tile_rows()), "")?, wt.rows, "")?, kb.i32c(1), "")?;
        Ok(self.classify(kb, wt, row0, q_hi, j)?.empty)
    }

    /// The key tiles `[lo, hi)` this work tile walks: all of them, or with split-KV the
    /// split's share of the span from the first to the last tile the mask leaves
    /// (equal shares of that span, as the other families cut it; a share may be empty,
    /// and its partial then has LSE = −∞, which the combine ignores).
    fn kv_range(&self, kb: &mut Kb<'ctx>, wt: &WorkTile<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let n = self.kv_tiles(kb, wt)?;
        let Some(ns) = self.num_splits()? else {
            return Ok((kb.i32c(0), n));
        };
        let (first, stop) = if self.spec.mask.to_predicate().is_some() {
            let first = kb.slot_i32("split_first", kb.i32c(0))?;
            kb.while_loop(
                "split_first",
                |kb| {
                    let f = kb.get_i(first, "")?;
                    let inside = kb.icmp(IntPredicate::SLT, f, n, "")?;
                    kb.and(inside, self.tile_empty(kb, wt, f)?, "")
                },
                |kb| {
                    let f = kb.get_i(first, "")?;
                    kb.set(first, kb.add(f, kb.i32c(1), "")?)
                },
            )?;
            let first = kb.get_i(first, "first_live")?;
            let stop = kb.slot_i32("split_stop", n)?;
            kb.while_loop(
                "split_stop",
                |kb| {
                    let t = kb.get_i(stop, "")?;
                    let above = kb.icmp(IntPredicate::SGT, t, first, "")?;
                    kb.and(above, self.tile_empty(kb, wt, kb.sub(t, kb.i32c(1), "")?)?, "")
                },
                |kb| {
                    let t = kb.get_i(stop, "")?;
                    kb.set(stop, kb.sub(t, kb.i32c(1), "")?)
                },
            )?;
            (first, kb.get_i(stop, "stop_live")?)
        } else {
            (kb.i32c(0), n)
        };
        let per = kb.ceil_div(kb.sub(stop, first, "")?, ns, "tiles_per_split")?;
        let lo = kb.smin(kb.add(first, kb.mul(wt.split, per, "")?, "")?, stop, "split_lo")?;
        let hi = kb.smin(kb.add(lo, per, "")?, stop, "split_hi")?;
        Ok((lo, hi))
    }

    /// How many key tiles [`Fwd::for_each_kv_tile`] visits for `wt` (a separate loop, so
    /// roles that only need the count keep the classification's registers out of their
    /// main loop).
    fn count_kv_tiles(&self, kb: &mut Kb<'ctx>, wt: &WorkTile<'ctx>) -> R<IntValue<'ctx>> {
        if self.spec.mask.to_predicate().is_none() {
            let (lo, hi) = self.kv_range(kb, wt)?;
            return kb.sub(hi, lo, "kv_count");
        }
        self.for_each_kv_tile(kb, wt, |_, _, _| Ok(()))
    }

    /// Key tiles of `wt` before the mask: `ceil(seqlen_k / 128)`, or 0 when the work
    /// tile has no query row (varlen: m blocks past this sequence's end).
    fn kv_tiles(&self, kb: &Kb<'ctx>, wt: &WorkTile<'ctx>) -> R<IntValue<'ctx>> {
        let n = kb.ceil_div(wt.seqlen_k, kb.i32c(BLOCK_N as i64), "kv_tiles")?;
        if self.spec.kv_layout != KvLayout::Varlen {
            return Ok(n);
        }
        let row0 = kb.mul(wt.m, kb.i32c(self.tile_rows()), "")?;
        let has_rows = kb.icmp(IntPredicate::SLT, row0, wt.rows, "has_rows")?;
        kb.select_i(has_rows, n, kb.i32c(0), "kv_tiles")
    }

    /// `for idx in 0..n { body(idx) }`.
    fn for_n(
        &self,
        kb: &mut Kb<'ctx>,
        n: IntValue<'ctx>,
        body: impl FnOnce(&mut Kb<'ctx>, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        kb.for_range(kb.i32c(0), n, "kv_idx", body)
    }

    // ------------------------------------------------------------ TMA producer

    fn producer(&self, kb: &mut Kb<'ctx>) -> R<()> {
        kb.section("role: TMA load warp (one thread)")?;
        let spec = self.spec;
        let tq = kb.param_generic_addr(&self.param_symbol("tmap_q")?, "tmap_q")?;
        kb.tensormap_prefetch(tq)?;
        // K/V maps, unless warps 14-15 gather the rows.
        let kv_maps = if self.cfg.gather {
            None
        } else {
            let tk = kb.param_generic_addr(&self.param_symbol("tmap_k")?, "tmap_k")?;
            let tv = kb.param_generic_addr(&self.param_symbol("tmap_v")?, "tmap_v")?;
            kb.tensormap_prefetch(tk)?;
            kb.tensormap_prefetch(tv)?;
            Some((tk, tv))
        };
        let kv_pos = kb.slot_i32("load_kv_pos", kb.i32c(0))?;
        let q_cnt = kb.slot_i32("load_q_count", kb.i32c(0))?;
        let layout = self.cfg.smem();
        self.persistent(kb, |kb, wt| {
            let hkv = self.hkv(kb, &wt)?;
            let row0 = kb.mul(wt.m, kb.i32c(self.tile_rows()), "row0")?;
            let base = kb.get_i(kv_pos, "kv_base")?;
            let n = self.for_each_kv_tile(kb, &wt, |kb, j, idx| {
                let first = kb.icmp(IntPredicate::EQ, idx, kb.i32c(0), "")?;
                kb.if_then(first, "load_q", |kb| {
                    let qc = kb.get_i(q_cnt, "")?;
                    let par = kb.xor(self.parity(kb, qc)?, kb.i32c(1), "")?;
                    kb.mbar_wait(self.bar(kb, Bar::QEmpty)?, par)?;
                    for i in 0..self.cfg.q_tiles {
                        let full = self.bar(kb, Bar::QFull(i))?;
                        kb.mbar_arrive_expect_tx(full, Config::boxes(spec.head_dim_qk) * TMA_BOX_BYTES)?;
                        let prow = kb.add(row0, kb.i32c((i * BLOCK_M) as i64), "")?;
                        for cb in 0..Config::boxes(spec.head_dim_qk) {
                            let dst =
                                kb.add(self.smem, kb.i32c((layout.q[i as usize] + cb * TMA_BOX_BYTES) as i64), "")?;
                            let c0 = kb.i32c((cb * TMA_BOX_COLS) as i64);
                            if spec.pack_gqa {
                                // Box {64, G, 128/G}: packed row r = position·G + head-in-group.
                                let pos = kb.add(wt.q_start, kb.udiv(prow, kb.i32c(self.group()), "")?, "")?;
                                kb.tma_load_5d(dst, tq, [c0, kb.i32c(0), pos, wt.h, wt.tma_b], full)?;
                            } else {
                                let row = kb.add(wt.q_start, prow, "")?;
                                kb.tma_load_4d(dst, tq, [c0, row, wt.h, wt.tma_b], full)?;
                            }
                        }
                    }
                    kb.set(q_cnt, kb.add(qc, kb.i32c(1), "")?)
                })?;
                let Some((tk, tv)) = kv_maps else { return Ok(()) };
                let kpos = kb.add(base, kb.mul(idx, kb.i32c(2), "")?, "kpos")?;
                let boxes = self.kv_boxes(kb, &wt, j)?;
                self.load_kv(kb, kpos, tk, spec.head_dim_qk, &boxes, hkv)?;
                let vpos = kb.add(kpos, kb.i32c(1), "vpos")?;
                self.load_kv(kb, vpos, tv, spec.head_dim_v, &boxes, hkv)
            })?;
            kb.set(kv_pos, kb.add(base, kb.mul(n, kb.i32c(2), "")?, "")?)
        })
    }

    /// Where key tile `j` of `wt` comes from: TMA boxes as (row, outermost coordinate),
    /// stacked in shared memory in this order. Contiguous and varlen: one 128-row box at
    /// (first key, batch). Paged: the rows' pages from the block table — one box inside
    /// the page when pages hold whole tiles, else one box per page; pages past the
    /// sequence's last are clamped to it (their rows are past seqlen_k: masked, and
    /// their V rows zeroed before P·V, see `zero_v_tail`).
    fn kv_boxes(
        &self,
        kb: &mut Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        j: IntValue<'ctx>,
    ) -> R<Vec<(IntValue<'ctx>, IntValue<'ctx>)>> {
        let key0 = kb.add(wt.k_start, kb.mul(j, kb.i32c(BLOCK_N as i64), "")?, "key0")?;
        let KvLayout::Paged { page_size } = self.spec.kv_layout else {
            return Ok(vec![(key0, wt.tma_b)]);
        };
        kb.section("paged KV: page indices of this tile from the block table")?;
        let ps = kb.i32c(page_size as i64);
        let bt = self.arg("block_table")?;
        let row = kb.mul(kb.sext64(wt.b, "")?, self.arg("block_table_stride")?, "")?;
        let entry_addr = |kb: &Kb<'ctx>, page_idx: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let e = kb.add(row, kb.sext64(page_idx, "")?, "")?;
            kb.add(bt, kb.mul(e, kb.i64c(4), "")?, "bt_entry")
        };
        if page_size >= BLOCK_N {
            let page = kb.ld_global_i32(entry_addr(kb, kb.udiv(key0, ps, "")?)?, "page")?;
            return Ok(vec![(kb.urem(key0, ps, "row_in_page")?, page)]);
        }
        let last = kb.udiv(kb.sub(wt.seqlen_k, kb.i32c(1), "")?, ps, "last_page")?;
        let first = kb.udiv(key0, ps, "first_page")?;
        (0..BLOCK_N / page_size)
            .map(|p| {
                let idx = kb.smin(kb.add(first, kb.i32c(p as i64), "")?, last, "")?;
                Ok((kb.i32c(0), kb.ld_global_i32(entry_addr(kb, idx)?, "page")?))
            })
            .collect()
    }

    /// TMA of one K or V tile into ring position `pos`: `ceil(d / 64)` column boxes (the
    /// bytes counted include a last box's zero-filled columns past d), each made
    /// of `boxes` stacked along the keys.
    fn load_kv(
        &self,
        kb: &mut Kb<'ctx>,
        pos: IntValue<'ctx>,
        tmap: IntValue<'ctx>,
        d: u32,
        boxes: &[(IntValue<'ctx>, IntValue<'ctx>)],
        hkv: IntValue<'ctx>,
    ) -> R<()> {
        let layout = self.cfg.smem();
        let (slot, par) = self.ring(kb, pos)?;
        kb.mbar_wait(self.bar_slot(kb, Bar::KvEmpty, slot)?, kb.xor(par, kb.i32c(1), "")?)?;
        let full = self.bar_slot(kb, Bar::KvFull, slot)?;
        kb.mbar_arrive_expect_tx(full, Config::boxes(d) * TMA_BOX_BYTES)?;
        let dst = kb.add(
            self.smem,
            kb.add(kb.i32c(layout.kv as i64), kb.mul(slot, kb.i32c(layout.kv_slot_bytes as i64), "")?, "")?,
            "kv_dst",
        )?;
        let box_bytes = TMA_BOX_BYTES / boxes.len() as u32;
        for cb in 0..Config::boxes(d) {
            for (i, &(row, outer)) in boxes.iter().enumerate() {
                let dst = kb.add(dst, kb.i32c((cb * TMA_BOX_BYTES + i as u32 * box_bytes) as i64), "")?;
                kb.tma_load_4d(dst, tmap, [kb.i32c((cb * TMA_BOX_COLS) as i64), row, hkv, outer], full)?;
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ row gather (paged)

    /// Gather warp 14 (K) or 15 (V), paged K/V whose pages TMA boxes cannot follow: per
    /// key tile, each lane reads the pages of rows `lane + 32 i` (one block-table read
    /// each, issued before the slot wait so their latency overlaps it); then the warp
    /// copies 4 rows × 128 bytes per cp.async round into the slot's 128-byte-swizzled
    /// layout (the one TMA would produce), the offsets exchanged by shuffles. Rows past
    /// seqlen_k and columns past d are zero-filled (src-size 0), so nothing stale reaches
    /// P·V. Each lane's `cp.async.mbarrier.arrive.noinc` completes `KvFull` (32 arrivals)
    /// when its copies land.
    fn gather(&self, kb: &mut Kb<'ctx>, is_v: bool) -> R<()> {
        let spec = self.spec;
        let KvLayout::Paged { page_size } = spec.kv_layout else {
            return Err(LowerError::Llvm("row gather without a paged layout".into()));
        };
        let t = if is_v { "v" } else { "k" };
        kb.section(&format!("role: {} row gather (cp.async, warp {})", t.to_uppercase(), if is_v { 15 } else { 14 }))?;
        let d = if is_v { spec.head_dim_v } else { spec.head_dim_qk };
        let base = self.arg(t)?;
        let (sb, sr, sh) = (
            self.arg(&format!("{t}_stride_batch"))?,
            self.arg(&format!("{t}_stride_row"))?,
            self.arg(&format!("{t}_stride_head"))?,
        );
        let kv_pos = kb.slot_i32("gather_kv_pos", kb.i32c(0))?;
        let ps = kb.i32c(page_size as i64);
        self.persistent(kb, |kb, wt| {
            let hkv = kb.sext64(self.hkv(kb, &wt)?, "")?;
            let bt = self.arg("block_table")?;
            let bt_row = kb.mul(kb.sext64(wt.b, "")?, self.arg("block_table_stride")?, "bt_row")?;
            let base_pos = kb.get_i(kv_pos, "kv_base")?;
            let n = self.for_each_kv_tile(kb, &wt, |kb, j, idx| {
                let pos =
                    kb.add(kb.add(base_pos, kb.mul(idx, kb.i32c(2), "")?, "")?, kb.i32c(is_v as i64), "gather_pos")?;
                let (slot, par) = self.ring(kb, pos)?;
                let n0 = kb.mul(j, kb.i32c(BLOCK_N as i64), "n0")?;
                let lane = kb.and(kb.opaque_i32(kb.sreg("tid.x", "")?, "")?, kb.i32c(31), "lane")?;
                let sub_row = kb.udiv(lane, kb.i32c(8), "sub_row")?;
                let chunk = kb.and(lane, kb.i32c(7), "chunk")?;
                kb.section("gather: this lane's rows' pages from the block table")?;
                // Only the page index (i32) stays live across the slot wait; the row's
                // offset is rebuilt in its copy round (registers are the gather's limit).
                let own: Vec<IntValue<'ctx>> = (0..BLOCK_N / 32)
                    .map(|i| {
                        let key = kb.add(n0, kb.add(lane, kb.i32c(32 * i as i64), "")?, "")?;
                        let valid = kb.icmp(IntPredicate::SLT, key, wt.seqlen_k, "")?;
                        let key = kb.select_i(valid, key, kb.i32c(0), "key_clamped")?;
                        let entry = kb.add(bt_row, kb.sext64(kb.udiv(key, ps, "")?, "")?, "")?;
                        kb.ld_global_i32(kb.add(bt, kb.mul(entry, kb.i64c(4), "")?, "")?, "page")
                    })
                    .collect::<R<_>>()?;
                kb.mbar_wait(self.bar_slot(kb, Bar::KvEmpty, slot)?, kb.xor(par, kb.i32c(1), "")?)?;
                let dst0 = self.kv_addr(kb, slot)?;
                kb.section("gather: cp.async 4 rows x 128 bytes per round into the swizzled slot")?;
                for (i, &own_page) in own.iter().enumerate() {
                    // A run-time loop: an unrolled one keeps every address live.
                    kb.for_range(kb.i32c(0), kb.i32c(8), "gather_rows", |kb, jj| {
                        let src = kb.add(kb.mul(jj, kb.i32c(4), "")?, sub_row, "src_lane")?;
                        let r = kb.add(kb.i32c(32 * i as i64), src, "row")?;
                        let page = kb.shfl_idx_i32(own_page, src, "row_page")?;
                        let key = kb.add(n0, r, "key")?;
                        let valid = kb.icmp(IntPredicate::SLT, key, wt.seqlen_k, "")?;
                        let in_page = kb.sext64(kb.urem(kb.select_i(valid, key, kb.i32c(0), "")?, ps, "")?, "")?;
                        let off = kb.add(kb.mul(kb.sext64(page, "")?, sb, "")?, kb.mul(in_page, sr, "")?, "")?;
                        let off = kb.add(off, kb.mul(hkv, sh, "")?, "row_off")?;
                        let bytes = kb.select_i(valid, kb.i32c(16), kb.i32c(0), "")?;
                        let row_gaddr = kb.add(base, kb.mul(off, kb.i64c(2), "")?, "")?;
                        let s_row = emit_chunk_addr(kb, dst0, r, chunk)?;
                        crate::variant::layout::cp_async_row_chunks(
                            kb,
                            s_row,
                            TMA_BOX_BYTES,
                            row_gaddr,
                            base,
                            chunk,
                            d,
                            bytes,
                        )?;
                        Ok(())
                    })?;
                }
                kb.cp_async_mbar_arrive_noinc(self.bar_slot(kb, Bar::KvFull, slot)?)
            })?;
            kb.set(kv_pos, kb.add(base_pos, kb.mul(n, kb.i32c(2), "")?, "")?)
        })
    }

    /// Waits for a K/V slot; after a cp.async gather also orders those generic-proxy
    /// writes before the tensor core's (async-proxy) reads.
    fn wait_kv_full(&self, kb: &Kb<'ctx>, slot: IntValue<'ctx>, parity: IntValue<'ctx>) -> R<()> {
        kb.mbar_wait(self.bar_slot(kb, Bar::KvFull, slot)?, parity)?;
        if self.cfg.gather {
            kb.fence_proxy_async_shared()?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ MMA issuer

    fn kv_addr(&self, kb: &Kb<'ctx>, slot: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let layout = self.cfg.smem();
        kb.add(
            self.smem,
            kb.add(kb.i32c(layout.kv as i64), kb.mul(slot, kb.i32c(layout.kv_slot_bytes as i64), "")?, "")?,
            "kv_addr",
        )
    }

    /// The low 32 bits of an SW128 descriptor for the matrix at shared address `addr`:
    /// `(addr >> 4) | low constant bits`; returns it with the constant high word.
    fn desc_lo(&self, kb: &Kb<'ctx>, constant: u64, addr: IntValue<'ctx>) -> R<(IntValue<'ctx>, u32)> {
        let a = kb.b.build_right_shift(addr, kb.i32c(4), false, "")?;
        let lo = kb.or(kb.i32c((constant & 0xFFFF_FFFF) as i64), a, "desc_lo")?;
        Ok((lo, (constant >> 32) as u32))
    }

    /// S_i = Q_i·Kᵀ: d_qk/16 MMAs of K = 16, the first one overwriting.
    fn issue_qk(&self, kb: &Kb<'ctx>, i: u32, k_addr: IntValue<'ctx>) -> R<()> {
        let spec = self.spec;
        let idesc = InstrDesc {
            m: BLOCK_M,
            n: BLOCK_N,
            a: spec.dtype.into(),
            b: spec.dtype.into(),
            d: DFormat::F32,
            a_major: Major::K,
            b_major: Major::K,
        };
        let c = SmemDesc::k_major_sw128(0).encode_without_start();
        let q_addr = kb.add(self.smem, kb.i32c(self.cfg.smem().q[i as usize] as i64), "q_addr")?;
        let d_off = self.cfg.tmem().s[i as usize];
        let (qlo, hi) = self.desc_lo(kb, c, q_addr)?;
        let (klo, _) = self.desc_lo(kb, c, k_addr)?;
        for kk in 0..spec.head_dim_qk / 16 {
            let a = SmemOperand { lo: qlo, hi, add: k_major_step_offset(BLOCK_M, kk) >> 4 };
            let b = SmemOperand { lo: klo, hi, add: k_major_step_offset(BLOCK_N, kk) >> 4 };
            let acc = if kk == 0 { Acc::Overwrite } else { Acc::Accumulate };
            kb.tcgen05_mma_ss(self.tmem, d_off, a, b, idesc.encode(), acc)?;
        }
        Ok(())
    }

    /// O_i (+)= P_i·V: BLOCK_N/16 MMAs with A = P from TMEM; `acc` (i32) says whether
    /// the first one accumulates.
    fn issue_pv(&self, kb: &Kb<'ctx>, i: u32, v_addr: IntValue<'ctx>, acc: IntValue<'ctx>) -> R<()> {
        let spec = self.spec;
        let idesc = InstrDesc {
            m: BLOCK_M,
            n: spec.head_dim_v,
            a: spec.dtype.into(),
            b: spec.dtype.into(),
            d: DFormat::F32,
            a_major: Major::K,
            b_major: Major::Mn,
        };
        let c = SmemDesc::mn_major_sw128(0, TMA_BOX_BYTES).encode_without_start();
        let t = self.cfg.tmem();
        let (vlo, hi) = self.desc_lo(kb, c, v_addr)?;
        for kk in 0..BLOCK_N / 16 {
            let b = SmemOperand { lo: vlo, hi, add: mn_major_step_offset(kk) >> 4 };
            let acc_k = if kk == 0 { Acc::When(acc) } else { Acc::Accumulate };
            kb.tcgen05_mma_ts(self.tmem, t.o[i as usize], t.p[i as usize] + kk * 8, b, idesc.encode(), acc_k)?;
        }
        Ok(())
    }

    fn mma(&self, kb: &mut Kb<'ctx>) -> R<()> {
        kb.section("role: MMA issue (one thread): tcgen05.mma + tcgen05.commit")?;
        let kv_pos = kb.slot_i32("mma_kv_pos", kb.i32c(0))?;
        let q_cnt = kb.slot_i32("mma_q_count", kb.i32c(0))?;
        let fenced = self.cfg.pv_order == PvOrder::Fenced;
        self.persistent(kb, |kb, wt| {
            let n = self.count_kv_tiles(kb, &wt)?;
            let base = kb.get_i(kv_pos, "kv_base")?;
            // Wait counts derived from the ring position (2 slots per tile) and the
            // number of earlier work tiles with any tile (q_cnt): P_i is awaited once per
            // tile, PV_i completion (fenced order) once per tile but the first.
            let tiles_before = kb.b.build_right_shift(base, kb.i32c(1), false, "tiles_before")?;
            self.for_n(kb, n, |kb, idx| {
                let kpos = kb.add(base, kb.mul(idx, kb.i32c(2), "")?, "kpos")?;
                let (kslot, kpar) = self.ring(kb, kpos)?;
                self.wait_kv_full(kb, kslot, kpar)?;
                let k_addr = self.kv_addr(kb, kslot)?;
                let first = kb.icmp(IntPredicate::EQ, idx, kb.i32c(0), "")?;
                kb.if_else(
                    first,
                    "mma_first",
                    |kb| {
                        kb.section("S_i = Q_i K^T for the first key tile")?;
                        let qc = kb.get_i(q_cnt, "")?;
                        let par = self.parity(kb, qc)?;
                        for i in 0..self.cfg.q_tiles {
                            kb.mbar_wait(self.bar(kb, Bar::QFull(i))?, par)?;
                        }
                        kb.tcgen05_fence_after()?;
                        for i in 0..self.cfg.q_tiles {
                            self.issue_qk(kb, i, k_addr)?;
                            kb.tcgen05_commit(self.bar(kb, Bar::SFull(i))?)?;
                        }
                        Ok(())
                    },
                    |kb| {
                        kb.section("O_i += P_i V(prev), then S_i = Q_i K^T")?;
                        let vpos = kb.sub(kpos, kb.i32c(1), "vpos")?;
                        let (vslot, vpar) = self.ring(kb, vpos)?;
                        self.wait_kv_full(kb, vslot, vpar)?;
                        let v_addr = self.kv_addr(kb, vslot)?;
                        let waits = kb.add(tiles_before, kb.sub(idx, kb.i32c(1), "")?, "p_waits")?;
                        let ppar = self.parity(kb, waits)?;
                        let acc = kb.zext32(kb.icmp(IntPredicate::SGT, idx, kb.i32c(1), "")?, "acc")?;
                        for i in 0..self.cfg.q_tiles {
                            kb.mbar_wait(self.bar(kb, Bar::PFull(i))?, ppar)?;
                            kb.tcgen05_fence_after()?;
                            self.issue_pv(kb, i, v_addr, acc)?;
                            if fenced {
                                // P_i lives in S_i's columns: the next S_i may only be
                                // written once this PV has read it.
                                let qc = kb.get_i(q_cnt, "")?;
                                let pv_waits = kb.sub(waits, qc, "pv_waits")?;
                                let done = self.bar(kb, Bar::PvDone(i))?;
                                kb.tcgen05_commit(done)?;
                                kb.mbar_wait(done, self.parity(kb, pv_waits)?)?;
                            }
                            self.issue_qk(kb, i, k_addr)?;
                            kb.tcgen05_commit(self.bar(kb, Bar::SFull(i))?)?;
                        }
                        kb.tcgen05_commit(self.bar_slot(kb, Bar::KvEmpty, vslot)?)
                    },
                )?;
                kb.tcgen05_commit(self.bar_slot(kb, Bar::KvEmpty, kslot)?)
            })?;
            let any = kb.icmp(IntPredicate::SGT, n, kb.i32c(0), "")?;
            kb.if_then(any, "mma_last_pv", |kb| {
                kb.section("last O_i += P_i V, then O_i is final")?;
                let qc = kb.get_i(q_cnt, "")?;
                kb.set(q_cnt, kb.add(qc, kb.i32c(1), "")?)?;
                kb.tcgen05_commit(self.bar(kb, Bar::QEmpty)?)?;
                let vpos = kb.sub(kb.add(base, kb.mul(n, kb.i32c(2), "")?, "")?, kb.i32c(1), "vpos")?;
                let (vslot, vpar) = self.ring(kb, vpos)?;
                self.wait_kv_full(kb, vslot, vpar)?;
                let v_addr = self.kv_addr(kb, vslot)?;
                let waits = kb.add(tiles_before, kb.sub(n, kb.i32c(1), "")?, "p_waits")?;
                let ppar = self.parity(kb, waits)?;
                let acc = kb.zext32(kb.icmp(IntPredicate::SGT, n, kb.i32c(1), "")?, "acc")?;
                for i in 0..self.cfg.q_tiles {
                    kb.mbar_wait(self.bar(kb, Bar::PFull(i))?, ppar)?;
                    kb.tcgen05_fence_after()?;
                    self.issue_pv(kb, i, v_addr, acc)?;
                    kb.tcgen05_commit(self.bar(kb, Bar::OFull(i))?)?;
                }
                kb.tcgen05_commit(self.bar_slot(kb, Bar::KvEmpty, vslot)?)
            })?;
            kb.set(kv_pos, kb.add(base, kb.mul(n, kb.i32c(2), "")?, "")?)
        })
    }
}
