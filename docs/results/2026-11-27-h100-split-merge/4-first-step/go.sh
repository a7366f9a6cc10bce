#!/bin/bash
# The merge's first step of partial rows loaded with the LSEs (before the reductions),
# 16 splits per step at d 128: selftest of the split specs (hopper and portable), then
# the decode suite old (HEAD) / new interleaved, three rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w76; mkdir -p $W; rm -f /tmp/attnc/attnc /tmp/attnc_old/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples; G=tests/gpu-specs
timeout 150 $R attnc selftest --no-grads --family hopper --json $W/sel_split.json $E/gqa_decode_paged.attn $E/sinks.attn $G/paged_page1_d64.attn $G/split_sinks.attn $D/dec.attn > $W/sel_split.txt 2>&1
echo "sel_split rc $? $(date -u)" >> $W/device.txt
timeout 90 $R attnc selftest --no-grads --family portable --json $W/sel_split_portable.json $E/gqa_decode_paged.attn $G/split_sinks.attn $D/dec.attn > $W/sel_split_portable.txt 2>&1
echo "sel_split_portable rc $? $(date -u)" >> $W/device.txt
for r in 1 2 3; do
  timeout 60 $R old attnc bench --suites decode --json $W/decode_old_$r.json > $W/decode_old_$r.txt 2>&1
  timeout 60 $R attnc bench --suites decode --json $W/decode_new_$r.json > $W/decode_new_$r.txt 2>&1
  echo "decode round $r $(date -u)" >> $W/device.txt
done
cat $W/device.txt; tail -n 1 $W/sel_*.txt; grep -c FAIL $W/sel_*.txt
python3 - $W <<'PY'
import json, sys, statistics as st
W = sys.argv[1]
rows = {}
for lab in ("old", "new"):
    for r in (1, 2, 3):
        d = json.load(open(f"{W}/decode_{lab}_{r}.json"))
        for x in d["decode"]:
            k = (x["batch"], x["seqlen_k"], x["page_size"])
            rows.setdefault(k, {}).setdefault(lab, []).append((x["time"]["median_ms"] * 1e3, x["gpu_time"]["median_ms"] * 1e3))
for k, v in sorted(rows.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
    o, n = v["old"], v["new"]
    go, gn = st.median([g for _, g in o]), st.median([g for _, g in n])
    to, tn = st.median([t for t, _ in o]), st.median([t for t, _ in n])
    print(k, f"old {to:.1f}/{go:.1f}  new {tn:.1f}/{gn:.1f}  gpu {gn/go:.3f}")
PY
