#!/bin/bash
# Unpacks attnc + ptxas next to each other (attnc always fresh) and runs "$@" with them on PATH.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/attnc
xz -dc "$D/attnc.xz" > /tmp/attnc/attnc; chmod +x /tmp/attnc/attnc
[ -x /tmp/attnc/ptxas ] || { xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas; }
export ATTNC_PTXAS=/tmp/attnc/ptxas PATH=/tmp/attnc:$PATH
"$@"
