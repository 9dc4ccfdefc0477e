#!/usr/bin/env python3
"""A small streaming client for engine-host's native /execute SSE API.

Standard library only. Prints tokens as they arrive; Ctrl-C disconnects,
which cancels the job on the server.

    python3 examples/clients/stream_client.py "Once upon a time" --max-tokens 64
"""
import argparse
import json
import sys
import urllib.error
import urllib.request
import uuid


def events(response):
    """Yields (event, data) pairs from an SSE response."""
    name, data = "", []
    for raw in response:
        line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "", []
        elif line.startswith(":"):
            continue  # keep-alive comment
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prompt")
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stop", action="append", default=[])
    args = ap.parse_args()

    body = {"job_id": str(uuid.uuid4()), "prompt": args.prompt, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "stop": args.stop}
    if args.seed is not None:
        body["seed"] = args.seed
    req = urllib.request.Request(args.url + "/execute", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            for name, data in events(resp):
                if name == "started":
                    print(f"[job {data['job_id']} seed {data['seed']} prompt_tokens {data['prompt_tokens']}]",
                          file=sys.stderr)
                elif name == "token":
                    print(data["t"], end="", flush=True)
                elif name == "end":
                    print(f"\n[{data['tokens_out']} tokens, {data['stop_reason']}, {data['decode_time_ms']:.0f} ms]",
                          file=sys.stderr)
                    return 0
                elif name == "error":
                    print(f"\n[error {data['code']}: {data['message']}]", file=sys.stderr)
                    return 1
    except urllib.error.HTTPError as e:
        err = json.loads(e.read() or b"{}").get("error", {})
        print(f"HTTP {e.code} {err.get('code')}: {err.get('message')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
