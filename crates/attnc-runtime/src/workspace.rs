//! The runtime's per-stream device buffers: workspaces (split-KV partials, the backward's
//! dQ accumulator and row values) and zeroed counters, sized on demand and then reused, so a
//! call of a sized shape allocates nothing and can be captured in a CUDA graph.

use crate::cuda::{DeviceBuffer, Gpu, Queue, Stream};
use crate::error::{RuntimeError, ValidationError};
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One pool of each kind per stream (`None`: the runtime's own).
#[derive(Default)]
pub(crate) struct Pools {
    /// Workspaces (split-KV partials, the backward's dQ accumulator and row values), one
    /// per stream (`None`: the runtime's), grown on demand and then reused, so a sized
    /// call allocates nothing (CUDA-graph capture). Held locked from a call's first
    /// launch to its last, so concurrent calls cannot interleave on one.
    workspaces: Mutex<HashMap<Option<Stream>, Arc<DeviceBuffer>>>,
    /// Zeroed u32 counters, one buffer per stream: the fused split-KV combine's per row
    /// block, or a persistent forward's two tile counters. Zeroed when allocated, and
    /// every launch leaves them zero (the last split of a row block resets its counter,
    /// the last CTA to stop taking tiles the tile counters), so they need no clearing per
    /// call. Locked like a workspace.
    counters: Mutex<HashMap<Option<Stream>, Arc<DeviceBuffer>>>,
    /// Pooled buffers a larger one replaced, kept until the runtime drops: a CUDA graph
    /// captured with the smaller one still points at it (PyTorch captures every graph on
    /// one shared stream), and freeing it would also need a wait on the stream, which a
    /// capture in progress forbids. Pools grow at least twofold, so what is kept stays
    /// below the size of the current buffer.
    retired: Mutex<Vec<Arc<DeviceBuffer>>>,
}

/// A call's workspace: the pool's (locked for the call) or the caller's.
pub(crate) enum Workspace<'a> {
    None,
    /// The pool stays locked while the call queues its work.
    Pooled {
        _lock: std::sync::MutexGuard<'a, HashMap<Option<Stream>, Arc<DeviceBuffer>>>,
        ptr: u64,
    },
    Caller(u64),
}

impl Workspace<'_> {
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            Workspace::None => 0,
            Workspace::Pooled { ptr, .. } | Workspace::Caller(ptr) => *ptr,
        }
    }
}

impl Pools {
    /// `count` zeroed u32 counters for a launch on `queue`'s stream (a fused combine's or
    /// a persistent forward's; none for 0), locked for the call.
    pub(crate) fn counters(&self, gpu: &Gpu, count: usize, queue: &Queue) -> Result<Workspace<'_>, RuntimeError> {
        if count == 0 {
            return Ok(Workspace::None);
        }
        let key = queue.caller_stream();
        let mut g = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        if g.get(&key).is_none_or(|b| b.bytes() < count * 4) {
            let old = g.remove(&key);
            let buf = gpu.alloc_bytes(self.grown(old, (count * 4).max(4096)))?;
            queue.memset_d32(buf.ptr(), 0, buf.bytes() / 4)?;
            g.insert(key, buf);
        }
        let ptr = g.get(&key).map_or(0, |b| b.ptr());
        Ok(Workspace::Pooled { _lock: g, ptr })
    }

    /// `bytes` of workspace for a call queued on `queue`: the caller's `given` buffer
    /// (checked: device, size, 256-byte alignment) or the pool's buffer of that stream.
    pub(crate) fn workspace(
        &self,
        gpu: &Gpu,
        bytes: usize,
        queue: &Queue,
        given: Option<&Tensor>,
    ) -> Result<Workspace<'_>, RuntimeError> {
        if bytes == 0 {
            return Ok(Workspace::None);
        }
        if let Some(t) = given {
            let d = t.desc();
            let have = d.capacity.saturating_mul(d.dtype.bytes() as u64);
            let err = |detail: String| RuntimeError::Validation(ValidationError::Workspace { detail });
            if d.device != gpu.info.ordinal {
                return Err(err(format!("on device {}, the kernel runs on device {}", d.device, gpu.info.ordinal)));
            }
            if have < bytes as u64 {
                return Err(err(format!("{have} bytes, this call needs {bytes}")));
            }
            if d.addr % 256 != 0 {
                return Err(err(format!("address {:#x} is not 256-byte aligned", d.addr)));
            }
            return Ok(Workspace::Caller(d.addr));
        }
        let key = queue.caller_stream();
        let mut g = self.workspaces.lock().unwrap_or_else(|e| e.into_inner());
        if g.get(&key).is_none_or(|b| b.bytes() < bytes) {
            let old = g.remove(&key);
            g.insert(key, gpu.alloc_bytes(self.grown(old, bytes.max(1 << 20)))?);
        }
        let ptr = g.get(&key).map_or(0, |b| b.ptr());
        Ok(Workspace::Pooled { _lock: g, ptr })
    }

    /// The size of a pooled buffer that replaces `old` (retired, see `Pools::retired`) and
    /// holds `need` bytes: at least twice the old one.
    fn grown(&self, old: Option<Arc<DeviceBuffer>>, need: usize) -> usize {
        match old {
            Some(old) => {
                let bytes = need.max(2 * old.bytes());
                self.retired.lock().unwrap_or_else(|e| e.into_inner()).push(old);
                bytes
            }
            None => need,
        }
    }
}
