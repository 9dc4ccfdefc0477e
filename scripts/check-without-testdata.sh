#!/usr/bin/env bash
# What a clone without the shared test data (../shared/testdata) does, on a
# machine that has it: the folder is hidden (an empty folder bound over it in
# a private mount namespace, `unshare -m`; the listing also `-rm` when not
# root), then
#  - every program ctest knows must list its tests: ctest's discovery runs
#    each program at build time on such a clone, so one that reads the data
#    while its tests are listed (a namespace-scope read) stops the build;
#  - with `run CTEST_ARGS...`, ctest runs those tests there too (CI:
#    `-LE "gpu|testdata"`, so a test that reads the data without the label
#    fails, and one that skips itself without it fails too:
#    scripts/ctest-no-skips.sh).
#   scripts/check-without-testdata.sh [BUILD_DIR [run CTEST_ARGS...]]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${BUILD_DIR:-build}}
shift || true
run=()
if [[ ${1:-} == run ]]; then
  shift
  run=("$@")
fi
testdata=$(sed -n 's/^EH_TESTDATA_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
if [[ -z $testdata || ! -d $testdata ]]; then
  echo "check-without-testdata: ${testdata:-the test data folder} is absent already; nothing to hide" >&2
  exit 1
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
# Root needs no user namespace. Anyone else gets one that maps them to root,
# which is enough to list the programs' tests but changes what chown and the
# like may do, which tests check: running tests there needs root.
ns=(unshare -m)
if ((EUID != 0)); then
  if ((${#run[@]} > 0)); then
    echo "check-without-testdata: running tests with the data hidden needs root (a user namespace would change the file ownership rules tests check); the listing alone works without: $0 $build" >&2
    exit 2
  fi
  ns=(unshare -rm)
fi
"${ns[@]}" bash -c '
  set -u
  empty=$1 testdata=$2 build=$3 nprog=$4
  shift 4
  mount --bind "$empty" "$testdata" || { echo "check-without-testdata: cannot hide $testdata (mount --bind)" >&2; exit 1; }
  failed=0
  for ((i = 0; i < nprog; ++i)); do
    p=$1
    shift
    if ! out=$("$p" --gtest_list_tests 2>&1); then
      echo "check-without-testdata: $p cannot list its tests without the test data:" >&2
      printf "%s\n" "$out" | tail -5 >&2
      failed=1
    fi
  done
  ((failed)) && exit 1
  echo "check-without-testdata: $nprog test programs list their tests without $testdata"
  if (($# > 0)); then
    echo "check-without-testdata: ctest $* with $testdata hidden"
    scripts/ctest-no-skips.sh "$build" "$@"
  fi' check "$empty" "$testdata" "$build" "${#programs[@]}" "${programs[@]}" "${run[@]}"
