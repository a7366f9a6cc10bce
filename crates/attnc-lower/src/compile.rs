//! The one entry point of lowering: a validated spec, a direction and a family choice
//! become a [`CompiledModule`]. Fails closed: an explicitly requested family that cannot
//! compile the spec is an error, `Auto` falls back along [`candidates`] and records why.

use crate::arch::Arch;
use crate::error::LowerError;
use crate::families::family;
use crate::module::{CompiledModule, Direction, FamilyKind};
use attnc_ir::{KvLayout, Spec, SplitKv};

/// Which family to compile with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FamilyChoice {
    /// The family the dispatcher would pick on the arch.
    #[default]
    Auto,
    Exactly(FamilyKind),
}

impl FamilyChoice {
    /// "auto", "portable", ...
    pub fn name(self) -> &'static str {
        match self {
            FamilyChoice::Auto => "auto",
            FamilyChoice::Exactly(k) => k.name(),
        }
    }
}

impl std::str::FromStr for FamilyChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(FamilyChoice::Auto);
        }
        FamilyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .map(FamilyChoice::Exactly)
            .ok_or_else(|| format!("unknown family `{s}`: expected auto, portable, hopper or blackwell"))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    pub arch: Arch,
    pub family: FamilyChoice,
    pub direction: Direction,
}

impl CompileOptions {
    /// The forward with the dispatcher's family choice.
    pub fn new(arch: Arch) -> Self {
        CompileOptions { arch, family: FamilyChoice::Auto, direction: Direction::Forward }
    }
    pub fn direction(self, direction: Direction) -> Self {
        CompileOptions { direction, ..self }
    }
    pub fn family(self, family: FamilyChoice) -> Self {
        CompileOptions { family, ..self }
    }
}

/// Why `direction` of `spec` does not exist for any family, or `None`. Paged KV and
/// split-KV are inference layouts: a model trains on contiguous or varlen K/V, and a
/// split only divides the forward's work, so neither has a backward.
pub fn pass_unsupported_reason(spec: &Spec, direction: Direction) -> Option<String> {
    if direction == Direction::Forward {
        return None;
    }
    if let KvLayout::Paged { .. } = spec.kv_layout {
        return Some("paged KV is an inference layout (train on contiguous or varlen K/V)".into());
    }
    if spec.split_kv != SplitKv::None {
        return Some("split-KV is an inference layout (its splits divide the forward's work; drop `split`)".into());
    }
    None
}

/// Which families could run on `arch`, fastest first.
pub fn candidates(arch: Arch) -> &'static [FamilyKind] {
    match arch {
        Arch::Sm80 => &[FamilyKind::Portable],
        Arch::Sm90a => &[FamilyKind::Hopper, FamilyKind::Portable],
        Arch::Sm100a => &[FamilyKind::Blackwell, FamilyKind::Portable],
    }
}

/// Why `family` cannot compile `direction` of `spec` for `arch`, or `None` when it can.
pub fn unsupported_reason(family_kind: FamilyKind, spec: &Spec, arch: Arch, direction: Direction) -> Option<String> {
    family(family_kind).unsupported_reason(spec, arch, direction)
}

/// The family `choice` resolves to for `direction` of `spec` on `arch`, and why faster
/// candidates were passed over (`None` when none was).
pub fn choose_family(
    spec: &Spec,
    arch: Arch,
    direction: Direction,
    choice: FamilyChoice,
) -> Result<(FamilyKind, Option<String>), LowerError> {
    match choice {
        FamilyChoice::Exactly(f) => match unsupported_reason(f, spec, arch, direction) {
            Some(reason) => Err(LowerError::Unsupported { family: f, direction, arch, reason }),
            None => Ok((f, None)),
        },
        FamilyChoice::Auto => {
            let mut reasons = Vec::new();
            for &f in candidates(arch) {
                match unsupported_reason(f, spec, arch, direction) {
                    None => return Ok((f, (!reasons.is_empty()).then(|| reasons.join("; ")))),
                    Some(r) => reasons.push(format!("{f}: {r}")),
                }
            }
            Err(LowerError::NoFamily { direction, arch, reason: reasons.join("; ") })
        }
    }
}

/// Lowers `opts.direction` of a spec to PTX with the chosen (or best available) family.
pub fn compile(spec: &Spec, opts: &CompileOptions) -> Result<CompiledModule, LowerError> {
    if let Err(errors) = attnc_ir::validate(spec) {
        let msgs: Vec<String> = errors.iter().map(|e| e.message.clone()).collect();
        return Err(LowerError::InvalidSpec(msgs.join("; ")));
    }
    if let Some(reason) = pass_unsupported_reason(spec, opts.direction) {
        return Err(LowerError::NoSuchPass { direction: opts.direction, reason });
    }
    let (kind, fallback_reason) = choose_family(spec, opts.arch, opts.direction, opts.family)?;
    let mut module = family(kind).compile(spec, opts.arch, opts.direction)?;
    module.fallback_reason = fallback_reason;
    Ok(module)
}

