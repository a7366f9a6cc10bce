#!/bin/bash
# The decode twin built for two resident CTAs per SM (twin_ctas_per_sm=2: 128 registers
# at launch, setmaxnreg 24/232) against the default (one CTA, 248): the forward selftest
# of the split and decode-shaped specs with it, then the decode suite, the two
# interleaved, three rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w71; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_TUNE=twin_ctas_per_sm=2 timeout 150 $R attnc selftest --no-grads --family hopper --json $W/sel_twin2.json \
  $E/gqa_decode_paged.attn $E/sinks.attn $E/mqa_falcon.attn $G/split_sinks.attn $G/paged_page128_d256.attn $G/gqa_d64.attn > $W/sel_twin2.txt 2>&1
echo "sel_twin2 rc $? $(date -u)" >> $W/device.txt
for r in 1 2 3; do
  timeout 60 $R attnc bench --suites decode --json $W/decode_def_$r.json > $W/decode_def_$r.txt 2>&1
  ATTNC_HOPPER_TUNE=twin_ctas_per_sm=2 timeout 60 $R attnc bench --suites decode --json $W/decode_twin2_$r.json > $W/decode_twin2_$r.txt 2>&1
  echo "decode round $r $(date -u)" >> $W/device.txt
done
cat $W/device.txt; tail -n 1 $W/sel_*.txt; grep -c FAIL $W/sel_*.txt
python3 - $W <<'PY'
import json, sys, statistics as st
W = sys.argv[1]
rows = {}
for lab in ("def", "twin2"):
    for r in (1, 2, 3):
        try: d = json.load(open(f"{W}/decode_{lab}_{r}.json"))
        except Exception as e: print(lab, r, e); continue
        for x in d["decode"]:
            k = (x["batch"], x["seqlen_k"], x["page_size"])
            g = (x.get("gpu_time") or {}).get("median_ms", float("nan")) * 1e3
            rows.setdefault(k, {}).setdefault(lab, []).append((x["time"]["median_ms"] * 1e3, g, x.get("num_splits"), x.get("receipt", "")))
print("batch seqlen page | def time/gpu | twin2 time/gpu | gpu ratio | splits")
for k, v in sorted(rows.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
    d, t = v.get("def", []), v.get("twin2", [])
    md = st.median([g for _, g, _, _ in d]) if d else float("nan"); mt = st.median([g for _, g, _, _ in t]) if t else float("nan")
    print(k, " ".join(f"{a:.1f}/{b:.1f}" for a, b, _, _ in d), "|", " ".join(f"{a:.1f}/{b:.1f}" for a, b, _, _ in t), f"| {mt/md:.3f} |", d[0][2] if d else "-", t[0][2] if t else "-")
for k, v in sorted(rows.items())[:1]:
    print(v.get("twin2", [[0,0,0,""]])[0][3][:400])
PY
