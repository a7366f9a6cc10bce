#!/usr/bin/env python3
"""Tables of one side-by-side run: `attnc bench --json` next to the anchors' bench.py JSON
(same device command), as markdown on stdout.

Usage: python3 scripts/dev/side_by_side.py ATTNC_BENCH.json ANCHORS.json [MORE_PEERS.json ...]
(more peer files: e.g. `peers_bwd.py`'s backward at head_dim 64 and 128)
"""
import json
import sys


def main(attnc_path, *peer_paths):
    a = json.load(open(attnc_path))
    peers = [r for p in peer_paths for r in json.load(open(p))["results"] if "error" not in r]

    def peer(suite, **kw):
        return {r["backend"]: r for r in peers if r.get("suite") == suite and all(r.get(k) == v for k, v in kw.items())}

    nan = float("nan")
    c = a["ceilings"]
    print(f"Ceilings (attnc): copy {c['copy_tb_s']:.2f} TB/s, bf16 GEMM {c['gemm_tflops']:.1f} TFLOP/s.\n")
    if a.get("prefill"):
        print("## Prefill forward, TFLOP/s\n")
        print("| hdim | causal | seqlen | attnc | FA4 | cuDNN | FA2 | attnc / best(FA4, cuDNN) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for p in a["prefill"]:
            d = p["head_dim"][0] if isinstance(p["head_dim"], list) else p["head_dim"]
            pp = peer("fwd", hdim=d, causal=p["causal"], seqlen=p["seqlen"])
            f = lambda b: pp[b]["tflops"] if b in pp else nan
            best = max(f("fa4"), f("cudnn"))
            print(f"| {d} | {'yes' if p['causal'] else 'no'} | {p['seqlen']} | {p['tflops']:.1f} | {f('fa4'):.1f} "
                  f"| {f('cudnn'):.1f} | {f('fa2'):.1f} | {p['tflops'] / best:.3f} |")
    if a.get("backward"):
        print("\n## Backward, TFLOP/s\n")
        print("| hdim | causal | seqlen | attnc | attnc det. | det. ÷ default | FA4 | cuDNN | FA2 "
              "| attnc / best(FA4, cuDNN) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        det = {(tuple(b["head_dim"]), b["causal"], b["seqlen"]): b["tflops"] for b in a["backward"] if b["deterministic"]}
        for b in a["backward"]:
            if b["deterministic"]:
                continue
            d = b["head_dim"][0]
            pp = peer("bwd", hdim=d, causal=b["causal"], seqlen=b["seqlen"])
            f = lambda k: pp[k]["tflops"] if k in pp else nan
            best = max(f("fa4"), f("cudnn"))
            t_det = det.get((tuple(b["head_dim"]), b["causal"], b["seqlen"]), nan)
            print(f"| {d} | {'yes' if b['causal'] else 'no'} | {b['seqlen']} | {b['tflops']:.1f} | {t_det:.1f} "
                  f"| {t_det / b['tflops']:.2f} | {f('fa4'):.1f} | {f('cudnn'):.1f} | {f('fa2'):.1f} "
                  f"| {b['tflops'] / best:.3f} |")
    if a.get("decode"):
        print("\n## Decode (q 1, 32/8 heads, d 128)\n")
        print("Protocol time (events around the call, host included, as bench.py times the peers), "
              "the GPU's own time (launches queued behind a spin kernel) and the host's enqueue time.\n")
        print("| batch | seqlen_k | page | attnc µs | attnc TB/s | % copy | GPU µs | host µs | cuDNN TB/s | FA2 TB/s "
              "| FA4 splits=1 TB/s | paged ÷ contiguous |")
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        contig = {(x["batch"], x["seqlen_k"]): x["time"]["median_ms"] for x in a["decode"] if x["page_size"] == 0}
        for x in a["decode"]:
            pp = peer("decode", batch=x["batch"], seqlen_k=x["seqlen_k"])
            paged = x["page_size"] != 0
            g = lambda b: f"{pp[b]['tbps']:.2f}" if b in pp and not paged else "-"
            ratio = f"{contig[(x['batch'], x['seqlen_k'])] / x['time']['median_ms']:.2f}" if paged else "-"
            gpu = x.get("gpu_time") or {}
            print(f"| {x['batch']} | {x['seqlen_k']} | {x['page_size'] if paged else '-'} | {x['time']['median_ms'] * 1e3:.1f} "
                  f"| {x['tb_s']:.2f} | {100 * (x['fraction_of_copy'] or nan):.0f}% | {gpu.get('median_ms', nan) * 1e3:.1f} "
                  f"| {x.get('host_us') or nan:.1f} | {g('cudnn')} | {g('fa2')} | {g('fa4 splits=1')} | {ratio} |")
        lf = a.get("launch_floor")
        if lf:
            print(f"\nLaunch floor (an empty one-parameter kernel, same host): enqueue {lf['host_us']:.1f} µs, "
                  f"GPU time between events {lf['gpu_us']:.1f} µs.")
    ct = a.get("compile")
    if ct:
        print("\n## Compile\n")
        print(f"attnc, DSL text → loaded module on this host: runtime cold {ct['runtime_cold_ms']:.0f} ms; "
              f"DSL→PTX {ct['dsl_to_ptx_ms']:.0f} ms (IR {ct['lower_stages_ms'][0]:.0f}, LLVM opt "
              f"{ct['lower_stages_ms'][1]:.0f}, codegen {ct['lower_stages_ms'][2]:.0f}); ptxas "
              f"{ct.get('ptxas_ms') or nan:.0f} ms; memory hit {ct['memory_hit_us']:.1f} µs; disk hit "
              f"{ct['disk_hit_fresh_runtime_ms']:.2f} ms (fresh runtime), {ct.get('disk_hit_fresh_process_ms') or nan:.2f} ms "
              "(fresh process).")
        if ct.get("ready_first_interim_ms") is not None:
            print(f"Ready first (a portable kernel while the dispatcher's compiles): interim loaded after "
                  f"{ct['ready_first_interim_ms']:.0f} ms, the dispatcher's after {ct['ready_first_final_ms']:.0f} ms.")
        for r in peers:
            if r.get("suite") == "compile":
                print(f"{r['backend']} {r['pass']}: first call {r['first_s']:.2f} s, second {r['second_s'] * 1e3:.1f} ms.")


if __name__ == "__main__":
    main(*sys.argv[1:])
