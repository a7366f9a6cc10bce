//! The 128-byte-swizzled tile layout: what TMA writes with `SWIZZLE_128B` and a 64-element
//! inner box, and what both tensor-core descriptors (wgmma on sm_90a, tcgen05 on sm_100a)
//! read with their 128-byte swizzle mode. Rows are 128 bytes (64 16-bit elements); the
//! 16-byte chunk `c` of row `r` sits at chunk `c ^ (r % 8)` of that row; 8 rows form a
//! 1024-byte atom; a wider tile is a sequence of 64-element column blocks. The cp.async
//! gathers and the O staging write this layout by hand, and the MMAs step through it.

use crate::llvm::kb::{Kb, R};
use inkwell::values::IntValue;

/// Bytes of one row (64 16-bit elements, the swizzle span).
pub const ROW_BYTES: u32 = 128;

/// Byte offset from a K-major tile's start (rows × `k_total` halves, stored as column
/// blocks of 64 halves, each `rows · 128` bytes) of MMA K step `kk` (16 halves).
pub fn k_major_step_offset(rows: u32, kk: u32) -> u32 {
    let k0 = kk * 16;
    (k0 / 64) * rows * ROW_BYTES + (k0 % 64) * 2
}

/// Byte offset of K step `kk` (16 K rows of 128 bytes) in an MN-major tile.
pub fn mn_major_step_offset(kk: u32) -> u32 {
    kk * 16 * ROW_BYTES
}

/// Shared address of the 16-byte chunk `chunk` (0..8) of row `row` in the column block
/// at `base`: `base + row·128 + (chunk ^ row % 8)·16`.
pub fn emit_chunk_addr<'ctx>(
    kb: &Kb<'ctx>,
    base: IntValue<'ctx>,
    row: IntValue<'ctx>,
    chunk: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let sw = kb.xor(chunk, kb.and(row, kb.i32c(7), "")?, "")?;
    kb.add(base, kb.add(kb.mul(row, kb.i32c(ROW_BYTES as i64), "")?, kb.mul(sw, kb.i32c(16), "")?, "")?, "")
}

/// Zeroes row `row_addr` (a row's address in the first column block) of a tile of
/// `d`-element rows stored as column blocks of `block_bytes` each: every 16-byte chunk
/// of the row in each block, so the swizzle does not matter. For K/V rows that must read
/// as zeros after a load brought other data there (a page's rows past the sequence).
pub fn zero_row<'ctx>(kb: &Kb<'ctx>, row_addr: IntValue<'ctx>, d: u32, block_bytes: u32) -> R<()> {
    let z = kb.i32c(0);
    for cb in 0..d.div_ceil(64) {
        for c in 0..ROW_BYTES / 16 {
            let a = kb.add(row_addr, kb.i32c((cb * block_bytes + 16 * c) as i64), "")?;
            kb.st_shared_v4_b32(a, [z, z, z, z])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_offsets() {
        // 64 rows, d = 128: K steps 0..3 in column block 0 at 32-byte steps, 4..7 in
        // block 1 (64 · 128 bytes = 8 KiB further).
        assert_eq!(k_major_step_offset(64, 3), 96);
        assert_eq!(k_major_step_offset(64, 4), 0x2000);
        assert_eq!(k_major_step_offset(64, 7), 0x2000 + 96);
        // 128 rows: the next block is 16 KiB further.
        assert_eq!(k_major_step_offset(128, 0), 0);
        assert_eq!(k_major_step_offset(128, 3), 96);
        assert_eq!(k_major_step_offset(128, 4), 16384);
        assert_eq!(k_major_step_offset(128, 7), 16384 + 96);
        assert_eq!(mn_major_step_offset(1), 2048);
    }
}
