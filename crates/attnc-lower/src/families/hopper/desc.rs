//! The wgmma shared-memory matrix descriptor (sm_90a), built from its documented bit
//! layout.
//!
//! Sources: PTX ISA 8.0+ §9.7.15.5.1 "Matrix Descriptor Format" (warpgroup-level matrix
//! shared-memory layout, "Matrix Descriptor"), cross-checked against CUTLASS's
//! `cute/arch/mma_sm90_desc.hpp` (`GmmaDescriptor` bitfields, `LayoutType`) and the
//! canonical layouts in `cute/atom/mma_traits_sm90_gmma.hpp` (`make_gmma_desc`), which
//! FlashAttention-3 uses. The unit tests pin the encodings to values computed by hand.
//!
//! # Layout (64 bits)
//! ```text
//! bits  0-13 start address >> 4         (shared::cta byte address, bits 4-17)
//! bits 14-15 reserved 0
//! bits 16-29 leading-dimension byte offset >> 4   (LBO)
//! bits 30-31 reserved 0
//! bits 32-45 stride-dimension byte offset >> 4    (SBO)
//! bits 46-48 reserved 0     (unlike tcgen05, no version field: bit 46 stays 0)
//! bits 49-51 matrix base offset (swizzled layouts whose pattern does not start on a
//!            repeat boundary; 0 here: every tile is 1024-byte aligned)
//! bits 52-61 reserved 0
//! bits 62-63 swizzle ("layout type")   0 none, 1 128B, 2 64B, 3 32B
//! ```
//! Note the differences from the tcgen05 descriptor of sm_100
//! (`families::blackwell::desc`): swizzle is 2 bits at 62-63 with 128B = 1 (tcgen05: 3
//! bits at 61-63 with 128B = 2) and there is no fixed `0b001` at bit 46.
//!
//! # Canonical 128-byte-swizzle layouts (CUTLASS notation, unit 16 bytes, T = 8 halves)
//! - K-major `Swizzle<3,4,3> ∘ ((8,m),(T,2k)) : ((8T,SBO),(1,T))`: each M/N row holds 64
//!   halves = 128 bytes of K, 8-row groups (1024 bytes) `SBO` apart. One wgmma's K = 16
//!   halves (32 bytes) stays inside a row, so LBO is unused ("assumed to be 1": we
//!   encode 1, i.e. 16 bytes, as CUTLASS does). K step `kk` adds `32·kk` bytes to the
//!   start within a 64-half column block; a head dim above 64 lives in further column
//!   blocks of `rows · 128` bytes (TMA box inner extent 64 halves).
//! - MN-major `Swizzle<3,4,3> ∘ ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))`: 64 contiguous
//!   MN elements per 128-byte row, one row per K index, 8-row K groups `SBO` = 1024
//!   bytes apart, the next 64 MN elements `LBO` bytes away. (The V operand of `P·V`.)

/// Swizzle mode, bits 62-63 ("layout type" in CUTLASS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swizzle {
    None = 0,
    B128 = 1,
    B64 = 2,
    B32 = 3,
}

/// A wgmma shared-memory matrix descriptor. Byte quantities; `encode` shifts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemDesc {
    /// Shared-memory byte address of the matrix (multiple of 16, below 256 KiB).
    pub start: u32,
    /// Leading-dimension byte offset (multiple of 16).
    pub lbo: u32,
    /// Stride-dimension byte offset (multiple of 16).
    pub sbo: u32,
    /// Matrix base offset (3 bits).
    pub base_offset: u32,
    pub swizzle: Swizzle,
}

impl SmemDesc {
    /// The descriptor without its start address: a kernel computes the per-MMA
    /// descriptor as `const | (addr >> 4)` at run time.
    pub fn encode_without_start(&self) -> u64 {
        ((self.lbo as u64 >> 4) & 0x3FFF) << 16
            | ((self.sbo as u64 >> 4) & 0x3FFF) << 32
            | ((self.base_offset as u64) & 0x7) << 49
            | (self.swizzle as u64) << 62
    }

    pub fn encode(&self) -> u64 {
        self.encode_without_start() | ((self.start as u64 >> 4) & 0x3FFF)
    }

    pub fn validate(&self) -> Result<(), String> {
        for (what, v) in [("start", self.start), ("LBO", self.lbo), ("SBO", self.sbo)] {
            if v % 16 != 0 || v >= 1 << 18 {
                return Err(format!("descriptor {what} {v:#x} must be a multiple of 16 below 256 KiB"));
            }
        }
        if self.base_offset > 7 {
            return Err(format!("base offset {} does not fit 3 bits", self.base_offset));
        }
        Ok(())
    }

    /// A K-major tile with 128-byte swizzle as TMA writes it with `SWIZZLE_128B` and a
    /// 64-half (128-byte) inner box: 128-byte rows, 8-row atoms of 1024 bytes.
    pub fn k_major_sw128(start: u32) -> SmemDesc {
        SmemDesc { start, lbo: 16, sbo: 1024, base_offset: 0, swizzle: Swizzle::B128 }
    }

