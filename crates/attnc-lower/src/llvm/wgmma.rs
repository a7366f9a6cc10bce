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
use super::tcgen05::Acc;
use crate::families::hopper::desc::Major;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, FloatValue, IntValue};

/// Input element type of `wgmma.mma_async` (the accumulator is always f32 here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaType {
    Bf16,
    F16,
}

impl WgmmaType {
    fn ptx(self) -> &'static str {
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

/// The N values the hopper family uses (PTX allows multiples of 8 in 8..=256).
pub const WGMMA_NS: [u32; 6] = [64, 96, 128, 176, 192, 256];

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
            .ok_or_else(|| crate::families::LowerError::Llvm("wgmma asm returned nothing".into()))?;
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
    #[allow(clippy::too_many_arguments)]
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
    #[allow(clippy::too_many_arguments)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Arch;
    use crate::families::hopper::desc::SmemDesc;
    use crate::llvm::emit_ptx;
    use crate::ptxas;
    use inkwell::context::Context;
    use inkwell::types::BasicMetadataTypeEnum;
    use std::collections::BTreeMap;

    /// Assembles `ptx` for sm_90a and returns its SASS opcode counts; `None` (skip)
    /// when ptxas is not installed, a failure when `CI` is set. ptxas warnings (e.g.
    /// "wgmma.mma_async instructions are serialized") fail the test.
    fn assemble_sm90a(ptx: &str) -> Option<BTreeMap<String, usize>> {
        let report = match ptxas::assemble(ptx, Arch::Sm90a) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas: {e}");
                eprintln!("skipping: {e}");
                return None;
            }
            Err(e) => panic!("ptxas rejected the PTX: {e}\n{ptx}"),
        };
        assert!(!report.has_spills(), "spills:\n{}", report.log);
        assert!(report.warnings.is_empty(), "ptxas warnings: {:?}\n{}", report.warnings, report.log);
        // ptxas reports a broken wgmma pipeline as `info`, not as a warning: serialized
        // MMAs (C7515 "Potential Performance Loss") or an injected wait (C7517
        // "wgmma.wait_group is injected"); a clean log never names wgmma.
        assert!(!wgmma_pipeline_broken(&report.log), "ptxas:\n{}\n{ptx}", report.log);
        if std::env::var_os("ATTNC_DUMP_SM90A").is_some() {
            eprintln!("{}", report.log);
        }
        match report.disassemble() {
            Ok(sass) => Some(ptxas::sass_opcode_counts(&sass)),
            Err(e) if e.is_not_found() => {
                assert!(std::env::var_os("CI").is_none(), "CI must have nvdisasm: {e}");
                eprintln!("skipping SASS: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    fn wgmma_pipeline_broken(log: &str) -> bool {
        log.contains("Potential Performance Loss") || log.contains("wgmma")
    }

    /// Builds kernel `t(out: i64, x: i32)` with 128 threads (one warpgroup) and `body`;
    /// returns its PTX for sm_90a.
    fn kernel(body: impl for<'a> FnOnce(&mut Kb<'a>, IntValue<'a>, IntValue<'a>) -> R<()>) -> String {
        let ctx = Context::create();
        let mut kb = Kb::new(&ctx, "t");
        let i64t: BasicMetadataTypeEnum = ctx.i64_type().into();
        let i32t: BasicMetadataTypeEnum = ctx.i32_type().into();
        let p = kb.begin_kernel("t", &[(i64t, "out".into()), (i32t, "x".into())]).expect("kernel");
        crate::families::blackwell::abi::set_launch_bounds(&kb, 128).expect("bounds");
        body(&mut kb, p[0].into_int_value(), p[1].into_int_value()).expect("body");
        kb.ret().expect("ret");
        let (_, ptx, _, _) = emit_ptx(&kb.module, Arch::Sm90a).expect("emits");
        ptx
    }

    /// Sums `v` and stores the sum to `out` (keeps every accumulator live).
    fn store_sum<'a>(kb: &Kb<'a>, out: IntValue<'a>, v: &[FloatValue<'a>]) -> R<()> {
        let mut s = kb.f32c(0.0);
        for x in v {
            s = kb.fadd(s, *x, "")?;
        }
        kb.st_global_f32(out, s)
    }

    fn has(ops: &BTreeMap<String, usize>, op: &str) -> bool {
        ops.contains_key(op)
    }

    /// S = Q·Kᵀ shape: A and B from shared memory (K-major SW128 descriptors), two K
    /// steps (overwrite, then accumulate), then a run-time scale-d, for each N and type.
    #[test]
    fn wgmma_ss_assembles_for_each_n() {
        for ty in [WgmmaType::Bf16, WgmmaType::F16] {
            for n in WGMMA_NS {
                let ptx = kernel(|kb, out, x| {
                    let q = SmemDesc::k_major_sw128(0).encode_without_start();
                    let a0 = kb.wgmma_desc(kb.i32c(0), q, "a0")?;
                    let a1 = kb.wgmma_desc(kb.i32c(32), q, "a1")?;
                    let b0 = kb.wgmma_desc(kb.i32c(0x2000), q, "b0")?;
                    let b1 = kb.wgmma_desc(kb.i32c(0x2020), q, "b1")?;
                    let undef = kb.ctx.f32_type().get_undef();
                    let acc = vec![undef; (n / 2) as usize];
                    kb.wgmma_fence()?;
                    let acc = kb.wgmma_ss(ty, n, &acc, a0, b0, Acc::Overwrite, Major::K, Major::K, "s")?;
                    let acc = kb.wgmma_ss(ty, n, &acc, a1, b1, Acc::Accumulate, Major::K, Major::K, "s")?;
                    let acc = kb.wgmma_ss(ty, n, &acc, a1, b1, Acc::When(x), Major::K, Major::Mn, "s")?;
                    kb.wgmma_commit_group()?;
                    let acc = kb.wgmma_wait_group_acc(0, &acc, "s")?;
                    store_sum(kb, out, &acc)
                });
                let t = ty.ptx();
                assert!(ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t}")), "{ptx}");
                if let Some(ops) = assemble_sm90a(&ptx) {
                    assert_eq!(ops.get("HGMMA"), Some(&3), "three HGMMA for {ty:?} n={n} in {ops:?}");
                    assert!(has(&ops, "WARPGROUP"), "no WARPGROUP (fence/arrive) for {ty:?} n={n} in {ops:?}");
                }
            }
        }
    }

    /// O += P·V shape: A (P) from registers, B (V) MN-major from shared memory,
    /// accumulating into running accumulators with a wait of 1 then 0 (two groups).
    #[test]
    fn wgmma_rs_assembles_for_each_n() {
        for ty in [WgmmaType::Bf16, WgmmaType::F16] {
            for n in WGMMA_NS {
                let ptx = kernel(|kb, out, x| {
                    let v = SmemDesc::mn_major_sw128(0, 0x4000).encode_without_start();
                    let b = kb.wgmma_desc(kb.i32c(0x8000), v, "v")?;
                    let a: Vec<IntValue> = (0..4).map(|i| kb.add(x, kb.i32c(i), "p")).collect::<R<_>>()?;
                    let a = [a[0], a[1], a[2], a[3]];
                    let acc: Vec<FloatValue> = (0..n / 2).map(|i| kb.f32c(i as f64)).collect();
                    kb.wgmma_fence()?;
                    let acc = kb.wgmma_rs(ty, n, &acc, a, b, Acc::Accumulate, Major::Mn, "o")?;
                    kb.wgmma_commit_group()?;
                    let acc = kb.wgmma_rs(ty, n, &acc, a, b, Acc::When(x), Major::K, "o")?;
                    kb.wgmma_commit_group()?;
                    kb.wgmma_wait_group(1)?;
                    let acc = kb.wgmma_wait_group_acc(0, &acc, "o")?;
                    store_sum(kb, out, &acc)
                });
                let t = ty.ptx();
                assert!(ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t}")), "{ptx}");
                if let Some(ops) = assemble_sm90a(&ptx) {
                    assert_eq!(ops.get("HGMMA"), Some(&2), "two HGMMA for {ty:?} n={n} in {ops:?}");
                }
            }
        }
    }

    /// The tcgen05.rs mbarrier/TMA-load/setmaxnreg/named-barrier wrappers assemble for
    /// sm_90a, and so do the TMA store pieces of this file.
    #[test]
    fn tma_mbarrier_setmaxnreg_assemble_for_sm90a() {
        let ptx = crate::llvm::tcgen05::tests::wrapper_kernel_ptx(Arch::Sm90a, 384, |kb, tmap, out, v| {
            let z = kb.i32c(0);
            kb.st_shared_f32(kb.i32c(2048), v)?;
            kb.fence_proxy_async_shared()?;
            kb.tma_store_4d(tmap, [z, z, z, z], kb.i32c(2048))?;
            kb.bulk_commit_group()?;
            kb.bulk_wait_group_read(0)?;
            kb.st_global_f32(out, v)
        });
        assert!(ptx.contains(".target sm_90a"), "{ptx}");
        if let Some(ops) = assemble_sm90a(&ptx) {
            for op in ["UTMALDG", "UTMASTG", "USETMAXREG", "UTMACCTL", "SYNCS", "BAR"] {
                assert!(has(&ops, op), "no {op} in {ops:?}");
            }
        }
    }

    /// The guard above is live: accumulators read between an MMA and its wait make
    /// ptxas inject a wait (C7517), and the check catches it.
    #[test]
    fn touching_accumulators_in_flight_is_caught() {
        let ptx = kernel(|kb, out, _x| {
            let q = SmemDesc::k_major_sw128(0).encode_without_start();
            let a = kb.wgmma_desc(kb.i32c(0), q, "a")?;
            let acc: Vec<FloatValue> = (0..32).map(|i| kb.f32c(i as f64)).collect();
            kb.wgmma_fence()?;
            let acc = kb.wgmma_ss(WgmmaType::Bf16, 64, &acc, a, a, Acc::Accumulate, Major::K, Major::K, "s")?;
            // Wrong: uses the MMA's results before any wait.
            let acc: Vec<FloatValue> = acc.iter().map(|v| kb.fadd(*v, kb.f32c(1.0), "")).collect::<R<_>>()?;
            let acc = kb.wgmma_ss(WgmmaType::Bf16, 64, &acc, a, a, Acc::Accumulate, Major::K, Major::K, "s")?;
            kb.wgmma_commit_group()?;
            let acc = kb.wgmma_wait_group_acc(0, &acc, "s")?;
            store_sum(kb, out, &acc)
        });
        match ptxas::assemble(&ptx, Arch::Sm90a) {
            Ok(r) => assert!(wgmma_pipeline_broken(&r.log), "ptxas no longer reports it:\n{}", r.log),
            Err(e) if e.is_not_found() => {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas: {e}");
                eprintln!("skipping: {e}");
            }
            Err(e) => panic!("ptxas rejected the PTX: {e}\n{ptx}"),
        }
    }
}
