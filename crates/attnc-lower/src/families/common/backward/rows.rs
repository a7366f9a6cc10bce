//! The row kernels around a backward's main loop, a warp per run of consecutive query
//! rows: the preprocess (`D = rowsum(dO ∘ O)` and the LSE in log2 units) and the dQ
//! convert (`dQ = scale · Σ_slices dq_accum` in the element type). Memory-bound, so each
//! warp issues every row's loads before it uses the first.

use super::dq_layout::{
    emit_consumer_half_offset, emit_fragment_offset, emit_transposed_fragment_offset, emit_wg_fragment_offset,
    DqAccumLayout,
};
use super::{dq_convert_params, emit_seqlen_pad, preprocess_params, ws_row, WS_ROW_ALIGN};
use crate::families::common::abi::{Args, ParamTy};
use crate::llvm::kb::{Kb, R};
use crate::module::{Grid, KernelInfo, KernelRole};
use crate::variant::layout::{batch_view, lse_offset, q_row_offset, LayoutArgs};
use attnc_ir::{KvLayout, Spec};
use inkwell::values::IntValue;
use inkwell::{FloatPredicate, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;

/// Warps per CTA of the row kernels (preprocess, dQ convert).
pub const ROW_WARPS: u32 = 4;
/// Rows per warp of the row kernels: each warp issues the loads of all its rows before
/// the first use. With one row per warp (4 per CTA) they were latency-bound: 262144 CTAs
/// of two 4-byte loads per lane at d64 × 32 heads × 32k rows, 199 µs for 272 MB
/// (1.4 TB/s) under ncu on the H100 (`docs/results/2026-11-28-h100-bwd-row-kernels/`).
pub const ROWS_PER_WARP: u32 = 8;
/// Rows per CTA of the row kernels: a divisor of [`WS_ROW_ALIGN`] (and so of every
/// [`super::ws_row_align`]), so the grid covers the
/// padded rows exactly.
pub const ROWS_PER_CTA: u32 = ROW_WARPS * ROWS_PER_WARP;
const _: () = assert!(WS_ROW_ALIGN % ROWS_PER_CTA == 0 && ROWS_PER_WARP <= 32);

/// The query-side layout view of a row kernel (varlen rows through `cu_seqlens_q`).
fn row_layout<'ctx>(args: &Args<'ctx>) -> R<LayoutArgs<'ctx>> {
    let seqlen_q = args.int("seqlen_q")?;
    Ok(LayoutArgs {
        seqlen_q,
        seqlen_k: seqlen_q,
        cu_seqlens_q: args.opt_int("cu_seqlens_q"),
        cu_seqlens_k: args.opt_int("cu_seqlens_k"),
        block_table: None,
        block_table_stride: None,
        seqused_k: None,
    })
}

/// A spec whose K side does not matter (the row kernels only read the query side).
fn query_side(spec: &Spec) -> Spec {
    let mut s = spec.clone();
    if s.kv_layout != KvLayout::Varlen {
        s.kv_layout = KvLayout::Contiguous;
    }
    s
}

fn row_kernel_info(name: &str, role: KernelRole, params: &[(String, ParamTy)]) -> KernelInfo {
    KernelInfo {
        name: name.to_string(),
        role,
        note: None,
        threads_per_block: ROW_WARPS * 32,
        dynamic_smem_bytes: 0,
        block_m: ROWS_PER_CTA,
        block_n: 0,
        params: crate::families::common::abi::describe(params),
        tensor_maps: Vec::new(),
        grid: Grid::WorkspaceRows,
    }
}

