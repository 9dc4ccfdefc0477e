#!/usr/bin/env python3
"""ncu CSV (--metrics gpu__time_duration.sum --csv --print-units base) on
stdin -> one line per kernel: total microseconds, launches, name; sorted by
time, then the total."""
import collections
import csv
import sys

rows = list(csv.reader(l for l in sys.stdin if l.startswith('"')))
if not rows:
    sys.exit("ncu-summary: no CSV rows on stdin")
h = rows[0]
k, v = h.index("Kernel Name"), h.index("Metric Value")
tot, cnt = collections.defaultdict(float), collections.Counter()
for r in rows[1:]:
    name = r[k].split("(")[0][:70]
    tot[name] += float(r[v].replace(",", "")) / 1e3
    cnt[name] += 1
for n, t in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"  {t:9.1f} us {cnt[n]:4d}x  {n}")
print(f"  {sum(tot.values()):9.1f} us total, {sum(cnt.values())} kernels")
