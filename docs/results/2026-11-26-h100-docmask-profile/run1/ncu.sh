#!/bin/bash
# Nsight Compute on one forward launch each: the document mask (b4, 8k, 16 heads, d128,
# documents of 256-2816 tokens, the bench's fill) and causal at the same shape.
D=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/cuda/bin:$PATH
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; which ncu) | tee $OUT/device.txt
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters"
for v in document_mask_16h causal_16h; do
  bash $D/run.sh attnc bench benches/variants/$v.attn --batch 4 --seqlen 8192 --iters 3 > /dev/null 2>&1
  bash $D/run.sh ncu --clock-control none -k regex:"${v}_hopper_fwd\$" -c 1 $S attnc bench benches/variants/$v.attn --batch 4 --seqlen 8192 --iters 1 > $OUT/ncu_$v.txt 2>&1
  echo "== $v rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Memory Throughput" $OUT/ncu_$v.txt | head -14
done
date -u >> $OUT/device.txt
