//! Family-level tests: PTX content, ptxas resources (sm_100a) and SASS.

use super::*;
use attnc_ir::{Align, KvLayout};

/// The forward through the family contract.
fn compile(spec: &Spec, arch: Arch) -> Result<CompiledModule, LowerError> {
    Blackwell.compile(spec, arch, Direction::Forward)
}

fn variants() -> Vec<Spec> {
    let mut v = Vec::new();
    v.push(Spec::new("mha", 128, 4));
    let mut c = Spec::new("causal", 128, 8);
    c.kv_heads = 2;
    c.mask.causal = Some(Align::TopLeft);
    c.lse = true;
    c.softmax.exp2_emulation = 0.25;
    c.softmax.rescale_threshold = 8.0;
    v.push(c);
    let mut g = Spec::new("gqa_packed", 128, 32);
    g.kv_heads = 8;
    g.pack_gqa = true;
    g.mask.causal = Some(Align::BottomRight);
    g.lse = true;
    g.sinks = true;
    v.push(g);
    let mut f = Spec::new("vit", 64, 4);
    f.dtype = attnc_ir::DType::Fp16;
    f.sinks = true;
    v.push(f);
    // Split-KV: partials into the combine kernel; masked (the span of live tiles is cut)
    // and unmasked with sinks (the combine adds them).
    let mut sd = Spec::new("split_decode", 128, 32);
    sd.kv_heads = 8;
    sd.pack_gqa = true;
    sd.mask.causal = Some(Align::BottomRight);
    sd.split_kv = attnc_ir::SplitKv::Auto;
    sd.lse = true;
    v.push(sd);
    let mut ss = Spec::new("split_sinks", 64, 8);
    ss.split_kv = attnc_ir::SplitKv::Fixed(3);
    ss.sinks = true;
    v.push(ss);
    // Paged KV by TMA: pages holding whole tiles (one box per tile, row offset inside
    // the page) and small pages (one box per page, 8-row minimum).
    let mut pl = Spec::new("paged_256", 64, 8);
    pl.kv_layout = KvLayout::Paged { page_size: 256 };
    pl.mask.causal = Some(Align::BottomRight);
    v.push(pl);
    let mut p8 = Spec::new("paged_8", 128, 4);
    p8.kv_layout = KvLayout::Paged { page_size: 8 };
    p8.softmax.exp2_emulation = 0.125;
    v.push(p8);
    // One Q tile per CTA (head dim 256), paged, a window mask (both softmax copies).
    let mut wide = Spec::new("one_tile_d256", 256, 4);
    wide.dtype = attnc_ir::DType::Fp16;
    wide.kv_layout = KvLayout::Paged { page_size: 128 };
    wide.mask.window = Some(attnc_ir::Window { left: Some(300), right: Some(0), align: Align::TopLeft });
    v.push(wide);
    // Head dims that are not multiples of 64 (whole boxes, zero-filled past d) and
    // 192/192 (one Q tile: two O of 192 columns do not fit beside two S tiles).
    let mut d96 = Spec::new("d96", 96, 8);
    d96.kv_heads = 2;
    d96.mask.causal = Some(Align::TopLeft);
    d96.split_kv = SplitKv::Fixed(2);
    v.push(d96);
    let mut d192 = Spec::new("d192", 192, 8);
    d192.kv_layout = KvLayout::Varlen;
    d192.sinks = true;
    v.push(d192);
    // Pages TMA boxes cannot follow: gathered by warps 14-15 (cp.async).
    let mut g1 = Spec::new("gather_page1", 64, 8);
    g1.kv_heads = 2;
    g1.kv_layout = KvLayout::Paged { page_size: 1 };
    g1.mask.causal = Some(Align::BottomRight);
    g1.split_kv = SplitKv::Auto;
    v.push(g1);
    let mut g48 = Spec::new("gather_page48", 128, 8);
    g48.kv_layout = KvLayout::Paged { page_size: 48 };
    g48.lse = true;
    v.push(g48);
    v
}

