//! TMA tensor maps: what `cuTensorMapEncodeTiled` is given for each `tensormap`
//! parameter of a kernel, and the call itself.
//!
//! The pure half — [`encode_args`] / [`plan_tensor_maps`], from a tensor's descriptor and
//! the kernel's [`TmaBox`] to a [`TmaEncode`] (every argument of the driver call), with
//! every precondition the driver states checked first as a typed
//! [`ValidationError::TensorMap`] — needs no device and is tested on the CPU.
//! [`encode`] is the thin driver wrapper: it turns a [`TmaEncode`] into the 128 opaque
//! bytes of a `CUtensorMap` ([`TensorMapArg`]), which the launch passes by value.
//!
//! The encoding (see `attnc_lower::families::abi::TmaBox`): rank 4 over
//! `[batch, seqlen, heads, d]`, innermost first — globalDim `{d, seqlen, heads, batch}`,
//! globalStrides (bytes) `{row, head, batch}`; a rank-3 varlen tensor `[total, heads, d]`
//! is batch 1 with `seqlen = total` (paged K/V `[pages, page_size, heads, d]` map as is).
//! boxDim `{box_cols, box_rows, 1, 1}`, elementStrides 1, no interleave, L2 promotion
//! 256 B, out-of-bounds elements read as zero (`OOB_FILL_NONE`: the kernels rely on rows
//! past the end loading as zeros).
//!
//! The stride of a dimension of size 1 is never used to address anything, so it is
//! replaced by a valid one (the view's span in bytes, rounded up to 16) instead of
//! failing on a view whose unused stride is odd (e.g. varlen's batch dim).

use crate::cuda::{guarded, Gpu};
use crate::error::{RuntimeError, ValidationError};
use crate::tensor::{ElemType, TensorDesc};
pub use crate::tensor_map::*;
use crate::validate::LaunchDescs;
pub use attnc_lower::TmaBox;

fn broken(b: &TmaBox, rule: TmaRule, what: impl Into<String>, value: u64) -> ValidationError {
    ValidationError::TensorMap { arg: b.tensor.clone(), param: b.param.clone(), rule, what: what.into(), value }
}

