#!/bin/bash
# Staging 3 of 4: the peers' small wheels, ptxas 13.5, run.sh and the anchors' bench.py into /tmp/stage/st.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/stage/st; cp $D/* /tmp/stage/st/; ls /tmp/stage/st | wc -l
