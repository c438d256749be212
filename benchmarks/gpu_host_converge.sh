#!/bin/bash
# Issue 39 on a real one-GPU host: the host layer converged against an inventory written from the host's own facts.
# Run as root from the repository root on the GPU host, $OUT set by the device runner (at most 8 files come back):
#   bash benchmarks/gpu_host_converge.sh
# Needs python3 >= 3.12 with ansible-core 2.21 (and its dependencies: Jinja2, MarkupSafe, PyYAML, cryptography, cffi,
# pycparser, packaging, resolvelib) and pdinfra's runtime packages (typer, click, rich, markdown-it-py, mdurl, Pygments,
# shellingham, typing_extensions; nvidia-ml-py and cuda-bindings for the NVML facts). Wheels in .whl/ are installed
# with --target /tmp/site first (as the other device scripts do); /tmp/site is put on PYTHONPATH either way, with
# this checkout behind it. Whatever is missing shows in machine.txt (the imports are tried first).
#
# What it does, in order (one file in $OUT per step):
#   machine.txt              the machine, the GPU's settings before and after, every step's rc and recap, the verdicts
#   facts.json               `pdinfra facts` of this host (live)
#   inventory.txt            `pdinfra inventory init --from-facts facts.json` and every file it wrote
#   check-config.txt         `pdinfra check-config` on it, then `pdinfra validate` of the facts against the
#                            expectations the inventory resolves to (the issue: 0 fail)
#   host-check.log           playbooks/host.yml --check --diff -c local, nvidia_driver_judge_in_container=true: the
#                            driver role's decision on this host's driver (expected: open at the pin, installed outside
#                            packages, left alone), what it cannot do here said without failing
#   ucx-run1.log, -run2.log  playbooks/host.yml --tags ucx for real, twice: /etc/pdinfra/ucx.env written, then changed=0
#                            (the task list of --tags ucx is checked first: only the ucx role's tasks and the roles'
#                            argument checks)
#   host-check2.log          host.yml --check again: nothing left to change (changed=0)
#
# What it never does: run anything but the ucx tag outside check mode (with it, only the model's resolution on the
# controller, tagged always, and the roles' argument checks; real_ucx_run refuses any other tag or argument, and its
# --list-tasks check stops it if the tag selected anything else), install or remove a package,
# pin or hold one, load or unload a module, touch nvidia-persistenced, the persistence mode, clocks, ECC or any other
# GPU setting, rebuild an initramfs or reboot. It compares the GPU's settings (nvidia-smi) before and after and says
# so in machine.txt.
#
# Rehearsal off a GPU host only (tests/unit/test_gpu_host_converge.py runs the same plays on recorded facts):
# FACTS_FROM=<facts.json> takes those facts instead of gathering them; REHEARSE_EXTRA='<json>' is passed as -e to every
# ansible-playbook run (e.g. ucx_env_dir and the nvidia_driver role's __nvidia_driver_* replay variables).
set -u
OUT=${OUT:?set OUT to the directory whose files come back}
mkdir -p "$OUT"
M=$OUT/machine.txt
: > "$M"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >> "$M" 2>&1 || echo "pip install of .whl/ failed" >> "$M"
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
# Linear (no Mitogen here); results as JSON so that each message stays on one line for the summary's grep.
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_STRATEGY=linear ANSIBLE_NOCOLOR=1 ANSIBLE_CALLBACK_RESULT_FORMAT=json
WORK=$(mktemp -d /tmp/pdinfra-converge.XXXXXX)
INV=$WORK/inventory
export ANSIBLE_HOME=$WORK/ansible-home ANSIBLE_LOCAL_TEMP=$WORK/ansible-tmp
# ansible-core's commands from PYTHONPATH (pip --target leaves no usable entry points): what its console scripts do.
mkdir -p "$WORK/bin"
for cmd in ansible:adhoc ansible-playbook:playbook ansible-inventory:inventory ansible-config:config; do
  printf '#!/usr/bin/env python3\nimport sys\nfrom ansible.cli.%s import main\nsys.exit(main())\n' "${cmd#*:}" \
    > "$WORK/bin/${cmd%%:*}"
  chmod +x "$WORK/bin/${cmd%%:*}"
