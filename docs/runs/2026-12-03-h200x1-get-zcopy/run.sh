#!/bin/bash
# On a one-GPU H200 host: does UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y move same-GPU READ from tcp to cuda_ipc, and does
# validate --transfer now pass a healthy one-GPU host (no fail)?
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; nvidia-smi nvlink -s | head -4;
  uname -r; nproc; python3 --version; } > $OUT/machine.txt 2>&1
# 1) READ and WRITE VRAM0<->VRAM0 with UCX's default and with cuda_ipc GET forced on
timeout 240 python3 -m pdinfra transfer --gpus 0 --sizes 64KiB,16MiB,1GiB --batches 1024x256KiB --no-host-gpu \
  --ucx-env default --ucx-env 'UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y' --output $OUT/transfer-get-zcopy.json \
  --log-dir $OUT/ucx-logs > $OUT/transfer-get-zcopy.txt 2>&1
echo "transfer rc=$?" >> $OUT/machine.txt
# 2) the whole catalog and validate --transfer as a user runs them on this host
echo '{"role": "gpu", "gpu_count": 1}' > /tmp/expect.json
timeout 200 python3 -m pdinfra validate --transfer --expect /tmp/expect.json --transfer-output $OUT/validate-transfer.json \
  > $OUT/validate.txt 2> $OUT/validate.stderr
echo "validate rc=$?" >> $OUT/machine.txt
tail -20 $OUT/transfer-get-zcopy.txt; tail -25 $OUT/validate.txt; cat $OUT/machine.txt