/// The encode arguments of `b` over the tensor `desc`, or the first precondition of
/// `cuTensorMapEncodeTiled` it breaks.
pub fn encode_args(b: &TmaBox, desc: &TensorDesc) -> Result<TmaEncode, ValidationError> {
    let data_type = match desc.dtype {
        ElemType::Bf16 => TmaDataType::Bfloat16,
        ElemType::F16 => TmaDataType::Float16,
        other => {
            return Err(broken(
                b,
                TmaRule::DataType,
                format!("the element size of {other}, bytes"),
                other.bytes() as u64,
            ))
        }
    };
    let eb = desc.dtype.bytes() as u64;
    if desc.shape.len() != desc.strides.len() {
        return Err(broken(
            b,
            TmaRule::Rank,
            "the stride count (differs from the shape's rank)",
            desc.strides.len() as u64,
        ));
    }
    // [batch, seqlen, heads, d] with strides in elements; rank 3 is batch 1.
    let (shape, strides): ([u64; 4], [u64; 4]) = match (desc.shape.as_slice(), desc.strides.as_slice()) {
        (&[n, s, h, d], &[sn, ss, sh, sd]) => ([n, s, h, d].map(|x| x as u64), [sn, ss, sh, sd].map(|x| x as u64)),
        (&[s, h, d], &[ss, sh, sd]) => ([1, s as u64, h as u64, d as u64], [0, ss as u64, sh as u64, sd as u64]),
        _ => return Err(broken(b, TmaRule::Rank, "the rank", desc.shape.len() as u64)),
    };
    if desc.addr % 16 != 0 {
        return Err(broken(b, TmaRule::BaseAlignment, "the global address", desc.addr));
    }
    let names = ["d", "seqlen", "heads", "batch"];
    // An empty sequence (seqlen_k = 0) has no key tile, so the kernel never loads through
    // the map; it is encoded over one row, which the driver accepts.
    let global_dims = [shape[3], shape[1].max(1), shape[2], shape[0]];
    for (i, &n) in global_dims.iter().enumerate() {
        if n == 0 || n > MAX_GLOBAL_DIM {
            return Err(broken(b, TmaRule::DimRange, format!("globalDim[{i}] ({})", names[i]), n));
        }
    }
    // A size-1 dimension's stride addresses nothing: any valid value will do.
    let span_bytes = u64::try_from(desc.span()).unwrap_or(u64::MAX).saturating_mul(eb);
    let filler = span_bytes.div_ceil(16).saturating_mul(16).max(16);
    let stride_names = ["row", "head", "batch"];
    let mut global_strides = [0u64; 3];
    for (j, (n, s)) in [(shape[1], strides[1]), (shape[2], strides[2]), (shape[0], strides[0])].into_iter().enumerate()
    {
        let bytes = if n <= 1 { filler } else { s.saturating_mul(eb) };
        if bytes % 16 != 0 {
            return Err(broken(
                b,
                TmaRule::StrideMultiple,
                format!("globalStrides[{j}] ({} stride, bytes)", stride_names[j]),
                bytes,
            ));
        }
        if bytes >= MAX_GLOBAL_STRIDE {
            return Err(broken(
                b,
                TmaRule::StrideRange,
                format!("globalStrides[{j}] ({} stride, bytes)", stride_names[j]),
                bytes,
            ));
        }
        global_strides[j] = bytes;
    }
    let swizzle = TmaSwizzle::from_bytes(b.swizzle_bytes)
        .ok_or_else(|| broken(b, TmaRule::Swizzle, "swizzle_bytes", u64::from(b.swizzle_bytes)))?;
    for (what, n) in [("box_cols (boxDim[0])", b.box_cols), ("box_rows (boxDim[1])", b.box_rows)] {
        if n == 0 || n > MAX_BOX_DIM {
            return Err(broken(b, TmaRule::BoxDim, what, u64::from(n)));
        }
    }
    let inner = u64::from(b.box_cols) * eb;
    if inner % 16 != 0 {
        return Err(broken(b, TmaRule::BoxColsBytes, "box_cols x element bytes", inner));
    }
    if swizzle != TmaSwizzle::None && inner > u64::from(swizzle.bytes()) {
        return Err(broken(
            b,
            TmaRule::SwizzleSpan,
            format!("box_cols x element bytes (swizzle {} B)", swizzle.bytes()),
            inner,
        ));
    }
    let g = b.pack_group.max(1);
    if g == 1 {
        return Ok(TmaEncode {
            param: b.param.clone(),
            tensor: b.tensor.clone(),
            data_type,
            global_address: desc.addr,
            rank: 4,
            global_dims: [global_dims[0], global_dims[1], global_dims[2], global_dims[3], 1],
            global_strides: [global_strides[0], global_strides[1], global_strides[2], 0],
            box_dims: [b.box_cols, b.box_rows, 1, 1, 1],
            element_strides: [1; 5],
            swizzle,
        });
    }
    // Pack-GQA Q, rank 5: heads split into (kv_heads, G); a box covers G heads x
    // box_rows / G positions. Its strides are the rank-4 ones rearranged: {head, row,
    // G x head, batch}.
    let heads = global_dims[2];
    if heads % u64::from(g) != 0 {
        return Err(broken(b, TmaRule::DimRange, format!("heads (not a multiple of the pack group {g})"), heads));
    }
    if b.box_rows % g != 0 {
        return Err(broken(
            b,
            TmaRule::BoxDim,
            format!("box_rows (not a multiple of the pack group {g})"),
            u64::from(b.box_rows),
        ));
    }
    let [row_stride, head_stride, batch_stride] = global_strides;
    let group_stride = head_stride.saturating_mul(u64::from(g));
    if group_stride >= MAX_GLOBAL_STRIDE {
        return Err(broken(b, TmaRule::StrideRange, "globalStrides[2] (G x head stride, bytes)", group_stride));
    }
    Ok(TmaEncode {
        param: b.param.clone(),
        tensor: b.tensor.clone(),
        data_type,
        global_address: desc.addr,
        rank: 5,
        global_dims: [global_dims[0], u64::from(g), global_dims[1], heads / u64::from(g), global_dims[3]],
        global_strides: [head_stride, row_stride, group_stride, batch_stride],
        box_dims: [b.box_cols, g, b.box_rows / g, 1, 1],
        element_strides: [1; 5],
        swizzle,
    })
}

