//! Dev tool: a single-tile wgmma kernel, S[64×64] = Q[64×64]·K[64×64]ᵀ (bf16 → f32),
//! with Q and K staged in shared memory in the 128-byte-swizzle layout and read through
//! `hopper::desc` descriptors, to validate descriptors and accumulator layout on an H100
//! (`scripts/dev/wgmma_probe.py`). With `pv`, the second GEMM's shape instead:
//! O[64×64] = P[64×64]·V[64×64] with P from registers (the mma A-fragment layout) and
//! V N-contiguous in shared memory (MN-major descriptor).
//! Usage: `cargo run -p attnc-lower --example wgmma_probe -- OUT.ptx [pv]`.

use attnc_lower::families::common::sw128::{k_major_step_offset, mn_major_step_offset};
use attnc_lower::families::hopper::desc::SmemDesc;
use attnc_lower::llvm::kb::{Kb, R};
use attnc_lower::llvm::operand::Major;
use attnc_lower::llvm::tcgen05::Acc;
use attnc_lower::llvm::wgmma::WgmmaType;
use attnc_lower::{llvm::emit_ptx, Arch};
use inkwell::context::Context;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::AddressSpace;

fn build(kb: &mut Kb<'_>, pv: bool) -> R<()> {
    let i64t: BasicMetadataTypeEnum = kb.ctx.i64_type().into();
    let p = kb.begin_kernel("wgmma_probe", &[(i64t, "q".into()), (i64t, "k".into()), (i64t, "s".into())])?;
    let (q, k, s) = (p[0].into_int_value(), p[1].into_int_value(), p[2].into_int_value());
    let g = kb.module.add_global(kb.ctx.i8_type().array_type(0), Some(AddressSpace::from(3u16)), "attnc_smem");
    g.set_alignment(1024);
    g.set_linkage(inkwell::module::Linkage::External);
    let smem64 = kb.b.build_ptr_to_int(g.as_pointer_value(), kb.ctx.i64_type(), "")?;
    let smem = kb.trunc32(smem64, "smem")?;
    let tid = kb.sreg("tid.x", "tid")?;
    // Q at smem + 0, K at smem + 8192; 128-byte rows, chunk c of row r at (c ^ r % 8) · 16.
    for (src, base) in [(q, 0i64), (k, 8192)] {
        for it in 0..4 {
            let c = kb.add(tid, kb.i32c(it * 128), "")?;
            let r = kb.udiv(c, kb.i32c(8), "")?;
            let ch = kb.urem(c, kb.i32c(8), "")?;
            let g_off =
                kb.mul(kb.add(kb.mul(r, kb.i32c(64), "")?, kb.mul(ch, kb.i32c(8), "")?, "")?, kb.i32c(2), "")?;
            let gaddr = kb.add(src, kb.zext64(g_off, "")?, "")?;
            let sw = kb.xor(ch, kb.and(r, kb.i32c(7), "")?, "")?;
            let s_off = kb.add(kb.mul(r, kb.i32c(128), "")?, kb.mul(sw, kb.i32c(16), "")?, "")?;
            let saddr = kb.add(smem, kb.add(s_off, kb.i32c(base), "")?, "")?;
            kb.cp_async_16(saddr, gaddr, kb.i32c(16))?;
        }
    }
    kb.cp_async_commit()?;
    kb.cp_async_wait(0)?;
    kb.fence_proxy_async_shared()?;
    kb.bar_sync()?;
    let undef = kb.ctx.f32_type().get_undef();
    let mut acc = vec![undef; 32];
    let lane = kb.and(tid, kb.i32c(31), "")?;
    let warp = kb.udiv(tid, kb.i32c(32), "")?;
    if pv {
        // P (the first input) read straight from global into the A fragment: warp w rows
        // 16w..16w+15; regs {row g, cols 2t..}, {row g+8}, {row g, cols +8}, {row g+8, +8}.
        let g = kb.add(kb.mul(warp, kb.i32c(16), "")?, kb.udiv(lane, kb.i32c(4), "")?, "")?;
        let t2 = kb.mul(kb.urem(lane, kb.i32c(4), "")?, kb.i32c(2), "")?;
        let cst = SmemDesc::mn_major_sw128(0, 8192).encode_without_start();
        kb.wgmma_fence()?;
        for kk in 0..4i64 {
            let mut a = [tid; 4];
            for (i, (dr, dc)) in [(0i64, 0i64), (8, 0), (0, 8), (8, 8)].into_iter().enumerate() {
                let row = kb.add(g, kb.i32c(dr), "")?;
                let col = kb.add(t2, kb.i32c(kk * 16 + dc), "")?;
                let idx = kb.add(kb.mul(row, kb.i32c(64), "")?, col, "")?;
                a[i] = kb.ld_global_i32(kb.add(q, kb.mul(kb.zext64(idx, "")?, kb.i64c(2), "")?, "")?, "p")?;
            }
            let off = mn_major_step_offset(kk as u32) as i64;
            let b = kb.wgmma_desc(kb.add(smem, kb.i32c(8192 + off), "")?, cst, "b")?;
            let scale = if kk == 0 { Acc::Overwrite } else { Acc::Accumulate };
            acc = kb.wgmma_rs(WgmmaType::Bf16, 64, &acc, a, b, scale, Major::Mn, "o")?;
        }
    } else {
        let cst = SmemDesc::k_major_sw128(0).encode_without_start();
        kb.wgmma_fence()?;
        for kk in 0..4u32 {
            let off = k_major_step_offset(64, kk) as i64;
            let a = kb.wgmma_desc(kb.add(smem, kb.i32c(off), "")?, cst, "a")?;
            let b = kb.wgmma_desc(kb.add(smem, kb.i32c(8192 + off), "")?, cst, "b")?;
            let scale = if kk == 0 { Acc::Overwrite } else { Acc::Accumulate };
            acc = kb.wgmma_ss(WgmmaType::Bf16, 64, &acc, a, b, scale, Major::K, Major::K, "s")?;
        }
    }
    kb.wgmma_commit_group()?;
    let acc = kb.wgmma_wait_group_acc(0, &acc, "s")?;
    // D fragment: warp w rows 16w + lane/4 (+8); n8 block j: cols 8j + 2(lane%4) + {0,1}.
    let row0 = kb.add(kb.mul(warp, kb.i32c(16), "")?, kb.udiv(lane, kb.i32c(4), "")?, "")?;
    let col0 = kb.mul(kb.urem(lane, kb.i32c(4), "")?, kb.i32c(2), "")?;
    for j in 0..8i64 {
        for e in 0..4i64 {
            let row = kb.add(row0, kb.i32c(if e >= 2 { 8 } else { 0 }), "")?;
            let col = kb.add(col0, kb.i32c(8 * j + (e % 2)), "")?;
            let idx = kb.add(kb.mul(row, kb.i32c(64), "")?, col, "")?;
            let addr = kb.add(s, kb.mul(kb.zext64(idx, "")?, kb.i64c(4), "")?, "")?;
            kb.st_global_f32(addr, acc[(4 * j + e) as usize])?;
        }
    }
    kb.ret()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| "wgmma_probe.ptx".into());
    let pv = std::env::args().nth(2).as_deref() == Some("pv");
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, "wgmma_probe");
    build(&mut kb, pv).map_err(|e| e.to_string())?;
    let (_, ptx, _, _) = emit_ptx(&kb.module, Arch::Sm90a).map_err(|e| e.to_string())?;
    std::fs::write(&out, ptx)?;
    Ok(())
}
