//! The dispatcher: which kernel family runs a direction of a spec on this device. It
//! walks the families fastest first (`attnc_lower::compile::candidates`) and takes the first
//! that both compiles the spec and that this runtime can launch; every family passed
//! over leaves its reason, which the receipt carries. An explicit request for a family
//! that cannot run is an error, never a silent substitute.

use crate::error::RuntimeError;
use attnc_ir::Spec;
use attnc_lower::compile::{candidates, unsupported_reason};
use attnc_lower::{Arch, Direction, FamilyChoice, FamilyKind, LowerError};

/// Why the runtime will not launch `family` for `spec`, or `None`. Portable and hopper
/// launch a tile grid (`ceil(rows / block_m), heads, batch x splits`), hopper with rank-4
/// TMA tensor maps ([`crate::tma`]). Blackwell's persistent grid is wired
/// (`KernelInfo::persistent`), but its kernel has never run on a B200: `Auto` passes it
/// over (fail closed), an explicit request runs it (how a B200 owner tests it:
/// `attnc selftest --family blackwell`), pack-GQA Q through a rank-5 tensor map.
pub fn runtime_unsupported_reason(family: FamilyKind, spec: &Spec, explicit: bool) -> Option<&'static str> {
    let _ = spec;
    match family {
        FamilyKind::Portable | FamilyKind::Hopper => None,
        FamilyKind::Blackwell if !explicit => Some(
            "never run on a B200 yet, so not chosen automatically (request it with `--family blackwell` to test it)",
        ),
        FamilyKind::Blackwell => None,
    }
}

/// The family that will run, and why faster ones were passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub family: FamilyKind,
    pub fallback_reason: Option<String>,
}

/// Resolves a family choice for `direction` of `spec` on `arch`.
pub fn resolve(spec: &Spec, arch: Arch, choice: FamilyChoice, direction: Direction) -> Result<Resolved, RuntimeError> {
    let explicit = matches!(choice, FamilyChoice::Exactly(_));
    let why_not = |f: FamilyKind| -> Option<String> {
        unsupported_reason(f, spec, arch, direction)
            .or_else(|| runtime_unsupported_reason(f, spec, explicit).map(str::to_string))
    };
    match choice {
        FamilyChoice::Exactly(f) => match why_not(f) {
            None => Ok(Resolved { family: f, fallback_reason: None }),
            Some(reason) => Err(RuntimeError::Lower(LowerError::Unsupported { family: f, direction, arch, reason })),
        },
        FamilyChoice::Auto => {
            let mut passed = Vec::new();
            for &f in candidates(arch) {
                match why_not(f) {
                    None => {
                        let fallback_reason = (!passed.is_empty()).then(|| passed.join("; "));
                        return Ok(Resolved { family: f, fallback_reason });
                    }
                    Some(r) => passed.push(format!("{f}: {r}")),
                }
            }
            Err(RuntimeError::Lower(LowerError::NoFamily { direction, arch, reason: passed.join("; ") }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_on_blackwell_falls_back_to_portable_with_a_reason() {
        let mut spec = Spec::new("t", 128, 8);
        spec.mask.causal = Some(attnc_ir::Align::TopLeft);
        let r = resolve(&spec, Arch::Sm100a, FamilyChoice::Auto, Direction::Forward).expect("resolves");
        assert_eq!(r.family, FamilyKind::Portable);
        let why = r.fallback_reason.expect("a reason");
        assert!(why.contains("blackwell"), "{why}");
    }

    #[test]
    fn blackwell_runs_only_when_asked_for() {
        let spec = Spec::new("t", 128, 8);
        // Both directions: the backward is built too, and passed over the same way.
        for direction in [Direction::Forward, Direction::Backward] {
            let r = resolve(&spec, Arch::Sm100a, FamilyChoice::Exactly(FamilyKind::Blackwell), direction)
                .expect("explicit request runs");
            assert_eq!(r, Resolved { family: FamilyKind::Blackwell, fallback_reason: None });
            let auto = resolve(&spec, Arch::Sm100a, FamilyChoice::Auto, direction).expect("resolves");
            assert_eq!(auto.family, FamilyKind::Portable);
            assert!(auto.fallback_reason.expect("a reason").contains("never run on a B200"));
        }
        let mut packed = Spec::new("p", 128, 8);
        packed.kv_heads = 2;
        packed.pack_gqa = true;
        let r = resolve(&packed, Arch::Sm100a, FamilyChoice::Exactly(FamilyKind::Blackwell), Direction::Forward)
            .expect("pack-GQA too");
        assert_eq!(r.family, FamilyKind::Blackwell);
        let ok = resolve(&spec, Arch::Sm90a, FamilyChoice::Exactly(FamilyKind::Portable), Direction::Forward)
            .expect("portable");
        assert_eq!(ok, Resolved { family: FamilyKind::Portable, fallback_reason: None });
    }

    #[test]
    fn the_runtime_launches_portable_and_hopper() {
        let spec = Spec::new("t", 128, 8);
        for explicit in [false, true] {
            assert_eq!(runtime_unsupported_reason(FamilyKind::Portable, &spec, explicit), None);
            assert_eq!(runtime_unsupported_reason(FamilyKind::Hopper, &spec, explicit), None);
        }
    }

    #[test]
    fn auto_on_hopper_follows_the_compiler() {
        // Whether hopper runs is now the compiler's call alone (the runtime can launch it).
        let spec = Spec::new("t", 64, 4);
        let r = resolve(&spec, Arch::Sm90a, FamilyChoice::Auto, Direction::Forward).expect("resolves");
        match unsupported_reason(FamilyKind::Hopper, &spec, Arch::Sm90a, Direction::Forward) {
            None => assert_eq!(r, Resolved { family: FamilyKind::Hopper, fallback_reason: None }),
            Some(why) => {
                assert_eq!(r.family, FamilyKind::Portable);
                assert_eq!(r.fallback_reason, Some(format!("hopper: {why}")));
            }
        }
    }
}
