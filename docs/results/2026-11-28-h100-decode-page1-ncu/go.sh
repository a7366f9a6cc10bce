#!/bin/bash
# Page-1 decode at b1 x 4k (0.87 of contiguous): the decode suite with forced split counts,
# then ncu (--set full) of the b1 x 4k launch, page 1 and contiguous.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w102; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'rm -f $W/*.ncu-rep; tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 150 $R attnc bench --suites decode --decode-splits 4,8,12,16,24,32,48,64 --json $W/decode.json > $W/decode.txt 2>&1
echo "decode rc $? $(date -u)" >> $W/device.txt
NCU=/usr/local/cuda/bin/ncu
for p in 1 0; do
  timeout 200 $R $NCU --set full --import-source no -k "regex:bench_decode_p${p}_" -s 2 -c 1 -o $W/p$p attnc bench --suites decode > $W/ncu_p$p.log 2>&1
  echo "ncu p$p rc $? $(date -u)" >> $W/device.txt
  $NCU --import $W/p$p.ncu-rep --page details --csv > $W/p${p}_details.csv 2>&1
  $NCU --import $W/p$p.ncu-rep --page source --csv --print-source sass > $W/p${p}_sass.csv 2>&1
done
cat $W/device.txt; grep -A30 "^decode" $W/decode.txt | head -40
