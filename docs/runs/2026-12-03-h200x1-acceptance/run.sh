#!/bin/bash
# On a one-GPU H200 host (from the repository root, $OUT set by the runner): the bandwidth acceptance
# (`python -m pdinfra.transfer.acceptance`: NCCL all-reduce/all-gather, host<->GPU copies, peer copies, per-rail
# RDMA) and the whole catalog on live facts (the health checks and nvswitch.sxid among them).
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
{ date -u; hostname; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uname -r; nproc
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  command -v ib_write_bw || echo "ib_write_bw: not installed"; ls /sys/class/infiniband 2>&1 | head -3; } > $OUT/machine.txt 2>&1
t0=$(date +%s)
python3 -m pdinfra.transfer.acceptance --output $OUT/accept-report.json > $OUT/accept.json 2> $OUT/accept.stderr
echo "acceptance rc=$? in $(( $(date +%s) - t0 )) s" >> $OUT/machine.txt
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "{\"role\": \"gpu\", \"gpu_count\": $gpus, \"ecc\": true}" > /tmp/expect.json
python3 -m pdinfra facts -o $OUT/facts.json 2> $OUT/facts.stderr
echo "facts rc=$?" >> $OUT/machine.txt
python3 -m pdinfra validate --facts $OUT/facts.json --expect /tmp/expect.json > $OUT/validate.txt 2>&1
echo "validate rc=$?" >> $OUT/machine.txt
python3 -m pdinfra validate --facts $OUT/facts.json --expect /tmp/expect.json --json > $OUT/validate.json 2> /dev/null
cp /tmp/expect.json $OUT/expect.json
