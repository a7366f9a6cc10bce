//! Variant code shared by every kernel family: how masks, score modifications (and, for
//! the backward, their derivatives and the learnable aux gradients), tile
//! classification and KV addressing (contiguous, varlen, paged) become instructions.
//! A family decides *when* these run (its schedule); this module decides *what* they
//! compute, so all families agree with the IR's reference semantics.

pub mod expr;
pub mod grad;
pub mod interval;
pub mod layout;
pub mod row_keys;
pub mod softmax;
pub mod tiles;
