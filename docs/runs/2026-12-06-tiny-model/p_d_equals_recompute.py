import json, sys, random, urllib.request, uuid

sys.path.insert(0, ".")  # run from the repository root
from pdinfra.serving.smoke import post_json

key = open("/var/lib/pdinfra/testhosts/api.key").read().strip()
R = "http://198.18.0.11:8000"
D = ["http://198.18.0.11:8201", "http://198.18.0.12:8200"]
from pdinfra.serving import tinymodel

lines = tinymodel.corpus()
rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20
diff = 0
fox = []
for p in ["The quick brown fox jumps over the lazy dog", "Completely unrelated words about weather and the dog"]:
    fox.append(
        post_json(
            R + "/v1/completions", {"model": "pdinfra-tiny-llama", "prompt": p, "max_tokens": 12, "temperature": 0}, key
        )["choices"][0]["text"]
    )
print("fox/weather differ:", fox[0] != fox[1], repr(fox[0][:40]), repr(fox[1][:40]))
for i in range(N):
    prompt = " ".join(rng.choice(lines) for _ in range(rng.randint(2, 40)))
    body = {"model": "pdinfra-tiny-llama", "prompt": prompt, "max_tokens": 16, "temperature": 0}
    r = post_json(R + "/v1/completions", body | {"cache_salt": uuid.uuid4().hex}, key)
    outs = [
        post_json(d + "/v1/completions", body | {"cache_salt": uuid.uuid4().hex}, key)["choices"][0]["text"] for d in D
    ]
    same = all(o == r["choices"][0]["text"] for o in outs)
    diff += not same
    if not same:
        print("DIFF", r["usage"]["prompt_tokens"], repr(r["choices"][0]["text"][:50]), [o[:50] for o in outs])
print(f"{N} prompts, {diff} differ")
