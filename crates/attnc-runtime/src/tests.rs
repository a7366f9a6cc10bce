//! CPU tests of launch validation (descriptors only, no device) and of the runtime's
//! behaviour without a driver.

use crate::cuda::ArgValue;
use crate::error::ValidationError as E;
use crate::tensor::{ElemType, HostIndex, TensorDesc};
use crate::validate::{marshal, plan, CombineKind, KernelShape, LaunchDescs, LaunchPlan, ParamValue};
use attnc_ir::{Align, AuxDecl, AuxDim, KvLayout, ParamDecl, ShardPositions, Spec, SplitKv, Ty};
use attnc_lower::families::common::abi::{POSITION_PARAMS, SEQUENCE_POSITIONS_PARAM};

const SMS: u32 = 132;
const KS: KernelShape = KernelShape {
    block_m: 64,
    block_n: 64,
    combine: CombineKind::Kernel { block_m: 4 },
    ctas_per_sm: 1,
    persistent: false,
};

/// Hands out non-overlapping, 256-byte aligned fake device addresses.
struct Alloc(u64);
impl Alloc {
    fn new() -> Alloc {
        Alloc(1 << 32)
    }
    fn t(&mut self, dtype: ElemType, shape: &[usize]) -> TensorDesc {
        let d = TensorDesc::contiguous(dtype, shape, self.0, 0);
        self.0 += (d.capacity * dtype.bytes() as u64).div_ceil(256) * 256 + 256;
        d
    }
}

fn spec(layout: KvLayout) -> Spec {
    let mut s = Spec::new("t", 128, 8);
    s.kv_heads = 2;
    s.kv_layout = layout;
    s.mask.causal = Some(Align::BottomRight);
    s
}

/// A valid contiguous launch: B=2, Sq=17, Sk=100.
fn contiguous(a: &mut Alloc, s: &Spec) -> LaunchDescs<'static> {
    let bf = ElemType::of(s.dtype);
    LaunchDescs {
        q: a.t(bf, &[2, 17, 8, 128]),
        k: a.t(bf, &[2, 100, 2, 128]),
        v: a.t(bf, &[2, 100, 2, 128]),
        o: a.t(bf, &[2, 17, 8, 128]),
        lse: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        block_table: None,
        seqused_k: None,
        sinks: None,
        aux: Vec::new(),
        params: Vec::new(),
        num_splits: None,
        positions: None,
        sequence_positions: None,
    }
}

fn check(s: &Spec, d: &LaunchDescs) -> Result<LaunchPlan, E> {
    plan(s, &KS, SMS, 0, d)
}

fn err(s: &Spec, d: &LaunchDescs) -> E {
    match check(s, d) {
        Ok(p) => panic!("accepted: {p:?}"),
        Err(e) => e,
    }
}

#[test]
fn contiguous_plan_and_args() {
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &s);
    let p = check(&s, &d).expect("valid");
    assert_eq!((p.batch, p.max_seqlen_q, p.max_seqlen_k, p.num_splits), (2, 17, 100, 1));
    assert_eq!(p.fwd_grid, [1, 8, 2]);
    assert_eq!(p.combine_grid, None);
    assert_eq!(p.arg("q_stride_batch"), Some(ArgValue::I64(17 * 8 * 128)));
    assert_eq!(p.arg("k_stride_row"), Some(ArgValue::I64(2 * 128)));
    assert_eq!(p.arg("k_stride_head"), Some(ArgValue::I64(128)));
    assert_eq!(p.arg("seqlen_k"), Some(ArgValue::I32(100)));
    assert_eq!(p.arg("lse"), Some(ArgValue::Ptr(0)));
    // The real ABI of the portable family marshals completely.
    let opts = attnc_lower::CompileOptions::new(attnc_lower::Arch::Sm90a)
        .family(attnc_lower::FamilyChoice::Exactly(attnc_lower::FamilyKind::Portable));
    let m = attnc_lower::compile(&s, &opts).expect("compiles");
    let fwd = m.kernel(attnc_lower::KernelRole::Forward).expect("fwd");
    let args = marshal(&fwd.params, &p, &[("o_partial", ArgValue::Ptr(0)), ("lse_partial", ArgValue::Ptr(0))])
        .expect("marshal");
    assert_eq!(args.len(), fwd.params.len());
    assert_eq!(args[0], ArgValue::Ptr(d.q.addr));
}

#[test]
fn pack_gqa_grid() {
    let mut s = spec(KvLayout::Contiguous);
    s.pack_gqa = true;
    let mut a = Alloc::new();
    let p = check(&s, &contiguous(&mut a, &s)).expect("valid");
    // 17 rows x group 4 = 68 packed rows -> 2 m-blocks, one CTA per KV head.
    assert_eq!(p.fwd_grid, [2, 2, 2]);
}

#[test]
fn marshal_rejects_unknown_and_mistyped_params() {
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let p = check(&s, &contiguous(&mut a, &s)).expect("valid");
    assert!(marshal(&["mystery:ptr".into()], &p, &[]).unwrap_err().contains("mystery"));
    assert!(marshal(&["seqlen_q:i64".into()], &p, &[]).unwrap_err().contains("seqlen_q"));
    assert!(marshal(&["q".into()], &p, &[]).unwrap_err().contains("malformed"));
}

#[test]
fn dtype_rank_dims_heads() {
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let mut d = contiguous(&mut a, &s);
    d.k.dtype = ElemType::F16;
    assert!(matches!(err(&s, &d), E::DType { arg, .. } if arg == "k"));

    let mut d = contiguous(&mut a, &s);
    d.q = a.t(ElemType::Bf16, &[2, 17, 8 * 128]);
    assert!(matches!(err(&s, &d), E::Rank { arg, expected: 4, found: 3, .. } if arg == "q"));

    let mut d = contiguous(&mut a, &s);
    d.v = a.t(ElemType::Bf16, &[2, 100, 2, 64]);
    assert!(matches!(err(&s, &d), E::Dim { arg, dim: 3, .. } if arg == "v"));

    let mut d = contiguous(&mut a, &s);
    d.k = a.t(ElemType::Bf16, &[2, 100, 4, 128]);
    d.v = a.t(ElemType::Bf16, &[2, 100, 4, 128]);
    assert!(matches!(err(&s, &d), E::GqaRatio { kv_heads: 4, spec_kv: 2, group: 4, .. }));

    let mut d = contiguous(&mut a, &s);
    d.k = a.t(ElemType::Bf16, &[3, 100, 2, 128]);
    assert!(matches!(err(&s, &d), E::Dim { arg, dim: 0, .. } if arg == "k"));

    let mut d = contiguous(&mut a, &s);
    d.o = a.t(ElemType::Bf16, &[2, 16, 8, 128]);
    assert!(matches!(err(&s, &d), E::Dim { arg, dim: 1, .. } if arg == "o"));

    let mut d = contiguous(&mut a, &s);
    d.v.device = 1;
    assert!(matches!(err(&s, &d), E::WrongDevice { arg, .. } if arg == "v"));
}

