#!/bin/bash
# On a one-GPU H200 host (from the repository root, $OUT set by the runner): live facts with the pcie_acs section,
# the catalog on them, and what lspci and sysfs say about the GPU's place in the PCI tree to compare with.
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
{ date -u; hostname; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,pci.bus_id --format=csv,noheader; uname -r; id -u
  for d in /sys/bus/pci/devices/*; do echo "$(basename $d) $(cat $d/class) -> $(readlink -f $d)"; done
  command -v lspci && lspci -vvv 2>&1 | grep -E "^[0-9a-f]|ACSCap|ACSCtl" ; } > $OUT/machine.txt 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "{\"role\": \"gpu\", \"gpu_count\": $gpus, \"ecc\": true}" > $OUT/expect.json
python3 -m pdinfra facts -o $OUT/facts.json 2> $OUT/facts.stderr; echo "facts rc=$?" >> $OUT/machine.txt
python3 -m pdinfra validate --facts $OUT/facts.json --expect $OUT/expect.json > $OUT/validate.txt 2>&1
echo "validate rc=$?" >> $OUT/machine.txt
python3 -c "import json; print(json.dumps(json.load(open('$OUT/facts.json'))['pcie_acs'], indent=1))" >> $OUT/machine.txt
