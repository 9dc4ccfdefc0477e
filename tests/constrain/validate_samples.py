#!/usr/bin/env python3
"""Validates the values eh-schema-coverage --samples wrote (JSON lines of
{"schema": path, "instance": text}) against their schemas with the
jsonschema package (Debian's python3-jsonschema): every value the grammar
lets a sampler finish must parse and be valid. A value whose only fault is
matching two or more `oneOf` branches is counted apart: oneOf exclusivity is
on docs/http-api.md's not-enforced list (beyond the shared `{}`, which is
left out). Prints the failures and the counts; exits 1 if any value is
invalid otherwise.
  python3 tests/constrain/validate_samples.py /tmp/samples.jsonl
"""
import json
import sys

import jsonschema


def one_of_overlap(error):
    """Whether the error is a oneOf that two or more branches match (no
    branch's own error beneath it)."""
    return error.validator == "oneOf" and not error.context


def main(path):
    schemas, bad, n, unchecked, overlaps = {}, 0, 0, 0, 0
    for line in open(path, encoding="utf-8"):
        rec = json.loads(line)
        n += 1
        if rec["schema"] not in schemas:
            with open(rec["schema"], encoding="utf-8") as f:
                schema = json.load(f)
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
            schemas[rec["schema"]] = cls(schema, format_checker=cls.FORMAT_CHECKER)
        try:
            value = json.loads(rec["instance"])
        except ValueError as e:
            bad += 1
            print(f"NOT JSON {rec['schema']}: {e}: {rec['instance'][:200]}")
            continue
        try:
            errors = list(schemas[rec["schema"]].iter_errors(value))
        except Exception as e:  # a pattern Python's re cannot read (\p{...}), a broken schema
            unchecked += 1
            if unchecked <= 5:
                print(f"UNCHECKED {rec['schema']}: {type(e).__name__}: {str(e)[:120]}")
            continue
        if errors and all(one_of_overlap(e) for e in errors):
            overlaps += 1
            if overlaps <= 5:
                print(f"ONEOF-OVERLAP {rec['schema']}: at {list(errors[0].absolute_path)}: {str(value)[:120]}")
        elif errors:
            errors = [e for e in errors if not one_of_overlap(e)]
            bad += 1
            e = errors[0]
            while e.context:  # anyOf/oneOf: the deepest reason
                e = sorted(e.context, key=lambda c: len(list(c.absolute_path)))[-1]
            print(f"INVALID {rec['schema']}: {e.validator} {str(e.validator_value)[:80]} at {list(e.absolute_path)}: "
                  f"{str(e.instance)[:120]}")
    print(f"{n - bad - unchecked - overlaps} valid, {bad} invalid, {overlaps} valid but for matching two oneOf "
          f"branches (not enforced), {unchecked} not checkable by the validator, of {n} values from {len(schemas)} schemas")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
