#!/bin/bash
# The backward launch memo (90be697, new) against 2925eef (old) on the H100: the gradient
# selftest of the backward specs (new binary; its determinism reruns hit the memo), then
# `attnc bench --suites backward` old / new / new / old (protocol time and host_us).
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/wab; mkdir -p $W/ab; trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
R="$D/run.sh"; $R true; $R old true
E=dsl-examples; G=tests/gpu-specs
timeout 170 $R attnc selftest --quick --json $W/sel.json $E/causal.attn $E/mha.attn $E/document_mask.attn $E/t5_bias.attn $E/sinks.attn $E/alibi_learned.attn $E/mqa_falcon.attn $G/gqa_d64.attn $G/head_dim_96.attn $G/varlen_gqa_d64.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt; tail -n 2 $W/sel.txt; grep FAIL $W/sel.txt | head -5
for r in 1 2; do
  if [ $r = 1 ]; then order="old new"; else order="new old"; fi
  for l in $order; do
    if [ $l = old ]; then X="$R old"; else X="$R"; fi
    timeout 100 $X attnc bench --suites backward --json $W/ab/backward_${l}_$r.json > $W/ab/backward_${l}_$r.txt 2>&1
    echo "$l round $r rc $? $(date -u)" >> $W/device.txt
  done
done
python3 scripts/dev/ab_compare.py $W/ab backward old > $W/ab/compare.md 2>&1; head -40 $W/ab/compare.md
python3 - $W/ab <<'PY'
import json, sys, glob, statistics as st
d = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{d}/backward_*_*.json")):
    lab = f.rsplit("/", 1)[1].split("_")[1]
    for r in json.load(open(f))["backward"]:
        k = (r["head_dim"][0], r["causal"], r["deterministic"], r["seqlen"])
        rows.setdefault(k, {}).setdefault(lab, []).append(r.get("host_us"))
print("| d | causal | det | seqlen | host µs old | host µs new |")
print("|---|---|---|---:|---|---|")
for k, v in sorted(rows.items()):
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {v.get('old')} | {v.get('new')} |")
PY
cat $W/device.txt
