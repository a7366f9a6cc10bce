#!/bin/bash
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/attnc
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas; export ATTNC_PTXAS=/tmp/attnc/ptxas
python3 -m pip install -q --no-deps --no-index --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/pyattnc NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
date -u | tee $OUT/device.txt; nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/device.txt
cp "$D/readme_cp.py" /tmp/your_script.py
torchrun --nproc_per_node=2 /tmp/your_script.py 2>&1 | grep -v "OMP_NUM\|^\*\*\*" | tee $OUT/readme_run.txt | tail -8
