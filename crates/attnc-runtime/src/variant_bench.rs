//! `attnc bench FILE.attn`: the forward of any variant at a chosen shape, beside the
//! protocol's fixed suites. Reports the median time, the density of allowed pairs
//! (exact, from `attnc_ir::block_mask::allowed_pairs`), and effective TFLOP/s over the
//! allowed pairs; for masks that take a block mask, the time with the mask built once
//! and passed in, the time with it built per call, and the classification alone.
//!
//! Inputs: Q, K, V ~ N(0, 1) on the device; params by value; int aux tensors filled
//! deterministically with "documents" (ascending ids along the last dimension, runs of
//! `doc_len` tokens, drawn per leading index), float aux tensors ~ N(0, 0.25); or any aux
//! tensor from a file (raw little-endian i32 or f32, row-major, exactly its elements).

use crate::bench::{time_gpu, time_gpu_queued, Helpers, TimeStats};
use crate::error::RuntimeError;
use crate::params::Params;
use crate::receipt::Receipt;
use crate::runtime::Runtime;
use crate::tensor::{ElemType, Tensor};
use crate::validate::ParamValue;
use attnc_ir::block_mask::{allowed_pairs, LaunchData, Tiling};
use attnc_ir::eval::{AuxTensor, Value};
use attnc_ir::reference::{resolve_aux_dims, Rng};
use attnc_ir::{AuxElem, KvLayout, Spec, Ty};
use attnc_lower::FamilyChoice;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct VariantBenchOptions {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub params: Vec<(String, ParamValue)>,
    /// Aux tensors read from files instead of the deterministic fill.
    pub aux_files: Vec<(String, PathBuf)>,
    /// Document lengths of the int aux fill, inclusive.
    pub doc_len: (usize, usize),
    pub family: FamilyChoice,
    pub warmup: usize,
    pub iters: usize,
    pub seed: u64,
}