#[test]
fn strides_alignment_bounds_overlap() {
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();

    // Unit inner stride.
    let mut d = contiguous(&mut a, &s);
    d.q.strides = vec![17 * 8 * 256, 8 * 256, 256, 2];
    d.q.capacity = 1 << 30;
    assert!(matches!(err(&s, &d), E::InnerStride { arg, stride: 2 } if arg == "q"));

    // Misaligned base (8 bytes off).
    let mut d = contiguous(&mut a, &s);
    d.v.addr += 8;
    assert!(matches!(err(&s, &d), E::Alignment { arg, .. } if arg == "v"));

    // A row stride that is not a multiple of 16 bytes: a q slice of a fused QKV tensor
    // with an odd head count in between.
    let mut d = contiguous(&mut a, &s);
    d.q.strides = vec![17 * 1028, 1028, 128, 1];
    d.q.capacity = 1 << 30;
    assert!(matches!(err(&s, &d), E::Alignment { arg, .. } if arg == "q"));
    // ... and a legal strided view (row stride 3 x 8 x 128, e.g. fused QKV).
    let mut d = contiguous(&mut a, &s);
    d.q.strides = vec![17 * 3072, 3072, 128, 1];
    d.q.capacity = 2 * 17 * 3072;
    check(&s, &d).expect("strided q view");

    // A view reaching past its allocation.
    let mut d = contiguous(&mut a, &s);
    d.k.capacity -= 1;
    assert!(matches!(err(&s, &d), E::OutOfBounds { arg, .. } if arg == "k"));
    let mut d = contiguous(&mut a, &s);
    d.o.strides = vec![1 << 40, 8 * 128, 128, 1];
    assert!(matches!(err(&s, &d), E::OutOfBounds { arg, .. } if arg == "o"));
    let mut d = contiguous(&mut a, &s);
    d.o.shape = vec![2, 17, 8, 128];
    d.o.strides = vec![17, 8, 1];
    assert!(matches!(err(&s, &d), E::BadView { .. }));

    // Output aliasing an input.
    let mut d = contiguous(&mut a, &s);
    d.o = d.q.clone();
    assert!(matches!(err(&s, &d), E::Overlap { a, b } if a == "o" && b == "q"));
}

#[test]
fn lse_rules() {
    let mut s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let mut d = contiguous(&mut a, &s);
    d.lse = Some(a.t(ElemType::F32, &[2, 8, 17]));
    assert!(matches!(err(&s, &d), E::Unexpected { arg, .. } if arg == "lse"));
    s.lse = true;
    let mut d = contiguous(&mut a, &s);
    assert!(matches!(err(&s, &d), E::Missing { arg, .. } if arg == "lse"));
    d.lse = Some(a.t(ElemType::F32, &[2, 8, 17]));
    let p = check(&s, &d).expect("valid");
    assert_eq!(p.arg("lse_stride_batch"), Some(ArgValue::I64(8 * 17)));
    assert_eq!(p.arg("lse_stride_head"), Some(ArgValue::I64(17)));
    d.lse = Some(a.t(ElemType::F32, &[2, 17, 8]));
    assert!(matches!(err(&s, &d), E::Dim { arg, dim: 1, .. } if arg == "lse"));
    d.lse = Some(a.t(ElemType::Bf16, &[2, 8, 17]));
    assert!(matches!(err(&s, &d), E::DType { arg, .. } if arg == "lse"));
    let mut l = a.t(ElemType::F32, &[2, 8, 17]);
    l.addr = d.o.addr + 64;
    d.lse = Some(l);
    assert!(matches!(err(&s, &d), E::Overlap { .. }));
}

fn varlen_descs<'a>(a: &mut Alloc, cq: &'a [i32], ck: &'a [i32], tq: usize, tk: usize) -> LaunchDescs<'a> {
    let bf = ElemType::Bf16;
    LaunchDescs {
        q: a.t(bf, &[tq, 8, 128]),
        k: a.t(bf, &[tk, 2, 128]),
        v: a.t(bf, &[tk, 2, 128]),
        o: a.t(bf, &[tq, 8, 128]),
        lse: Some(a.t(ElemType::F32, &[8, tq])),
        cu_seqlens_q: Some(HostIndex { desc: a.t(ElemType::I32, &[cq.len()]), values: cq }),
        cu_seqlens_k: Some(HostIndex { desc: a.t(ElemType::I32, &[ck.len()]), values: ck }),
        block_table: None,
        seqused_k: None,
        sinks: None,
        aux: Vec::new(),
        params: Vec::new(),
        num_splits: None,
        positions: None,
        sequence_positions: None,
    }
}

#[test]
fn varlen_rules() {
    let mut s = spec(KvLayout::Varlen);
    s.lse = true;
    let mut a = Alloc::new();
    let (cq, ck) = ([0, 1, 38, 188], [0, 120, 157, 307]);
    let d = varlen_descs(&mut a, &cq, &ck, 188, 307);
    let p = check(&s, &d).expect("valid");
    assert_eq!((p.batch, p.max_seqlen_q, p.max_seqlen_k, p.total_q), (3, 150, 150, 188));
    assert_eq!(p.arg("q_stride_batch"), Some(ArgValue::I64(0)));
    assert_eq!(p.arg("lse_stride_batch"), Some(ArgValue::I64(0)));
    assert_eq!(p.arg("lse_stride_head"), Some(ArgValue::I64(188)));
    assert_eq!(p.fwd_grid, [3, 8, 3]);

    let bad_q = [0, 40, 38, 188];
    let e = err(&s, &varlen_descs(&mut a, &bad_q, &ck, 188, 307));
    assert!(matches!(&e, E::CuSeqlens { arg, detail } if arg == "cu_seqlens_q" && detail.contains("decreases")), "{e}");
    let past = [0, 120, 157, 308];
    let e = err(&s, &varlen_descs(&mut a, &cq, &past, 188, 307));
    assert!(matches!(&e, E::CuSeqlens { arg, detail } if arg == "cu_seqlens_k" && detail.contains("308")), "{e}");
    let neg = [-1, 1, 38, 188];
    assert!(matches!(err(&s, &varlen_descs(&mut a, &neg, &ck, 188, 307)), E::CuSeqlens { .. }));
    let short = [0, 120, 307];
    let e = err(&s, &varlen_descs(&mut a, &cq, &short, 188, 307));
    assert!(matches!(&e, E::CuSeqlens { arg, detail } if arg == "cu_seqlens_k" && detail.contains("batch + 1")), "{e}");
    let mut d = varlen_descs(&mut a, &cq, &ck, 188, 307);
    d.cu_seqlens_k = None;
    assert!(matches!(err(&s, &d), E::Missing { arg, .. } if arg == "cu_seqlens_k"));
    let mut d = varlen_descs(&mut a, &cq, &ck, 188, 307);
    d.lse = Some(a.t(ElemType::F32, &[3, 8, 150]));
    assert!(matches!(err(&s, &d), E::Rank { arg, .. } if arg == "lse"));
    // Index tensors must be i32 and hold what the host copy says.
    let mut d = varlen_descs(&mut a, &cq, &ck, 188, 307);
    if let Some(h) = &mut d.cu_seqlens_q {
        h.desc.dtype = ElemType::F32;
    }
    assert!(matches!(err(&s, &d), E::DType { arg, .. } if arg == "cu_seqlens_q"));
    let mut d = varlen_descs(&mut a, &cq, &ck, 188, 307);
    if let Some(h) = &mut d.cu_seqlens_q {
        h.values = &cq[..3];
    }
    assert!(matches!(err(&s, &d), E::CuSeqlens { .. }));
    // Contiguous-layout metadata on a varlen spec and vice versa.
    let sc = spec(KvLayout::Contiguous);
    let mut d = contiguous(&mut a, &sc);
    d.cu_seqlens_q = Some(HostIndex { desc: a.t(ElemType::I32, &[4]), values: &cq });
    assert!(matches!(err(&sc, &d), E::Unexpected { arg, .. } if arg == "cu_seqlens_q"));
}

