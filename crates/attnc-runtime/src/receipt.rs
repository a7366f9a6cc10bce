//! Launch receipts: what ran, in which configuration, and why. A flag never proves that a
//! fast path ran; the receipt does.

use crate::cache::CacheSource;
use attnc_lower::families::common::dq_order::DqAccumulation;
use attnc_lower::Direction;
use serde::Serialize;
use std::fmt;

/// The tile configuration of the forward kernel that ran.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelConfig {
    pub kernel: String,
    pub block_m: u32,
    pub block_n: u32,
    pub threads: u32,
    pub smem_bytes: u32,
    /// Registers per thread of the loaded code (from the driver).
    pub registers: Option<i32>,
    /// Resident CTAs per SM (the driver's occupancy calculator).
    pub ctas_per_sm: u32,
}

/// GPU times of one launch (CUDA events), milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Timings {
    /// The direction's main kernel (forward, or backward main loop).
    pub main_ms: f64,
    /// The split-KV combine after a forward.
    pub combine_ms: Option<f64>,
    /// Everything the call launched (a backward's preprocess, convert and reductions too).
    pub total_ms: f64,
}

/// What one `forward` or `backward` did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Receipt {
    pub spec: String,
    pub direction: Direction,
    /// The family asked for ("auto" or a family name).
    pub requested: String,
    /// The family that ran.
    pub executed: String,
    pub arch: String,
    pub device: String,
    pub config: KernelConfig,
    /// Which image the module was loaded from: "cubin" (driver-compiled PTX) or "ptx".
    pub image: String,
    /// Where `Runtime::kernel` found the module.
    pub kernel_source: CacheSource,
    pub batch: usize,
    pub max_seqlen_q: usize,
    pub max_seqlen_k: usize,
    pub grid: [u32; 3],
    pub num_splits: u32,
    pub split_reason: String,
    pub combine_grid: Option<[u32; 3]>,
    /// Why the requested (or a faster) family did not run.
    pub fallback_reason: Option<String>,
    /// Set when nothing was launched (no batch entry or no query row).
    pub skipped: Option<String>,
    /// Backward: whether dQ and the aux gradients were accumulated in the fixed order.
    pub deterministic: Option<bool>,
    /// Backward: how dQ was accumulated, and why a deterministic launch took the slice
    /// mode rather than the ordered one.
    pub dq_accumulation: Option<DqAccumulation>,
    pub dq_accumulation_reason: Option<String>,
    /// Forward of a spec whose mask takes a block mask: where the lists came from, their
    /// tiles, and (timed launches) the live-tile fraction and classification time.
    pub block_mask: Option<BlockMaskUse>,
    pub timings: Option<Timings>,
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        write!(
            f,
            "{} {}: ran {} (requested {}) on {} [{}]",
            self.spec, self.direction, self.executed, self.requested, self.arch, self.device
        )?;
        write!(f, "; {}x{} tiles, {} threads, {} B smem", c.block_m, c.block_n, c.threads, c.smem_bytes)?;
        if let Some(r) = c.registers {
            write!(f, ", {r} regs")?;
        }
        write!(f, ", {} CTA/SM", c.ctas_per_sm)?;
        write!(f, "; grid {:?}; splits {} ({})", self.grid, self.num_splits, self.split_reason)?;
        match self.dq_accumulation {
            Some(DqAccumulation::Atomic) => write!(f, "; atomic accumulation")?,
            Some(DqAccumulation::Ordered) => write!(f, "; deterministic (ordered dQ turns)")?,
            Some(DqAccumulation::Slices) => write!(f, "; deterministic (dQ slices)")?,
            None => {}
        }
        if let Some(r) = &self.dq_accumulation_reason {
            write!(f, " ({r})")?;
        }
        write!(f, "; batch {}, seqlen_q {}, seqlen_k {}", self.batch, self.max_seqlen_q, self.max_seqlen_k)?;
        write!(f, "; {} from {}", self.image, self.kernel_source)?;
        match &self.fallback_reason {
            Some(r) => write!(f, "; fallback: {r}")?,
            None => write!(f, "; no fallback")?,
        }
        if let Some(m) = &self.block_mask {
            write!(f, "; block mask {} ({}x{} tiles", m.source, m.block_m, m.block_n)?;
            if let Some(l) = m.live_fraction {
                write!(f, ", {:.1}% live", 100.0 * l)?;
            }
            if let Some(c) = m.classify_ms {
                write!(f, ", classified in {c:.4} ms")?;
            }
            write!(f, ")")?;
        }
        if let Some(s) = &self.skipped {
            write!(f, "; SKIPPED: {s}")?;
        }
        if let Some(t) = &self.timings {
            write!(f, "; {:.4} ms", t.total_ms)?;
            if let Some(c) = t.combine_ms {
                write!(f, " (forward {:.4} + combine {c:.4})", t.main_ms)?;
            }
        }
        Ok(())
    }
}

/// Where a launch's tile classification came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockMaskSource {
    /// The caller's [`crate::BlockMask`], built once.
    PassedIn,
    /// The caller's [`crate::BlockMask`], whose backward classes this launch added (the
    /// first backward that receives a mask; later ones reuse them).
    PassedInBackwardBuiltNow,
    /// Classified by this launch, into its workspace (no mask passed in).
    BuiltPerCall,
}

impl fmt::Display for BlockMaskSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockMaskSource::PassedIn => "passed in",
            BlockMaskSource::PassedInBackwardBuiltNow => "passed in (its backward classes built now)",
            BlockMaskSource::BuiltPerCall => "built per call",
        })
    }
}

/// What a receipt says about the block mask of a launch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockMaskUse {
    pub source: BlockMaskSource,
    pub block_m: u32,
    pub block_n: u32,
    /// Non-empty tiles over all tiles inside the sequences (timed launches, where the
    /// lists are downloaded to count them).
    pub live_fraction: Option<f64>,
    /// GPU time of the classification (timed launches that built it).
    pub classify_ms: Option<f64>,
}