impl Default for VariantBenchOptions {
    fn default() -> Self {
        VariantBenchOptions {
            batch: 4,
            seqlen_q: 8192,
            seqlen_k: 8192,
            params: Vec::new(),
            aux_files: Vec::new(),
            doc_len: (256, 2816),
            family: FamilyChoice::Auto,
            warmup: 5,
            iters: 25,
            seed: 0x5eed,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct VariantBenchResult {
    pub spec: String,
    pub family: String,
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim_qk: u32,
    pub head_dim_v: u32,
    /// Allowed (query, key) pairs over all batch entries and query heads.
    pub allowed_pairs: u64,
    /// `allowed_pairs` over all pairs.
    pub density: f64,
    /// The forward (with the block mask passed in, when the spec takes one).
    pub time: TimeStats,
    /// `2 · allowed_pairs · (d_qk + d_v)` over the median time.
    pub effective_tflops: f64,
    /// Specs with a block mask: the forward building the mask per call.
    pub time_per_call: Option<TimeStats>,
    /// Specs with a block mask: building one on its own (allocation and classifier).
    pub classify: Option<TimeStats>,
    /// Specs with a block mask: the classification's GPU time alone (its kernels into a
    /// built mask, queued behind a spin kernel, so no host time or allocation counts).
    pub classify_gpu: Option<TimeStats>,
    pub live_fraction: Option<f64>,
    pub receipt: Receipt,
    /// Variants that train: the backward (dQ, dK, dV from the forward's O and LSE and a
    /// random dO; with the forward's block mask passed in, when it takes one), and
    /// effective TFLOP/s at 2.5 × the forward's FLOPs.
    pub backward: Option<TimeStats>,
    /// Specs with a block mask: the backward classifying per call.
    pub backward_per_call: Option<TimeStats>,
    pub backward_effective_tflops: Option<f64>,
    pub backward_receipt: Option<Receipt>,
}

/// Host copies of the aux tensors a launch reads, and the device tensors by name.
type AuxPair = (Vec<AuxTensor>, Vec<(String, Tensor)>);

/// Host copies of the aux tensors the launch reads, and the device tensors.
fn aux_tensors(rt: &Runtime, spec: &Spec, opts: &VariantBenchOptions) -> Result<AuxPair, RuntimeError> {
    let seqlens = vec![(opts.seqlen_q, opts.seqlen_k); opts.batch];
    let mut rng = Rng::new(opts.seed);
    let (mut host, mut dev) = (Vec::new(), Vec::new());
    for decl in &spec.aux {
        let dims = resolve_aux_dims(spec, &decl.dims, &seqlens);
        let n: usize = dims.iter().product();
        let file = opts.aux_files.iter().find(|(name, _)| *name == decl.name).map(|(_, p)| p);
        let t = match (file, decl.elem) {
            (Some(p), elem) => {
                let bytes = std::fs::read(p).map_err(|e| {
                    RuntimeError::Other(format!("--aux {}={}: cannot read: {e}", decl.name, p.display()))
                })?;
                if bytes.len() != 4 * n {
                    return Err(RuntimeError::Other(format!(
                        "--aux {}={}: {} bytes, the tensor {:?} needs {} (4-byte elements)",
                        decl.name,
                        p.display(),
                        bytes.len(),
                        dims,
                        4 * n
                    )));
                }
                let words = bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
                match elem {
                    AuxElem::Int => AuxTensor::int(dims.clone(), words.map(i32::from_le_bytes).collect()),
                    AuxElem::Float => {
                        AuxTensor::float(dims.clone(), words.map(|w| f64::from(f32::from_le_bytes(w))).collect())
                    }
                }
            }
            (None, AuxElem::Int) => {
                let last = dims.last().copied().unwrap_or(1).max(1);
                let (lo, hi) = (opts.doc_len.0.max(1) as i64, opts.doc_len.1.max(opts.doc_len.0.max(1)) as i64);
                let mut data = Vec::with_capacity(n);
                let (mut id, mut left) = (0i32, 0i64);
                for x in 0..n {
                    if x % last == 0 {
                        id = 0;
                        left = rng.int_in(lo, hi);
                    } else if left == 0 {
                        id += 1;
                        left = rng.int_in(lo, hi);
                    }
                    data.push(id);
                    left -= 1;
                }
                AuxTensor::int(dims.clone(), data)
            }
            (None, AuxElem::Float) => {
                AuxTensor::float(dims.clone(), (0..n).map(|_| (0.5 * rng.normal()) as f32 as f64).collect())
            }
        };
        let d = match &t.data {
            attnc_ir::AuxData::Int(v) => rt.upload(v, &dims)?,
            attnc_ir::AuxData::Float(v) => rt.upload(&v.iter().map(|&x| x as f32).collect::<Vec<_>>(), &dims)?,
        };
        host.push(t);
        dev.push((decl.name.clone(), d));
    }
    Ok((host, dev))
}

/// Benchmarks the forward of `spec` (contiguous layout) at the options' shape.
pub fn bench_variant(
    rt: &Runtime,
    spec: &Spec,
    opts: &VariantBenchOptions,
) -> Result<VariantBenchResult, RuntimeError> {
    if spec.kv_layout != KvLayout::Contiguous {
        return Err(RuntimeError::Other(format!(
            "attnc bench FILE times contiguous layouts; `{}` is {:?} (the selftest covers it)",
            spec.name, spec.kv_layout
        )));
    }
    for p in &spec.params {
        if !opts.params.iter().any(|(n, _)| *n == p.name) {
            return Err(RuntimeError::Other(format!(
                "the spec declares param `{}` ({}): give its value with --param {}=VALUE",
                p.name,
                if p.ty == Ty::Float { "float" } else { "int" },
                p.name
            )));
        }
    }
    let kernel = rt.kernel_with(spec, opts.family)?;
    let (b, sq, sk) = (opts.batch, opts.seqlen_q, opts.seqlen_k);
    let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let dtype = match spec.dtype {
        attnc_ir::DType::Bf16 => ElemType::Bf16,
        attnc_ir::DType::Fp16 => ElemType::F16,
    };
    let h = Helpers::load(rt.gpu())?;
    let q = rt.alloc(dtype, &[b, sq, qh, dqk])?;
    let k = rt.alloc(dtype, &[b, sk, kvh, dqk])?;
    let v = rt.alloc(dtype, &[b, sk, kvh, dv])?;
    let mut o = rt.alloc(dtype, &[b, sq, qh, dv])?;
    h.fill_normal(rt, &q, opts.seed, 1.0)?;
    h.fill_normal(rt, &k, opts.seed + 1, 1.0)?;
    h.fill_normal(rt, &v, opts.seed + 2, 1.0)?;
    let lse = if spec.lse { Some(rt.alloc(ElemType::F32, &[b, qh, sq])?) } else { None };
    let (aux_host, aux_dev) = aux_tensors(rt, spec, opts)?;
    let mut params = Params::default();
    for (n, val) in &opts.params {
        params.values.push((n.clone(), *val));
    }
    for (n, t) in &aux_dev {
        params = params.aux(n, t);
    }
    // The output's view for building block masks (the closure below holds `o` mutably).
    let o_view = o.clone();
    let mut run = |p: &Params| -> Result<Receipt, RuntimeError> {
        match &lse {
            Some(l) => {
                let mut l = l.clone();
                kernel.forward_lse(&q, &k, &v, &mut o, &mut l, p)
            }
            None => kernel.forward(&q, &k, &v, &mut o, p),
        }
    };
    // The receipt of one timed call (it says whether a block mask ran and its live share).
    let receipt = run(&Params { timing: true, ..params.clone() })?;
    let takes_mask = receipt.block_mask.is_some();
    let gpu = rt.gpu();
    let mask = if takes_mask { Some(kernel.block_mask(&q, &k, &v, &o_view, &params)?) } else { None };
    let (time, time_per_call, classify, classify_gpu, live_fraction) = if let Some(mask) = &mask {
        let live = kernel.block_mask_live_fraction(mask)?;
        let with_mask = Params { block_mask: Some(mask), ..params.clone() };
        let t = time_gpu(gpu, opts.warmup, opts.iters, || run(&with_mask).map(|_| ()))?;
        let per_call = time_gpu(gpu, opts.warmup, opts.iters, || run(&params).map(|_| ()))?;
        let classify =
            time_gpu(gpu, opts.warmup, opts.iters, || kernel.block_mask(&q, &k, &v, &o_view, &params).map(|_| ()))?;
        let classify_gpu = time_gpu_queued(gpu, &h, opts.warmup, opts.iters, || {
            kernel.reclassify(mask, &q, &k, &v, &o_view, &params)
        })?;
        (t, Some(per_call), Some(classify), Some(classify_gpu), Some(live))
    } else {
        (time_gpu(gpu, opts.warmup, opts.iters, || run(&params).map(|_| ()))?, None, None, None, None)
    };

    // The backward, for variants that train (learnable aux gradients included).
    let trains = attnc_lower::compile::pass_unsupported_reason(spec, attnc_lower::Direction::Backward).is_none();
    let (backward, backward_per_call, backward_receipt) = if trains {
        let mut lse = rt.alloc(ElemType::F32, &[b, qh, sq])?;
        let mut o2 = rt.alloc(dtype, &[b, sq, qh, dv])?;
        kernel.forward_lse(&q, &k, &v, &mut o2, &mut lse, &params)?;
        let d_out = rt.alloc(dtype, &[b, sq, qh, dv])?;
        h.fill_normal(rt, &d_out, opts.seed + 3, 1.0)?;
        let (mut dq, mut dk, mut dvt) = (
            rt.alloc(dtype, &[b, sq, qh, dqk])?,
            rt.alloc(dtype, &[b, sk, kvh, dqk])?,
            rt.alloc(dtype, &[b, sk, kvh, dv])?,
        );
        let mut aux_grads = Vec::new();
        for a in spec.aux.iter().filter(|a| a.learnable) {
            let t = aux_dev.iter().find(|(n, _)| *n == a.name).map(|(_, t)| t.shape().to_vec()).unwrap_or_default();
            aux_grads.push((a.name.clone(), rt.alloc(ElemType::F32, &t)?));
        }
        let sinks_grad = if spec.sinks { Some(rt.alloc(ElemType::F32, &[qh])?) } else { None };
        let mut bp = params.clone();
        for (n, t) in &aux_grads {
            bp = bp.aux_grad(n, t);
        }
        if let Some(t) = &sinks_grad {
            bp = bp.dsinks(t);
        }
        let mut go = |p: &Params| {
            let g = crate::backward::Gradients { dq: &mut dq, dk: &mut dk, dv: &mut dvt };
            kernel.backward(&q, &k, &v, &o2, &lse, &d_out, g, p)
        };
        // With a block mask: passed in (its backward classes built by the first call, as
        // in a training step's first layer), and classified per call.
        let per_call = match &mask {
            Some(_) => Some(time_gpu(gpu, opts.warmup, opts.iters, || go(&bp).map(|_| ()))?),
            None => None,
        };
        let bp = Params { block_mask: mask.as_ref(), ..bp };
        let r = go(&Params { timing: true, ..bp.clone() })?;
        let t = time_gpu(gpu, opts.warmup, opts.iters, || go(&bp).map(|_| ()))?;
        (Some(t), per_call, Some(r))
    } else {
        (None, None, None)
    };

    let seqlens = vec![(sq, sk); b];
    let values: Vec<Value> = spec
        .params
        .iter()
        .map(|p| match opts.params.iter().find(|(n, _)| *n == p.name).map(|x| x.1) {
            Some(ParamValue::Int(i)) => Value::Int(i),
            Some(ParamValue::Float(f)) => Value::Float(f64::from(f)),
            None => Value::Int(0),
        })
        .collect();
    let data = LaunchData { seqlens: &seqlens, params: &values, aux: &aux_host, positions: &[] };
    let pairs = allowed_pairs(spec, Tiling { block_m: 128, block_n: 128, pack_gqa: false }, &data);
    let all = (b * sq * sk * qh) as f64;
    let flops = 2.0 * pairs as f64 * (dqk + dv) as f64;
    Ok(VariantBenchResult {
        spec: spec.name.clone(),
        family: receipt.executed.clone(),
        batch: b,
        seqlen_q: sq,
        seqlen_k: sk,
        q_heads: spec.q_heads,
        kv_heads: spec.kv_heads,
        head_dim_qk: spec.head_dim_qk,
        head_dim_v: spec.head_dim_v,
        allowed_pairs: pairs,
        density: if all > 0.0 { pairs as f64 / all } else { 0.0 },
        effective_tflops: flops / (time.median_ms * 1e-3) / 1e12,
        backward_effective_tflops: backward.map(|t| 2.5 * flops / (t.median_ms * 1e-3) / 1e12),
        backward,
        backward_per_call,
        backward_receipt,
        time,
        time_per_call,
        classify,
        classify_gpu,
        live_fraction,
        receipt,
    })
}

impl VariantBenchResult {
    pub fn line(&self) -> String {
        let mut s = format!(
            "{} [{}] b{} {}x{} h{}/{} d{}/{}: {:.4} ms, density {:.4}, {:.1} effective TFLOP/s",
            self.spec,
            self.family,
            self.batch,
            self.seqlen_q,
            self.seqlen_k,
            self.q_heads,
            self.kv_heads,
            self.head_dim_qk,
            self.head_dim_v,
            self.time.median_ms,
            self.density,
            self.effective_tflops
        );
        if let (Some(t), Some(f)) = (&self.backward, self.backward_effective_tflops) {
            s.push_str(&format!("; backward {:.4} ms, {f:.1} effective TFLOP/s", t.median_ms));
            if let Some(p) = &self.backward_per_call {
                s.push_str(&format!(" (classified per call {:.4} ms)", p.median_ms));
            }
        }
        if let (Some(p), Some(c), Some(l)) = (&self.time_per_call, &self.classify, self.live_fraction) {
            s.push_str(&format!(
                "; block mask: {:.1}% tiles live, built per call {:.4} ms, classification alone {:.4} ms",
                100.0 * l,
                p.median_ms,
                c.median_ms
            ));
            if let Some(g) = &self.classify_gpu {
                s.push_str(&format!(
                    " (GPU time {:.4} ms, {:.1}% of the forward)",
                    g.median_ms,
                    100.0 * g.median_ms / self.time.median_ms
                ));
            }
        }
        s
    }
}
