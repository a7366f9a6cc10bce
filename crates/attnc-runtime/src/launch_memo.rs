//! The last forward launch of a kernel, remembered: a call whose arguments are exactly the
//! last call's (every descriptor field, address included, every index value, param, aux
//! tensor, split count, stream and workspace) skips validation, tensor-map encoding,
//! marshalling and the receipt's assembly, and launches the arguments it launched then.
//! Inference and training loops repeat their calls: PyTorch's caching allocator hands the
//! same addresses back for the same shapes, so most calls of a loop hit.
//!
//! Sound by construction: the launch is a pure function of what the signature holds (the
//! spec and module are the kernel's own), so equal signatures mean equal launches. Calls
//! the memo does not serve: timed ones, and those whose mask needs tile lists classified
//! per call. A caller's block mask is part of the signature by identity: its lists are
//! fixed once built, so the same mask in the same launch passed its check before.
//!
//! The backward has its twin ([`BackwardMemo`]): a training loop repeats its backward calls
//! as it repeats its forwards, and a backward's host path (validation, plan, four tensor
//! maps, the module's kernels' arguments) is what the GPU waits for before the preprocess starts.

use crate::cuda::{ArgSlots, Stream};
use crate::params::Params;
use crate::receipt::Receipt;
use crate::tensor::Tensor;
use crate::validate::ParamValue;
use std::sync::Arc;

/// Everything a forward launch depends on: words (names as their bytes) and the values of
/// the index tensors. Those are held, not copied: a page table can hold millions of
/// entries, and an index tensor's values never change (`IndexTensor` shares them
/// immutably), so the same shared values compare equal without being read, and only
/// distinct ones (a caller that rebuilds its tables per call) compare element-wise.
#[derive(Clone, Debug, Default)]
pub(crate) struct LaunchSignature(Vec<u64>, Vec<Arc<Vec<i32>>>);

impl PartialEq for LaunchSignature {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
            && self.1.len() == other.1.len()
            && self.1.iter().zip(&other.1).all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
    }
}
impl Eq for LaunchSignature {}

impl LaunchSignature {
    pub(crate) fn of(q: &Tensor, k: &Tensor, v: &Tensor, o: &Tensor, lse: Option<&Tensor>, p: &Params) -> Self {
        let mut s = LaunchSignature(Vec::with_capacity(96), Vec::new());
        for t in [q, k, v, o] {
            s.tensor(t);
        }
        s.opt_tensor(lse);
        s.opt_tensor(p.sinks);
        s.opt_tensor(p.workspace);
        for ix in [p.cu_seqlens_q, p.cu_seqlens_k, p.block_table, p.seqused_k] {
            match ix {
                Some(ix) => {
                    s.0.push(1);
                    s.tensor(ix.tensor());
                    s.1.push(Arc::clone(ix.host_shared()));
                }
                None => s.0.push(0),
            }
        }
        s.0.push(p.aux.len() as u64);
        for (name, t) in &p.aux {
            s.name(name);
            s.tensor(t);
        }
        s.0.push(p.values.len() as u64);
        for (name, v) in &p.values {
            s.name(name);
            s.0.push(match *v {
                ParamValue::Int(i) => (1 << 32) | i as u32 as u64,
                ParamValue::Float(f) => (2 << 32) | f.to_bits() as u64,
            });
        }
        match p.positions {
            Some(sp) => {
                s.0.push(1);
                s.0.extend([sp.q_offset, sp.k_offset, sp.seqlen_q, sp.seqlen_k].map(|x| x as u64));
                s.0.push(u64::from(sp.sinks));
            }
            None => s.0.push(0),
        }
        match p.sequence_positions {
            Some((t, sink)) => {
                s.0.push(1);
                s.tensor(t.tensor());
                s.1.push(Arc::clone(t.host_shared()));
                s.0.push(u64::from(sink));
            }
            None => s.0.push(0),
        }
        // A caller's block mask, by identity (its lists are fixed once built).
        s.0.push(p.block_mask.map_or(0, |m| m.id));
        s.0.push(p.num_splits.map_or(0, |n| 1 + n as u64));
        s.0.push(p.stream.map_or(0, |st: Stream| 1 + st.handle() as u64));
        s
    }

