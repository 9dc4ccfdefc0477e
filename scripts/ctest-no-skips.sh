#!/usr/bin/env bash
# ctest that also fails when a test skips itself (GTEST_SKIP): in CI every
# test that is run must be able to fail. A skip there means a precondition
# the test took for granted is missing (its data, a tool), and the test
# checked nothing; ctest alone counts it as passed.
#   scripts/ctest-no-skips.sh BUILD_DIR CTEST_ARGS...
set -uo pipefail
build=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ctest --test-dir "$build" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
# ctest lists them after the run: "  <n> - <name> (Skipped)".
skipped=$(sed -n '/^The following tests did not run:/,/^$/p' "$log" | grep -E '\(Skipped\)$' || true)
if [[ -n $skipped ]]; then
  echo "ctest-no-skips: these tests skipped themselves, so they checked nothing:" >&2
  printf '%s\n' "$skipped" >&2
  ((rc == 0)) && rc=1
fi
exit $rc