fn paged_descs<'a>(
    a: &mut Alloc,
    bt: &'a [i32],
    su: &'a [i32],
    batch: usize,
    pages: usize,
    ps: usize,
) -> LaunchDescs<'a> {
    let bf = ElemType::Bf16;
    let max_pages = bt.len() / batch.max(1);
    LaunchDescs {
        q: a.t(bf, &[batch, 1, 8, 128]),
        k: a.t(bf, &[pages, ps, 2, 128]),
        v: a.t(bf, &[pages, ps, 2, 128]),
        o: a.t(bf, &[batch, 1, 8, 128]),
        lse: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        block_table: Some(HostIndex { desc: a.t(ElemType::I32, &[batch, max_pages]), values: bt }),
        seqused_k: Some(HostIndex { desc: a.t(ElemType::I32, &[batch]), values: su }),
        sinks: None,
        aux: Vec::new(),
        params: Vec::new(),
        num_splits: None,
        positions: None,
        sequence_positions: None,
    }
}

#[test]
fn paged_rules() {
    let mut s = spec(KvLayout::Paged { page_size: 16 });
    s.split_kv = SplitKv::Auto;
    let mut a = Alloc::new();
    // Two sequences: 40 keys (3 pages) and 16 keys (1 page; the rest is padding -1).
    let bt = [4, 0, 2, 1, -1, -1];
    let su = [40, 16];
    let p = check(&s, &paged_descs(&mut a, &bt, &su, 2, 5, 16)).expect("valid");
    assert_eq!((p.batch, p.max_seqlen_k), (2, 40));
    assert_eq!(p.arg("block_table_stride"), Some(ArgValue::I64(3)));
    assert_eq!(p.arg("k_stride_batch"), Some(ArgValue::I64(16 * 2 * 128)));

    let bad = [4, 0, 5, 1, -1, -1];
    assert_eq!(
        err(&s, &paged_descs(&mut a, &bad, &su, 2, 5, 16)),
        E::PageIndex { batch: 0, page: 2, entry: 5, num_pages: 5 }
    );
    let neg = [4, 0, 2, -1, -1, -1];
    assert_eq!(
        err(&s, &paged_descs(&mut a, &neg, &su, 2, 5, 16)),
        E::PageIndex { batch: 1, page: 0, entry: -1, num_pages: 5 }
    );
    let long = [40, 49];
    assert!(matches!(err(&s, &paged_descs(&mut a, &bt, &long, 2, 5, 16)), E::SequsedK { batch: 1, value: 49, .. }));
    let negative = [40, -3];
    assert!(matches!(err(&s, &paged_descs(&mut a, &bt, &negative, 2, 5, 16)), E::SequsedK { batch: 1, value: -3, .. }));
    // Page size of k/v must be the spec's.
    assert!(matches!(err(&s, &paged_descs(&mut a, &bt, &su, 2, 5, 8)), E::Dim { arg, dim: 1, .. } if arg == "k"));
    let mut d = paged_descs(&mut a, &bt, &su, 2, 5, 16);
    d.seqused_k = None;
    assert!(matches!(err(&s, &d), E::Missing { arg, .. } if arg == "seqused_k"));
    let mut d = paged_descs(&mut a, &bt, &su, 2, 5, 16);
    d.block_table = Some(HostIndex { desc: a.t(ElemType::I32, &[3, 2]), values: &bt });
    assert!(matches!(err(&s, &d), E::Dim { arg, dim: 0, .. } if arg == "block_table"));
}

#[test]
fn splits_rules() {
    let mut s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let mut d = contiguous(&mut a, &s);
    d.num_splits = Some(3);
    assert!(matches!(err(&s, &d), E::Splits { .. }));
    s.split_kv = SplitKv::Fixed(4);
    let d = contiguous(&mut a, &s);
    let p = check(&s, &d).expect("valid");
    assert_eq!(p.num_splits, 4);
    assert_eq!(p.fwd_grid, [1, 8, 8]);
    assert_eq!(p.combine_grid, Some([5, 8, 2]));
    assert_eq!(p.lse_partial_elems, 4 * 2 * 8 * 17);
    assert_eq!(p.o_partial_elems, 4 * 2 * 8 * 17 * 128);
    let mut d = contiguous(&mut a, &s);
    d.num_splits = Some(0);
    assert!(matches!(err(&s, &d), E::Splits { .. }));
    d.num_splits = Some(129);
    assert!(matches!(err(&s, &d), E::Splits { .. }));
    d.num_splits = Some(1);
    assert_eq!(check(&s, &d).expect("valid").combine_grid, None);
    // A module without a combine kernel cannot split.
    let ks = KernelShape { combine: CombineKind::None, ..KS };
    assert!(matches!(plan(&s, &ks, SMS, 0, &contiguous(&mut a, &s)), Err(E::Splits { .. })));
    // Auto: decode-like launch gets several splits.
    s.split_kv = SplitKv::Auto;
    let bf = ElemType::Bf16;
    let mut d = contiguous(&mut a, &s);
    d.q = a.t(bf, &[1, 1, 8, 128]);
    d.o = a.t(bf, &[1, 1, 8, 128]);
    d.k = a.t(bf, &[1, 32768, 2, 128]);
    d.v = a.t(bf, &[1, 32768, 2, 128]);
    let p = check(&s, &d).expect("valid");
    assert!(p.num_splits > 4, "{p:?}");
    assert!(p.split_reason.starts_with("auto"));
    // Two resident CTAs per SM: twice the slots to fill, more splits.
    let two = KernelShape { ctas_per_sm: 2, ..KS };
    let p2 = plan(&s, &two, SMS, 0, &d).expect("valid");
    assert!(p2.num_splits > p.num_splits, "{} vs {}", p2.num_splits, p.num_splits);
    // A fused combine: no combine launch, one counter per row block of the forward grid.
    let fused = KernelShape { combine: CombineKind::Fused, ..KS };
    let pf = plan(&s, &fused, SMS, 0, &d).expect("valid");
    assert_eq!(pf.num_splits, p.num_splits);
    assert_eq!(pf.combine_grid, None);
    let [gx, gy, gz] = pf.fwd_grid;
    assert_eq!(pf.counters, (gx * gy * gz / pf.num_splits) as usize);
    assert_eq!(p.counters, 0, "a combine kernel needs no counters");
    let mut one = d.clone();
    one.num_splits = Some(1);
    assert_eq!(plan(&s, &fused, SMS, 0, &one).expect("valid").counters, 0);
}

