//! The two descriptors `tcgen05.mma` reads, built from their documented bit layouts.
//!
//! Sources: PTX ISA 8.6+ §9.7.16.4.1 "Instruction descriptor" (table "Instruction
//! descriptor format for .kind::f16 and .kind::tf32") and §9.7.16.4.2 "Shared memory
//! descriptor" (tcgen05 "matrix descriptor"), cross-checked against CUTLASS's
//! `cute/arch/mma_sm100_desc.hpp` (`UMMA::InstrDescriptor`, `UMMA::SmemDescriptor`),
//! which FlashAttention-4's CuTe-DSL code uses. The unit tests below pin the encodings
//! to values computed by hand from those tables.
//!
//! # Instruction descriptor (32 bits, `.kind::f16`)
//! ```text
//! bits  0-1  sparsity selector          0 (dense)
//! bit   2    sparsity enable            0
//! bit   3    saturate                   0
//! bits  4-5  D format                   0 = f16, 1 = f32
//! bit   6    reserved
//! bits  7-9  A format                   0 = f16, 1 = bf16
//! bits 10-12 B format                   0 = f16, 1 = bf16
//! bit  13    negate A                   0
//! bit  14    negate B                   0
//! bit  15    A major                    0 = K-major, 1 = MN-major
//! bit  16    B major                    0 = K-major, 1 = MN-major
//! bits 17-22 N >> 3
//! bit  23    reserved
//! bits 24-28 M >> 4
//! bit  29    reserved
//! bits 30-31 max shift (.ws only)       0
//! ```
//!
//! # Shared-memory (matrix) descriptor (64 bits)
//! ```text
//! bits  0-13 start address >> 4         (shared::cta byte address)
//! bits 16-29 leading-dimension byte offset >> 4   (LBO)
//! bits 32-45 stride-dimension byte offset >> 4    (SBO)
//! bits 46-48 fixed 0b001 (descriptor version for tcgen05)
//! bits 49-51 matrix base offset         0 (every swizzle atom is 1024-byte aligned)
//! bit  52    LBO mode                   0 (relative byte offset)
//! bits 53-60 fixed 0
//! bits 61-63 swizzle                    0 none, 1 128B with 32B atoms, 2 128B, 4 64B, 6 32B
//! ```
//!
//! Canonical 128-byte-swizzle layouts (CUTLASS notation, unit = 16 bytes, T = 8 halves):
//! - K-major `Swizzle<3,4,3> ∘ ((8,m),(T,2k)) : ((8T,SBO),(1,T))`: rows of 128 bytes,
//!   8-row groups `SBO` apart; the K extent of one MMA (16 halves = 32 bytes) stays inside
//!   the 128-byte row, so LBO is unused (set to 1 as CUTLASS does). Stepping K by 16
//!   elements adds 32 bytes to the start address; K beyond 64 halves lives in the next
//!   128-byte column block of the tile.
//! - MN-major `Swizzle<3,4,3> ∘ ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))`: 64 contiguous
//!   MN elements per 128-byte row, the next 64 (`m`) `LBO` bytes away, K rows 128 bytes
//!   apart and 8-row K groups `SBO` apart.

use crate::llvm::operand::Major;

/// Element types of the `kind::f16` MMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbType {
    F16 = 0,
    Bf16 = 1,
}

impl From<attnc_ir::DType> for AbType {
    fn from(d: attnc_ir::DType) -> AbType {
        match d {
            attnc_ir::DType::Bf16 => AbType::Bf16,
            attnc_ir::DType::Fp16 => AbType::F16,
        }
    }
}

/// Accumulator type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DFormat {
    F16 = 0,
    F32 = 1,
}

/// A `tcgen05.mma.cta_group::1.kind::f16` instruction descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstrDesc {
    pub m: u32,
    pub n: u32,
    pub a: AbType,
    pub b: AbType,
    pub d: DFormat,
    pub a_major: Major,
    pub b_major: Major,
}

impl InstrDesc {
    /// Checks the shape rules of `cta_group::1, kind::f16` (M = 64 with N % 8 == 0 in
    /// 8..=256, or M = 128 with N % 16 == 0 in 16..=256).
    pub fn validate(&self) -> Result<(), String> {
        let ok = match self.m {
            64 => self.n % 8 == 0 && (8..=256).contains(&self.n),
            128 => self.n % 16 == 0 && (16..=256).contains(&self.n),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("tcgen05.mma.cta_group::1.kind::f16 has no shape M={} N={}", self.m, self.n))
        }
    }

    pub fn encode(&self) -> u32 {
        (self.d as u32) << 4
            | (self.a as u32) << 7
            | (self.b as u32) << 10
            | (self.a_major as u32) << 15
            | (self.b_major as u32) << 16
            | (self.n >> 3) << 17
            | (self.m >> 4) << 24
    }
}

/// Swizzle modes of the shared-memory descriptor (bits 61-63).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swizzle {
    None = 0,
    B128Base32 = 1,
    B128 = 2,
    B64 = 4,
    B32 = 6,
}

/// A tcgen05 shared-memory matrix descriptor. Byte quantities; `encode` shifts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemDesc {
    /// Shared-memory byte address of the matrix (multiple of 16, below 256 KiB).
    pub start: u32,
    /// Leading-dimension byte offset (multiple of 16).
    pub lbo: u32,
    /// Stride-dimension byte offset (multiple of 16).
    pub sbo: u32,
    pub swizzle: Swizzle,
}

/// Bit 46: the fixed `0b001` version field of tcgen05 descriptors.
pub const SMEM_DESC_VERSION: u64 = 1 << 46;

