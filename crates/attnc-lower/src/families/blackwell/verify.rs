//! Checks of an assembled blackwell kernel that need no GPU: ptxas resources against the
//! resource model, per-role register use read off the SASS, the tcgen05/TMA instructions
//! the family promises, and the MUFU.EX2 : emulated-exp2 ratio of the softmax.
//!
//! SASS mnemonics (ptxas 13.5, sm_100a), found by assembling small kernels
//! (`llvm::tcgen05` tests): `tcgen05.mma` → `UTCHMMA`, `tcgen05.commit` → `UTCBAR`,
//! `tcgen05.ld` → `LDTM`, `tcgen05.st` → `STTM`, `tcgen05.alloc` → `UTCATOMSWS`,
//! `cp.async.bulk.tensor` → `UTMALDG`, `setmaxnreg` → `USETMAXREG`, mbarrier waits →
//! `SYNCS.PHASECHK`, `ex2.approx` → `MUFU.EX2`, and the emulation's `add.rm.f32` (its
//! floor) → `FADD.RM` (one per emulated exponential, nothing else in the kernel emits it).

use super::config::{Config, BLOCK_N};
use super::forward::emulated_per_row;
use attnc_ir::Spec;
use std::collections::BTreeMap;

/// SASS opcodes the family promises in every kernel.
pub const PROMISED_SASS: &[&str] = &["UTCHMMA", "UTCBAR", "LDTM", "STTM", "UTMALDG", "USETMAXREG", "SYNCS"];

/// SASS the backward main kernel must show: the MMAs and their commits, TMEM loads and
/// stores, TMA and bulk loads, the register split, mbarriers, and dQ's vector reds.
pub const PROMISED_BWD_SASS: &[&str] =
    &["UTCHMMA", "UTCBAR", "LDTM", "STTM", "UTMALDG", "UBLKCP", "USETMAXREG", "SYNCS", "REDG"];

/// What a kernel of this family was modelled to use, for [`budget_problems`].
pub struct Budget<'a> {
    /// Registers per thread at launch (65536 / threads).
    pub launch_regs: u32,
    pub smem_request: u32,
    pub tmem_alloc: u32,
    pub tmem_used: u32,
    /// The `setmaxnreg` budgets of its warpgroups.
    pub regions: &'a [u32],
    /// SASS opcodes it must contain.
    pub promised: &'a [&'a str],
}

/// Every budget of `b` the assembled kernel `v` breaks: spills, registers at launch and per
/// setmaxnreg region, shared memory, the TMEM allocation, missing promised instructions.
pub fn budget_problems(b: &Budget<'_>, v: &Verified) -> Vec<String> {
    let mut p = Vec::new();
    if v.spill_bytes > 0 {
        p.push(format!("{} spill bytes", v.spill_bytes));
    }
    if v.registers > b.launch_regs {
        p.push(format!("{} registers at launch, the budget is {}", v.registers, b.launch_regs));
    }
    let smem = v.smem_bytes + b.smem_request as u64;
    if smem > crate::arch::Arch::Sm100a.max_smem_per_block() as u64 {
        p.push(format!("{smem} bytes of shared memory"));
    }
    if v.tmem_alloc != vec![b.tmem_alloc] || b.tmem_used > b.tmem_alloc || b.tmem_alloc > super::config::TMEM_COLS {
        p.push(format!("TMEM: PTX allocates {:?}, the model uses {} of {}", v.tmem_alloc, b.tmem_used, b.tmem_alloc));
    }
    let mut seen: Vec<u32> = v.regions.iter().map(|r| r.budget).collect();
    seen.sort();
    seen.dedup();
    let mut want = b.regions.to_vec();
    want.sort();
    want.dedup();
    if seen != want {
        p.push(format!("setmaxnreg budgets in SASS {seen:?}, model {want:?}"));
    }
    for r in &v.regions {
        if r.max_reg >= r.budget {
            p.push(format!("a region with budget {} uses R{}", r.budget, r.max_reg));
        }
    }
    for op in b.promised {
        if !v.opcodes.contains_key(*op) {
            p.push(format!("no {op} in the SASS"));
        }
    }
    p
}