#[test]
fn runtime_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<crate::Runtime>();
    check::<crate::Kernel>();
    check::<crate::Tensor>();
    check::<crate::IndexTensor>();
    check::<crate::Receipt>();
}

#[test]
fn grid_and_i32_limits() {
    let mut s = spec(KvLayout::Contiguous);
    s.split_kv = SplitKv::Fixed(2);
    let mut a = Alloc::new();
    let bf = ElemType::Bf16;
    let mut d = contiguous(&mut a, &s);
    d.q = a.t(bf, &[40000, 1, 8, 128]);
    d.o = a.t(bf, &[40000, 1, 8, 128]);
    d.k = a.t(bf, &[40000, 1, 2, 128]);
    d.v = a.t(bf, &[40000, 1, 2, 128]);
    assert!(matches!(err(&s, &d), E::TooLarge { what, .. } if what.contains("grid z")));
    // seqlen beyond i32 (descriptors only: nothing is allocated).
    let s = spec(KvLayout::Contiguous);
    let mut d = contiguous(&mut a, &s);
    let huge = 1usize << 31;
    d.k =
        TensorDesc { shape: vec![2, huge, 2, 128], strides: vec![huge * 256, 256, 128, 1], capacity: u64::MAX, ..d.k };
    d.v = TensorDesc {
        shape: vec![2, huge, 2, 128],
        strides: vec![huge * 256, 256, 128, 1],
        capacity: u64::MAX,
        addr: d.k.addr + (1u64 << 50),
        ..d.v
    };
    assert!(matches!(err(&s, &d), E::TooLarge { what, .. } if what == "seqlen_k"));
}

#[test]
fn float_aux_tensors_are_f32() {
    let mut s = spec(KvLayout::Contiguous);
    s.aux = vec![
        AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK]),
        AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::Fixed(32)], true),
    ];
    let mut a = Alloc::new();
    let mut d = contiguous(&mut a, &s);
    d.aux = vec![("doc".into(), a.t(ElemType::I32, &[2, 100])), ("bias".into(), a.t(ElemType::F32, &[8, 32]))];
    let p = check(&s, &d).expect("valid");
    assert_eq!(p.arg("aux_bias_dim0"), Some(ArgValue::I32(8)));
    assert_eq!(p.arg("aux_bias_dim1"), Some(ArgValue::I32(32)));
    d.aux[1].1 = a.t(ElemType::I32, &[8, 32]);
    assert!(matches!(
        err(&s, &d),
        E::DType { arg, expected: ElemType::F32, found: ElemType::I32 } if arg == "aux `bias`"
    ));
    d.aux[1].1 = a.t(ElemType::F32, &[8, 31]);
    assert!(matches!(err(&s, &d), E::Aux { name, .. } if name == "bias"));
}

#[test]
fn params_aux_sinks() {
    let mut s = spec(KvLayout::Contiguous);
    s.params = vec![ParamDecl { name: "prefix".into(), ty: Ty::Int }, ParamDecl { name: "cap".into(), ty: Ty::Float }];
    s.aux = vec![AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK])];
    s.sinks = true;
    let mut a = Alloc::new();
    let base = |a: &mut Alloc| {
        let mut d = contiguous(a, &s);
        d.params = vec![("prefix".into(), ParamValue::Int(5)), ("cap".into(), ParamValue::Float(30.0))];
        d.aux = vec![("doc".into(), a.t(ElemType::I32, &[2, 100]))];
        d.sinks = Some(a.t(ElemType::F32, &[8]));
        d
    };
    let p = check(&s, &base(&mut a)).expect("valid");
    assert_eq!(p.arg("param_prefix"), Some(ArgValue::I32(5)));
    assert_eq!(p.arg("param_cap"), Some(ArgValue::F32(30.0)));
    assert_eq!(p.arg("aux_doc_dim0"), Some(ArgValue::I32(2)));
    assert_eq!(p.arg("aux_doc_dim1"), Some(ArgValue::I32(100)));

    let mut d = base(&mut a);
    d.params.pop();
    assert!(matches!(err(&s, &d), E::Param { name, .. } if name == "cap"));
    let mut d = base(&mut a);
    d.params[1].1 = ParamValue::Int(3);
    assert!(matches!(err(&s, &d), E::Param { name, .. } if name == "cap"));
    let mut d = base(&mut a);
    d.params[0].1 = ParamValue::Float(3.0);
    assert!(matches!(err(&s, &d), E::Param { name, .. } if name == "prefix"));
    let mut d = base(&mut a);
    d.params.push(("bogus".into(), ParamValue::Int(1)));
    assert!(matches!(err(&s, &d), E::Param { name, .. } if name == "bogus"));
    let mut d = base(&mut a);
    d.params.push(("prefix".into(), ParamValue::Int(1)));
    assert!(matches!(err(&s, &d), E::Param { name, detail } if name == "prefix" && detail.contains("more than once")));

    let mut d = base(&mut a);
    d.aux[0].1 = a.t(ElemType::I32, &[2, 99]);
    assert!(matches!(err(&s, &d), E::Aux { name, detail } if name == "doc" && detail.contains("seqlen_k")));
    let mut d = base(&mut a);
    d.aux[0].1 = a.t(ElemType::F32, &[2, 100]);
    assert!(matches!(err(&s, &d), E::DType { .. }));
    let mut d = base(&mut a);
    d.aux.clear();
    assert!(matches!(err(&s, &d), E::Aux { name, detail } if name == "doc" && detail == "missing"));
    let mut d = base(&mut a);
    d.aux.push(("other".into(), a.t(ElemType::I32, &[2])));
    assert!(matches!(err(&s, &d), E::Aux { name, .. } if name == "other"));

    let mut d = base(&mut a);
    d.sinks = None;
    assert!(matches!(err(&s, &d), E::Missing { arg, .. } if arg == "sinks"));
    let mut d = base(&mut a);
    d.sinks = Some(a.t(ElemType::F32, &[2]));
    assert!(matches!(err(&s, &d), E::Dim { arg, .. } if arg == "sinks"));
    let mut d = base(&mut a);
    d.sinks = Some(a.t(ElemType::Bf16, &[8]));
    assert!(matches!(err(&s, &d), E::Sinks { .. }));
    let s2 = spec(KvLayout::Contiguous);
    let mut d = contiguous(&mut a, &s2);
    d.sinks = Some(a.t(ElemType::F32, &[8]));
    assert!(matches!(err(&s2, &d), E::Unexpected { arg, .. } if arg == "sinks"));
}

