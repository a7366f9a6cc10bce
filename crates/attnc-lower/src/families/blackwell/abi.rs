//! The launch ABI of the blackwell family: the forward kernel's parameters in order,
//! the TMA tensor maps the runtime must encode (`cuTensorMapEncodeTiled`) and pass by
//! value as `__grid_constant__` parameters (`.param .align 64 .b8 [128]`), and the
//! LLVM attributes that produce that PTX.

use crate::families::common::abi::ParamTy;

/// The ordered parameter list of the forward kernel. Tensor maps come first, so their
/// PTX names are `<kernel>_param_0..2`.
pub fn forward_params(spec: &attnc_ir::Spec) -> Vec<(String, ParamTy)> {
    use ParamTy::*;
    let mut p: Vec<(String, ParamTy)> = Vec::new();
    let mut add = |n: &str, t: ParamTy| p.push((n.to_string(), t));
    let gather = super::config::gathers(spec);
    for t in ["tmap_q", "tmap_k", "tmap_v"] {
        if !(gather && t != "tmap_q") {
            add(t, TensorMap);
        }
    }
    if super::config::stores_o_by_tma(spec) {
        add("tmap_o", TensorMap);
    }
    if gather {
        // Row gather (pages TMA cannot follow): the cache tensors themselves.
        for t in ["k", "v"] {
            add(t, Ptr);
            for st in ["batch", "row", "head"] {
                add(&format!("{t}_stride_{st}"), I64);
            }
        }
    }
    add("o", Ptr);
    for s in ["batch", "row", "head"] {
        add(&format!("o_stride_{s}"), I64);
    }
    add("batch", I32);
    add("seqlen_q", I32);
    add("seqlen_k", I32);
    add("lse", Ptr);
    add("lse_stride_batch", I64);
    add("lse_stride_head", I64);
    if spec.kv_layout == attnc_ir::KvLayout::Varlen {
        add("cu_seqlens_q", Ptr);
        add("cu_seqlens_k", Ptr);
    }
    if let attnc_ir::KvLayout::Paged { .. } = spec.kv_layout {
        // i32 [batch, block_table_stride] page indices, i32 [batch] keys per sequence.
        add("block_table", Ptr);
        add("block_table_stride", I64);
        add("seqused_k", Ptr);
    }
    if spec.split_kv != attnc_ir::SplitKv::None {
        // The combine kernel's workspace (`variant::layout::partial_row`).
        add("num_splits", I32);
        add("o_partial", Ptr);
        add("lse_partial", Ptr);
    }
    if spec.sinks {
        add("sinks", Ptr);
    }
    crate::families::common::abi::expression_params(spec, &mut p);
    // A mask over aux tensors: the block mask's class table (`BlockLayout::Dense`).
    crate::families::common::abi::block_list_params(spec, &mut p);
    p
}

/// How the runtime must encode one tensor map (`cuTensorMapEncodeTiled`): rank 4 over
/// the `[batch, seqlen, heads, d]` tensor, innermost first; with pack_gqa, Q is rank 5
/// `{d, G, seqlen, kv_heads, batch}` so one box holds 128/G positions × G heads.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TensorMapSpec {
    /// The kernel parameter that receives it.
    pub param: String,
    /// The tensor it describes (`q`, `k`, `v`).
    pub tensor: String,
    /// `CU_TENSOR_MAP_DATA_TYPE_BFLOAT16` or `..._FLOAT16`.
    pub data_type: String,
    /// globalDim, innermost first (rank 4, or 5 for Q with pack_gqa).
    pub global_dims: Vec<String>,
    /// globalStrides (bytes) of dims 1..; each a multiple of 16.
    pub global_strides_bytes: Vec<String>,
    /// boxDim: 64 elements (128 bytes) × 128 rows (× G × 128/G for packed Q) × 1 × 1.
    pub box_dims: Vec<u32>,
    /// elementStrides (all 1).
    pub element_strides: Vec<u32>,
    pub interleave: String,
    pub swizzle: String,
    pub l2_promotion: String,
    /// Out-of-bounds elements read as zero (rows past seqlen, which the kernel masks).
    pub oob_fill: String,
}