done
export PATH=$WORK/bin:$PATH
say() { echo "$*" | tee -a "$M"; }
EXTRA=()
[ -n "${REHEARSE_EXTRA:-}" ] && EXTRA=(-e "$REHEARSE_EXTRA")
# Root in a container without sudo: Ansible's become has nothing to do (the plays say become: true).
[ "$(id -u)" = 0 ] && ! command -v sudo > /dev/null && EXTRA+=(-e '{"ansible_become": false}')

gpu_state() {  # every GPU setting the host layer must not change
  nvidia-smi --query-gpu=index,pci.bus_id,driver_version,persistence_mode,ecc.mode.current,compute_mode,\
clocks.applications.graphics,clocks.applications.memory,power.limit,mig.mode.current --format=csv,noheader 2>&1
  cat /sys/module/nvidia/version 2>&1
  head -1 /proc/driver/nvidia/version 2>&1
}
recap() { grep -A3 "PLAY RECAP" "$1" | grep -E "^\S+\s+: ok=" | sed 's/  */ /g'; }
changed() { recap "$1" | sed -n 's/.* changed=\([0-9]*\).*/\1/p' | awk '{s+=$1} END {print s+0}'; }
playbook() { ansible-playbook -i "$INV/hosts.yml" -c local "$@"; }

{ date -u; hostname; id -u; uname -r; nproc
  echo "PID 1: $(cat /proc/1/comm 2>&1)"; systemd-detect-virt 2>&1 || true
  grep PRETTY_NAME /etc/os-release; python3 --version
  python3 -c 'import ansible.release as r; print("ansible-core", r.__version__)' 2>&1
  for m in yaml jinja2 typer rich pynvml cuda.bindings; do
    python3 -c "import $m" > /dev/null 2>&1 && echo "import $m: ok" || echo "import $m: MISSING"
  done
  nvidia-smi -L 2>&1
  echo "dpkg's NVIDIA packages:"; dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' 2>/dev/null | grep -i nvidia || echo "  none"
  echo "/etc/pdinfra before: $(ls /etc/pdinfra 2>&1)"
  echo "GPU settings before:"; gpu_state; } >> "$M" 2>&1
gpu_state > "$WORK/gpu-before.txt"

# 1. facts
if [ -n "${FACTS_FROM:-}" ]; then
  cp "$FACTS_FROM" "$OUT/facts.json"; say "facts: copied from $FACTS_FROM (rehearsal)"
else
  python3 -m pdinfra facts -o "$OUT/facts.json" 2>> "$M"; say "facts rc=$?"
fi