#[test]
fn a_shard_sees_global_positions_and_global_aux_dims() {
    // Queries 17 of a global 64 at offset 40, keys 100 of a global 300 at offset 200.
    let mut s = spec(KvLayout::Contiguous);
    s.aux = vec![AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK])];
    let at = |q_offset, k_offset| ShardPositions { q_offset, k_offset, seqlen_q: 64, seqlen_k: 300, sinks: true };
    let mut a = Alloc::new();
    let mut d = contiguous(&mut a, &s);
    d.aux = vec![("doc".into(), a.t(ElemType::I32, &[2, 300]))];
    d.positions = Some(at(40, 200));
    let p = check(&s, &d).expect("valid");
    let frame: Vec<_> = POSITION_PARAMS.iter().map(|n| p.arg(n)).collect();
    assert_eq!(frame, [40, 200, 64 - 17, 300 - 100].map(|x| Some(ArgValue::I32(x))));
    assert_eq!(p.arg("aux_doc_dim1"), Some(ArgValue::I32(300)), "aux dims resolve against the global lengths");

    // The local aux shape is the wrong one for a shard.
    let mut local = d.clone();
    local.aux = vec![("doc".into(), a.t(ElemType::I32, &[2, 100]))];
    assert!(matches!(err(&s, &local), E::Aux { name, detail } if name == "doc" && detail.contains("expected 300")));
    // Rows or keys past the global lengths.
    for bad in [at(48, 200), at(40, 201)] {
        let mut d2 = d.clone();
        d2.positions = Some(bad);
        assert!(matches!(err(&s, &d2), E::Positions { detail } if detail.contains("past the global")));
    }
    // Without positions the frame is all zeros (the whole sequence).
    let mut whole = contiguous(&mut a, &s);
    whole.aux = vec![("doc".into(), a.t(ElemType::I32, &[2, 100]))];
    let p = check(&s, &whole).expect("valid");
    assert!(POSITION_PARAMS.iter().all(|n| p.arg(n) == Some(ArgValue::I32(0))));
    // Varlen sequences have no single global frame.
    let mut sv = spec(KvLayout::Varlen);
    sv.lse = true;
    let (cq, ck) = ([0, 5, 12], [0, 40, 90]);
    let mut dv = varlen_descs(&mut a, &cq, &ck, 12, 90);
    dv.positions = Some(at(0, 0));
    let e = err(&sv, &dv);
    assert!(matches!(&e, E::Positions { detail } if detail.contains("contiguous")), "{e}");

    // Varlen shards take one frame per sequence: [batch, 4] (offsets, global lengths).
    // Sequences 5 and 7 rows long, 40 and 50 keys.
    let frames = [10, 100, 20, 200, 0, 0, 7, 50];
    let mut dv = varlen_descs(&mut a, &cq, &ck, 12, 90);
    dv.sequence_positions = Some(HostIndex { desc: a.t(ElemType::I32, &[2, 4]), values: &frames });
    let p = check(&sv, &dv).expect("valid per-sequence frames");
    let table = dv.sequence_positions.as_ref().map(|t| t.desc.addr);
    assert_eq!(p.arg(SEQUENCE_POSITIONS_PARAM), table.map(ArgValue::Ptr));
    // Sequence 1's keys (0..50) past its global 49.
    let short = [10, 100, 20, 200, 0, 0, 7, 49];
    let mut bad = varlen_descs(&mut a, &cq, &ck, 12, 90);
    bad.sequence_positions = Some(HostIndex { desc: a.t(ElemType::I32, &[2, 4]), values: &short });
    let e = err(&sv, &bad);
    assert!(matches!(&e, E::Positions { detail } if detail.contains("sequence 1")), "{e}");
    // Not both kinds of frame; no per-sequence frames for a contiguous batch.
    let mut both = varlen_descs(&mut a, &cq, &ck, 12, 90);
    both.sequence_positions = Some(HostIndex { desc: a.t(ElemType::I32, &[2, 4]), values: &frames });
    both.positions = Some(at(0, 0));
    assert!(matches!(err(&sv, &both), E::Positions { .. }));
    let mut contiguous_frames = contiguous(&mut a, &s);
    contiguous_frames.aux = vec![("doc".into(), a.t(ElemType::I32, &[2, 100]))];
    contiguous_frames.sequence_positions = Some(HostIndex { desc: a.t(ElemType::I32, &[2, 4]), values: &frames });
    let e = err(&s, &contiguous_frames);
    assert!(matches!(&e, E::Positions { detail } if detail.contains("varlen")), "{e}");
}

#[test]
fn empty_launches_are_accepted_and_skipped() {
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let bf = ElemType::Bf16;
    let mut d = contiguous(&mut a, &s);
    d.q = a.t(bf, &[2, 0, 8, 128]);
    d.o = a.t(bf, &[2, 0, 8, 128]);
    assert!(check(&s, &d).expect("valid").empty);
    // seqlen_k = 0 is a real launch (o = 0, lse = -inf).
    let mut d = contiguous(&mut a, &s);
    d.k = a.t(bf, &[2, 0, 2, 128]);
    d.v = a.t(bf, &[2, 0, 2, 128]);
    assert!(!check(&s, &d).expect("valid").empty);
}

#[test]
fn every_example_spec_plans_with_its_abi() {
    // Each dsl-example's kernels take only arguments the validator provides.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dsl-examples");
    let Ok(rd) = std::fs::read_dir(&dir) else { return };
    let mut n = 0;
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "attn") {
            continue;
        }
        let Ok(spec) = attnc_dsl::parse_file(&p) else { continue };
        let m =
            attnc_lower::compile(&spec, &attnc_lower::CompileOptions::new(attnc_lower::Arch::Sm90a)).expect("compiles");
        for k in &m.kernels {
            for param in &k.params {
                let (name, ty) = param.split_once(':').unwrap_or((param, ""));
                let known = [
                    "q",
                    "k",
                    "v",
                    "o",
                    "batch",
                    "seqlen_q",
                    "seqlen_k",
                    "num_splits",
                    "lse",
                    "o_partial",
                    "lse_partial",
                    "cu_seqlens_q",
                    "cu_seqlens_k",
                    "block_table",
                    "block_table_stride",
                    "seqused_k",
                    "sinks",
                ]
                .contains(&name)
                    || name.contains("_stride_")
                    || name.starts_with("aux_")
                    || name.starts_with("param_")
                    // Block masks: filled from the `BlockMask` (`block_mask.rs`).
                    || attnc_lower::variant::tiles::BLOCK_LIST_PARAMS.contains(&name)
                    || name == attnc_lower::families::common::block_mask::QUEUE_PARAM
                    || POSITION_PARAMS.contains(&name)
                    || name == SEQUENCE_POSITIONS_PARAM
                    // Filled by the runtime's counter pool (`Runtime::counters`).
                    || name == attnc_lower::families::common::abi::SPLIT_COUNTERS_PARAM
                    || name == attnc_lower::families::common::abi::TILE_COUNTERS_PARAM
                    || (ty == "tensormap" && k.tensor_maps.iter().any(|b| b.param == name));
                assert!(known, "{} ({}): unknown kernel parameter {param}", spec.name, m.family);
            }
        }
        n += 1;
    }
    assert!(n > 0);
}