    /// A backward launch's signature: the forward's (with the LSE), then the output
    /// gradient, the gradients written, and the accumulation mode.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn of_backward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        grads: [&Tensor; 3],
        p: &Params,
    ) -> Self {
        let mut s = LaunchSignature::of(q, k, v, o, Some(lse), p);
        s.tensor(d_out);
        for g in grads {
            s.tensor(g);
        }
        s.opt_tensor(p.dsinks);
        s.0.push(p.aux_grads.len() as u64);
        for (name, t) in &p.aux_grads {
            s.name(name);
            s.tensor(t);
        }
        s.0.push(u64::from(p.deterministic));
        s
    }

    /// A view's words, read in place (no descriptor copy: this runs on every launch).
    fn tensor(&mut self, t: &Tensor) {
        let shape = t.shape();
        self.0.extend([t.dtype() as u64, t.device() as u64, t.device_ptr(), t.capacity(), shape.len() as u64]);
        self.0.extend(shape.iter().map(|&x| x as u64));
        self.0.extend(t.strides().iter().map(|&x| x as u64));
    }

    fn opt_tensor(&mut self, t: Option<&Tensor>) {
        match t {
            Some(t) => {
                self.0.push(1);
                self.tensor(t);
            }
            None => self.0.push(0),
        }
    }

    fn name(&mut self, n: &str) {
        self.0.push(n.len() as u64);
        self.0.extend(n.as_bytes().chunks(8).map(|c| c.iter().fold(0u64, |a, &b| (a << 8) | b as u64)));
    }
}

/// A remembered launch: what it took and what it queued.
#[derive(Clone, Debug)]
pub(crate) struct LaunchMemo {
    pub(crate) signature: LaunchSignature,
    /// The workspace it used: its size, and its address (a hit needs the same one).
    pub(crate) ws_bytes: usize,
    pub(crate) ws_ptr: u64,
    /// The fused combine's counters: how many, and where (a hit needs the same ones).
    pub(crate) counters: usize,
    pub(crate) counters_ptr: u64,
    /// The launches' arguments, packed once.
    pub(crate) fwd_args: ArgSlots,
    pub(crate) combine_args: Option<ArgSlots>,
    pub(crate) receipt: Arc<Receipt>,
}

/// A remembered backward launch: the workspace it used, what it zeroed and what it launched,
/// in order.
#[derive(Clone, Debug)]
pub(crate) struct BackwardMemo {
    pub(crate) signature: LaunchSignature,
    pub(crate) ws_bytes: usize,
    pub(crate) ws_ptr: u64,
    /// `(address, words)` filled with 0 before the kernels.
    pub(crate) memsets: Vec<(u64, usize)>,
    pub(crate) launches: Vec<QueuedLaunch>,
    pub(crate) receipt: Receipt,
}

/// One kernel launch of a remembered call, its arguments packed once.
#[derive(Clone, Debug)]
pub(crate) struct QueuedLaunch {
    pub(crate) role: attnc_lower::KernelRole,
    pub(crate) grid: [u32; 3],
    pub(crate) threads: u32,
    pub(crate) smem: u32,
    pub(crate) args: ArgSlots,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem::ElemType;

    fn t(addr: u64, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        // SAFETY: descriptors only; nothing is dereferenced.
        unsafe {
            Tensor::from_raw_parts(0, addr, ElemType::Bf16, shape, &crate::tensor::contiguous_strides(shape), n)
                .expect("view")
        }
    }

