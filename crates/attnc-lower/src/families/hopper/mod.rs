//! The hopper family (sm_90a), under construction: only verified foundations so far.
//! It is not wired into the dispatcher ([`crate::families::compile`] still reports
//! "not implemented yet" for it).
//!
//! Plan (issue: warp-specialized sm_90a forward): TMA loads of Q/K/V through tensor maps
//! with 128-byte swizzle into an mbarrier-guarded K/V ring; one producer warp issuing
//! the TMA loads; two consumer warpgroups (raised with `setmaxnreg`) computing
//! `S = Q·Kᵀ` with `wgmma.mma_async` from shared memory and `O += P·V` with P from
//! registers, ping-ponged so one warpgroup's softmax overlaps the other's MMAs.
//!
//! What exists: [`desc`] (the wgmma shared-memory matrix descriptor) and the
//! instruction wrappers in [`crate::llvm::wgmma`]. See `docs/hopper.md`.

pub mod desc;