    /// An MN-major tile with 128-byte swizzle stored as blocks of 64 MN elements
    /// (128-byte rows, one per K index), the blocks `block_bytes` apart.
    pub fn mn_major_sw128(start: u32, block_bytes: u32) -> SmemDesc {
        SmemDesc { start, lbo: block_bytes, sbo: 1024, base_offset: 0, swizzle: Swizzle::B128 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::common::sw128::{k_major_step_offset, mn_major_step_offset};

    #[test]
    fn q_tile_64x64_bf16_k_major_sw128() {
        // Q tile: 64 rows × 64 bf16 = 64 rows of 128 bytes = 8 KiB at shared 0x400.
        // start 0x400 >> 4 = 0x40; LBO 16 >> 4 = 1 → 1 << 16 = 0x1_0000;
        // SBO 1024 >> 4 = 64 → 64 << 32 = 0x40_0000_0000; base offset 0;
        // swizzle 128B = 1 → 1 << 62 = 0x4000_0000_0000_0000.
        let d = SmemDesc::k_major_sw128(0x400);
        assert_eq!(d.validate(), Ok(()));
        assert_eq!(d.encode(), 0x4000_0040_0001_0040);
        assert_eq!(d.encode_without_start(), 0x4000_0040_0001_0000);
        // K steps 0..3 (of d = 64) advance the start by 32 bytes = 2 units each.
        for kk in 0..4 {
            let s = SmemDesc::k_major_sw128(0x400 + k_major_step_offset(64, kk));
            assert_eq!(s.encode(), 0x4000_0040_0001_0040 + 2 * kk as u64);
        }
    }

    #[test]
    fn k_tile_128x64_bf16_k_major_sw128() {
        // K tile as the B operand of m64n128k16: N = 128 keys × 64 bf16 = 16 KiB at
        // 0x2400 (after Q). The descriptor does not encode N: 16 groups of 8 rows, SBO
        // apart. start 0x2400 >> 4 = 0x240.
        let d = SmemDesc::k_major_sw128(0x2400);
        assert_eq!(d.encode(), 0x4000_0040_0001_0240);
    }

    #[test]
    fn k_tile_64x128_bf16_k_major_sw128_two_column_blocks() {
        // 64 keys × head dim 128: two column blocks of 64 halves, each 64 · 128 = 8 KiB.
        // K steps 0..3 in block 0 (32-byte steps), 4..7 in block 1 (+0x2000).
        assert_eq!(k_major_step_offset(64, 3), 96);
        assert_eq!(k_major_step_offset(64, 4), 0x2000);
        assert_eq!(k_major_step_offset(64, 7), 0x2000 + 96);
        // Tile at 0x4000: step 5 → 0x4000 + 0x2000 + 32 = 0x6020 → 0x602.
        let d = SmemDesc::k_major_sw128(0x4000 + k_major_step_offset(64, 5));
        assert_eq!(d.encode(), 0x4000_0040_0001_0602);
    }

    #[test]
    fn v_tile_mn_major_sw128() {
        // V tile 128 keys × 128 dims, d contiguous: for B = V (K = keys, N = dims),
        // MN-major; blocks of 64 dims, each 128 keys · 128 bytes = 16 KiB apart.
        // start 0x8000 → 0x800; LBO 16384 → 1024 << 16 = 0x400_0000; SBO 1024 → 64 << 32.
        let d = SmemDesc::mn_major_sw128(0x8000, 16384);
        assert_eq!(d.encode(), 0x4000_0040_0400_0800);
        // K step 1 = 16 keys = 2048 bytes further.
        assert_eq!(mn_major_step_offset(1), 2048);
    }

    #[test]
    fn every_field_lands_on_its_bits() {
        let z = SmemDesc { start: 0, lbo: 0, sbo: 0, base_offset: 0, swizzle: Swizzle::None };
        assert_eq!(z.encode(), 0);
        assert_eq!(SmemDesc { start: 0x3_FFF0, ..z }.encode(), 0x3FFF);
        assert_eq!(SmemDesc { lbo: 0x3_FFF0, ..z }.encode(), 0x3FFF << 16);
        assert_eq!(SmemDesc { sbo: 0x3_FFF0, ..z }.encode(), 0x3FFF << 32);
        assert_eq!(SmemDesc { base_offset: 7, ..z }.encode(), 7 << 49);
        assert_eq!(SmemDesc { swizzle: Swizzle::B128, ..z }.encode(), 1 << 62);
        assert_eq!(SmemDesc { swizzle: Swizzle::B64, ..z }.encode(), 2 << 62);
        assert_eq!(SmemDesc { swizzle: Swizzle::B32, ..z }.encode(), 3 << 62);
        // Reserved bits (14-15, 30-31, 46-48, 52-61) stay clear for every field at max.
        let all = SmemDesc { start: 0x3_FFF0, lbo: 0x3_FFF0, sbo: 0x3_FFF0, base_offset: 7, swizzle: Swizzle::B32 };
        let reserved: u64 = (0b11 << 14) | (0b11 << 30) | (0b111 << 46) | (0x3FF << 52);
        assert_eq!(all.encode() & reserved, 0);
        assert!(SmemDesc { start: 8, ..z }.validate().is_err());
        assert!(SmemDesc { sbo: 1 << 18, ..z }.validate().is_err());
        assert!(SmemDesc { base_offset: 8, ..z }.validate().is_err());
    }
}