impl SmemDesc {
    /// The descriptor without its start address: the per-MMA part is then
    /// `const | (addr >> 4)`, computed at run time from the shared-memory base.
    pub fn encode_without_start(&self) -> u64 {
        ((self.lbo as u64 >> 4) & 0x3FFF) << 16
            | ((self.sbo as u64 >> 4) & 0x3FFF) << 32
            | SMEM_DESC_VERSION
            | (self.swizzle as u64) << 61
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
        Ok(())
    }

    /// A K-major tile with 128-byte swizzle as TMA writes it with `SWIZZLE_128B` and a
    /// 64-element (128-byte) inner box: 128-byte rows, 8-row atoms of 1024 bytes.
    pub fn k_major_sw128(start: u32) -> SmemDesc {
        SmemDesc { start, lbo: 16, sbo: 1024, swizzle: Swizzle::B128 }
    }

    /// An MN-major tile with 128-byte swizzle stored as column blocks of 64 MN elements
    /// (128-byte rows, one row per K index), the blocks `block_bytes` apart.
    pub fn mn_major_sw128(start: u32, block_bytes: u32) -> SmemDesc {
        SmemDesc { start, lbo: block_bytes, sbo: 1024, swizzle: Swizzle::B128 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instr_desc_qk_bf16_m128_n128() {
        // D f32 (1<<4) | A bf16 (1<<7) | B bf16 (1<<10) | K-major both | N/8=16 (<<17)
        // | M/16=8 (<<24)
        let d = InstrDesc {
            m: 128,
            n: 128,
            a: AbType::Bf16,
            b: AbType::Bf16,
            d: DFormat::F32,
            a_major: Major::K,
            b_major: Major::K,
        };
        assert_eq!(d.encode(), 0x0820_0490);
        assert_eq!(d.validate(), Ok(()));
    }

    #[test]
    fn instr_desc_pv_f16_m128_n64_b_mn_major() {
        // D f32 (0x10) | f16 A/B (0) | B MN-major (1<<16) | N/8=8 (<<17 = 0x10_0000) | M/16=8
        let d = InstrDesc {
            m: 128,
            n: 64,
            a: AbType::F16,
            b: AbType::F16,
            d: DFormat::F32,
            a_major: Major::K,
            b_major: Major::Mn,
        };
        assert_eq!(d.encode(), 0x0811_0010);
        let d128 = InstrDesc { n: 128, a: AbType::Bf16, b: AbType::Bf16, ..d };
        // 0x10 | 0x80 | 0x400 | 0x1_0000 | 16<<17 = 0x20_0000 | 0x0800_0000
        assert_eq!(d128.encode(), 0x0821_0490);
    }

    #[test]
    fn instr_desc_every_field_lands_on_its_bits() {
        let base = InstrDesc {
            m: 64,
            n: 8,
            a: AbType::F16,
            b: AbType::F16,
            d: DFormat::F16,
            a_major: Major::K,
            b_major: Major::K,
        };
        assert_eq!(base.encode(), (1 << 17) | (4 << 24));
        assert_eq!(InstrDesc { d: DFormat::F32, ..base }.encode() ^ base.encode(), 1 << 4);
        assert_eq!(InstrDesc { a: AbType::Bf16, ..base }.encode() ^ base.encode(), 1 << 7);
        assert_eq!(InstrDesc { b: AbType::Bf16, ..base }.encode() ^ base.encode(), 1 << 10);
        assert_eq!(InstrDesc { a_major: Major::Mn, ..base }.encode() ^ base.encode(), 1 << 15);
        assert_eq!(InstrDesc { b_major: Major::Mn, ..base }.encode() ^ base.encode(), 1 << 16);
        // N = 256 → 32 in bits 17-22 (the field's top value), M = 128 → 8 in bits 24-28.
        let big = InstrDesc { m: 128, n: 256, ..base };
        assert_eq!(big.encode(), (32 << 17) | (8 << 24));
        assert_eq!(big.encode() & (1 << 23), 0, "bit 23 is reserved");
        assert!(InstrDesc { m: 128, n: 8, ..base }.validate().is_err());
        assert!(InstrDesc { m: 256, ..base }.validate().is_err());
    }

    #[test]
    fn smem_desc_k_major_sw128() {
        // start 0x400 → 0x40; LBO 16 → 1 << 16; SBO 1024 → 64 << 32; version 1 << 46;
        // swizzle 128B = 2 << 61.
        let d = SmemDesc::k_major_sw128(0x400);
        assert_eq!(d.encode(), 0x4000_4040_0001_0040);
        assert_eq!(d.validate(), Ok(()));
        // Start-address field is 14 bits of addr >> 4: the top shared address 0x3FFF0.
        assert_eq!(SmemDesc::k_major_sw128(0x3_FFF0).encode() & 0x3FFF, 0x3FFF);
        assert_eq!(d.encode_without_start() | 0x40, d.encode());
    }

    #[test]
    fn smem_desc_mn_major_sw128() {
        // V tile of 128 keys × 128 dims: column blocks of 64 dims, 16 KiB apart.
        // start 0x8000 → 0x800; LBO 16384 → 1024 << 16 = 0x400_0000; SBO 1024 → 64 << 32.
        let d = SmemDesc::mn_major_sw128(0x8000, 16384);
        assert_eq!(d.encode(), 0x4000_4040_0400_0800);
        assert!(SmemDesc { start: 8, ..d }.validate().is_err());
        assert!(SmemDesc { lbo: 1 << 18, ..d }.validate().is_err());
    }
}
