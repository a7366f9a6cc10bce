#!/bin/bash
# Call 1 of 2: the peers' small wheels, the first half of the CUTLASS-DSL library, ptxas.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/attnc /tmp/site /tmp/stage

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -2
cp $D/cu13.tar.xz.part-aa /tmp/stage/
ls /tmp/site /tmp/stage | head -20
