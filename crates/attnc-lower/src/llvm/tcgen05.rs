//! sm_100a instruction wrappers: tensor memory (`tcgen05.alloc/ld/st/dealloc`), the
//! fifth-generation tensor core MMA (`tcgen05.mma`, `tcgen05.commit`), mbarriers, TMA
//! (`cp.async.bulk.tensor`), `setmaxnreg` and named barriers, as typed inline asm on
//! [`Kb`]. Each one's syntax was validated with ptxas 13.5 for sm_100a; the tests at the
//! end assemble a small kernel per group and check the SASS (`UTCHMMA`, `UTCBAR`,
//! `LDTM`, `STTM`, `UTMALDG`, `USETMAXREG`, `SYNCS.*`).
//!
//! Instructions whose PTX form is `.sync.aligned` (every thread of the warp executes
//! the same instance) are emitted as `convergent` calls, so LLVM never moves them into
//! divergent control flow.

use super::kb::{meta_type, Kb, R};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::types::{BasicMetadataTypeEnum, BasicType};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FloatValue, IntValue};

/// A shared-memory matrix operand of `tcgen05.mma`: the descriptor is
/// `(hi << 32) | (lo + add)`, `lo` holding `(address >> 4) | low constant bits` and `add`
/// the operand's offset from that address in 16-byte units (the address field has 14
/// bits and shared addresses stay below 256 KiB, so the add never carries out of it).
#[derive(Clone, Copy, Debug)]
pub struct SmemOperand<'ctx> {
    pub lo: IntValue<'ctx>,
    pub hi: u32,
    pub add: u32,
}

/// The CTAs a tcgen05 instruction acts for: this CTA alone, or (2-CTA mode) the CTA pair
/// of a cluster of two, whose MMAs take M = 256 rows split across the pair's TMEM and read
/// each CTA's half of the B operand (the kernel declares `.reqnctapercluster 2, 1, 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtaGroup {
    One,
    Two,
}

impl CtaGroup {
    fn ptx(self) -> &'static str {
        match self {
            CtaGroup::One => "cta_group::1",
            CtaGroup::Two => "cta_group::2",
        }
    }
}

/// The MMA's accumulate flag (`enable-input-d`).
#[derive(Clone, Copy, Debug)]
pub enum Acc<'ctx> {
    /// D = A·B.
    Overwrite,
    /// D += A·B.
    Accumulate,
    /// Accumulate when the i32 is non-zero.
    When(IntValue<'ctx>),
}

impl<'ctx> Acc<'ctx> {
    /// The PTX that sets predicate `p` (operand $3 / the last register operand `$A`).
    fn setp(self) -> &'static str {
        match self {
            Acc::Overwrite => "setp.ne.b32 p, $0, $0;",
            Acc::Accumulate => "setp.eq.b32 p, $0, $0;",
            Acc::When(_) => "setp.ne.b32 p, $A, 0;",
        }
    }
    fn reg(self, kb: &Kb<'ctx>) -> IntValue<'ctx> {
        match self {
            Acc::When(v) => v,
            _ => kb.i32c(0),
        }
    }
}

