#!/usr/bin/env bash
# On the GPU machine: the prefix cache's host tier (--kv-host-bytes, issue 50's
# target: a 10-turn, ~4,000-token chat whose prefix was evicted from the GPU
# gets its turn-10 first token within 2x of an unevicted one).
# Serves a forged model with a KV pool that holds the chat and about one
# more long prompt, and times turn 10's first token three ways:
#   unevicted  turns 1-9, then turn 10 at once (the prefix is on the GPU);
#   restored   turns 1-9, two other ~3,000-token prompts that evict the
#              chat's prefix, then turn 10: with the tier, copied back;
#   recomputed the same on a server without the tier: computed again.
# Each is repeated REPS times with a fresh chat (median reported), and
# /metrics' eh_kv_host_tier_* counters show that the prefix was parked and
# restored (and, without the tier, never).
#
#   scripts/device-host-tier.sh BUILD_DIR [PROFILE] [KV_MB] [REPS]
# (after device-unpack.sh; MODELS_DIR, default /dev/shm/eh; OUT for the logs;
# CTX 6144; MODEL: a model file instead of forging PROFILE, PLUGINS another
# plugin folder.) KV_MB "auto" (the default) sizes the pool to POOL_TOKENS
# (6800) from /health's kv_bytes_per_token of a first start. The chat's turns
# and the evicting prompts are sized in tokens (TURN_TOKENS 380, OTHER_TOKENS
# 2500) from the server's /tokenize of the words used; TURN_WORDS /
# OTHER_WORDS set them in words instead.
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
profile=${2:-qwen2.5-0.5b-instruct-q4_k_m}
kv_mb=${3:-auto}
reps=${4:-3}
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/dev/shm/eh}
out=${OUT:-/tmp/host-tier}
mkdir -p "$models" "$out"
model=${MODEL:-$models/$profile.gguf}
[ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" | tail -1
plugins=${PLUGINS:-$build/plugins}
export TURN_WORDS=${TURN_WORDS:-0} OTHER_WORDS=${OTHER_WORDS:-0} TURN_TOKENS=${TURN_TOKENS:-380} OTHER_TOKENS=${OTHER_TOKENS:-2500}

serve() {  # PORT HOST_BYTES LOG
  "$eh" serve --plugins "$plugins" --model "$model" --port "$1" --ctx-size "${CTX:-6144}" \
    --kv-cache-size-mb "$kv_mb" --kv-host-bytes "$2" --log-format text > "$3" 2>&1 &
  echo $!
}
wait_healthy() {
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '"status": *"healthy"' && return 0
    sleep 0.5
  done
  return 1
}

run_mode() {  # PORT MODE (tier|notier)
  python3 - "http://127.0.0.1:$1" "$2" "$reps" <<'EOF'
import json, os, statistics, sys, time, urllib.request
base, mode, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
turn_words, other_words = int(os.environ["TURN_WORDS"]), int(os.environ["OTHER_WORDS"])
WORDS = ("the river keeper walked north along the stone road and counted every bridge "
         "while the morning light moved slowly across the quiet fields of barley").split()
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            a = json.load(r)
    except urllib.error.HTTPError as e:
        sys.exit(f"[host-tier] {mode}: {path} answered {e.code}: {e.read()[:500]!r}")
    return time.perf_counter() - t0, a
def metrics():
    m = urllib.request.urlopen(base + "/metrics").read().decode()
    out = {}
    for line in m.splitlines():
        if line.startswith("eh_kv_host_tier_") or line.startswith("eh_prefix_cache_hit_tokens_total"):
            k, v = line.split(" ", 1)
            out[k] = float(v)
    return out
def text(salt, n):
    return " ".join(WORDS[(salt * 7 + i) % len(WORDS)] for i in range(n))
def tokens_of(t):
    req = urllib.request.Request(base + "/tokenize", json.dumps({"text": t}).encode(), {"Content-Type": "application/json"})
    return len(json.load(urllib.request.urlopen(req))["tokens"])
per_word = tokens_of(text(3, 400)) / 400
turn_words = turn_words or max(1, int(int(os.environ["TURN_TOKENS"]) / per_word))
other_words = other_words or max(1, int(int(os.environ["OTHER_TOKENS"]) / per_word))
print(f"[host-tier] {mode}: {per_word:.2f} tokens a word; turns of {turn_words} words, evicting prompts of {other_words}")
def chat(salt, evict):
    msgs = [{"role": "system", "content": f"Session {salt}. You are a careful assistant."}]
    for turn in range(1, 10):
        msgs.append({"role": "user", "content": f"Session {salt}, turn {turn}: {text(salt + turn, turn_words)}"})
        post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "temperature": 0})
        msgs.append({"role": "assistant", "content": "Noted."})
    if evict:  # two other long prompts push the chat's prefix out of the pool
        for k in range(2):
            post("/v1/completions", {"prompt": f"Other {salt}-{k}: " + text(salt * 31 + k, other_words), "max_tokens": 1,
                                     "temperature": 0})
    msgs.append({"role": "user", "content": f"Session {salt}, turn 10: {text(salt + 10, turn_words)}"})
    t, a = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "temperature": 0})
    u = a["usage"]
    return t, u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens")
