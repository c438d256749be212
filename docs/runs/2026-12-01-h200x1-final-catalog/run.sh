#!/bin/bash
# On the lent 1xH200: the final catalog and validate --transfer (host<->GPU only: one GPU).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; hostname; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uname -r; nproc; } > $OUT/machine.txt 2>&1
echo '{"role": "gpu", "gpu_count": 1, "nvlinks_per_gpu": 18, "nvlink_version": "4.0"}' > /tmp/expect.json
python3 -m pdinfra facts -o $OUT/facts.json 2> $OUT/facts.stderr
python3 -m pdinfra validate --transfer --expect /tmp/expect.json --cluster out/device/cluster.json \
  --transfer-output $OUT/transfer.json --json > $OUT/validate.json 2> $OUT/validate.stderr
echo "validate rc=$?" >> $OUT/machine.txt
python3 -m pdinfra validate --facts $OUT/facts.json --expect /tmp/expect.json > $OUT/validate-table.txt 2>&1
echo "table rc=$?" >> $OUT/machine.txt
python3 -c "import json; print(json.load(open('$OUT/facts.json'))['errors'])" >> $OUT/machine.txt
tail -4 $OUT/validate.stderr; tail -3 $OUT/validate-table.txt; tail -4 $OUT/machine.txt