/// Everything that is wrong with an assembled backward main kernel, per its plan.
pub fn backward_problems(plan: &super::backward_plan::BwdPlan, v: &Verified) -> Vec<String> {
    let regions: Vec<u32> = plan.roles.iter().map(|r| r.2).collect();
    let b = Budget {
        launch_regs: 65536 / super::backward::BWD_THREADS,
        smem_request: plan.smem.request,
        tmem_alloc: plan.tmem.alloc,
        tmem_used: plan.tmem.used,
        regions: &regions,
        promised: PROMISED_BWD_SASS,
    };
    let mut p = budget_problems(&b, v);
    if plan.mode == super::backward_plan::CtaMode::Two {
        let n = |f: &str| v.pair_forms.get(f).copied().unwrap_or(0);
        for f in PAIR_SASS_FORMS {
            if n(f) == 0 {
                p.push(format!("no {f} in the SASS of a CTA-pair kernel"));
            }
        }
        if n("UTCHMMA") != n("UTCHMMA.2CTA") {
            p.push(format!("{} of {} UTCHMMA are not pair MMAs", n("UTCHMMA") - n("UTCHMMA.2CTA"), n("UTCHMMA")));
        }
    }
    p
}

/// One straight-line SASS instruction.
struct Ins {
    text: String,
}

/// Per setmaxnreg region: (register budget, highest register index used, instructions).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RegionRegs {
    pub budget: u32,
    pub max_reg: u32,
    pub instructions: usize,
}

/// Splits the SASS into the regions each `USETMAXREG` governs (every instruction
/// reachable from it without passing another `USETMAXREG`) and reports the highest
/// general register each region touches. Code reachable from several regions is
/// counted in each (harmless: it is the short join before the teardown).
pub fn register_regions(sass: &str) -> Vec<RegionRegs> {
    let mut ins: Vec<Ins> = Vec::new();
    let mut labels: BTreeMap<String, usize> = BTreeMap::new();
    for line in sass.lines() {
        let t = line.trim();
        if let Some(l) = t.strip_suffix(':').filter(|l| l.starts_with(".L")) {
            labels.insert(l.to_string(), ins.len());
            continue;
        }
        let Some(rest) = t.strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r.trim()) else { continue };
        let body = rest.split(';').next().unwrap_or("").trim();
        if body.is_empty() {
            continue;
        }
        ins.push(Ins { text: body.to_string() });
    }
    let target = |t: &str| -> Option<usize> {
        let start = t.find("`(")? + 2;
        let end = t[start..].find(')')? + start;
        labels.get(&t[start..end]).copied()
    };
    let succ = |i: usize| -> Vec<usize> {
        let t = &ins[i].text;
        let predicated = t.starts_with('@');
        let body = if predicated { t.split_once(' ').map(|x| x.1).unwrap_or("") } else { t.as_str() };
        let op = body.split_whitespace().next().unwrap_or("");
        let mut out = Vec::new();
        if op.starts_with("BRA") || op.starts_with("CALL") {
            if let Some(j) = target(t) {
                out.push(j);
            }
            // Conditional forms: predicated, `BRA !UP0, ...`, divergent-aware branches.
            let cond_operand = body.split_whitespace().nth(1).is_some_and(|a| a.ends_with(',') && a.contains('P'));
            if predicated || cond_operand || op.starts_with("CALL") || op.contains("DIV") {
                out.push(i + 1);
            }
            return out;
        }
        if op.starts_with("EXIT") || op.starts_with("RET") {
            return if predicated { vec![i + 1] } else { vec![] };
        }
        if op.starts_with("BSSY") {
            if let Some(j) = target(t) {
                out.push(j);
            }
        }
        out.push(i + 1);
        out
    };
    let mut regions = Vec::new();
    for (s, i) in ins.iter().enumerate() {
        if !i.text.contains("USETMAXREG") {
            continue;
        }
        let budget = i
            .text
            .rsplit([' ', ','])
            .find_map(|w| w.trim().strip_prefix("0x").and_then(|h| u32::from_str_radix(h, 16).ok()))
            .unwrap_or(0);
        let mut seen = vec![false; ins.len()];
        let mut stack = vec![s + 1];
        let mut max_reg = 0u32;
        let mut count = 0usize;
        while let Some(k) = stack.pop() {
            if k >= ins.len() || seen[k] || ins[k].text.contains("USETMAXREG") {
                continue;
            }
            seen[k] = true;
            count += 1;
            max_reg = max_reg.max(max_register(&ins[k].text));
            stack.extend(succ(k));
        }
        regions.push(RegionRegs { budget, max_reg, instructions: count });
    }
    regions
}

