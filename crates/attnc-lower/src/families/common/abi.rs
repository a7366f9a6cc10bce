//! The kernel-entry ABI every family shares: typed parameters in order, the parameter
//! lists of the kernels more than one family launches (the tile-grid forward's scalar
//! part, the combine, the backward kernels), kernel names, and [`Args`], the declared
//! parameters by name. The runtime marshals arguments from these lists
//! (`KernelInfo::params` as `name:type` strings), so they are the single source of truth;
//! names appear in the PTX as `<kernel>_param_<i>` in the same order.

use crate::llvm::kb::{Kb, R};
use crate::variant::expr::{AuxArg, PositionFrame, Val, VariantArgs};
use crate::variant::layout::{LayoutArgs, Strides};
use crate::variant::tiles::{block_list_param_is_ptr, BlockListArgs, BLOCK_LIST_PARAMS};
use attnc_ir::{KvLayout, Spec, Ty};
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue};

/// The machine type of a kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamTy {
    /// A 128-byte CUtensorMap passed by value (`.param .align 64 .b8 [128]`).
    TensorMap,
    /// A device address (u64); 0 where the tensor is absent.
    Ptr,
    I64,
    I32,
    F32,
}

impl ParamTy {
    pub fn name(self) -> &'static str {
        match self {
            ParamTy::TensorMap => "tensormap",
            ParamTy::Ptr => "ptr",
            ParamTy::I64 => "i64",
            ParamTy::I32 => "i32",
            ParamTy::F32 => "f32",
        }
    }
}

/// "name:type" strings for `KernelInfo::params`.
pub fn describe(params: &[(String, ParamTy)]) -> Vec<String> {
    params.iter().map(|(n, t)| format!("{n}:{}", t.name())).collect()
}

/// Entry-point names: `attnc_<variant>_<kernel>`.
pub fn kernel_name(spec: &Spec, what: &str) -> String {
    format!("attnc_{}_{what}", spec.name)
}

/// The ordered parameter list of the forward kernel.
/// The forward parameter of a family that fuses the split-KV combine: one u32 counter per
/// row block (grid x · grid y · batch), zero before the launch and left zero after it.
pub const SPLIT_COUNTERS_PARAM: &str = "split_counters";
/// A persistent forward's dynamic scheduler: the next work tile and the count of CTAs done
/// fetching (two zeroed u32, set back to 0 by the last CTA; the same per-stream buffer).
pub const TILE_COUNTERS_PARAM: &str = "tile_counters";

pub fn forward_params(spec: &Spec) -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    let mut p: Vec<(String, ParamTy)> = Vec::new();
    let mut add = |n: &str, t: ParamTy| p.push((n.to_string(), t));
    for t in ["q", "k", "v", "o"] {
        add(t, Ptr);
    }
    for t in ["q", "k", "v", "o"] {
        for s in ["batch", "row", "head"] {
            add(&format!("{t}_stride_{s}"), I64);
        }
    }
    add("seqlen_q", I32);
    add("seqlen_k", I32);
    add("num_splits", I32);
    add("lse", Ptr);
    add("lse_stride_batch", I64);
    add("lse_stride_head", I64);
    add("o_partial", Ptr);
    add("lse_partial", Ptr);
    variant_params(spec, &mut p);
    block_list_params(spec, &mut p);
    p
}

/// The block mask's row lists, for kernels that walk them (specs whose mask needs one).
pub fn block_list_params(spec: &Spec, p: &mut Vec<(String, ParamTy)>) {
    if attnc_ir::block_mask::needs_block_mask(spec) {
        for (i, n) in BLOCK_LIST_PARAMS.iter().enumerate() {
            p.push((n.to_string(), if block_list_param_is_ptr(i) { ParamTy::Ptr } else { ParamTy::I32 }));
        }
    }
}

/// Parameters every kernel reading the variant needs: layout metadata, sinks, aux
/// tensors and scalar params.
pub fn variant_params(spec: &Spec, p: &mut Vec<(String, ParamTy)>) {
    use ParamTy::*;
    let mut add = |n: String, t: ParamTy| p.push((n, t));
    match spec.kv_layout {
        KvLayout::Contiguous => {}
        KvLayout::Varlen => {
            add("cu_seqlens_q".into(), Ptr);
            add("cu_seqlens_k".into(), Ptr);
        }
        KvLayout::Paged { .. } => {
            add("block_table".into(), Ptr);
            add("block_table_stride".into(), I64);
            add("seqused_k".into(), Ptr);
        }
    }
    if spec.sinks {
        add("sinks".into(), Ptr);
    }
    expression_params(spec, p);
}

