#!/usr/bin/env bash
# On the GPU machine: LoRA adapters on the CUDA plugins (issue 50).
#  1. The GPU tests (eh_cuda_lora_tests: llama-cuda and gpt-cuda against the
#     CPU reference, mixed adapters in one step, forks, rules) and
#     eh-plugin-check's LoRA check on both plugins.
#  2. Logits against transformers (+ peft when installed; the JSON says which
#     reference ran) with a random rank-8 adapter on the tiny seeded llama
#     (tests/reference/lora_reference.py), served from its GGUF and from its
#     HF directory (q/k rows in HF order there).
#  3. Throughput: a forged Llama-3.1-8B-class Q4_K_M with 8 forged rank-16
#     adapters (q/k/v/o/gate/up/down of every layer, F16): 64 clients spread
#     over the 8 adapters against 64 clients of the base model (requests
#     without an adapter: steps without adapters), on one server; PLAIN=1 adds
#     the base model on a server without --lora. Target: adapters >= 0.8x.
#
#   scripts/device-lora.sh BUILD_DIR TESTDATA_DIR
# OUT (default /tmp/device-lora) gets the logs; MODELS_DIR (default /tmp/eh-forged) the forged files;
# PARTS (default 1,2,3) picks the parts above.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build-cuda}" && pwd)
testdata=${2:-../shared/testdata}
eh="$build/bin/engine-host"
out=${OUT:-/tmp/device-lora}
models=${MODELS_DIR:-/tmp/eh-forged}
mkdir -p "$out" "$models"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
export EH_LLAMA_CUDA_PLUGIN="$build/plugins/libeh-llama-cuda.so"
export EH_CPU_REFERENCE_PLUGIN="$build/plugins/libeh-cpu-reference.so"
fails=0
port=18790
parts=",${PARTS:-1,2,3},"

# ---- 1. GPU tests and the plugin check ------------------------------------
if [[ $parts == *,1,* ]]; then
if "$build/bin/eh_cuda_lora_tests" > "$out/lora_tests.log" 2>&1; then echo "PASS eh_cuda_lora_tests"
else echo "FAIL eh_cuda_lora_tests"; fails=$((fails + 1)); fi
grep -E "^\[lora-gpu\]|Failure|FAILED|PASSED" "$out/lora_tests.log" | head -60
for pair in llama-cuda:tiny-llama-3.1-q4_k_m gpt-cuda:tiny-gpt2-f16 gpt-cuda:tiny-gpt-oss-mxfp4; do
  plugin=${pair%%:*} prof=${pair#*:}
  tiny="$models/$prof.gguf"
  [ -s "$tiny" ] || "$eh" forge --like "$prof" --out "$tiny" -q > /dev/null 2>&1
  log="$out/plugin_check.$prof.log"
  if "$build/bin/eh-plugin-check" "$build/plugins/libeh-$plugin.so" --model "$tiny" --only lora_adapters > "$log" 2>&1
  then echo "PASS eh-plugin-check lora_adapters ($plugin, $prof): $(grep -i lora "$log" | head -1)"
  else echo "FAIL eh-plugin-check lora_adapters ($plugin, $prof)"; tail -5 "$log"; fails=$((fails + 1)); fi
done

fi

# ---- 2. against transformers (+ peft) --------------------------------------
if [[ $parts == *,2,* ]]; then
python3 -c "import peft" 2>/dev/null && echo "peft: $(python3 -c 'import peft; print(peft.__version__)')" \
  || echo "peft: NOT installed here: the reference is the merged model in torch (W + alpha/r B A)"
if python3 "$here/tests/reference/lora_reference.py" --dump "$build/bin/eh_lora_dump" --plugin "$EH_LLAMA_CUDA_PLUGIN" \
     --device cuda --hf-model --base-tol 0.02 --out "$out/reference" > "$out/lora_reference.json" 2> "$out/lora_reference.err"
then echo "PASS lora_reference (llama-cuda, GGUF and HF directory)"
else echo "FAIL lora_reference"; tail -5 "$out/lora_reference.err"; fails=$((fails + 1)); fi
python3 - "$out/lora_reference.json" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"  (no JSON: {e})"); sys.exit()
print(f"  reference: {r.get('reference')}; adapter moves logits by {r.get('adapter_vs_base_max_abs_logit', 0):.3g}")
for k, v in r.items():
    if isinstance(v, dict):
        if "error" in v: print(f"  {k}: error {v['error'][-300:]}")
        else: print(f"  {k}: max |logit| {v['max_abs_logit']:.4g}, max |logprob| {v['max_abs_logprob']:.4g}, "
                    f"same top-1 {v['same_top1']}, base rows {v['base_rows_vs_base_model']['max_abs_logit']:.4g}")
EOF

fi