/// Highest `R<n>` in an instruction (vector operands `R4.64` count their second
/// register).
fn max_register(t: &str) -> u32 {
    let b = t.as_bytes();
    let mut best = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'R' && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) {
            let mut j = i + 1;
            let mut n: u32 = 0;
            while j < b.len() && b[j].is_ascii_digit() {
                n = n * 10 + (b[j] - b'0') as u32;
                j += 1;
            }
            if j > i + 1 && !(j < b.len() && b[j].is_ascii_alphabetic()) {
                let wide = t[j..].starts_with(".64");
                best = best.max(n + wide as u32);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    best
}

/// How many copies of the softmax's exponential code the kernel has: the full-tile fast
/// path and the streamed path, or only the streamed one with a score modification or a
/// mask reading aux tensors that takes no block mask (the interval analysis cannot bound
/// aux values, so no tile is ever proven full and the fast path folds away; with a block
/// mask the class table proves them).
pub fn softmax_copies(spec: &Spec) -> usize {
    // A mask over aux tensors has full tiles only through the block mask's class table.
    let mask_reads_aux = spec.mask.predicate.as_ref().is_some_and(|p| p.uses_aux());
    let full_tiles_known = !mask_reads_aux || attnc_ir::block_mask::needs_block_mask(spec);
    if spec.score_mod.is_some() || !full_tiles_known {
        1
    } else {
        2
    }
}

/// Expected SASS counts of the exponential units: `FADD.RM` = one per emulated
/// exponential, `MUFU.EX2` at least one per hardware exponential plus one rescale factor
/// per copy (score mods, sinks and the epilogue may add a few).
pub fn expected_exp_counts(spec: &Spec) -> (usize, usize) {
    let e = emulated_per_row(spec) as usize;
    let copies = softmax_copies(spec);
    (copies * e, copies * (BLOCK_N as usize - e + 1))
}

/// `tcgen05.alloc` column counts in the PTX (to cross-check the TMEM model).
pub fn ptx_tmem_allocs(ptx: &str) -> Vec<u32> {
    ptx.lines()
        .filter(|l| l.contains("tcgen05.alloc."))
        .filter_map(|l| l.rsplit(',').next()?.trim().trim_end_matches(';').trim().parse().ok())
        .collect()
}

/// Resource and instruction report of one assembled kernel.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Verified {
    pub registers: u32,
    pub spill_bytes: u64,
    pub smem_bytes: u64,
    pub tmem_alloc: Vec<u32>,
    pub regions: Vec<RegionRegs>,
    pub mufu_ex2: usize,
    /// `FADD.RM`: the emulated exponentials' floors.
    pub emulated_floor: usize,
    /// `FRND` and `F2I`: conversion-pipe ops (none may come from the emulation).
    pub conversions: usize,
    pub opcodes: BTreeMap<String, usize>,
    /// Lines of each of [`PAIR_SASS_FORMS`] (the CTA-pair forms), and of `UTCHMMA` at all.
    pub pair_forms: BTreeMap<String, usize>,
}

/// The SASS a CTA-pair kernel (`cta_group::2`) must show: pair MMAs, the multicast
/// commit, pair TMA loads, the pair TMEM allocation and the cluster barrier.
pub const PAIR_SASS_FORMS: &[&str] =
    &["UTCHMMA.2CTA", "UTCBAR.2CTA.MULTICAST", "UTMALDG.4D.2CTA", "UTCATOMSWS.2CTA", "UCGABAR_ARV", "UCGABAR_WAIT"];

