#!/usr/bin/env python3
"""Soak an engine-host on loopback: N requests from C kept-alive clients, then
report latency percentiles and the server's RSS per block of requests, so a
leak or a slowdown shows as a trend. Bounded in count and in time.

  scripts/soak.py --port 8080 --pid PID [--requests 10000] [--clients 4]
                  [--max-seconds 900] [--max-tokens 8]

Stdlib only. The mix: /execute (stream, max_tokens tokens), /v1/chat/completions
(non-stream), /tokenize and /health, in rotation.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--block", type=int, default=1000)
    ap.add_argument("--only", type=int, choices=range(4), help="send only one kind of the rotation (0-3)")
    a = ap.parse_args()

    lock = threading.Lock()
    issued = [0]
    results = []  # (index, seconds, ok)
    deadline = time.monotonic() + a.max_seconds

    def body(i):
        k = i % 4 if a.only is None else a.only
        if k == 0:
            return "POST", "/execute", {"job_id": f"soak-{i}", "prompt": "Once upon a time", "max_tokens": a.max_tokens,
                                        "temperature": 0}
        if k == 1:
            return "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": f"story {i}"}],
                                                    "max_tokens": a.max_tokens}
        if k == 2:
            return "POST", "/tokenize", {"text": f"Hello world {i}"}
        return "GET", "/health", None

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
        while True:
            with lock:
                if issued[0] >= a.requests or time.monotonic() > deadline:
                    return
                i = issued[0]
                issued[0] += 1
            method, path, payload = body(i)
            t0 = time.monotonic()
            ok = False
            try:
                data = json.dumps(payload) if payload is not None else None
                conn.request(method, path, body=data,
                             headers={"Content-Type": "application/json"} if data else {})
                r = conn.getresponse()
                text = r.read()
                ok = r.status == 200 and (path != "/execute" or b"event: end" in text)
            except Exception:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
            with lock:
                results.append((i, time.monotonic() - t0, ok))

    rss = [(0, rss_kib(a.pid))]
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    next_mark = a.block
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        with lock:
            n = len(results)
        while n >= next_mark:
            rss.append((next_mark, rss_kib(a.pid)))
            next_mark += a.block
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    results.sort()
    print(f"requests {len(results)} in {elapsed:.1f} s, failures {sum(1 for r in results if not r[2])}")
    print("block      p50 ms   p99 ms   max ms   RSS MiB at block end")
    rss_at = dict(rss)
    for b in range(0, len(results), a.block):
        lat = sorted(r[1] * 1000 for r in results[b:b + a.block])
        if not lat:
            continue
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        mark = b + a.block
        r = rss_at.get(mark, rss_kib(a.pid))
        print(f"{b:>5}-{mark - 1:<5} {p(0.5):7.2f} {p(0.99):8.2f} {lat[-1]:8.2f}   {r / 1024:8.1f}")
    print(f"RSS MiB start {rss[0][1] / 1024:.1f} end {rss_kib(a.pid) / 1024:.1f}")
    return 0 if all(r[2] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
