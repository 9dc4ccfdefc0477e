#!/usr/bin/env bash
# On the GPU machine: one client's time per output token through the server
# beside `engine-host bench`'s per-token decode time (issue 46's "within 3 %"),
# and the server's aggregate throughput at 64 clients, for each profile.
#   bench -p 32 -n 128 (depth close to loadgen's ~25-token prompts) and
#   -p 512 -n 128, the step path (bench's default);
#   serve --ctx-size 4096, then `engine-host loadgen --stream --levels 1`
#   (TPOT p50) and `--levels 64`.
#
#   scripts/device-server-tpot.sh BUILD_DIR "PROFILE:PLUGIN ..."
# (after device-unpack.sh; MODELS_DIR, default /dev/shm/eh; OUT for the JSON)
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/dev/shm/eh}
out=${OUT:-/tmp/server-tpot}
mkdir -p "$models" "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || echo unknown)"
port=18720
for entry in ${2:-qwen2.5-0.5b-instruct-q4_k_m:llama-cuda}; do
  profile=${entry%%:*}
  plugin=${entry##*:}
  model="$models/$profile.gguf"
  [ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" > "$out/$profile.forge.log" 2>&1 || { echo "$profile: forge failed"; continue; }
  for p in 32 512; do
    "$eh" bench --plugins "$build/plugins" --plugin "$plugin" --model "$model" -p $p -n 128 -r 3 --json > "$out/$profile.bench$p.json" 2>/dev/null
  done
  # serve picks the plugin by the model (PLUGIN names bench's choice)
  "$eh" serve --plugins "$build/plugins" --model "$model" --port $port --ctx-size 4096 > "$out/$profile.serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    kill -0 $pid 2>/dev/null || { echo "$profile: serve exited"; tail -3 "$out/$profile.serve.log"; break; }
    curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"status": *"healthy"' && break
    sleep 0.5
  done
  "$eh" loadgen --url "http://127.0.0.1:$port" --levels 1 -n 128 --requests-per-client 6 --stream --json > "$out/$profile.load1.json" 2>&1
  "$eh" loadgen --url "http://127.0.0.1:$port" --levels 64 -n 128 --requests-per-client 2 --json > "$out/$profile.load64.json" 2>&1
  kill -TERM $pid; wait $pid
  python3 - "$out" "$profile" "$plugin" <<'EOF'
import json, sys
out, profile, plugin = sys.argv[1:4]
def load(name):
    try:
        return json.load(open(f"{out}/{profile}.{name}.json"))
    except Exception as e:
        return {"error": str(e)}
def tg(name):
    r = load(name).get("results", [{}])[0]
    return r.get("decode_tokens_per_s", 0)
def level(name):
    d = load(name)
    lv = d.get("levels", [d])[0] if isinstance(d, dict) else {}
    return lv
b32, b512 = tg("bench32"), tg("bench512")
l1, l64 = level("load1"), level("load64")
tpot = 1000 * l1.get("tpot_p50_s", 0)
bench_ms = 1000 / b32 if b32 else 0
print(f"{profile} ({plugin}): bench step tg128 after 32 tokens {b32:.1f} tok/s ({bench_ms:.3f} ms/token), "
      f"after 512 {b512:.1f} tok/s | server, 1 client: TPOT p50 {tpot:.3f} ms ({100 * (tpot / bench_ms - 1) if bench_ms else 0:+.1f} % "
      f"against bench after 32), TTFT p50 {1000 * l1.get('ttft_p50_s', 0):.1f} ms, failed {l1.get('failed')} | "
      f"64 clients: {l64.get('tokens_per_s', 0):.0f} tok/s, failed {l64.get('failed')}")
EOF
  rm -f "$model"
done
