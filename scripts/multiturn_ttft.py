#!/usr/bin/env python3
"""Time to first token over a multi-turn chat, against a running server.

Each turn appends a user message of about --words words and a short fixed
assistant reply to the history, and asks for one token, so the answer's
latency is the time to first token of that turn. With prefix reuse the
server computes only the new turn; without it, the whole history.
Loopback use only; bounded by --turns.

  python3 scripts/multiturn_ttft.py --url http://127.0.0.1:8080 --turns 10 --words 300
"""
import argparse
import json
import time
import urllib.request

WORDS = ("the river keeper walked north along the stone road and counted every bridge "
         "while the morning light moved slowly across the quiet fields of barley").split()


def ask(url, messages):
    body = json.dumps({"messages": messages, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    return time.perf_counter() - t0, answer["usage"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--words", type=int, default=300)
    a = ap.parse_args()
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    rows = []
    for turn in range(1, a.turns + 1):
        text = " ".join(WORDS[(turn * 7 + i) % len(WORDS)] for i in range(a.words))
        messages.append({"role": "user", "content": f"Turn {turn}: {text}"})
        secs, usage = ask(a.url, messages)
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        rows.append({"turn": turn, "ttft_s": secs, "prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached})
        print(f"turn {turn:2d}: {secs * 1000:8.1f} ms  prompt {usage['prompt_tokens']:6d}  cached {cached:6d}", flush=True)
        messages.append({"role": "assistant", "content": f"Noted, turn {turn}."})
    print(json.dumps({"turns": rows, "last_over_first": rows[-1]["ttft_s"] / rows[0]["ttft_s"]}))


if __name__ == "__main__":
    main()
