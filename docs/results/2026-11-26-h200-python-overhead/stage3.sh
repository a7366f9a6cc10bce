#!/bin/bash
# Call 2 of 3: the attnc wheels, this commit's and the previous one's.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/pyattnc_old
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc_old "$D"/old/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
ls /tmp/pyattnc /tmp/pyattnc_old
