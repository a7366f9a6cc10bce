#!/bin/bash
# Staging 1 of 3: the peers' small wheels into /tmp/site.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site /tmp/stage /tmp/attnc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -2
ls /tmp/site | head -3