/// The shard's place in its global sequence, for the sharded twin of a variant that reads
/// positions ([`takes_frame`]): `q = q_offset + local row`, `k = k_offset + local key`,
/// and the global lengths as the local ones plus `seqlen_*_extra` (all 0 without
/// sharding, whatever the layout).
pub const POSITION_PARAMS: [&str; 4] = ["q_offset", "k_offset", "seqlen_q_extra", "seqlen_k_extra"];

/// The sharded twin of a varlen variant: one frame per sequence, i32 `[batch][4]`
/// (`q_offset`, `k_offset`, global `seqlen_q`, global `seqlen_k`).
pub const SEQUENCE_POSITIONS_PARAM: &str = "sequence_positions";

/// Whether the kernels take [`POSITION_PARAMS`]: the sharded twin of a variant whose
/// expressions read positions (for the others every shard computes the same thing).
pub fn takes_frame(spec: &Spec) -> bool {
    spec.shards && spec.reads_positions()
}

/// What the mask and score-mod expressions read: aux tensors with their dims, scalar
/// params, and the shard's positions (every family's kernels, in this order).
pub fn expression_params(spec: &Spec, p: &mut Vec<(String, ParamTy)>) {
    use ParamTy::*;
    let mut add = |n: String, t: ParamTy| p.push((n, t));
    for a in &spec.aux {
        add(format!("aux_{}", a.name), Ptr);
        for j in 0..a.dims.len() {
            add(format!("aux_{}_dim{j}", a.name), I32);
        }
    }
    for prm in &spec.params {
        add(format!("param_{}", prm.name), if prm.ty == Ty::Float { F32 } else { I32 });
    }
    if takes_frame(spec) {
        if spec.kv_layout == KvLayout::Varlen {
            // One frame per sequence: i32 [batch][4].
            add(SEQUENCE_POSITIONS_PARAM.into(), Ptr);
        } else {
            for n in POSITION_PARAMS {
                add(n.into(), I32);
            }
        }
    }
}

/// The expressions' arguments ([`expression_params`]) from a kernel's parameters by name.
pub fn variant_args<'ctx>(spec: &Spec, get: &dyn Fn(&str) -> R<BasicValueEnum<'ctx>>) -> R<VariantArgs<'ctx>> {
    let mut va = VariantArgs::default();
    for a in &spec.aux {
        let addr = get(&format!("aux_{}", a.name))?.into_int_value();
        let dims = (0..a.dims.len())
            .map(|j| Ok(get(&format!("aux_{}_dim{j}", a.name))?.into_int_value()))
            .collect::<R<Vec<_>>>()?;
        va.aux.push(AuxArg { addr, dims });
    }
    for p in &spec.params {
        let v = get(&format!("param_{}", p.name))?;
        va.params.push(match p.ty {
            Ty::Float => Val::Float(v.into_float_value()),
            _ => Val::Int(v.into_int_value()),
        });
    }
    if takes_frame(spec) {
        va.frame = Some(if spec.kv_layout == KvLayout::Varlen {
            PositionFrame::PerSequence { table: get(SEQUENCE_POSITIONS_PARAM)?.into_int_value() }
        } else {
            let [q, k, sq, sk] = POSITION_PARAMS.map(|n| get(n).map(|v| v.into_int_value()));
            PositionFrame::Launch { q_offset: q?, k_offset: k?, seqlen_q_extra: sq?, seqlen_k_extra: sk? }
        });
    }
    Ok(va)
}

/// The ordered parameter list of the split-KV combine kernel.
pub fn combine_params(spec: &Spec) -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    let mut p: Vec<(String, ParamTy)> = vec![
        ("o_partial".into(), Ptr),
        ("lse_partial".into(), Ptr),
        ("o".into(), Ptr),
        ("o_stride_batch".into(), I64),
        ("o_stride_row".into(), I64),
        ("o_stride_head".into(), I64),
        ("lse".into(), Ptr),
        ("lse_stride_batch".into(), I64),
        ("lse_stride_head".into(), I64),
        ("seqlen_q".into(), I32),
        ("num_splits".into(), I32),
    ];
    if spec.kv_layout == KvLayout::Varlen {
        p.push(("cu_seqlens_q".into(), Ptr));
    }
    if spec.sinks {
        p.push(("sinks".into(), Ptr));
    }
    p
}

