#!/bin/bash
# Fused split-KV combine (hopper) + MIN_TILES_PER_SPLIT 2 + index tensors held in the launch memo:
# selftest of the split spec (hopper and portable), the whole forward selftest, then the decode bench.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
for fam in auto portable; do
  bash $D/run.sh attnc selftest --family $fam --json $OUT/selftest_split_$fam.json dsl-examples/gqa_decode_paged.attn > $OUT/selftest_split_$fam.txt 2>&1
  echo "split selftest $fam rc=$?"; tail -1 $OUT/selftest_split_$fam.txt
done
bash $D/run.sh attnc bench --suites ceilings,decode --decode-splits 8,16,32 --json $OUT/decode.json > $OUT/decode.txt 2>$OUT/decode.err
echo "bench rc=$?"; sed -n '/^decode (/,$p' $OUT/decode.txt
bash $D/run.sh attnc selftest --no-grads dsl-examples tests/gpu-specs > $OUT/selftest_fwd.txt 2>&1
echo "fwd selftest rc=$?"; grep "^FAIL" $OUT/selftest_fwd.txt | head; tail -1 $OUT/selftest_fwd.txt
date -u | tee -a $OUT/device.txt
