#!/bin/bash
# Where the backward's time goes at 1k-4k: every kernel of attnc's backward (preprocess,
# main, dQ convert) and the forward under ncu (GPU time and DRAM bytes), d128 16 heads and
# d64 32 heads, batch 32 x 1k and 8 x 4k (the bench's shapes), plus nsys if present.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w92; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; ls /usr/local/cuda/bin | tr '\n' ' '; echo; } > $W/device.txt
NCU=/usr/local/cuda/bin/ncu
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
$R attnc bench $D/t128h16.attn --batch 32 --seqlen 1024 --iters 3 > $W/warm.txt 2>&1   # fills the kernel cache
for spec in t128h16 t128h16c t64h32; do
  for bs in "32 1024" "8 4096"; do
    set -- $bs
    timeout 120 $R $NCU --metrics $M --csv -k 'regex:attnc' -s 6 -c 12 attnc bench $D/$spec.attn --batch $1 --seqlen $2 --iters 2 > $W/ncu_${spec}_$2.csv 2>&1
    echo "$spec $bs rc $? $(date -u)" >> $W/device.txt
  done
done
NSYS=$(ls /usr/local/cuda/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  timeout 120 $R $NSYS profile -o $W/nsys_t128 --force-overwrite true attnc bench $D/t128h16.attn --batch 32 --seqlen 1024 --iters 5 > $W/nsys.log 2>&1
  timeout 60 $NSYS stats --report cuda_gpu_trace --format csv $W/nsys_t128.nsys-rep > $W/nsys_trace.csv 2>&1
  rm -f $W/*.nsys-rep $W/*.sqlite
fi
cat $W/device.txt
for f in $W/ncu_*.csv; do echo "== $f"; grep -E '"(gpu__time_duration.sum|dram__bytes_read.sum|dram__bytes_write.sum)"' $f | awk -F'","' '{print $5, $(NF-2), $(NF-1), $NF}' | sed 's/"//g' | cut -c1-150 | head -40; done
