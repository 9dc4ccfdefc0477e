#!/usr/bin/env bash
# The README's test command: install, build, run every non-GPU test.
# On a GPU machine, `ctest --test-dir build -L gpu` runs the GPU tests.
# Tests that read the shared test data (../shared/testdata, never committed)
# carry the ctest label `testdata`, test by test (eh_discover_tests in
# tests/CMakeLists.txt); without that folder they are left out, and the script
# says so. CI always has it and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
build=${BUILD_DIR:-build}
# The folder the build was configured with (EH_TESTDATA_DIR, tests/CMakeLists.txt).
testdata=$(sed -n 's/^EH_TESTDATA_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
if [[ -n $testdata && -d $testdata && ${EH_TEST_HIDE_DATA:-0} == 1 ]]; then
  # CI's form (.ci/run): the tests without the label run with the folder
  # hidden, as on a clone without it, so a test that reads the data without
  # carrying the label fails here; then the labelled ones with the data. A
  # test that skips itself fails in both (ctest-no-skips.sh).
  scripts/check-without-testdata.sh "$build" run -LE "gpu|testdata" --output-on-failure -j"$(nproc)"
  scripts/ctest-no-skips.sh "$build" -L testdata -LE gpu --output-on-failure -j"$(nproc)"
elif [[ -n $testdata && -d $testdata ]]; then
  ctest --test-dir "$build" -LE gpu --output-on-failure -j"$(nproc)"
else
  left_out=$(ctest --test-dir "$build" -N -L testdata -LE gpu | sed -n 's/^Total Tests: //p')
  echo "scripts/test.sh: ${testdata:-the test data folder} is absent: ${left_out:-?} tests that read it" \
       "(ctest label testdata) are left out; CI runs them"
  ctest --test-dir "$build" -LE "gpu|testdata" --output-on-failure -j"$(nproc)"
fi
