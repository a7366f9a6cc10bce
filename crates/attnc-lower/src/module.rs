//! What a compile produces: the module (PTX plus the facts the runtime needs to launch
//! each kernel) and the vocabulary both directions and every family share: which family,
//! which direction, which role a kernel plays. Nothing here knows how a kernel is built,
//! so families, the compile entry point and the runtime all depend on this module and it
//! depends on none of them.

use crate::arch::Arch;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A kernel family: one way of computing attention on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FamilyKind {
    /// FlashAttention-2-style: mma.sync m16n8k16, ldmatrix, cp.async. Runs on sm_80+.
    Portable,
    /// Warp-specialized wgmma/TMA (sm_90a).
    Hopper,
    /// FA4 pipeline with tcgen05/TMEM (sm_100a).
    Blackwell,
}

impl FamilyKind {
    pub const ALL: [FamilyKind; 3] = [FamilyKind::Portable, FamilyKind::Hopper, FamilyKind::Blackwell];

    pub fn name(self) -> &'static str {
        match self {
            FamilyKind::Portable => "portable",
            FamilyKind::Hopper => "hopper",
            FamilyKind::Blackwell => "blackwell",
        }
    }
}

impl fmt::Display for FamilyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which pass of attention a module computes. The forward and the backward of a variant
/// are separate modules (cached and loaded separately: inference never pays for the
/// backward's compile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Direction {
    /// O (and LSE) from Q, K, V.
    #[default]
    Forward,
    /// dQ, dK, dV (and the gradients of sinks and learnable aux tensors) from Q, K, V,
    /// O, LSE and dO.
    Backward,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Forward, Direction::Backward];

    /// The short name the CLI uses (`--pass fwd|bwd`).
    pub fn name(self) -> &'static str {
        match self {
            Direction::Forward => "fwd",
            Direction::Backward => "bwd",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        })
    }
}

/// What one kernel of a module does. The runtime launches kernels by role, so a role is
/// a type, not a description string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KernelRole {
    /// The attention forward: O and LSE, or one split's partials.
    Forward,
    /// Merges split-KV partials into O (and LSE).
    Combine,
    /// Backward, first kernel: `D = rowsum(dO ∘ O)` per query row, and the f32 dQ
    /// accumulator cleared.
    BackwardPreprocess,
    /// Backward main loop: dK and dV per KV tile, dQ accumulated in f32, gradients of
    /// sinks and learnable aux tensors.
    BackwardMain,
    /// Backward: the f32 dQ accumulator converted to the element type.
    DqConvert,
    /// Backward: the gradient of the sink logits, one reduction per head.
    SinkGrad,
    /// Backward, deterministic mode: the learnable aux tensors' gradients summed from
    /// their per-(CTA, warp) partials in a fixed order.
    AuxGradReduce,
    /// Block mask: the forward's row lists of non-empty key tiles, classified from the
    /// mask over the launch's data (`families::common::block_mask`).
    BlockClassify,
    /// Block mask with bits: every element of the partial tiles the classifier queued,
    /// into their bitmask slots (launched right after it).
    BlockBits,
    /// Backward, ordered deterministic mode: each (query tile, key tile) visit's
    /// predecessor in the dQ order (`families::common::dq_order`).
    TurnPlan,
}

impl KernelRole {
    pub fn name(self) -> &'static str {
        match self {
            KernelRole::Forward => "forward",
            KernelRole::Combine => "split-KV combine",
            KernelRole::BackwardPreprocess => "backward preprocess",
            KernelRole::BackwardMain => "backward",
            KernelRole::DqConvert => "dQ convert",
            KernelRole::SinkGrad => "sink gradient",
            KernelRole::AuxGradReduce => "aux-gradient reduce",
            KernelRole::BlockClassify => "block classifier",
            KernelRole::BlockBits => "block mask bits",
            KernelRole::TurnPlan => "dQ turn plan",
        }
    }

    /// Whether a module of direction `d` may hold kernels of this role: the block
    /// classifier is in both (each direction classifies at its own tiling).
    pub fn belongs_to(self, d: Direction) -> bool {
        match self {
            KernelRole::BlockClassify | KernelRole::BlockBits => true,
            KernelRole::Forward | KernelRole::Combine => d == Direction::Forward,
            KernelRole::BackwardPreprocess
            | KernelRole::BackwardMain
            | KernelRole::DqConvert
            | KernelRole::SinkGrad
            | KernelRole::AuxGradReduce
            | KernelRole::TurnPlan => d == Direction::Backward,
        }
    }
}

