#!/bin/bash
# The block classifier with partial tiles' bits: 8 words per warp step ("old", ffd5f45)
# against 32 ("new"), interleaved; then Nsight Compute on the new classifier's launch.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; A=/tmp/aux
export PATH=/usr/local/cuda/bin:$PATH
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc /tmp/attnc_old
python3 $V/flex_variants.py write-aux $A > /dev/null
aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; document_prefix) echo "--aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128";; esac; }
for round in 1 2; do
  for who in old new; do
    for v in document_mask_16h document_prefix; do
      W=""; [ $who = old ] && W=old
      echo "== round $round $who $v"
      bash $D/run.sh $W attnc bench $V/$v.attn --batch 4 --seqlen 8192 $(aux $v) 2>&1 | grep -v "^\[" | tail -2 | grep -o "^[a-z_]* \[hopper\].*ms, density\|built per call [0-9.]* ms, classification alone [0-9.]* ms\|classified in [0-9.]* ms); [0-9.]* ms"
    done
  done
done | tee $OUT/bench.txt
S="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats --section InstructionStats --section SourceCounters"
bash $D/run.sh ncu --clock-control none -k regex:"block_classify\$" -c 1 $S attnc bench $V/document_mask_16h.attn --batch 4 --seqlen 8192 --iters 1 $(aux document_mask_16h) > $OUT/ncu_classify.txt 2>&1
echo "ncu rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Memory Throughput|Grid Size|Waves" $OUT/ncu_classify.txt | head -16
date -u | tee -a $OUT/device.txt
