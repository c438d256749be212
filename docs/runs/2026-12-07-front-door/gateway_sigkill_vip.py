import json
import subprocess
import threading
import time
import urllib.error
import urllib.request

KEY = open("/var/lib/pdinfra/testhosts/api.key").read().strip()
import os

# the front door (the VIP) by default; HOST: the router host whose gateway is killed (the VIP holder)
URL = os.environ.get("URL", "http://198.18.0.10:8000") + "/v1/completions"
HOST = os.environ.get("HOST", "198.18.0.11")
res = {"ok": 0, "refused": 0, "other": 0}
errs = []
stop = time.time() + 14


def worker():
    while time.time() < stop:
        req = urllib.request.Request(
            URL,
            data=json.dumps({"model": "pdinfra-tiny-llama", "prompt": "Hello", "max_tokens": 2}).encode(),
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                res["ok"] += 1
        except urllib.error.URLError as e:
            if isinstance(e.reason, ConnectionRefusedError):
                res["refused"] += 1
            else:
                res["other"] += 1
                errs.append(repr(e)[:120])
        except Exception as e:
            res["other"] += 1
            errs.append(repr(e)[:120])


ts = [threading.Thread(target=worker) for _ in range(4)]
[t.start() for t in ts]
time.sleep(4)
ssh = [
    "ssh",
    "-i",
    "/var/lib/pdinfra/testhosts/ssh/id_ed25519",
    "-o",
    "UserKnownHostsFile=/var/lib/pdinfra/testhosts/ssh/known_hosts",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    "BatchMode=yes",
    f"root@{HOST}",
]
t0 = time.time()
print(
    subprocess.run(
        ssh
        + ["systemctl kill -s SIGKILL pdinfra-gateway.service; sleep 0.2; systemctl is-active pdinfra-gateway.socket"],
        capture_output=True,
        text=True,
    ).stdout.strip(),
    flush=True,
)
[t.join() for t in ts]
print(json.dumps(res), errs[:5])
print(
    subprocess.run(
        ssh
        + [
            "systemctl show -p NRestarts --value pdinfra-gateway.service; journalctl -u pdinfra-gateway -n 3 --no-pager -o cat"
        ],
        capture_output=True,
        text=True,
    ).stdout
)