/// The tensor maps of the forward kernel, in parameter order. With varlen the rows are
/// the packed `[total, heads, d]` tensor (`seqlen` = total rows, `batch` = 1). With a
/// row-gathered paged cache only Q has one.
pub fn tensor_maps(spec: &attnc_ir::Spec) -> Vec<TensorMapSpec> {
    let gather = super::config::gathers(spec);
    let store_o = super::config::stores_o_by_tma(spec);
    let mut maps = tensor_maps_all(spec);
    maps.retain(|m| match m.tensor.as_str() {
        "k" | "v" => !gather,
        "o" => store_o,
        _ => true,
    });
    maps
}

fn tensor_maps_all(spec: &attnc_ir::Spec) -> Vec<TensorMapSpec> {
    let varlen = spec.kv_layout == attnc_ir::KvLayout::Varlen;
    let dt = match spec.dtype {
        attnc_ir::DType::Bf16 => "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
        attnc_ir::DType::Fp16 => "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    };
    let (lq, lk, batch) = if varlen { ("total_q", "total_k", "1") } else { ("seqlen_q", "seqlen_k", "batch") };
    // Paged K/V: the cache `[num_pages, page_size, kv_heads, d]`, one box per page (or
    // per 128 keys of a page that holds whole tiles).
    let (lk, kv_batch, kv_rows) = match spec.kv_layout {
        attnc_ir::KvLayout::Paged { page_size } => ("page_size", "num_pages", page_size.min(super::config::BLOCK_N)),
        _ => (lk, batch, super::config::BLOCK_N),
    };
    let g = spec.group_size();
    [
        ("q", spec.head_dim_qk, lq, "q_heads", batch, super::config::BLOCK_N),
        ("k", spec.head_dim_qk, lk, "kv_heads", kv_batch, kv_rows),
        ("v", spec.head_dim_v, lk, "kv_heads", kv_batch, kv_rows),
        ("o", spec.head_dim_v, lq, "q_heads", batch, super::config::BLOCK_M),
    ]
    .into_iter()
    .map(|(t, d, len, heads, batch, rows)| {
        let packed = (t == "q" || t == "o") && spec.pack_gqa;
        let (global_dims, global_strides_bytes, box_dims) = if packed {
            (
                vec![d.to_string(), g.to_string(), len.into(), "kv_heads".into(), batch.into()],
                vec![
                    format!("2*{t}_stride_head"),
                    format!("2*{t}_stride_row"),
                    format!("2*{g}*{t}_stride_head"),
                    format!("2*{t}_stride_batch"),
                ],
                vec![super::config::TMA_BOX_COLS, g, super::config::BLOCK_M / g, 1, 1],
            )
        } else {
            (
                vec![d.to_string(), len.into(), heads.into(), batch.into()],
                vec![format!("2*{t}_stride_row"), format!("2*{t}_stride_head"), format!("2*{t}_stride_batch")],
                vec![super::config::TMA_BOX_COLS, rows, 1, 1],
            )
        };
        TensorMapSpec {
            param: format!("tmap_{t}"),
            tensor: t.into(),
            data_type: dt.into(),
            element_strides: vec![1; global_dims.len()],
            global_dims,
            global_strides_bytes,
            box_dims,
            interleave: "CU_TENSOR_MAP_INTERLEAVE_NONE".into(),
            swizzle: "CU_TENSOR_MAP_SWIZZLE_128B".into(),
            l2_promotion: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B".into(),
            oob_fill: "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE".into(),
        }
    })
    .collect()
}

/// The tensor maps in the runtime's encoding terms: rank 4, or for pack-GQA Q rank 5
/// with `pack_group` G (box `{64, G, rows / G, 1, 1}` = `box_rows` G x rows / G).
pub fn tma_boxes(spec: &attnc_ir::Spec) -> Vec<crate::module::TmaBox> {
    tensor_maps(spec)
        .into_iter()
        .map(|t| {
            let packed = t.box_dims.len() == 5;
            crate::module::TmaBox {
                param: t.param,
                tensor: t.tensor,
                box_cols: t.box_dims[0],
                box_rows: if packed { t.box_dims[1] * t.box_dims[2] } else { t.box_dims[1] },
                swizzle_bytes: 128,
                pack_group: if packed { t.box_dims[1] } else { 1 },
            }
        })
        .collect()
}