impl<'ctx> Kb<'ctx> {
    /// Inline asm with side effects, optionally `convergent`; returns the result value
    /// (a struct for several outputs) or `None` for a void asm.
    pub fn asm_call(
        &self,
        ret: Option<inkwell::types::BasicTypeEnum<'ctx>>,
        text: &str,
        constraints: &str,
        convergent: bool,
        args: &[BasicMetadataValueEnum<'ctx>],
        name: &str,
    ) -> R<Option<BasicValueEnum<'ctx>>> {
        let tys: Vec<BasicMetadataTypeEnum> = args.iter().map(|a| meta_type(*a)).collect();
        let fn_ty = match ret {
            Some(t) => t.fn_type(&tys, false),
            None => self.ctx.void_type().fn_type(&tys, false),
        };
        let asm =
            self.ctx.create_inline_asm(fn_ty, text.to_string(), constraints.to_string(), true, false, None, false);
        let call = self.b.build_indirect_call(fn_ty, asm, args, name)?;
        if convergent {
            let kind = Attribute::get_named_enum_kind_id("convergent");
            call.add_attribute(AttributeLoc::Function, self.ctx.create_enum_attribute(kind, 0));
        }
        Ok(match call.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Some(v),
            inkwell::values::ValueKind::Instruction(_) => None,
        })
    }

    fn asm_v(&self, text: &str, constraints: &str, convergent: bool, args: &[BasicMetadataValueEnum<'ctx>]) -> R<()> {
        self.asm_call(None, text, constraints, convergent, args, "")?;
        Ok(())
    }

    // ------------------------------------------------------------ tensor memory

    /// `tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [slot], ncols`: the warp
    /// allocates `ncols` TMEM columns (a power of two in 32..=512) and the hardware writes
    /// the TMEM address to shared memory at `slot`.
    pub fn tmem_alloc(&self, slot: IntValue<'ctx>, ncols: u32) -> R<()> {
        self.tmem_alloc_in(CtaGroup::One, slot, ncols)
    }
    /// [`Kb::tmem_alloc`] for `group` (2-CTA: the same columns in both CTAs of the pair).
    pub fn tmem_alloc_in(&self, group: CtaGroup, slot: IntValue<'ctx>, ncols: u32) -> R<()> {
        assert!(
            ncols.is_power_of_two() && (32..=512).contains(&ncols),
            "TMEM allocations are 32..=512 columns, a power of two"
        );
        self.asm_v(
            &format!("tcgen05.alloc.{}.sync.aligned.shared::cta.b32 [$0], {ncols};", group.ptx()),
            "r,~{memory}",
            true,
            &[slot.into()],
        )
    }
    /// `tcgen05.relinquish_alloc_permit`: this CTA will not allocate again.
    pub fn tmem_relinquish(&self) -> R<()> {
        self.tmem_relinquish_in(CtaGroup::One)
    }
    pub fn tmem_relinquish_in(&self, group: CtaGroup) -> R<()> {
        self.asm_v(&format!("tcgen05.relinquish_alloc_permit.{}.sync.aligned;", group.ptx()), "~{memory}", true, &[])
    }
    pub fn tmem_dealloc(&self, taddr: IntValue<'ctx>, ncols: u32) -> R<()> {
        self.tmem_dealloc_in(CtaGroup::One, taddr, ncols)
    }
    pub fn tmem_dealloc_in(&self, group: CtaGroup, taddr: IntValue<'ctx>, ncols: u32) -> R<()> {
        self.asm_v(
            &format!("tcgen05.dealloc.{}.sync.aligned.b32 $0, {ncols};", group.ptx()),
            "r,~{memory}",
            true,
            &[taddr.into()],
        )
    }
    /// `tcgen05.fence::before_thread_sync`: orders this thread's prior tcgen05 operations
    /// before a following synchronization (mbarrier arrive, bar.sync).
    pub fn tcgen05_fence_before(&self) -> R<()> {
        self.asm_v("tcgen05.fence::before_thread_sync;", "~{memory}", false, &[])
    }
    /// `tcgen05.fence::after_thread_sync`: orders following tcgen05 operations after a
    /// preceding synchronization.
    pub fn tcgen05_fence_after(&self) -> R<()> {
        self.asm_v("tcgen05.fence::after_thread_sync;", "~{memory}", false, &[])
    }

    /// Loads `n` consecutive 32-bit TMEM columns per thread (`tcgen05.ld.sync.aligned.
    /// 32x32b.x{chunk}.b32`, `n / chunk` instructions at `taddr + k·chunk`) and waits for
    /// them (`tcgen05.wait::ld`) inside the same asm statement, so no use of a result can
    /// be scheduled before the wait. Thread t of the warp reads lane `lane(taddr) + t`,
    /// columns from `col(taddr) + off` (an immediate offset, so a loop needs no register
    /// per column address).
    pub fn tmem_load(&self, taddr: IntValue<'ctx>, off: u32, n: u32, chunk: u32, name: &str) -> R<Vec<IntValue<'ctx>>> {
        assert!(chunk.is_power_of_two() && chunk <= 128 && n % chunk == 0 && n > 0);
        let i32t = self.ctx.i32_type();
        let parts = n / chunk;
        let mut text = String::new();
        let args: Vec<BasicMetadataValueEnum> = vec![taddr.into()];
        for p in 0..parts {
            let regs: Vec<String> = (0..chunk).map(|k| format!("${}", p * chunk + k)).collect();
            text.push_str(&format!(
                "tcgen05.ld.sync.aligned.32x32b.x{chunk}.b32 {{{}}}, [${n}+{}];\n\t",
                regs.join(","),
                off + p * chunk
            ));
        }
        text.push_str("tcgen05.wait::ld.sync.aligned;");
        let mut cons: Vec<String> = (0..n).map(|_| "=r".to_string()).collect();
        cons.push("r".to_string());
        cons.push("~{memory}".into());
        let ret = if n == 1 { i32t.into() } else { self.struct_of(i32t.into(), n as usize).into() };
        let v = self
            .asm_call(Some(ret), &text, &cons.join(","), true, &args, name)?
            .ok_or_else(|| crate::error::LowerError::Llvm("tcgen05.ld returned nothing".into()))?;
        if n == 1 {
            return Ok(vec![v.into_int_value()]);
        }
        (0..n).map(|k| Ok(self.extract(v, k, name)?.into_int_value())).collect()
    }

    /// `tcgen05.st.sync.aligned.32x32b.x{n}.b32 [taddr], {vals}`: thread t writes
    /// `vals` to `n` consecutive columns of lane `lane(taddr) + t`. Completion needs
    /// [`Kb::tmem_wait_st`].
    pub fn tmem_store(&self, taddr: IntValue<'ctx>, off: u32, vals: &[IntValue<'ctx>]) -> R<()> {
        let n = vals.len();
        assert!(n.is_power_of_two() && n <= 128);
        let regs: Vec<String> = (1..=n).map(|k| format!("${k}")).collect();
        let text = format!("tcgen05.st.sync.aligned.32x32b.x{n}.b32 [$0+{off}], {{{}}};", regs.join(","));
        let mut cons = vec!["r".to_string()];
        cons.extend((0..n).map(|_| "r".to_string()));
        cons.push("~{memory}".into());
        let mut args: Vec<BasicMetadataValueEnum> = vec![taddr.into()];
        args.extend(vals.iter().map(|v| BasicMetadataValueEnum::from(*v)));
        self.asm_v(&text, &cons.join(","), true, &args)
    }
    pub fn tmem_wait_st(&self) -> R<()> {
        self.asm_v("tcgen05.wait::st.sync.aligned;", "~{memory}", true, &[])
    }

    // ------------------------------------------------------------ MMA

    /// `tcgen05.mma.cta_group::1.kind::f16 [tmem + d_off], a, b, idesc, acc`: D (TMEM) =
    /// A·B (+ D when `acc`), A and B in shared memory. Issued by one thread. The 64-bit
    /// descriptors are assembled inside the asm from a 32-bit register and immediates
    /// ([`SmemOperand`]), so an MMA loop holds one register per operand tile.
    pub fn tcgen05_mma_ss(
        &self,
        tmem: IntValue<'ctx>,
        d_off: u32,
        a: SmemOperand<'ctx>,
        b: SmemOperand<'ctx>,
        idesc: u32,
        acc: Acc<'ctx>,
    ) -> R<()> {
        self.tcgen05_mma_ss_in(CtaGroup::One, tmem, d_off, a, b, idesc, acc)
    }

    /// [`Kb::tcgen05_mma_ss`] for `group` (2-CTA: issued by one thread of the pair's first
    /// CTA, M = 256 in the instruction descriptor).
    #[allow(clippy::too_many_arguments)]
    pub fn tcgen05_mma_ss_in(
        &self,
        group: CtaGroup,
        tmem: IntValue<'ctx>,
        d_off: u32,
        a: SmemOperand<'ctx>,
        b: SmemOperand<'ctx>,
        idesc: u32,
        acc: Acc<'ctx>,
    ) -> R<()> {
        let text = format!(
            "{{\n\t.reg .pred p;\n\t.reg .b32 al, bl, ah, bh;\n\t.reg .b64 ad, bd;\n\t{}\n\t\
             add.u32 al, $1, {};\n\tmov.b32 ah, {:#x};\n\tmov.b64 ad, {{al, ah}};\n\t\
             add.u32 bl, $2, {};\n\tmov.b32 bh, {:#x};\n\tmov.b64 bd, {{bl, bh}};\n\t\
             tcgen05.mma.{}.kind::f16 [$0+{d_off}], ad, bd, {idesc:#x}, p;\n\t}}",
            acc.setp().replace("$A", "$3"),
            a.add,
            a.hi,
            b.add,
            b.hi,
            group.ptx()
        );
        self.asm_v(&text, "r,r,r,r,~{memory}", false, &[tmem.into(), a.lo.into(), b.lo.into(), acc.reg(self).into()])
    }

    /// The same with A read from tensor memory at `tmem + a_off`: 16-bit A elements packed
    /// two per 32-bit column, row m in lane m.
    pub fn tcgen05_mma_ts(
        &self,
        tmem: IntValue<'ctx>,
        d_off: u32,
        a_off: u32,
        b: SmemOperand<'ctx>,
        idesc: u32,
        acc: Acc<'ctx>,
    ) -> R<()> {
        self.tcgen05_mma_ts_in(CtaGroup::One, tmem, d_off, a_off, b, idesc, acc)
    }

    /// [`Kb::tcgen05_mma_ts`] for `group`.
    #[allow(clippy::too_many_arguments)]
    pub fn tcgen05_mma_ts_in(
        &self,
        group: CtaGroup,
        tmem: IntValue<'ctx>,
        d_off: u32,
        a_off: u32,
        b: SmemOperand<'ctx>,
        idesc: u32,
        acc: Acc<'ctx>,
    ) -> R<()> {
        let text = format!(
            "{{\n\t.reg .pred p;\n\t.reg .b32 bl, bh;\n\t.reg .b64 bd;\n\t{}\n\t\
             add.u32 bl, $1, {};\n\tmov.b32 bh, {:#x};\n\tmov.b64 bd, {{bl, bh}};\n\t\
             tcgen05.mma.{}.kind::f16 [$0+{d_off}], [$0+{a_off}], bd, {idesc:#x}, p;\n\t}}",
            acc.setp().replace("$A", "$2"),
            b.add,
            b.hi,
            group.ptx()
        );
        self.asm_v(&text, "r,r,r,~{memory}", false, &[tmem.into(), b.lo.into(), acc.reg(self).into()])
    }

    /// `tcgen05.commit...mbarrier::arrive::one`: one arrival on `mbar` once every prior
    /// async tcgen05 operation of this thread (MMAs) has completed.
    pub fn tcgen05_commit(&self, mbar: IntValue<'ctx>) -> R<()> {
        self.asm_v(
            "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [$0];",
            "r,~{memory}",
            false,
            &[mbar.into()],
        )
    }

    /// `tcgen05.commit.cta_group::2...multicast::cluster`: once the pair's prior MMAs
    /// completed, one arrival on the mbarrier at the same shared offset in each CTA of
    /// `cta_mask` (bit i: the cluster's CTA i), so both CTAs learn that their TMEM halves
    /// are written.
    pub fn tcgen05_commit_multicast(&self, mbar: IntValue<'ctx>, cta_mask: u16) -> R<()> {
        self.asm_v(
            &format!(
                "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [$0], {cta_mask};"
            ),
            "r,~{memory}",
            false,
            &[mbar.into()],
        )
    }

    // ------------------------------------------------------------ mbarriers

    pub fn mbar_init(&self, mbar: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_v(&format!("mbarrier.init.shared::cta.b64 [$0], {count};"), "r,~{memory}", false, &[mbar.into()])
    }
    /// `mbar_init` with a run-time arrival count.
    pub fn mbar_init_r(&self, mbar: IntValue<'ctx>, count: IntValue<'ctx>) -> R<()> {
        self.asm_v("mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", false, &[mbar.into(), count.into()])
    }
    /// Makes initialized mbarriers visible to other threads and the async proxy.
    pub fn fence_mbarrier_init(&self) -> R<()> {
        self.asm_v("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;", "~{memory}", false, &[])
    }
    pub fn mbar_arrive(&self, mbar: IntValue<'ctx>) -> R<()> {
        self.asm_v("mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}", false, &[mbar.into()])
    }
    /// One arrival per warp on `mbar`: lane 0 (`lane` is the thread's lane) arrives
    /// through a predicate inside the asm, not a branch — a divergent branch between two
    /// wgmma waits makes ptxas hoist the second wait above it.
    pub fn mbar_arrive_lane0(&self, mbar: IntValue<'ctx>, lane: IntValue<'ctx>) -> R<()> {
        self.asm_v(
            "{\n\t.reg .pred lane0;\n\tsetp.eq.u32 lane0, $0, 0;\n\t@lane0 mbarrier.arrive.shared::cta.b64 _, [$1];\n\t}",
            "r,r,~{memory}",
            false,
            &[lane.into(), mbar.into()],
        )
    }
    /// One arrival that also expects `bytes` of TMA transactions in the current phase.
    pub fn mbar_arrive_expect_tx(&self, mbar: IntValue<'ctx>, bytes: u32) -> R<()> {
        self.asm_v(
            &format!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {bytes};"),
            "r,~{memory}",
            false,
            &[mbar.into()],
        )
    }
    /// Spins until the phase of parity `parity` (0/1) of `mbar` has completed
    /// (`mbarrier.try_wait.parity` in a loop; the label is local to the asm's block).
    pub fn mbar_wait(&self, mbar: IntValue<'ctx>, parity: IntValue<'ctx>) -> R<()> {
        self.mbar_try_wait_loop(mbar, parity, "")
    }

    /// `mbar_wait` whose `try_wait` may suspend the thread up to `hint_ns` nanoseconds
    /// (the suspend-time hint) instead of returning at once: a warp that waits long (a
    /// producer ahead of its consumers) then stops spinning and leaves its scheduler's
    /// issue slots to the other warps.
    pub fn mbar_wait_suspend(&self, mbar: IntValue<'ctx>, parity: IntValue<'ctx>, hint_ns: u32) -> R<()> {
        self.mbar_try_wait_loop(mbar, parity, &format!(", {hint_ns}"))
    }

    /// The `try_wait.parity` loop of the waits above, `hint` appended to its operands.
    fn mbar_try_wait_loop(&self, mbar: IntValue<'ctx>, parity: IntValue<'ctx>, hint: &str) -> R<()> {
        self.asm_v(
            &format!(
                "{{\n\t.reg .pred p;\n\tWAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1{hint};\n\t@!p bra WAIT;\n\t}}"
            ),
            "r,r,~{memory}",
            false,
            &[mbar.into(), parity.into()],
        )
    }

    // ------------------------------------------------------------ TMA

    /// The generic address of kernel parameter `param` (a `__grid_constant__` tensor map
    /// in `.param` space): `mov` of the parameter symbol, then `cvta.param`.
    pub fn param_generic_addr(&self, param: &str, name: &str) -> R<IntValue<'ctx>> {
        let t = self.ctx.i64_type();
        let v = self.asm_call(
            Some(t.into()),
            &format!("{{\n\t.reg .b64 t;\n\tmov.b64 t, {param};\n\tcvta.param.u64 $0, t;\n\t}}"),
            "=l",
            false,
            &[],
            name,
        )?;
        Ok(v.map(|v| v.into_int_value()).unwrap_or_else(|| self.i64c(0)))
    }
    pub fn tensormap_prefetch(&self, tmap: IntValue<'ctx>) -> R<()> {
        self.asm_v("prefetch.tensormap [$0];", "l,~{memory}", false, &[tmap.into()])
    }
    /// 4-D TMA load of one box into shared memory at `dst`, completing `bytes` of
    /// transactions on `mbar`. Coordinates are innermost first (elements).
    pub fn tma_load_4d(
        &self,
        dst: IntValue<'ctx>,
        tmap: IntValue<'ctx>,
        c: [IntValue<'ctx>; 4],
        mbar: IntValue<'ctx>,
    ) -> R<()> {
        self.tma_load_4d_with("", dst, tmap, c, mbar)
    }
    /// `cp.async.bulk.tensor.4d` with `qualifier` after the dimension (`.cta_group::2`).
    fn tma_load_4d_with(
        &self,
        qualifier: &str,
        dst: IntValue<'ctx>,
        tmap: IntValue<'ctx>,
        c: [IntValue<'ctx>; 4],
        mbar: IntValue<'ctx>,
    ) -> R<()> {
        self.asm_v(
            &format!(
                "cp.async.bulk.tensor.4d{qualifier}.shared::cluster.global.mbarrier::complete_tx::bytes \
                 [$0], [$1, {{$2, $3, $4, $5}}], [$6];"
            ),
            "r,l,r,r,r,r,r,~{memory}",
            false,
            &[dst.into(), tmap.into(), c[0].into(), c[1].into(), c[2].into(), c[3].into(), mbar.into()],
        )
    }

    /// 1-D bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from
    /// global `src` to shared `dst`, completing its bytes of transactions on `mbar`.
    pub fn bulk_load(&self, dst: IntValue<'ctx>, src: IntValue<'ctx>, bytes: u32, mbar: IntValue<'ctx>) -> R<()> {
        self.asm_v(
            &format!("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], {bytes}, [$2];"),
            "r,l,r,~{memory}",
            false,
            &[dst.into(), src.into(), mbar.into()],
        )
    }

    /// 5-D TMA load (coordinates innermost first), as [`Kb::tma_load_4d`].
    pub fn tma_load_5d(
        &self,
        dst: IntValue<'ctx>,
        tmap: IntValue<'ctx>,
        c: [IntValue<'ctx>; 5],
        mbar: IntValue<'ctx>,
    ) -> R<()> {
        self.asm_v(
            "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1, {$2, $3, $4, $5, $6}], [$7];",
            "r,l,r,r,r,r,r,r,~{memory}",
            false,
            &[dst.into(), tmap.into(), c[0].into(), c[1].into(), c[2].into(), c[3].into(), c[4].into(), mbar.into()],
        )
    }

    /// 5-D TMA store of one box from shared memory at `src` (pack-GQA O), tracked by
    /// bulk async groups.
    pub fn tma_store_5d(&self, tmap: IntValue<'ctx>, c: [IntValue<'ctx>; 5], src: IntValue<'ctx>) -> R<()> {
        self.asm_v(
            "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [$0, {$1, $2, $3, $4, $5}], [$6];",
            "l,r,r,r,r,r,r,~{memory}",
            false,
            &[tmap.into(), c[0].into(), c[1].into(), c[2].into(), c[3].into(), c[4].into(), src.into()],
        )
    }

    // ------------------------------------------------------------ registers, barriers

    // ------------------------------------------------------------ clusters (CTA pairs)

    /// `mapa.shared::cluster`: the shared::cluster address of the same offset `addr` in
    /// the shared memory of the cluster's CTA `rank`.
    pub fn mapa_shared(&self, addr: IntValue<'ctx>, rank: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let t = self.ctx.i32_type();
        let v = self.asm_call(
            Some(t.into()),
            "mapa.shared::cluster.u32 $0, $1, $2;",
            "=r,r,r",
            false,
            &[addr.into(), rank.into()],
            name,
        )?;
        Ok(v.map(|v| v.into_int_value()).unwrap_or(addr))
    }
    /// A 16-byte store to a shared::cluster address (this CTA's or its peer's).
    pub fn st_shared_cluster_v4_b32(&self, addr: IntValue<'ctx>, v: [IntValue<'ctx>; 4]) -> R<()> {
        self.asm_v(
            "st.shared::cluster.v4.b32 [$0], {$1, $2, $3, $4};",
            "r,r,r,r,r,~{memory}",
            false,
            &[addr.into(), v[0].into(), v[1].into(), v[2].into(), v[3].into()],
        )
    }
    /// One arrival, released at cluster scope, on an mbarrier at a shared::cluster
    /// address: orders this thread's global memory operations too (`MEMBAR.ALL.GPU` in
    /// the SASS), for hand-overs that publish global adds.
    pub fn mbar_arrive_cluster(&self, mbar: IntValue<'ctx>) -> R<()> {
        self.asm_v("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [$0];", "r,~{memory}", false, &[mbar.into()])
    }
    /// One arrival on an mbarrier at a shared::cluster address (the pair's first CTA
    /// gathers both CTAs' hand-overs) with the instruction's default semantics, as cluster
    /// pipelines hand buffers across CTAs: no GPU-scope memory barrier per arrival.
    pub fn mbar_arrive_remote(&self, mbar: IntValue<'ctx>) -> R<()> {
        self.asm_v("mbarrier.arrive.shared::cluster.b64 _, [$0];", "r,~{memory}", false, &[mbar.into()])
    }
    /// [`Kb::mbar_arrive_remote`] once per warp: lane 0 arrives through a predicate.
    pub fn mbar_arrive_remote_lane0(&self, mbar: IntValue<'ctx>, lane: IntValue<'ctx>) -> R<()> {
        self.asm_v(
            "{\n\t.reg .pred lane0;\n\tsetp.eq.u32 lane0, $0, 0;\n\t@lane0 mbarrier.arrive.shared::cluster.b64 _, [$1];\n\t}",
            "r,r,~{memory}",
            false,
            &[lane.into(), mbar.into()],
        )
    }
    /// [`Kb::mbar_arrive_expect_tx`] on a shared::cluster address (the peer's barrier).
    pub fn mbar_arrive_expect_tx_remote(&self, mbar: IntValue<'ctx>, bytes: u32) -> R<()> {
        self.asm_v(
            &format!("mbarrier.arrive.expect_tx.shared::cluster.b64 _, [$0], {bytes};"),
            "r,~{memory}",
            false,
            &[mbar.into()],
        )
    }
    /// [`Kb::mbar_wait`] acquiring at cluster scope: for barriers the peer CTA arrives on.
    pub fn mbar_wait_cluster(&self, mbar: IntValue<'ctx>, parity: IntValue<'ctx>) -> R<()> {
        self.asm_v(
            "{\n\t.reg .pred p;\n\tWAIT:\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [$0], $1;\n\t\
             @!p bra WAIT;\n\t}",
            "r,r,~{memory}",
            false,
            &[mbar.into(), parity.into()],
        )
    }
    /// 4-D TMA load into this CTA's shared memory whose transactions complete on an
    /// mbarrier of either CTA of the pair (`.cta_group::2`; `mbar` a shared::cluster
    /// address): both CTAs' operands land on the first CTA's barrier, which its MMA
    /// thread waits on.
    pub fn tma_load_4d_pair(
        &self,
        dst: IntValue<'ctx>,
        tmap: IntValue<'ctx>,
        c: [IntValue<'ctx>; 4],
        mbar: IntValue<'ctx>,
    ) -> R<()> {
        self.tma_load_4d_with(".cta_group::2", dst, tmap, c, mbar)
    }
    /// Every thread of the cluster: `barrier.cluster.arrive.release` then `wait.acquire`
    /// (the pair's barriers initialized before any remote arrival; neither CTA exits
    /// while its peer may still reach its shared memory or TMEM).
    pub fn cluster_sync(&self) -> R<()> {
        self.asm_v("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;", "~{memory}", true, &[])
    }
    /// Orders this thread's generic-proxy shared-memory writes (its own CTA's or the
    /// peer's) before later async-proxy reads (the peer's MMAs).
    pub fn fence_proxy_async_shared_cluster(&self) -> R<()> {
        self.asm_v("fence.proxy.async.shared::cluster;", "~{memory}", false, &[])
    }

    /// `setmaxnreg.inc.sync.aligned.u32 n`, executed by every warp of a warpgroup: waits
    /// until the CTA's register pool can raise this warp's budget to `n`.
    pub fn setmaxnreg_inc(&self, n: u32) -> R<()> {
        check_maxnreg(n);
        self.asm_v(&format!("setmaxnreg.inc.sync.aligned.u32 {n};"), "~{memory}", true, &[])
    }
    /// `setmaxnreg.dec.sync.aligned.u32 n`: returns registers above `n` to the pool.
    pub fn setmaxnreg_dec(&self, n: u32) -> R<()> {
        check_maxnreg(n);
        self.asm_v(&format!("setmaxnreg.dec.sync.aligned.u32 {n};"), "~{memory}", true, &[])
    }
    /// `barrier.sync id, count` (not `.aligned`: safe where a warp may be diverged).
    pub fn named_bar_sync(&self, id: u32, count: u32) -> R<()> {
        self.asm_v(&format!("barrier.sync {id}, {count};"), "~{memory}", true, &[])
    }
    pub fn named_bar_arrive(&self, id: u32, count: u32) -> R<()> {
        self.asm_v(&format!("barrier.arrive {id}, {count};"), "~{memory}", true, &[])
    }
    /// `barrier.sync id, count` with the id in a register.
    pub fn named_bar_sync_r(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_v(&format!("barrier.sync $0, {count};"), "r,~{memory}", true, &[id.into()])
    }
    pub fn named_bar_arrive_r(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_v(&format!("barrier.arrive $0, {count};"), "r,~{memory}", true, &[id.into()])
    }
    /// Every thread of the CTA (`barrier.sync 0`, not `.aligned`).
    pub fn cta_barrier(&self) -> R<()> {
        self.asm_v("barrier.sync 0;", "~{memory}", true, &[])
    }
    /// Reconverges the warp (`bar.warp.sync -1`).
    pub fn warp_sync(&self) -> R<()> {
        self.asm_v("bar.warp.sync -1;", "~{memory}", true, &[])
    }

    // ------------------------------------------------------------ shared memory

    pub fn ld_shared_b32(&self, addr: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let t = self.ctx.i32_type();
        let v =
            self.asm_call(Some(t.into()), "ld.shared.b32 $0, [$1];", "=r,r,~{memory}", false, &[addr.into()], name)?;
        Ok(v.map(|v| v.into_int_value()).unwrap_or_else(|| self.i32c(0)))
    }
    pub fn ld_shared_f32(&self, addr: IntValue<'ctx>, name: &str) -> R<FloatValue<'ctx>> {
        let t = self.ctx.f32_type();
        let v =
            self.asm_call(Some(t.into()), "ld.shared.f32 $0, [$1];", "=f,r,~{memory}", false, &[addr.into()], name)?;
        Ok(v.map(|v| v.into_float_value()).unwrap_or_else(|| self.f32c(0.0)))
    }
    /// `ld.volatile.shared.b32`: never hoisted or merged (by LLVM or ptxas).
    pub fn ld_volatile_shared_b32(&self, addr: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let t = self.ctx.i32_type();
        let v = self.asm_call(
            Some(t.into()),
            "ld.volatile.shared.b32 $0, [$1];",
            "=r,r,~{memory}",
            false,
            &[addr.into()],
            name,
        )?;
        Ok(v.map(|v| v.into_int_value()).unwrap_or_else(|| self.i32c(0)))
    }
    pub fn st_shared_b32(&self, addr: IntValue<'ctx>, v: IntValue<'ctx>) -> R<()> {
        self.asm_v("st.shared.b32 [$0], $1;", "r,r,~{memory}", false, &[addr.into(), v.into()])
    }
    pub fn st_shared_v4_b32(&self, addr: IntValue<'ctx>, v: [IntValue<'ctx>; 4]) -> R<()> {
        self.asm_v(
            "st.shared.v4.b32 [$0], {$1, $2, $3, $4};",
            "r,r,r,r,r,~{memory}",
            false,
            &[addr.into(), v[0].into(), v[1].into(), v[2].into(), v[3].into()],
        )
    }
    pub fn st_shared_f32(&self, addr: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        self.asm_v("st.shared.f32 [$0], $1;", "r,f,~{memory}", false, &[addr.into(), v.into()])
    }
    pub fn st_global_v4_b32(&self, addr: IntValue<'ctx>, v: [IntValue<'ctx>; 4]) -> R<()> {
        self.asm_v(
            "st.global.v4.b32 [$0], {$1, $2, $3, $4};",
            "l,r,r,r,r,~{memory}",
            false,
            &[addr.into(), v[0].into(), v[1].into(), v[2].into(), v[3].into()],
        )
    }
}

