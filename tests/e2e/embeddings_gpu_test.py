#!/usr/bin/env python3
"""/v1/embeddings and /v1/rerank through engine-host on llama-cuda (issue 49),
against the same server on the CPU reference (the numeric oracle), on a
forged tiny Qwen3 (the architecture of Qwen3-Embedding and Qwen3-Reranker):

  - llama-cuda starts with --embedding (it hands out hidden states, ABI 1.5
    seq_hidden) and every input's vector has cosine >= 0.9999 with the CPU
    reference's (issue 49's embedding target); text inputs and token-id
    inputs, short and long, many in one request;
  - with --rerank, every document's relevance_score is within 1e-3 of the
    CPU reference's (issue 49's reranker target) and the order agrees;
  - gpt-cuda, which keeps no hidden states, is refused at start (exit 4)
    naming itself and seq_hidden.

Usage: embeddings_gpu_test.py ENGINE_HOST PLUGIN_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_gpu_test import Server  # noqa: E402  (the bring-up test's server handle)

failures = []


def check(name, ok, detail=""):
    print(("PASS  " if ok else "FAIL  ") + name + ("" if ok else ": " + detail), flush=True)
    if not ok:
        failures.append(name)


def serve(eh, plugins, model, workdir, name, extra, wait=True):
    """engine-host on `model` with a 1,024-token context and a 256 MiB KV pool
    (a tiny model needs no more), through the bring-up test's server handle;
    `wait`: until /health says it is loaded."""
    s = Server(eh, plugins, model, 1024, workdir, ["--kv-cache-size-mb", "256"] + list(extra), log_name=name + ".log",
               wait_listening=wait)
    if wait:
        s.wait_ready()
    return s


def post(s, path, body):
    st, answer = s.json("POST", path, body)
    if st != 200:
        raise RuntimeError(f"{path} answered {st}: {json.dumps(answer)[:500]}")
    return answer


def log_of(s):
    with open(s.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def forge(eh, profile, workdir):
    out = os.path.join(workdir, profile + ".gguf")
    subprocess.run([eh, "forge", "--like", profile, "--out", out, "--seed", "3", "-q"], check=True)
    return out


def main():
    eh, plugins = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="eh-embeddings-gpu-")
    model = forge(eh, "tiny-qwen3-q4_k_m", work)
    words = "the river keeper walked north along the stone road and counted every bridge".split()
    texts = ["hello", "a short sentence about a river"] + [
        f"{i} " + " ".join(words[(i + k) % len(words)] for k in range(40 * i)) for i in range(1, 6)]
    ids = [[9707], list(range(1000, 1300, 3)), [(i * 7919 + 11) % 151000 for i in range(700)]]
    inputs = texts + ids

    # Embeddings: llama-cuda beside the CPU reference.
    vectors = {}
    for name, extra in (("llama-cuda", ["--device", "gpu"]), ("cpu-reference", ["--device", "cpu"])):
        s = None
        try:
            s = serve(eh, plugins, model, work, "embed-" + name, ["--embedding"] + extra)
            body = post(s, "/v1/embeddings", {"input": inputs, "encoding_format": "float"})
            vectors[name] = [d["embedding"] for d in body["data"]]
            check(f"{name}: one vector per input", len(vectors[name]) == len(inputs), json.dumps(body)[:300])
            if name == "llama-cuda":
                log = log_of(s)
                check("llama-cuda serves embeddings", '"plugin":"llama-cuda"' in log.replace(" ", ""), log[-2000:])
        except (Exception, SystemExit) as e:  # noqa: BLE001 - every failure is reported, then the next check runs
            check(f"{name}: embeddings served", False, str(e))
        finally:
            if s:
                s.stop()
    if len(vectors) == 2:
        worst = min(cosine(a, b) for a, b in zip(vectors["llama-cuda"], vectors["cpu-reference"]))
        print(f"[embeddings-gpu] {len(inputs)} inputs: worst cosine llama-cuda vs cpu-reference {worst:.7f}")
        check("embeddings: cosine >= 0.9999 with the CPU reference", worst >= 0.9999, f"worst {worst}")
        # The vectors are not all alike (a constant answer would pass the cosine).
        spread = min(cosine(vectors["cpu-reference"][0], v) for v in vectors["cpu-reference"][1:])
        check("embeddings: inputs give different vectors", spread < 0.99, f"closest {spread}")

    # Rerank: the relevance scores.
    query = "where does the river keeper walk"
    docs = [texts[1], texts[3], "bananas are yellow", texts[5], "north along the stone road"]
    scores = {}
    for name, extra in (("llama-cuda", ["--device", "gpu"]), ("cpu-reference", ["--device", "cpu"])):
        s = None
        try:
            s = serve(eh, plugins, model, work, "rerank-" + name, ["--rerank"] + extra)
            body = post(s, "/v1/rerank", {"query": query, "documents": docs})
            scores[name] = {r["index"]: r["relevance_score"] for r in body["results"]}
            check(f"{name}: a score per document", len(scores[name]) == len(docs), json.dumps(body)[:300])
        except (Exception, SystemExit) as e:  # noqa: BLE001
            check(f"{name}: rerank served", False, str(e))
        finally:
            if s:
                s.stop()
    if len(scores) == 2:
        worst = max(abs(scores["llama-cuda"][i] - scores["cpu-reference"][i]) for i in range(len(docs)))
        print(f"[embeddings-gpu] rerank {len(docs)} documents: worst |score difference| {worst:.2e}")
        check("rerank: scores within 1e-3 of the CPU reference", worst <= 1e-3, f"worst {worst}")

    # gpt-cuda keeps no hidden states: refused at start, by name.
    moe = forge(eh, "tiny-qwen3-moe-q4_k_m", work)
    s = serve(eh, plugins, moe, work, "gpt-cuda-refused", ["--embedding", "--device", "gpu"], wait=False)
    try:
        rc = s.proc.wait(600)
    except subprocess.TimeoutExpired:
        rc = None
    log = log_of(s)
    s.stop()
    want = "plugin gpt-cuda cannot serve embeddings (--embedding): it hands out no final hidden states (ABI 1.5 seq_hidden)"
    check("gpt-cuda refused with --embedding", rc == 4 and want in log, f"exit {rc}: {log[-2000:]}")

    print(f"[embeddings-gpu] {len(failures)} failed" + (": " + ", ".join(failures) if failures else ""))
    if not failures:
        shutil.rmtree(work, ignore_errors=True)  # the logs stay where something failed
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
