//! What more than one family uses, in one place, so that no family imports another:
//!
//! - [`abi`]: the kernel-entry ABI (typed parameter lists, [`abi::Args`], kernel names);
//! - [`backward`]: the backward's ABI, workspace layout and the kernels around a
//!   family's main loop (preprocess, dQ convert, sink gradient, aux-gradient reduce);
//! - [`dq_order`]: the deterministic backward's ordered dQ accumulation (turn flags per
//!   query tile);
//! - [`combine`]: the split-KV combine kernel every family's split partials go through;
//! - [`epilogue`]: the final store of a row held in mma/wgmma accumulator fragments (O
//!   normalized, LSE, or a split's partials);
//! - [`paged`]: which page sizes TMA boxes can follow, and a key tile's boxes in a paged
//!   cache;
//! - [`schedule`]: a persistent forward's work tiles (plain and LPT order);
//! - [`sw128`]: the 128-byte-swizzled tile layout TMA writes and both tensor-core
//!   descriptor formats read.

pub mod abi;
pub mod backward;
pub mod block_mask;
pub mod combine;
pub mod dq_order;
pub mod epilogue;
pub mod paged;
pub mod schedule;
pub mod sw128;