fn check_maxnreg(n: u32) {
    assert!(n % 8 == 0 && (24..=256).contains(&n), "setmaxnreg takes a multiple of 8 in 24..=256");
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::arch::Arch;
    use crate::llvm::emit_ptx;
    use crate::ptxas;
    use inkwell::context::Context;
    use inkwell::types::BasicMetadataTypeEnum;
    use inkwell::values::{FloatValue, IntValue};

    /// Assembles `ptx` for sm_100a and returns its SASS opcode counts; `None` (skip)
    /// when ptxas is not installed, a failure when `CI` is set.
    pub(crate) fn assemble_sm100a(ptx: &str) -> Option<std::collections::BTreeMap<String, usize>> {
        let report = match ptxas::assemble(ptx, Arch::Sm100a) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas: {e}");
                eprintln!("skipping: {e}");
                return None;
            }
            Err(e) => panic!("ptxas rejected the PTX: {e}\n{ptx}"),
        };
        assert!(!report.has_spills(), "spills:\n{}", report.log);
        assert!(report.warnings.is_empty(), "ptxas warnings: {:?}", report.warnings);
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

    /// Builds kernel `name` with params (i64 out, i32 x) and `body`, returns its PTX.
    fn kernel(body: impl for<'a> FnOnce(&mut Kb<'a>, IntValue<'a>, IntValue<'a>) -> R<()>) -> String {
        let ctx = Context::create();
        let mut kb = Kb::new(&ctx, "t");
        let i64t: BasicMetadataTypeEnum = ctx.i64_type().into();
        let i32t: BasicMetadataTypeEnum = ctx.i32_type().into();
        let p = kb.begin_kernel("t", &[(i64t, "out".into()), (i32t, "x".into())]).expect("kernel");
        body(&mut kb, p[0].into_int_value(), p[1].into_int_value()).expect("body");
        kb.ret().expect("ret");
        let (_, ptx, _, _) = emit_ptx(&kb.module, Arch::Sm100a).expect("emits");
        ptx
    }

    fn has(ops: &std::collections::BTreeMap<String, usize>, op: &str) -> bool {
        ops.contains_key(op)
    }

    #[test]
    fn tmem_alloc_ld_st_dealloc_assemble() {
        let ptx = kernel(|kb, out, x| {
            let slot = kb.i32c(0);
            kb.tmem_alloc(slot, 512)?;
            kb.tmem_relinquish()?;
            kb.tcgen05_fence_before()?;
            kb.cta_barrier()?;
            kb.tcgen05_fence_after()?;
            let taddr = kb.ld_shared_b32(slot, "taddr")?;
            let v = kb.tmem_load(taddr, 0, 64, 32, "s")?;
            let w: Vec<IntValue> = v.iter().map(|r| kb.add(*r, x, "")).collect::<R<_>>()?;
            kb.tmem_store(taddr, 0, &w[..32])?;
            kb.tmem_store(taddr, 32, &w[32..])?;
            kb.tmem_wait_st()?;
            let one = kb.tmem_load(taddr, 256, 1, 1, "one")?;
            kb.st_global_b32(out, one[0])?;
            kb.tcgen05_fence_before()?;
            kb.cta_barrier()?;
            kb.tmem_dealloc(taddr, 512)
        });
        assert!(ptx.contains("tcgen05.ld.sync.aligned.32x32b.x32.b32"), "{ptx}");
        if let Some(ops) = assemble_sm100a(&ptx) {
            for op in ["LDTM", "STTM", "UTCATOMSWS"] {
                assert!(has(&ops, op), "no {op} in {ops:?}");
            }
        }
    }

    #[test]
    fn mma_commit_mbarrier_assemble() {
        let ptx = kernel(|kb, out, x| {
            let bar = kb.i32c(64);
            kb.mbar_init(bar, 1)?;
            kb.fence_mbarrier_init()?;
            kb.cta_barrier()?;
            let d = kb.i32c(0);
            let a = SmemOperand { lo: kb.i32c(0x0001_0040), hi: 0x4000_4040, add: 2 };
            let b = SmemOperand {
                lo: kb.or(kb.i32c(0x0001_0000), kb.and(x, kb.i32c(0x3f00), "")?, "")?,
                hi: 0x4000_4040,
                add: 0,
            };
            let acc = kb.icmp(inkwell::IntPredicate::NE, x, kb.i32c(0), "")?;
            let acc = kb.zext32(acc, "")?;
            kb.tcgen05_fence_after()?;
            kb.tcgen05_mma_ss(d, 0, a, b, 0x0820_0490, Acc::When(acc))?;
            kb.tcgen05_mma_ss(d, 0, a, b, 0x0820_0490, Acc::Accumulate)?;
            kb.tcgen05_mma_ts(d, 256, 64, b, 0x0821_0490, Acc::Overwrite)?;
            kb.tcgen05_commit(bar)?;
            kb.mbar_wait(bar, kb.i32c(0))?;
            kb.mbar_arrive(bar)?;
            kb.mbar_wait(bar, kb.i32c(1))?;
            kb.st_global_b32(out, x)
        });
        assert!(ptx.contains("tcgen05.mma.cta_group::1.kind::f16"), "{ptx}");
        if let Some(ops) = assemble_sm100a(&ptx) {
            for op in ["UTCHMMA", "UTCBAR", "SYNCS"] {
                assert!(has(&ops, op), "no {op} in {ops:?}");
            }
        }
    }

    /// The 2-CTA forms the blackwell backward's design needs (`cta_group::2` allocation,
    /// MMAs with A from shared memory and from TMEM, the multicast commit) assemble in a
    /// kernel launched as clusters of two, and ptxas emits their pair forms.
    #[test]
    fn two_cta_forms_assemble() {
        let ctx = Context::create();
        let mut kb = Kb::new(&ctx, "t");
        let i64t: BasicMetadataTypeEnum = ctx.i64_type().into();
        let i32t: BasicMetadataTypeEnum = ctx.i32_type().into();
        let p = kb.begin_kernel("t", &[(i64t, "out".into()), (i32t, "x".into())]).expect("kernel");
        kb.set_cluster_dims(2, 1, 1).expect("cluster");
        let (out, x) = (p[0].into_int_value(), p[1].into_int_value());
        fn body<'a>(kb: &mut Kb<'a>, out: IntValue<'a>, x: IntValue<'a>) -> R<()> {
            let slot = kb.i32c(0);
            let g = CtaGroup::Two;
            kb.tmem_alloc_in(g, slot, 256)?;
            kb.tmem_relinquish_in(g)?;
            kb.tcgen05_fence_before()?;
            kb.cta_barrier()?;
            kb.tcgen05_fence_after()?;
            let taddr = kb.ld_shared_b32(slot, "taddr")?;
            let a = SmemOperand { lo: kb.i32c(0x0001_0040), hi: 0x4000_4040, add: 2 };
            let b_lo = kb.or(kb.i32c(0x0001_0000), kb.and(x, kb.i32c(0x3f00), "")?, "")?;
            let b = SmemOperand { lo: b_lo, hi: 0x4000_4040, add: 0 };
            // M = 256 (16 << 24), N = 128, bf16, f32 accumulate.
            let idesc = 0x1020_0490;
            kb.tcgen05_mma_ss_in(g, taddr, 0, a, b, idesc, Acc::Overwrite)?;
            kb.tcgen05_mma_ts_in(g, taddr, 128, 64, b, idesc, Acc::Accumulate)?;
            kb.tcgen05_commit_multicast(kb.i32c(64), 0b11)?;
            let v = kb.tmem_load(taddr, 0, 1, 1, "v")?;
            kb.st_global_b32(out, v[0])?;
            kb.tcgen05_fence_before()?;
            kb.cta_barrier()?;
            kb.tmem_dealloc_in(g, taddr, 256)
        }
        body(&mut kb, out, x).expect("body");
        kb.ret().expect("ret");
        let (_, ptx, _, _) = emit_ptx(&kb.module, Arch::Sm100a).expect("emits");
        assert!(ptx.contains(".reqnctapercluster 2, 1, 1"), "{ptx}");
        assert!(ptx.contains("tcgen05.mma.cta_group::2.kind::f16"), "{ptx}");
        let report = match ptxas::assemble(&ptx, Arch::Sm100a) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas: {e}");
                return;
            }
            Err(e) => panic!("ptxas rejected the PTX: {e}\n{ptx}"),
        };
        let Ok(sass) = report.disassemble() else { return };
        for form in ["UTCHMMA.2CTA", "UTCBAR.2CTA.MULTICAST", "UTCATOMSWS.2CTA"] {
            assert!(sass.contains(form), "no {form} in the SASS");
        }
    }

    /// A kernel `tma(tmap: tensormap, out: ptr)` for `arch` with `threads` per CTA that
    /// uses every mbarrier / TMA-load / setmaxnreg / named-barrier wrapper of this file,
    /// then `tail(kb, tmap, out, v)` with `v` a value read from shared memory; its PTX.
    /// The sm_100a test and wgmma.rs's sm_90a test assemble it.
    pub(crate) fn wrapper_kernel_ptx(
        arch: Arch,
        threads: u32,
        tail: for<'a> fn(&mut Kb<'a>, IntValue<'a>, IntValue<'a>, FloatValue<'a>) -> R<()>,
    ) -> String {
        let ctx = Context::create();
        let mut kb = Kb::new(&ctx, "t");
        let ptr: BasicMetadataTypeEnum = ctx.ptr_type(inkwell::AddressSpace::default()).into();
        let i64t: BasicMetadataTypeEnum = ctx.i64_type().into();
        let p = kb.begin_kernel("tma", &[(ptr, "tmap".into()), (i64t, "out".into())]).expect("kernel");
        kb.mark_tensor_map_param(0).expect("byval");
        // setmaxnreg needs a known launch register count (ptxas drops it otherwise).
        kb.set_launch_bounds(threads).expect("bounds");
        let out = p[1].into_int_value();
        type Tail = for<'a> fn(&mut Kb<'a>, IntValue<'a>, IntValue<'a>, FloatValue<'a>) -> R<()>;
        fn body<'a>(kb: &mut Kb<'a>, out: IntValue<'a>, tail: Tail) -> R<()> {
            let tmap = kb.param_generic_addr("tma_param_0", "tmap")?;
            kb.tensormap_prefetch(tmap)?;
            let bar = kb.i32c(0);
            kb.mbar_init(bar, 1)?;
            kb.fence_mbarrier_init()?;
            kb.cta_barrier()?;
            kb.mbar_arrive_expect_tx(bar, 16384)?;
            let z = kb.i32c(0);
            kb.tma_load_4d(kb.i32c(1024), tmap, [z, z, z, z], bar)?;
            kb.tma_load_5d(kb.i32c(1024), tmap, [z, z, z, z, z], bar)?;
            kb.mbar_wait(bar, z)?;
            kb.mbar_arrive(bar)?;
            kb.mbar_wait(bar, kb.i32c(1))?;
            kb.setmaxnreg_dec(40)?;
            kb.setmaxnreg_inc(232)?;
            kb.named_bar_arrive(1, 256)?;
            kb.named_bar_sync(2, 256)?;
            kb.named_bar_sync_r(kb.i32c(1), 256)?;
            kb.named_bar_arrive_r(kb.i32c(2), 256)?;
            kb.warp_sync()?;
            let v = kb.ld_shared_f32(kb.i32c(1024), "v")?;
            tail(kb, tmap, out, v)
        }
        body(&mut kb, out, tail).expect("body");
        kb.ret().expect("ret");
        let (_, ptx, _, _) = emit_ptx(&kb.module, arch).expect("emits");
        ptx
    }

    #[test]
    fn tma_setmaxnreg_named_barriers_assemble() {
        let ptx = wrapper_kernel_ptx(Arch::Sm100a, 512, |kb, _tmap, out, v| kb.st_global_f32(out, v));
        assert!(ptx.contains(".param .align 64 .b8 tma_param_0[128]"), "{ptx}");
        if let Some(ops) = assemble_sm100a(&ptx) {
            for op in ["UTMALDG", "USETMAXREG", "UTMACCTL", "BAR"] {
                assert!(has(&ops, op), "no {op} in {ops:?}");
            }
        }
    }
}
