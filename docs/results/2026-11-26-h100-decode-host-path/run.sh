#!/bin/bash
# The decode suite with the previous runtime (da136b4) and this one (30c9ece), alternating
# twice, then this one with forced split counts.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/attnc
xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; xz -dc $D/attnc.old.xz > /tmp/attnc/attnc.old; xz -dc $D/attnc.new.xz > /tmp/attnc/attnc.new
chmod +x /tmp/attnc/*
export ATTNC_PTXAS=/tmp/attnc/ptxas
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
for r in 1 2; do for b in old new; do
  /tmp/attnc/attnc.$b bench --suites decode --json $OUT/decode_${b}_$r.json > $OUT/decode_${b}_$r.txt 2>&1
  echo "== $b $r"; grep -A8 "^batch seqlen_k" $OUT/decode_${b}_$r.txt | head -8
done; done
/tmp/attnc/attnc.new bench --suites decode --decode-splits 8,12,24,32 --json $OUT/decode_splits.json > $OUT/decode_splits.txt 2>&1
grep -E "^ +1 +4096|^ +8 +4096|^ +1 +32768" $OUT/decode_splits.txt | head -40
date -u >> $OUT/device.txt
