#!/usr/bin/env bash
# eh-schema-coverage (host/constrain/bench/schema_coverage.cpp): its usage,
# its refusals of bad arguments (exit 2, never a crash), and its table on a
# two-schema source.
# Usage: schema_coverage_test.sh EH_SCHEMA_COVERAGE
source "$(dirname "$0")/../cli/testlib.sh"
cov=$1

mkdir -p "$scratch/set/src"
echo '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}' >"$scratch/set/src/ok.json"
echo '{"type":"string","pattern":"(a)\\1"}' >"$scratch/set/src/backref.json"

expect help 0 '^usage: eh-schema-coverage \[--list' -- "$cov" --help
expect help-short 0 '^  --repeat N ' -- "$cov" -h
expect no-dir 2 "eh-schema-coverage: no DIR given" -- "$cov"
expect missing-dir 2 "eh-schema-coverage: '$scratch/nope' is not a folder" -- "$cov" "$scratch/nope"
expect file-not-dir 2 "is not a folder" -- "$cov" "$scratch/set/src/ok.json"
expect unknown-option 2 "unknown option '--bogus'" -- "$cov" --bogus "$scratch/set"
expect repeat-junk 2 '--repeat takes a count from 1 to 1000' -- "$cov" --repeat x "$scratch/set"
expect repeat-missing 2 '--repeat takes a count from 1 to 1000' -- "$cov" "$scratch/set" --repeat
expect samples-short 2 '--samples takes a count from 1 to 100000 and a file' -- "$cov" --samples 3
expect samples-unwritable 2 "cannot write '$scratch/nope/s.jsonl'" -- "$cov" --samples 3 "$scratch/nope/s.jsonl" "$scratch/set"

expect table 0 '^\| src \| 2 \| 1 \| 50 % \|$' -- "$cov" "$scratch/set"
expect list-ok 0 $'^ok\tsrc/ok.json\t' -- "$cov" --list "$scratch/set"
expect list-refused 0 $'^REFUSED\tsrc/backref.json\t.*\\[pattern\\]' -- "$cov" --list "$scratch/set"
expect repeat 0 '^\| all \| 2 \| 1 \| 50 % \|$' -- "$cov" --repeat 3 "$scratch/set"
# --samples: N complete values of the accepted schema, one JSON line each.
expect samples 0 'random walks: 4, ended with a complete value: [1-4]$' -- "$cov" --samples 4 "$scratch/s.jsonl" "$scratch/set"
n=$(grep -c '"instance":"{' "$scratch/s.jsonl")
check samples-file $(( n >= 1 && n <= 4 ? 0 : 1 )) "$n sample lines in $scratch/s.jsonl"

# Walked values validate with the jsonschema package (python3-jsonschema;
# these checks are skipped, and say so, where python3 lacks it): warp-themes'
# oneOf of two objects whose members are all optional never gives `{}`,
# which matches both branches.
if ! python3 -c 'import jsonschema' 2>/dev/null; then
  echo "SKIP walk/overlap/invalid: python3 has no jsonschema module"
  finish
  exit
fi
mkdir -p "$scratch/walk/w"
cat >"$scratch/walk/w/gradient.json" <<'JSON'
{"type":"object","oneOf":[
  {"properties":{"left":{"enum":["#000000"]},"right":{"enum":["#ffffff"]}},"additionalProperties":false},
  {"properties":{"top":{"enum":["#000000"]},"bottom":{"enum":["#ffffff"]}},"additionalProperties":false}]}
JSON
expect walk 0 'random walks: 300, ended with a complete value: 300$' -- "$cov" --samples 300 "$scratch/walk.jsonl" "$scratch/walk"
expect walk-valid 0 '^300 valid, 0 invalid, 0 valid but for matching two oneOf branches' -- python3 "$(dirname "$0")/validate_samples.py" "$scratch/walk.jsonl"
# The validator counts an overlap of oneOf branches apart (not enforced) and
# fails on any other invalid value.
echo '{"oneOf":[{"type":"integer"},{"minimum":0}]}' >"$scratch/overlap.json"
printf '{"schema":"%s","instance":"5"}\n' "$scratch/overlap.json" >"$scratch/overlap.jsonl"
expect overlap 0 '^0 valid, 0 invalid, 1 valid but for matching two oneOf branches' -- python3 "$(dirname "$0")/validate_samples.py" "$scratch/overlap.jsonl"
printf '{"schema":"%s","instance":"-1.5"}\n' "$scratch/overlap.json" >>"$scratch/overlap.jsonl"
expect invalid 1 '^INVALID .*overlap.json' -- python3 "$(dirname "$0")/validate_samples.py" "$scratch/overlap.jsonl"

finish
