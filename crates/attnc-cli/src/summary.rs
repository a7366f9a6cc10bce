//! The summary `attnc dump --emit ir` prints under the variant: which family was chosen
//! and why, the kernels with their launch shapes, and what the mask means for tiling.
//! Written as .attn comments, so the whole output still parses.

use attnc::{Align, CompileOptions, CompiledModule, KvLayout, Spec, SplitKv, TileClass};
use std::fmt::Write;

/// Line-comment marker of the .attn language.
const COMMENT: &str = "//";

pub fn summary(spec: &Spec, opts: &CompileOptions, module: Option<&CompiledModule>) -> String {
    let mut lines: Vec<String> = Vec::new();
    lines.push(format!("---- attnc summary: {} pass for {} ----", opts.direction, opts.arch));
    let requested = opts.family.name();
    match module {
        Some(m) => {
            lines.push(format!("family: {} (requested: {requested})", m.family));
            if let Some(r) = &m.fallback_reason {
                lines.push(format!("fallback reason: {r}"));
            }
            for k in &m.kernels {
                lines.push(format!(
                    "kernel {} ({}): {} threads, block_m {}, block_n {}, dynamic smem {} B, {} params",
                    k.name,
                    k.describe_role(),
                    k.threads_per_block,
                    k.block_m,
                    k.block_n,
                    k.dynamic_smem_bytes,
                    k.params.len()
                ));
            }
        }
        None => lines.push(format!("family: none (requested: {requested}; codegen failed, see stderr)")),
    }
    lines.push(shape_line(spec));
    lines.extend(mask_facts(spec, module));
    let mut out = String::new();
    for l in lines {
        let _ = writeln!(out, "{COMMENT} {l}");
    }
    out
}

fn shape_line(spec: &Spec) -> String {
    let heads = if spec.q_heads == spec.kv_heads {
        format!("{} heads (MHA)", spec.q_heads)
    } else {
        let kind = if spec.kv_heads == 1 { "MQA" } else { "GQA" };
        format!(
            "{} q heads / {} kv heads ({kind}, group {}{})",
            spec.q_heads,
            spec.kv_heads,
            spec.group_size(),
            if spec.pack_gqa { ", packed" } else { "" }
        )
    };
    let layout = match spec.kv_layout {
        KvLayout::Contiguous => "contiguous".to_string(),
        KvLayout::Varlen => "varlen".to_string(),
        KvLayout::Paged { page_size } => format!("paged (page {page_size})"),
    };
    let split = match spec.split_kv {
        SplitKv::None => "none".to_string(),
        SplitKv::Fixed(n) => n.to_string(),
        SplitKv::Auto => "auto".to_string(),
    };
    format!(
        "shape: {}, d_qk {}, d_v {}, {heads}, kv {layout}, split-kv {split}, scale {:.6}{}{}",
        spec.dtype,
        spec.head_dim_qk,
        spec.head_dim_v,
        spec.scale_value(),
        if spec.sinks { ", sinks" } else { "" },
        if spec.lse { ", lse" } else { "" },
    )
}

/// What the mask means for the tile loop: the IR's static mask facts and, as an
/// illustration, how the tiles of one (batch, head) split at seqlen 4096.
fn mask_facts(spec: &Spec, module: Option<&CompiledModule>) -> Vec<String> {
    let m = &spec.mask;
    let facts = attnc::mask_facts(spec);
    if !facts.has_mask {
        return vec!["mask: none (every tile is full; no masking code)".into()];
    }
    let mut parts = Vec::new();
    if let Some(a) = m.causal {
        parts.push(format!("causal ({})", align(a)));
    }
    if let Some(w) = m.window {
        let side = |s: Option<u64>| s.map(|v| v.to_string()).unwrap_or_else(|| "unbounded".into());
        parts.push(format!("window (left {}, right {}, {})", side(w.left), side(w.right), align(w.align)));
    }
    if m.predicate.is_some() {
        parts.push("predicate".into());
    }
    let mut out = vec![format!("mask: {}", parts.join(" and "))];
    let mut reads: Vec<&str> = Vec::new();
    for (flag, name) in [
        (facts.uses_q, "q"),
        (facts.uses_k, "k"),
        (facts.uses_batch, "b"),
        (facts.uses_head, "h/hkv"),
        (facts.depends_on_seqlens, "seqlens"),
        (facts.reads_params, "params"),
        (facts.reads_aux, "aux tensors"),
    ] {
        if flag {
            reads.push(name);
        }
    }
    out.push(format!(
        "mask facts: reads {}; {}",
        if reads.is_empty() { "nothing".to_string() } else { reads.join(", ") },
        match (facts.needs_elementwise, facts.constant) {
            (false, Some(c)) => format!("every tile is {c:?} (no per-element masking)"),
            _ if facts.reads_aux => "per-element masking (aux reads are not analyzable)".to_string(),
            _ => "tiles classified full / partial / empty by interval analysis".to_string(),
        }
    ));
    if let Some(line) = module.and_then(|m| tile_census(spec, m)) {
        out.push(line);
    }
    out
}

/// Full / partial / empty tile counts of the first kernel's tiling for one (b=0, h=0)
/// at seqlen_q = seqlen_k = 4096, params unknown.
fn tile_census(spec: &Spec, module: &CompiledModule) -> Option<String> {
    const SEQ: i64 = 4096;
    let k0 = module.kernels.first()?;
    if k0.block_m == 0 || k0.block_n == 0 {
        return None;
    }
    // With pack_gqa a tile's rows are (q position, head in group) pairs.
    let group = if spec.pack_gqa { spec.group_size().max(1) } else { 1 };
    let rows = (k0.block_m / group).max(1) as i64;
    let cols = k0.block_n as i64;
    let (mut full, mut partial, mut empty) = (0u64, 0u64, 0u64);
    let mut q0 = 0;
    while q0 < SEQ {
        let mut c0 = 0;
        while c0 < SEQ {
            let q = attnc::ir::IntRange::new(q0, (q0 + rows).min(SEQ) - 1);
            let k = attnc::ir::IntRange::new(c0, (c0 + cols).min(SEQ) - 1);
            let tq = attnc::ir::TileQuery::tile(spec, 0, 0, q, k, SEQ, SEQ);
            match attnc::ir::classify(spec, &tq) {
                TileClass::Full => full += 1,
                TileClass::Partial => partial += 1,
                TileClass::Empty => empty += 1,
            }
            c0 += cols;
        }
        q0 += rows;
    }
    Some(format!(
        "tiles at seqlen 4096 ({}x{} tiles of {}, b=0, h=0): {full} full, {partial} partial, {empty} empty",
        rows, cols, k0.name
    ))
}

fn align(a: Align) -> &'static str {
    a.name()
}
