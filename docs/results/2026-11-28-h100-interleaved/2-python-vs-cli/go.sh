#!/bin/bash
# Why attnc through the Python package timed 5-11% under the CLI's numbers in
# ../2026-11-28-h100-interleaved: the CLI's prefill and backward suites, then diag.py
# (the same kernels through the package: default vs side stream, autograd vs a direct
# call; receipts), in one command.
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/w202; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
R="$D/run.sh"; $R true
xz -dc $D/_attnc.so.xz > python/attnc/_attnc.abi3.so
export ATTNC_PTXAS=/tmp/attnc/ptxas PYTHONPATH=$PWD/python
timeout 150 $R attnc bench --suites prefill,backward --json $W/cli.json > $W/cli.txt 2> $W/cli.err
echo "cli rc $? $(date -u)" >> $W/device.txt
timeout 200 python3 $D/diag.py $W/diag.json > $W/diag.txt 2>&1
echo "diag rc $? $(date -u)" >> $W/device.txt
cat $W/diag.txt | cut -c1-1500; head -70 $W/cli.txt
cat $W/device.txt
