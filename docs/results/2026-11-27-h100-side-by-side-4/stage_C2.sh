#!/bin/bash
# Staging 3 of 3: the second half, extracted next to the wheels.
D=$(cd "$(dirname "$0")" && pwd)
cat /tmp/stage/cu13.tar.xz.part-aa $D/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
ls /tmp/site/nvidia_cutlass_dsl | head -5
