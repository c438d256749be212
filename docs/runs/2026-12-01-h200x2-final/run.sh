#!/bin/bash
# On the lent 2xH200: validate --transfer with the KV plan from the cluster model, plus the whole catalog.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
cd "$PWD"
{ date -u; hostname; nvidia-smi -L; nvidia-smi topo -m; uname -r; } > $OUT/machine.txt 2>&1
python3 -m pdinfra facts -o $OUT/facts.json
python3 -m pdinfra validate --transfer --expect out/device/expect.json --cluster out/device/cluster.json \
  --transfer-output $OUT/transfer.json --json > $OUT/validate.json 2> $OUT/validate.stderr
echo "validate rc=$?" >> $OUT/machine.txt
python3 -m pdinfra validate --facts $OUT/facts.json --expect out/device/expect.json > $OUT/validate-table.txt 2>&1
echo "table rc=$?" >> $OUT/machine.txt
tail -5 $OUT/validate.stderr; tail -3 $OUT/validate-table.txt; cat $OUT/machine.txt | tail -3