/// The rows a warp of a row kernel owns: grid `(seqlen_pad / ROWS_PER_CTA, q_heads,
/// batch)`, warp `w` of CTA `c` the consecutive rows `c · ROWS_PER_CTA + w ·
/// ROWS_PER_WARP + i` for `i` in `0..ROWS_PER_WARP` (so lane `i` can read and write row
/// `i`'s per-row values in one request for the warp). Returns (lane, rows, h, b).
fn row_coords<'ctx>(kb: &Kb<'ctx>) -> R<(IntValue<'ctx>, Vec<IntValue<'ctx>>, IntValue<'ctx>, IntValue<'ctx>)> {
    let tid = kb.sreg("tid.x", "tid")?;
    let lane = kb.and(tid, kb.i32c(31), "lane")?;
    let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
    let first = kb.add(
        kb.mul(kb.sreg("ctaid.x", "")?, kb.i32c(ROWS_PER_CTA as i64), "")?,
        kb.mul(warp, kb.i32c(ROWS_PER_WARP as i64), "")?,
        "q_first",
    )?;
    let rows = (0..ROWS_PER_WARP).map(|i| kb.add(first, kb.i32c(i as i64), "q")).collect::<R<Vec<_>>>()?;
    Ok((lane, rows, kb.sreg("ctaid.y", "h")?, kb.sreg("ctaid.z", "b")?))
}

/// The column pairs a lane reads of a `d`-wide row (two elements per 64-column chunk),
/// with whether each is inside the row.
fn lane_pairs<'ctx>(kb: &Kb<'ctx>, lane: IntValue<'ctx>, d: u32) -> R<Vec<(IntValue<'ctx>, IntValue<'ctx>)>> {
    (0..d.div_ceil(64))
        .map(|chunk| {
            let col = kb.add(kb.mul(lane, kb.i32c(2), "")?, kb.i32c(chunk as i64 * 64), "col")?;
            Ok((col, kb.icmp(IntPredicate::SLT, col, kb.i32c(d as i64), "")?))
        })
        .collect()
}

