//! Typed device tensors with shape/stride views, and their host-side descriptors.
//!
//! A [`Tensor`] is a view (`shape`, `strides` in elements, element `offset`) of a device
//! allocation that it shares (`Arc`) with other views of it. Kernels need row-major views
//! with unit stride in the last dimension; other strides are free (a Q slice of a fused
//! QKV tensor works), subject to the 16-byte alignment checked at launch.
//!
//! A [`TensorDesc`] is what launch validation looks at: dtype, shape, strides, device
//! address and how many elements the allocation holds from there. It needs no device,
//! so validation is tested on the CPU.
//!
//! An [`IndexTensor`] is an i32 tensor (cu_seqlens, block tables, seqused_k) uploaded
//! from host data that keeps that host copy: launches validate its *values* (monotonic
//! cu_seqlens, page indices in range) on the host without a download, and since it can
//! only be created by an upload and is never written by a kernel, the two copies agree.

use crate::cuda::DeviceBuffer;
pub use crate::elem::{ElemType, Element};
use crate::error::RuntimeError;
use std::fmt;
use std::sync::Arc;

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// Everything launch validation needs to know about one tensor argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    pub dtype: ElemType,
    pub shape: Vec<usize>,
    /// In elements.
    pub strides: Vec<usize>,
    /// Device address of the view's first element.
    pub addr: u64,
    /// Elements the allocation holds from `addr` on.
    pub capacity: u64,
    /// Device ordinal.
    pub device: usize,
}

impl TensorDesc {
    /// A row-major view that exactly fills its allocation.
    pub fn contiguous(dtype: ElemType, shape: &[usize], addr: u64, device: usize) -> TensorDesc {
        let n = shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        TensorDesc { dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), addr, capacity: n, device }
    }
    pub fn numel(&self) -> u128 {
        self.shape.iter().fold(1u128, |a, &d| a * d as u128)
    }
    /// Elements from the first to one past the last element the view can reach (0 when
    /// any dimension is 0).
    pub fn span(&self) -> u128 {
        if self.shape.contains(&0) {
            return 0;
        }
        1 + self.shape.iter().zip(&self.strides).map(|(&n, &s)| (n as u128 - 1) * s as u128).sum::<u128>()
    }
    /// The byte range `[start, end)` the view can touch.
    pub fn byte_range(&self) -> (u128, u128) {
        let start = u128::from(self.addr);
        (start, start + self.span() * self.dtype.bytes() as u128)
    }
    pub fn is_contiguous(&self) -> bool {
        self.strides == contiguous_strides(&self.shape)
    }
}

/// A view of device memory.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) buf: Arc<DeviceBuffer>,
    dtype: ElemType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {:?} strides {:?} +{})", self.dtype, self.shape, self.strides, self.offset)
    }
}

impl Tensor {
    /// A row-major view of the whole of `buf`.
    pub(crate) fn from_buffer(buf: Arc<DeviceBuffer>, dtype: ElemType, shape: &[usize]) -> Tensor {
        Tensor { buf, dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0 }
    }
    pub fn dtype(&self) -> ElemType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Element offset of the view in its allocation.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_contiguous(&self) -> bool {
        self.strides == contiguous_strides(&self.shape)
    }
    /// Device ordinal.
    pub fn device(&self) -> usize {
        self.buf.ordinal
    }
    /// Device address of the view's first element.
    pub fn device_ptr(&self) -> u64 {
        self.buf.ptr + (self.offset * self.dtype.bytes()) as u64
    }
    /// Elements the allocation holds from this view's start.
    pub(crate) fn capacity(&self) -> u64 {
        ((self.buf.bytes / self.dtype.bytes()) as u64).saturating_sub(self.offset as u64)
    }
    pub fn desc(&self) -> TensorDesc {
        TensorDesc {
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            addr: self.device_ptr(),
            capacity: self.capacity(),
            device: self.device(),
        }
    }

    /// Another view of the same allocation: `offset` in elements from the allocation's
    /// start. Fails when the view would reach past the allocation.
    pub fn view(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor, RuntimeError> {
        if shape.len() != strides.len() {
            return Err(RuntimeError::Other(format!("view: shape {shape:?} and strides {strides:?} differ in rank")));
        }
        let t = Tensor {
            buf: self.buf.clone(),
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        };
        let cap = (self.buf.bytes / self.dtype.bytes()) as u128;
        if offset as u128 + t.desc().span() > cap {
            return Err(RuntimeError::Other(format!(
                "view {shape:?} strides {strides:?} at +{offset} reaches past the allocation ({cap} elements)"
            )));
        }
        Ok(t)
    }

    /// A tensor over device memory the caller owns (a PyTorch or CuPy tensor, a buffer of
    /// another library): `shape` and `strides` (in elements) from `ptr`, which reaches
    /// `capacity` elements. attnc never frees it. Launches validate it like any other
    /// tensor (dtype, shape, strides, alignment, bounds, aliasing), so a bad view is a
    /// typed error, never a launch.
    ///
    /// # Safety
    /// `ptr` is a device address of the runtime's device in its primary context, and the
    /// `capacity` elements from it stay allocated (and are not written by anyone else)
    /// until the work queued with this tensor has run.
    pub unsafe fn from_raw_parts(
        device: usize,
        ptr: u64,
        dtype: ElemType,
        shape: &[usize],
        strides: &[usize],
        capacity: usize,
    ) -> Result<Tensor, RuntimeError> {
        if shape.len() != strides.len() {
            return Err(RuntimeError::Other(format!("tensor: shape {shape:?} and strides {strides:?} differ in rank")));
        }
        if ptr == 0 && capacity > 0 {
            return Err(RuntimeError::Other("tensor: null device pointer".into()));
        }
        let bytes = capacity.checked_mul(dtype.bytes()).ok_or_else(|| {
            RuntimeError::Other(format!("tensor: a capacity of {capacity} elements overflows the address space"))
        })?;
        let t = Tensor {
            buf: Arc::new(DeviceBuffer::borrowed(ptr, bytes, device)),
            dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset: 0,
        };
        let span = t.desc().span();
        if span > capacity as u128 {
            return Err(RuntimeError::Other(format!(
                "tensor {shape:?} strides {strides:?} reaches {span} elements, its memory holds {capacity}"
            )));
        }
        Ok(t)
    }

    /// Does this view's memory belong to the caller ([`Tensor::from_raw_parts`])?
    pub fn is_borrowed(&self) -> bool {
        !self.buf.is_owned()
    }

    /// The same elements with another shape (contiguous views only).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        if !self.is_contiguous() || shape.iter().product::<usize>() != self.numel() {
            return Err(RuntimeError::Other(format!("cannot reshape {:?} to {shape:?}", self)));
        }
        self.view(shape, &contiguous_strides(shape), self.offset)
    }
}