/// Declared parameters by name, after `Kb::begin_kernel`.
pub struct Args<'ctx> {
    names: Vec<String>,
    values: Vec<BasicValueEnum<'ctx>>,
}

impl<'ctx> Args<'ctx> {
    /// Starts kernel `name` with `params` and returns its arguments.
    pub fn begin(kb: &mut Kb<'ctx>, name: &str, params: &[(String, ParamTy)]) -> R<Args<'ctx>> {
        let decl: Vec<(BasicMetadataTypeEnum, String)> = params
            .iter()
            .map(|(n, t)| {
                let ty: BasicMetadataTypeEnum = match t {
                    // By-value tensor maps are marked `.param .align 64 .b8 [128]` by the
                    // family that uses them; in LLVM they are a pointer parameter.
                    ParamTy::TensorMap => kb.ctx.ptr_type(inkwell::AddressSpace::default()).into(),
                    ParamTy::Ptr | ParamTy::I64 => kb.ctx.i64_type().into(),
                    ParamTy::I32 => kb.ctx.i32_type().into(),
                    ParamTy::F32 => kb.ctx.f32_type().into(),
                };
                (ty, n.clone())
            })
            .collect();
        let values = kb.begin_kernel(name, &decl)?;
        Ok(Args { names: params.iter().map(|p| p.0.clone()).collect(), values })
    }

    pub fn get(&self, name: &str) -> R<BasicValueEnum<'ctx>> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| self.values[i])
            .ok_or_else(|| crate::error::LowerError::Llvm(format!("kernel has no parameter `{name}`")))
    }
    pub fn int(&self, name: &str) -> R<IntValue<'ctx>> {
        Ok(self.get(name)?.into_int_value())
    }
    pub fn opt_int(&self, name: &str) -> Option<IntValue<'ctx>> {
        self.get(name).ok().map(|v| v.into_int_value())
    }
    pub fn strides(&self, t: &str) -> R<Strides<'ctx>> {
        Ok(Strides {
            batch: self.int(&format!("{t}_stride_batch"))?,
            row: self.int(&format!("{t}_stride_row"))?,
            head: self.int(&format!("{t}_stride_head"))?,
        })
    }
    pub fn layout(&self) -> R<LayoutArgs<'ctx>> {
        Ok(LayoutArgs {
            seqlen_q: self.int("seqlen_q")?,
            seqlen_k: self.opt_int("seqlen_k").unwrap_or_else(|| self.values[0].into_int_value()),
            cu_seqlens_q: self.opt_int("cu_seqlens_q"),
            cu_seqlens_k: self.opt_int("cu_seqlens_k"),
            block_table: self.opt_int("block_table"),
            block_table_stride: self.opt_int("block_table_stride"),
            seqused_k: self.opt_int("seqused_k"),
        })
    }
    /// The block mask's row lists, when the kernel takes them.
    pub fn block_lists(&self) -> Option<BlockListArgs<'ctx>> {
        Some(BlockListArgs {
            lists: self.opt_int(BLOCK_LIST_PARAMS[0])?,
            slots: self.opt_int(BLOCK_LIST_PARAMS[1])?,
            m_tiles: self.opt_int(BLOCK_LIST_PARAMS[2])?,
            n_tiles: self.opt_int(BLOCK_LIST_PARAMS[3])?,
            bits: self.opt_int(BLOCK_LIST_PARAMS[4])?,
            bits_per_row: self.opt_int(BLOCK_LIST_PARAMS[5])?,
        })
    }

    pub fn variant(&self, spec: &Spec) -> R<VariantArgs<'ctx>> {
        variant_args(spec, &|n| self.get(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the sharded twin of a variant that reads positions takes the shard's frame:
    /// every other module keeps its ABI (and PTX).
    #[test]
    fn the_position_frame_is_in_the_sharded_twin_of_positional_variants_only() {
        let takes = |s: &Spec| {
            let p = forward_params(s);
            POSITION_PARAMS.iter().all(|n| p.iter().any(|(m, _)| m == n))
        };
        let mut causal = Spec::new("c", 128, 8);
        causal.mask.causal = Some(attnc_ir::Align::TopLeft);
        let plain = Spec::new("p", 128, 8);
        assert!(!takes(&causal) && !takes(&plain));
        let (mut causal_twin, mut plain_twin) = (causal.clone(), plain.clone());
        causal_twin.shards = true;
        plain_twin.shards = true;
        assert!(takes(&causal_twin), "a causal mask reads positions");
        assert!(!takes(&plain_twin), "no expression reads a position: nothing to shift");
    }
}