/// Everything that is wrong with an assembled kernel, per the model in `cfg`.
pub fn problems(spec: &Spec, cfg: &Config, v: &Verified) -> Vec<String> {
    let t = cfg.tmem();
    let b = Budget {
        launch_regs: super::config::RegBudget::LAUNCH,
        smem_request: cfg.smem().request,
        tmem_alloc: t.alloc,
        tmem_used: t.used,
        regions: &[cfg.regs.softmax, cfg.regs.correction, cfg.regs.other],
        promised: PROMISED_SASS,
    };
    let mut p = budget_problems(&b, v);
    // O by TMA stores, or row stores (varlen, split-KV), as the configuration says.
    if cfg.tma_store_o != v.opcodes.contains_key("UTMASTG") {
        p.push(format!(
            "UTMASTG in the SASS: {}, the configuration stores O by TMA: {}",
            !cfg.tma_store_o, cfg.tma_store_o
        ));
    }
    let (emulated, mufu_min) = expected_exp_counts(spec);
    if v.emulated_floor != emulated {
        p.push(format!("{} FADD.RM (emulated exp2), expected {emulated}", v.emulated_floor));
    }
    // Extra MUFU.EX2: expression exps, sinks (2 per Q tile), at most a handful.
    if v.mufu_ex2 < mufu_min || v.mufu_ex2 > mufu_min + 8 {
        p.push(format!("{} MUFU.EX2, expected {mufu_min} (+ up to 8 outside the row loop)", v.mufu_ex2));
    }
    p
}

/// Assembles `ptx` and reads back what [`problems`] checks of its forward kernel; `None`
/// when ptxas or the disassembler is missing.
pub fn verify(ptx: &str) -> Result<Option<Verified>, crate::ptxas::PtxasError> {
    verify_kernel(ptx, "_fwd")
}

/// [`verify`] for the kernel whose name ends with `suffix` (the first kernel if none does).
pub fn verify_kernel(ptx: &str, suffix: &str) -> Result<Option<Verified>, crate::ptxas::PtxasError> {
    let report = match crate::ptxas::assemble(ptx, crate::arch::Arch::Sm100a) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let sass = match report.disassemble() {
        Ok(s) => s,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    // The main kernel (a split-KV module also holds the combine kernel, a backward module
    // the shared row kernels).
    let k = report
        .kernels
        .iter()
        .find(|k| k.name.ends_with(suffix))
        .or(report.kernels.first())
        .cloned()
        .unwrap_or_default();
    let sass = crate::ptxas::sass_function(&sass, &k.name).unwrap_or(&sass);
    let count = |needle: &str| sass.lines().filter(|l| l.contains(needle)).count();
    Ok(Some(Verified {
        registers: k.registers,
        spill_bytes: report.total_spill_bytes(),
        smem_bytes: k.smem_bytes,
        tmem_alloc: ptx_tmem_allocs(ptx),
        regions: register_regions(sass),
        mufu_ex2: count("MUFU.EX2"),
        emulated_floor: count("FADD.RM"),
        conversions: count("FRND") + count("F2I"),
        opcodes: crate::ptxas::sass_opcode_counts(sass),
        pair_forms: PAIR_SASS_FORMS.iter().chain(&["UTCHMMA"]).map(|f| (f.to_string(), count(f))).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_follow_control_flow() {
        let sass = "\
        /*0000*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0010*/              @P0 BRA `(.L_x_1) ;
        /*0020*/                   USETMAXREG.DEALLOC.CTAPOOL 0x38 ;
        /*0030*/                   IADD3 R40, PT, PT, R1, R2, RZ ;
        /*0040*/                   BRA `(.L_x_2) ;
.L_x_1:
        /*0050*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xc0 ;
        /*0060*/                   BRA.U !UP0, `(.L_x_1) ;
        /*0070*/                   LDG.E.64 R180, desc[UR4][R2.64] ;
.L_x_2:
        /*0080*/                   EXIT ;
";
        let r = register_regions(sass);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].budget, r[0].max_reg), (0x38, 40));
        // A 64-bit destination shows only its first register (R180 of the pair R180:R181).
        assert_eq!((r[1].budget, r[1].max_reg), (0xc0, 180));
        assert_eq!(max_register("STL [R1+0x8], R143"), 143);
    }

    #[test]
    fn tmem_allocs_are_read_from_ptx() {
        assert_eq!(
            ptx_tmem_allocs("\ttcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], 512;\n"),
            vec![512]
        );
    }
}