#[test]
fn runtime_without_driver_is_an_error_not_a_panic() {
    if crate::cuda::driver_present() {
        return; // a machine with a driver: nothing to check here
    }
    match crate::Runtime::new(0) {
        Err(crate::RuntimeError::NoDriver(msg)) => assert!(msg.contains("libcuda"), "{msg}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a runtime without a driver"),
    }
}

#[test]
fn tensor_maps_marshal_in_abi_position() {
    use crate::tma::{plan_tensor_maps, TensorMapArg, TmaBox};
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &s);
    let mut p = check(&s, &d).expect("valid");
    assert_eq!(p.arg("batch"), Some(ArgValue::I32(2)));
    let boxes: Vec<TmaBox> = ["q", "k", "v"]
        .iter()
        .map(|t| TmaBox {
            param: format!("tmap_{t}"),
            tensor: (*t).into(),
            box_cols: 64,
            box_rows: 128,
            swizzle_bytes: 128,
            pack_group: 1,
        })
        .collect();
    p.tensor_maps = plan_tensor_maps(&boxes, &d).expect("encodable");
    assert_eq!(p.tensor_maps.iter().map(|e| e.param.as_str()).collect::<Vec<_>>(), ["tmap_q", "tmap_k", "tmap_v"]);
    assert_eq!(p.tensor_maps[1].dims().0, [128, 100, 2, 2]);
    assert_eq!(p.tensor_maps[1].global_address, d.k.addr);

    // What `run` does after the driver encoded each map: pass them as extra args.
    let fake = |i: u64| ArgValue::TensorMap(TensorMapArg([i; 16]));
    let extra = [("tmap_q", fake(1)), ("tmap_k", fake(2)), ("tmap_v", fake(3))];
    let params: Vec<String> = [
        "tmap_q:tensormap",
        "tmap_k:tensormap",
        "tmap_v:tensormap",
        "o:ptr",
        "o_stride_row:i64",
        "batch:i32",
        "seqlen_k:i32",
    ]
    .map(String::from)
    .to_vec();
    let args = marshal(&params, &p, &extra).expect("marshal");
    assert_eq!(args[..3], [fake(1), fake(2), fake(3)]);
    assert_eq!(args[3], ArgValue::Ptr(d.o.addr));
    assert_eq!(args[5], ArgValue::I32(2));
    assert_eq!(args[6], ArgValue::I32(100));
    // A tensormap param without an encoded map, or typed wrong, is refused.
    assert!(marshal(&params, &p, &[]).unwrap_err().contains("tmap_q"));
    assert!(marshal(&["tmap_q:ptr".into()], &p, &extra).unwrap_err().contains("tmap_q"));
    assert!(marshal(&["q:tensormap".into()], &p, &extra).unwrap_err().contains("`q`"));
}

#[test]
fn tensor_maps_over_varlen_and_their_rejections() {
    use crate::tma::{plan_tensor_maps, TmaBox, TmaRule};
    let bx = |t: &str, rows: u32| TmaBox {
        param: format!("tmap_{t}"),
        tensor: t.into(),
        box_cols: 64,
        box_rows: rows,
        swizzle_bytes: 128,
        pack_group: 1,
    };
    let mut s = spec(KvLayout::Varlen);
    s.lse = true;
    let mut a = Alloc::new();
    let (cq, ck) = ([0, 5, 12], [0, 40, 90]);
    let d = varlen_descs(&mut a, &cq, &ck, 12, 90);
    check(&s, &d).expect("valid");
    let m = plan_tensor_maps(&[bx("q", 128), bx("k", 128), bx("o", 128)], &d).expect("encodable");
    assert_eq!(m[0].dims().0, [128, 12, 8, 1]);
    assert_eq!(m[1].dims().0, [128, 90, 2, 1]);
    assert_eq!(m[2].global_address, d.o.addr);
    // Box rows over 256: a typed error naming the tensor and the map.
    match plan_tensor_maps(&[bx("k", 512)], &d) {
        Err(crate::RuntimeError::Validation(E::TensorMap {
            arg, param, rule: TmaRule::BoxDim, value: 512, ..
        })) => {
            assert_eq!((arg.as_str(), param.as_str()), ("k", "tmap_k"))
        }
        other => panic!("{other:?}"),
    }
    // A box over an unknown tensor is an ABI error.
    assert!(matches!(plan_tensor_maps(&[bx("lse", 128)], &d), Err(crate::RuntimeError::Abi(_))));
}

#[test]
fn the_sm90a_auto_family_marshals_with_its_tensor_maps() {
    // Whatever family auto compiles on sm_90a (hopper once it lands, with tensor maps),
    // its forward kernel marshals completely from a plan plus the encoded maps.
    use crate::tma::{plan_tensor_maps, TensorMapArg};
    let s = spec(KvLayout::Contiguous);
    let m = attnc_lower::compile(&s, &attnc_lower::CompileOptions::new(attnc_lower::Arch::Sm90a)).expect("compiles");
    let fwd = m.kernel(attnc_lower::KernelRole::Forward).expect("fwd");
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &s);
    let mut p = check(&s, &d).expect("valid");
    p.tensor_maps = plan_tensor_maps(&fwd.tensor_maps, &d).expect("encodable");
    let n_maps = fwd.params.iter().filter(|p| p.ends_with(":tensormap")).count();
    assert_eq!(p.tensor_maps.len(), n_maps, "{}: one box per tensormap parameter", m.family);
    // As `Kernel::run` adds them (the counters from the runtime's pool).
    let mut extra = vec![
        ("o_partial", ArgValue::Ptr(0)),
        ("lse_partial", ArgValue::Ptr(0)),
        (attnc_lower::families::common::abi::TILE_COUNTERS_PARAM, ArgValue::Ptr(0x4000)),
    ];
    for (i, e) in p.tensor_maps.iter().enumerate() {
        extra.push((e.param.as_str(), ArgValue::TensorMap(TensorMapArg([i as u64 + 1; 16]))));
    }
    let args = marshal(&fwd.params, &p, &extra).expect("marshal");
    assert_eq!(args.len(), fwd.params.len());
    for (param, arg) in fwd.params.iter().zip(&args) {
        assert_eq!(param.ends_with(":tensormap"), matches!(arg, ArgValue::TensorMap(_)), "{param}");
    }
}

