#!/usr/bin/env bash
# The worker spec's haiku test on a GPU: "Write a haiku about GPU computing",
# temperature 0, seed 42, twice, through engine-host over HTTP/SSE with the
# GPU plugin chosen by the registry. Both streams must be valid SSE and carry
# the same tokens. Model: a forged Qwen2.5-0.5B-Instruct Q4_K_M (from
# $EH_FORGED_DIR when present). Usage: haiku_sse.sh ENGINE_HOST PLUGIN_DIR
set -euo pipefail
eh=$1 plugins=$2
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

model=${EH_FORGED_DIR:-/nonexistent}/qwen2.5-0.5b-instruct-q4_k_m.gguf
if [ ! -f "$model" ]; then
  model=$work/qwen.gguf
  "$eh" forge --like qwen2.5-0.5b-instruct-q4_k_m --out "$model" --seed 1 >/dev/null
fi
"$eh" --plugins "$plugins" --model "$model" --port 0 --log-format text >"$work/log" 2>&1 &
pid=$!
port=
for _ in $(seq 1 300); do
  port=$(grep -o ' listening .*port=[0-9]*' "$work/log" | grep -o 'port=[0-9]*' | cut -d= -f2 || true)
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/log"; echo "server did not start"; exit 1; }

python3 - "$port" <<'PY'
import json, sys, time, urllib.request

port = int(sys.argv[1])
base = f"http://127.0.0.1:{port}"

def get(path):
    try:
        with urllib.request.urlopen(base + path, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

for _ in range(600):
    status, health = get("/health")
    if status == 200:
        break
    time.sleep(0.2)
assert status == 200, health
assert health["plugin"]["name"] != "cpu-reference", f"expected a GPU plugin, got {health['plugin']}"
assert health["resident"] is True and health["vram_bytes_used"] > 0, health
print("serving with", health["plugin"], "on", health["device"], "sm", health["sm"])

def stream():
    body = json.dumps({"messages": [{"role": "user", "content": "Write a haiku about GPU computing"}],
                       "temperature": 0, "seed": 42, "max_tokens": 64, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    pieces, finish, usage, done = [], None, None, False
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers["Content-Type"]
        for raw in r.read().decode("utf-8").split("\n\n"):
            if not raw.strip():
                continue
            assert raw.startswith("data: "), f"not an SSE data frame: {raw!r}"
            payload = raw[len("data: "):]
            assert not done, "a frame after [DONE]"
            if payload == "[DONE]":
                done = True
                continue
            chunk = json.loads(payload)
            assert "error" not in chunk, chunk
            for ch in chunk.get("choices", []):
                if ch["delta"].get("content"):
                    pieces.append(ch["delta"]["content"])
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert done, "stream did not end with [DONE]"
    assert finish in ("stop", "length"), finish
    assert usage and usage["completion_tokens"] > 0, usage
    return pieces, usage

a, ua = stream()
b, ub = stream()
print("tokens:", ua["completion_tokens"], "text:", repr("".join(a))[:120])
assert a == b, "two greedy runs with seed 42 differ"
# The second run may reuse the first one's prompt from the prefix cache
# (engines with batched steps): only cached_tokens may differ.
counts = lambda u: {k: v for k, v in u.items() if k != "prompt_tokens_details"}
assert counts(ua) == counts(ub), (ua, ub)
cached = lambda u: u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
assert cached(ub) >= cached(ua), (ua, ub)
print("haiku: identical token streams twice, valid SSE; second run reused", cached(ub), "prompt tokens")
PY
