//! sm_90a instruction wrappers for the hopper family: the warpgroup MMA
//! (`wgmma.fence`, `wgmma.mma_async` m64nNk16 with A from shared memory or from
//! registers, `wgmma.commit_group`, `wgmma.wait_group`) and the TMA store path that
//! [`super::tcgen05`] lacks (`cp.async.bulk.tensor` shared → global, bulk groups,
//! `fence.proxy.async`), as typed inline asm on [`Kb`].
//!
//! The mbarrier, TMA load, `setmaxnreg` and named-barrier wrappers of
//! [`super::tcgen05`] are not sm_100-specific: the tests below assemble them for sm_90a
//! too (PTX 8.0) and check their SASS.
//!
//! # Accumulators
//! `m64nNk16` with f32 accumulators gives each of the warpgroup's 128 threads `N/2`
//! f32 registers (fragment layout: PTX ISA "Register Fragments and Shared Memory
//! Matrix Layouts" for wgmma, D matrix). They are passed as a slice and returned as a
//! new vector, tied to the same registers (`=f` outputs, inputs tied by index), so
//! LLVM's dataflow matches the hardware's: use the values returned by
//! [`Kb::wgmma_wait_group_acc`] after the MMAs, never the ones returned by the MMA
//! itself before the wait. Every instruction here is `.sync.aligned` and emitted as a
//! side-effecting `convergent` call.

use super::kb::{Kb, R};
use super::operand::Major;
use super::tcgen05::Acc;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, FloatValue, IntValue};

/// Input element type of `wgmma.mma_async` (the accumulator is always f32 here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaType {
    Bf16,
    F16,
}

impl WgmmaType {
    pub fn ptx(self) -> &'static str {
        match self {
            WgmmaType::Bf16 => "bf16",
            WgmmaType::F16 => "f16",
        }
    }
}

impl From<attnc_ir::DType> for WgmmaType {
    fn from(d: attnc_ir::DType) -> WgmmaType {
        match d {
            attnc_ir::DType::Bf16 => WgmmaType::Bf16,
            attnc_ir::DType::Fp16 => WgmmaType::F16,
        }
    }
}

/// The N values the hopper family uses (PTX allows multiples of 8 in 8..=256); 32 is the
/// d64 backward's dQ (each consumer warpgroup half of the 64 columns), 80 the backward's
/// 80-query tiles (the transposed dQ split).
pub const WGMMA_NS: [u32; 8] = [32, 64, 80, 96, 128, 176, 192, 256];

/// `{$first, ..., $first+n-1}`.
fn reg_list(first: usize, n: usize) -> String {
    let regs: Vec<String> = (first..first + n).map(|i| format!("${i}")).collect();
    format!("{{{}}}", regs.join(", "))
}

/// The predicate-setting line for `scale-d` from the i32 operand `$reg`.
fn scale_d_setp(acc: Acc<'_>, reg: usize) -> String {
    match acc {
        Acc::Overwrite => format!("setp.ne.b32 p, ${reg}, ${reg};"),
        Acc::Accumulate => format!("setp.eq.b32 p, ${reg}, ${reg};"),
        Acc::When(_) => format!("setp.ne.b32 p, ${reg}, 0;"),
    }
}

