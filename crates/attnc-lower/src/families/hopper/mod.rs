//! The hopper family (sm_90a): a warp-specialized forward kernel in FlashAttention-3's
//! shape — TMA loads of K/V through tensor maps into an mbarrier ring, one producer
//! warpgroup, consumer warpgroups with raised register budgets running `wgmma`
//! (`S = Q·Kᵀ` from shared memory, `O += P·V` with P from registers) with the softmax
//! overlapped with both GEMMs. See `docs/hopper.md`.
//!
//! - [`forward`]: the kernel; [`config`]: tiles, roles, shared-memory layout;
//! - [`desc`]: the wgmma shared-memory matrix descriptor.
//!
//! Split-KV partials are merged inside the forward: the last split CTA of a row block
//! runs the shared combine (`common::combine::fused_tail`), no second launch.

pub mod backward;
pub mod config;
pub mod desc;
pub mod forward;

use crate::arch::Arch;
use crate::error::LowerError;
use crate::families::common::{abi::kernel_name, backward as common_bwd, block_mask};
use crate::families::{finish_module, finish_module_at, Family};
use crate::llvm::kb::Kb;
use crate::module::{BlockLayout, CompiledModule, Direction, FamilyKind};
use attnc_ir::block_mask::Tiling;
use attnc_ir::Spec;
use config::{BwdConfig, Config, DqSplit};
use inkwell::context::Context;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

/// The hopper family (see the module docs).
pub struct Hopper;

impl Family for Hopper {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Hopper
    }
    fn unsupported_reason(&self, spec: &Spec, arch: Arch, direction: Direction) -> Option<String> {
        match direction {
            Direction::Forward => forward_unsupported_reason(spec, arch),
            Direction::Backward => backward_unsupported_reason(spec, arch),
        }
    }
    fn compile(&self, spec: &Spec, arch: Arch, direction: Direction) -> Result<CompiledModule, LowerError> {
        if let Some(reason) = self.unsupported_reason(spec, arch, direction) {
            return Err(LowerError::Unsupported { family: FamilyKind::Hopper, direction, arch, reason });
        }
        match direction {
            Direction::Forward => compile_with_config(spec, arch, &Config::for_spec(spec)),
            Direction::Backward => compile_backward_with_config(spec, arch, &BwdConfig::for_spec(spec)),
        }
    }

    fn step_down(
        &self,
        spec: &Spec,
        arch: Arch,
        direction: Direction,
        step: u32,
    ) -> Option<Result<(CompiledModule, String), LowerError>> {
        match direction {
            Direction::Forward => forward_step_down(spec, arch, step),
            Direction::Backward => backward_step_down(spec, arch, step),
        }
    }
}

/// The forward's step `step` down when the default spills, cheapest first: the tiled grid
/// instead of the persistent one (its tile walk's state: the sharded twin of
/// `chunked_local`, whose shard positions are launch values, spilled 16 bytes persistent
/// and none tiled), then 64-key tiles where the default has 128 (S, P and the mask's work
/// per step halve), then both.
fn forward_step_down(spec: &Spec, arch: Arch, step: u32) -> Option<Result<(CompiledModule, String), LowerError>> {
    let cfg = Config::for_spec(spec);
    let persistent = cfg.runs_persistent(spec);
    let ladder = [
        (persistent, Config { persistent: false, ..cfg.clone() }, "the tiled grid instead of the persistent one"),
        (cfg.block_n != 64, Config { block_n: 64, ..cfg.clone() }, "64-key tiles instead of 128"),
        (
            persistent && cfg.block_n != 64,
            Config { block_n: 64, persistent: false, ..cfg.clone() },
            "64-key tiles on the tiled grid",
        ),
    ];
    let (_, next, gave_up) = ladder
        .into_iter()
        .filter(|(applies, c, _)| *applies && c.check(spec, arch.max_smem_per_block()).is_ok())
        .nth(step.checked_sub(1)? as usize)?;
    Some(compile_with_config(spec, arch, &next).map(|m| (m, gave_up.to_string())))
}

/// What a step down of the backward gives up to free registers, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BwdRelaxation {
    /// The ordered deterministic mode (its turn handling in the dQ issuer costs the
    /// consumers a few registers): free for default launches; deterministic ones then
    /// take dQ slices, and the receipt says so.
    NoOrderedDq,
    /// dS from the bf16 P instead of the f32 P (32–64 registers live from the softmax to
    /// dS): −0..−6% at d64, up to −7% at d128 causal.
    Bf16P,
    /// dPᵀ issued after P instead of with Sᵀ (fewer live accumulators during the
    /// softmax): −1..−4% at d64.
    LateDp,
}

impl BwdRelaxation {
    fn applies(self, cfg: &BwdConfig) -> bool {
        match self {
            BwdRelaxation::NoOrderedDq => cfg.ordered_dq(),
            BwdRelaxation::Bf16P => cfg.p_f32_for_ds,
            BwdRelaxation::LateDp => cfg.dp_with_s,
        }
    }
    fn apply(self, cfg: BwdConfig) -> BwdConfig {
        match self {
            BwdRelaxation::NoOrderedDq => BwdConfig { ordered: false, ..cfg },
            BwdRelaxation::Bf16P => BwdConfig { p_f32_for_ds: false, ..cfg },
            BwdRelaxation::LateDp => BwdConfig { dp_with_s: false, ..cfg },
        }
    }
    fn says(self) -> &'static str {
        match self {
            BwdRelaxation::NoOrderedDq => "no ordered deterministic mode (deterministic launches take dQ slices)",
            BwdRelaxation::Bf16P => "dS from the bf16 P",
            BwdRelaxation::LateDp => "dP^T issued after P",
        }
    }
}

