#!/usr/bin/env bash
# Every test program must list its tests without the shared test data
# (../shared/testdata): on a clone without it, ctest's test discovery runs
# each program at build time, so one that reads the data while its tests are
# listed (a namespace-scope read) stops the README's build. CI always has
# the data; this hides it (an empty folder bound over it in a private mount
# namespace, `unshare -rm`) and asks every program ctest knows for its list.
#   scripts/check-without-testdata.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${BUILD_DIR:-build}}
testdata=$(sed -n 's/^EH_TESTDATA_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
if [[ -z $testdata || ! -d $testdata ]]; then
  echo "check-without-testdata: ${testdata:-the test data folder} is absent already; nothing to hide"
  exit 0
fi
# The programs behind ctest's tests (a test is "PROGRAM --gtest_filter=...").
mapfile -t programs < <(ctest --test-dir "$build" -N --show-only=json-v1 |
  python3 -c 'import json, sys
seen = set()
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or []
    if cmd and any(a.startswith("--gtest_filter") for a in cmd[1:]) and cmd[0] not in seen:
        seen.add(cmd[0]); print(cmd[0])')
if ((${#programs[@]} == 0)); then
  echo "check-without-testdata: ctest lists no GoogleTest programs in $build" >&2
  exit 1
fi
empty=$(mktemp -d)
trap 'rmdir "$empty"' EXIT
# Inside the namespace the data folder is empty; a program that cannot list
# its tests there is named with what it printed.
unshare -rm bash -c '
  set -u
  mount --bind "$1" "$2" || { echo "check-without-testdata: cannot hide $2 (mount --bind)" >&2; exit 1; }
  shift 2
  failed=0
  for p in "$@"; do
    if ! out=$("$p" --gtest_list_tests 2>&1); then
      echo "check-without-testdata: $p cannot list its tests without the test data:" >&2
      printf "%s\n" "$out" | tail -5 >&2
      failed=1
    fi
  done
  exit $failed' check "$empty" "$testdata" "${programs[@]}"
echo "check-without-testdata: ${#programs[@]} test programs list their tests without $testdata"
