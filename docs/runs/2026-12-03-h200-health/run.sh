#!/bin/bash
# On an H200 host (run from the repository root, $OUT set by the device runner): the GPU and fabric health
# facts (NVML health fields, NVLink error counters, sysfs AER and RDMA counters, the kernel log's Xids) gathered
# live, judged by the catalog, and next to them what nvidia-smi and sysfs print for the same counters, so that each
# fact can be checked against the tool an engineer would use.
set -u
if ls .whl/*.whl > /dev/null 2>&1; then  # the wheels the earlier runs carried (nvidia-ml-py among them)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
fi
export PYTHONUNBUFFERED=1
{ date -u; hostname; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uname -r; nproc; id -u
  python3 -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))'; } > $OUT/machine.txt 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
# what the hgx-h200 profiles expect of the GPUs, ECC included (no rails: these hosts have none)
echo "{\"role\": \"gpu\", \"gpu_count\": $gpus, \"nvlinks_per_gpu\": 18, \"nvlink_version\": \"4.0\", \"ecc\": true}" > /tmp/expect.json
mkdir -p $OUT/rec/pdinfra-cmd
python3 -m pdinfra facts -o $OUT/facts.json --record-nvml $OUT/rec/pdinfra-nvml.json 2> $OUT/facts.stderr
echo "facts rc=$?" >> $OUT/machine.txt
python3 -m pdinfra validate --facts $OUT/facts.json --expect /tmp/expect.json > $OUT/validate.txt 2>&1
echo "validate rc=$?" >> $OUT/machine.txt
python3 -m pdinfra validate --facts $OUT/facts.json --expect /tmp/expect.json --json > $OUT/validate.json 2> /dev/null
# the same counters as the tools show them
nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT,PERFORMANCE > $OUT/nvidia-smi-q.txt 2>&1
nvidia-smi nvlink -e > $OUT/nvidia-smi-nvlink-e.txt 2>&1
nvidia-smi --query-gpu=index,pci.bus_id,ecc.mode.current,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,clocks_event_reasons.active \
  --format=csv > $OUT/nvidia-smi-query.csv 2>&1
nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure \
  --format=csv > $OUT/nvidia-smi-remapped-rows.csv 2>&1
journalctl -k -b --no-pager -o short-iso > $OUT/rec/pdinfra-cmd/journalctl_-k_-b_--no-pager_-o_short-iso.txt 2>&1
grep -h 'Xid' $OUT/rec/pdinfra-cmd/journalctl_-k_-b_--no-pager_-o_short-iso.txt > $OUT/xid-lines.txt 2>&1
dmesg 2>&1 | grep 'Xid' >> $OUT/xid-lines.txt
for d in /sys/bus/pci/devices/*; do
  [ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] || [ -d $d/infiniband ] || continue
  for f in aer_dev_correctable aer_dev_nonfatal aer_dev_fatal; do
    [ -r $d/$f ] && { echo "== $d/$f"; cat $d/$f; }
  done
done > $OUT/aer.txt 2>&1
for c in /sys/class/infiniband/*/ports/*/counters/link_downed /sys/class/infiniband/*/ports/*/counters/link_error_recovery; do
  [ -r "$c" ] && echo "$c $(cat $c)"
done > $OUT/rdma-counters.txt 2>&1
python3 - "$OUT/facts.json" >> $OUT/machine.txt <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
print("errors:", f["errors"])
print("kernel_log:", {k: v for k, v in f.get("kernel_log", {}).items() if k != "xids"}, len(f.get("kernel_log", {}).get("xids", [])), "xids")
for d in f["gpus"].get("devices", []):
    print(d["index"], d.get("bus_id"), json.dumps(d.get("health")), "aer", json.dumps(d.get("pcie", {}).get("aer")))
    print("   link errors:", sorted({json.dumps(lk.get("errors")) for lk in d.get("nvlinks", [])}))
PY
tail -12 $OUT/validate.txt; tail -25 $OUT/machine.txt
