//! The parts of the backward every family shares: the launch ABI of the backward
//! kernels, the workspace layout, and the small kernels around a family's main loop.
//!
//! ```text
//! preprocess   D = rowsum(dO ∘ O), lse·log2(e) per query row      -> dpsum, lse_log2
//! turn plan    each visit's predecessor in the dQ order   (ordered deterministic mode)
//! main         (the family's) dK, dV per key tile; dQ into dq_accum; aux gradients
//! dq convert   dQ = scale · Σ_slices dq_accum, in the element type
//! sink grad    dsinks[h] = −Σ_rows exp(sink_h − lse) · D           (specs with sinks)
//! aux reduce   aux gradient = Σ_slices partials, in slice order   (deterministic, learnable aux)
//! ```
//!
//! **Workspace.** Per-row values live in `[batch, q_heads, seqlen_pad]` f32 arrays whatever
//! the Q layout (contiguous or varlen: row `q` of sequence `b`), where `seqlen_pad` is the
//! launch's max seqlen_q rounded up to [`ws_row_align`] of the module's query tile (128, or
//! 160 for 80-query tiles): every query tile of the main loop is then 16-byte aligned and
//! inside its row, and rows past a sequence's end hold
//! `D = 0`, `lse_log2 = +∞` (so they contribute `P = 0`). `dq_accum` is
//! `[slices, batch, q_heads, seqlen_pad, d_qk]` f32: one slice when the main kernel adds
//! with atomics, one per key-tile CTA column in deterministic mode, where every element
//! of a slice has exactly one writer and the convert kernel sums slices in order.
//! Learnable aux gradients in deterministic mode go through `aux_grad_ws`,
//! `[slices, Σ aux sizes]` f32 (one slice per (CTA, warp)), summed the same way.

mod dq_layout;
mod rows;

pub use dq_layout::{
    consumer_half_offset, fragment_offset, fragment_store_offset, transposed_fragment_offset, wg_fragment_offset,
    wg_fragment_store_offset, DqAccumLayout, CONSUMER_HALF_FLOATS, FRAG_THREADS, FRAG_TILE_ROWS,
};
pub use rows::{build_dq_convert, build_preprocess, ROWS_PER_CTA, ROWS_PER_WARP, ROW_WARPS};

use super::abi::{describe, kernel_name, variant_params, Args, ParamTy};
use super::dq_order::{DqAccumulation, MAX_TURN_TILES, PLAN_THREADS, TURN_ROWS};
use crate::llvm::kb::{Kb, R};
use crate::module::BlockLayout;
use crate::module::{Grid, KernelInfo, KernelRole, TmaBox};
use crate::variant::expr::VariantArgs;
pub use crate::variant::grad::learnable_aux;
use crate::variant::grad::AuxSink;
use crate::variant::layout::{batch_view, BatchView, LayoutArgs};
use crate::variant::tiles::{DenseClasses, QueryTiles};
use attnc_ir::block_mask::Tiling;
use attnc_ir::{KvLayout, Spec};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{AddressSpace, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;

/// The kernels of every family's backward module, in launch order around the family's
/// main kernel (`main`): preprocess, main, dQ convert, then the sink gradient (specs with
/// sinks), the aux-gradient reduce (learnable aux tensors) and the block classifier at the
/// main kernel's tiling in layout `classes` (`Dense`, or `DenseWithBits` for a main kernel
/// that reads partial tiles' bits; masks over aux tensors; query tiles are per head, never
/// packed).
pub fn build_kernels<'ctx>(
    kb: &mut Kb<'ctx>,
    spec: &Spec,
    classes: BlockLayout,
    dq_layout: DqAccumLayout,
    main: impl FnOnce(&mut Kb<'ctx>) -> R<KernelInfo>,
) -> R<Vec<KernelInfo>> {
    let ws_align = dq_layout.ws_row_align();
    let mut kernels = vec![build_preprocess(kb, spec, &kernel_name(spec, "bwd_pre"), ws_align)?];
    let main = main(kb)?;
    if ws_row_align(main.block_m) != ws_align {
        return Err(crate::error::LowerError::InvalidSpec(format!(
            "backward main kernel of {}-query tiles with a dq_accum layout for {}-row workspace alignment",
            main.block_m, ws_align
        )));
    }
    let tiling = Tiling { block_m: main.block_m, block_n: main.block_n, pack_gqa: false };
    if let Grid::KeyTiles { ordered_dq: true, .. } = main.grid {
        let name = kernel_name(spec, "bwd_turn_plan");
        kernels.push(build_turn_plan(kb, spec, &name, main.block_m, main.block_n)?);
    }
    kernels.push(main);
    kernels.push(build_dq_convert(kb, spec, &kernel_name(spec, "bwd_dq"), dq_layout)?);
    if spec.sinks {
        kernels.push(build_sink_grad(kb, spec, &kernel_name(spec, "bwd_dsinks"), ws_align)?);
    }
    if !learnable_aux(spec).is_empty() {
        kernels.push(build_aux_reduce(kb, spec, &kernel_name(spec, "bwd_daux"))?);
    }
    super::block_mask::push_if_needed(kb, spec, tiling, classes, "bwd_block_classify", &mut kernels)?;
    Ok(kernels)
}

/// Per-(batch, head) rows of the workspace are padded to a multiple of this many queries:
/// the largest power-of-two query tile of any family's main kernel (blackwell's 128), so
/// every tile's bulk copy of its `lse_log2` and D rows stays inside its row.
/// [`ws_row_align`] widens it for tiles that do not divide it.
pub const WS_ROW_ALIGN: u32 = 128;
/// Threads of the sink-gradient and aux-reduce kernels.
pub const REDUCE_THREADS: u32 = 256;

/// The workspace row alignment of a backward module whose main kernel walks
/// `block_m`-query tiles: [`WS_ROW_ALIGN`] where `block_m` divides it, else the least
/// common multiple of `block_m` and the row kernels' [`ROWS_PER_CTA`] (80-query tiles:
/// 160), so every tile, and every `dq_accum` fragment tile, stays inside its head's rows.
pub const fn ws_row_align(block_m: u32) -> u32 {
    if block_m == 0 || WS_ROW_ALIGN % block_m == 0 {
        return WS_ROW_ALIGN;
    }
    let (mut a, mut b) = (block_m, ROWS_PER_CTA);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    block_m / a * ROWS_PER_CTA
}

/// `seqlen` rounded up to `align` ([`ws_row_align`]: the workspace row length).
pub fn padded_seqlen(seqlen: usize, align: u32) -> usize {
    seqlen.div_ceil(align as usize) * align as usize
}

fn push_strides(p: &mut Vec<(String, ParamTy)>, t: &str) {
    for s in ["batch", "row", "head"] {
        p.push((format!("{t}_stride_{s}"), ParamTy::I64));
    }
}

/// Parameters of the backward main kernel (every family's).
pub fn main_params(spec: &Spec) -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    let mut p: Vec<(String, ParamTy)> = Vec::new();
    for t in ["q", "k", "v", "do", "dk", "dv"] {
        p.push((t.into(), Ptr));
    }
    for t in ["q", "k", "v", "do", "dk", "dv"] {
        push_strides(&mut p, t);
    }
    for (n, t) in [("seqlen_q", I32), ("seqlen_k", I32), ("dq_accum", Ptr), ("dpsum", Ptr), ("lse_log2", Ptr)] {
        p.push((n.into(), t));
    }
    // A `dq_order::DqAccumulation`, and the turn flags and plan of its ordered mode.
    p.push(("deterministic".into(), I32));
    p.push(("dq_order".into(), Ptr));
    p.push(("turn_plan".into(), Ptr));
    if !learnable_aux(spec).is_empty() {
        p.push(("aux_grad_ws".into(), Ptr));
    }
    variant_params(spec, &mut p);
    for a in learnable_aux(spec) {
        p.push((format!("aux_grad_{}", a.name), Ptr));
    }
    // The block mask, as dense classes at the backward's tiling (`variant::tiles::DenseClasses`).
    super::abi::block_list_params(spec, &mut p);
    p
}

