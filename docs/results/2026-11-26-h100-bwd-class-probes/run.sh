#!/bin/bash
# run.sh [old] CMD...: unpacks attnc (or the baseline attnc_old) and ptxas into
# /tmp/attnc[_old] once, then runs CMD with them on PATH.
D=$(cd "$(dirname "$0")" && pwd)
S=""; [ "$1" = old ] && { S=_old; shift; }
T=/tmp/attnc$S; mkdir -p $T
[ -x $T/attnc ] || { xz -dc $D/attnc$S.xz > $T/attnc; chmod +x $T/attnc; }
[ -x $T/ptxas ] || { xz -dc $D/ptxas.xz > $T/ptxas; chmod +x $T/ptxas; }
export PATH=$T:$PATH ATTNC_PTXAS=$T/ptxas
"$@"