/// The preprocess kernel: per query row, `D = Σ dO ∘ O` (f32) and the LSE in log2 units,
/// into the workspace; padded rows get `D = 0` and `+∞`, and so does a row whose LSE is
/// −∞ (no key contributed: its P is 0 everywhere, not `exp(s + ∞)`). Each warp reads
/// all its rows' O and dO before it multiplies the first; lane `i` reads row `i`'s LSE
/// and writes its D and log2 LSE (one request per warp for each, not one per row).
pub fn build_preprocess<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str, ws_align: u32) -> R<KernelInfo> {
    let params = preprocess_params(spec);
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!("attnc backward preprocess: {} (D = rowsum(dO*O), lse in log2 units)", spec.name))?;
    let (lane, rows, h, b) = row_coords(kb)?;
    let la = row_layout(&args)?;
    let qs = query_side(spec);
    let bv = batch_view(kb, &qs, &la, b)?;
    let pad = emit_seqlen_pad(kb, la.seqlen_q, ws_align)?;
    let pairs = lane_pairs(kb, lane, spec.head_dim_v)?;
    let (o_st, do_st) = (args.strides("o")?, args.strides("do")?);
    kb.section("loads: every row's O and dO pairs (rows past seqlen_q read nothing), lane i row i's LSE")?;
    let mut loaded = Vec::new();
    for &q in &rows {
        let valid = kb.icmp(IntPredicate::SLT, q, bv.seqlen_q, "row_valid")?;
        let words = pairs
            .iter()
            .map(|_| Ok((kb.slot_i32("o2", kb.i32c(0))?, kb.slot_i32("do2", kb.i32c(0))?)))
            .collect::<R<Vec<_>>>()?;
        kb.if_then(valid, "row", |kb| {
            let o_row = kb.add(args.int("o")?, kb.mul(q_row_offset(kb, &bv, &o_st, q, h)?, kb.i64c(2), "")?, "")?;
            let do_row = kb.add(args.int("do")?, kb.mul(q_row_offset(kb, &bv, &do_st, q, h)?, kb.i64c(2), "")?, "")?;
            for (&(col, in_row), &(o_w, do_w)) in pairs.iter().zip(&words) {
                kb.if_then(in_row, "col_guard", |kb| {
                    let off = kb.mul(kb.zext64(col, "")?, kb.i64c(2), "")?;
                    kb.set(o_w, kb.ld_global_b32(kb.add(o_row, off, "")?, "o2")?)?;
                    kb.set(do_w, kb.ld_global_b32(kb.add(do_row, off, "")?, "do2")?)
                })?;
            }
            Ok(())
        })?;
        loaded.push(words);
    }
    // Lane i < ROWS_PER_WARP: row i's LSE (−∞ past seqlen_q: D = 0, +∞ there).
    let my_q = kb.add(rows[0], lane, "lane_row")?;
    let my_row = kb.icmp(IntPredicate::ULT, lane, kb.i32c(ROWS_PER_WARP as i64), "")?;
    let my_valid = kb.and(my_row, kb.icmp(IntPredicate::SLT, my_q, bv.seqlen_q, "")?, "lane_row_valid")?;
    let lse_slot = kb.slot_f32("lse", kb.f32c(f64::NEG_INFINITY))?;
    kb.if_then(my_valid, "lse_load", |kb| {
        let lse_off = lse_offset(kb, &bv, args.int("lse_stride_batch")?, args.int("lse_stride_head")?, h, my_q)?;
        kb.set(lse_slot, kb.ld_global_f32(kb.add(args.int("lse")?, kb.mul(lse_off, kb.i64c(4), "")?, "")?, "lse")?)
    })?;
    zero_dq_accum(kb, &args, spec, pad, h, b)?;
    kb.section("D = sum over d_v of dO * O (lanes share the columns); lane i keeps row i's")?;
    let mut my_d = kb.f32c(0.0);
    for (i, words) in loaded.into_iter().enumerate() {
        let mut acc = kb.f32c(0.0);
        for (o_w, do_w) in words {
            // Zero words (columns past d_v, rows past seqlen_q) add zero.
            let (o0, o1) = kb.unpack_half2(spec.dtype, kb.get_i(o_w, "")?, "o")?;
            let (g0, g1) = kb.unpack_half2(spec.dtype, kb.get_i(do_w, "")?, "do")?;
            acc = kb.fadd(acc, kb.fma(o1, g1, kb.fmul(o0, g0, "")?, "")?, "")?;
        }
        let d_row = kb.warp_sum_f32(acc)?;
        let mine = kb.icmp(IntPredicate::EQ, lane, kb.i32c(i as i64), "")?;
        my_d = kb.select_f(mine, d_row, my_d, "d_row")?;
    }
    let lse = kb.get_f(lse_slot, "")?;
    let none = kb.fcmp(FloatPredicate::OEQ, lse, kb.f32c(f64::NEG_INFINITY), "")?;
    let lse2 = kb.select_f(none, kb.f32c(f64::INFINITY), kb.fmul(lse, kb.f32c(LOG2E), "")?, "lse2")?;
    let inside = kb.and(my_row, kb.icmp(IntPredicate::SLT, my_q, pad, "")?, "")?;
    kb.if_then(inside, "store", |kb| {
        let row = ws_row(kb, spec.q_heads, pad, b, h, my_q)?;
        let off = kb.mul(row, kb.i64c(4), "")?;
        kb.st_global_f32(kb.add(args.int("dpsum")?, off, "")?, my_d)?;
        kb.st_global_f32(kb.add(args.int("lse_log2")?, off, "")?, lse2)
    })?;
    kb.ret()?;
    Ok(row_kernel_info(name, KernelRole::BackwardPreprocess, &params))
}

