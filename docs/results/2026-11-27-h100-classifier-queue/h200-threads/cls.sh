#!/bin/bash
# #11: the block classifier: "old" c007877 (bits built by the classifier, one CTA of 128
# threads per row); "new" bits in their own kernel over the queued tiles, the classifier at
# 256 threads (lane groups sharing the interval scans, border-first element rounds after
# one diagonal round); "alt" the same at 512 threads. Interleaved benches, Nsight Compute
# durations, then the aux-mask selftest (new).
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples; A=/tmp/aux
export PATH=/usr/local/cuda/bin:$PATH
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
python3 $V/flex_variants.py write-aux $A > /dev/null
aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; document_prefix) echo "--aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128";; block_sparse_table) echo "--aux layout=$A/layout.bin";; scattered_mask) echo "--aux tag=$A/tag.bin";; esac; }
if [ "$1" = bench ]; then
rm -rf /tmp/attnc /tmp/attnc_old /tmp/attnc_alt
for round in 1 2; do
  for who in old new alt; do
    L="document_mask_16h document_prefix"; [ $round = 1 ] && L="document_mask_16h document_prefix block_sparse_table scattered_mask"
    for v in $L; do
      W=""; [ $who != new ] && W=$who
      echo "== round $round $who $v"
      bash $D/run.sh $W attnc bench $V/$v.attn --batch 4 --seqlen 8192 $(aux $v) --json /tmp/${who}_${v}_$round.json 2>&1 | grep -v "^\["
    done
  done
done > $OUT/bench.txt 2>&1
cat /tmp/old_*.json /tmp/new_*.json /tmp/alt_*.json > $OUT/bench.jsonl 2>/dev/null
grep -o "^==.*\|built per call [0-9.]* ms, classification alone [0-9.]* ms\|classified in [0-9.]* ms); [0-9.]* ms\|backward [0-9.]* ms\|classified per call [0-9.]* ms" $OUT/bench.txt | head -80
fi
if [ "$1" = check ]; then
S="--section SpeedOfLight --section LaunchStats --section Occupancy"
for W in new alt; do
for v in document_mask_16h document_prefix; do
echo "== ncu $W $v"
bash $D/run.sh $W ncu --clock-control none -k regex:"block_classify" -c 2 $S attnc bench $V/$v.attn --batch 4 --seqlen 8192 --iters 1 $(aux $v) 2>&1 | grep -E "attnc_.*block_classify|Duration|Grid Size|Registers Per|Achieved Occupancy"
done; done > $OUT/ncu_classify.txt 2>&1
cat $OUT/ncu_classify.txt
timeout 200 bash $D/run.sh attnc selftest --family hopper --json $OUT/selftest.json $E/document_mask.attn $V/document_mask_16h.attn $V/document_prefix.attn $V/block_sparse_table.attn $V/scattered_mask.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "FAIL" $OUT/selftest.txt | head; tail -3 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
fi
date -u | tee -a $OUT/device.txt
