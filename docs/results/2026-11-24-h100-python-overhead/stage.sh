#!/bin/bash
# Stages the attnc wheel and ptxas on the warm machine (the next call runs the checks).
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/attnc
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas
python3 -m pip install -q --no-deps --no-index --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
ls /tmp/pyattnc | head -3