/// `dq_accum := 0` over this CTA's rows of every slice, while the CTA's loads are in
/// flight: the main kernel only adds into it. This replaces a memset of the whole
/// accumulator before the preprocess (268 MB at 32k tokens × 2048 columns, ~90 µs on the
/// H100, 3–5% of a 1k-sequence backward): the same bytes, one pass over memory less to
/// wait for. The CTAs' rows tile `seqlen_pad` exactly ([`ROWS_PER_CTA`] divides the
/// workspace row alignment), and a row block of any [`DqAccumLayout`] is the flat range
/// of its rows' `d` floats — fragment layouts permute elements only inside a tile — so
/// the flat range `[ws_row(first row) · d, +ROWS_PER_CTA · d)` is this CTA's share
/// whatever the layout. 16-byte stores: `ROWS_PER_CTA · d` floats is `8 · d` vectors, and
/// every range starts at a multiple of `ROWS_PER_CTA · d · 4` bytes.
fn zero_dq_accum<'ctx>(
    kb: &mut Kb<'ctx>,
    args: &Args<'ctx>,
    spec: &Spec,
    pad: IntValue<'ctx>,
    h: IntValue<'ctx>,
    b: IntValue<'ctx>,
) -> R<()> {
    kb.section("dq_accum := 0 over this CTA's rows of every slice (the main kernel adds into it)")?;
    let d = spec.head_dim_qk as i64;
    let threads = (ROW_WARPS * 32) as i64;
    let vectors = ROWS_PER_CTA as i64 * d / 4;
    let tid = kb.sreg("tid.x", "tid")?;
    let batch = kb.sreg("nctaid.z", "batch")?;
    let slice_bytes = kb.mul(
        kb.mul(kb.sext64(batch, "")?, kb.i64c(spec.q_heads as i64 * d * 4), "")?,
        kb.sext64(pad, "")?,
        "slice_bytes",
    )?;
    let cta_row0 = kb.mul(kb.sreg("ctaid.x", "")?, kb.i32c(ROWS_PER_CTA as i64), "cta_row0")?;
    let first = kb.mul(ws_row(kb, spec.q_heads, pad, b, h, cta_row0)?, kb.i64c(d * 4), "")?;
    let mine = kb.add(args.int("dq_accum")?, kb.add(first, kb.mul(kb.zext64(tid, "")?, kb.i64c(16), "")?, "")?, "")?;
    let zero = kb.i32c(0);
    kb.for_range(kb.i32c(0), args.int("dq_slices")?, "zero_slice", |kb, slice| {
        let at = kb.add(mine, kb.mul(kb.sext64(slice, "")?, slice_bytes, "")?, "dq_zero_at")?;
        for k in 0..(vectors + threads - 1) / threads {
            let store = |kb: &Kb<'ctx>| kb.st_global_v4_b32(kb.add(at, kb.i64c(k * threads * 16), "")?, [zero; 4]);
            if (k + 1) * threads <= vectors {
                store(kb)?;
            } else {
                let inside = kb.icmp(IntPredicate::ULT, tid, kb.i32c(vectors - k * threads), "")?;
                kb.if_then(inside, "zero_tail", |kb| store(kb))?;
            }
        }
        Ok(())
    })
}

