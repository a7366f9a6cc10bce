//! Variant code shared by every kernel family: how masks, score modifications, tile
//! classification and KV addressing (contiguous, varlen, paged) become instructions.
//! A family decides *when* these run (its schedule); this module decides *what* they
//! compute, so all families agree with the IR's reference semantics.

pub mod expr;
pub mod interval;
pub mod layout;
pub mod softmax;
pub mod tiles;
