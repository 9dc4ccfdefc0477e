#!/usr/bin/env bash
# On the GPU machine: `engine-host bench` through the served path (the
# batched step) beside llama-bench, in one call, for each profile: pp512 and
# tg128 (the peers' commands), and 64 sequences decoding together. The CUDA
# plugins have no session path; SESSION=1 also runs `--path session` (a
# plugin that keeps one, e.g. cpu-reference).
#
#   scripts/device-bench-paths.sh BUILD_DIR "PROFILE:PLUGIN ..."
# (after device-unpack.sh; llama.cpp unpacked in /tmp/lc; MODELS_DIR, default
# /dev/shm/eh; OUT for the JSON; LONG=N adds one N-token prompt, SESSION=1
# the session path)
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/dev/shm/eh}
out=${OUT:-/tmp/bench-paths}
mkdir -p "$models" "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || echo unknown)"
rate() {  # FILE FIELD: the first result's field
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; print("%.1f" % r.get(sys.argv[2], 0) if not r.get("error") else "error: " + r["error"][:120])' "$1" "$2"
}
for entry in ${2:-qwen2.5-0.5b-instruct-q4_k_m:llama-cuda}; do
  profile=${entry%%:*}
  plugin=${entry##*:}
  model="$models/$profile.gguf"
  [ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" > "$out/$profile.forge.log" 2>&1 || { echo "$profile: forge failed"; tail -3 "$out/$profile.forge.log"; continue; }
  LD_LIBRARY_PATH=/tmp/lc /tmp/lc/llama-bench -m "$model" -p 512 -n 128 -r 3 -ngl 99 -fa 1 -o json > "$out/$profile.llama.json" 2> "$out/$profile.llama.err"
  lc=$(python3 -c 'import json,sys
try:
    rows = json.load(open(sys.argv[1]))
    pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
    tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
    print("%.1f %.1f" % (pp[0] if pp else 0, tg[0] if tg else 0))
except Exception as e:
    print("0 0")' "$out/$profile.llama.json")
  "$eh" bench --plugins "$build/plugins" --plugin "$plugin" --model "$model" -p 512 -n 128 -r 3 --json > "$out/$profile.step.json" 2> "$out/$profile.step.err"
  [ "${SESSION:-0}" = 1 ] && "$eh" bench --plugins "$build/plugins" --plugin "$plugin" --model "$model" -p 512 -n 128 -r 3 --path session --json > "$out/$profile.session.json" 2> "$out/$profile.session.err"
  "$eh" bench --plugins "$build/plugins" --plugin "$plugin" --model "$model" -p 512 -n 128 -r 2 --batch 64 --json > "$out/$profile.b64.json" 2> "$out/$profile.b64.err"
  # LONG=N: also one N-token prompt through the step path (the server's chunks).
  [ -n "${LONG:-}" ] && "$eh" bench --plugins "$build/plugins" --plugin "$plugin" --model "$model" -p "$LONG" -n 32 -r 1 --json > "$out/$profile.long.json" 2> "$out/$profile.long.err"
  read -r lc_pp lc_tg <<< "$lc"
  echo "$profile ($plugin): llama.cpp pp512 $lc_pp tg128 $lc_tg |" \
       "step pp512 $(rate "$out/$profile.step.json" prefill_tokens_per_s) tg128 $(rate "$out/$profile.step.json" decode_tokens_per_s) |" \
       "$([ "${SESSION:-0}" = 1 ] && echo "session pp512 $(rate "$out/$profile.session.json" prefill_tokens_per_s) tg128 $(rate "$out/$profile.session.json" decode_tokens_per_s) |")" \
       "step x64 pp $(rate "$out/$profile.b64.json" prefill_tokens_per_s) tg $(rate "$out/$profile.b64.json" decode_tokens_per_s)" \
       "$([ -n "${LONG:-}" ] && echo "| p$LONG $(rate "$out/$profile.long.json" prefill_tokens_per_s)")"
  rm -f "$model"  # /dev/shm is memory
done
