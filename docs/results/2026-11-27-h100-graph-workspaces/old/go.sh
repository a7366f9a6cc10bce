#!/bin/bash
# The growing-sizes graph check with the wheel of 53cec04 (before outgrown workspaces were
# kept: the pool waited on the stream and freed the old buffer).
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/w86; mkdir -p $W /tmp/pyold /tmp/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyold "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas PYTHONPATH=/tmp/pyold:$PYTHONPATH
(cd python/tests && timeout 120 python3 -c "import gpu_check as g; g.cuda_graphs_of_growing_sizes()") > $W/graphs_53cec04.txt 2>&1
echo "rc $?"; cut -c1-700 $W/graphs_53cec04.txt | tail -3
