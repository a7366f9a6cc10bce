//! The wgmma wrappers of `llvm::wgmma` with this family's shared-memory descriptors:
//! each form assembles for sm_90a into the HGMMA it promises, without serialization.

use super::desc::SmemDesc;
use crate::arch::Arch;
use crate::llvm::emit_ptx;
use crate::llvm::kb::{Kb, R};
use crate::llvm::operand::Major;
use crate::llvm::tcgen05::Acc;
use crate::llvm::wgmma::{WgmmaType, WGMMA_NS};
use crate::ptxas;
use inkwell::context::Context;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{FloatValue, IntValue};
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
    kb.set_launch_bounds(128).expect("bounds");
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