/// An i32 tensor that keeps the host copy it was uploaded from (see the module docs).
#[derive(Clone, Debug)]
pub struct IndexTensor {
    pub(crate) tensor: Tensor,
    pub(crate) host: Arc<Vec<i32>>,
}

impl IndexTensor {
    /// An index tensor over the caller's device memory and its values on the host, so
    /// launches validate the values (monotonic cu_seqlens, pages in range) without reading
    /// the device. `tensor` must be contiguous i32 and hold `host.len()` elements.
    ///
    /// # Safety
    /// The device memory holds exactly `host` (row-major) while launches use it.
    pub unsafe fn from_parts(tensor: Tensor, host: Vec<i32>) -> Result<IndexTensor, RuntimeError> {
        if tensor.dtype() != ElemType::I32 || !tensor.is_contiguous() || tensor.numel() != host.len() {
            return Err(RuntimeError::Other(format!(
                "index tensor: expected a contiguous i32 tensor of {} elements, found {:?}",
                host.len(),
                tensor
            )));
        }
        Ok(IndexTensor { tensor, host: Arc::new(host) })
    }

    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
    pub fn host(&self) -> &[i32] {
        &self.host
    }
    /// The shared host values (clones of an index tensor share them).
    pub(crate) fn host_shared(&self) -> &Arc<Vec<i32>> {
        &self.host
    }
    pub fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }
    pub fn host_index(&self) -> HostIndex<'_> {
        HostIndex { desc: self.tensor.desc(), values: &self.host }
    }
}

/// The descriptor of a contiguous i32 tensor together with its values (row-major).
#[derive(Clone, Debug)]
pub struct HostIndex<'a> {
    pub desc: TensorDesc,
    pub values: &'a [i32],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_memory_is_viewed_checked_and_never_freed() {
        // SAFETY: only descriptors are built; nothing dereferences the address.
        let t = unsafe { Tensor::from_raw_parts(0, 0x7000_0000, ElemType::Bf16, &[2, 3, 4], &[24, 4, 1], 48) }
            .expect("a view inside its memory");
        assert!(t.is_borrowed());
        assert_eq!(t.desc().capacity, 48);
        assert_eq!(t.device_ptr(), 0x7000_0000);
        // A strided Q slice of a fused QKV buffer, and one reaching past the memory.
        let qkv = unsafe { Tensor::from_raw_parts(0, 0x7000_0000, ElemType::Bf16, &[2, 4], &[12, 1], 24) };
        assert!(qkv.is_ok());
        let past = unsafe { Tensor::from_raw_parts(0, 0x7000_0000, ElemType::Bf16, &[2, 4], &[12, 1], 15) };
        assert!(past.unwrap_err().to_string().contains("reaches 16 elements"));
        let rank = unsafe { Tensor::from_raw_parts(0, 0x7000_0000, ElemType::F32, &[2, 4], &[1], 8) };
        assert!(rank.is_err());
        let null = unsafe { Tensor::from_raw_parts(0, 0, ElemType::F32, &[2], &[1], 2) };
        assert!(null.is_err());
        // Dropping it frees nothing (no driver on this machine to call).
        drop(t);
        let idx = unsafe { Tensor::from_raw_parts(0, 0x8000_0000, ElemType::I32, &[3], &[1], 3) }.unwrap();
        let host = unsafe { IndexTensor::from_parts(idx.clone(), vec![0, 5, 9]) }.unwrap();
        assert_eq!(host.host(), &[0, 5, 9]);
        assert!(unsafe { IndexTensor::from_parts(idx, vec![0, 5]) }.is_err());
    }

    #[test]
    fn strides_and_span() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        let d = TensorDesc::contiguous(ElemType::Bf16, &[2, 3, 4], 0x1000, 0);
        assert_eq!((d.numel(), d.span(), d.capacity), (24, 24, 24));
        assert_eq!(d.byte_range(), (0x1000, 0x1000 + 48));
        let mut e = d.clone();
        e.shape = vec![2, 0, 4];
        assert_eq!(e.span(), 0);
        let v = TensorDesc { shape: vec![2, 3], strides: vec![10, 1], ..d };
        assert_eq!(v.span(), 13);
        assert!(!v.is_contiguous());
    }
}