/// The encode arguments of every box of a kernel over a launch's tensors. A box naming
/// a tensor other than `q`, `k`, `v`, `o` is an ABI error.
pub fn plan_tensor_maps(boxes: &[TmaBox], d: &LaunchDescs) -> Result<Vec<TmaEncode>, RuntimeError> {
    plan_tensor_maps_over(boxes, |t| match t {
        "q" => Some(&d.q),
        "k" => Some(&d.k),
        "v" => Some(&d.v),
        "o" => Some(&d.o),
        _ => None,
    })
}

/// [`plan_tensor_maps`] over the tensors `lookup` names (the backward adds `do`); a box
/// naming a tensor `lookup` does not know is an ABI error.
pub fn plan_tensor_maps_over<'a>(
    boxes: &[TmaBox],
    lookup: impl Fn(&str) -> Option<&'a TensorDesc>,
) -> Result<Vec<TmaEncode>, RuntimeError> {
    boxes
        .iter()
        .map(|b| {
            let desc = lookup(b.tensor.as_str()).ok_or_else(|| {
                RuntimeError::Abi(format!(
                    "tensor map `{}` describes `{}`, which this launch does not have",
                    b.param, b.tensor
                ))
            })?;
            Ok(encode_args(b, desc)?)
        })
        .collect()
}

