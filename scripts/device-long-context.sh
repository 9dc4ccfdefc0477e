#!/usr/bin/env bash
# On the GPU machine: long contexts through engine-host, on the forged
# Qwen2.5-0.5B Q4_K_M. (1) `engine-host bench -p N -n 128` (prefill rate,
# then decode at depth N) for each N; (2) the server's time to first token
# of one N-token prompt (the batched step: tensor-core attention over the
# paged pool); (3) scripts/multiturn_ttft.py, 10 turns over a ~4,000-token
# history, with the prefix cache and without it.
#   scripts/device-long-context.sh BUILD_DIR [N ...]
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
shift
lens=${*:-4096 16384}
eh="$build/bin/engine-host"
f=/tmp/eh-models/qwen.gguf
mkdir -p /tmp/eh-models
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$eh" forge --like qwen2.5-0.5b-instruct-q4_k_m --out "$f" -q
for n in $lens; do
  timeout 200 "$eh" bench --plugins "$build/plugins" --model "$f" -p "$n" -n 128 -r 2 2>&1 | tail -3
done
serve() {  # port, extra flags
  local port=$1; shift
  "$eh" --plugins "$build/plugins" --port "$port" --log-format text --log-level warn --model "$f" --ctx-size 20480 "$@" \
    > "/tmp/eh-serve-$port.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -sf "localhost:$port/health" > /dev/null && return 0; sleep 0.5; done
  echo "server on $port did not come up"; tail -5 "/tmp/eh-serve-$port.log"; return 1
}
if serve 18710; then
  for n in $lens; do
    # ~n tokens of prompt: one token per " word" for this vocabulary's common words
    python3 - "$n" <<'PY'
import json, sys, time, urllib.request
n = int(sys.argv[1])
words = "the river keeper walked north along the stone road and counted every bridge".split()
prompt = " ".join(words[i % len(words)] for i in range(n - 8))
for attempt in ("cold", "again (prefix cache)"):
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:18710/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        u = json.load(r)["usage"]
    dt = time.perf_counter() - t0
    print(f"server TTFT, {u['prompt_tokens']} prompt tokens, {attempt}: {dt * 1e3:.1f} ms = {u['prompt_tokens'] / dt:.0f} tok/s")
PY
  done
  python3 scripts/multiturn_ttft.py --url http://127.0.0.1:18710 --turns 10 --words 400 | tail -1
  kill $pid; wait $pid 2>/dev/null
fi
if serve 18711 --no-prefix-cache; then
  python3 scripts/multiturn_ttft.py --url http://127.0.0.1:18711 --turns 10 --words 400 | tail -1
  kill $pid; wait $pid 2>/dev/null
fi
