#!/bin/bash
# cp-varlen: the selftest's varlen shard cases (auto and portable), then cp_check on 2 GPUs.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/attnc
xz -dc "$D/attnc.xz" > /tmp/attnc/attnc; chmod +x /tmp/attnc/attnc
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas
export ATTNC_PTXAS=/tmp/attnc/ptxas PATH=/tmp/attnc:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
for fam in auto portable; do
  attnc selftest --family $fam --filter varlen --json $OUT/selftest_varlen_$fam.json dsl-examples > $OUT/selftest_varlen_$fam.txt 2>&1
  echo "selftest $fam rc=$?"; tail -3 $OUT/selftest_varlen_$fam.txt
done
python3 -m pip install -q --no-deps --no-index --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/pyattnc NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=2 python/tests/cp_check.py $OUT/cp_check.json 2>&1 | grep -v "^DEBUG\|Warning\|warn\|detach\|return float" > $OUT/cp_check.txt
echo "cp_check rc=${PIPESTATUS[0]}"
grep -c "^PASS" $OUT/cp_check.txt; grep "^FAIL\|passed\|Error\|error" $OUT/cp_check.txt | cut -c1-400 | head -20
date -u | tee -a $OUT/device.txt