/// The TMA families' main-kernel parameters: the tensor maps of Q, K, V and dO, then
/// [`main_params`].
pub fn tma_main_params(spec: &Spec) -> Vec<(String, ParamTy)> {
    let mut p: Vec<(String, ParamTy)> =
        ["tmap_q", "tmap_k", "tmap_v", "tmap_do"].iter().map(|n| (n.to_string(), ParamTy::TensorMap)).collect();
    p.extend(main_params(spec));
    p
}

/// The four tensor maps of [`tma_main_params`]: 64-element (128-byte) boxes with the
/// 128-byte swizzle, `block_m` rows for Q and dO, `block_n` for K and V.
pub fn tma_boxes(block_m: u32, block_n: u32) -> Vec<TmaBox> {
    [("q", block_m), ("k", block_n), ("v", block_n), ("do", block_m)]
        .into_iter()
        .map(|(t, rows)| TmaBox {
            param: format!("tmap_{t}"),
            tensor: t.into(),
            box_cols: TMA_BOX_COLS,
            box_rows: rows,
            swizzle_bytes: 128,
            pack_group: 1,
        })
        .collect()
}

/// Columns of one TMA box (64 16-bit elements: the 128-byte swizzle span).
pub const TMA_BOX_COLS: u32 = 64;

/// Parameters of the preprocess kernel.
pub fn preprocess_params(spec: &Spec) -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    let mut p: Vec<(String, ParamTy)> = vec![("o".into(), Ptr), ("do".into(), Ptr)];
    push_strides(&mut p, "o");
    push_strides(&mut p, "do");
    for (n, t) in [
        ("lse", Ptr),
        ("lse_stride_batch", I64),
        ("lse_stride_head", I64),
        ("seqlen_q", I32),
        ("dpsum", Ptr),
        ("lse_log2", Ptr),
        ("dq_accum", Ptr),
        ("dq_slices", I32),
    ] {
        p.push((n.into(), t));
    }
    varlen_params(spec, &mut p);
    p
}

/// Parameters of the dQ convert kernel.
pub fn dq_convert_params(spec: &Spec) -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    let mut p: Vec<(String, ParamTy)> = vec![("dq".into(), Ptr)];
    push_strides(&mut p, "dq");
    for (n, t) in [("seqlen_q", I32), ("dq_accum", Ptr), ("dq_slices", I32)] {
        p.push((n.into(), t));
    }
    varlen_params(spec, &mut p);
    p
}