/// The dQ convert kernel: `dQ = scale · Σ_s dq_accum[s]` (slices summed in order), in
/// the element type, for the real rows of each sequence. Each warp reads a slice's pairs
/// of all its rows before it adds the first.
pub fn build_dq_convert<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str, layout: DqAccumLayout) -> R<KernelInfo> {
    let params = dq_convert_params(spec);
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!("attnc backward dQ convert: {} (scale * sum of dq_accum slices)", spec.name))?;
    let (lane, rows, h, b) = row_coords(kb)?;
    let la = row_layout(&args)?;
    let qs = query_side(spec);
    let bv = batch_view(kb, &qs, &la, b)?;
    let pad = emit_seqlen_pad(kb, la.seqlen_q, layout.ws_row_align())?;
    let batch = kb.sreg("nctaid.z", "batch")?;
    let d = spec.head_dim_qk as i64;
    let slices = args.int("dq_slices")?;
    // Elements per slice: batch · q_heads · seqlen_pad · d.
    let slice_elems = kb.mul(
        kb.mul(kb.sext64(batch, "")?, kb.i64c(spec.q_heads as i64), "")?,
        kb.mul(kb.sext64(pad, "")?, kb.i64c(d), "")?,
        "slice_elems",
    )?;
    let pairs = lane_pairs(kb, lane, spec.head_dim_qk)?;
    let acc_base = args.int("dq_accum")?;
    // Per row: whether it is real, and the f32 offset in slice 0 of each of the lane's
    // pairs. Row-major: from the row's first element; fragment tiles: from the tile's
    // first, the pair's place inside the tile following its row and column.
    let mut row_pairs = Vec::new();
    for &q in &rows {
        let valid = kb.icmp(IntPredicate::SLT, q, bv.seqlen_q, "row_valid")?;
        let row0 = match layout {
            DqAccumLayout::RowMajor => kb.mul(ws_row(kb, spec.q_heads, pad, b, h, q)?, kb.i64c(d), "acc_row")?,
            _ => {
                let t = layout.tile_rows() as i64;
                let q0 = kb.mul(kb.udiv(q, kb.i32c(t), "")?, kb.i32c(t), "tile_q0")?;
                kb.mul(ws_row(kb, spec.q_heads, pad, b, h, q0)?, kb.i64c(d), "acc_tile")?
            }
        };
        let tile_row = kb.urem(q, kb.i32c(layout.tile_rows() as i64), "tile_row")?;
        let mut offs = Vec::new();
        for &(col, in_row) in &pairs {
            let in_tile = match layout {
                DqAccumLayout::RowMajor => col,
                DqAccumLayout::ConsumerFragments => emit_fragment_offset(kb, tile_row, col, spec.head_dim_qk)?,
                DqAccumLayout::WarpgroupFragments => emit_wg_fragment_offset(kb, tile_row, col)?,
                DqAccumLayout::TransposedFragments { .. } => emit_transposed_fragment_offset(kb, tile_row, col)?,
                DqAccumLayout::ConsumerHalves => emit_consumer_half_offset(kb, tile_row, col)?,
            };
            let take = kb.and(valid, in_row, "pair_real")?;
            let acc = (kb.slot_f32("dq0", kb.f32c(0.0))?, kb.slot_f32("dq1", kb.f32c(0.0))?);
            offs.push((take, kb.add(row0, kb.zext64(in_tile, "")?, "pair_elem")?, acc, col));
        }
        row_pairs.push((q, offs));
    }
    kb.section("sum the slices: every row's pairs of a slice loaded before the adds")?;
    kb.for_range(kb.i32c(0), slices, "slice_loop", |kb, s| {
        let slice0 = kb.mul(kb.sext64(s, "")?, slice_elems, "slice0")?;
        let mut parts = Vec::new();
        for (_, offs) in &row_pairs {
            for &(take, e, _, _) in offs {
                let got = (kb.slot_f32("part0", kb.f32c(0.0))?, kb.slot_f32("part1", kb.f32c(0.0))?);
                kb.if_then(take, "pair_load", |kb| {
                    let e = kb.add(e, slice0, "")?;
                    let addr = kb.add(acc_base, kb.mul(e, kb.i64c(4), "")?, "")?;
                    let [x0, x1] = if layout.column_pairs_adjacent() {
                        kb.ld_global_v2_f32(addr, "dq_part")?
                    } else {
                        // Transposed fragments: column c + 1 is 4 lanes (8 floats) on.
                        [
                            kb.ld_global_f32(addr, "dq_part")?,
                            kb.ld_global_f32(kb.add(addr, kb.i64c(32), "")?, "dq_part")?,
                        ]
                    };
                    kb.set(got.0, x0)?;
                    kb.set(got.1, x1)
                })?;
                parts.push(got);
            }
        }
        let accs = row_pairs.iter().flat_map(|(_, offs)| offs.iter().map(|o| o.2));
        for ((a0, a1), (p0, p1)) in accs.zip(parts) {
            kb.set(a0, kb.fadd(kb.get_f(a0, "")?, kb.get_f(p0, "")?, "")?)?;
            kb.set(a1, kb.fadd(kb.get_f(a1, "")?, kb.get_f(p1, "")?, "")?)?;
        }
        Ok(())
    })?;
    kb.section("dQ = scale * sum, in the element type")?;
    let scale = kb.f32c(spec.scale_value());
    let dq_st = args.strides("dq")?;
    for (q, offs) in row_pairs {
        for (take, _, (a0, a1), col) in offs {
            kb.if_then(take, "pair_store", |kb| {
                let dq_row =
                    kb.add(args.int("dq")?, kb.mul(q_row_offset(kb, &bv, &dq_st, q, h)?, kb.i64c(2), "")?, "")?;
                let x0 = kb.fmul(kb.get_f(a0, "")?, scale, "")?;
                let x1 = kb.fmul(kb.get_f(a1, "")?, scale, "")?;
                let packed = kb.pack_half2(spec.dtype, x0, x1, "dq_pair")?;
                kb.st_global_b32(kb.add(dq_row, kb.mul(kb.zext64(col, "")?, kb.i64c(2), "")?, "")?, packed)
            })?;
        }
    }
    kb.ret()?;
    Ok(row_kernel_info(name, KernelRole::DqConvert, &params))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row kernels keep every row's loads in flight together: the preprocess issues
    /// all of a warp's O and dO words (2 per row and 64-column chunk) and its LSE before its
    /// first multiply-add (and zeroes its rows of dq_accum in between), and the convert one
    /// slice's pairs of all its rows per trip.
    #[test]
    fn row_kernels_issue_every_rows_loads_before_the_math() {
        use crate::compile::{compile, CompileOptions};
        for (d, arch) in [(128u32, crate::Arch::Sm90a), (64, crate::Arch::Sm90a), (96, crate::Arch::Sm80)] {
            let src = format!("attention r {{\n dtype bf16\n head_dim {d}\n heads 4\n}}\n");
            let spec = attnc_dsl::parse_named("r.attn", &src).expect("parses");
            let m = compile(&spec, &CompileOptions::new(arch).direction(crate::Direction::Backward)).expect("compiles");
            let entry = |suffix: &str| -> String {
                let at = m.ptx.find(&format!(".entry attnc_r_bwd_{suffix}(")).expect("the row kernel");
                let body = &m.ptx[at..];
                body[..body.find("\n}").expect("its end")].to_string()
            };
            let chunks = d.div_ceil(64) as usize;
            let pre = entry("pre");
            let loads: Vec<usize> = pre.match_indices("ld.global.b32").map(|(i, _)| i).collect();
            // O and dO words, and lane i's LSE of row i.
            assert_eq!(loads.len(), 2 * ROWS_PER_WARP as usize * chunks + 1, "d {d}: O, dO and LSE");
            let first_fma = pre.find("fma.rn.f32").expect("the dot products");
            assert!(loads.iter().all(|&l| l < first_fma), "d {d}: a load after the first multiply-add");
            // dq_accum zeroed in 16-byte stores of the CTA's 32 rows (8·d vectors over 128
            // threads per slice), issued after the loads and before the math.
            let zeros: Vec<usize> = pre.match_indices("st.global.v4.b32").map(|(i, _)| i).collect();
            assert_eq!(zeros.len(), (8 * d as usize).div_ceil(128), "d {d}: the zeroing stores");
            assert!(zeros.iter().all(|&z| z > *loads.last().unwrap() && z < first_fma), "d {d}: zeroing placement");
            let dq = entry("dq");
            assert_eq!(dq.matches("ld.global.v2.f32").count(), ROWS_PER_WARP as usize * chunks, "d {d}: dq pairs");
        }
    }
}
