#!/usr/bin/env bash
# On the GPU machine: llama-cuda's quantized KV cache (issue 50's targets).
#  1. Its GPU tests: eh_cuda_kv_quant_tests (CUDA vs the CPU reference with
#     the same cache type, vs F16, pool size, parking, refusals).
#  2. Decode speed: `engine-host bench` tg128 after a P-token prompt
#     (BENCH_PROMPTS, default "512 4096") with --kv-cache-type f16, q8_0
#     and fp8 on a forged PROFILE (Llama-3.1-8B Q4_K_M by default); decode
#     tok/s of each and its ratio to f16.
#  3. Long contexts under a fixed KV budget: `engine-host serve` with
#     --kv-cache-size-mb KV_MB and each type, 64 chat clients of
#     PROMPT_WORDS words (shared preamble off), ANSWER_TOKENS each (decode-heavy)
#     (`engine-host loadgen --workload chat`): completion tokens/s per type,
#     and /health's pool (blocks) and preemptions, f16 running out of blocks
#     where the others do not.
#
#   scripts/device-kv-quant.sh BUILD_DIR [PROFILE] [KV_MB]
# (MODELS_DIR, default /dev/shm/eh; OUT for the logs, default /tmp/kv-quant;
# SKIP_TESTS=1, SKIP_BENCH=1, SKIP_LOAD=1 leave a part out; GPT_OSS=1 adds
# gpt-cuda's tg128 per type on a forged gpt-oss-20b; TYPES, default
# "f16 q8_0 fp8", LOAD_TYPES the load part's (default TYPES); PROMPT_WORDS 1500:2500; LEVELS 64; ANSWER_TOKENS 512; CTX 8192.)
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
profile=${2:-llama-3.1-8b-instruct-q4_k_m}
kv_mb=${3:-2048}
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/dev/shm/eh}
out=${OUT:-/tmp/kv-quant}
types=${TYPES:-f16 q8_0 fp8}
mkdir -p "$models" "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 "$build/bin/eh_cuda_kv_quant_tests" --gtest_brief=1 > "$out/tests.log" 2>&1
  echo "eh_cuda_kv_quant_tests rc=$?"
  grep -E "^\[kv-quant-gpu\]|^\[  (PASSED|FAILED|SKIPPED)|Failure|Expected|Which is" "$out/tests.log" | head -80
fi

model="$models/$profile.gguf"
[ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" -q | tail -1

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  for p in ${BENCH_PROMPTS:-512 4096}; do
    for kv in $types; do
      timeout 300 "$eh" bench --plugins "$build/plugins" --plugin llama-cuda --model "$model" -p "$p" -n 128 -r 3 \
        --kv-cache-type "$kv" --json > "$out/bench-$p-$kv.json" 2> "$out/bench-$p-$kv.err" ||
        { echo "bench p$p $kv failed:"; tail -5 "$out/bench-$p-$kv.err"; }
    done
    python3 - "$out" "$p" $types <<'EOF'
import json, os, sys
out, p, types = sys.argv[1], sys.argv[2], sys.argv[3:]
rates = {}
for kv in types:
    try:
        r = json.load(open(os.path.join(out, f"bench-{p}-{kv}.json")))["results"][0]
        rates[kv] = (r["decode_tokens_per_s"], r["prefill_tokens_per_s"], r.get("kv_blocks"), r.get("kv_cache_type"))
    except Exception as e:
        print(f"p{p} {kv}: no result ({e})")
base = rates.get("f16", (None,))[0]
for kv, (tg, pp, blocks, granted) in rates.items():
    rel = f" ({tg / base:.3f}x f16)" if base else ""
    print(f"bench p{p} tg128 {kv} (granted {granted}): decode {tg:.1f} tok/s{rel}, prefill {pp:.0f} tok/s, {blocks} blocks")
EOF
  done
fi

# gpt-cuda (GPT_OSS=1): tg128 after 512 prompt tokens per type on a forged
# gpt-oss-20b.
if [ "${GPT_OSS:-0}" = 1 ]; then
  gm="$models/gpt-oss-20b-mxfp4.gguf"
  [ -s "$gm" ] || "$eh" forge --like gpt-oss-20b-mxfp4 --out "$gm" -q | tail -1
  for kv in $types; do
    timeout 300 "$eh" bench --plugins "$build/plugins" --plugin gpt-cuda --model "$gm" -p 512 -n 128 -r 3 \
      --kv-cache-type "$kv" --json > "$out/bench-gpt-$kv.json" 2> "$out/bench-gpt-$kv.err" ||
      { echo "bench gpt-oss $kv failed:"; tail -5 "$out/bench-gpt-$kv.err"; }
    python3 - "$out/bench-gpt-$kv.json" "$kv" <<'EOF2' || true
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f"bench gpt-oss-20b p512 tg128 {sys.argv[2]} (granted {r.get('kv_cache_type')}): decode "
      f"{r['decode_tokens_per_s']:.1f} tok/s, prefill {r['prefill_tokens_per_s']:.0f} tok/s")
EOF2
  done
fi

[ "${SKIP_LOAD:-0}" = 1 ] && exit 0
port=18760
for kv in ${LOAD_TYPES:-$types}; do
  "$eh" serve --plugins "$build/plugins" --model "$model" --port $port --ctx-size "${CTX:-8192}" \
    --kv-cache-size-mb "$kv_mb" --kv-cache-type "$kv" --log-format text --log-level warn > "$out/serve-$kv.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"status": *"healthy"' && break
    sleep 0.5
  done
  curl -s "http://127.0.0.1:$port/health" > "$out/health-$kv.json"
  timeout 420 "$eh" loadgen --url "http://127.0.0.1:$port" --workload chat --levels "${LEVELS:-64}" --requests-per-client 1 \
    --prompt-words "${PROMPT_WORDS:-1500:2500}" --preamble-words 0 --shared-prefix 0 --answer-tokens "${ANSWER_TOKENS:-512}:${ANSWER_TOKENS:-512}" --json \
    > "$out/load-$kv.json" 2> "$out/load-$kv.err"
  echo "loadgen $kv rc=$?"
  curl -s "http://127.0.0.1:$port/health" > "$out/health-$kv-after.json"
  kill -TERM $pid; wait $pid 2>/dev/null
  python3 - "$out" "$kv" <<'EOF'
import json, os, sys
out, kv = sys.argv[1], sys.argv[2]
h0 = json.load(open(os.path.join(out, f"health-{kv}.json")))
h1 = json.load(open(os.path.join(out, f"health-{kv}-after.json")))
s0, s1 = h0.get("scheduler", {}), h1.get("scheduler", {})
print(f"serve {kv}: kv type {h0.get('kv_cache_type', h0.get('kv', {}))}, pool {s0.get('kv_blocks_total')} blocks of "
      f"{s0.get('kv_block_tokens')} tokens, preemptions {s1.get('preemptions', 0) - s0.get('preemptions', 0)}")
try:
    for lv in json.load(open(os.path.join(out, f"load-{kv}.json")))["levels"]:
        print(f"loadgen {kv}: {lv['clients']} clients, {lv['prompt_tokens']} prompt + {lv['completion_tokens']} "
              f"completion tokens in {lv['seconds']:.1f} s: {lv['tokens_per_s']:.1f} completion tok/s, failed "
              f"{lv['failed']}, TTFT p50 {lv['ttft_p50_s']:.2f} s, TPOT p50 {1000 * lv['tpot_p50_s']:.1f} ms")
except Exception as e:
    print(f"loadgen {kv}: no JSON ({e}):", open(os.path.join(out, f"load-{kv}.err")).read()[-800:])
EOF
done
