#!/bin/bash
# Staging 1 of 3: the first half of the CUTLASS-DSL library into /tmp/stage.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/stage; cp $D/cu13.tar.xz.part-aa /tmp/stage/; ls -la /tmp/stage
