#!/usr/bin/env python3
"""Bring-up checks of a GPU engine through the real engine-host binary
(issues 7 and 8), on a forged real-shape model served over HTTP:

  --memory band20  /health: quant kind, residency, and device memory within
                   +-20 % of the expected envelope (tensor bytes of the file,
                   from `engine-host inspect --json`, + the KV cache of the
                   served context, from /health's kv_bytes_per_token)
  --memory cap10   device memory <= (model + KV cache) * 1.10, the model
                   being its tensors plus the FP16 weight mirror the plugin
                   may keep (checked: at most two bytes per parameter)
                   (the KV cache is the block pool the server allocates at
                   start: kv_blocks_total x kv_block_tokens x bytes per token)
  --oom            a KV pool that holds two full contexts
                   (--kv-cache-size-mb) under six concurrent requests of
                   nearly a context each: requests wait or are preempted,
                   every one ends with `end` and the same greedy text as
                   alone, device memory is unchanged afterwards; and with
                   another process holding all but half the weights' bytes
                   of device memory, serve exits non-zero with a message
                   naming the memory, instead of hanging or crashing

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
    def __init__(self, eh, plugins, model, ctx, workdir, extra=(), log_name="serve.log", wait_listening=True,
                 allow_cpu=False):
        self.log_path = os.path.join(workdir, log_name)
        self.logf = open(self.log_path, "w")
        args = [eh, "--plugins", plugins, "--model", model, "--port", "0", "--log-format", "json"]
        if ctx:
            args += ["--ctx-size", str(ctx)]
        if allow_cpu:  # the default refuses to let the CPU stand in for a rejected GPU plugin
            args += ["--device", "any"]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=self.logf, stderr=subprocess.STDOUT)
        self.port = None
        if not wait_listening:
            return
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
    per = h["kv_bytes_per_token"]
    sch = h["scheduler"]
    assert per > 0, f"the plugin states no KV cost per token: {h}"
    if sch["batched"]:
        pool = sch["kv_blocks_total"] * sch["kv_block_tokens"]
        assert kv == pool * per, (kv, sch, per)
        assert pool >= ctx, f"the KV pool holds {pool} tokens, less than one context of {ctx}"
        what = f"pool of {sch['kv_blocks_total']} blocks x {sch['kv_block_tokens']} tokens x {per} B"
    else:
        assert kv == ctx * per, (kv, ctx, per)
        what = f"{ctx} x {per} B"
    # The model's part: its tensors, plus the FP16 weight mirror when the
    # plugin keeps one (at most two bytes per parameter).
    model = h["vram_bytes_model"]
    params = model_info["parameter_count"]
    mirror = max(0, model - weights)
    assert model <= weights + 2 * params + (64 << 20), \
        f"the model holds {model} bytes: more than its tensors {weights} and an FP16 copy of its {params} parameters"
    expected = model + kv
    ratio = used / expected
    log(f"device memory: used {used / 1e9:.3f} GB, expected {expected / 1e9:.3f} GB = tensors {weights / 1e9:.3f} GB "
        f"+ FP16 mirror {mirror / 1e9:.3f} GB + KV {kv / 1e9:.3f} GB ({what}); used/expected = {ratio:.4f}")
    assert used >= 0.99 * weights, f"device memory {used} is below the tensor bytes {weights}: not all weights on the device?"
    if mode == "band20":
        assert 0.8 <= ratio <= 1.2, f"device memory {used} is not within 20 % of {expected}"
    elif mode == "cap10":
        assert ratio <= 1.10, f"device memory {used} exceeds model + KV cache + 10 % ({expected * 1.1:.0f})"


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


def hold_device_memory(leave):
    """Starts a process that takes all free device memory but `leave` bytes;
    returns it once it holds the memory (close its stdin to end it)."""
    hog = subprocess.Popen([sys.executable, "-c", CUDA_HOG, str(leave)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    line = hog.stdout.readline().strip()
    assert line.startswith("held "), f"could not occupy device memory: {line!r} (rc {hog.poll()})"
    log(f"a second process holds device memory ({line})")
    return hog


def check_pool_pressure(a, model, ctx, per_token, work):
    """Six requests of nearly a context each through a pool of two contexts:
    the scheduler makes them wait (or preempts them); all complete."""
    mb = (2 * ctx * per_token + (1 << 20) - 1) >> 20
    srv = Server(a.engine_host, a.plugins, model, ctx, work, ["--kv-cache-size-mb", str(mb)], "pool.log")
    try:
        h = srv.wait_ready()
        base = h["vram_bytes_used"]
        pool = h["scheduler"]["kv_blocks_total"] * h["scheduler"]["kv_block_tokens"]
        assert pool < 3 * ctx, f"--kv-cache-size-mb {mb} gave a pool of {pool} tokens (context {ctx})"
        n_prompt = ctx - 96  # room for 16 new tokens and a re-tokenization that differs slightly
        # Different texts, so prefix reuse cannot make them share blocks.
        bodies = [{"job_id": f"pool-{i}", "prompt": f"{i} " + "word " * n_prompt, "max_tokens": 16,
                   "temperature": 0, "add_special": False} for i in range(6)]
        for b in bodies:  # the prompt is cut to n_prompt tokens by /tokenize + /detokenize
            st, tk = srv.json("POST", "/tokenize", {"text": b["prompt"], "add_special": False})
            assert st == 200, tk
            st, dt = srv.json("POST", "/detokenize", {"tokens": tk["tokens"][:n_prompt]})
            assert st == 200, dt
            b["prompt"] = dt["text"]
        alone = srv.execute(dict(bodies[0], job_id="pool-alone"))
        assert alone[-1][0] == "end", alone[-1]
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as ex:
            outs = list(ex.map(srv.execute, bodies))
        for b, evs in zip(bodies, outs):
            assert evs[-1][0] == "end", f"{b['job_id']}: {evs[-1]}"
        text = lambda evs: "".join(d["t"] for n, d in evs if n == "token")
        assert text(outs[0]) == text(alone), "the same greedy request under pool pressure gave other text"
        st, h = srv.json("GET", "/health")
        assert h["vram_bytes_used"] == base, (h["vram_bytes_used"], base)
        log(f"pool: {len(bodies)} requests of {n_prompt} prompt tokens through a pool of {pool} tokens: all ended; "
            f"preemptions {h['scheduler']['preemptions']}")
        srv.check_alive()
    except AssertionError as e:
        srv.fail(f"{type(e).__name__}: {e}")
    finally:
        srv.stop()


def check_start_without_memory(a, model, weights, work):
    """With less device memory free than the weights need, serve must exit
    with an error that names the memory, not hang or crash."""
    hog = hold_device_memory(weights // 2)
    try:
        srv = Server(a.engine_host, a.plugins, model, a.ctx, work, [], "nomem.log", wait_listening=False)
        rc = None
        for _ in range(3000):
            rc = srv.proc.poll()
            if rc is not None:
                break
            ready = srv.event("ready")
            if ready:  # the VRAM-only rule: never a silent fallback to the CPU
                srv.stop()
                srv.fail(f"serve started with {ready.get('plugin')} instead of refusing without device memory")
            time.sleep(0.1)
        if rc is None:
            srv.stop()
            srv.fail("serve neither failed nor finished starting within 300 s with the device memory taken")
        with open(srv.log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        srv.stop()
        assert rc not in (0, -11, -6, 139, 134), f"serve exited with {rc}:\n{text[-3000:]}"
        low = text.lower()
        assert "memory" in low or "vram" in low, f"the exit does not name the memory:\n{text[-3000:]}"
        said = [l for l in text.splitlines() if "memory" in l.lower() or "vram" in l.lower()]
        log(f"no memory: serve exited with {rc}: {said[-1][:300]}")
    finally:
        hog.stdin.close()
        hog.wait(60)


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
        srv = Server(a.engine_host, a.plugins, model, a.ctx, work, allow_cpu=a.allow_cpu)
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
            per_token = h["kv_bytes_per_token"]
            srv.check_alive()
        except AssertionError as e:
            srv.fail(f"{type(e).__name__}: {e}")
        finally:
            srv.stop()
        if a.oom and not on_cpu:
            check_pool_pressure(a, model, a.ctx, per_token, work)
            check_start_without_memory(a, model, info["tensor_bytes"], work)
    log("PASS")


if __name__ == "__main__":
    main()
