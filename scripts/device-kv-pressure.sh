#!/usr/bin/env bash
# On the GPU machine: the scheduler under a KV pool far smaller than the
# requests sent at once (docs/robustness.md, "The scheduler under KV
# pressure"). Serves a forged model through a CUDA plugin with a small
# --kv-cache-size-mb, sends N concurrent /v1/completions of a long prompt
# and many output tokens, and prints how many answered, the time, and
# /health's preemptions; then the same with a client that leaves mid-way.
#
#   scripts/device-kv-pressure.sh BUILD_DIR [PROFILE] [KV_MB] [N] [PROMPT_WORDS] [MAX_TOKENS]
# (after device-unpack.sh; MODELS_DIR, default /dev/shm/eh)
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
profile=${2:-qwen2.5-0.5b-instruct-q4_k_m}
kv_mb=${3:-64}
n=${4:-24}
words=${5:-900}
max_tokens=${6:-500}
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/dev/shm/eh}
mkdir -p "$models"
model="$models/$profile.gguf"
[ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" | tail -1
port=18710
base="http://127.0.0.1:$port"

"$eh" serve --plugins "$build/plugins" --model "$model" --port $port --ctx-size 4096 \
  --kv-cache-size-mb "$kv_mb" > /tmp/kv-serve.log 2>&1 &
serve_pid=$!
for _ in $(seq 1 240); do
  curl -sf "$base/health" 2>/dev/null | grep -q '"status": *"healthy"' && break
  sleep 0.5
done
curl -sf "$base/health" | python3 -c 'import json,sys; h=json.load(sys.stdin); s=h["scheduler"]; print("device:", h["device"], "| plugin:", h["plugin"]["name"], "| context:", h["context_length"], "| KV pool:", s["kv_blocks_total"], "blocks of", s["kv_block_tokens"], "tokens")' || { tail -30 /tmp/kv-serve.log; exit 1; }

python3 - "$base" "$n" "$words" "$max_tokens" <<'EOF'
import json, sys, threading, time, urllib.request, socket
base, n, words, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def post(path, body, timeout=600):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except Exception as e:
        return -1, {"error": str(e)}
def health():
    return json.loads(urllib.request.urlopen(base + "/health").read())["scheduler"]
results = [None] * n
def client(i):
    prompt = " ".join(f"word{(i * 7919 + k) % 5000}" for k in range(words))
    results[i] = post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
n_prompt = len(json.loads(urllib.request.urlopen(urllib.request.Request(base + "/tokenize", data=json.dumps({"text": " ".join(f"word{k}" for k in range(words))}).encode(), headers={"Content-Type": "application/json"})).read())["tokens"])
s0 = health()
pool = s0["kv_blocks_total"] * s0["kv_block_tokens"]
print(f"{n} requests of ~{n_prompt} prompt + {max_tokens} output tokens = {n * (n_prompt + max_tokens)} tokens against a pool of {pool} ({n * (n_prompt + max_tokens) / pool:.1f}x)")
t0 = time.time()
threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
dt = time.time() - t0
ok = sum(1 for r in results if r[0] == 200)
toks = sum(r[1]["usage"]["completion_tokens"] for r in results if r[0] == 200)
s = health()
print(f"answered 200: {ok}/{n} in {dt:.1f} s, {toks} tokens ({toks / dt:.0f} tok/s); preemptions {s['preemptions'] - s0['preemptions']}; running {s['running']}, waiting {s['waiting']}")
for r in results:
    if r[0] != 200: print("  not 200:", r[0], json.dumps(r[1])[:300])
# A client that leaves: a non-streamed request whose connection closes while
# it runs; its sequence must leave the batch at once.
sock = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])))
body = json.dumps({"prompt": "word " * words, "max_tokens": 3000, "temperature": 0, "ignore_eos": True})
sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
for _ in range(200):
    if health()["running"] == 1: break
    time.sleep(0.01)
sock.close()
t1 = time.time()
while health()["running"] != 0 and time.time() - t1 < 10: time.sleep(0.01)
print(f"a client that left: its request left the batch {1000 * (time.time() - t1):.0f} ms after the close (running {health()['running']})")
EOF
kill -TERM $serve_pid; wait $serve_pid; echo "serve exit: $?"
grep -c '"preempted"' /tmp/kv-serve.log | sed 's/^/preempted log lines: /'