#[test]
fn a_persistent_kernel_gets_one_cta_per_slot_at_most() {
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &s);
    let tile_grid = plan(&s, &KS, 132, 0, &d).expect("valid").fwd_grid;
    let tiles = tile_grid.iter().map(|&x| u64::from(x)).product::<u64>();
    let ks = KernelShape { persistent: true, ..KS };
    let p = plan(&s, &ks, 132, 0, &d).expect("valid");
    assert_eq!(p.fwd_grid, [tiles.min(132) as u32, 1, 1]);
    assert_eq!(p.counters, 2, "the dynamic scheduler's tile counters");
    // More slots than tiles: one CTA per tile.
    let p = plan(&s, &KernelShape { ctas_per_sm: 1000, ..ks }, 132, 0, &d).expect("valid");
    assert_eq!(p.fwd_grid, [tiles as u32, 1, 1]);
}

/// Marshals `fwd`'s arguments for plan `p` with a placeholder for each tensor map the
/// plan encodes (the driver encodes real ones at launch), plus `extra`; every parameter
/// must be filled.
fn marshal_with_placeholder_maps<'a>(
    fwd: &attnc_lower::KernelInfo,
    p: &'a LaunchPlan,
    mut extra: Vec<(&'a str, ArgValue)>,
) -> Vec<ArgValue> {
    for (i, e) in p.tensor_maps.iter().enumerate() {
        extra.push((e.param.as_str(), ArgValue::TensorMap(crate::tma::TensorMapArg([i as u64 + 1; 16]))));
    }
    let args = marshal(&fwd.params, p, &extra).expect("marshal");
    assert_eq!(args.len(), fwd.params.len());
    args
}

/// `s` compiled by an explicit blackwell request (sm_100a), and the module metadata
/// the runtime would cache for it.
fn blackwell_module(s: &Spec) -> (attnc_lower::CompiledModule, crate::jit::ModuleMeta) {
    use attnc_lower::{Arch, CompileOptions, FamilyChoice, FamilyKind};
    let opts = CompileOptions::new(Arch::Sm100a).family(FamilyChoice::Exactly(FamilyKind::Blackwell));
    let m = attnc_lower::compile(s, &opts).unwrap_or_else(|e| panic!("blackwell compiles {}: {e}", s.name));
    let meta = crate::jit::ModuleMeta {
        requested: "blackwell".into(),
        family: "blackwell".into(),
        direction: attnc_lower::Direction::Forward,
        arch: "sm_100a".into(),
        fallback_reason: None,
        kernels: m.kernels.iter().map(crate::jit::KernelMeta::from).collect(),
        compiler: String::new(),
    };
    (m, meta)
}

#[test]
fn the_blackwell_forward_marshals_and_plans_a_persistent_grid() {
    // The launch path of an explicit `--family blackwell` on a B200, without one: its
    // forward kernel marshals completely (rank-4 maps for Q, K, V and the O store,
    // `batch`) and plans a persistent grid.
    use crate::tma::plan_tensor_maps;
    let s = spec(KvLayout::Contiguous);
    let (m, meta) = blackwell_module(&s);
    let fwd = m.kernel(attnc_lower::KernelRole::Forward).expect("fwd");
    assert_eq!(fwd.grid, attnc_lower::Grid::Persistent);
    assert_eq!(fwd.tensor_maps.iter().map(|b| b.tensor.as_str()).collect::<Vec<_>>(), ["q", "k", "v", "o"]);
    // The runtime finds it as the forward kernel, and no combine kernel.
    assert_eq!(meta.forward().map(|k| k.name.as_str()), Some(fwd.name.as_str()));
    assert!(meta.combine().is_none());
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &s);
    let ks = KernelShape {
        block_m: fwd.block_m,
        block_n: fwd.block_n,
        combine: CombineKind::None,
        ctas_per_sm: 1,
        persistent: fwd.grid == attnc_lower::Grid::Persistent,
    };
    let mut p = plan(&s, &ks, 148, 0, &d).expect("valid");
    assert_eq!((p.fwd_grid[1], p.fwd_grid[2]), (1, 1));
    assert!(p.fwd_grid[0] >= 1 && p.fwd_grid[0] <= 148);
    p.tensor_maps = plan_tensor_maps(&fwd.tensor_maps, &d).expect("encodable");
    marshal_with_placeholder_maps(fwd, &p, Vec::new());
}

#[test]
fn the_blackwell_pack_gqa_q_map_is_rank_5() {
    use crate::tma::plan_tensor_maps;
    let mut s = spec(KvLayout::Contiguous);
    s.pack_gqa = true;
    let (m, _) = blackwell_module(&s);
    let fwd = m.kernel(attnc_lower::KernelRole::Forward).expect("fwd");
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &s);
    let maps = plan_tensor_maps(&fwd.tensor_maps, &d).expect("encodable");
    let g = s.group_size() as u64;
    // Q loads and O stores go through packed rank-5 boxes; K and V are rank 4.
    for t in ["q", "o"] {
        let m = maps.iter().find(|e| e.tensor == t).expect("map");
        assert_eq!(m.rank, 5, "{t}");
        assert_eq!(m.dims().0[1], g, "{t}: the second dim is the pack group");
    }
    assert!(maps.iter().filter(|e| e.tensor == "k" || e.tensor == "v").all(|e| e.rank == 4));
}

#[test]
fn the_blackwell_paged_split_forward_marshals_with_page_boxes() {
    // Paged KV (16-key pages) with split-KV on blackwell: K/V maps over the cache
    // `{d, page_size, kv_heads, num_pages}` with one 16-row box per page, and every
    // parameter (block table, seqused_k, split workspace) marshals; the module brings
    // the combine kernel.
    use crate::tma::plan_tensor_maps;
    let mut s = spec(KvLayout::Paged { page_size: 16 });
    s.split_kv = SplitKv::Fixed(2);
    let (m, meta) = blackwell_module(&s);
    let fwd = m.kernel(attnc_lower::KernelRole::Forward).expect("fwd");
    let combine_bm = meta.combine().map(|c| c.block_m).expect("a combine kernel");
    let mut a = Alloc::new();
    let bt = [4, 0, 2, 1, -1, -1];
    let su = [40, 16];
    let d = paged_descs(&mut a, &bt, &su, 2, 5, 16);
    let ks = KernelShape {
        block_m: fwd.block_m,
        block_n: fwd.block_n,
        combine: CombineKind::Kernel { block_m: combine_bm },
        ctas_per_sm: 1,
        persistent: fwd.grid == attnc_lower::Grid::Persistent,
    };
    let mut p = plan(&s, &ks, 148, 0, &d).expect("valid");
    assert_eq!(p.num_splits, 2);
    assert!(p.combine_grid.is_some());
    p.tensor_maps = plan_tensor_maps(&fwd.tensor_maps, &d).expect("encodable");
    for t in ["k", "v"] {
        let e = p.tensor_maps.iter().find(|e| e.tensor == t).expect("map");
        let (dims, strides, boxes) = e.dims();
        assert_eq!(dims, [128, 16, 2, 5], "{t}: d, page_size, kv_heads, num_pages");
        assert_eq!(strides, [2 * 128 * 2, 128 * 2, 16 * 2 * 128 * 2], "{t}: row, head, page strides (bytes)");
        assert_eq!(boxes, [64, 16, 1, 1]);
    }
    marshal_with_placeholder_maps(
        fwd,
        &p,
        vec![("o_partial", ArgValue::Ptr(0x1000)), ("lse_partial", ArgValue::Ptr(0x2000))],
    );
}

