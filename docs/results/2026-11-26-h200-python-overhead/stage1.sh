#!/bin/bash
# Call 1 of 3: the peers' small wheels and the first half of the CUTLASS-DSL library, ptxas.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/attnc /tmp/site /tmp/stage
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -2
ls /tmp/site | head