#[test]
fn ptx_has_the_pipeline_instructions() {
    for spec in variants() {
        let m = compile(&spec, Arch::Sm100a).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert!(m.ptx.is_ascii());
        for needle in [
            "tcgen05.mma.cta_group::1.kind::f16",
            "tcgen05.commit.cta_group::1.mbarrier::arrive::one",
            "tcgen05.ld.sync.aligned.32x32b.x32.b32",
            "tcgen05.st.sync.aligned.32x32b.x32.b32",
            "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
            "tcgen05.dealloc.cta_group::1.sync.aligned.b32",
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes",
            ".maxntid 512",
            ".param .align 64 .b8 ",
        ] {
            assert!(m.ptx.contains(needle), "{}: no `{needle}`", spec.name);
        }
        let r = Config::for_spec(&spec).expect("cfg").regs;
        for needle in [
            format!("setmaxnreg.inc.sync.aligned.u32 {}", r.softmax),
            format!("setmaxnreg.dec.sync.aligned.u32 {}", r.correction),
            format!("setmaxnreg.dec.sync.aligned.u32 {}", r.other),
        ] {
            assert!(m.ptx.contains(&needle), "{}: no `{needle}`", spec.name);
        }
    }
}

/// A split-KV module holds the forward kernel (writing partials when num_splits > 1)
/// and the portable combine kernel.
#[test]
fn split_kv_writes_partials_and_brings_the_combine_kernel() {
    let spec = variants().into_iter().find(|s| s.name == "split_decode").expect("variant");
    crate::llvm::keep_llvm_ir(true);
    let m = compile(&spec, Arch::Sm100a).expect("compiles");
    let names: Vec<&str> = m.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["attnc_split_decode_fwd", "attnc_split_decode_combine"]);
    let params: Vec<String> =
        m.kernels[0].params.iter().map(|p| p.split(':').next().unwrap_or("").to_string()).collect();
    for p in ["num_splits", "o_partial", "lse_partial"] {
        assert!(params.iter().any(|x| x == p), "forward has no {p}: {params:?}");
    }
    for needle in ["store_partial", "split_lo", "split_hi"] {
        assert!(m.llvm_ir.contains(needle), "no `{needle}` in the LLVM IR");
    }
}

/// Paged K/V: one TMA box per page for small pages (block-table loads, pages past the
/// sequence clamped), one per tile inside big pages; the tail tile's V rows past
/// seqlen_k are zeroed before P·V (paged and varlen only).
#[test]
fn paged_kv_loads_pages_by_tma() {
    let count = |ptx: &str, needle: &str| ptx.matches(needle).count();
    let small = variants().into_iter().find(|s| s.name == "paged_8").expect("variant");
    let m = compile(&small, Arch::Sm100a).expect("compiles");
    // K and V, 2 column boxes each, 16 pages of 8 rows per tile (+ 2·2 Q boxes).
    assert_eq!(count(&m.ptx, "cp.async.bulk.tensor.4d.shared::cluster"), 2 * 2 * 16 + 2 * 2, "TMA count");
    assert!(m.ptx.contains("zero V rows past seqlen_k"), "no V tail zeroing");
    assert!(m.ptx.contains("fence.proxy.async.shared::cta"));
    let maps = abi::tensor_maps(&small);
    assert_eq!(maps[1].global_dims, ["128", "page_size", "kv_heads", "num_pages"]);
    assert_eq!(maps[1].box_dims, [64, 8, 1, 1]);
    assert_eq!(abi::tma_boxes(&small)[2].box_rows, 8);
    let big = variants().into_iter().find(|s| s.name == "paged_256").expect("variant");
    let m = compile(&big, Arch::Sm100a).expect("compiles");
    assert_eq!(
        count(&m.ptx, "cp.async.bulk.tensor.4d.shared::cluster"),
        4,
        "TMA count (d 64: one box per Q tile, K and V)"
    );
    assert_eq!(abi::tensor_maps(&big)[1].box_dims, [64, 128, 1, 1]);
    let mut contiguous = Spec::new("c", 128, 4);
    contiguous.mask.causal = Some(Align::TopLeft);
    assert!(!compile(&contiguous, Arch::Sm100a).expect("compiles").ptx.contains("zero V rows past seqlen_k"));
}