impl<'ctx> Kb<'ctx> {
    fn f32_struct_call(
        &self,
        text: &str,
        acc: &[FloatValue<'ctx>],
        extra_constraints: &str,
        extra: &[BasicMetadataValueEnum<'ctx>],
        name: &str,
    ) -> R<Vec<FloatValue<'ctx>>> {
        let n = acc.len();
        let f: BasicTypeEnum = self.ctx.f32_type().into();
        let mut cons: Vec<String> = vec!["=f".to_string(); n];
        cons.extend((0..n).map(|i| i.to_string()));
        if !extra_constraints.is_empty() {
            cons.push(extra_constraints.to_string());
        }
        cons.push("~{memory}".to_string());
        let mut args: Vec<BasicMetadataValueEnum> = acc.iter().map(|v| (*v).into()).collect();
        args.extend_from_slice(extra);
        if n == 0 {
            self.asm_call(None, text, &cons.join(","), true, &args, "")?;
            return Ok(Vec::new());
        }
        let ret = if n == 1 { f } else { self.struct_of(f, n).into() };
        let v = self
            .asm_call(Some(ret), text, &cons.join(","), true, &args, name)?
            .ok_or_else(|| crate::error::LowerError::Llvm("wgmma asm returned nothing".into()))?;
        if n == 1 {
            return Ok(vec![v.into_float_value()]);
        }
        (0..n).map(|i| Ok(self.extract(v, i as u32, name)?.into_float_value())).collect()
    }

    /// `wgmma.fence.sync.aligned`: orders prior register and shared-memory accesses of
    /// the warpgroup before following `wgmma.mma_async` (needed before the first MMA and
    /// whenever accumulator or A registers were written by other instructions).
    pub fn wgmma_fence(&self) -> R<()> {
        self.asm_call(None, "wgmma.fence.sync.aligned;", "~{memory}", true, &[], "")?;
        Ok(())
    }

    /// `wgmma.commit_group.sync.aligned`: closes a group of the prior uncommitted MMAs.
    pub fn wgmma_commit_group(&self) -> R<()> {
        self.asm_call(None, "wgmma.commit_group.sync.aligned;", "~{memory}", true, &[], "")?;
        Ok(())
    }

    /// `wgmma.wait_group.sync.aligned n`: waits until at most `n` groups are pending.
    pub fn wgmma_wait_group(&self, n: u32) -> R<()> {
        assert!(n <= 7, "wgmma.wait_group takes 0..=7");
        self.asm_call(None, &format!("wgmma.wait_group.sync.aligned {n};"), "~{memory}", true, &[], "")?;
        Ok(())
    }

    /// [`Kb::wgmma_wait_group`] that threads the accumulators of the awaited MMAs
    /// through the wait (tied registers), so their later uses depend on it.
    pub fn wgmma_wait_group_acc(&self, n: u32, acc: &[FloatValue<'ctx>], name: &str) -> R<Vec<FloatValue<'ctx>>> {
        assert!(n <= 7, "wgmma.wait_group takes 0..=7");
        self.f32_struct_call(&format!("wgmma.wait_group.sync.aligned {n};"), acc, "", &[], name)
    }

    /// `D (+)= A·B` with A and B in shared memory:
    /// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} d, a-desc, b-desc, p, 1, 1,
    /// trans-a, trans-b`. `acc` holds the `n/2` accumulator registers of this thread
    /// (ignored but still tied for [`Acc::Overwrite`]); returns the new ones, valid after
    /// a commit and a wait.
    pub fn wgmma_ss(
        &self,
        ty: WgmmaType,
        n: u32,
        acc: &[FloatValue<'ctx>],
        a_desc: IntValue<'ctx>,
        b_desc: IntValue<'ctx>,
        scale_d: Acc<'ctx>,
        a_major: Major,
        b_major: Major,
        name: &str,
    ) -> R<Vec<FloatValue<'ctx>>> {
        check_n(n, acc.len());
        let k = acc.len();
        let t = ty.ptx();
        let text = format!(
            "{{\n\t.reg .pred p;\n\t{}\n\twgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {}, ${}, ${}, p, 1, 1, {}, {};\n\t}}",
            scale_d_setp(scale_d, 2 * k + 2),
            reg_list(0, k),
            2 * k,
            2 * k + 1,
            a_major as u32,
            b_major as u32,
        );
        let reg = match scale_d {
            Acc::When(v) => v,
            _ => self.i32c(0),
        };
        self.f32_struct_call(&text, acc, "l,l,r", &[a_desc.into(), b_desc.into(), reg.into()], name)
    }

    /// `D (+)= A·B` with A from registers (four b32 registers, each two packed halves,
    /// in the wgmma A-fragment layout) and B in shared memory:
    /// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} d, {a0..a3}, b-desc, p, 1,
    /// 1, trans-b`. The A registers must not change until the MMA's group is waited on.
    pub fn wgmma_rs(
        &self,
        ty: WgmmaType,
        n: u32,
        acc: &[FloatValue<'ctx>],
        a: [IntValue<'ctx>; 4],
        b_desc: IntValue<'ctx>,
        scale_d: Acc<'ctx>,
        b_major: Major,
        name: &str,
    ) -> R<Vec<FloatValue<'ctx>>> {
        check_n(n, acc.len());
        let k = acc.len();
        let t = ty.ptx();
        let text = format!(
            "{{\n\t.reg .pred p;\n\t{}\n\twgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {}, {}, ${}, p, 1, 1, {};\n\t}}",
            scale_d_setp(scale_d, 2 * k + 5),
            reg_list(0, k),
            reg_list(2 * k, 4),
            2 * k + 4,
            b_major as u32,
        );
        let reg = match scale_d {
            Acc::When(v) => v,
            _ => self.i32c(0),
        };
        let args = [a[0].into(), a[1].into(), a[2].into(), a[3].into(), b_desc.into(), reg.into()];
        self.f32_struct_call(&text, acc, "r,r,r,r,l,r", &args, name)
    }

    /// A wgmma descriptor at run time: `hi_lo_const | ((addr >> 4) & 0x3FFF)` where
    /// `addr` is the shared::cta byte address (i32) and `without_start` the constant
    /// part ([`crate::families::hopper::desc::SmemDesc::encode_without_start`]).
    pub fn wgmma_desc(&self, addr: IntValue<'ctx>, without_start: u64, name: &str) -> R<IntValue<'ctx>> {
        let a = self.zext64(addr, "")?;
        let a = self.b.build_right_shift(a, self.i64c(4), false, "")?;
        let a = self.and(a, self.i64c(0x3FFF), "")?;
        let c = self.ctx.i64_type().const_int(without_start, false);
        self.or(a, c, name)
    }

    // ------------------------------------------------------------ TMA store

    /// `fence.proxy.async.shared::cta`: makes this thread's generic-proxy shared-memory
    /// writes visible to the async proxy (before a TMA store or a wgmma reads them).
    pub fn fence_proxy_async_shared(&self) -> R<()> {
        self.asm_call(None, "fence.proxy.async.shared::cta;", "~{memory}", false, &[], "")?;
        Ok(())
    }

    /// 4-D TMA store of one box from shared memory at `src` (coordinates innermost
    /// first, elements), tracked by bulk async groups.
    pub fn tma_store_4d(&self, tmap: IntValue<'ctx>, c: [IntValue<'ctx>; 4], src: IntValue<'ctx>) -> R<()> {
        self.asm_call(
            None,
            "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [$0, {$1, $2, $3, $4}], [$5];",
            "l,r,r,r,r,r,~{memory}",
            false,
            &[tmap.into(), c[0].into(), c[1].into(), c[2].into(), c[3].into(), src.into()],
            "",
        )?;
        Ok(())
    }

    /// `cp.async.bulk.commit_group`: closes a group of this thread's bulk stores.
    pub fn bulk_commit_group(&self) -> R<()> {
        self.asm_call(None, "cp.async.bulk.commit_group;", "~{memory}", false, &[], "")?;
        Ok(())
    }

    /// `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32`: adds `bytes` (a
    /// multiple of 16; both addresses 16-byte aligned) of f32 from shared `src` into
    /// global `dst`, element by element, as one bulk operation of this thread's open
    /// bulk group.
    pub fn bulk_reduce_add_f32(&self, dst: IntValue<'ctx>, src: IntValue<'ctx>, bytes: u32) -> R<()> {
        self.asm_call(
            None,
            &format!("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], {bytes};"),
            "l,r,~{memory}",
            false,
            &[dst.into(), src.into()],
            "",
        )?;
        Ok(())
    }

    /// `cp.async.bulk.wait_group n`: waits until at most `n` bulk groups are pending, their
    /// writes done (not only their shared-memory reads).
    pub fn bulk_wait_group(&self, n: u32) -> R<()> {
        self.asm_call(None, &format!("cp.async.bulk.wait_group {n};"), "~{memory}", false, &[], "")?;
        Ok(())
    }

    /// `stmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8×8 b16 matrices, matrix `j` from
    /// register `v[j]` of every lane (lane `l` holds row `l / 4`, columns `2 (l % 4)` and
    /// `+1`); lane `l` gives the address of row `l % 8` of matrix `l / 8`. Warp-wide.
    pub fn stmatrix_x4(&self, addr: IntValue<'ctx>, offset: i64, v: [IntValue<'ctx>; 4]) -> R<()> {
        self.stmatrix_x4_as("", addr, offset, v)
    }

    /// `stmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: [`Kb::stmatrix_x4`] with each
    /// matrix transposed on the way: row `r` in memory (the address of lane `8 j + r`) gets
    /// column `r` of matrix `j`.
    pub fn stmatrix_x4_trans(&self, addr: IntValue<'ctx>, offset: i64, v: [IntValue<'ctx>; 4]) -> R<()> {
        self.stmatrix_x4_as(".trans", addr, offset, v)
    }

    fn stmatrix_x4_as(&self, layout: &str, addr: IntValue<'ctx>, offset: i64, v: [IntValue<'ctx>; 4]) -> R<()> {
        // The constant offset in the immediate: one address register serves every block.
        self.asm_call(
            None,
            &format!("stmatrix.sync.aligned.m8n8.x4{layout}.shared.b16 [$0+{offset}], {{$1, $2, $3, $4}};"),
            "r,r,r,r,r,~{memory}",
            true,
            &[addr.into(), v[0].into(), v[1].into(), v[2].into(), v[3].into()],
            "",
        )?;
        Ok(())
    }

    /// `st.shared.v2.f32`: two adjacent f32 (8-byte aligned address).
    pub fn st_shared_v2_f32(&self, addr: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<()> {
        self.asm_call(
            None,
            "st.shared.v2.f32 [$0], {$1, $2};",
            "r,f,f,~{memory}",
            false,
            &[addr.into(), a.into(), b.into()],
            "",
        )?;
        Ok(())
    }

    /// `cp.async.bulk.wait_group.read n`: waits until at most `n` bulk groups still read
    /// their shared-memory source (the buffer may then be reused).
    pub fn bulk_wait_group_read(&self, n: u32) -> R<()> {
        self.asm_call(None, &format!("cp.async.bulk.wait_group.read {n};"), "~{memory}", false, &[], "")?;
        Ok(())
    }
}

fn check_n(n: u32, regs: usize) {
    assert!(WGMMA_NS.contains(&n), "the hopper family uses m64nNk16 with N in {WGMMA_NS:?}, not {n}");
    assert_eq!(regs, (n / 2) as usize, "m64n{n}k16.f32 has {} accumulator registers per thread", n / 2);
}
