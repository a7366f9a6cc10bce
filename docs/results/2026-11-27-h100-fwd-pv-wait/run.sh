#!/bin/bash
# run.sh [old|alt] CMD...: unpacks attnc (or attnc_old / attnc_alt) and ptxas into
# /tmp/attnc[_old|_alt] once, then runs CMD with them on PATH.
D=$(cd "$(dirname "$0")" && pwd)
S=""; case "$1" in old|alt) S=_$1; shift;; esac
T=/tmp/attnc$S; mkdir -p $T
[ -x $T/attnc ] || { xz -dc $D/attnc$S.xz > $T/attnc; chmod +x $T/attnc; }
[ -x $T/ptxas ] || { xz -dc $D/ptxas.xz > $T/ptxas; chmod +x $T/ptxas; }
export PATH=$T:$PATH ATTNC_PTXAS=$T/ptxas
"$@"