/// Page sizes TMA cannot follow: warps 14 (K) and 15 (V) gather rows with cp.async into
/// the same swizzled slots, arrive per lane on KvFull (32 arrivals), and the MMA thread
/// fences the proxies before reading; K/V come as pointers and strides, not maps.
#[test]
fn small_pages_are_gathered_by_two_warps() {
    let spec = variants().into_iter().find(|s| s.name == "gather_page48").expect("variant");
    let cfg = Config::for_spec(&spec).expect("cfg");
    assert!(cfg.gather);
    assert_eq!(cfg.bar_count(config::Bar::KvFull(0)), 32);
    let m = compile(&spec, Arch::Sm100a).expect("compiles");
    for needle in
        ["cp.async.cg.shared.global", "cp.async.mbarrier.arrive.noinc.shared::cta.b64", "fence.proxy.async.shared::cta"]
    {
        assert!(m.ptx.contains(needle), "no `{needle}`");
    }
    // Only Q by TMA: 2 Q tiles x 2 column boxes.
    assert_eq!(m.ptx.matches("cp.async.bulk.tensor.4d.shared::cluster").count(), 4);
    let k = &m.kernels[0];
    let maps: Vec<&str> = k.tensor_maps.iter().map(|b| b.tensor.as_str()).collect();
    assert_eq!(maps, ["q", "o"]);
    for p in ["k:ptr", "v:ptr", "k_stride_row:i64", "v_stride_batch:i64", "block_table:ptr", "seqused_k:ptr"] {
        assert!(k.params.iter().any(|x| x == p), "no {p} in {:?}", k.params);
    }
    assert!(!k.params.iter().any(|x| x.starts_with("tmap_k")));
    assert!(report::report(&spec).expect("report").to_string().contains("cp.async row gather"));
}

/// O leaves through a swizzled staging box and TMA stores (one per 64 columns and Q
/// tile), 5-D with pack_gqa; varlen and split-KV keep row stores.
#[test]
fn o_leaves_by_tma_store_where_boxes_fit() {
    let mha = Spec::new("mha", 128, 4);
    let m = compile(&mha, Arch::Sm100a).expect("compiles");
    assert_eq!(m.ptx.matches("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group").count(), 4);
    assert!(m.ptx.contains("cp.async.bulk.wait_group.read 0"));
    assert!(m.kernels[0].params.iter().any(|p| p == "tmap_o:tensormap"));
    assert!(m.kernels[0].tensor_maps.iter().any(|b| b.tensor == "o" && b.box_rows == 128));
    assert!(Config::for_spec(&mha).expect("cfg").smem().o_stage.is_some_and(|o| o % 1024 == 0));
    let packed = variants().into_iter().find(|s| s.name == "gqa_packed").expect("variant");
    let m = compile(&packed, Arch::Sm100a).expect("compiles");
    assert_eq!(m.ptx.matches("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group").count(), 4);
    for name in ["split_decode", "d192"] {
        let spec = variants().into_iter().find(|s| s.name == name).expect("variant");
        let m = compile(&spec, Arch::Sm100a).expect("compiles");
        assert!(!m.ptx.contains(".global.shared::cta.bulk_group"), "{name}");
        assert!(!m.kernels[0].params.iter().any(|p| p.starts_with("tmap_o")), "{name}");
        assert!(m.ptx.contains("st.global.v4.b32"), "{name}");
    }
}

#[test]
fn packed_gqa_loads_q_with_a_5d_box() {
    let spec = variants().into_iter().find(|s| s.pack_gqa).expect("a packed variant");
    let m = compile(&spec, Arch::Sm100a).expect("compiles");
    assert!(m.ptx.contains("cp.async.bulk.tensor.5d."), "Q through the 5-D map");
    let maps = abi::tensor_maps(&spec);
    assert_eq!(maps[0].box_dims, vec![64, 4, 32, 1, 1]);
    assert_eq!(maps[0].global_dims[1], "4");
    assert_eq!(maps[1].box_dims, vec![64, 128, 1, 1]);
    // G = 3 does not divide 128: the kernel runs the heads unpacked (rank-4 Q map, one
    // work tile per query head) and the forward kernel's role says so.
    let odd = Spec { q_heads: 24, kv_heads: 8, ..spec.clone() };
    assert_eq!(kernel_unsupported_reason(&odd, Arch::Sm100a), None);
    let m = compile(&odd, Arch::Sm100a).expect("compiles unpacked");
    assert!(!m.ptx.contains("cp.async.bulk.tensor.5d."));
    let note = m.kernels[0].note.clone().unwrap_or_default();
    assert!(note.contains("pack_gqa off: 3 query heads"), "{note}");
    assert!(m.kernels[0].tensor_maps.iter().all(|b| b.pack_group == 1));
    assert!(effective_spec(&spec).1.is_none());
}