# ---- 3. throughput: 64 clients over 8 adapters vs the base model ----------
if [[ $parts == *,3,* ]]; then
base="$models/llama-3.1-8b-instruct-q4_k_m.gguf"
[ -s "$base" ] || "$eh" forge --like llama-3.1-8b-instruct-q4_k_m --out "$base" -q > "$out/forge.log" 2>&1 \
  || { echo "FAIL forge of the 8B"; exit 1; }
python3 - "$here/tests/reference" "$base" "$models" <<'EOF' || { echo "FAIL forging adapters"; exit 1; }
import os, struct, sys
sys.path.insert(0, sys.argv[1])
import gguf_io, torch
base, outdir = sys.argv[2], sys.argv[3]
# The tensor infos only (the header): names and dims of the matrices adapted.
with open(base, "rb") as f:
    head = f.read(64 << 20)
class Head(gguf_io.Reader):
    def __init__(self, buf):
        self.buf, self.pos = buf, 4
        self.version = self._u("<I"); nt = self._u("<Q"); nkv = self._u("<Q")
        self.meta = {}
        for _ in range(nkv):
            k = self._str(); self.meta[k] = self._value(self._u("<I"))
        self.dims = {}
        for _ in range(nt):
            name = self._str(); nd = self._u("<I")
            self.dims[name] = [self._u("<Q") for _ in range(nd)]; self._u("<I"); self._u("<Q")
h = Head(head)
kinds = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
r = 16
for i in range(8):
    path = os.path.join(outdir, f"lora8b-{i}.gguf")
    if os.path.exists(path): continue
    g = torch.Generator().manual_seed(100 + i)
    w = gguf_io.Writer(h.meta["general.architecture"])
    w.str("general.type", "adapter"); w.str("adapter.type", "lora"); w.f32("adapter.lora.alpha", 32.0)
    for name, dims in sorted(h.dims.items()):
        if not any(name.endswith("." + k + ".weight") for k in kinds): continue
        n_in, n_out = dims
        a = (torch.randn(r, n_in, generator=g) / n_in ** 0.5).half()
        b = (0.01 * torch.randn(n_out, r, generator=g)).half()
        w.tensor_raw(name + ".lora_a", [n_in, r], gguf_io.TYPE_F16, a.numpy().tobytes())
        w.tensor_raw(name + ".lora_b", [r, n_out], gguf_io.TYPE_F16, b.numpy().tobytes())
    w.write(path)
print("adapters ready")
EOF
serve() {  # NAME [flags...]: a server on $port, waits until healthy
  local name=$1; shift
  "$eh" serve --plugins "$build/plugins" --model "$base" --port $port --device gpu --log-format text "$@" \
    > "$out/$name.serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    kill -0 $pid 2>/dev/null || { echo "$name: serve exited"; tail -3 "$out/$name.serve.log"; return 1; }
    curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"status": *"healthy"' && return 0
    sleep 0.5
  done
  echo "$name: not healthy"; return 1
}
stop() { kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; }
load() {  # NAME MODEL-LIST
  "$eh" loadgen --url "http://127.0.0.1:$port" --levels 64 -n 128 --requests-per-client 2 --model "$2" --json \
    > "$out/$1.json" 2> "$out/$1.err"
}
id=$(basename "$base" .gguf)
# (PLAIN=1: also the base model on a server without --lora, one more 8B load)
if [ "${PLAIN:-0}" = 1 ] && serve plain; then load plain "$id"; stop; fi
flags=(); list=""
for i in $(seq 0 7); do flags+=(--lora "a$i=$models/lora8b-$i.gguf"); list="$list,$id:a$i"; done
if serve lora "${flags[@]}"; then
  load base "$id"
  load adapters "${list#,}"
  load base_again "$id"
  stop
fi
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
def lv(n):
    try:
        d = json.load(open(f"{out}/{n}.json")); return d.get("levels", [d])[0]
    except Exception as e:
        return {"error": str(e)}
r = {n: lv(n) for n in ("plain", "base", "adapters", "base_again")}
for n, l in r.items():
    if "error" in l and n == "plain": continue
    print(f"  {n}: {l.get('tokens_per_s', 0):.1f} output tok/s, {l.get('failed', '?')} failed "
          f"{l.get('first_error', l.get('error', ''))[:200]}")
b, a, p = r["base"].get("tokens_per_s", 0), r["adapters"].get("tokens_per_s", 0), r["plain"].get("tokens_per_s", 0)
ratio = a / b if b else 0
print(f"64 clients over 8 adapters / base on the same server: {ratio:.3f}x (target >= 0.8)"
      + (f"; base with adapters loaded / server without --lora: {b / p:.3f}x" if p else ""))
sys.exit(0 if ratio >= 0.8 and r["adapters"].get("failed", 1) == 0 else 1)
EOF
[ $? -eq 0 ] && echo "PASS throughput" || { echo "FAIL throughput"; fails=$((fails + 1)); }
fi
echo "device-lora: $fails failed"
[ $fails -eq 0 ]
