#!/usr/bin/env bash
# Same-machine A/B on the GPU machine: alternates `engine-host bench` over
# two or more sides, round after round, so that the machine instance (whose
# speed differs from the next one's by a few per cent) is the same for all.
# A side is a plugin folder and optional environment settings, one word:
#
#   scripts/device-ab.sh BIN MODEL PLUGIN SIDE SIDE [SIDE...]
#   SIDE = DIR[,VAR=VALUE...]    e.g. build/plugins,EHCUDA_PLAN={"pair_slots":1}
#   (one plan key per side: a comma separates settings)
#
# Environment: AB_ROUNDS (default 3), AB_ARGS (default -p 512 -n 128 -r 3).
# Prints one line per run (decode and prefill tok/s) and each side's
# decode range at the end.
set -uo pipefail
[ $# -ge 5 ] || { sed -n 2,12p "$0"; exit 2; }
bin=$1 model=$2 plugin=$3
shift 3
rounds=${AB_ROUNDS:-3}
args=${AB_ARGS:-"-p 512 -n 128 -r 3"}
declare -A runs
for ((r = 1; r <= rounds; ++r)); do
  for side in "$@"; do
    IFS=, read -r dir vars <<< "$side"
    # shellcheck disable=SC2086
    line=$(env ${vars//,/ } "$bin" bench --plugins "$dir" --plugin "$plugin" --model "$model" $args --json 2>/dev/null |
      python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print("%.1f %.0f" % (r["decode_tokens_per_s"], r["prefill_tokens_per_s"]) if r.get("ok") else "failed: " + r.get("error", ""))' 2>&1)
    echo "round $r  $side: decode/prefill $line"
    runs[$side]="${runs[$side]:-} ${line%% *}"
  done
done
for side in "$@"; do echo "decode $side:${runs[$side]}"; done