#[test]
fn unsupported_variants_say_why() {
    let mut s = Spec::new("x", 128, 8);
    assert_eq!(kernel_unsupported_reason(&s, Arch::Sm100a), None);
    assert!(unsupported_reason(&s, Arch::Sm90a).is_some());
    s.split_kv = SplitKv::Fixed(2);
    assert_eq!(kernel_unsupported_reason(&s, Arch::Sm100a), None);
    // Every page size runs: TMA boxes where they can follow the pages, else a gather.
    for (page, tma) in
        [(16, true), (8, true), (128, true), (384, true), (4, false), (1, false), (48, false), (192, false)]
    {
        let mut p = Spec::new("x", 128, 8);
        p.kv_layout = KvLayout::Paged { page_size: page };
        assert_eq!(kernel_unsupported_reason(&p, Arch::Sm100a), None, "page {page}");
        assert_eq!(config::gathers(&p), !tma, "page {page}");
    }
}

/// Dumps each variant's PTX to $ATTNC_DUMP_DIR (dev aid).
#[test]
fn dump_ptx_when_asked() {
    let Some(dir) = std::env::var_os("ATTNC_DUMP_DIR") else { return };
    let mut specs = variants();
    specs.extend(accepted_examples());
    for spec in specs {
        let mut cfg = Config::for_spec(&spec).expect("cfg");
        if let Ok(r) = std::env::var("ATTNC_BW_REGS") {
            let v: Vec<u32> = r.split(',').map(|x| x.parse().expect("number")).collect();
            cfg.regs = config::RegBudget { softmax: v[0], correction: v[1], other: v[2] };
        }
        let m = build_module(&spec, Arch::Sm100a, &cfg).expect("compiles");
        std::fs::write(std::path::Path::new(&dir).join(format!("{}.ptx", spec.name)), &m.ptx).expect("write");
    }
}

/// The dsl-examples/ this family accepts, parsed.
pub(super) fn accepted_examples() -> Vec<Spec> {
    specs_in("dsl-examples").into_iter().filter(|s| kernel_unsupported_reason(s, Arch::Sm100a).is_none()).collect()
}

/// Every `.attn` file of the repository folder `dir`, parsed, in file-name order.
pub(super) fn specs_in(dir: &str) -> Vec<Spec> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .collect();
    files.sort();
    files.iter().map(|p| attnc_dsl::parse_file(p).unwrap_or_else(|d| panic!("{}: {d}", p.display()))).collect()
}

/// Dev aid: ptxas spills per register split ($ATTNC_BW_SWEEP=1).
#[test]
fn sweep_register_budgets_when_asked() {
    if std::env::var_os("ATTNC_BW_SWEEP").is_none() {
        return;
    }
    let mut specs = variants();
    specs.extend(accepted_examples());
    let only = std::env::var("ATTNC_BW_ONLY").unwrap_or_default();
    let budgets: Vec<(u32, u32, u32)> = match std::env::var("ATTNC_BW_BUDGETS") {
        Ok(b) => b
            .split(';')
            .map(|t| {
                let v: Vec<u32> = t.split(',').map(|x| x.parse().expect("n")).collect();
                (v[0], v[1], v[2])
            })
            .collect(),
        Err(_) => vec![(192, 80, 48), (184, 80, 64), (176, 96, 64), (168, 112, 64), (176, 80, 80)],
    };
    for spec in specs.into_iter().filter(|s| only.is_empty() || only.split(',').any(|o| o == s.name)) {
        for &(s, c, o) in &budgets {
            let mut cfg = Config::for_spec(&spec).expect("cfg");
            cfg.regs = config::RegBudget { softmax: s, correction: c, other: o };
            let m = build_module(&spec, Arch::Sm100a, &cfg).expect("compiles");
            let r = crate::ptxas::assemble(&m.ptx, Arch::Sm100a).expect("assembles");
            eprintln!("{} {s}/{c}/{o}: spill {} regs {}", spec.name, r.total_spill_bytes(), r.kernels[0].registers);
        }
    }
}