/// What [`compile_without_spills`] returns: the module, its ptxas report, and the spills
/// of the configurations it stepped down from (empty when the first fitted).
#[derive(Debug)]
pub struct SpillFreeCompile {
    pub module: CompiledModule,
    pub report: crate::ptxas::PtxasReport,
    pub stepped_down: Vec<String>,
}

/// [`compile`], then ptxas (`ptxas`), then — while the module spills — the chosen
/// family's smaller configurations in order ([`Family::step_down`]): a spec that
/// does not fit the default tiles gets smaller ones, never a silent spill. The module's
/// `config_note` then says which configuration spilled how much and what the one kept
/// gave up. When every configuration of a family `auto` chose spills, the portable
/// family runs instead (the reason says so); when portable's spill too, or the family was
/// named, the first module is returned with its report (`attnc check` fails on it, the
/// runtime runs it).
///
/// [`Family::step_down`]: crate::families::Family::step_down
pub fn compile_without_spills(
    spec: &Spec,
    opts: &CompileOptions,
    ptxas: &std::path::Path,
) -> Result<SpillFreeCompile, LowerError> {
    compile_without_spills_or_portable(spec, opts, ptxas, opts.family == FamilyChoice::Auto)
}

/// [`compile_without_spills`] with the last step said explicitly: `to_portable` lets a
/// module whose every configuration spills fall back to portable (the runtime resolves
/// `auto` itself and compiles the family it chose by name).
pub fn compile_without_spills_or_portable(
    spec: &Spec,
    opts: &CompileOptions,
    ptxas: &std::path::Path,
    to_portable: bool,
) -> Result<SpillFreeCompile, LowerError> {
    let module = compile(spec, opts)?;
    let assemble = |m: &CompiledModule| {
        crate::ptxas::assemble_with(ptxas, &m.ptx, opts.arch).map_err(|e| LowerError::Ptxas(e.to_string()))
    };
    let report = assemble(&module)?;
    if !report.has_spills() {
        return Ok(SpillFreeCompile { module, report, stepped_down: Vec::new() });
    }
    let spilled = |r: &crate::ptxas::PtxasReport| {
        let worst = r.kernels.iter().chain(&r.functions).max_by_key(|f| f.spill_bytes());
        format!(
            "{} bytes of spills{}",
            r.total_spill_bytes(),
            worst.map_or_else(String::new, |f| format!(" ({} {} bytes)", f.name, f.spill_bytes()))
        )
    };
    let mut stepped_down = vec![spilled(&report)];
    let fam = family(module.family);
    for step in 1.. {
        let Some(next) = fam.step_down(spec, opts.arch, opts.direction, step) else { break };
        let (mut m, gave_up) = next?;
        let r = assemble(&m)?;
        if !r.has_spills() {
            m.fallback_reason.clone_from(&module.fallback_reason);
            m.config_note = Some(format!(
                "{}: the default configuration spilled ({}); {gave_up}",
                m.family.name(),
                stepped_down.join("; then ")
            ));
            return Ok(SpillFreeCompile { module: m, report: r, stepped_down });
        }
        stepped_down.push(spilled(&r));
    }
    // Every configuration of a family `auto` chose spills: portable, the family of last
    // resort, runs it (its own ladder first).
    if to_portable && module.family != FamilyKind::Portable {
        let portable = opts.clone().family(FamilyChoice::Exactly(FamilyKind::Portable));
        let mut fallback = compile_without_spills_or_portable(spec, &portable, ptxas, false)?;
        let why = format!("{}: every configuration spills ({})", module.family.name(), stepped_down.join("; "));
        fallback.module.fallback_reason = Some(match &module.fallback_reason {
            Some(a) => format!("{a}; {why}"),
            None => why,
        });
        fallback.stepped_down.splice(0..0, stepped_down);
        return Ok(fallback);
    }
    Ok(SpillFreeCompile { module, report, stepped_down })
}

/// Compiles `spec` in each of `directions` (the options' own direction is ignored), each
/// on its own thread with its own LLVM context, results in the order asked. A training
/// step needs the forward and the backward, and the two modules share nothing, so a cold
/// start takes about the longer of the two instead of their sum.
pub fn compile_directions(
    spec: &Spec,
    opts: &CompileOptions,
    directions: &[Direction],
) -> Vec<Result<CompiledModule, LowerError>> {
    if directions.len() <= 1 {
        return directions.iter().map(|&d| compile(spec, &opts.clone().direction(d))).collect();
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = directions
            .iter()
            .map(|&d| {
                let o = opts.clone().direction(d);
                scope.spawn(move || compile(spec, &o))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(LowerError::Llvm("a compile thread panicked".into()))))
            .collect()
    })
}
