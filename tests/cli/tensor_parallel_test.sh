#!/usr/bin/env bash
# --tensor-parallel / --gpus (issue 53): the GPUs a model spans (ABI 1.6
# device sets). On the fake-gpu fixture (tests/plugins/test-engine), a "cuda"
# plugin that spans up to 8 devices, whose probe sees the GPUs of
# EH_TEST_ENGINE_GPUS (free MiB each), and whose model info names the device
# set it was loaded on; and the test engine, a CPU plugin of one device.
# Checks: the GPUs with the most free memory are chosen, --gpus is taken in
# rank order (a GPU twice: the shard mode), /health, the ready line and
# /metrics list every rank's GPU; every refusal names why, before the load.
# Usage: tensor_parallel_test.sh ENGINE_HOST TEST_PLUGIN_DIR MODEL
source "$(dirname "$0")/testlib.sh"
eh=$1 plugins=$2 model=$3
gpu=(--plugins "$plugins/fake-gpu")

# refuses NAME EXIT PATTERN... -- command: exits with EXIT before loading,
# printing every PATTERN.
refuses() {
  local name=$1 want=$2 patterns=()
  shift 2
  while [[ $1 != -- ]]; do patterns+=("$1"); shift; done
  shift
  local out rc ok=0
  out=$(timeout 20 "$@" --port 0 2>&1)
  rc=$?
  [[ $rc -eq $want ]] || ok=1
  for p in "${patterns[@]}"; do grep -qF -- "$p" <<<"$out" || ok=1; done
  grep -qE '"event":"(model_load_start|ready)"' <<<"$out" && ok=1
  check "$name" $ok "exit $rc (want $want), patterns [${patterns[*]}] in: $(head -c 3000 <<<"$out")"
}

# serving NAME -- command: starts it, waits for ready, leaves its log in
# $scratch/NAME.log, its port in $port and its pid in $pid.
serving() {
  local name=$1
  shift 2
  log=$scratch/$name.log
  "$@" --port 0 >"$log" 2>&1 &
  pid=$!
  wait_for_line "$log" '"event":"ready"' $pid
  port=$(grep -o '"uri":"http://127.0.0.1:[0-9]*"' "$log" | head -1 | grep -o '[0-9]*"$' | tr -d '"')
}
stop() { kill -TERM $pid 2>/dev/null; wait $pid; }
# pyq EXPR: EXPR over the JSON on stdin as `j` (python3, which the build
# already needs; no jq), printed as compact JSON, a string as is.
pyq() {
  python3 -c 'import json,sys
v = eval(sys.argv[1], {"j": json.load(sys.stdin)})
print(v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))' "$1"
}

# Two ranks, no --gpus: GPUs 1 and 2 have the most free memory.
export EH_TEST_ENGINE_GPUS=10000,70000,40000
serving tp2-most-free -- "$eh" --model "$model" "${gpu[@]}" --tensor-parallel 2
health=$(curl -s "http://127.0.0.1:$port/health")
[[ $(pyq '[[d["rank"], d["gpu"], d["name"]] for d in j["devices"]]' <<<"$health") == '[[0,1,"test GPU 1"],[1,2,"test GPU 2"]]' ]]
check tp2-health-lists-every-rank $? "$health"
[[ $(pyq 'j["device"]' <<<"$health") == "test devices 1,2" ]]
check tp2-plugin-got-the-device-set $? "$health"
[[ $(grep '"event":"ready"' "$log" | pyq '[d["gpu"] for d in j["devices"]] == [1, 2] and isinstance(j["vram_bytes"], int)') == true ]]
check tp2-ready-line-lists-every-rank $? "$(grep '"event":"ready"' "$log")"
metrics=$(curl -s "http://127.0.0.1:$port/metrics")
grep -qx 'eh_model_device_info{rank="0",gpu="1",name="test GPU 1"} 1' <<<"$metrics" &&
  grep -qx 'eh_model_device_info{rank="1",gpu="2",name="test GPU 2"} 1' <<<"$metrics"
check tp2-metrics-list-every-rank $? "$(grep device_info <<<"$metrics")"
stop

# --gpus names them, rank order kept; a GPU twice is the shard mode.
serving gpus-order -- "$eh" --model "$model" "${gpu[@]}" --gpus 2,0
[[ $(curl -s "http://127.0.0.1:$port/health" | pyq 'j["device"]') == "test devices 2,0" ]]
check gpus-rank-order $? "$(curl -s "http://127.0.0.1:$port/health")"
stop
serving shard-mode -- "$eh" --model "$model" "${gpu[@]}" --gpus 0,0 --tensor-parallel 2
[[ $(curl -s "http://127.0.0.1:$port/health" | pyq '[j["device"], [d["gpu"] for d in j["devices"]]]') == '["test devices 0,0",[0,0]]' ]]
check shard-mode-one-gpu-twice $? "$(curl -s "http://127.0.0.1:$port/health")"
stop
# A GPU the probe refuses (busy) is skipped, not the end of the GPUs: the
# ones after it are chosen, or named, by their own ordinal.
export EH_TEST_ENGINE_GPUS=busy,70000,40000
serving skip-busy -- "$eh" --model "$model" "${gpu[@]}" --gpu-device 1 --tensor-parallel 2
[[ $(curl -s "http://127.0.0.1:$port/health" | pyq 'j["device"]') == "test devices 1,2" ]]
check tp-skips-a-busy-gpu $? "$(curl -s "http://127.0.0.1:$port/health")"
stop
refuses gpus-names-a-busy-gpu 3 '--gpus names GPU 0, which plugin fixture-fake-gpu cannot use: fixture: GPU 0 is busy' \
  -- "$eh" --model "$model" "${gpu[@]}" --gpus 2,0