/// Parameters of the sink-gradient kernel.
pub fn sink_grad_params() -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    [("sinks", Ptr), ("dpsum", Ptr), ("lse_log2", Ptr), ("batch", I32), ("seqlen_q", I32), ("dsinks", Ptr)]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect()
}

/// Parameters of the aux-reduce kernel.
pub fn aux_reduce_params(spec: &Spec) -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    let mut p: Vec<(String, ParamTy)> = vec![("aux_grad_ws".into(), Ptr), ("aux_grad_slices".into(), I32)];
    for a in learnable_aux(spec) {
        p.push((format!("aux_grad_{}", a.name), Ptr));
        for j in 0..a.dims.len() {
            p.push((format!("aux_{}_dim{j}", a.name), I32));
        }
    }
    p
}

/// The query side of varlen: the row kernels map a sequence's rows through
/// `cu_seqlens_q` (the key side is passed along so the layout view is complete).
fn varlen_params(spec: &Spec, p: &mut Vec<(String, ParamTy)>) {
    if spec.kv_layout == KvLayout::Varlen {
        p.push(("cu_seqlens_q".into(), ParamTy::Ptr));
        p.push(("cu_seqlens_k".into(), ParamTy::Ptr));
    }
}

/// The shared-memory base of the module's dynamic shared memory (one `extern` array per
/// module, created by the first kernel that asks).
pub fn dynamic_smem_base<'ctx>(kb: &Kb<'ctx>) -> R<IntValue<'ctx>> {
    let g = match kb.module.get_global("attnc_smem") {
        Some(g) => g,
        None => {
            let g = kb.module.add_global(kb.ctx.i8_type().array_type(0), Some(AddressSpace::from(3u16)), "attnc_smem");
            g.set_alignment(128);
            g.set_linkage(inkwell::module::Linkage::External);
            g
        }
    };
    let p = kb.b.build_ptr_to_int(g.as_pointer_value(), kb.ctx.i64_type(), "")?;
    kb.trunc32(p, "smem_base")
}

/// The TMA backward's tensor maps and this CTA's coordinates in them
/// ([`KeyTileCta::tma_sources`]).
pub struct TmaSources<'ctx> {
    pub q: IntValue<'ctx>,
    pub k: IntValue<'ctx>,
    pub v: IntValue<'ctx>,
    pub d_o: IntValue<'ctx>,
    pub q_row: IntValue<'ctx>,
    pub k_row: IntValue<'ctx>,
    pub batch: IntValue<'ctx>,
}

/// A key-tile backward kernel's view of its CTA (grid `(key tiles | columns, kv_heads,
/// batch)`): its KV head, batch entry and sequence lengths, the workspace row length, and
/// the tile counts at the family's tiling. The TMA families derive it in each role after
/// its `setmaxnreg` (nothing stays live across the register reallocation).
pub struct KeyTileCta<'ctx> {
    pub la: LayoutArgs<'ctx>,
    pub bv: BatchView<'ctx>,
    pub va: VariantArgs<'ctx>,
    pub hkv: IntValue<'ctx>,
    pub seqlen_pad: IntValue<'ctx>,
    pub n_tiles: IntValue<'ctx>,
    pub m_tiles: IntValue<'ctx>,
    pub block_m: u32,
    pub block_n: u32,
}

impl<'ctx> KeyTileCta<'ctx> {
    pub fn new(kb: &mut Kb<'ctx>, spec: &Spec, args: &Args<'ctx>, block_m: u32, block_n: u32) -> R<Self> {
        let hkv = kb.sreg("ctaid.y", "hkv")?;
        let b = kb.opaque_i32(kb.sreg("ctaid.z", "")?, "b")?;
        Self::for_batch(kb, spec, args, b, hkv, block_m, block_n)
    }

    /// The view of batch entry `b` and KV head `hkv` from any kernel with the main
    /// kernel's parameters (the ordered mode's turn plan).
    pub fn for_batch(
        kb: &mut Kb<'ctx>,
        spec: &Spec,
        args: &Args<'ctx>,
        b: IntValue<'ctx>,
        hkv: IntValue<'ctx>,
        block_m: u32,
        block_n: u32,
    ) -> R<Self> {
        let la = args.layout()?;
        let bv = batch_view(kb, spec, &la, b)?;
        let seqlen_pad = emit_seqlen_pad(kb, la.seqlen_q, ws_row_align(block_m))?;
        let n_tiles = kb.ceil_div(bv.seqlen_k, kb.i32c(block_n as i64), "n_tiles")?;
        let m_tiles = kb.ceil_div(bv.seqlen_q, kb.i32c(block_m as i64), "m_tiles")?;
        Ok(KeyTileCta { la, va: args.variant(spec)?, bv, hkv, seqlen_pad, n_tiles, m_tiles, block_m, block_n })
    }