/// Every example this family accepts (and the unit variants) assembles with ptxas for
/// sm_100a: zero spills, launch registers within 65536 / 512, every setmaxnreg region
/// below its budget, shared memory ≤ 227 KB, the TMEM allocation the model predicts, the
/// promised tcgen05/TMA SASS, and the MUFU.EX2 : emulated-exp2 ratio. Skips without
/// ptxas; fails when CI is set and ptxas is missing.
#[test]
fn every_accepted_example_assembles_within_the_model() {
    let mut specs = variants();
    specs.extend(accepted_examples());
    let mut failures = Vec::new();
    let mut table = String::new();
    for spec in &specs {
        let cfg = Config::for_spec(spec).expect("cfg");
        let m = compile(spec, Arch::Sm100a).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        let v = match verify::verify(&m.ptx) {
            Ok(Some(v)) => v,
            Ok(None) => {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas and nvdisasm");
                eprintln!("skipping: ptxas or nvdisasm not installed");
                return;
            }
            Err(e) => panic!("{}: {e}", spec.name),
        };
        table.push_str(&format!(
            "{:<22} regs {:>3} spill {:>3} regions {:?} MUFU.EX2 {:>3} FADD.RM {:>3} FRND/F2I {:>3}\n",
            spec.name,
            v.registers,
            v.spill_bytes,
            v.regions.iter().map(|r| (r.budget, r.max_reg)).collect::<Vec<_>>(),
            v.mufu_ex2,
            v.emulated_floor,
            v.conversions
        ));
        for p in verify::problems(spec, &cfg, &v) {
            failures.push(format!("{}: {p}", spec.name));
        }
    }
    eprintln!("{table}");
    assert!(!specs.is_empty());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The emulated exp2 runs on the FMA/ALU pipes only: emulating a quarter of each row adds
/// `FADD.RM`s but not one conversion-pipe op (`FRND`, `F2I` share the quarter-rate pipe
/// with `MUFU.EX2`, so using them would cost more than the MUFU op it replaces).
#[test]
fn emulated_exp2_adds_no_conversion_pipe_ops() {
    let mut with = Spec::new("emulated", 128, 4);
    with.softmax.exp2_emulation = 0.25;
    let mut without = with.clone();
    without.softmax.exp2_emulation = 0.0;
    let mut seen = Vec::new();
    for spec in [&with, &without] {
        let m = compile(spec, Arch::Sm100a).expect("compile");
        match verify::verify(&m.ptx) {
            Ok(Some(v)) => seen.push(v),
            Ok(None) => {
                assert!(std::env::var_os("CI").is_none(), "CI must have ptxas and nvdisasm");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(seen[0].emulated_floor, verify::expected_exp_counts(&with).0);
    assert!(seen[0].emulated_floor > 0);
    assert_eq!(seen[1].emulated_floor, 0);
    assert_eq!(seen[0].conversions, seen[1].conversions, "the emulation added FRND/F2I");
}

/// The schedule summary (cycle model, TMEM map, roles, shared memory, mbarriers) of every
/// example this family accepts, pinned by insta snapshots in `snapshots/`.
#[test]
fn schedule_summaries() {
    for spec in accepted_examples() {
        let r = report::report(&spec).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        insta::assert_snapshot!(format!("schedule_{}", spec.name), r.to_string());
    }
}

/// What the dispatcher says for the examples it declines (the receipts' fallback reasons).
#[test]
fn fallback_reasons() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dsl-examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("dsl-examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .collect();
    files.sort();
    let mut out = String::new();
    for p in files {
        let spec = attnc_dsl::parse_file(&p).expect("parses");
        let why = unsupported_reason(&spec, Arch::Sm100a).unwrap_or_else(|| "blackwell".into());
        out.push_str(&format!("{}: {why}\n", spec.name));
    }
    insta::assert_snapshot!(out);
}

/// FA4's back-to-back PV/QK order compiles, assembles within the model, and drops the
/// PvDone commits the fenced order adds.
#[test]
fn in_order_pipe_variant() {
    let spec = Spec::new("mha_inorder", 128, 4);
    let mut cfg = Config::for_spec(&spec).expect("cfg");
    let fenced = compile_with_config(&spec, Arch::Sm100a, &cfg).expect("fenced");
    cfg.pv_order = config::PvOrder::InOrderPipe;
    let m = compile_with_config(&spec, Arch::Sm100a, &cfg).expect("in order");
    let commits = |p: &str| p.matches("tcgen05.commit").count();
    assert!(commits(&m.ptx) < commits(&fenced.ptx));
    if let Ok(Some(v)) = verify::verify(&m.ptx) {
        let p = verify::problems(&spec, &cfg, &v);
        assert!(p.is_empty(), "{p:?}");
    }
}
