//! The PTX instructions families use, as typed inline-asm wrappers on [`Kb`]. Each one
//! is a single instruction (or a short fixed sequence) whose semantics the PTX ISA
//! defines; keeping them here means a family reads like the algorithm.

use super::kb::{Kb, R};
use attnc_ir::DType;
use inkwell::values::{FloatValue, IntValue};

impl<'ctx> Kb<'ctx> {
    /// `D = A·B + C` with `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`: A is four
    /// b32 registers (8 halves), B two, C/D four f32.
    pub fn mma_m16n8k16(
        &self,
        dtype: DType,
        a: [IntValue<'ctx>; 4],
        b: [IntValue<'ctx>; 2],
        c: [FloatValue<'ctx>; 4],
        name: &str,
    ) -> R<[FloatValue<'ctx>; 4]> {
        let f = self.ctx.f32_type();
        let i = self.ctx.i32_type();
        let ret = self.struct_of(f.into(), 4);
        let ty = ret.fn_type(
            &[i.into(), i.into(), i.into(), i.into(), i.into(), i.into(), f.into(), f.into(), f.into(), f.into()],
            false,
        );
        let t = match dtype {
            DType::Bf16 => "bf16",
            DType::Fp16 => "f16",
        };
        let text = format!(
            "mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};"
        );
        let v = self.asm(
            ty,
            &text,
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
            false,
            &[
                a[0].into(),
                a[1].into(),
                a[2].into(),
                a[3].into(),
                b[0].into(),
                b[1].into(),
                c[0].into(),
                c[1].into(),
                c[2].into(),
                c[3].into(),
            ],
            name,
        )?;
        let mut out = [c[0]; 4];
        for (k, o) in out.iter_mut().enumerate() {
            *o = self.extract(v, k as u32, &format!("{name}{k}"))?.into_float_value();
        }
        Ok(out)
    }

    /// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`: four 8×8 b16 matrices, the
    /// row addresses given by lanes 0–7, 8–15, 16–23, 24–31, at `smem_addr + offset`.
    /// The constant offset goes into the instruction's immediate so one base register
    /// serves a whole tile (LLVM would otherwise hoist one register per address).
    pub fn ldmatrix_x4(
        &self,
        smem_addr: IntValue<'ctx>,
        offset: i64,
        trans: bool,
        name: &str,
    ) -> R<[IntValue<'ctx>; 4]> {
        let i = self.ctx.i32_type();
        let ret = self.struct_of(i.into(), 4);
        let ty = ret.fn_type(&[i.into()], false);
        let text = format!(
            "ldmatrix.sync.aligned.m8n8.x4{}.shared.b16 {{$0,$1,$2,$3}}, [$4+{offset}];",
            if trans { ".trans" } else { "" }
        );
        let v = self.asm(ty, &text, "=r,=r,=r,=r,r,~{memory}", true, &[smem_addr.into()], name)?;
        let mut out = [smem_addr; 4];
        for (k, o) in out.iter_mut().enumerate() {
            *o = self.extract(v, k as u32, &format!("{name}{k}"))?.into_int_value();
        }
        Ok(out)
    }

    /// `ld.shared.v2.f32` of two adjacent f32 at `smem_addr + offset` (8-byte aligned),
    /// the offset in the instruction's immediate (one base register for a whole row of
    /// loads; an address LLVM builds per load becomes an OR per load in the SASS).
    pub fn ld_shared_v2_f32(&self, smem_addr: IntValue<'ctx>, offset: i64, name: &str) -> R<[FloatValue<'ctx>; 2]> {
        let f = self.ctx.f32_type();
        let ret = self.struct_of(f.into(), 2);
        let ty = ret.fn_type(&[self.ctx.i32_type().into()], false);
        let text = format!("ld.shared.v2.f32 {{$0, $1}}, [$2+{offset}];");
        let v = self.asm(ty, &text, "=f,=f,r,~{memory}", false, &[smem_addr.into()], name)?;
        Ok([self.extract(v, 0, name)?.into_float_value(), self.extract(v, 1, name)?.into_float_value()])
    }

    /// `ld.shared.f32` at `smem_addr + offset`, the offset in the immediate.
    pub fn ld_shared_f32_at(&self, smem_addr: IntValue<'ctx>, offset: i64, name: &str) -> R<FloatValue<'ctx>> {
        let ty = self.ctx.f32_type().fn_type(&[self.ctx.i32_type().into()], false);
        let text = format!("ld.shared.f32 $0, [$1+{offset}];");
        Ok(self.asm(ty, &text, "=f,r,~{memory}", false, &[smem_addr.into()], name)?.into_float_value())
    }

    /// `cp.async.cg.shared.global` of 16 bytes; `src_bytes` < 16 zero-fills the rest
    /// (0 = a pure zero fill, used for rows past the end).
    pub fn cp_async_16(
        &self,
        smem_addr: IntValue<'ctx>,
        gmem_addr: IntValue<'ctx>,
        src_bytes: IntValue<'ctx>,
    ) -> R<()> {
        self.asm_void(
            "cp.async.cg.shared.global [$0], [$1], 16, $2;",
            "r,l,r,~{memory}",
            &[smem_addr.into(), gmem_addr.into(), src_bytes.into()],
        )
    }
    pub fn cp_async_commit(&self) -> R<()> {
        self.asm_void("cp.async.commit_group;", "~{memory}", &[])
    }
    /// Waits until at most `pending` committed groups are still in flight.
    pub fn cp_async_wait(&self, pending: u32) -> R<()> {
        self.asm_void(&format!("cp.async.wait_group {pending};"), "~{memory}", &[])
    }
    /// CTA-wide barrier.
    pub fn bar_sync(&self) -> R<()> {
        self.asm_void("bar.sync 0;", "~{memory}", &[])
    }

    /// `shfl.sync.bfly.b32` with a full mask.
    pub fn shfl_xor_f32(&self, v: FloatValue<'ctx>, lane_mask: u32, name: &str) -> R<FloatValue<'ctx>> {
        let f = self.ctx.f32_type();
        let i = self.ctx.i32_type();
        let ty = f.fn_type(&[f.into(), i.into()], false);
        Ok(self
            .asm(
                ty,
                "shfl.sync.bfly.b32 $0, $1, $2, 0x1f, 0xffffffff;",
                "=f,f,r",
                true,
                &[v.into(), self.i32c(lane_mask as i64).into()],
                name,
            )?
            .into_float_value())
    }

    /// The sum of `v` over the warp: a butterfly of `shfl.sync.bfly`, so every lane gets
    /// the same total, added in a fixed order (repeatable run to run).
    pub fn warp_sum_f32(&self, mut v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        for m in [16, 8, 4, 2, 1] {
            v = self.fadd(v, self.shfl_xor_f32(v, m, "")?, "")?;
        }
        Ok(v)
    }

    /// The maximum of `v` over the warp, in every lane (butterfly).
    pub fn warp_max_f32(&self, mut v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        for m in [16, 8, 4, 2, 1] {
            v = self.fmax(v, self.shfl_xor_f32(v, m, "")?, "")?;
        }
        Ok(v)
    }

    /// `bmsk.clamp.b32`: bits `[start, start + width)` of a word set (nothing past bit
    /// 31; `start` ≥ 32 gives 0, `width` ≥ 32 every bit from `start`). Both operands are
    /// unsigned: callers pass them non-negative.
    pub fn bmsk_clamp(&self, start: IntValue<'ctx>, width: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into(), i.into()], false);
        Ok(self
            .asm(ty, "bmsk.clamp.b32 $0, $1, $2;", "=r,r,r", false, &[start.into(), width.into()], name)?
            .into_int_value())
    }

    /// `shfl.sync.idx.b32` over the full warp: `v` of lane `src`.
    pub fn shfl_idx_i32(&self, v: IntValue<'ctx>, src: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into(), i.into()], false);
        Ok(self
            .asm(ty, "shfl.sync.idx.b32 $0, $1, $2, 0x1f, 0xffffffff;", "=r,r,r", true, &[v.into(), src.into()], name)?
            .into_int_value())
    }

    /// [`Kb::shfl_idx_i32`] of a 64-bit value (two shuffles).
    pub fn shfl_idx_i64(&self, v: IntValue<'ctx>, src: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let lo = self.trunc32(v, "")?;
        let hi = self.trunc32(self.b.build_right_shift(v, self.i64c(32), false, "")?, "")?;
        let lo = self.zext64(self.shfl_idx_i32(lo, src, "")?, "")?;
        let hi = self.zext64(self.shfl_idx_i32(hi, src, "")?, "")?;
        self.or(self.shl(hi, self.i64c(32), "")?, lo, name)
    }

    /// `cp.async.mbarrier.arrive.noinc`: the mbarrier receives one arrival when all of
    /// this thread's prior cp.async copies have landed (the arrival is one of the
    /// barrier's expected count).
    pub fn cp_async_mbar_arrive_noinc(&self, mbar: IntValue<'ctx>) -> R<()> {
        self.asm_void("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [$0];", "r,~{memory}", &[mbar.into()])
    }

    /// `vote.sync.any.pred` over the full warp.
    pub fn vote_any(&self, pred: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into()], false);
        let p32 = self.zext32(pred, "")?;
        let v = self.asm(
            ty,
            "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 $0, 1, 0, q; }",
            "=r,r",
            true,
            &[p32.into()],
            name,
        )?;
        self.icmp(inkwell::IntPredicate::NE, v.into_int_value(), self.i32c(0), name)
    }

    /// `vote.sync.ballot.b32` over the full warp: bit `i` set when lane `i`'s `pred` holds.
    pub fn ballot(&self, pred: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into()], false);
        let p32 = self.zext32(pred, "")?;
        let v = self.asm(
            ty,
            "{ .reg .pred p; setp.ne.u32 p, $1, 0; vote.sync.ballot.b32 $0, p, 0xffffffff; }",
            "=r,r",
            true,
            &[p32.into()],
            name,
        )?;
        Ok(v.into_int_value())
    }

    /// `popc.b32`: the number of set bits.
    pub fn popc(&self, v: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into()], false);
        Ok(self.asm(ty, "popc.b32 $0, $1;", "=r,r", false, &[v.into()], name)?.into_int_value())
    }

    /// `ld.global.nc.b32` (read-only path) of an i32 that no kernel writes (metadata:
    /// cu_seqlens, block tables, seqused_k, aux tensors). Emitted as a pure asm so LLVM
    /// can merge repeated reads of one address (e.g. `doc[b, q]` evaluated for every
    /// key of a row). Callers must only pass addresses that are valid whether or not the
    /// surrounding code runs (clamped indices), since a pure read may be moved.
    pub fn ld_global_i32(&self, addr: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[self.ctx.i64_type().into()], false);
        Ok(self.asm(ty, "ld.global.nc.b32 $0, [$1];", "=r,l", false, &[addr.into()], name)?.into_int_value())
    }
    pub fn ld_global_f32(&self, addr: IntValue<'ctx>, name: &str) -> R<FloatValue<'ctx>> {
        let f = self.ctx.f32_type();
        let ty = f.fn_type(&[self.ctx.i64_type().into()], false);
        Ok(self.asm(ty, "ld.global.b32 $0, [$1];", "=f,l,~{memory}", true, &[addr.into()], name)?.into_float_value())
    }
    pub fn st_global_b32(&self, addr: IntValue<'ctx>, v: IntValue<'ctx>) -> R<()> {
        self.asm_void("st.global.b32 [$0], $1;", "l,r,~{memory}", &[addr.into(), v.into()])
    }
    pub fn st_global_f32(&self, addr: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        self.asm_void("st.global.f32 [$0], $1;", "l,f,~{memory}", &[addr.into(), v.into()])
    }
    pub fn st_global_v2_f32(&self, addr: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<()> {
        self.asm_void("st.global.v2.f32 [$0], {$1, $2};", "l,f,f,~{memory}", &[addr.into(), a.into(), b.into()])
    }
    pub fn ld_global_v2_f32(&self, addr: IntValue<'ctx>, name: &str) -> R<[FloatValue<'ctx>; 2]> {
        let f = self.ctx.f32_type();
        let ret = self.struct_of(f.into(), 2);
        let ty = ret.fn_type(&[self.ctx.i64_type().into()], false);
        let v = self.asm(ty, "ld.global.v2.f32 {$0, $1}, [$2];", "=f,=f,l,~{memory}", true, &[addr.into()], name)?;
        Ok([self.extract(v, 0, name)?.into_float_value(), self.extract(v, 1, name)?.into_float_value()])
    }

    /// `ld.global.nc` of `n` (1, 2 or 4) consecutive u32 (16-byte aligned for 4) that no
    /// kernel writes, kept where it is (side effect): for reads whose address is only
    /// valid under the guard around them (a block mask's tile bits).
    pub fn ld_global_nc_v_b32(&self, addr: IntValue<'ctx>, n: u32, name: &str) -> R<Vec<IntValue<'ctx>>> {
        let i = self.ctx.i32_type();
        let (text, cons) = match n {
            1 => ("ld.global.nc.b32 $0, [$1];", "=r,l"),
            2 => ("ld.global.nc.v2.b32 {$0, $1}, [$2];", "=r,=r,l"),
            4 => ("ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l"),
            _ => return Err(crate::LowerError::Llvm(format!("ld.global.nc of {n} words"))),
        };
        if n == 1 {
            let ty = i.fn_type(&[self.ctx.i64_type().into()], false);
            return Ok(vec![self.asm(ty, text, cons, true, &[addr.into()], name)?.into_int_value()]);
        }
        let ret = self.struct_of(i.into(), n as usize);
        let ty = ret.fn_type(&[self.ctx.i64_type().into()], false);
        let v = self.asm(ty, text, cons, true, &[addr.into()], name)?;
        (0..n).map(|k| Ok(self.extract(v, k, name)?.into_int_value())).collect()
    }

    /// `ld.global.b32` that stays in program order (a memory clobber): for inputs read
    /// under a guard, whose address is only valid where the guard holds.
    pub fn ld_global_b32(&self, addr: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[self.ctx.i64_type().into()], false);
        Ok(self.asm(ty, "ld.global.b32 $0, [$1];", "=r,l,~{memory}", true, &[addr.into()], name)?.into_int_value())
    }
    /// `fence.acq_rel.gpu`: orders this thread's memory operations before and after it at
    /// GPU scope (publishing stores before a count, reading others' after one).
    pub fn fence_acq_rel_gpu(&self) -> R<()> {
        self.asm_void("fence.acq_rel.gpu;", "~{memory}", &[])
    }
    /// `atom.acq_rel.gpu.global.add.u32`: adds `v` at `addr` and returns the old value.
    pub fn atom_add_acq_rel_gpu_u32(&self, addr: IntValue<'ctx>, v: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[self.ctx.i64_type().into(), i.into()], false);
        let text = "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;";
        Ok(self.asm(ty, text, "=r,l,r,~{memory}", true, &[addr.into(), v.into()], name)?.into_int_value())
    }
    /// `atom.relaxed.gpu.global.add.u32`: adds `v` at `addr` and returns the old value,
    /// ordering nothing around it (a work counter: later loads need not wait for it).
    pub fn atom_add_relaxed_gpu_u32(&self, addr: IntValue<'ctx>, v: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[self.ctx.i64_type().into(), i.into()], false);
        let text = "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;";
        Ok(self.asm(ty, text, "=r,l,r,~{memory}", true, &[addr.into(), v.into()], name)?.into_int_value())
    }
    /// `st.relaxed.gpu.global.u32`: a store other CTAs may read without a data race.
    pub fn st_relaxed_gpu_u32(&self, addr: IntValue<'ctx>, v: IntValue<'ctx>) -> R<()> {
        self.asm_void("st.relaxed.gpu.global.u32 [$0], $1;", "l,r,~{memory}", &[addr.into(), v.into()])
    }
    /// `ld.acquire.gpu.global.u32`: reads a flag another CTA publishes with a release;
    /// what that CTA wrote before it is visible after this load.
    pub fn ld_acquire_gpu_u32(&self, addr: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[self.ctx.i64_type().into()], false);
        Ok(self
            .asm(ty, "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l,~{memory}", true, &[addr.into()], name)?
            .into_int_value())
    }
    /// `st.release.gpu.global.u32`: publishes a flag after this thread's earlier writes
    /// (and, through a barrier and fences before it, other threads' writes).
    pub fn st_release_gpu_u32(&self, addr: IntValue<'ctx>, v: IntValue<'ctx>) -> R<()> {
        self.asm_void("st.release.gpu.global.u32 [$0], $1;", "l,r,~{memory}", &[addr.into(), v.into()])
    }
    /// `fence.proxy.async.global`: orders this thread's async-proxy (bulk copy/reduce)
    /// accesses of global memory against its generic-proxy ones.
    pub fn fence_proxy_async_global(&self) -> R<()> {
        self.asm_void("fence.proxy.async.global;", "~{memory}", &[])
    }
    /// `barrier.red.or.pred` over named barrier `id` of `count` threads: a barrier that
    /// also tells every participant whether any of them passed a nonzero `flag` (1 or 0).
    pub fn bar_red_or(&self, id: u32, count: u32, flag: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into()], false);
        let text = format!(
            "{{ .reg .pred %any_in, %any_out; setp.ne.u32 %any_in, $1, 0; \
             barrier.red.or.pred %any_out, {id}, {count}, %any_in; selp.u32 $0, 1, 0, %any_out; }}"
        );
        Ok(self.asm(ty, &text, "=r,r,~{memory}", true, &[flag.into()], name)?.into_int_value())
    }
    /// `red.global.add.f32`: an atomic add whose result is not needed (gradient
    /// accumulation).
    pub fn red_global_add_f32(&self, addr: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        self.red_global_add_f32_at(addr, 0, v)
    }
    /// [`Kb::red_global_add_f32`] at `addr + offset` (the offset in the instruction's
    /// immediate: one base register serves a row of adds).
    pub fn red_global_add_f32_at(&self, addr: IntValue<'ctx>, offset: i64, v: FloatValue<'ctx>) -> R<()> {
        self.asm_void(&format!("red.global.add.f32 [$0+{offset}], $1;"), "l,f,~{memory}", &[addr.into(), v.into()])
    }
    /// `red.global.add.v4.f32` at `addr + offset` (16-byte aligned): one vector atomic for
    /// four adjacent floats (sm_90+, PTX 8.1).
    pub fn red_global_add_v4_f32_at(&self, addr: IntValue<'ctx>, offset: i64, v: [FloatValue<'ctx>; 4]) -> R<()> {
        self.asm_void(
            &format!("red.global.add.v4.f32 [$0+{offset}], {{$1, $2, $3, $4}};"),
            "l,f,f,f,f,~{memory}",
            &[addr.into(), v[0].into(), v[1].into(), v[2].into(), v[3].into()],
        )
    }
    /// `shfl.sync.idx.b32` of an f32 over the full warp: `v` of lane `src`.
    pub fn shfl_idx_f32(&self, v: FloatValue<'ctx>, src: IntValue<'ctx>, name: &str) -> R<FloatValue<'ctx>> {
        let f = self.ctx.f32_type();
        let ty = f.fn_type(&[f.into(), self.ctx.i32_type().into()], false);
        Ok(self
            .asm(ty, "shfl.sync.idx.b32 $0, $1, $2, 0x1f, 0xffffffff;", "=f,f,r", true, &[v.into(), src.into()], name)?
            .into_float_value())
    }
    /// `shfl.sync.bfly.b32` of an i32 with a full mask.
    pub fn shfl_xor_i32(&self, v: IntValue<'ctx>, lane_mask: u32, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into(), i.into()], false);
        Ok(self
            .asm(
                ty,
                "shfl.sync.bfly.b32 $0, $1, $2, 0x1f, 0xffffffff;",
                "=r,r,r",
                true,
                &[v.into(), self.i32c(lane_mask as i64).into()],
                name,
            )?
            .into_int_value())
    }
    /// `match.any.sync.b32` over the full warp: the mask of lanes whose `v` equals this
    /// lane's.
    pub fn match_any_b32(&self, v: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into()], false);
        Ok(self.asm(ty, "match.any.sync.b32 $0, $1, 0xffffffff;", "=r,r", true, &[v.into()], name)?.into_int_value())
    }
    /// The two 16-bit values of a b32 (`lo` in the low half) as f32.
    pub fn unpack_half2(&self, dtype: DType, v: IntValue<'ctx>, name: &str) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        match dtype {
            // bf16 is the top half of an f32: shift or mask, no conversion.
            DType::Bf16 => {
                let lo = self.bits_f(self.shl(v, self.i32c(16), "")?, &format!("{name}.lo"))?;
                let hi =
                    self.bits_f(self.and(v, self.i32c(0xffff_0000u32 as i32 as i64), "")?, &format!("{name}.hi"))?;
                Ok((lo, hi))
            }
            DType::Fp16 => {
                let f = self.ctx.f32_type();
                let ret = self.struct_of(f.into(), 2);
                let ty = ret.fn_type(&[self.ctx.i32_type().into()], false);
                let r = self.asm(
                    ty,
                    "{ .reg .f16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
                    "=f,=f,r",
                    false,
                    &[v.into()],
                    name,
                )?;
                Ok((self.extract(r, 0, name)?.into_float_value(), self.extract(r, 1, name)?.into_float_value()))
            }
        }
    }

    /// Packs two f32 into one b32 of two 16-bit values (`lo` in the low half), rounding
    /// to nearest even.
    pub fn pack_half2(
        &self,
        dtype: DType,
        lo: FloatValue<'ctx>,
        hi: FloatValue<'ctx>,
        name: &str,
    ) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let f = self.ctx.f32_type();
        let ty = i.fn_type(&[f.into(), f.into()], false);
        let t = match dtype {
            DType::Bf16 => "bf16x2",
            DType::Fp16 => "f16x2",
        };
        // cvt packs its first source into the upper half.
        Ok(self
            .asm(ty, &format!("cvt.rn.{t}.f32 $0, $1, $2;"), "=r,f,f", false, &[hi.into(), lo.into()], name)?
            .into_int_value())
    }

    /// Adjacent pairs of `v` packed in the element type, the even one in the low half: the
    /// 16-bit operand layout of every MMA that reads P or dS from registers or TMEM.
    pub fn pack_pairs(&self, dtype: DType, v: &[FloatValue<'ctx>], name: &str) -> R<Vec<IntValue<'ctx>>> {
        v.chunks(2).map(|q| self.pack_half2(dtype, q[0], q[1], name)).collect()
    }

    /// `ex2.approx.ftz.f32` (MUFU.EX2).
    pub fn ex2(&self, x: FloatValue<'ctx>, name: &str) -> R<FloatValue<'ctx>> {
        self.asm_f32_1("ex2.approx.ftz.f32 $0, $1;", x, name)
    }
    /// `lg2.approx.ftz.f32` (MUFU.LG2).
    pub fn lg2(&self, x: FloatValue<'ctx>, name: &str) -> R<FloatValue<'ctx>> {
        self.asm_f32_1("lg2.approx.ftz.f32 $0, $1;", x, name)
    }
    /// Approximate reciprocal (`rcp.approx.ftz.f32`).
    pub fn rcp(&self, x: FloatValue<'ctx>, name: &str) -> R<FloatValue<'ctx>> {
        self.asm_f32_1("rcp.approx.ftz.f32 $0, $1;", x, name)
    }
}
