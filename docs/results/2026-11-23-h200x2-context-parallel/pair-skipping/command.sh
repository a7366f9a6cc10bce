#!/bin/bash
# Context parallelism on 2 GPUs with chunk-pair skipping: correctness, then the 128k bench.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/attnc
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas; export ATTNC_PTXAS=/tmp/attnc/ptxas
python3 -m pip install -q --no-deps --no-index --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/pyattnc NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
python3 -m torch.distributed.run --standalone --nproc_per_node=2 python/tests/cp_check.py $OUT/cp_check.json 2>&1 | grep -v "^DEBUG\|Warning\|warn\|detach\|return float" > $OUT/cp_check.txt
grep -c "^PASS" $OUT/cp_check.txt; grep "^FAIL\|passed" $OUT/cp_check.txt | cut -c1-300
python3 -m torch.distributed.run --standalone --nproc_per_node=2 python/tests/cp_bench.py $OUT/cp_bench.json 131072 2>&1 | grep -v "^DEBUG\|Warning\|warn" | tee $OUT/cp_bench.txt | grep "^{" | cut -c1-600
