#!/bin/bash
# attnc.cp with uneven varlen sequences: cp_check on 2 GPUs (every earlier row plus the varlen ring rows).
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/attnc
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas; export ATTNC_PTXAS=/tmp/attnc/ptxas
python3 -m pip install -q --no-deps --no-index --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/pyattnc NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node=2 python/tests/cp_check.py $OUT/cp_check.json 2>&1 | grep -v "^DEBUG\|Warning\|warn\|detach\|return float" > $OUT/cp_check.txt
echo "cp_check rc=${PIPESTATUS[0]}"
grep "passed\|^FAIL\|Error" $OUT/cp_check.txt | cut -c1-300 | head; grep "varlen" $OUT/cp_check.txt | cut -c1-420
date -u | tee -a $OUT/device.txt