    /// The four tensor maps of [`tma_main_params`] (prefetched) of kernel `kernel`, and
    /// where this CTA's rows start in them: `(maps [q, k, v, dO], q row base, k row base,
    /// batch coordinate)` — varlen rows are packed (the sequence's first row, batch 0).
    pub fn tma_sources(&self, kb: &Kb<'ctx>, spec: &Spec, kernel: &str) -> R<TmaSources<'ctx>> {
        let map = |i: u32, n: &str| kb.param_generic_addr(&format!("{kernel}_param_{i}"), n);
        let maps = [map(0, "tmap_q")?, map(1, "tmap_k")?, map(2, "tmap_v")?, map(3, "tmap_do")?];
        for t in maps {
            kb.tensormap_prefetch(t)?;
        }
        let z = kb.i32c(0);
        let (q_row, k_row, batch) = if spec.kv_layout == KvLayout::Varlen {
            (self.bv.q_start.unwrap_or(z), self.bv.k_start.unwrap_or(z), z)
        } else {
            (z, z, self.bv.b)
        };
        Ok(TmaSources { q: maps[0], k: maps[1], v: maps[2], d_o: maps[3], q_row, k_row, batch })
    }

    /// The ordered mode's order key of key tile `n`'s visit at walk position `position`
    /// (`QueryPair::m`, the rotated walk's position of the query tile): one multiply-add.
    pub fn turn_key(&self, kb: &Kb<'ctx>, n: IntValue<'ctx>, position: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.add(kb.add(kb.mul(position, self.n_tiles, "")?, n, "")?, kb.i32c(1), "turn_mine")
    }

    /// Element index of key tile `n`'s word in the turn plan row of (this batch entry,
    /// head `h`, query tile `m`).
    pub fn turn_plan_index(
        &self,
        kb: &Kb<'ctx>,
        spec: &Spec,
        h: IntValue<'ctx>,
        m: IntValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> R<IntValue<'ctx>> {
        let tiles = (self.block_m, self.block_n);
        turn_plan_index(kb, spec, &self.la, self.seqlen_pad, self.bv.b, tiles, (h, m, n))
    }

    /// The query walk of key tile `n` (its keys clipped to seqlen_k); `rotate`: key tile
    /// `n` starts at query tile `n` (without it, the dQ adds of every key tile of a head
    /// land on the same rows at once).
    pub fn queries<'b>(
        &'b self,
        kb: &Kb<'ctx>,
        spec: &'b Spec,
        args: &Args<'ctx>,
        n: IntValue<'ctx>,
        rotate: bool,
    ) -> R<QueryTiles<'b, 'ctx>> {
        let bn = self.block_n as i64;
        let n0 = kb.mul(n, kb.i32c(bn), "n0")?;
        let k_hi = kb.sub(kb.smin(kb.add(n0, kb.i32c(bn), "")?, self.bv.seqlen_k, "")?, kb.i32c(1), "k_hi")?;
        Ok(QueryTiles {
            spec,
            block_m: self.block_m,
            bv: self.bv,
            hkv: self.hkv,
            k: (n0, k_hi),
            va: &self.va,
            classes: DenseClasses::for_key_tile(spec, args.block_lists().as_ref(), self.bv.b, n),
            rotation: rotate.then_some((n, self.m_tiles)),
            probes: 1,
        })
    }
}

/// Element offset of row `q` of (`b`, `h`) in a `[batch, q_heads, seqlen_pad]` workspace.
pub fn ws_row<'ctx>(
    kb: &Kb<'ctx>,
    q_heads: u32,
    seqlen_pad: IntValue<'ctx>,
    b: IntValue<'ctx>,
    h: IntValue<'ctx>,
    q: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let bh = kb.add(kb.mul(kb.sext64(b, "")?, kb.i64c(q_heads as i64), "")?, kb.sext64(h, "")?, "")?;
    kb.add(kb.mul(bh, kb.sext64(seqlen_pad, "")?, "")?, kb.sext64(q, "")?, "ws_row")
}

/// `seqlen_q` rounded up to `align` ([`ws_row_align`]), in the kernel.
pub fn emit_seqlen_pad<'ctx>(kb: &Kb<'ctx>, seqlen_q: IntValue<'ctx>, align: u32) -> R<IntValue<'ctx>> {
    let a = align as i64;
    if align.is_power_of_two() {
        return kb.and(kb.add(seqlen_q, kb.i32c(a - 1), "")?, kb.i32c(!(a - 1)), "seqlen_pad");
    }
    kb.mul(kb.udiv(kb.add(seqlen_q, kb.i32c(a - 1), "")?, kb.i32c(a), "")?, kb.i32c(a), "seqlen_pad")
}

/// One `dq_accum` slice of a backward main kernel: every CTA adds into slice 0 with
/// atomics, or, in deterministic mode, into its grid column's slice, whose every element
/// then has one adding thread (its adds land in program order).
pub struct DqSlice<'ctx> {
    /// Byte address of the slice.
    pub base: IntValue<'ctx>,
    pub seqlen_pad: IntValue<'ctx>,
    pub b: IntValue<'ctx>,
    q_heads: u32,
    d: u32,
}

impl<'ctx> DqSlice<'ctx> {
    pub fn new(
        kb: &Kb<'ctx>,
        spec: &Spec,
        args: &Args<'ctx>,
        seqlen_pad: IntValue<'ctx>,
        b: IntValue<'ctx>,
        slice: IntValue<'ctx>,
    ) -> R<DqSlice<'ctx>> {
        let d = spec.head_dim_qk as i64;
        let batch = kb.sreg("nctaid.z", "batch")?;
        let slice_elems = kb.mul(
            kb.mul(kb.sext64(batch, "")?, kb.i64c(spec.q_heads as i64), "")?,
            kb.mul(kb.sext64(seqlen_pad, "")?, kb.i64c(d), "")?,
            "slice_elems",
        )?;
        let base = kb.add(
            args.int("dq_accum")?,
            kb.mul(kb.mul(kb.sext64(slice, "")?, slice_elems, "")?, kb.i64c(4), "")?,
            "dq_slice_base",
        )?;
        Ok(DqSlice { base, seqlen_pad, b, q_heads: spec.q_heads, d: spec.head_dim_qk })
    }
}

