#!/usr/bin/env bash
# --device (issue 26, the worker contract's VRAM-only rule): when a GPU plugin
# serves the model but was rejected, serve, chat and inspect refuse with exit 3
# and its reasons instead of running the model on the CPU engine unasked;
# --device cpu asks for the CPU engine, --device any is the old fallback,
# except for a GPU named on the command line (--gpu-device N, --gpu N): no
# GPU plugin accepting it is exit 3 under every policy but cpu.
# The GPU plugin is the fake-gpu fixture (tests/plugins/test-engine): a
# "cuda" plugin whose probe accepts GPU 0 only, and finds no driver with
# EH_TEST_ENGINE_NO_GPU set. The CPU plugin is the test engine.
# Usage: device_test.sh ENGINE_HOST TEST_PLUGIN_DIR MODEL
source "$(dirname "$0")/testlib.sh"
eh=$1 plugins=$2 model=$3
both=(--plugins "$plugins/fake-gpu" --plugins "$plugins/good")

# refuses NAME EXIT PATTERN... -- command: the command exits with EXIT by
# itself, never gets as far as loading the model, and prints every PATTERN.
refuses() {
  local name=$1 want=$2 patterns=()
  shift 2
  while [[ $1 != -- ]]; do patterns+=("$1"); shift; done
  shift
  local out rc ok=0
  out=$(timeout 20 "$@" 2>&1)
  rc=$?
  [[ $rc -eq $want ]] || ok=1
  for p in "${patterns[@]}"; do grep -qF -- "$p" <<<"$out" || ok=1; done
  grep -qE '"event":"(model_load_start|ready)"' <<<"$out" && ok=1
  check "$name" $ok "exit $rc (want $want), patterns [${patterns[*]}] in: $(head -c 3000 <<<"$out")"
}

# serves NAME PLUGIN -- command: serve comes up ready with PLUGIN, and exits 0
# on SIGTERM.
serves() {
  local name=$1 want=$2 log=$scratch/$1.log
  shift 3
  "$@" --port 0 >"$log" 2>&1 &
  local pid=$!
  wait_for_line "$log" '"event":"ready"' $pid
  local ready
  ready=$(grep '"event":"ready"' "$log")
  kill -TERM $pid 2>/dev/null
  wait $pid
  local rc=$?
  [[ $rc -eq 0 && $ready == *"\"plugin\":\"$want\""* ]]
  check "$name" $? "exit $rc, want ready with $want: $(head -c 3000 "$log")"
}

no_gpu=(env EH_TEST_ENGINE_NO_GPU=1)
reason='fixture-fake-gpu (rejected): probe: cannot run here: fixture: no usable CUDA device (no driver)'
hint='pass --device cpu to serve this model with test-engine on the CPU'

# The default: the GPU plugin claims the model and was rejected, so the CPU
# engine does not serve it; the error names the plugin, its reason and the way out.
refuses serve-auto-refuses 3 'no accepted device (GPU) plugin can serve this model' "$reason" "$hint" '[NO_PLUGIN]' \
  -- "${no_gpu[@]}" "$eh" --model "$model" "${both[@]}" --port 0
# The same as a log line for the orchestrator (the message, and the plugin's own plugin_rejected warning).
out=$("${no_gpu[@]}" "$eh" --model "$model" "${both[@]}" --port 0 2>/dev/null)
grep '"event":"error"' <<<"$out" | grep -q '"code":"NO_PLUGIN".*fixture-fake-gpu (rejected)'
check serve-auto-logs-the-refusal $? "$out"
grep '"event":"plugin_rejected"' <<<"$out" | grep -q 'no usable CUDA device'
check serve-auto-logs-the-rejection $? "$out"
serves serve-device-cpu test-engine -- "${no_gpu[@]}" "$eh" --model "$model" "${both[@]}" --device cpu
serves serve-device-any-falls-back test-engine -- "${no_gpu[@]}" "$eh" --model "$model" "${both[@]}" --device any
refuses serve-device-gpu 3 "$reason" "$hint" -- "${no_gpu[@]}" "$eh" --model "$model" "${both[@]}" --device gpu --port 0
# No GPU plugin claims the model: the CPU engine serves by default.
serves serve-auto-cpu-only test-engine -- "$eh" --model "$model" --plugins "$plugins/good"
# The GPU plugin accepted (GPU 0 exists): it serves.
serves serve-auto-gpu-accepted fixture-fake-gpu -- "$eh" --model "$model" "${both[@]}"

