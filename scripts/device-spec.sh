#!/usr/bin/env bash
# On the GPU machine: speculative decoding through the server (issue 50).
#  1. Correctness on the CUDA plugins: stories260K (llama-cuda) serves the
#     same greedy text, and the same sampled text for a fixed seed (its draws
#     are keyed by position), with --spec-ngram and with --draft-model (the
#     model as its own draft) as without; /metrics shows drafts accepted.
#  2. Speed: for each TARGET:DRAFT pair (DRAFT a GGUF of the same vocabulary,
#     or "ngram" for prompt lookup), one client's decode (loadgen --levels 1
#     --stream: TPOT and tok/s) and 64 clients' throughput, without and with
#     speculation, and the acceptance the server counted.
#
#   scripts/device-spec.sh BUILD_DIR TESTDATA_DIR ["TARGET.gguf:DRAFT.gguf|ngram ..."] [EXTRA serve flags...]
# OUT (default /tmp/device-spec) gets the logs and loadgen JSON; DEVICE=cpu runs it on the CPU reference
# (its draws are sequential: only greedy text must match there); CTX: --ctx-size (4096).
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
testdata=${2:-../shared/testdata}
pairs=${3:-}
shift 3 2>/dev/null || shift $#
extra=("$@")
eh="$build/bin/engine-host"
out=${OUT:-/tmp/device-spec}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
port=18760
fails=0

serve() {  # NAME MODEL [flags...]: starts a server on $port, waits until healthy
  local name=$1 model=$2
  shift 2
  "$eh" serve --plugins "$build/plugins" --model "$model" --port $port --device "${DEVICE:-gpu}" --log-format text "$@" \
    > "$out/$name.serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 480); do
    kill -0 $pid 2>/dev/null || { echo "$name: serve exited"; tail -3 "$out/$name.serve.log"; return 1; }
    curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"status": *"healthy"' && return 0
    sleep 0.5
  done
  echo "$name: not healthy"; return 1
}
stop() { kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; }

texts() {  # NAME: greedy and sampled completions of three prompts, one JSON line each
  python3 - "$port" > "$out/$1.texts" <<'EOF'
import json, sys, urllib.request
port = sys.argv[1]
prompts = ["Once upon a time", "Lily had a red ball. Lily liked her red ball. One day Lily", "The little dog"]
for temp in (0, 0.8):
    for p in prompts:
        body = {"prompt": p, "max_tokens": 96, "temperature": temp, "seed": 5, "ignore_eos": True}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        print(json.dumps(json.load(urllib.request.urlopen(req))["choices"][0]["text"]))
EOF
}
spec_metrics() { curl -s "http://127.0.0.1:$port/metrics" | grep -E '^eh_spec_decode_(num|acceptance|tokens_per)' | tr '\n' ' '; echo; }

# ---- 1. correctness -------------------------------------------------------
stories="$testdata/models/stories260K.gguf"
if serve plain "$stories"; then texts plain; stop; fi
for mode in ngram draft; do
  flags=(--spec-ngram); [ $mode = draft ] && flags=(--draft-model "$stories")
  if serve "$mode" "$stories" "${flags[@]}"; then
    texts "$mode"
    echo "stories260K $mode: $(curl -s "http://127.0.0.1:$port/health" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("speculation"))')"
    echo "  $(spec_metrics)"
    stop
    # greedy: the first three lines; seeded: the rest, the same only where draws are keyed by position (CUDA)
    lines=6; [ "${DEVICE:-gpu}" = cpu ] && lines=3
    if cmp -s <(head -$lines "$out/plain.texts") <(head -$lines "$out/$mode.texts"); then
      echo "PASS stories260K $mode: the first $lines texts (greedy$([ $lines = 6 ] && echo ', seeded')) as without"
    else echo "FAIL stories260K $mode: texts differ"; diff "$out/plain.texts" "$out/$mode.texts" | head -8; fails=$((fails + 1)); fi
  fi
done

# ---- 2. speed ---------------------------------------------------------------
for pair in $pairs; do
  target=${pair%%:*} draft=${pair#*:}
  name=$(basename "$target" .gguf)-$(basename "$draft" .gguf)
  flags=(--spec-ngram); [ "$draft" != ngram ] && flags=(--draft-model "$draft")
  for mode in without with; do
    f=("${extra[@]}"); [ $mode = with ] && f+=("${flags[@]}")
    serve "$name.$mode" "$target" --ctx-size "${CTX:-4096}" "${f[@]}" || continue
    "$eh" loadgen --url "http://127.0.0.1:$port" --levels 1 -n 256 --requests-per-client 4 --stream --json \
      > "$out/$name.$mode.load1.json" 2>&1
    "$eh" loadgen --url "http://127.0.0.1:$port" --levels 64 -n 128 --requests-per-client 2 --json \
      > "$out/$name.$mode.load64.json" 2>&1
    echo "$name $mode: $(spec_metrics)"
    stop
  done
  python3 - "$out" "$name" <<'EOF'
import json, sys
out, name = sys.argv[1:3]
def level(mode, n):
    try:
        d = json.load(open(f"{out}/{name}.{mode}.load{n}.json"))
        return d.get("levels", [d])[0]
    except Exception as e:
        return {"error": str(e)}
for n in (1, 64):
    a, b = level("without", n), level("with", n)
    ta, tb = a.get("tokens_per_s", 0), b.get("tokens_per_s", 0)
    tp = f", TPOT p50 {1000 * a.get('tpot_p50_s', 0):.2f} -> {1000 * b.get('tpot_p50_s', 0):.2f} ms" if n == 1 else ""
    print(f"{name}, {n} client(s): {ta:.1f} -> {tb:.1f} output tok/s ({tb / ta if ta else 0:.2f}x){tp}")
EOF
done
echo "device-spec: $fails failed"
[ $fails -eq 0 ]
