#!/usr/bin/env python3
"""Bring-up checks of a GPU engine through the real engine-host binary
(issues 7 and 8), on a forged real-shape model served over HTTP:

  --memory band20  /health: quant kind, residency, and device memory within
                   +-20 % of the expected envelope (tensor bytes of the file,
                   from `engine-host inspect --json`, + the KV cache of the
                   served context, from /health's kv_bytes_per_token)
  --memory cap10   device memory <= (weights + KV cache) * 1.10
  --utf8           Chinese, emoji (ZWJ sequences too) and mixed scripts
                   round-trip /tokenize -> /detokenize exactly (o200k has
                   no normalizer; Qwen's NFC would fold e+U+0301); a sampled
                   stream's pieces are each valid UTF-8 and join to
                   /detokenize of the streamed ids
  --oom            a job whose own n_ctx does not fit in free device memory
                   ends with VRAM_OOM, memory is given back, the next request
                   is served; with the memory back, the same n_ctx is served

Prints the load rate (file bytes / load_ms of the model_load_complete log
event) for the notes; that is a measurement, not an assertion.

The model comes from $EH_FORGED_DIR/<profile>.gguf when present, else it is
forged (seed 1) into $TMPDIR/eh-agreement-<profile>.gguf, the file the
agreement test uses, so the two share one forge.

Usage: serve_gpu_test.py ENGINE_HOST PLUGIN_DIR --profile P --plugin NAME
           [--ctx N] [--memory band20|cap10|none] [--utf8] [--oom]
           [--quant MXFP4] [--allow-cpu]
--allow-cpu lets a CPU plugin stand in (memory and OOM checks are then
skipped): a way to try the script without a GPU.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ZWJ_TEXT = ("中文：你好，世界！今天天气很好。 日本語のテキスト、カタカナ。 한국어 문장. "
            "Emoji: 👩\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 🧑\u200d💻 👍🏽 ❤️ 🇯🇵 "
            "Ελληνικά, русский, العربية, עברית, हिन्दी, ไทย — e\u0301 ﬁ ½ ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 "
            "mixed: abc中文😀def\tтаб\nnew line")


def log(*a):
    print("[serve_gpu]", *a, flush=True)


class Server:
    def __init__(self, eh, plugins, model, ctx, workdir, allow_cpu=False):
        self.log_path = os.path.join(workdir, "serve.log")
        self.logf = open(self.log_path, "w")
        args = [eh, "--plugins", plugins, "--model", model, "--port", "0", "--log-format", "json"]
        if ctx:
            args += ["--ctx-size", str(ctx)]
        if allow_cpu:  # the default refuses to let the CPU stand in for a rejected GPU plugin
            args += ["--device", "any"]
        self.proc = subprocess.Popen(args, stdout=self.logf, stderr=subprocess.STDOUT)
        self.port = None
        for _ in range(600):
            ev = self.event("listening")
            if ev:
                self.port = ev["port"]
                break
            self.check_alive()
            time.sleep(0.1)
        if not self.port:
            self.fail("the server did not start listening")
        self.base = f"http://127.0.0.1:{self.port}"

    def events(self):
        out = []
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if isinstance(j, dict):
                    out.append(j)
        return out

    def event(self, name):
        for j in self.events():
            if j.get("event") == name:
                return j
        return None

    def check_alive(self):
        if self.proc.poll() is not None:
            self.fail(f"engine-host exited with {self.proc.returncode}")

    def fail(self, msg):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-6000:]
        raise SystemExit(f"FAIL: {msg}\n--- engine-host log ---\n{tail}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()

    def request(self, method, path, body=None, timeout=600):
        data = json.dumps(body, ensure_ascii=False).encode("utf-8") if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, method, path, body=None):
        st, _, raw = self.request(method, path, body)
        return st, json.loads(raw.decode("utf-8"))

    def wait_ready(self):
        for _ in range(3000):
            self.check_alive()
            try:
                st, h = self.json("GET", "/health")
                if st == 200:
                    return h
                if h.get("status") not in ("loading",):
                    self.fail(f"/health: {h}")
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        self.fail("the model did not finish loading")

    def execute(self, body):
        """POST /execute; returns the list of (event, data) with data parsed,
        after checking the raw stream is strict UTF-8 and well-formed SSE."""
        st, headers, raw = self.request("POST", "/execute", body)
        if st != 200:
            self.fail(f"/execute answered {st}: {raw[:500]!r}")
        assert headers["Content-Type"].startswith("text/event-stream"), headers["Content-Type"]
        text = raw.decode("utf-8")  # strict: the stream itself must be valid UTF-8
        out = []
        for frame in text.split("\n\n"):
            if not frame.strip():
                continue
            name, data = "", []
            for line in frame.split("\n"):
                if line.startswith(":"):
                    continue
                if line.startswith("event: "):
                    name = line[len("event: "):]
                elif line.startswith("data: "):
                    data.append(line[len("data: "):])
                else:
                    raise AssertionError(f"not an SSE line: {line!r}")
            if data:
                out.append((name, json.loads("\n".join(data))))
        terminals = [e for e in out if e[0] in ("end", "error")]
        assert len(terminals) == 1 and out[-1] is terminals[0], f"not exactly one terminal event last: {out[-3:]}"
        assert out[0][0] == "started", out[0]
        return out


def forged(eh, profile):
    d = os.environ.get("EH_FORGED_DIR")
    if d and os.path.exists(os.path.join(d, profile + ".gguf")):
        return os.path.join(d, profile + ".gguf")
    p = os.path.join(tempfile.gettempdir(), f"eh-agreement-{profile}.gguf")
    if not os.path.exists(p):
        t0 = time.time()
        subprocess.run([eh, "forge", "--like", profile, "--out", p, "--seed", "1"], check=True,
                       stdout=subprocess.DEVNULL)
        log(f"forged {profile} in {time.time() - t0:.1f} s")
    return p


def check_memory(h, model_info, ctx, mode):
    weights = model_info["tensor_bytes"]
    used = h["vram_bytes_used"]
    kv = h["kv_cache_bytes"]
    assert h["kv_bytes_per_token"] > 0, f"the plugin states no KV cost per token: {h}"
    assert kv == ctx * h["kv_bytes_per_token"], (kv, ctx, h["kv_bytes_per_token"])
    expected = weights + kv
    ratio = used / expected
    log(f"device memory: used {used / 1e9:.3f} GB (model {h['vram_bytes_model'] / 1e9:.3f} GB), expected "
        f"{expected / 1e9:.3f} GB = tensors {weights / 1e9:.3f} GB + KV {kv / 1e9:.3f} GB "
        f"({ctx} x {h['kv_bytes_per_token']} B); used/expected = {ratio:.4f}")
    assert used >= 0.99 * weights, f"device memory {used} is below the tensor bytes {weights}: not all weights on the device?"
    if mode == "band20":
        assert 0.8 <= ratio <= 1.2, f"device memory {used} is not within 20 % of {expected}"
    elif mode == "cap10":
        assert ratio <= 1.10, f"device memory {used} exceeds weights + KV cache + 10 % ({expected * 1.1:.0f})"


def check_utf8(srv, vocab_size):
    st, tk = srv.json("POST", "/tokenize", {"text": ZWJ_TEXT, "add_special": False})
    assert st == 200, tk
    ids = tk["tokens"]
    st, dt = srv.json("POST", "/detokenize", {"tokens": ids})
    assert st == 200, dt
    assert dt["text"] == ZWJ_TEXT, f"round trip differs:\n{dt['text']!r}\n{ZWJ_TEXT!r}"
    # The text must really exercise split characters: some of its tokens are
    # not whole characters on their own.
    partial = 0
    for i in ids:
        st, one = srv.json("POST", "/detokenize", {"tokens": [i]})
        assert st == 200, one
        partial += "\ufffd" in one["text"]
    log(f"utf8: {len(ZWJ_TEXT)} chars -> {len(ids)} tokens, round trip exact; {partial} tokens are partial characters")
    assert partial > 0, "no token of the mixed text splits a character; the test would not cover partial sequences"

    # Random weights over a 201k vocabulary: sampled output is mostly
    # multi-byte pieces (CJK, Cyrillic, byte tokens), which is what we want.
    evs = srv.execute({"job_id": "utf8-stream", "prompt": ZWJ_TEXT, "max_tokens": 200, "temperature": 1.0,
                       "seed": 1234, "logprobs": 0})
    pieces, out_ids = [], []
    for name, d in evs:
        if name == "token":
            t = d["t"]
            t.encode("utf-8")  # raises on a lone surrogate: every piece must be valid UTF-8
            pieces.append(t)
            out_ids += [lp["id"] for lp in d.get("logprobs", [])]
    end = evs[-1]
    assert end[0] == "end", end
    assert len(out_ids) == end[1]["tokens_out"], (len(out_ids), end[1])
    assert all(0 <= i < vocab_size for i in out_ids)
    text = "".join(pieces)
    st, dt = srv.json("POST", "/detokenize", {"tokens": out_ids})
    assert st == 200, dt
    assert text == dt["text"], f"streamed text differs from /detokenize of the streamed ids:\n{text!r}\n{dt['text']!r}"
    non_ascii = sum(1 for c in text if ord(c) > 127)
    multi = sum(1 for p in pieces if any(ord(c) > 127 for c in p))
    log(f"utf8 stream: {len(out_ids)} tokens in {len(pieces)} pieces, {multi} pieces with non-ASCII text, "
        f"{non_ascii} non-ASCII chars, {text.count(chr(0xFFFD))} U+FFFD; sample {text[:60]!r}")
    assert non_ascii > 0, "the stream carried no multi-byte character"


CUDA_HOG = r"""
import ctypes, sys
leave = int(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0:
        print(f"{what} failed: {r}", flush=True); sys.exit(3)
ok(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int(); ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p(); ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
free, total = ctypes.c_size_t(), ctypes.c_size_t()
held = 0
chunk = 1 << 30
while True:
    ok(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    want = free.value - leave
    if want <= (64 << 20):
        break
    p = ctypes.c_uint64()
    if cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(min(chunk, want))) != 0:
        if chunk <= (64 << 20):
            break
        chunk //= 2
        continue
    held += min(chunk, want)
print(f"held {held} free {free.value}", flush=True)
sys.stdin.read()  # hold until the test closes our stdin
"""


def check_oom(srv, n_ctx_big, baseline_used):
    # Warm the server's session first (decode graph, first-use buffers), so
    # the request after the failure needs no memory the hog took.
    evs = srv.execute({"job_id": "warm", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert evs[-1][0] == "end", evs[-1]
    st, h = srv.json("GET", "/health")
    need = n_ctx_big * h["kv_bytes_per_token"]
    leave = need // 4
    hog = subprocess.Popen([sys.executable, "-c", CUDA_HOG, str(leave)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        line = hog.stdout.readline().strip()
        assert line.startswith("held "), f"could not occupy device memory: {line!r} (rc {hog.poll()})"
        log(f"oom: a second process holds device memory ({line}); asking for n_ctx {n_ctx_big} "
            f"({need / 1e9:.2f} GB of KV)")
        evs = srv.execute({"job_id": "oom-big", "prompt": "Hello", "max_tokens": 4, "n_ctx": n_ctx_big,
                           "temperature": 0})
        name, d = evs[-1]
        assert name == "error" and d["code"] == "VRAM_OOM", f"expected VRAM_OOM, got {name} {d}"
        assert f"n_ctx {n_ctx_big}" in d["message"], d["message"]
        assert d.get("retriable") is True, d
        log(f"oom: {d['code']}: {d['message']}")
        st, h = srv.json("GET", "/health")
        assert st == 200 and h["status"] == "healthy" and h["resident"] is True, h
        assert h["vram_bytes_used"] == baseline_used, \
            f"device memory not given back after VRAM_OOM: {h['vram_bytes_used']} vs {baseline_used}"
        evs = srv.execute({"job_id": "after-oom", "prompt": "Hello", "max_tokens": 16, "temperature": 0})
        assert evs[-1][0] == "end" and evs[-1][1]["tokens_out"] > 0, evs[-1]
        log("oom: the next request was served")
    finally:
        hog.stdin.close()
        hog.wait(60)
    evs = srv.execute({"job_id": "big-fits", "prompt": "Hello", "max_tokens": 8, "n_ctx": n_ctx_big, "temperature": 0})
    assert evs[-1][0] == "end", f"with the memory back, n_ctx {n_ctx_big} should be served: {evs[-1]}"
    st, h = srv.json("GET", "/health")
    assert h["vram_bytes_used"] == baseline_used, (h["vram_bytes_used"], baseline_used)
    log(f"oom: with the memory back, n_ctx {n_ctx_big} was served and freed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine_host")
    ap.add_argument("plugins")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--memory", choices=["band20", "cap10", "none"], default="none")
    ap.add_argument("--quant", default="")
    ap.add_argument("--utf8", action="store_true")
    ap.add_argument("--oom", action="store_true")
    ap.add_argument("--allow-cpu", action="store_true")
    a = ap.parse_args()

    model = forged(a.engine_host, a.profile)
    insp = json.loads(subprocess.run([a.engine_host, "inspect", "--json", "--model", model], check=True,
                                     capture_output=True).stdout)
    info = insp["model"]
    with tempfile.TemporaryDirectory() as work:
        srv = Server(a.engine_host, a.plugins, model, a.ctx, work, a.allow_cpu)
        try:
            h = srv.wait_ready()
            done = srv.event("model_load_complete")
            load_ms = done["load_ms"] if done else float("nan")
            size = insp["file_size"]
            log(f"{a.profile}: {size / 1e9:.2f} GB file, loaded by {h['plugin']['name']} on {h['device']} in "
                f"{load_ms:.0f} ms = {size / (load_ms / 1e3) / 1e9:.2f} GB/s (page cache unless first read)")
            on_cpu = h["plugin"]["name"] != a.plugin and a.allow_cpu
            if not on_cpu:
                assert h["plugin"]["name"] == a.plugin, f"expected {a.plugin}, got {h['plugin']} (no GPU?)"
            assert h["status"] == "healthy" and h["resident"] is True, h
            assert h["context_length"] == a.ctx, (h["context_length"], a.ctx)
            if a.quant:
                assert h["quant_kind"].upper().startswith(a.quant.upper()), f"quant_kind {h['quant_kind']}"
            log(f"/health: quant_kind {h['quant_kind']}, resident {h['resident']}, sm {h['sm']}")
            if a.memory != "none" and not on_cpu:
                check_memory(h, info, a.ctx, a.memory)
            if a.utf8:
                check_utf8(srv, h["vocab_size"])
            if a.oom and not on_cpu:
                check_oom(srv, info["context_length"], h["vram_bytes_used"])
            srv.check_alive()
        except AssertionError as e:
            srv.fail(f"{type(e).__name__}: {e}")
        finally:
            srv.stop()
    log("PASS")


if __name__ == "__main__":
    main()
