#!/usr/bin/env python3
"""Embeddings throughput against a running server started with --embedding.

Sends --inputs distinct texts of about --words words (each opens with its
own number, so no two share a prefix the prefix cache could reuse) as
POST /v1/embeddings requests of --per-request inputs, --concurrency at a
time, and prints inputs and prompt tokens per second over the whole run.
Loopback use only.

  python3 scripts/embeddings_throughput.py --url http://127.0.0.1:8080 --inputs 1000 --words 150 --per-request 100
"""
import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

WORDS = ("the river keeper walked north along the stone road and counted every bridge "
         "while the morning light moved slowly across the quiet fields of barley").split()


def text(i, words):
    return f"{i} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))


def post(url, inputs):
    body = json.dumps({"input": inputs, "encoding_format": "base64"}).encode()
    req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        answer = json.load(r)
    assert len(answer["data"]) == len(inputs), answer
    return answer["usage"]["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--inputs", type=int, default=1000)
    ap.add_argument("--words", type=int, default=150)
    ap.add_argument("--per-request", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--first", type=int, default=int(time.time()) % 100000 * 10000,
                    help="number the first input opens with (a new one each run: nothing cached from before)")
    a = ap.parse_args()
    if not 1 <= a.inputs <= 1_000_000 or not 1 <= a.per_request <= 2048 or not 1 <= a.concurrency <= 64:
        ap.error("--inputs 1-1000000, --per-request 1-2048, --concurrency 1-64")
    post(a.url, [text(10**9, a.words)])  # warm up
    batches = [[text(a.first + i, a.words) for i in range(s, min(s + a.per_request, a.inputs))]
               for s in range(0, a.inputs, a.per_request)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.concurrency) as pool:
        tokens = sum(pool.map(lambda b: post(a.url, b), batches))
    dt = time.perf_counter() - t0
    print(json.dumps({"inputs": a.inputs, "per_request": a.per_request, "concurrency": a.concurrency,
                      "prompt_tokens": tokens, "tokens_per_input": round(tokens / a.inputs, 1),
                      "seconds": round(dt, 3), "inputs_per_s": round(a.inputs / dt, 1),
                      "tokens_per_s": round(tokens / dt, 1)}))


if __name__ == "__main__":
    main()