export EH_TEST_ENGINE_GPUS=10000,70000,40000

# One rank: the plain load (no device set), /health still lists its GPU.
serving one-rank -- "$eh" --model "$model" "${gpu[@]}"
[[ $(curl -s "http://127.0.0.1:$port/health" | pyq '[j["device"], [d["gpu"] for d in j["devices"]]]') == '["test device",[0]]' ]]
check one-rank-plain-load $? "$(curl -s "http://127.0.0.1:$port/health")"
stop

# Refusals, each before the load.
refuses cpu-plugin-one-device 2 'plugin test-engine serves one device only; --tensor-parallel 2 needs a plugin that spans 2 devices' \
  -- "$eh" --model "$model" --plugins "$plugins/good" --tensor-parallel 2
refuses too-few-gpus 5 "--tensor-parallel 4 needs 4 GPUs; the plugin can use 3" '[INSUFFICIENT_VRAM]' \
  -- "$eh" --model "$model" "${gpu[@]}" --tensor-parallel 4
refuses gpus-names-a-missing-gpu 3 '--gpus names GPU 5, which plugin fixture-fake-gpu cannot use: fixture: CUDA device 5 does not exist (3 present)' \
  -- "$eh" --model "$model" "${gpu[@]}" --gpus 0,5
# each rank holds its share of the layers' matrices and the KV cache, and
# the embeddings, LM head and norms whole
EH_TEST_ENGINE_GPUS=1,1 refuses fit-shortfall-named 5 'the model needs 11.4 MiB of weights split over the ranks + 0.8 MiB on every rank (embeddings, LM head, norms) + 3.4 MiB of KV cache (one sequence of 512 tokens), 8.2 MiB a rank over 2 ranks; GPU 0 (test GPU 0) has 1.0 MiB free for 1 rank: 7.2 MiB short' \
  -- "$eh" --model "$model" "${gpu[@]}" --tensor-parallel 2
EH_TEST_ENGINE_GPUS=1,1 refuses fit-shortfall-kv-cache-size 5 '+ 64.0 MiB of KV cache (--kv-cache-size-mb 64), 38.5 MiB a rank' \
  -- "$eh" --model "$model" "${gpu[@]}" --tensor-parallel 2 --kv-cache-size-mb 64
refuses tp-out-of-range 2 '--tensor-parallel must be between 1 and 8' -- "$eh" --model "$model" "${gpu[@]}" --tensor-parallel 9
refuses gpus-bad-list 2 "--gpus '0,,1': '' is not a GPU ordinal (0-63)" -- "$eh" --model "$model" "${gpu[@]}" --gpus 0,,1
refuses gpus-count-disagrees 2 '--tensor-parallel 3 but --gpus names 2 GPUs' -- "$eh" --model "$model" "${gpu[@]}" --tensor-parallel 3 --gpus 0,1
refuses gpus-and-gpu-device 2 '--gpus and --gpu-device both name GPUs' -- "$eh" --model "$model" "${gpu[@]}" --gpus 1 --gpu-device 1
refuses tp-engine-process 2 'cannot go with --engine-process yet' -- "$eh" --model "$model" "${gpu[@]}" --tensor-parallel 2 --engine-process

# bench: the same flags; the device set reaches the load, and a plugin of
# one device fails its run naming why.
out=$(timeout 60 "$eh" bench -m "$model" "${gpu[@]}" --gpus 0,0 -p 8 -n 4 -r 1 --json 2>&1)
[[ $(pyq 'j["gpus"] == [0, 0] and j["results"][0]["ok"] and j["results"][0]["device_name"] == "test devices 0,0"' <<<"$out") == true ]]
check bench-shard-mode $? "$out"
out=$(timeout 60 "$eh" bench -m "$model" --plugins "$plugins/good" --tensor-parallel 2 -p 8 -n 4 -r 1 --json 2>&1)
[[ $(pyq 'j["gpus"] == [0, 1] and "plugin test-engine serves one device only; 2 were asked for" in j["results"][0]["error"]' <<<"$out") == true ]]
check bench-one-device-plugin-fails-its-run $? "$out"
out=$(timeout 20 "$eh" bench -m "$model" "${gpu[@]}" --gpus 0 --gpu 1 2>&1); rc=$?
[[ $rc -eq 2 && $out == *"--gpus and --gpu both name GPUs"* ]]
check bench-gpus-and-gpu $? "exit $rc: $out"

finish
