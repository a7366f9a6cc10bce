//! Ready first: a variant's first kernel from the portable family, whose module compiles in
//! a fraction of the time, while the module the dispatcher picks compiles on a thread.
//!
//! On the H100 host ptxas alone takes 0.42–0.63 s for the hopper forward of a causal d128
//! spec (docs/results/2026-11-27-h100-writer-turns-ptxas-host/), a cold compile's whole
//! budget; the portable forward of the same spec assembles in about a third of that. A
//! caller that cannot wait takes the interim kernel (its receipts say so) and swaps in the
//! dispatcher's once [`PendingKernel::poll`] hands it over.

use crate::error::RuntimeError;
use crate::jit::kernel_key;
use crate::runtime::{Kernel, Runtime};
use attnc_ir::Spec;
use attnc_lower::{Arch, Direction, FamilyChoice, FamilyKind};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Instant;

/// The dispatcher's kernel of a variant, compiling on a thread. The thread hands it over
/// as soon as its forward is loaded, then goes on to compile the modules its later calls
/// may need (`Kernel::warm`: the decode twin, and for variants that train the LSE forward
/// and the backward), so the first training step after the switch finds them cached.
pub struct PendingKernel {
    family: FamilyKind,
    started: Instant,
    state: Mutex<Handover>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

enum Handover {
    Waiting(Receiver<Result<Kernel, RuntimeError>>),
    Ready(Box<Result<Kernel, RuntimeError>>),
    Taken,
}

impl std::fmt::Debug for PendingKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingKernel({}, {:.1} ms)", self.family, self.started.elapsed().as_secs_f64() * 1e3)
    }
}

impl PendingKernel {
    /// The family being compiled.
    pub fn family(&self) -> FamilyKind {
        self.family
    }

    /// Whether [`PendingKernel::poll`] would hand the kernel (or its error) over now.
    pub fn is_ready(&self) -> bool {
        let mut state = self.lock();
        Self::receive(&mut state, false);
        matches!(*state, Handover::Ready(_))
    }

    /// The dispatcher's kernel once its forward is loaded; `None` while it compiles, and
    /// after it was handed over once.
    pub fn poll(&self) -> Option<Result<Kernel, RuntimeError>> {
        let mut state = self.lock();
        Self::receive(&mut state, false);
        Self::take(&mut state)
    }

    /// Waits for the dispatcher's kernel (an error if it was handed over already).
    pub fn wait(&self) -> Result<Kernel, RuntimeError> {
        let mut state = self.lock();
        Self::receive(&mut state, true);
        Self::take(&mut state).unwrap_or_else(|| {
            Err(RuntimeError::Other(format!("the pending {} kernel was already handed over", self.family)))
        })
    }

    /// Moves what the thread sent (waiting for it with `block`) into `Ready`.
    fn receive(state: &mut Handover, block: bool) {
        let Handover::Waiting(rx) = state else { return };
        let got = match block {
            true => rx.recv().map_err(|_| TryRecvError::Disconnected),
            false => rx.try_recv(),
        };
        match got {
            Ok(r) => *state = Handover::Ready(Box::new(r)),
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => {
                *state =
                    Handover::Ready(Box::new(Err(RuntimeError::Other("the background compile thread panicked".into()))))
            }
        }
    }

    fn take(state: &mut Handover) -> Option<Result<Kernel, RuntimeError>> {
        match std::mem::replace(state, Handover::Taken) {
            Handover::Ready(r) => Some(*r),
            other => {
                *state = other;
                None
            }
        }
    }

    /// Waits until the compile thread has also built the modules it goes on to warm (a
    /// benchmark that times other work next, for one).
    pub fn join(&self) {
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Handover> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The family an interim kernel of `spec` would stand in for on `arch`, if it may start on
/// one: the dispatcher picks a family other than portable, and the variant builds no block
/// masks (they are built and checked under one kernel's tiling, which the swap would change).
fn interim_family(spec: &Spec, arch: Arch) -> Option<FamilyKind> {
    if attnc_ir::block_mask::needs_block_mask(spec) {
        return None;
    }
    let resolved = crate::dispatch::resolve(spec, arch, FamilyChoice::Auto, Direction::Forward).ok()?;
    (resolved.family != FamilyKind::Portable).then_some(resolved.family)
}

impl Runtime {
    /// The kernel of `spec` with the least wait: the dispatcher's when the memory or disk
    /// cache holds it (or when it is portable anyway, or the variant builds block masks);
    /// otherwise a portable kernel now, marked interim in its receipts, and the
    /// dispatcher's compiling on a thread. If the portable one cannot be built, this waits
    /// for the dispatcher's.
    pub fn kernel_ready_first(&self, spec: &Spec) -> Result<(Kernel, Option<PendingKernel>), RuntimeError> {
        let gpu = &self.inner.gpu;
        let key = kernel_key(spec, gpu.arch.name(), FamilyChoice::Auto, Direction::Forward, gpu.info.driver_version);
        let family = match self.inner.kernels.holds(&key) {
            true => None,
            false => interim_family(spec, self.arch()),
        };
        let Some(family) = family else {
            return Ok((self.kernel(spec)?, None));
        };
        let started = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = {
            let (rt, spec) = (self.clone(), spec.clone());
            std::thread::Builder::new()
                .name(format!("attnc-compile-{}", spec.name))
                .spawn(move || {
                    let kernel = rt.kernel(&spec);
                    let then_warm = kernel.as_ref().ok().cloned();
                    let _ = tx.send(kernel);
                    // Errors here surface again, synchronously, where the module is used.
                    if let Some(k) = then_warm {
                        let _ = k.warm();
                    }
                })
                .map_err(|e| RuntimeError::Other(format!("starting the background compile thread: {e}")))?
        };
        let pending = PendingKernel {
            family,
            started,
            state: Mutex::new(Handover::Waiting(rx)),
            thread: Mutex::new(Some(thread)),
        };
        match self.kernel_with(spec, FamilyChoice::Exactly(FamilyKind::Portable)) {
            Ok(mut interim) => {
                interim.interim = Some(format!("portable runs while the {family} module compiles (ready first)"));
                Ok((interim, Some(pending)))
            }
            Err(_) => Ok((pending.wait()?, None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Spec {
        let src = format!("attention v {{\n dtype bf16\n head_dim 128\n heads 16 kv 4\n{body}}}\n");
        attnc_dsl::parse_named("v.attn", &src).expect("parses")
    }

    /// An interim kernel only where it stands in for a faster family, and never for a
    /// variant whose block masks are tied to one kernel's tiles.
    #[test]
    fn an_interim_kernel_stands_in_only_for_another_family_without_block_masks() {
        assert_eq!(interim_family(&parse(" mask causal\n"), Arch::Sm90a), Some(FamilyKind::Hopper));
        // Auto passes blackwell over until it has run on a B200: portable anyway there.
        assert_eq!(interim_family(&parse(""), Arch::Sm100a), None);
        assert_eq!(interim_family(&parse(" mask causal\n"), Arch::Sm80), None, "portable anyway");
        let doc = parse(" aux doc: int[batch, seqlen_k]\n mask causal && doc[b, q] == doc[b, k]\n");
        assert!(attnc_ir::block_mask::needs_block_mask(&doc));
        assert_eq!(interim_family(&doc, Arch::Sm90a), None);
    }
}
