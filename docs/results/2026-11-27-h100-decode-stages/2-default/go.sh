#!/bin/bash
# Paged K/V in pieces with three ring slots at d128 (default now) and the cache key's
# compiler by file identity: the decode suite twice, the compile suite (fresh-process disk
# hit), and the forward selftest of the paged specs (every page size the selftest draws).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w59; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
for i in 1 2; do
  timeout 80 $R attnc bench --suites decode --json $W/decode_def_$i.json > $W/decode_def_$i.txt 2>&1
  echo "decode $i rc $? $(date -u)" >> $W/device.txt
done
timeout 80 $R attnc bench --suites compile --json $W/compile.json > $W/compile.txt 2>&1
echo "compile rc $? $(date -u)" >> $W/device.txt
timeout 200 $R attnc selftest --no-grads --family hopper --json $W/sel.json dsl-examples/gqa_decode_paged.attn \
  tests/gpu-specs/paged_page1_d64.attn tests/gpu-specs/paged_page128_d256.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; grep -i "compile\|disk" $W/compile.txt | head -5; tail -n 2 $W/sel.txt; grep -c FAIL $W/sel.txt
python3 - $W <<'PY'
import json, sys
W = sys.argv[1]
rs = [{(d["batch"], d["seqlen_k"], d["page_size"]): d for d in json.load(open(f"{W}/decode_def_{i}.json"))["decode"]} for i in (1, 2)]
for key in rs[0]:
    print(*key, " ".join(f"{1e3*r[key]['gpu_time']['median_ms']:.1f}/{1e3*r[key]['time']['median_ms']:.1f}{'' if r[key]['ok'] else '!'}" for r in rs))
PY