# 2. the inventory from the facts
python3 -m pdinfra inventory init --from-facts "$OUT/facts.json" --out "$INV" > "$OUT/inventory.txt" 2>&1
say "inventory init rc=$?"
for f in "$INV/hosts.yml" "$INV"/group_vars/*.yml "$INV"/host_vars/*.yml; do
  [ -f "$f" ] && { printf '\n===== %s\n' "${f#"$INV"/}"; cat "$f"; } >> "$OUT/inventory.txt"
done
[ -f "$INV/hosts.yml" ] || { say "no inventory written: stopping"; exit 1; }

# 3. check-config, then validate against the expectations it resolves to
{ python3 -m pdinfra check-config -i "$INV/hosts.yml"; echo "check-config rc=$?"
  python3 -m pdinfra check-config -i "$INV/hosts.yml" --json > "$WORK/cluster.json"
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print(json.dumps(c["hosts"][0]["expect"]))' \
    "$WORK/cluster.json" > "$WORK/expect.json"
  echo "expectations: $(cat "$WORK/expect.json")"
  python3 -m pdinfra validate --facts "$OUT/facts.json" --expect "$WORK/expect.json"; echo "validate rc=$?"
} > "$OUT/check-config.txt" 2>&1
say "$(grep -E '^(check-config|validate) rc=' "$OUT/check-config.txt" | tr '\n' ' ')"
say "validate: $(grep -E '^[0-9]+ pass, ' "$OUT/check-config.txt" | tail -1)"

# 4. the whole host layer in check mode, the driver role judging the driver this container sees
check_run() {  # $1: log; check mode only
  playbook playbooks/host.yml --check --diff -e '{"nvidia_driver_judge_in_container": true}' "${EXTRA[@]}" > "$1" 2>&1
  local rc=$?
  if [ $rc != 0 ] && grep -q "preflight failed on" "$1"; then  # go on to the driver's decision, the verdicts kept
    printf '\n\n##### preflight failed (above); again with preflight_fail_on_error=false\n\n' >> "$1"
    playbook playbooks/host.yml --check --diff -e '{"nvidia_driver_judge_in_container": true}' \
      -e '{"preflight_fail_on_error": false}' "${EXTRA[@]}" >> "$1" 2>&1
    rc=$?
  fi
  return $rc
}
check_run "$OUT/host-check.log"; say "host.yml --check rc=$? recap: $(recap "$OUT/host-check.log" | tail -1)"
grep -o -E '"msg": "(nvidia_driver: |rdma_roce: nothing|ucx: ).*"' "$OUT/host-check.log" | sed 's/^"msg": //' >> "$M"

# 5. for real: the ucx tag only, twice
real_ucx_run() {  # the only run outside check mode: --tags ucx, nothing else on the command line
  [ "$1" = ucx ] && [ $# = 2 ] || { say "refused: a real run takes --tags ucx and a log only"; exit 3; }
  playbook playbooks/host.yml --list-tasks --tags ucx > "$WORK/ucx-tasks.txt" 2>&1
  # in the host play, only the ucx role's tasks and the argument checks of the roles (tag always, read-only)
  local other
  other=$(awk '/play #2/ {p=1; next} p && /^      / {sub(/^ +/, ""); print}' "$WORK/ucx-tasks.txt" \
          | grep -v -E '^ucx : |^[a-z_]+ : Validating arguments against arg spec' || true)
  [ -z "$other" ] && grep -q "play #2" "$WORK/ucx-tasks.txt" \
    || { say "refused: --tags ucx selects other tasks: $other"; cat "$WORK/ucx-tasks.txt" >> "$M"; exit 3; }
  { cat "$WORK/ucx-tasks.txt"; echo; } > "$2"
  playbook playbooks/host.yml --tags ucx --diff "${EXTRA[@]}" >> "$2" 2>&1
}
real_ucx_run ucx "$OUT/ucx-run1.log"; say "ucx run 1 rc=$? recap: $(recap "$OUT/ucx-run1.log" | tail -1)"
real_ucx_run ucx "$OUT/ucx-run2.log"; rc2=$?; say "ucx run 2 rc=$rc2 recap: $(recap "$OUT/ucx-run2.log" | tail -1)"

# 6. the host layer in check mode again: nothing left to change
check_run "$OUT/host-check2.log"; rc3=$?; say "host.yml --check again rc=$rc3 recap: $(recap "$OUT/host-check2.log" | tail -1)"

gpu_state > "$WORK/gpu-after.txt"
{ echo "GPU settings after:"; cat "$WORK/gpu-after.txt"; echo "/etc/pdinfra after: $(ls /etc/pdinfra 2>&1)"; } >> "$M"
verdict() { if [ "$2" = 0 ]; then say "PASS $1"; else say "FAIL $1"; fi; }
cmp -s "$WORK/gpu-before.txt" "$WORK/gpu-after.txt"; verdict "GPU settings unchanged" $?
grep -q "installed outside packages (no driver package in dpkg), loaded at the pin" "$OUT/host-check.log"
verdict "nvidia_driver judged the driver compliant and left it alone" $?
! grep -E "^TASK \[nvidia_driver : (Install|Hold|Enable|Blacklist|Reboot|Run nvidia-persistenced)" -A2 \
    "$OUT/host-check.log" | grep -q -E "^(ok|changed):"
verdict "no nvidia_driver install, hold, service, blacklist or reboot task ran" $?
[ "$rc2" = 0 ] && [ "$(changed "$OUT/ucx-run2.log")" = 0 ]; verdict "second ucx run changed=0" $?
[ "$rc3" = 0 ] && [ "$(changed "$OUT/host-check2.log")" = 0 ]; verdict "host.yml --check after the ucx runs changed=0" $?
grep -q -E '^0 fail|, 0 fail' "$OUT/check-config.txt"; verdict "validate 0 fail on the inventory's expectations" $?
rm -rf "$WORK"
