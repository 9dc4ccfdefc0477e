#!/usr/bin/env bash
# Long libFuzzer runs on the GPU machine's CPU cores (its 16 cores against
# this machine's 2). FUZZ_DIR holds the clang fuzz binaries (from a
# build-fuzz tree, stripped) and lib/ with the shared libraries they need
# beside them. Each TARGET:WORKERS runs WORKERS processes for SECONDS on a
# private corpus seeded from the repository's seeds; the executions of every
# process are summed per target. FUZZ_SEEDS, when set, names a folder whose
# TARGET subfolder (a corpus grown by earlier runs) seeds the target too.
#   [FUZZ_SEEDS=DIR] scripts/device-fuzz.sh FUZZ_DIR SECONDS TARGET:WORKERS ...
set -uo pipefail
cd "$(dirname "$0")/.."
dir=$(cd "$1" && pwd); secs=$2; shift 2
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
seeds_of() {  # the repository's seed folder of a target, if any, and FUZZ_SEEDS/TARGET
  find tests -maxdepth 2 -type d -name "${1}_seeds" | head -1
  if [ -n "${FUZZ_SEEDS:-}" ] && [ -d "$FUZZ_SEEDS/$1" ]; then echo "$FUZZ_SEEDS/$1"; fi
}
args_of() {
  case $1 in fuzz_chat_template) echo "-max_len=4096" ;; esac
}
log=$(mktemp -d)
for spec in "$@"; do
  t=${spec%%:*}; n=${spec##*:}
  for i in $(seq 1 "$n"); do
    corpus=$log/$t-corpus-$i; mkdir -p "$corpus"
    "$dir/$t" "$corpus" $(seeds_of "$t") $(args_of "$t") -max_total_time="$secs" -rss_limit_mb=4096 \
      -print_final_stats=1 > "$log/$t-$i.log" 2>&1 &
  done
done
wait
for spec in "$@"; do
  t=${spec%%:*}
  runs=$(cat "$log/$t"-*.log | grep -h "stat::number_of_executed_units" | awk '{s += $2} END {print s + 0}')
  crashes=$(grep -lE "ERROR: (AddressSanitizer|libFuzzer)|SUMMARY: UndefinedBehavior|deadly signal" "$log/$t"-*.log | wc -l)
  echo "$t: $runs executions in ${secs} s over ${spec##*:} processes; processes with a finding: $crashes"
  if [ "$crashes" -gt 0 ]; then
    grep -hE -A12 "ERROR:|deadly signal|runtime error" "$log/$t"-*.log | head -30; status=1
  fi
done
exit "${status:-0}"