/// A lane's place in an accumulator fragment of 16 rows × 8-column tiles (mma.sync's
/// m16n8 and each warp's quarter of wgmma's m64 share it): rows `quad_row` and
/// `quad_row + 8`, columns `2·quad_col + {0, 1}` of each tile.
#[derive(Clone, Copy)]
pub struct FragLane<'ctx> {
    pub quad_row: IntValue<'ctx>,
    pub quad_col: IntValue<'ctx>,
}

/// Adds a warp's dQ fragment (16 query rows of head `h` from `q0`; 8-column tiles from
/// column `col0`, `acc[tile][element]`) to `dq` with `red.global.add`. Vector reds
/// (`vec4`, sm_90+): lane pairs of a quad swap halves of adjacent 8-column tiles, so each
/// lane holds 4 adjacent columns: a quarter of the scalar atomics.
#[allow(clippy::too_many_arguments)]
pub fn red_dq_fragment<'ctx>(
    kb: &Kb<'ctx>,
    dq: &DqSlice<'ctx>,
    h: IntValue<'ctx>,
    q0: IntValue<'ctx>,
    col0: IntValue<'ctx>,
    l: FragLane<'ctx>,
    acc: &[[FloatValue<'ctx>; 4]],
    vec4: bool,
) -> R<()> {
    let d = dq.d as i64;
    let odd = kb.icmp(IntPredicate::NE, kb.and(l.quad_col, kb.i32c(1), "")?, kb.i32c(0), "odd_lane")?;
    // One base address per accumulator row; the row's other columns are immediate
    // offsets (2 live addresses, not 64). With .v4 an odd lane's 4 columns start 6
    // columns further (at the partner's tile + 1).
    let mut rows = Vec::new();
    for half in 0..2i64 {
        let q = kb.add(q0, kb.add(l.quad_row, kb.i32c(8 * half), "")?, "")?;
        let row = kb.mul(ws_row(kb, dq.q_heads, dq.seqlen_pad, dq.b, h, q)?, kb.i64c(d), "")?;
        let mut col = kb.add(col0, kb.mul(l.quad_col, kb.i32c(2), "")?, "")?;
        if vec4 {
            col = kb.add(col, kb.select_i(odd, kb.i32c(6), kb.i32c(0), "")?, "")?;
        }
        rows.push(kb.add(dq.base, kb.mul(kb.add(row, kb.zext64(col, "")?, "")?, kb.i64c(4), "")?, "dq_row_addr")?);
    }
    for (half, &row) in rows.iter().enumerate() {
        let (e0, e1) = (2 * half, 2 * half + 1);
        if vec4 {
            for j in 0..acc.len() / 2 {
                let (t0, t1) = (acc[2 * j], acc[2 * j + 1]);
                // Even lanes keep tile 2j's pair and take the partner's; odd lanes
                // keep tile 2j+1's pair and take the partner's.
                let send0 = kb.select_f(odd, t0[e0], t1[e0], "")?;
                let send1 = kb.select_f(odd, t0[e1], t1[e1], "")?;
                let r0 = kb.shfl_xor_f32(send0, 1, "")?;
                let r1 = kb.shfl_xor_f32(send1, 1, "")?;
                let v = [
                    kb.select_f(odd, r0, t0[e0], "")?,
                    kb.select_f(odd, r1, t0[e1], "")?,
                    kb.select_f(odd, t1[e0], r0, "")?,
                    kb.select_f(odd, t1[e1], r1, "")?,
                ];
                kb.red_global_add_v4_f32_at(row, (16 * j) as i64 * 4, v)?;
            }
        } else {
            for (nt, f) in acc.iter().enumerate() {
                let off = (nt * 8) as i64 * 4;
                kb.red_global_add_f32_at(row, off, f[e0])?;
                kb.red_global_add_f32_at(row, off + 4, f[e1])?;
            }
        }
    }
    Ok(())
}

/// Where a main kernel's learnable-aux contributions go: atomics into the outputs, or
/// in deterministic mode this (CTA, warp)'s slice of `aux_grad_ws` (CTAs numbered
/// x-fastest, `warps_per_cta` slices each; the runtime sizes the workspace the same way).
pub fn aux_sink<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    args: &Args<'ctx>,
    deterministic: IntValue<'ctx>,
    warps_per_cta: u32,
    tid: IntValue<'ctx>,
) -> R<AuxSink<'ctx>> {
    let (sizes, total) = aux_sizes(kb, spec, args)?;
    let outputs =
        learnable_aux(spec).iter().map(|a| args.int(&format!("aux_grad_{}", a.name))).collect::<R<Vec<_>>>()?;
    let cta = kb.add(
        kb.mul(
            kb.add(kb.mul(kb.sreg("ctaid.z", "")?, kb.sreg("nctaid.y", "")?, "")?, kb.sreg("ctaid.y", "")?, "")?,
            kb.sreg("nctaid.x", "")?,
            "",
        )?,
        kb.sreg("ctaid.x", "")?,
        "cta_linear",
    )?;
    let warp = kb.udiv(kb.opaque_i32(tid, "")?, kb.i32c(32), "")?;
    let slice = kb.add(kb.mul(cta, kb.i32c(warps_per_cta as i64), "")?, warp, "aux_slice")?;
    let slice_base = kb.add(
        args.int("aux_grad_ws")?,
        kb.mul(kb.mul(kb.sext64(slice, "")?, kb.sext64(total, "")?, "")?, kb.i64c(4), "")?,
        "aux_slice_base",
    )?;
    Ok(AuxSink { deterministic, outputs, sizes, slice_base })
}

