#!/bin/bash
# The first half of the CUTLASS-DSL library, staged for install.sh.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/stage && cp $D/cu13.tar.xz.part-aa /tmp/stage/ && ls -la /tmp/stage