/// The backward's steps down while the default spills: each relaxation that applies
/// alone (cheapest first), then every pair, then all of them (one spare register is
/// often all it takes: a shard twin of a masked d128 spec spills 8 bytes with the ordered
/// mode), then, where the
/// default has 128-query tiles (d64), 64-query tiles with everything given up but the
/// ordered mode, and without it.
fn backward_step_down(spec: &Spec, arch: Arch, step: u32) -> Option<Result<(CompiledModule, String), LowerError>> {
    let default = BwdConfig::for_spec(spec);
    let relaxations: Vec<BwdRelaxation> = [BwdRelaxation::NoOrderedDq, BwdRelaxation::Bf16P, BwdRelaxation::LateDp]
        .into_iter()
        .filter(|r| r.applies(&default))
        .collect();
    let n = relaxations.len();
    let mut subsets: Vec<Vec<BwdRelaxation>> = (1u32..1 << n)
        .map(|bits| relaxations.iter().enumerate().filter(|(i, _)| bits & (1 << i) != 0).map(|(_, r)| *r).collect())
        .collect();
    // By size, then in the order of the list (a stable sort keeps the bit order's).
    subsets.sort_by_key(Vec::len);
    let relaxed = |set: &[BwdRelaxation]| {
        let cfg = set.iter().fold(default.clone(), |c, r| r.apply(c));
        let why: Vec<&str> = set.iter().map(|r| r.says()).collect();
        (cfg, why.join(", "))
    };
    let mut steps: Vec<(BwdConfig, String)> = subsets.iter().map(|set| relaxed(set)).collect();
    if default.block_m == 128 {
        // The row split needs 128-query tiles: 64-query ones split dQ by columns.
        let small = |set: &[BwdRelaxation]| {
            let (cfg, why) = relaxed(set);
            let tiles = "64-query tiles instead of 128";
            let why = if why.is_empty() { tiles.to_string() } else { format!("{tiles}, {why}") };
            (BwdConfig { block_m: 64, dq_split: DqSplit::Columns, ..cfg }, why)
        };
        let keep_order: Vec<BwdRelaxation> =
            relaxations.iter().copied().filter(|r| *r != BwdRelaxation::NoOrderedDq).collect();
        let ordered = small(&keep_order);
        if ordered.0.ordered_dq() {
            steps.push(ordered);
        }
        steps.push(small(&[&[BwdRelaxation::NoOrderedDq][..], &keep_order].concat()));
    }
    let (next, why) =
        steps.into_iter().filter(|(c, _)| c.check(spec, arch.max_smem_per_block()).is_ok()).nth(step as usize - 1)?;
    Some(compile_backward_with_config(spec, arch, &next).map(|m| (m, why)))
}

/// Why the backward cannot compile `spec` for `arch`, or `None`.
pub fn backward_unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    backward_arch_reason(arch).or_else(|| BwdConfig::for_spec(spec).check(spec, arch.max_smem_per_block()).err())
}

fn backward_arch_reason(arch: Arch) -> Option<String> {
    (arch != Arch::Sm90a).then(|| "needs sm_90a (wgmma, TMA)".to_string())
}

/// Compiles the backward with an explicit configuration: the shared preprocess, dQ
/// convert, sink-gradient and aux-reduce kernels around this family's main kernel.
pub fn compile_backward_with_config(spec: &Spec, arch: Arch, cfg: &BwdConfig) -> Result<CompiledModule, LowerError> {
    let unsupported =
        |reason| LowerError::Unsupported { family: FamilyKind::Hopper, direction: Direction::Backward, arch, reason };
    // The arch, then this configuration (not the default's: a tune may allow more).
    if let Some(reason) = backward_arch_reason(arch) {
        return Err(unsupported(reason));
    }
    cfg.check(spec, arch.max_smem_per_block()).map_err(unsupported)?;
    let t0 = std::time::Instant::now();
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}_bwd", spec.name));
    let classes = if cfg.mask_bits { BlockLayout::DenseWithBits } else { BlockLayout::Dense };
    let kernels = common_bwd::build_kernels(&mut kb, spec, classes, cfg.dq_accum_layout(), |kb| {
        backward::build(kb, spec, cfg, &kernel_name(spec, "hopper_bwd"))
    })?;
    // dQ goes out through vector atomics.
    finish_module_at(&kb, FamilyKind::Hopper, Direction::Backward, arch, kernels, t0, arch.vector_red_ptx_feature())
}

/// The warp-specialized split every hopper kernel makes after its setup: warpgroup 0
/// lowers its registers to `regs.0` and runs `producer`; the consumer warpgroups mark
/// their section, raise theirs to `regs.1` and run `consumer`.
pub(crate) fn split_roles<'ctx>(
    kb: &mut Kb<'ctx>,
    tid: IntValue<'ctx>,
    regs: (u32, u32),
    consumer_section: &str,
    producer: impl FnOnce(&mut Kb<'ctx>) -> Result<(), LowerError>,
    consumer: impl FnOnce(&mut Kb<'ctx>) -> Result<(), LowerError>,
) -> Result<(), LowerError> {
    let wg = kb.udiv(tid, kb.i32c(128), "warpgroup")?;
    let is_producer = kb.icmp(IntPredicate::EQ, wg, kb.i32c(0), "")?;
    kb.if_else(
        is_producer,
        "role",
        |kb| {
            kb.setmaxnreg_dec(regs.0)?;
            producer(kb)
        },
        |kb| {
            kb.section(consumer_section)?;
            kb.setmaxnreg_inc(regs.1)?;
            consumer(kb)
        },
    )
}

/// Why the forward cannot compile `spec` for `arch`, or `None`.
pub fn forward_unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    if arch != Arch::Sm90a {
        return Some("needs sm_90a (wgmma, TMA)".into());
    }
    Config::for_spec(spec).check(spec, arch.max_smem_per_block()).err()
}

