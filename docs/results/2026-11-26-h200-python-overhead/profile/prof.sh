#!/bin/bash
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/attnc /tmp/pyspy
[ -x /tmp/attnc/ptxas ] || { xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas; }
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
[ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-deps --no-index --target /tmp/pyspy "$D"/py_spy-*.whl 2>&1 | grep -v WARNING | tail -2
xz -dc "$D/attnc_unstripped.so.xz" > /tmp/pyattnc/attnc/_attnc.abi3.so
export ATTNC_PTXAS=/tmp/attnc/ptxas PYTHONPATH=/tmp/pyattnc:$PYTHONPATH
timeout 200 taskset -c 5 /tmp/pyspy/bin/py-spy record --native --rate 100 --format raw -o /tmp/stacks.txt -- python3 $D/loop.py > /tmp/pyspy.txt 2>&1; echo "py-spy rc=$?"; tail -3 /tmp/pyspy.txt; gzip -c /tmp/stacks.txt > $OUT/stacks.txt.gz
