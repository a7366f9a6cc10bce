#!/bin/bash
# Call 2 of 3: the second half of the CUTLASS-DSL library (extracted next to the wheels), ptxas.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/attnc
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas
cat /tmp/stage/cu13.tar.xz.part-aa $D/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
ls /tmp/site/nvidia_cutlass_dsl | head -5