/// Compiles the forward with an explicit configuration (tuning; the family's `compile`
/// picks the default).
pub fn compile_with_config(spec: &Spec, arch: Arch, cfg: &Config) -> Result<CompiledModule, LowerError> {
    let unsupported =
        |reason| LowerError::Unsupported { family: FamilyKind::Hopper, direction: Direction::Forward, arch, reason };
    if let Some(reason) = forward_unsupported_reason(spec, arch) {
        return Err(unsupported(reason));
    }
    cfg.check(spec, arch.max_smem_per_block()).map_err(unsupported)?;
    let t0 = std::time::Instant::now();
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}", spec.name));
    // Split partials are merged by the forward's last split CTA (fused combine).
    let mut kernels = vec![forward::build(&mut kb, spec, cfg, &kernel_name(spec, "hopper_fwd"))?];
    let tiling = Tiling { block_m: cfg.block_m(), block_n: cfg.block_n, pack_gqa: spec.pack_gqa };
    // With mask bits the forward loads a partial tile's bits from the classifier (where it
    // has a slot) instead of evaluating the mask per element.
    let layout = if cfg.mask_bits { BlockLayout::RowListsWithBits } else { BlockLayout::RowLists };
    block_mask::push_if_needed(&mut kb, spec, tiling, layout, "block_classify", &mut kernels)?;
    finish_module(&kb, FamilyKind::Hopper, Direction::Forward, arch, kernels, t0)
}