# A GPU ordinal that does not exist is an error at startup, naming it.
refuses serve-gpu-device-99 3 'fixture-fake-gpu (rejected): probe: cannot run here: fixture: CUDA device 99 does not exist' \
  -- "$eh" --model "$model" "${both[@]}" --gpu-device 99 --port 0
# A GPU named on the command line is a request for it under every policy but
# cpu: --device any does not fall back to the CPU for it, and the error names
# the GPU count the plugin's probe gives.
named='GPU 99 was asked for on the command line, and no GPU plugin can use it'
present='fixture: CUDA device 99 does not exist (1 present)'
refuses serve-any-gpu-device-99 3 "$named" "$present" 'pass --device cpu' '[NO_PLUGIN]' \
  -- "$eh" --model "$model" "${both[@]}" --device any --gpu-device 99 --port 0
refuses serve-gpu-gpu-device-99 3 "$named" "$present" -- "$eh" --model "$model" "${both[@]}" --device gpu --gpu-device 99 --port 0
refuses serve-any-named-gpu-no-driver 3 'GPU 0 was asked for on the command line' 'no usable CUDA device (no driver)' \
  -- "${no_gpu[@]}" "$eh" --model "$model" "${both[@]}" --device any --gpu-device 0 --port 0
refuses serve-any-named-gpu-no-gpu-plugin 3 'GPU 1 was asked for on the command line, and no GPU plugin can use it (no GPU plugin was found)' \
  -- "$eh" --model "$model" --plugins "$plugins/good" --device any --gpu-device 1 --port 0
refuses serve-auto-named-gpu-no-gpu-plugin 3 'GPU 1 was asked for' -- "$eh" --model "$model" --plugins "$plugins/good" --gpu-device 1 --port 0
serves serve-any-named-gpu-exists fixture-fake-gpu -- "$eh" --model "$model" "${both[@]}" --device any --gpu-device 0
serves serve-cpu-ignores-gpu-device test-engine -- "$eh" --model "$model" "${both[@]}" --device cpu --gpu-device 99
refuses serve-gpu-device-negative 2 '--gpu-device must be 0 or more' -- "$eh" --model "$model" "${both[@]}" --gpu-device=-1
refuses serve-device-unknown 2 '--device must be auto, gpu, cpu or any' -- "$eh" --model "$model" "${both[@]}" --device tpu

# chat loads a model as serve does, by the same rule.
refuses chat-auto-refuses 3 "$reason" "$hint" -- "${no_gpu[@]}" "$eh" chat -m "$model" "${both[@]}" -p hi -n 4
out=$("${no_gpu[@]}" "$eh" chat -m "$model" "${both[@]}" --device cpu -p hi -n 4 2>&1); rc=$?
[[ $rc -eq 0 && -n $out ]]; check chat-device-cpu $? "exit $rc: $out"
refuses chat-gpu-99 3 'CUDA device 99 does not exist' -- "$eh" chat -m "$model" "${both[@]}" --gpu 99 -p hi -n 4

refuses chat-any-gpu-99 3 "$named" "$present" -- "$eh" chat -m "$model" "${both[@]}" --device any --gpu 99 -p hi -n 4
out=$("$eh" chat -m "$model" "${both[@]}" --device cpu --gpu 99 -p hi -n 4 2>&1); rc=$?
[[ $rc -eq 0 && -n $out ]]; check chat-cpu-ignores-gpu $? "exit $rc: $out"

# inspect says what serve would do.
refuses inspect-any-gpu-99 3 "$named" "$present" -- "$eh" inspect --model "$model" "${both[@]}" --device any --gpu 99
out=$("$eh" inspect --model "$model" "${both[@]}" --device cpu --gpu 99 2>&1); rc=$?
[[ $rc -eq 0 && $out =~ serves\ it\ +test-engine ]]; check inspect-cpu-ignores-gpu $? "exit $rc: $out"
refuses inspect-auto 3 "$reason" "$hint" -- "${no_gpu[@]}" "$eh" inspect --model "$model" "${both[@]}"
out=$("${no_gpu[@]}" "$eh" inspect --model "$model" "${both[@]}" --device cpu 2>&1); rc=$?
[[ $rc -eq 0 && $out =~ serves\ it\ +test-engine ]]; check inspect-device-cpu $? "exit $rc: $out"

finish
