//! Records a fingerprint of the code generator for the JIT cache keys.
//!
//! While attnc's version stays at 0.x during development, two builds with the same version
//! can generate different PTX for the same spec. The cache key therefore includes a hash
//! of the sources that decide what PTX is generated (attnc-ir and attnc-lower, when they
//! sit beside this crate in the workspace) — a rebuilt code generator never reuses a stale
//! cached module. Outside the workspace (a published crate) the version alone is used.

use std::path::{Path, PathBuf};

fn fnv1a64(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    fnv1a64(&mut h, std::env::var("CARGO_PKG_VERSION").unwrap_or_default().as_bytes());
    let mut files = Vec::new();
    for sib in ["attnc-ir/src", "attnc-lower/src"] {
        let dir = manifest.join("..").join(sib);
        if dir.is_dir() {
            println!("cargo:rerun-if-changed={}", dir.display());
            collect(&dir, &mut files);
        }
    }
    files.sort();
    for f in &files {
        if let Ok(rel) = f.strip_prefix(manifest.join("..")) {
            fnv1a64(&mut h, rel.to_string_lossy().as_bytes());
        }
        if let Ok(bytes) = std::fs::read(f) {
            fnv1a64(&mut h, &(bytes.len() as u64).to_le_bytes());
            fnv1a64(&mut h, &bytes);
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=ATTNC_CODEGEN_FINGERPRINT={h:016x}");
}