# one warm-up chat (graphs, allocator)
chat(1000, False)
rows = {"unevicted": [], "evicted": []}
m0 = metrics()
for r in range(reps):
    for kind in ("unevicted", "evicted"):
        t, prompt, cached = chat(2000 + 100 * r + (kind == "evicted"), kind == "evicted")
        rows[kind].append(t)
        print(f"[host-tier] {mode} rep {r} {kind}: turn-10 TTFT {t * 1000:.1f} ms, prompt {prompt} tokens, cached {cached}")
m1 = metrics()
for k in sorted(m1):
    print(f"[host-tier] {mode} {k} +{m1[k] - m0.get(k, 0):.0f}" if k.endswith("_total") else f"[host-tier] {mode} {k} {m1[k]:.0f}")
med = {k: statistics.median(v) * 1000 for k, v in rows.items()}
print(f"[host-tier] {mode} median turn-10 TTFT: unevicted {med['unevicted']:.1f} ms, evicted {med['evicted']:.1f} ms "
      f"({med['evicted'] / med['unevicted']:.2f}x)")
EOF
}

curl_health() { curl -sf "http://127.0.0.1:$1/health" | python3 -c 'import json,sys; h=json.load(sys.stdin); s=h["scheduler"]; print("[host-tier] device:", h["device"], "| plugin:", h["plugin"]["name"], "| KV pool:", s["kv_blocks_total"], "blocks of", s["kv_block_tokens"], "| kv_host_tier:", json.dumps(h.get("kv_host_tier")))'; }

if [ "$kv_mb" = auto ]; then  # one start to read the model's KV bytes a token
  kv_mb=2048
  pid=$(serve 18730 0 "$out/serve-probe.log")
  if wait_healthy 18730; then
    kv_mb=$(curl -sf http://127.0.0.1:18730/health | python3 -c "import json,sys,os; b=json.load(sys.stdin)['kv_bytes_per_token']; print(-(-b * int(os.environ.get('POOL_TOKENS', 6800)) // (1 << 20)))")
  fi
  kill $pid; wait $pid 2>/dev/null
  echo "[host-tier] KV pool: $kv_mb MiB"
fi

for mode in tier notier; do
  port=$([ $mode = tier ] && echo 18731 || echo 18732)
  bytes=$([ $mode = tier ] && echo 8000000000 || echo 0)
  pid=$(serve $port $bytes "$out/serve-$mode.log")
  if ! wait_healthy $port; then echo "[host-tier] $mode: server did not come up"; tail -30 "$out/serve-$mode.log"; kill $pid; continue; fi
  curl_health $port
  run_mode $port $mode
  kill $pid; wait $pid 2>/dev/null
done
grep -h "host_tier" "$out"/serve-*.log | head -5
