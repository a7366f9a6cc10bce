#!/bin/bash
# Staging 2 of 3: the second half, extracted into /tmp/site.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site
cat /tmp/stage/cu13.tar.xz.part-aa $D/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
ls /tmp/site/nvidia_cutlass_dsl | head -5
