#!/bin/bash
# Split-KV merge with sinks (selftest, hopper and portable), then the decode suite twice
# with the host breakdown (forward vs forward_shared enqueue, an empty kernel's floor),
# the first round with a sweep of forced split counts.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w67; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
G=tests/gpu-specs
timeout 100 $R attnc selftest --no-grads --family hopper --json $W/sel_sinks.json $G/split_sinks.attn > $W/sel_sinks.txt 2>&1
echo "sel_sinks rc $? $(date -u)" >> $W/device.txt
timeout 60 $R attnc selftest --no-grads --family portable --json $W/sel_sinks_portable.json $G/split_sinks.attn > $W/sel_sinks_portable.txt 2>&1
echo "sel_sinks_portable rc $? $(date -u)" >> $W/device.txt
timeout 120 $R attnc bench --suites decode --decode-splits 8,12,16,20,24,32 --json $W/decode_sweep.json > $W/decode_sweep.txt 2>&1
echo "decode sweep rc $? $(date -u)" >> $W/device.txt
timeout 60 $R attnc bench --suites decode --json $W/decode_2.json > $W/decode_2.txt 2>&1
echo "decode 2 rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 1 $W/sel_*.txt; grep -c FAIL $W/sel_*.txt
cat $W/decode_sweep.txt | sed -n '/^decode/,$p'; sed -n '/^decode/,$p' $W/decode_2.txt