#[test]
fn the_hopper_paged_forward_marshals_with_page_boxes() {
    // Paged KV on hopper (sm_90a, auto): 16-key pages load by TMA with a 16-row box per
    // page over the cache `{d, page_size, kv_heads, num_pages}`, 128-key pages with one
    // 128-row box inside the page; page 1 gathers (no K/V maps, the cache pointers
    // instead). Every parameter marshals (block table, seqused_k, the fused combine's
    // counters, the split workspace).
    use crate::tma::plan_tensor_maps;
    let opts = attnc_lower::CompileOptions::new(attnc_lower::Arch::Sm90a);
    for (page, box_rows) in [(16usize, Some(16u32)), (128, Some(128)), (1, None)] {
        let mut s = spec(KvLayout::Paged { page_size: page as u32 });
        s.split_kv = SplitKv::Fixed(2);
        let m = attnc_lower::compile(&s, &opts).expect("compiles");
        assert_eq!(m.family, attnc_lower::FamilyKind::Hopper, "page {page}");
        let fwd = m.kernel(attnc_lower::KernelRole::Forward).expect("fwd");
        let mut a = Alloc::new();
        let pages = 48usize.div_ceil(page) + 2;
        let per = 48usize.div_ceil(page);
        let bt: Vec<i32> = (0..2 * per).map(|i| ((i * 7 + 3) % pages) as i32).collect();
        let su = [48, 33];
        let d = paged_descs(&mut a, &bt, &su, 2, pages, page);
        let ks = KernelShape {
            block_m: fwd.block_m,
            block_n: fwd.block_n,
            combine: CombineKind::Fused,
            ctas_per_sm: 1,
            persistent: false,
        };
        let mut p = plan(&s, &ks, 132, 0, &d).expect("valid");
        p.tensor_maps = plan_tensor_maps(&fwd.tensor_maps, &d).expect("encodable");
        match box_rows {
            Some(rows) => {
                for t in ["k", "v"] {
                    let e = p.tensor_maps.iter().find(|e| e.tensor == t).expect("map");
                    let (dims, _, boxes) = e.dims();
                    assert_eq!(dims, [128, page as u64, 2, pages as u64], "page {page} {t}");
                    assert_eq!(boxes, [64, rows, 1, 1], "page {page} {t}");
                }
            }
            None => assert!(p.tensor_maps.iter().all(|e| e.tensor != "k" && e.tensor != "v"), "page 1 gathers"),
        }
        let extra = vec![
            ("o_partial", ArgValue::Ptr(0x1000)),
            ("lse_partial", ArgValue::Ptr(0x2000)),
            (attnc_lower::families::common::abi::SPLIT_COUNTERS_PARAM, ArgValue::Ptr(0x3000)),
        ];
        marshal_with_placeholder_maps(fwd, &p, extra);
    }
}

#[test]
fn the_blackwell_row_gather_marshals_pointers_and_one_map() {
    // 3-key pages: no TMA box can follow them, so blackwell gathers rows; the forward
    // kernel takes Q's map and K/V as pointers with strides, all of which marshal.
    use crate::tma::plan_tensor_maps;
    let s = spec(KvLayout::Paged { page_size: 3 });
    let (m, _) = blackwell_module(&s);
    let fwd = m.kernel(attnc_lower::KernelRole::Forward).expect("fwd");
    assert_eq!(fwd.tensor_maps.iter().map(|b| b.tensor.as_str()).collect::<Vec<_>>(), ["q", "o"]);
    let mut a = Alloc::new();
    let bt = [4, 0, 2, 1, -1, -1];
    let su = [7, 3];
    let d = paged_descs(&mut a, &bt, &su, 2, 5, 3);
    let ks = KernelShape {
        block_m: fwd.block_m,
        block_n: fwd.block_n,
        combine: CombineKind::None,
        ctas_per_sm: 1,
        persistent: fwd.grid == attnc_lower::Grid::Persistent,
    };
    let mut p = plan(&s, &ks, 148, 0, &d).expect("valid");
    p.tensor_maps = plan_tensor_maps(&fwd.tensor_maps, &d).expect("encodable");
    assert_eq!(p.tensor_maps.len(), 2);
    marshal_with_placeholder_maps(fwd, &p, Vec::new());
    assert!(fwd.params.iter().any(|x| x == "k_stride_row:i64"));
}

/// Host cost of validating one launch (run with `--ignored --nocapture`; a measurement,
/// not a check).
#[test]
#[ignore]
fn plan_cost() {
    let s = spec(KvLayout::Contiguous);
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &s);
    let n = 20000;
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(check(&s, std::hint::black_box(&d)).unwrap());
    }
    println!("plan: {:.2} us", t0.elapsed().as_secs_f64() / n as f64 * 1e6);

    // The hopper forward's marshalling of the same launch (tensor maps faked).
    let mut hs = s.clone();
    hs.kv_heads = 8;
    let mut a = Alloc::new();
    let d = contiguous(&mut a, &Spec { kv_heads: 2, ..hs.clone() });
    let m =
        attnc_lower::compile(&Spec { kv_heads: 2, ..hs }, &attnc_lower::CompileOptions::new(attnc_lower::Arch::Sm90a))
            .expect("compiles");
    let fwd = m.kernels.iter().find(|k| k.role == attnc_lower::KernelRole::Forward).expect("forward");
    let p = check(&s, &d).unwrap();
    let map = ArgValue::TensorMap(crate::tensor_map::TensorMapArg([0; 16]));
    let mut extra: Vec<(&str, ArgValue)> = fwd.tensor_maps.iter().map(|t| (t.param.as_str(), map)).collect();
    extra.extend([("o_partial", ArgValue::Ptr(0)), ("lse_partial", ArgValue::Ptr(0))]);
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(marshal(&fwd.params, &p, &extra).unwrap());
    }
    println!("marshal ({} params): {:.2} us", fwd.params.len(), t0.elapsed().as_secs_f64() / n as f64 * 1e6);
}
