//! GPU architectures attnc emits code for.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Ampere (A100): mma.sync, ldmatrix, cp.async.
    Sm80,
    /// Hopper (H100/H200) with the arch-specific features (wgmma, setmaxnreg).
    Sm90a,
    /// Blackwell datacenter (B200) with tcgen05/TMEM.
    Sm100a,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Sm80, Arch::Sm90a, Arch::Sm100a];

    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
        }
    }
    /// The PTX ISA version LLVM should target (the lowest that has the arch).
    pub fn ptx_feature(self) -> &'static str {
        match self {
            Arch::Sm80 => "+ptx80",
            Arch::Sm90a => "+ptx80",
            Arch::Sm100a => "+ptx86",
        }
    }
    /// Whether `red.global.add.v2.f32` (one vector atomic for two floats) exists: sm_90
    /// and later, from PTX ISA 8.1 ([`Arch::vector_red_ptx_feature`]).
    pub fn has_vector_red(self) -> bool {
        self >= Arch::Sm90a
    }
    /// The PTX ISA feature a module with vector `red` needs.
    pub fn vector_red_ptx_feature(self) -> &'static str {
        match self {
            Arch::Sm100a => "+ptx86",
            _ => "+ptx81",
        }
    }
    /// Shared memory a CTA may use (opt-in maximum), in bytes.
    pub fn max_smem_per_block(self) -> u32 {
        match self {
            Arch::Sm80 => 163 * 1024,
            Arch::Sm90a | Arch::Sm100a => 227 * 1024,
        }
    }
    /// From a compute capability (major, minor), as the runtime reads it off a device.
    pub fn from_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        match (major, minor) {
            (8, _) => Some(Arch::Sm80),
            (9, 0) => Some(Arch::Sm90a),
            (10, 0) => Some(Arch::Sm100a),
            _ => None,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Arch, String> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown arch `{s}`: expected sm_80, sm_90a or sm_100a"))
    }
}
