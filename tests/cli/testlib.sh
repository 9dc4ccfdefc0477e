# Sourced by the tests/cli scripts: a scratch folder removed on exit, the pass
# and fail counts, and the summary line that is the script's verdict.
set -uo pipefail
fails=0 passes=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

check() {  # NAME CONDITION-RESULT DETAIL
  if [[ $2 -eq 0 ]]; then passes=$((passes + 1)); else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}

# expect NAME EXIT_CODE PATTERN -- command...: the command exits EXIT_CODE
# and its output (stdout and stderr) has a line matching PATTERN (grep -E).
expect() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne $want ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $want), pattern '$pattern' in:"
    sed 's/^/    /' <<<"$out" | head -20
    fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}

finish() {  # the last command of a test script: its exit status
  echo "$passes passed, $fails failed"
  [[ $fails -eq 0 ]]
}

# wait_for_line LOG PATTERN PID [SECONDS]: until LOG has a line matching
# PATTERN (grep -E), PID has exited, or SECONDS (default 60) have passed;
# the status says whether the line came.
wait_for_line() {
  local log=$1 pattern=$2 pid=$3 tenths=$((${4:-60} * 10))
  for _ in $(seq "$tenths"); do
    grep -qE -- "$pattern" "$log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -qE -- "$pattern" "$log" 2>/dev/null
}

# exits_within PID SECONDS: whether PID (a child of this shell) ends within
# SECONDS; if not, it is killed.
exits_within() {
  local pid=$1 tenths=$(($2 * 10))
  for _ in $(seq "$tenths"); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null || return 0
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 1
}