/// The sink-gradient kernel: one CTA per head, `dsinks[h] = −Σ_{b, q} exp2(sink·log2 e −
/// lse_log2) · D`, each thread over a fixed set of rows and the threads' sums joined by a
/// fixed tree: the same bits every run.
pub fn build_sink_grad<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str, ws_align: u32) -> R<KernelInfo> {
    let params = sink_grad_params();
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!("attnc backward sink gradient: {} (dsinks = -sum P_sink * D)", spec.name))?;
    let tid = kb.sreg("tid.x", "tid")?;
    let h = kb.sreg("ctaid.x", "h")?;
    let smem = dynamic_smem_base(kb)?;
    let pad = emit_seqlen_pad(kb, args.int("seqlen_q")?, ws_align)?;
    let rows = kb.mul(args.int("batch")?, pad, "rows")?;
    let sink = kb.ld_global_f32(kb.add(args.int("sinks")?, kb.mul(kb.sext64(h, "")?, kb.i64c(4), "")?, "")?, "sink")?;
    let sink2 = kb.fmul(sink, kb.f32c(LOG2E), "sink_log2")?;
    let acc = kb.slot_f32("acc", kb.f32c(0.0))?;
    let i = kb.slot_i32("row", tid)?;
    let (dpsum, lse2) = (args.int("dpsum")?, args.int("lse_log2")?);
    kb.while_loop(
        "rows",
        |kb| {
            let r = kb.get_i(i, "")?;
            kb.icmp(IntPredicate::SLT, r, rows, "")
        },
        |kb| {
            let r = kb.get_i(i, "r")?;
            let bq = kb.udiv(r, pad, "b")?;
            let q = kb.urem(r, pad, "q")?;
            let off = kb.mul(ws_row(kb, spec.q_heads, pad, bq, h, q)?, kb.i64c(4), "")?;
            let d = kb.ld_global_f32(kb.add(dpsum, off, "")?, "d")?;
            let l = kb.ld_global_f32(kb.add(lse2, off, "")?, "lse2")?;
            let p = kb.ex2(kb.fsub(sink2, l, "")?, "p_sink")?;
            kb.set(acc, kb.fma(p, d, kb.get_f(acc, "")?, "")?)?;
            kb.set(i, kb.add(r, kb.i32c(REDUCE_THREADS as i64), "")?)
        },
    )?;
    let total = block_sum(kb, smem, tid, kb.get_f(acc, "")?)?;
    let first = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
    kb.if_then(first, "store", |kb| {
        let addr = kb.add(args.int("dsinks")?, kb.mul(kb.sext64(h, "")?, kb.i64c(4), "")?, "")?;
        kb.st_global_f32(addr, kb.fneg(total, "dsink")?)
    })?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::SinkGrad,
        note: None,
        threads_per_block: REDUCE_THREADS,
        dynamic_smem_bytes: REDUCE_THREADS / 32 * 4,
        block_m: 0,
        block_n: 0,
        params: super::abi::describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::Heads,
    })
}

/// The CTA-wide sum of one value per thread, in a fixed order (warp butterflies, then
/// warp 0 over the warps' sums in warp order); valid in thread 0.
fn block_sum<'ctx>(
    kb: &mut Kb<'ctx>,
    smem: IntValue<'ctx>,
    tid: IntValue<'ctx>,
    v: FloatValue<'ctx>,
) -> R<FloatValue<'ctx>> {
    let warps = REDUCE_THREADS / 32;
    let lane = kb.and(tid, kb.i32c(31), "lane")?;
    let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
    let s = kb.warp_sum_f32(v)?;
    let first = kb.icmp(IntPredicate::EQ, lane, kb.i32c(0), "")?;
    kb.if_then(first, "warp_sum_store", |kb| kb.st_shared_f32(kb.add(smem, kb.mul(warp, kb.i32c(4), "")?, "")?, s))?;
    kb.bar_sync()?;
    let mut total = kb.f32c(0.0);
    for w in 0..warps {
        total = kb.fadd(total, kb.ld_shared_f32(kb.add(smem, kb.i32c(w as i64 * 4), "")?, "w_sum")?, "")?;
    }
    Ok(total)
}