    #[test]
    fn any_difference_in_what_a_launch_depends_on_changes_the_signature() {
        let (q, k, v, o) = (
            t(0x1000, &[2, 17, 8, 64]),
            t(0x9000, &[2, 33, 2, 64]),
            t(0x20000, &[2, 33, 2, 64]),
            t(0x40000, &[2, 17, 8, 64]),
        );
        let base = Params::default();
        let sig = |q: &Tensor, o: &Tensor, p: &Params| LaunchSignature::of(q, &k, &v, o, None, p);
        let s0 = sig(&q, &o, &base);
        assert_eq!(s0, sig(&q, &o, &Params::default()), "equal calls, equal signatures");
        // An address, a shape, a stride.
        assert_ne!(s0, sig(&t(0x1100, &[2, 17, 8, 64]), &o, &base));
        assert_ne!(s0, sig(&t(0x1000, &[2, 16, 8, 64]), &o, &base));
        let strided = q.view(&[2, 17, 8, 32], &[17 * 8 * 64, 8 * 64, 64, 1], 0).expect("view");
        assert_ne!(sig(&strided, &o, &base), sig(&t(0x1000, &[2, 17, 8, 32]), &o, &base));
        // Params: value, type, name.
        let pi = Params::default().int("w", 3);
        assert_ne!(s0, sig(&q, &o, &pi));
        assert_ne!(sig(&q, &o, &pi), sig(&q, &o, &Params::default().int("w", 4)));
        assert_ne!(sig(&q, &o, &pi), sig(&q, &o, &Params::default().float("w", 3.0)));
        assert_ne!(sig(&q, &o, &pi), sig(&q, &o, &Params::default().int("x", 3)));
        // A shard's place in its sequence.
        let at = |q_offset| {
            Params::default().positions(attnc_ir::ShardPositions {
                q_offset,
                k_offset: 0,
                seqlen_q: 100,
                seqlen_k: 100,
                sinks: true,
            })
        };
        assert_ne!(sig(&q, &o, &at(0)), sig(&q, &o, &at(8)));
        assert_ne!(sig(&q, &o, &base), sig(&q, &o, &at(0)));
        // Aux tensors, splits, the stream, an LSE output.
        let a = t(0x80000, &[2, 33]);
        assert_ne!(s0, sig(&q, &o, &Params::default().aux("doc", &a)));
        assert_ne!(s0, sig(&q, &o, &Params::default().splits(2)));
        // SAFETY: a handle value only.
        assert_ne!(s0, sig(&q, &o, &Params::default().on_stream(unsafe { Stream::from_raw(0x77) })));
        let lse = t(0x90000, &[2, 8, 17]);
        assert_ne!(s0, LaunchSignature::of(&q, &k, &v, &o, Some(&lse), &base));
    }

    #[test]
    fn a_passed_in_block_mask_is_part_of_the_signature_by_identity() {
        use crate::block_mask::{BlockMask, BuiltFor};
        let (q, k, v, o) = (
            t(0x1000, &[2, 17, 8, 64]),
            t(0x9000, &[2, 33, 2, 64]),
            t(0x20000, &[2, 33, 2, 64]),
            t(0x40000, &[2, 17, 8, 64]),
        );
        let built_for = || BuiltFor {
            module_key: "m".into(),
            tiling: attnc_ir::block_mask::Tiling { block_m: 128, block_n: 64, pack_gqa: false },
            layout: attnc_lower::BlockLayout::RowLists,
            dims: attnc_ir::block_mask::BlockDims {
                batch: 2,
                slots: 1,
                m_tiles: 1,
                n_tiles: 1,
                bits_per_row: 0,
                tile_words: 128,
            },
            seqlens: vec![(17, 33); 2],
            aux: vec![],
            params: vec![],
        };
        // Two masks over the same device words (a mask rebuilt where the last one was):
        // distinct signatures, so the second is checked before it serves a launch.
        let (a, b) = (BlockMask::new(built_for(), t(0x80000, &[4])), BlockMask::new(built_for(), t(0x80000, &[4])));
        let sig = |m: &BlockMask| LaunchSignature::of(&q, &k, &v, &o, None, &Params::default().block_mask(m));
        assert_eq!(sig(&a), sig(&a), "the same mask, the same launch");
        assert_ne!(sig(&a), sig(&b));
        assert_ne!(sig(&a), LaunchSignature::of(&q, &k, &v, &o, None, &Params::default()));
    }

