#!/usr/bin/env bash
# Puts the peers (FA4's CuTe DSL wheels and the CUTLASS-DSL cu13 library, fetched into a
# git-ignored folder by the anchors' fetch script) onto the GPU machine in three device
# calls, since one call carries at most 64 MiB with the tree: run each step from the
# repository root there, with the folder holding that step's files carried.
#
#   scripts/dev/peers_stage.sh 1 DIR   DIR holds cu13.tar.xz.part-aa: kept in /tmp/stage
#   scripts/dev/peers_stage.sh 2 DIR   DIR holds cu13.tar.xz.part-ab: the library into /tmp/site
#   scripts/dev/peers_stage.sh 3 DIR   DIR holds the small wheels: installed into /tmp/site
#
# Step 3 can share its call with the measurement: after it,
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
# (pip's --upgrade replaces the library's package folder; step 3 extracts the library
# again from /tmp/stage and step 2's DIR when that happened, so keep step 2's DIR on the
# machine: a folder carried by an earlier call of the same warm machine stays there).
set -uo pipefail
STEP=$1; DIR=$(cd "$2" && pwd)
mkdir -p /tmp/stage /tmp/site
LIB=/tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs
case $STEP in
  1) cp "$DIR"/cu13.tar.xz.part-aa /tmp/stage/ && ls -la /tmp/stage ;;
  2) cp "$DIR"/cu13.tar.xz.part-ab /tmp/stage/ &&
     cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site &&
     ls /tmp/site/nvidia_cutlass_dsl ;;
  3) [ -d /tmp/site/flash_attn ] ||
       python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$DIR"/*.whl
     ls $LIB/_cutlass_ir.cu* >/dev/null 2>&1 ||
       cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
     ls $LIB/_cutlass_ir.cu* >/dev/null && echo "peers staged in /tmp/site" ;;
  *) echo "usage: $0 1|2|3 DIR" >&2; exit 2 ;;
esac
