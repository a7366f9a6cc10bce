#!/bin/bash
# run.sh CMD...: unpacks attnc and ptxas into /tmp/attnc once, then runs CMD with them on PATH.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/attnc
[ -x /tmp/attnc/attnc ] || { xz -dc $D/attnc.xz > /tmp/attnc/attnc; chmod +x /tmp/attnc/attnc; }
[ -x /tmp/attnc/ptxas ] || { xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas; }
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
"$@"