impl fmt::Display for KernelRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One TMA tensor map a kernel takes by value (a `tensormap` parameter), as the runtime
/// must encode it with `cuTensorMapEncodeTiled` from the launch's tensor: rank 4 (or 5,
/// see `pack_group`) over `[batch, seqlen, heads, d]`, innermost first
/// (`{d, seqlen, heads, batch}`; with varlen the packed `[total, heads, d]` tensor as
/// batch 1), strides in bytes, elementStrides 1, no interleave, out-of-bounds elements
/// read as zero.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmaBox {
    /// The kernel parameter that receives the map (e.g. `tmap_q`).
    pub param: String,
    /// The tensor it describes: `q`, `k`, `v` or `o`.
    pub tensor: String,
    /// Box extent along d, elements (× 2 bytes ≤ the swizzle span).
    pub box_cols: u32,
    /// Box extent along the sequence, rows (≤ 256).
    pub box_rows: u32,
    /// `CU_TENSOR_MAP_SWIZZLE_*` span in bytes: 0 (none), 32, 64 or 128.
    pub swizzle_bytes: u32,
    /// 1: the rank-4 map above. G > 1 (pack-GQA Q): rank 5 over
    /// `{d, G, seqlen, kv_heads, batch}` with the box `{box_cols, G, box_rows / G, 1, 1}`,
    /// so one box holds `box_rows / G` positions of all G heads of a KV group.
    #[serde(default = "one")]
    pub pack_group: u32,
}

fn one() -> u32 {
    1
}

/// How a kernel's grid follows from a launch (the runtime computes it from the
/// validated shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Grid {
    /// `(ceil(rows / block_m), heads, batch × splits)`: one CTA per query tile (with
    /// pack_gqa `seqlen_q · G` packed rows and the KV heads).
    QueryTiles,
    /// `[min(work tiles, SMs × CTAs per SM), 1, 1]`: the CTAs walk the work tiles
    /// (`ceil(rows / block_m) × heads × batch × splits`) themselves.
    Persistent,
    /// `(ceil(seqlen_q / block_m), q_heads, batch)`: `block_m` query rows per CTA.
    Rows,
    /// `(seqlen_pad / block_m, q_heads, batch)`: the rows of the backward's workspace
    /// (`families::common::backward`), `block_m` per CTA.
    WorkspaceRows,
    /// `(key tiles of block_n keys — or the slice mode's column count —, kv_heads
    /// × parts (× 2 with `pair`), batch)`: the backward main loop, `parts` CTAs per key tile.
    /// `ordered_dq`: the kernel implements `DqAccumulation::Ordered` (the deterministic
    /// mode over the default grid; `families::common::dq_order`).
    KeyTiles {
        parts: u32,
        #[serde(default)]
        ordered_dq: bool,
        /// Two CTAs per (KV head, part), adjacent along y, form a cluster that shares each
        /// key tile of `block_n` keys (`cta_group::2`): the y extent doubles.
        #[serde(default)]
        pair: bool,
    },
    /// `(q_heads)`: one CTA per query head.
    Heads,
    /// `(ceil(Σ learnable aux elements / threads))`: one thread per aux-gradient element.
    AuxElements,
    /// `(row tiles, head slots, batch)` of a block mask: one CTA per row of tiles,
    /// written in `layout`.
    BlockRows { layout: BlockLayout },
    /// `[min(bit-work items, SMs × CTAs per SM), 1, 1]`: the block mask bits kernel's
    /// warps stride over the (queued tile, step) items the classifier left
    /// (`families::common::block_mask`).
    QueuedBitWork,
}