/// The deterministic aux-gradient reduce: element `e` of each learnable aux tensor is
/// the sum of its partials over the slices, in slice order.
pub fn build_aux_reduce<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str) -> R<KernelInfo> {
    let params = aux_reduce_params(spec);
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!("attnc backward aux-gradient reduce: {} (sum of slices, in order)", spec.name))?;
    let e =
        kb.add(kb.mul(kb.sreg("ctaid.x", "")?, kb.i32c(REDUCE_THREADS as i64), "")?, kb.sreg("tid.x", "")?, "elem")?;
    let (sizes, total) = aux_sizes(kb, spec, &args)?;
    let total64 = kb.sext64(total, "")?;
    let ws = args.int("aux_grad_ws")?;
    let slices = args.int("aux_grad_slices")?;
    let mut offset = kb.i32c(0);
    for (a, size) in learnable_aux(spec).into_iter().zip(sizes) {
        let mine = kb.icmp(IntPredicate::SLT, e, size, "")?;
        let off = offset;
        kb.if_then(mine, &format!("reduce_{}", a.name), |kb| {
            let acc = kb.slot_f32("acc", kb.f32c(0.0))?;
            let col = kb.sext64(kb.add(off, e, "")?, "")?;
            kb.for_range(kb.i32c(0), slices, "slice_loop", |kb, s| {
                let idx = kb.add(kb.mul(kb.sext64(s, "")?, total64, "")?, col, "")?;
                let x = kb.ld_global_f32(kb.add(ws, kb.mul(idx, kb.i64c(4), "")?, "")?, "part")?;
                kb.set(acc, kb.fadd(kb.get_f(acc, "")?, x, "")?)
            })?;
            let out =
                kb.add(args.int(&format!("aux_grad_{}", a.name))?, kb.mul(kb.sext64(e, "")?, kb.i64c(4), "")?, "")?;
            kb.st_global_f32(out, kb.get_f(acc, "")?)
        })?;
        offset = kb.add(offset, size, "")?;
    }
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::AuxGradReduce,
        note: None,
        threads_per_block: REDUCE_THREADS,
        dynamic_smem_bytes: 0,
        block_m: 0,
        block_n: 0,
        params: super::abi::describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::AuxElements,
    })
}

/// Each learnable aux tensor's element count (the product of its launch dims, i32) and
/// their total: the slice layout of `aux_grad_ws`.
pub fn aux_sizes<'ctx>(kb: &Kb<'ctx>, spec: &Spec, args: &Args<'ctx>) -> R<(Vec<IntValue<'ctx>>, IntValue<'ctx>)> {
    let mut sizes = Vec::new();
    let mut total = kb.i32c(0);
    for a in learnable_aux(spec) {
        let mut n = kb.i32c(1);
        for j in 0..a.dims.len() {
            n = kb.mul(n, args.int(&format!("aux_{}_dim{j}", a.name))?, "")?;
        }
        total = kb.add(total, n, "")?;
        sizes.push(n);
    }
    Ok((sizes, total))
}

// ------------------------------------------------------------------ ordered dQ (dq_order)

/// `dq_order::order_key` in the kernel (the rotated walk's order).
pub fn emit_order_key<'ctx>(
    kb: &Kb<'ctx>,
    cta: &KeyTileCta<'ctx>,
    n: IntValue<'ctx>,
    m: IntValue<'ctx>,
    name: &str,
) -> R<IntValue<'ctx>> {
    let p = cta.m_tiles;
    let position = kb.urem(kb.sub(kb.add(m, p, "")?, kb.urem(n, p, "")?, "")?, p, "turn_position")?;
    kb.add(kb.add(kb.mul(position, cta.n_tiles, "")?, n, "")?, kb.i32c(1), name)
}

/// The ordered mode's flag of the query tile whose first query is at workspace row
/// `ws_row` (`ws_row`, a multiple of `dq_order::TURN_ROWS`): `[batch, q_heads, seqlen_pad /
/// TURN_ROWS]` u32.
pub fn turn_flag<'ctx>(kb: &Kb<'ctx>, args: &Args<'ctx>, ws_row: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let offset = kb.mul(kb.udiv(ws_row, kb.i64c(TURN_ROWS as i64), "")?, kb.i64c(4), "")?;
    kb.add(args.int("dq_order")?, offset, "turn_flag")
}

/// Element index of key tile `n`'s word in the turn plan row of (`b`, `h`, query tile `m`)
/// (`dq_order::turn_plan_words`; `tiles` = (block_m, block_n)), from the launch arguments
/// alone (no batch view: hopper's dQ writer has 24 registers).
pub fn turn_plan_index<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    la: &LayoutArgs<'ctx>,
    seqlen_pad: IntValue<'ctx>,
    b: IntValue<'ctx>,
    tiles: (u32, u32),
    (h, m, n): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
) -> R<IntValue<'ctx>> {
    let bn = tiles.1 as i64;
    let key_tiles = kb.udiv(kb.add(la.seqlen_k, kb.i32c(bn - 1), "")?, kb.i32c(bn), "")?;
    let stride = kb.and(kb.add(key_tiles, kb.i32c(3), "")?, kb.i32c(!3), "turn_plan_stride")?;
    let m_rows = kb.udiv(seqlen_pad, kb.i32c(tiles.0 as i64), "")?;
    let bh = kb.add(kb.mul(b, kb.i32c(spec.q_heads as i64), "")?, h, "")?;
    let row = kb.add(kb.mul(kb.sext64(bh, "")?, kb.sext64(m_rows, "")?, "")?, kb.sext64(m, "")?, "")?;
    kb.add(kb.mul(row, kb.sext64(stride, "")?, "")?, kb.sext64(n, "")?, "turn_plan_index")
}

