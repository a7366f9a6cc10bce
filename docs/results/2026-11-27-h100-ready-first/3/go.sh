#!/bin/bash
# 1. chunked_local with gradients: its sharded twin now steps down to the tiled hopper grid
#    (was: portable, every configuration spilled). 2. The compile suite three times (ready first).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w84; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 200 $R attnc selftest --json $W/sel.json dsl-examples/chunked_local.attn > $W/sel.txt 2>&1
echo "selftest rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
python3 - $W/sel.json <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
print(collections.Counter((c["receipt"] or {}).get("executed", "none") for c in d["cases"]))
for c in d["cases"]:
    r = c["receipt"] or {}
    if "shard" in c["case"]:
        print(c["case"][:60], r.get("executed"), (r.get("config") or {}).get("kernel"), r.get("grid"))
PY
for i in 1 2 3; do
  timeout 90 $R attnc bench --suites compile --json $W/compile_$i.json > $W/compile_$i.txt 2>&1
  echo "compile $i rc $? $(date -u)" >> $W/device.txt; grep -E "^compile \(" $W/compile_$i.txt | cut -c1-400
done
cat $W/device.txt