/// What a block classifier writes per row tile (`[batch][slot][m_tiles][row words]` u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockLayout {
    /// A walk's list: the count of non-empty key tiles, then their indices ascending,
    /// `FULL_TILE` set on full ones (`1 + n_tiles` words).
    RowLists,
    /// One class per key tile, 0 empty, 1 partial, 2 full (`n_tiles` words), for walks
    /// that probe tiles in their own order.
    Dense,
    /// Row lists whose partial tiles carry a bitmask slot (`BITS_SLOT_SHIFT`), and after
    /// the lists the bits of those tiles (`bm_bits`): the classifier evaluates a partial
    /// tile's mask once, for every kernel that walks the lists, instead of each of them
    /// per element.
    RowListsWithBits,
    /// Dense classes whose partial tiles carry 1 + a bitmask slot from bit 8 (the class in
    /// bits 0–7), and after the table the bits of those tiles key-major (a row per key,
    /// bits over the tile's queries): for walks that hold keys on M (the backward's Sᵀ).
    DenseWithBits,
}

impl BlockLayout {
    /// Whether kernels walk per-row lists in this layout (the count, then the entries).
    pub fn has_lists(self) -> bool {
        matches!(self, BlockLayout::RowLists | BlockLayout::RowListsWithBits)
    }
    /// Whether the classifier writes partial tiles' bits after the lists or classes.
    pub fn has_bits(self) -> bool {
        matches!(self, BlockLayout::RowListsWithBits | BlockLayout::DenseWithBits)
    }
}

/// One `.entry` of a module and how to launch it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelInfo {
    /// The PTX entry name.
    pub name: String,
    pub role: KernelRole,
    /// What the family changed or wants the reader of a receipt to know about this
    /// kernel (e.g. "persistent grid", "pack_gqa off: ..."); `None` for nothing.
    pub note: Option<String>,
    pub threads_per_block: u32,
    /// Dynamic shared memory to request at launch, bytes.
    pub dynamic_smem_bytes: u32,
    /// Rows of Q (packed rows with pack_gqa) one CTA handles; for a backward main kernel,
    /// the rows of one Q tile of its inner loop.
    pub block_m: u32,
    /// Keys per inner-loop tile; for a backward main kernel, the keys one CTA owns.
    pub block_n: u32,
    /// The kernel's parameter list in order (documentation and runtime ABI check).
    pub params: Vec<String>,
    /// How to encode each `tensormap` parameter (empty for kernels without TMA).
    pub tensor_maps: Vec<TmaBox>,
    pub grid: Grid,
}

impl KernelInfo {
    /// The role with the family's note, as receipts and summaries print it.
    pub fn describe_role(&self) -> String {
        match &self.note {
            Some(n) => format!("{} ({n})", self.role),
            None => self.role.to_string(),
        }
    }
}

/// The result of lowering one spec, in one direction, for one arch.
#[derive(Clone, Debug)]
pub struct CompiledModule {
    pub family: FamilyKind,
    pub direction: Direction,
    pub arch: Arch,
    /// Why the requested family was not used (auto or explicit fallback).
    pub fallback_reason: Option<String>,
    /// Why the family's default configuration was not used: it spilled, and this is the
    /// smaller one that did not (`crate::compile::compile_without_spills`).
    pub config_note: Option<String>,
    pub kernels: Vec<KernelInfo>,
    /// The optimized LLVM IR, as text, when `llvm::keep_llvm_ir` asked for it (empty
    /// otherwise: printing it costs a cold compile time).
    pub llvm_ir: String,
    pub ptx: String,
    /// Where the compile time went.
    pub timings: CompileTimings,
}

impl CompiledModule {
    /// The first kernel with `role`.
    pub fn kernel(&self, role: KernelRole) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.role == role)
    }
}

/// Wall-clock time of each lowering phase, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CompileTimings {
    /// Building the LLVM IR (the family's schedule and the variant code).
    pub build_ms: f64,
    /// LLVM's optimization pipeline.
    pub optimize_ms: f64,
    /// NVPTX instruction selection, register allocation and PTX printing.
    pub codegen_ms: f64,
}

impl CompileTimings {
    pub fn total_ms(&self) -> f64 {
        self.build_ms + self.optimize_ms + self.codegen_ms
    }
}
