//! The dispatcher: which kernel family runs a spec on this device. It walks the
//! families fastest first (`attnc_lower::families::candidates`) and takes the first
//! that both compiles the spec and that this runtime can launch; every family passed
//! over leaves its reason, which the receipt carries. An explicit request for a family
//! that cannot run is an error, never a silent substitute.

use crate::error::RuntimeError;
use attnc_ir::Spec;
use attnc_lower::families::{candidates, unsupported_reason};
use attnc_lower::{Arch, FamilyChoice, FamilyKind, LowerError};

/// Families whose launch ABI the runtime implements. Portable and hopper launch the
/// same grid (`ceil(rows / block_m), heads, batch x splits`), hopper with rank-4 TMA
/// tensor maps ([`crate::tma`]). Blackwell also needs a persistent grid
/// (`grid.x = min(SMs, work tiles)`) and, with pack_gqa, a rank-5 Q map; neither is wired.
pub fn runtime_unsupported_reason(family: FamilyKind) -> Option<&'static str> {
    match family {
        FamilyKind::Portable | FamilyKind::Hopper => None,
        FamilyKind::Blackwell => Some(
            "the runtime cannot launch the blackwell family yet (its persistent grid and the rank-5 pack-GQA Q tensor map are not wired)",
        ),
    }
}

/// The family that will run, and why faster ones were passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub family: FamilyKind,
    pub fallback_reason: Option<String>,
}

/// Resolves a family choice for `spec` on `arch`.
pub fn resolve(spec: &Spec, arch: Arch, choice: FamilyChoice) -> Result<Resolved, RuntimeError> {
    let why_not = |f: FamilyKind| -> Option<String> {
        unsupported_reason(f, spec, arch).or_else(|| runtime_unsupported_reason(f).map(str::to_string))
    };
    match choice {
        FamilyChoice::Exactly(f) => match why_not(f) {
            None => Ok(Resolved { family: f, fallback_reason: None }),
            Some(reason) => Err(RuntimeError::Lower(LowerError::Unsupported { family: f, arch, reason })),
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
            Err(RuntimeError::Lower(LowerError::Unsupported {
                family: FamilyKind::Portable,
                arch,
                reason: passed.join("; "),
            }))
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
        let r = resolve(&spec, Arch::Sm100a, FamilyChoice::Auto).expect("resolves");
        assert_eq!(r.family, FamilyKind::Portable);
        let why = r.fallback_reason.expect("a reason");
        assert!(why.contains("blackwell"), "{why}");
    }

    #[test]
    fn an_explicit_family_the_runtime_cannot_launch_is_an_error() {
        let spec = Spec::new("t", 128, 8);
        let e = resolve(&spec, Arch::Sm100a, FamilyChoice::Exactly(FamilyKind::Blackwell)).expect_err("refused");
        assert!(e.to_string().contains("blackwell"), "{e}");
        let ok = resolve(&spec, Arch::Sm90a, FamilyChoice::Exactly(FamilyKind::Portable)).expect("portable");
        assert_eq!(ok, Resolved { family: FamilyKind::Portable, fallback_reason: None });
    }

    #[test]
    fn the_runtime_launches_portable_and_hopper_not_blackwell() {
        assert_eq!(runtime_unsupported_reason(FamilyKind::Portable), None);
        assert_eq!(runtime_unsupported_reason(FamilyKind::Hopper), None);
        let why = runtime_unsupported_reason(FamilyKind::Blackwell).expect("refused");
        assert!(why.contains("persistent grid") && why.contains("rank-5"), "{why}");
    }

    #[test]
    fn auto_on_hopper_follows_the_compiler() {
        // Whether hopper runs is now the compiler's call alone (the runtime can launch it).
        let spec = Spec::new("t", 64, 4);
        let r = resolve(&spec, Arch::Sm90a, FamilyChoice::Auto).expect("resolves");
        match unsupported_reason(FamilyKind::Hopper, &spec, Arch::Sm90a) {
            None => assert_eq!(r, Resolved { family: FamilyKind::Hopper, fallback_reason: None }),
            Some(why) => {
                assert_eq!(r.family, FamilyKind::Portable);
                assert_eq!(r.fallback_reason, Some(format!("hopper: {why}")));
            }
        }
    }
}