#[cfg(test)]
mod wgmma_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::{Align, AuxDecl, AuxDim};

    /// A float of a key distance (ALiBi's `float(abs(q - k))`, and `k - q`, `-(k + c)`)
    /// converts once per row of a thread's tile, not per score: the forward's PTX has a
    /// handful of int-to-float conversions where it had one per score, and `abs` moves to
    /// the float. Anything else still converts per score.
    #[test]
    fn a_key_distance_converts_once_per_row() {
        use attnc_ir::{BinOp, Expr, Func, Var};
        let (q, k) = (|| Expr::var(Var::Q), || Expr::var(Var::K));
        let tofloat = |e: Expr| Expr::call(Func::ToFloat, vec![e]);
        let cvts = |dist: Expr| {
            let mut s = Spec::new("dist", 128, 16);
            s.mask.causal = Some(Align::TopLeft);
            s.score_mod = Some(Expr::binary(
                BinOp::Sub,
                Expr::var(Var::Score),
                Expr::binary(BinOp::Mul, Expr::float(0.25), tofloat(dist)),
            ));
            let m = Hopper.compile(&s, Arch::Sm90a, Direction::Forward).expect("compiles");
            m.ptx.matches("cvt.rn.f32.s32").count()
        };
        let per_score = cvts(Expr::binary(BinOp::Mul, q(), k()));
        assert!(per_score >= 64, "a product of q and k converts per score: {per_score}");
        for dist in [
            Expr::call(Func::Abs, vec![Expr::binary(BinOp::Sub, q(), k())]),
            Expr::binary(BinOp::Sub, k(), q()),
            Expr::unary(attnc_ir::UnOp::Neg, Expr::binary(BinOp::Add, k(), Expr::int(3))),
        ] {
            let n = cvts(dist.clone());
            assert!(n <= 8, "{dist:?}: {n} conversions");
        }
    }

    /// A mask over aux tensors: both directions' classifiers write partial tiles' bits
    /// (a ballot per word), in the layout their main kernel reads — query rows for the
    /// forward, keys for the backward — and both main kernels load them (vector loads
    /// under the S GEMM) beside the per-element fallback; at 128-key forward tiles.
    #[test]
    fn aux_masks_read_the_classifiers_bits() {
        use crate::module::{BlockLayout, Grid, KernelRole};
        let spec = attnc_dsl::parse_named(
            "doc.attn",
            "attention doc {\n dtype bf16\n head_dim 128\n heads 16\n aux doc: int[batch, seqlen_k]\n mask causal && doc[b, q] == doc[b, k]\n}\n",
        )
        .expect("parses");
        for (direction, layout, load) in [
            (Direction::Forward, BlockLayout::RowListsWithBits, "ld.global.nc.v4.b32"),
            (Direction::Backward, BlockLayout::DenseWithBits, "ld.global.nc.v2.b32"),
        ] {
            let m = Hopper.compile(&spec, Arch::Sm90a, direction).expect("compiles");
            let classify = m.kernels.iter().find(|k| k.role == KernelRole::BlockClassify).expect("a classifier");
            assert_eq!(classify.grid, Grid::BlockRows { layout }, "{direction:?}");
            let bits = m.kernels.iter().find(|k| k.role == KernelRole::BlockBits).expect("a bits kernel");
            assert_eq!(bits.grid, Grid::QueuedBitWork, "{direction:?}");
            assert!(m.ptx.contains("attnc block mask bits"), "{direction:?}");
            assert!(m.ptx.contains("atom.acq_rel.gpu.global.add.u32"), "{direction:?}: the classifier queues tiles");
            assert!(m.ptx.contains("vote.sync.ballot"), "{direction:?}");
            assert!(m.ptx.contains("the classifier's bits") && m.ptx.contains(load), "{direction:?}");
            assert!(m.ptx.contains("one bit per element"), "{direction:?}: the fallback evaluation");
        }
        let fwd = Hopper.compile(&spec, Arch::Sm90a, Direction::Forward).expect("compiles");
        assert_eq!(fwd.kernels.iter().find(|k| k.role == KernelRole::Forward).map(|k| k.block_n), Some(128));
    }

    /// Causal and window masks build a partial tile's forward mask from two bounds per row
    /// (one `bmsk` per word, `variant::row_keys`); a predicate keeps the per-element test;
    /// the backward does so only with `row_keys`. Maskless forwards take the warp-uniform
    /// consumer index, masked ones not (`Config::uniform_consumer`).
    #[test]
    fn interval_masks_build_their_bits_by_ranges() {
        let fwd = |text: &str| {
            let spec = attnc_dsl::parse_named("m.attn", text).expect("parses");
            (Config::for_spec(&spec), Hopper.compile(&spec, Arch::Sm90a, Direction::Forward).expect("compiles").ptx)
        };
        let head = "attention m {\n dtype bf16\n head_dim 64\n heads 8\n";
        for mask in ["mask causal", "mask causal && window(left=100)", "mask window(left=50, right=7)"] {
            let (cfg, ptx) = fwd(&format!("{head} {mask}\n}}\n"));
            assert!(cfg.mask_bits && !cfg.uniform_consumer, "{mask}");
            assert!(ptx.contains("bmsk.clamp.b32"), "{mask}: the words by bit ranges");
            // One shuffle, the consumer's own walk end (and the tiles a persistent
            // consumer takes from the ring); the consumer index stays plain.
            let shuffles = 1 + 2 * usize::from(cfg.persistent); // the first tile, then each next
            assert_eq!(ptx.matches("shfl.sync.idx").count(), shuffles, "{mask}: the plain consumer index");
        }
        let (cfg, ptx) = fwd(&format!("{head} mask k <= q || k < 16\n}}\n"));
        assert!(!cfg.mask_bits && !ptx.contains("bmsk"), "a predicate is tested per element");
        let (cfg, ptx) = fwd(&format!("{head}}}\n"));
        assert!(cfg.uniform_consumer && ptx.contains("shfl.sync.idx.b32"), "maskless: the uniform index");
        let bwd = |head_dim: u32, tune: &str| {
            let src = format!("attention m {{\n dtype bf16\n head_dim {head_dim}\n heads 8\n mask causal\n}}\n");
            let spec = attnc_dsl::parse_named("m.attn", &src).expect("parses");
            let cfg = BwdConfig::for_spec(&spec).tuned(tune);
            let m = compile_backward_with_config(&spec, Arch::Sm90a, &cfg).expect("compiles");
            m.ptx.contains("bmsk.clamp.b32")
        };
        assert!(bwd(64, "") && !bwd(64, "row_keys=0"), "d64's backward by ranges unless turned off");
        assert!(!bwd(128, "") && bwd(128, "row_keys=1"), "d128's by ranges only when asked");
    }

    /// d64's 192-row tiles: a consumer whose rows all lie past the end sits the key walk
    /// out (a warp vote ptxas sees as uniform, empty barriers counting the working
    /// consumers), and under a mask each consumer ends its walk at its own rows' last
    /// tile; d128's 128-row tiles keep the fixed count and the CTA's walk.
    #[test]
    fn idle_consumers_only_where_tiles_are_192_rows() {
        for (head_dim, idle) in [(64, true), (128, false)] {
            for mask in ["", " mask causal\n"] {
                let src = format!("attention m {{\n dtype bf16\n head_dim {head_dim}\n heads 8\n{mask}}}\n");
                let spec = attnc_dsl::parse_named("m.attn", &src).expect("parses");
                let cfg = Config::for_spec(&spec);
                assert_eq!(cfg.idle_consumers, idle, "d{head_dim} {mask}");
                // A persistent CTA (the default under a causal mask) keeps the fixed
                // count: its idle consumers drain the tile's slots instead.
                let persistent = cfg.runs_persistent(&spec);
                let ptx = Hopper.compile(&spec, Arch::Sm90a, Direction::Forward).expect("compiles").ptx;
                let counted = ptx.lines().any(|l| l.contains("mbarrier.init.shared::cta.b64") && l.contains("], %r"));
                assert_eq!(
                    counted,
                    idle && !persistent,
                    "d{head_dim} {mask}: empty barriers count the working consumers"
                );
                assert_eq!(ptx.contains("vote.sync.any.pred"), idle, "d{head_dim} {mask}");
                // Each consumer's own walk end (and the drain after it) only where a mask
                // empties tiles; a persistent CTA drains every tile's rest.
                let drains = ptx.contains("drain: release the slots");
                assert_eq!(drains, (idle && !mask.is_empty()) || persistent, "d{head_dim} {mask}: own walk end");
            }
        }
    }

    /// A `Grid::Persistent` forward (the default under a causal mask, `persistent=1`
    /// otherwise) takes the batch and the tile counters, hands work tiles from the
    /// producer to the consumers through a shared-memory ring, and assembles cleanly;
    /// paged and split-KV specs keep the tiled grid.
    #[test]
    fn a_persistent_forward_walks_work_tiles_where_asked() {
        let ptxas = crate::ptxas::find_ptxas();
        // By default: under a causal mask, and for plain attention (no mask, no score mod).
        for (d, mask, by_default) in [
            (64, "", true),
            (64, " mask causal\n", true),
            (128, " mask causal\n", true),
            (128, " kv varlen\n", true),
            (128, " mask window(left=256, right=256)\n", false),
        ] {
            let src = format!("attention m {{\n dtype bf16\n head_dim {d}\n heads 8\n{mask}}}\n");
            let spec = attnc_dsl::parse_named("m.attn", &src).expect("parses");
            assert_eq!(Config::for_spec(&spec).runs_persistent(&spec), by_default, "d{d}{mask}");
            let cfg = Config::for_spec(&spec).tuned("persistent=1");
            assert!(cfg.runs_persistent(&spec), "d{d}{mask}");
            let m = compile_with_config(&spec, Arch::Sm90a, &cfg).expect("compiles");
            let fwd = m.kernels.iter().find(|k| k.role == crate::module::KernelRole::Forward).expect("forward");
            assert_eq!(fwd.grid, crate::module::Grid::Persistent, "d{d}{mask}");
            for param in ["batch", crate::families::common::abi::TILE_COUNTERS_PARAM] {
                assert!(fwd.params.iter().any(|p| p.starts_with(param)), "d{d}{mask}: {param} in {:?}", fwd.params);
            }
            assert!(m.ptx.contains("atom.acq_rel.gpu.global.add.u32"), "d{d}{mask}: tiles from the counter");
            let Ok(path) = &ptxas else {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
                continue;
            };
            let r = crate::ptxas::assemble_with(path, &m.ptx, Arch::Sm90a).expect("assembles");
            assert!(!r.has_spills(), "d{d}{mask} spills:\n{}", r.log);
            for code in crate::ptxas::WGMMA_SERIALIZED {
                assert!(!r.log.contains(code), "d{d}{mask}: ptxas {code}:\n{}", r.log);
            }
        }
        for extra in [" kv paged(page_size=16)\n", " split auto\n"] {
            let src = format!("attention m {{\n dtype bf16\n head_dim 128\n heads 8\n{extra}}}\n");
            let spec = attnc_dsl::parse_named("m.attn", &src).expect("parses");
            assert!(!Config::for_spec(&spec).tuned("persistent=1").runs_persistent(&spec), "{extra}");
        }
    }

    /// A masked and an unmasked copy of each step (`Config::split_mask`) by default only
    /// where it measured faster: causal d64. Their GEMMs then appear twice in the PTX.
    #[test]
    fn causal_d64_steps_come_in_a_masked_and_an_unmasked_copy() {
        for (d, mask, split) in [
            (64, " mask causal\n", true),
            (128, " mask causal\n", false),
            (64, "", false),
            (64, " mask window(left=256, right=256)\n", false),
        ] {
            let src = format!("attention m {{\n dtype bf16\n head_dim {d}\n heads 8\n{mask}}}\n");
            let spec = attnc_dsl::parse_named("m.attn", &src).expect("parses");
            assert_eq!(Config::for_spec(&spec).split_mask, split, "d{d}{mask}");
        }
        let src = "attention m {\n dtype bf16\n head_dim 64\n heads 8\n mask causal\n}\n";
        let spec = attnc_dsl::parse_named("m.attn", src).expect("parses");
        let gemms = |cfg: &Config| {
            let m = compile_with_config(&spec, Arch::Sm90a, cfg).expect("compiles");
            m.ptx.matches("wgmma.mma_async").count()
        };
        let (split, branched) =
            (gemms(&Config::for_spec(&spec)), gemms(&Config::for_spec(&spec).tuned("split_mask=0")));
        assert!(split > branched, "{split} GEMMs split vs {branched} with the mask under a branch");
    }

    /// The fused split-KV combine publishes a split's partials with the counting thread's
    /// `atom.acq_rel.gpu` after the CTA's barrier and no per-thread fence (the default),
    /// or with every thread's fence on both sides (`merge_fences=0`).
    #[test]
    fn fused_combine_fences_by_the_counting_thread() {
        let mut s = Spec::new("split_fences", 128, 32);
        s.kv_heads = 8;
        s.pack_gqa = true;
        s.split_kv = attnc_ir::SplitKv::Auto;
        s.query_rows = attnc_ir::QueryRows::OneTile;
        let count = |cfg: &Config| {
            let m = compile_with_config(&s, Arch::Sm90a, cfg).expect("compiles");
            (m.ptx.matches("fence.acq_rel.gpu").count(), m.ptx.matches("atom.acq_rel.gpu").count())
        };
        assert_eq!(count(&Config::for_spec(&s)), (0, 1));
        assert_eq!(count(&Config::for_spec(&s).tuned("merge_fences=0")), (2, 1));
    }

    /// Paged K/V whose pages TMA boxes follow loads by TMA (one box per page, or one
    /// inside the page), the block table read by a lane window and shuffled, the tail
    /// tile's V zeroed past seqlen_k behind its own barrier; page 1 (and 3) still
    /// gathers, the decode twin's gather with each lane's pages of a window of tiles read
    /// together. The decode twin (64-key tiles) too. Every module assembles without
    /// spills or wgmma serialization.
    #[test]
    fn paged_kv_by_tma_where_boxes_follow_the_pages() {
        use crate::module::KernelRole;
        let ptxas = crate::ptxas::find_ptxas();
        for (page, rows, d, tma_per_tile) in [
            (16, attnc_ir::QueryRows::Any, 128, 8 * 2),
            (16, attnc_ir::QueryRows::OneTile, 128, 4 * 2),
            (128, attnc_ir::QueryRows::Any, 128, 2),
            (128, attnc_ir::QueryRows::OneTile, 64, 1),
            (256, attnc_ir::QueryRows::Any, 96, 2),
            (1, attnc_ir::QueryRows::Any, 128, 0),
            (1, attnc_ir::QueryRows::Any, 64, 0),
            (1, attnc_ir::QueryRows::OneTile, 128, 0),
            (1, attnc_ir::QueryRows::OneTile, 64, 0),
            (3, attnc_ir::QueryRows::OneTile, 128, 0),
        ] {
            let mut s = Spec::new(&format!("paged{page}_d{d}"), d, 8);
            s.kv_heads = 2;
            s.pack_gqa = true;
            s.kv_layout = attnc_ir::KvLayout::Paged { page_size: page };
            s.mask.causal = Some(Align::BottomRight);
            s.query_rows = rows;
            let label = format!("page {page}, {rows:?}, d {d}");
            let m = Hopper.compile(&s, Arch::Sm90a, Direction::Forward).unwrap_or_else(|e| panic!("{label}: {e}"));
            let fwd = m.kernels.iter().find(|k| k.role == KernelRole::Forward).expect("forward");
            let tma = m.ptx.matches("cp.async.bulk.tensor.4d").count();
            if tma_per_tile == 0 {
                assert!(fwd.tensor_maps.is_empty() && tma == 0, "{label}: gathers");
                // One copy of the gather code for the four producer warps.
                assert_eq!(m.ptx.matches("gather K or V tile").count(), 1, "{label}");
                // 64-key tiles (one row group per warp): a window of the ring's tiles.
                let windowed = m.ptx.contains("pages of a window of tiles");
                assert_eq!(windowed, fwd.block_n == 64, "{label}: block_n {}", fwd.block_n);
            } else {
                let expect_rows = if page >= fwd.block_n { fwd.block_n } else { page };
                assert!(fwd.tensor_maps.iter().all(|b| b.box_rows == expect_rows), "{label}: {:?}", fwd.tensor_maps);
                // K, V, and V of the tail tile (to its own barrier).
                assert_eq!(tma, 3 * tma_per_tile, "{label}");
                assert!(!m.ptx.contains("gather K or V tile"), "{label}");
                for section in ["block-table window", "rows past seqlen_k zeroed", "shfl.sync.idx", "fence.proxy.async"]
                {
                    assert!(m.ptx.contains(section), "{label}: no {section}");
                }
            }
            let Ok(path) = &ptxas else {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
                continue;
            };
            let r = crate::ptxas::assemble_with(path, &m.ptx, Arch::Sm90a).expect("assembles");
            assert!(!r.has_spills(), "{label} spills:\n{}", r.log);
            for code in ["C7504"].into_iter().chain(crate::ptxas::WGMMA_SERIALIZED) {
                assert!(!r.log.contains(code), "{label}: ptxas {code}:\n{}", r.log);
            }
        }
    }

    /// The backward's ladder when a configuration spills: dPᵀ after P first where it was
    /// issued with Sᵀ, then d128 drops the ordered mode and stops; d64 (128-query tiles)
    /// then tries 64-query tiles with and without it.
    #[test]
    fn the_backward_steps_down_through_its_ladder() {
        let steps = |d: u32| -> Vec<(u32, String)> {
            // Causal: d128 keeps dPᵀ after P there (no dPᵀ step), d64 issues it with Sᵀ.
            let mut s = Spec::new(&format!("ladder_d{d}"), d, 8);
            s.mask.causal = Some(Align::BottomRight);
            (1..)
                .map_while(|step| Hopper.step_down(&s, Arch::Sm90a, Direction::Backward, step))
                .map(|r| {
                    let (m, why) = r.expect("compiles");
                    let main = m.kernel(crate::module::KernelRole::BackwardMain).expect("main");
                    (main.block_m, why)
                })
                .collect()
        };
        // Single relaxations first (cheapest first), then pairs, then all.
        let d128 = steps(128);
        let whys: Vec<&str> = d128.iter().map(|(_, why)| why.as_str()).collect();
        assert_eq!(
            whys,
            [
                "no ordered deterministic mode (deterministic launches take dQ slices)",
                "dS from the bf16 P",
                "no ordered deterministic mode (deterministic launches take dQ slices), dS from the bf16 P"
            ],
            "{d128:?}"
        );
        let d64 = steps(64);
        let got: Vec<(u32, usize)> = d64.iter().map(|(m, why)| (*m, why.split(", ").count())).collect();
        assert_eq!(
            got,
            [(128, 1), (128, 1), (128, 1), (128, 2), (128, 2), (128, 2), (128, 3), (64, 3), (64, 4)],
            "{d64:?}"
        );
        assert!(d64[2].1 == "dP^T issued after P" && d64[8].1.contains("dS from the bf16 P"), "{d64:?}");
    }

    /// The ordered deterministic mode is where the dQ tile is one bulk reduce (the column
    /// split: d64, d128): the main kernel says so in its grid and the module has the
    /// turn-plan kernel at the main kernel's tiling; at d96 (the key split's per-thread
    /// adds) neither.
    #[test]
    fn the_ordered_deterministic_mode_is_declared_where_it_is_built() {
        for (d, ordered) in [(64, true), (96, false), (128, true)] {
            let mut s = Spec::new(&format!("det_d{d}"), d, 8);
            s.kv_heads = 2;
            s.mask.causal = Some(Align::BottomRight);
            let m = Hopper.compile(&s, Arch::Sm90a, Direction::Backward).unwrap_or_else(|e| panic!("d={d}: {e}"));
            let main = m.kernel(crate::module::KernelRole::BackwardMain).expect("main");
            assert_eq!(
                main.grid,
                crate::module::Grid::KeyTiles { parts: 1, ordered_dq: ordered, pair: false },
                "d={d}"
            );
            let plan = m.kernel(crate::module::KernelRole::TurnPlan);
            assert_eq!(plan.is_some(), ordered, "d={d}: turn plan kernel");
            if let Some(p) = plan {
                assert_eq!((p.block_m, p.block_n), (main.block_m, main.block_n));
                assert!(p.params.iter().any(|n| n.contains("turn_plan")), "{:?}", p.params);
            }
            // The dQ writer and its turn (acquire spin, release pass) are in the PTX.
            let has = |t: &str| m.ptx.contains(t);
            assert_eq!(has("ld.acquire.gpu.global.u32") && has("st.release.gpu.global.u32"), ordered, "d={d}");
        }
    }

    /// The backward compiles for every head dim it has tiles for, masked and not, with
    /// GQA; with ptxas present it must assemble for sm_90a without spills and without
    /// serialized wgmma, with HGMMA, UTMALDG, the bulk copy and the dQ adds in the SASS. Other head
    /// dims and learnable aux tensors are refused with a reason (the dispatcher falls
    /// back to portable).
    #[test]
    fn the_backward_assembles_cleanly_or_says_why_not() {
        let ptxas = crate::ptxas::find_ptxas();
        for &(dqk, dv) in attnc_ir::spec::SUPPORTED_HEAD_DIMS {
            for causal in [false, true] {
                let mut s = Spec::new(&format!("bwd_d{dqk}_{dv}_{causal}"), dqk, 8);
                s.head_dim_v = dv;
                s.kv_heads = 2;
                if causal {
                    s.mask.causal = Some(Align::BottomRight);
                }
                let r = Hopper.compile(&s, Arch::Sm90a, Direction::Backward);
                if !matches!((dqk, dv), (64, 64) | (96, 96) | (128, 128)) {
                    let e = r.expect_err("no tiles for this head dim").to_string();
                    assert!(e.contains("head dims"), "{e}");
                    continue;
                }
                let m = r.unwrap_or_else(|e| panic!("d={dqk}: {e}"));
                assert!(m.ptx.contains("wgmma.mma_async") && m.ptx.contains("cp.async.bulk.tensor"));
                let Ok(path) = &ptxas else {
                    assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
                    continue;
                };
                let mut a = crate::ptxas::assemble_with(path, &m.ptx, Arch::Sm90a).expect("assembles");
                // Should a default spill (none does with ptxas 13.5), one relaxation
                // alone must do.
                let mut step = 1;
                while a.has_spills() {
                    let (m1, why) = Hopper
                        .step_down(&s, Arch::Sm90a, Direction::Backward, step)
                        .expect("a step")
                        .expect("compiles");
                    assert!(!why.contains(", "), "d={dqk} causal={causal}: more than one step down: {why}");
                    a = crate::ptxas::assemble_with(path, &m1.ptx, Arch::Sm90a).expect("assembles");
                    step += 1;
                }
                assert!(!a.has_spills(), "d={dqk} causal={causal} spills:\n{}", a.log);
                for code in crate::ptxas::WGMMA_SERIALIZED {
                    assert!(!a.log.contains(code), "d={dqk} causal={causal}: wgmma serialized:\n{}", a.log);
                }
                if let Ok(sass) = a.disassemble() {
                    let ops = crate::ptxas::sass_opcode_counts(&sass);
                    // dQ: one bulk reduce-add per tile (column split: d64, d128), per-thread
                    // reds otherwise.
                    let dq_add = if dqk != 96 { "UBLKRED" } else { "RED" };
                    for want in ["HGMMA", "UTMALDG", "UBLKCP", dq_add] {
                        assert!(ops.keys().any(|k| k.starts_with(want)), "d={dqk}: no {want}");
                    }
                }
            }
        }
        let mut s = Spec::new("learned_bias", 128, 4);
        s.aux.push(AuxDecl::float("bias", vec![AuxDim::QHeads], true));
        let e = Hopper.compile(&s, Arch::Sm90a, Direction::Backward).expect_err("refused").to_string();
        assert!(e.contains("learnable aux tensor `bias`"), "{e}");
        assert!(Hopper.unsupported_reason(&Spec::new("x", 128, 4), Arch::Sm80, Direction::Backward).is_some());
    }

    /// The transposed dQ split (FA4's SM90 d128 shape; a tune key, measured no faster on
    /// the H100): 80-query tiles with dQᵀ = Kᵀ·dSᵀ at N = 80, dS stored transposed, the
    /// workspace rows padded to 160, assembled without spills for a plain and a causal
    /// d128 spec; refused at d64 and, where the classifier's bit rows are read, with
    /// masks over aux tensors.
    #[test]
    fn transposed_dq_split_builds_80_query_tiles() {
        use crate::families::common::backward::DqAccumLayout;
        let ptxas = crate::ptxas::find_ptxas();
        for causal in [false, true] {
            let mut s = Spec::new(&format!("t80_{causal}"), 128, 8);
            if causal {
                s.mask.causal = Some(Align::BottomRight);
            }
            let cfg = BwdConfig::for_spec(&s).tuned("block_m=80,dq_split=3");
            assert_eq!((cfg.block_m, cfg.dq_split), (80, DqSplit::Transposed));
            assert_eq!(cfg.dq_accum_layout(), DqAccumLayout::TransposedFragments { rows: 80 });
            assert_eq!(cfg.dq_accum_layout().ws_row_align(), 160);
            cfg.check(&s, Arch::Sm90a.max_smem_per_block()).expect("fits");
            let m = compile_backward_with_config(&s, Arch::Sm90a, &cfg).expect("compiles");
            assert!(m.ptx.contains("m64n80k16"), "no N = 80 wgmma");
            assert!(m.ptx.contains("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16"), "no transposed dS store");
            assert!(m.ptx.contains("wgmma dQ^T = K^T*dS^T"), "no dQ^T section");
            let Ok(path) = &ptxas else {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
                continue;
            };
            let a = crate::ptxas::assemble_with(path, &m.ptx, Arch::Sm90a).expect("assembles");
            assert!(!a.has_spills(), "causal={causal} spills:\n{}", a.log);
            for code in crate::ptxas::WGMMA_SERIALIZED {
                assert!(!a.log.contains(code), "causal={causal}: wgmma serialized:\n{}", a.log);
            }
        }
        let d64 = Spec::new("t80_d64", 64, 8);
        let e = BwdConfig::for_spec(&d64).tuned("block_m=80,dq_split=3").check(&d64, 232448).expect_err("refused");
        assert!(e.contains("transposed split"), "{e}");
    }

    /// The dQ writer warp (FA4's SM90 dQ path; a tune key, measured +0-3% at d128 without a
    /// mask): each consumer stages its half of the dQ tile (`ConsumerHalves`) and hands it
    /// over through a pair of 160-thread named barriers; the writer warp issues the bulk
    /// reduces. No ordered mode with it; refused outside the column split at d128.
    #[test]
    fn dq_writer_warp_builds_at_d128() {
        use crate::families::common::backward::DqAccumLayout;
        let s = Spec::new("dq_writer", 128, 8);
        let cfg = BwdConfig::for_spec(&s).tuned("dq_writer=1");
        assert!(cfg.dq_writer && !cfg.ordered_dq(), "{cfg:?}");
        assert_eq!(cfg.dq_accum_layout(), DqAccumLayout::ConsumerHalves);
        cfg.check(&s, Arch::Sm90a.max_smem_per_block()).expect("fits");
        let m = compile_backward_with_config(&s, Arch::Sm90a, &cfg).expect("compiles");
        for want in ["barrier.arrive 5, 160", "barrier.sync 7, 160", "dQ writer warp", "16384;"] {
            assert!(m.ptx.contains(want), "no `{want}` in the PTX");
        }
        if let Ok(path) = crate::ptxas::find_ptxas() {
            let a = crate::ptxas::assemble_with(&path, &m.ptx, Arch::Sm90a).expect("assembles");
            assert!(!a.has_spills(), "spills:\n{}", a.log);
        } else {
            assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
        }
        let d64 = Spec::new("dq_writer_d64", 64, 8);
        let e = BwdConfig::for_spec(&d64).tuned("dq_writer=1").check(&d64, 232448).expect_err("refused");
        assert!(e.contains("dQ writer warp"), "{e}");
    }

    /// Learnable aux gradients train on hopper at d64 (64-query tiles, the column split),
    /// assembled without spills; d128 builds them only when asked (P parked in shared
    /// memory, without spills too); elsewhere they are refused with the reason.
    #[test]
    fn learnable_aux_gradients_train_at_d64() {
        let mut s = Spec::new("learned_bias_d64", 64, 8);
        s.mask.causal = Some(Align::BottomRight);
        s.aux.push(AuxDecl::float("bias", vec![AuxDim::QHeads], true));
        let cfg = BwdConfig::for_spec(&s);
        assert!(cfg.aux_grads && cfg.block_m == 64 && cfg.dq_split == DqSplit::Columns, "{cfg:?}");
        cfg.check(&s, Arch::Sm90a.max_smem_per_block()).expect("accepted");
        // Without learnable aux tensors d64 keeps its 128-query tiles.
        let plain = BwdConfig::for_spec(&Spec::new("plain_d64", 64, 8));
        assert!(plain.block_m == 128 && plain.dq_split == DqSplit::Rows, "{plain:?}");
        let m = Hopper.compile(&s, Arch::Sm90a, Direction::Backward).expect("compiles");
        // d128 refuses by default; turned on (the tune key) it parks P in shared memory.
        // d96 refuses.
        let mut d128 = Spec::new("learned_bias_d128", 128, 8);
        d128.mask.causal = Some(Align::BottomRight);
        d128.aux.push(AuxDecl::float("bias", vec![AuxDim::QHeads], true));
        d128.score_mod = Some(attnc_ir::Expr::binary(
            attnc_ir::BinOp::Add,
            attnc_ir::Expr::var(attnc_ir::Var::Score),
            attnc_ir::Expr::aux("bias", vec![attnc_ir::Expr::var(attnc_ir::Var::H)]),
        ));
        let e = Hopper.compile(&d128, Arch::Sm90a, Direction::Backward).expect_err("refused").to_string();
        assert!(e.contains("learnable aux tensor `bias` at head dim 128"), "{e}");
        let cfg128 = BwdConfig { aux_grads: true, ..BwdConfig::for_spec(&d128) };
        assert!(cfg128.p_in_smem_used(&d128), "{cfg128:?}");
        cfg128.check(&d128, Arch::Sm90a.max_smem_per_block()).expect("fits");
        let m128 = compile_backward_with_config(&d128, Arch::Sm90a, &cfg128).expect("compiles");
        assert!(m128.ptx.contains("f32 P -> shared memory"));
        let mut d96 = Spec::new("learned_bias_d96", 96, 8);
        d96.aux.push(AuxDecl::float("bias", vec![AuxDim::QHeads], true));
        let e = Hopper.compile(&d96, Arch::Sm90a, Direction::Backward).expect_err("refused").to_string();
        assert!(e.contains("learnable aux tensor `bias` at head dim 96"), "{e}");
        let Ok(path) = crate::ptxas::find_ptxas() else {
            assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
            return;
        };
        for (label, m) in [("d64", &m), ("d128", &m128)] {
            let a = crate::ptxas::assemble_with(&path, &m.ptx, Arch::Sm90a).expect("assembles");
            assert!(!a.has_spills(), "{label} spills:\n{}", a.log);
            for code in crate::ptxas::WGMMA_SERIALIZED {
                assert!(!a.log.contains(code), "{label}: ptxas {code}:\n{}", a.log);
            }
        }
    }

    /// Every supported head dim, masked and not, compiles; with ptxas present it must
    /// assemble for sm_90a without spills and without serialized wgmma, with HGMMA and
    /// UTMALDG in the SASS.
    #[test]
    fn every_head_dim_assembles_cleanly() {
        let ptxas = crate::ptxas::find_ptxas();
        for &(dqk, dv) in attnc_ir::spec::SUPPORTED_HEAD_DIMS {
            for causal in [false, true] {
                let mut s = Spec::new(&format!("d{dqk}_{dv}_{causal}"), dqk, 4);
                s.head_dim_v = dv;
                if causal {
                    s.mask.causal = Some(Align::BottomRight);
                }
                let m =
                    Hopper.compile(&s, Arch::Sm90a, Direction::Forward).unwrap_or_else(|e| panic!("d={dqk}/{dv}: {e}"));
                assert!(m.ptx.contains("wgmma.mma_async") && m.ptx.contains("cp.async.bulk.tensor"));
                let Ok(path) = &ptxas else {
                    assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
                    continue;
                };
                let r = crate::ptxas::assemble_with(path, &m.ptx, Arch::Sm90a).expect("assembles");
                assert!(!r.has_spills(), "d={dqk}/{dv} causal={causal} spills:\n{}", r.log);
                for code in crate::ptxas::WGMMA_SERIALIZED {
                    assert!(!r.log.contains(code), "d={dqk}/{dv} causal={causal}: wgmma serialized:\n{}", r.log);
                }
                if let Ok(sass) = r.disassemble() {
                    let ops = crate::ptxas::sass_opcode_counts(&sass);
                    assert!(ops.keys().any(|k| k.starts_with("HGMMA")), "d={dqk}/{dv}: no HGMMA");
                    assert!(ops.keys().any(|k| k.starts_with("UTMALDG")), "d={dqk}/{dv}: no UTMALDG");
                }
            }
        }
    }

    /// Without a mask or score mod the P·V wait is pinned below the softmax
    /// (`Config::pin_pv_wait`): in the steady-state step, the exponentials sit between
    /// the wait for S (`DEPBAR.LE gsb0, 0x1`) and the wait for P·V (`0x0`). Unpinned,
    /// ptxas 13.5 put that wait before all of them.
    #[test]
    fn the_exponentials_run_under_p_v_where_the_wait_is_pinned() {
        let Ok(path) = crate::ptxas::find_ptxas() else {
            assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
            return;
        };
        for d in [64, 128] {
            let s = Spec::new(&format!("plain_d{d}"), d, 4);
            let cfg = Config::for_spec(&s);
            assert!(cfg.pin_pv_wait, "d{d}: pinned by default without a mask");
            let m = Hopper.compile(&s, Arch::Sm90a, Direction::Forward).expect("compiles");
            let r = crate::ptxas::assemble_with(&path, &m.ptx, Arch::Sm90a).expect("assembles");
            let Ok(sass) = r.disassemble() else { continue };
            let (mut after_s, mut most) = (None, 0);
            for line in sass.lines() {
                if line.contains("WARPGROUP.DEPBAR.LE gsb0, 0x1") {
                    after_s = Some(0);
                } else if line.contains("WARPGROUP.DEPBAR.LE gsb0, 0x0") {
                    most = most.max(after_s.take().unwrap_or(0));
                } else if line.contains("MUFU.EX2") {
                    if let Some(n) = after_s.as_mut() {
                        *n += 1;
                    }
                }
            }
            let per_thread = (cfg.block_n / 2) as usize;
            assert!(most >= per_thread, "d{d}: at most {most} of {per_thread} exponentials before the P.V wait");
        }
    }
}
