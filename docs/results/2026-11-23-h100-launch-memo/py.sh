#!/bin/bash
# Installs the attnc wheel (and, when staged, the peers), then runs the package's GPU checks.
D=$(cd "$(dirname "$0")" && pwd)
if [ -d .device/anchB ]; then cd .device/anchB && WHEELS=. source install.sh && cd - >/dev/null; fi
mkdir -p /tmp/pyattnc /tmp/attnc
[ -f "$D/ptxas.xz" ] && { xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas; export ATTNC_PTXAS=/tmp/attnc/ptxas; }
python3 -m pip install -q --no-deps --no-index --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/pyattnc${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
python3 -c "import torch, attnc; print(torch.__version__, attnc.__version__, attnc.__file__)"
python3 python/tests/gpu_check.py $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.txt | grep -v "^DEBUG"
python3 $D/prof.py 2>&1 | grep -v "^DEBUG" | tee $OUT/prof.txt
which perf py-spy nsys 2>&1 | head -3