    fn index(addr: u64, values: Vec<i32>) -> crate::tensor::IndexTensor {
        let n = values.len();
        // SAFETY: descriptors only; nothing is dereferenced.
        unsafe {
            let t = Tensor::from_raw_parts(0, addr, ElemType::I32, &[n], &[1], n).expect("view");
            crate::tensor::IndexTensor::from_parts(t, values).expect("index")
        }
    }

    #[test]
    fn index_values_compare_by_identity_first_then_by_value() {
        let (q, k, v, o) = (
            t(0x1000, &[2, 1, 8, 64]),
            t(0x9000, &[6, 16, 2, 64]),
            t(0x20000, &[6, 16, 2, 64]),
            t(0x40000, &[2, 1, 8, 64]),
        );
        let table = index(0x80000, vec![3, 1, 0, 2, 5, 4]);
        let used = index(0x90000, vec![40, 33]);
        let sig = |bt: &crate::tensor::IndexTensor| {
            LaunchSignature::of(&q, &k, &v, &o, None, &Params::default().paged(bt, &used))
        };
        let s0 = sig(&table);
        assert_eq!(s0, sig(&table.clone()), "a clone shares the values");
        assert_eq!(s0, sig(&index(0x80000, vec![3, 1, 0, 2, 5, 4])), "rebuilt with equal values");
        assert_ne!(s0, sig(&index(0x80000, vec![3, 1, 0, 2, 4, 5])), "one entry differs");
        assert_ne!(s0, sig(&index(0x80000, vec![3, 1, 0, 2, 5])), "one entry fewer");
    }

    #[test]
    fn a_backward_signature_covers_its_gradients_and_its_mode() {
        let (q, k, v, o) = (
            t(0x1000, &[2, 17, 8, 64]),
            t(0x9000, &[2, 33, 2, 64]),
            t(0x20000, &[2, 33, 2, 64]),
            t(0x40000, &[2, 17, 8, 64]),
        );
        let lse = t(0x50000, &[2, 8, 17]);
        let d_out = t(0x60000, &[2, 17, 8, 64]);
        let (dq, dk, dv) = (t(0x70000, &[2, 17, 8, 64]), t(0x80000, &[2, 33, 2, 64]), t(0x90000, &[2, 33, 2, 64]));
        let sig = |d_out: &Tensor, dq: &Tensor, p: &Params| {
            LaunchSignature::of_backward(&q, &k, &v, &o, &lse, d_out, [dq, &dk, &dv], p)
        };
        let base = Params::default();
        let s0 = sig(&d_out, &dq, &base);
        assert_eq!(s0, sig(&d_out, &dq, &Params::default()), "equal calls, equal signatures");
        assert_ne!(s0, LaunchSignature::of(&q, &k, &v, &o, Some(&lse), &base), "not the forward's");
        assert_ne!(s0, sig(&t(0x61000, &[2, 17, 8, 64]), &dq, &base), "another output gradient");
        assert_ne!(s0, sig(&d_out, &t(0x71000, &[2, 17, 8, 64]), &base), "another dQ");
        assert_ne!(s0, sig(&d_out, &dq, &Params::default().deterministic(true)), "the accumulation mode");
        let ds = t(0xa0000, &[8]);
        assert_ne!(s0, sig(&d_out, &dq, &Params::default().dsinks(&ds)), "a sink gradient");
        let g = t(0xb0000, &[2, 33]);
        let with_grad = Params::default().aux_grad("bias", &g);
        assert_ne!(s0, sig(&d_out, &dq, &with_grad), "an aux gradient");
        assert_ne!(
            sig(&d_out, &dq, &with_grad),
            sig(&d_out, &dq, &Params::default().aux_grad("bias", &t(0xb1000, &[2, 33])))
        );
    }
}