/// Encodes one tensor map with the driver (`cuTensorMapEncodeTiled`). A failure names
/// the tensor and every argument passed.
pub fn encode(gpu: &Gpu, a: &TmaEncode) -> Result<TensorMapArg, RuntimeError> {
    use cudarc::driver::sys;
    gpu.bind()?;
    guarded("cuTensorMapEncodeTiled", || {
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let data_type = match a.data_type {
            TmaDataType::Bfloat16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TmaDataType::Float16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        };
        let swizzle = match a.swizzle {
            TmaSwizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            TmaSwizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            TmaSwizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            TmaSwizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        // SAFETY: `map` is a writable, suitably aligned CUtensorMap; the arrays hold at
        // least rank (≤ 5) and rank - 1 entries as the call reads; the driver only records
        // the global address (nothing is dereferenced at encode time).
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                data_type,
                a.rank,
                a.global_address as *mut std::ffi::c_void,
                a.global_dims.as_ptr(),
                a.global_strides.as_ptr(),
                a.box_dims.as_ptr(),
                a.element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        crate::cuda::check("cuTensorMapEncodeTiled", r).map_err(|e| match e {
            RuntimeError::Cuda { code, message, .. } => {
                RuntimeError::TensorMapEncode { code, message, args: Box::new(a.clone()) }
            }
            other => other,
        })?;
        Ok(TensorMapArg(map.opaque))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bx(tensor: &str, cols: u32, rows: u32, swizzle: u32) -> TmaBox {
        TmaBox {
            param: format!("tmap_{tensor}"),
            tensor: tensor.into(),
            box_cols: cols,
            box_rows: rows,
            swizzle_bytes: swizzle,
            pack_group: 1,
        }
    }

    fn rule(r: Result<TmaEncode, ValidationError>) -> TmaRule {
        match r {
            Err(ValidationError::TensorMap { rule, .. }) => rule,
            other => panic!("expected a tensor-map rejection, got {other:?}"),
        }
    }

    const BASE: u64 = 0x7f00_0000_0000;

    #[test]
    fn contiguous_bf16() {
        let d = TensorDesc::contiguous(ElemType::Bf16, &[2, 1000, 8, 128], BASE, 0);
        let e = encode_args(&bx("q", 64, 128, 128), &d).expect("encodes");
        assert_eq!(e.param, "tmap_q");
        assert_eq!(e.data_type, TmaDataType::Bfloat16);
        assert_eq!(e.global_address, BASE);
        assert_eq!(e.dims().0, [128, 1000, 8, 2]);
        assert_eq!(e.dims().1, [8 * 128 * 2, 128 * 2, 1000 * 8 * 128 * 2]);
        assert_eq!(e.dims().2, [64, 128, 1, 1]);
        assert_eq!(e.element_strides[..4], [1, 1, 1, 1]);
        assert_eq!(e.swizzle, TmaSwizzle::B128);
        let text = e.to_string();
        assert!(text.contains("globalDim=[128, 1000, 8, 2]") && text.contains("swizzle=128B"), "{text}");
    }

    #[test]
    fn gqa_kv_fp16() {
        // K of a GQA launch: 2 KV heads, head dim 64, seqlen 333, fp16, 64B swizzle.
        let d = TensorDesc::contiguous(ElemType::F16, &[3, 333, 2, 64], BASE + 256, 0);
        let e = encode_args(&bx("k", 32, 176, 64), &d).expect("encodes");
        assert_eq!(e.data_type, TmaDataType::Float16);
        assert_eq!(e.dims().0, [64, 333, 2, 3]);
        assert_eq!(e.dims().1, [2 * 64 * 2, 64 * 2, 333 * 2 * 64 * 2]);
        assert_eq!(e.dims().2, [32, 176, 1, 1]);
        assert_eq!(e.swizzle, TmaSwizzle::B64);
    }

    #[test]
    fn strided_view_of_a_fused_qkv() {
        // K as a slice of a fused [B, S, 3, H, D] buffer viewed as [B, S, H, D].
        let (b, s, h, dd) = (2usize, 50usize, 4usize, 128usize);
        let d = TensorDesc {
            dtype: ElemType::Bf16,
            shape: vec![b, s, h, dd],
            strides: vec![s * 3 * h * dd, 3 * h * dd, dd, 1],
            addr: BASE + (h * dd * 2) as u64,
            capacity: (b * s * 3 * h * dd) as u64,
            device: 0,
        };
        let e = encode_args(&bx("k", 64, 128, 128), &d).expect("encodes");
        assert_eq!(e.dims().1, [(3 * h * dd * 2) as u64, (dd * 2) as u64, (s * 3 * h * dd * 2) as u64]);
    }

    #[test]
    fn varlen_is_batch_one() {
        let d = TensorDesc::contiguous(ElemType::Bf16, &[777, 8, 128], BASE, 0);
        let e = encode_args(&bx("q", 64, 128, 128), &d).expect("encodes");
        assert_eq!(e.dims().0, [128, 777, 8, 1]);
        let batch = e.global_strides[2];
        assert_eq!(e.global_strides[..2], [8 * 128 * 2, 128 * 2]);
        assert!(batch % 16 == 0 && (777 * 8 * 128 * 2..MAX_GLOBAL_STRIDE).contains(&batch), "{batch}");
        // A batch dim of 1 with an odd stride is fine too (the stride is never used).
        let mut d4 = TensorDesc::contiguous(ElemType::Bf16, &[1, 40, 8, 128], BASE, 0);
        d4.strides[0] = 3;
        assert!(encode_args(&bx("q", 64, 128, 128), &d4).is_ok());
    }

    #[test]
    fn rejections() {
        let b = bx("q", 64, 128, 128);
        let ok = TensorDesc::contiguous(ElemType::Bf16, &[2, 100, 8, 128], BASE, 0);
        assert!(encode_args(&b, &ok).is_ok());

        let mut d = ok.clone();
        d.addr = BASE + 8;
        assert_eq!(rule(encode_args(&b, &d)), TmaRule::BaseAlignment);
        match encode_args(&b, &d) {
            Err(e @ ValidationError::TensorMap { .. }) => {
                let t = e.to_string();
                assert!(t.starts_with("q (tensor map `tmap_q`)") && t.contains("16-byte"), "{t}");
            }
            other => panic!("{other:?}"),
        }

        // Row stride of 1028 elements = 2056 bytes, not a multiple of 16.
        let mut d = ok.clone();
        d.strides = vec![100 * 1028, 1028, 128, 1];
        d.capacity = 2 * 100 * 1028;
        assert_eq!(rule(encode_args(&b, &d)), TmaRule::StrideMultiple);

        let mut d = ok.clone();
        d.strides[0] = 1 << 40;
        assert_eq!(rule(encode_args(&b, &d)), TmaRule::StrideRange);

        // 128 bf16 columns = 256 bytes: wider than the 128-byte swizzle span.
        assert_eq!(rule(encode_args(&bx("q", 128, 64, 128), &ok)), TmaRule::SwizzleSpan);
        assert!(encode_args(&bx("q", 128, 64, 0), &ok).is_ok(), "no swizzle: no span limit");
        assert_eq!(rule(encode_args(&bx("q", 64, 257, 128), &ok)), TmaRule::BoxDim);
        assert_eq!(rule(encode_args(&bx("q", 0, 64, 128), &ok)), TmaRule::BoxDim);
        assert_eq!(rule(encode_args(&bx("q", 4, 64, 0), &ok)), TmaRule::BoxColsBytes);
        assert_eq!(rule(encode_args(&bx("q", 64, 64, 96), &ok)), TmaRule::Swizzle);

        // seqlen 0: no tile is ever loaded; encoded over one row.
        let empty_seq = TensorDesc::contiguous(ElemType::Bf16, &[2, 0, 8, 128], BASE, 0);
        assert_eq!(encode_args(&b, &empty_seq).map(|e| e.dims().0.to_vec()), Ok(vec![128, 1, 8, 2]));
        let zero_heads = TensorDesc::contiguous(ElemType::Bf16, &[2, 10, 0, 128], BASE, 0);
        assert_eq!(rule(encode_args(&b, &zero_heads)), TmaRule::DimRange);
        let f32 = TensorDesc::contiguous(ElemType::F32, &[2, 100, 8, 128], BASE, 0);
        assert_eq!(rule(encode_args(&b, &f32)), TmaRule::DataType);
        let r2 = TensorDesc::contiguous(ElemType::Bf16, &[100, 128], BASE, 0);
        assert_eq!(rule(encode_args(&b, &r2)), TmaRule::Rank);
    }

    #[test]
    fn a_driver_refusal_names_the_tensor_and_every_argument() {
        let d = TensorDesc::contiguous(ElemType::Bf16, &[2, 1000, 8, 128], BASE, 0);
        let args = encode_args(&bx("v", 64, 128, 128), &d).expect("encodes");
        let e = RuntimeError::TensorMapEncode {
            code: "CUDA_ERROR_INVALID_VALUE".into(),
            message: "invalid argument".into(),
            args: Box::new(args),
        };
        let t = e.to_string();
        for part in [
            "for v (tensor map `tmap_v`)",
            "CUDA_ERROR_INVALID_VALUE",
            "tensorDataType=BFLOAT16",
            "globalAddress=0x7f0000000000",
            "globalDim=[128, 1000, 8, 2]",
            "globalStrides=[2048, 256, 2048000]",
            "boxDim=[64, 128, 1, 1]",
            "elementStrides=[1, 1, 1, 1]",
            "interleave=NONE",
            "swizzle=128B",
            "l2Promotion=L2_256B",
            "oobFill=NONE",
        ] {
            assert!(t.contains(part), "{part} missing from: {t}");
        }
    }

    #[test]
    fn tensor_map_arg_is_128_bytes_64_aligned() {
        assert_eq!(std::mem::size_of::<TensorMapArg>(), TENSOR_MAP_BYTES);
        assert_eq!(std::mem::align_of::<TensorMapArg>(), TENSOR_MAP_ALIGN);
        let mut words = [0u64; 16];
        words[0] = 0x0102_0304_0506_0708;
        words[15] = u64::MAX;
        let b = TensorMapArg(words).to_bytes();
        assert_eq!(b[..8], 0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(b[120..], [0xff; 8]);
    }

    #[test]
    fn pack_gqa_q_is_rank_5() {
        // Q [2, 1000, 8 heads = 2 kv x G 4, 128] bf16, box 64 cols x 128 rows = 4 heads x 32.
        let q = TensorDesc::contiguous(ElemType::Bf16, &[2, 1000, 8, 128], BASE, 0);
        let b = TmaBox { pack_group: 4, ..bx("q", 64, 128, 128) };
        let e = encode_args(&b, &q).expect("encodes");
        assert_eq!(e.rank, 5);
        assert_eq!(e.dims().0, [128, 4, 1000, 2, 2]);
        let (row, head, batch) = (8 * 128 * 2, 128 * 2, 1000 * 8 * 128 * 2);
        assert_eq!(e.dims().1, [head, row, 4 * head, batch]);
        assert_eq!(e.dims().2, [64, 4, 32, 1, 1]);
        assert!(e.to_string().contains("tensorRank=5"));
        // Heads that are not whole groups, and boxes that are not whole groups, are refused.
        let odd = TensorDesc::contiguous(ElemType::Bf16, &[2, 1000, 6, 128], BASE, 0);
        assert_eq!(rule(encode_args(&b, &odd)), TmaRule::DimRange);
        let b3 = TmaBox { pack_group: 3, ..bx("q", 64, 128, 128) };
        let q9 = TensorDesc::contiguous(ElemType::Bf16, &[2, 1000, 9, 128], BASE, 0);
        assert_eq!(rule(encode_args(&b3, &q9)), TmaRule::BoxDim);
    }
}