/// The turn plan kernel: grid `(ceil(max seqlen_q / block_m), q_heads, batch)`, one CTA
/// per (batch, query head, query tile at `block_m`): every key tile that visits it gets its
/// predecessor's order key (0: the first) — `dq_order::predecessor_key` over the main kernel's
/// classification (intervals or the block mask), for the rotated walk.
pub fn build_turn_plan<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str, block_m: u32, block_n: u32) -> R<KernelInfo> {
    let params = main_params(spec);
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!(
        "attnc backward turn plan: {} (each visit's predecessor in the ordered dQ accumulation)",
        spec.name
    ))?;
    let m = kb.sreg("ctaid.x", "m")?;
    let h = kb.sreg("ctaid.y", "h")?;
    let b = kb.opaque_i32(kb.sreg("ctaid.z", "")?, "b")?;
    let hkv = kb.udiv(h, kb.i32c(spec.group_size() as i64), "hkv")?;
    let cta = KeyTileCta::for_batch(kb, spec, &args, b, hkv, block_m, block_n)?;
    let outside = kb.icmp(IntPredicate::SGE, m, cta.m_tiles, "")?;
    kb.return_if(outside, "query_tile_outside")?;
    let tid = kb.sreg("tid.x", "tid")?;
    let keys = dynamic_smem_base(kb)?;
    let nt = kb.smin(cta.n_tiles, kb.i32c(MAX_TURN_TILES as i64), "n_tiles")?;
    let threads = kb.i32c(PLAN_THREADS as i64);
    let key_at = |kb: &Kb<'ctx>, n: IntValue<'ctx>| kb.add(keys, kb.mul(n, kb.i32c(4), "")?, "key_addr");
    let strided = |kb: &mut Kb<'ctx>, name: &str, body: &dyn Fn(&mut Kb<'ctx>, IntValue<'ctx>) -> R<()>| {
        let n = kb.slot_i32(name, tid)?;
        kb.while_loop(
            name,
            |kb| kb.icmp(IntPredicate::SLT, kb.get_i(n, "")?, nt, ""),
            |kb| {
                let cur = kb.get_i(n, "n")?;
                body(kb, cur)?;
                kb.set(n, kb.add(cur, threads, "")?)
            },
        )
    };
    kb.section("each key tile's order key if it visits the query tile, else 0")?;
    let bm = block_m as i64;
    strided(kb, "visit_keys", &|kb, n| {
        let key = emit_order_key(kb, &cta, n, m, "key")?;
        let visits = if spec.mask.is_none() {
            kb.boolc(true)
        } else {
            let qt = cta.queries(kb, spec, &args, n, false)?;
            let cls = qt.classify(kb, kb.mul(m, kb.i32c(bm), "")?, h)?;
            kb.not(cls.empty, "visits")?
        };
        kb.st_shared_b32(key_at(kb, n)?, kb.select_i(visits, key, kb.i32c(0), "")?)
    })?;
    kb.cta_barrier()?;
    kb.section("each visit's predecessor: the largest key below its own")?;
    let plan = args.int("turn_plan")?;
    strided(kb, "predecessors", &|kb, n| {
        let mine = kb.ld_shared_b32(key_at(kb, n)?, "mine")?;
        let best = kb.slot_i32("best", kb.i32c(0))?;
        kb.for_range(kb.i32c(0), nt, "candidates", |kb, c| {
            let key = kb.ld_shared_b32(key_at(kb, c)?, "cand")?;
            let cur = kb.get_i(best, "")?;
            let better =
                kb.and(kb.icmp(IntPredicate::ULT, key, mine, "")?, kb.icmp(IntPredicate::UGT, key, cur, "")?, "")?;
            kb.set(best, kb.select_i(better, key, cur, "")?)
        })?;
        let idx = cta.turn_plan_index(kb, spec, h, m, n)?;
        let addr = kb.add(plan, kb.mul(idx, kb.i64c(4), "")?, "")?;
        kb.st_global_b32(addr, kb.get_i(best, "pred")?)
    })?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::TurnPlan,
        note: None,
        threads_per_block: PLAN_THREADS,
        dynamic_smem_bytes: 4 * MAX_TURN_TILES,
        block_m,
        block_n,
        params: describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::Rows,
    })
}

/// Whether the key tiles are walked from the last (`variant::tiles::walk_key_tiles`): in
/// the ordered mode, so that CTAs start in the order their turns come. A visit's
/// predecessors are higher key tiles (the query tile's order is descending from it), and
/// under a causal mask those are the short walks: counted from the first, the long walks
/// started first and waited on CTAs not yet started (H100, d128 causal 16k: 0.60× the
/// default; see `docs/hopper.md`).
pub fn reversed_key_tiles<'ctx>(kb: &Kb<'ctx>, args: &Args<'ctx>, kernel_has_it: bool) -> R<IntValue<'ctx>> {
    if !kernel_has_it {
        return Ok(kb.boolc(false));
    }
    dq_mode_is(kb, args, DqAccumulation::Ordered)
}

/// Whether the launch's dQ accumulation (the `deterministic` argument) is `mode`. Read
/// where it is used, through an opaque copy: not hoisted, so no flag stays live across
/// a role's loop (in the 24-register roles and hopper's consumers that cost spills).
pub fn dq_mode_is<'ctx>(kb: &Kb<'ctx>, args: &Args<'ctx>, mode: DqAccumulation) -> R<IntValue<'ctx>> {
    let arg = kb.opaque_i32(args.int("deterministic")?, "dq_accumulation")?;
    kb.icmp(IntPredicate::EQ, arg, kb.i32c(mode.arg() as i64), "dq_mode")
}
