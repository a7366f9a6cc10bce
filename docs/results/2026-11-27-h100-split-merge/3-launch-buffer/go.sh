#!/bin/bash
# Launch parameters as one buffer in the driver's layout (default) against a pointer per
# parameter (ATTNC_LAUNCH_PARAMS=pointers): the forward selftest of every example and GPU
# spec and the gradient selftest of five specs with the buffer path, then the decode suite,
# the two paths interleaved, two rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w68; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples; G=tests/gpu-specs
timeout 220 $R attnc selftest --no-grads --family hopper --json $W/sel_fwd.json $E/*.attn $G/*.attn > $W/sel_fwd.txt 2>&1
echo "sel_fwd rc $? $(date -u)" >> $W/device.txt
timeout 150 $R attnc selftest --family hopper --json $W/sel_grad.json $E/causal.attn $E/sinks.attn \
  $E/mqa_falcon.attn $E/varlen_causal.attn $E/grok_softcap.attn > $W/sel_grad.txt 2>&1
echo "sel_grad rc $? $(date -u)" >> $W/device.txt
for r in 1 2; do
  timeout 60 $R attnc bench --suites decode --json $W/decode_buffer_$r.json > $W/decode_buffer_$r.txt 2>&1
  ATTNC_LAUNCH_PARAMS=pointers timeout 60 $R attnc bench --suites decode --json $W/decode_pointers_$r.json > $W/decode_pointers_$r.txt 2>&1
  echo "decode round $r $(date -u)" >> $W/device.txt
done
cat $W/device.txt; tail -n 1 $W/sel_*.txt; grep -c FAIL $W/sel_*.txt
for f in $W/decode_*_1.txt $W/decode_*_2.txt; do echo "== $f"; sed -n '/^batch/,$p' $f | grep -E '^ +1 |^ +8 +4096|floor'; done
