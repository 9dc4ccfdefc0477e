#!/usr/bin/env python3
"""Conformance with the files people download: llama.cpp's own converter and
quantizer against transformers, read by engine-host's plugins.

Run on the GPU machine (torch + transformers there; nothing is downloaded):

    python3 tests/reference/conformance.py --llama-cpp SRC --quantize BIN \\
        --dump build/bin/eh_logits_dump --tokenizer DIR \\
        --plugin cpu-reference=build/plugins/libeh-cpu-reference.so \\
        --plugin llama-cuda=build/plugins/libeh-llama-cuda.so --out OUT

For each family (qwen3, llama3, mistral, qwen3moe, gemma3; llama as a control) it
builds a random-weight transformers model with the family's real structure
at small dims (hidden 256 so that K-quant rows are whole 256-value blocks),
saves it with a real tokenizer (the converter refuses a model without one),
converts it with SRC/convert_hf_to_gguf.py to F32 and quantizes that with
llama-quantize to Q8_0, Q4_K_M and, for the first family, the low-bit types
of popular uploads (Q2_K, Q3_K_M, IQ4_XS, IQ4_NL). Each quantized file is also turned back into F32 by
llama-quantize itself (--allow-requantize ... F32: ggml's own
dequantization). Then every plugin gives the logits of a fixed 32-token
sequence (eh_logits_dump: decode path per position, plus the batched prefill
of the whole sequence) and, as log-probabilities, they are compared:

  F32 GGUF and the HF directory  vs transformers (float32, CPU)
  quantized GGUF                 vs the same plugin on its dequantized F32 file

Reported per family, file and plugin: max |delta logprob| of the
teacher-forced tokens (the logprob of token i+1 at position i) and over the
whole vocabulary, and top-1 agreement (positions where the reference's top
two are further apart than the tolerance must agree). Tolerances (max
teacher-forced |delta logprob|; the whole-vocabulary figure is reported, not
checked): TOL below. A plugin that refuses a file is reported with its
message; refusing any of them (but the refusals by design below) is a failure.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as mr  # noqa: E402  (randomize, instantiate, all_logits)

VOCAB = 50304  # >= the GPT-2 tokenizer's 50257 ids, as the converter requires
HIDDEN, FF, LAYERS, HEADS, KV_HEADS, CTX = 256, 512, 2, 4, 2, 256
TOKENS = [int(x) for x in np.random.default_rng(7).integers(0, 50257, size=32)]
REQUIRED = ["F32", "Q8_0", "Q4_K_M"]
NEW_TYPES = ["Q2_K", "Q3_K_M", "IQ4_XS", "IQ4_NL"]  # quantized for the first family only
# Max teacher-forced |delta logprob|, by (plugin kind, comparison). The CUDA
# plugin keeps an FP16 KV cache and reorders sums; quantized decode GEMVs
# take int16-coded inputs.
TOL = {("cpu", "hf"): 2e-3, ("cpu", "deq"): 2e-3, ("cuda", "hf"): 3e-2, ("cuda", "deq"): 3e-2}


def families():
    def llama3():
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(
            rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            **common())

    def mistral():
        return transformers.MistralForCausalLM, transformers.MistralConfig(
            head_dim=128, rope_theta=1000000.0, sliding_window=None, **common())

    def qwen3():
        return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
            head_dim=128, rope_theta=1000000.0, use_sliding_window=False, attention_bias=False, **common())

    def qwen3moe():  # Qwen3-30B-A3B's structure: every layer MoE, top-k renormalised
        return transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
            head_dim=128, rope_theta=1000000.0, use_sliding_window=False, attention_bias=False,
            moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], **common())

    def llama():
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(rope_theta=10000.0, **common())

    def qwen2():
        return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
            rope_theta=1000000.0, use_sliding_window=False, **common())

    def gemma3():
        # Gemma 3's structure at small dims: six layers, the sixth global (the
        # period llama.cpp assumes: its converter writes no pattern), window 8
        # of the 32 tokens, head size 128 at hidden 256, tied head, and the
        # vocabulary exactly the GPT-2 tokenizer's (the converter cuts the
        # embedding to the tokenizer's size).
        cfg = mr.gemma3_config(50257, HIDDEN, FF, 6, HEADS, KV_HEADS, 128, 8, 6, CTX, None,
                               bos=50256, eos=50256, pad=50256)
        return transformers.Gemma3ForCausalLM, cfg

    # qwen2 is not in the default run: with the GPT-2 tokenizer saved beside a
    # qwen2 config, transformers builds a Qwen2 tokenizer whose pre-tokenizer
    # hash the converter does not know, and it refuses (--only qwen2 shows it).
    return {"qwen3": qwen3, "llama3": llama3, "mistral": mistral, "llama": llama, "qwen2": qwen2,
            "qwen3moe": qwen3moe, "gemma3": gemma3}


# (family, plugin or "HF dir") pairs refused by design: llama-cuda has no MoE
# (gpt-cuda serves qwen3moe and none of the dense families), and no plugin
# reads an HF Qwen3-MoE directory. Recorded, not failures.
EXPECTED_REFUSALS = {("qwen3moe", "llama-cuda"), ("qwen3moe", "HF dir")} | {
    (f, "gpt-cuda") for f in ("qwen3", "llama3", "mistral", "llama", "qwen2", "gemma3")}


DEFAULT_FAMILIES = ["qwen3", "llama3", "mistral", "llama", "qwen3moe", "gemma3"]


def common():
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CTX,
                rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def read_dump(path):
    with open(path, "rb") as f:
        rows, vocab = struct.unpack("<II", f.read(8))
        return np.frombuffer(f.read(), dtype=np.float32).reshape(rows, vocab)


def dump(exe, plugin, model, out):
    r = subprocess.run([exe, plugin, model, ",".join(map(str, TOKENS)), out], capture_output=True, text=True)
    if r.returncode == 0:
        return read_dump(out), None
    msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
    return None, (msg[-1] if msg else f"exit {r.returncode}")


def compare(got, want, tol):
    """got: dump rows (n positions + the batched-prefill row); want: [n, vocab]
    reference logits. Returns the figures of both paths."""
    n = len(TOKENS)
    lg, lw = log_softmax(got[:n]), log_softmax(want[:n])
    tf = np.abs(lg[np.arange(n - 1), TOKENS[1:]] - lw[np.arange(n - 1), TOKENS[1:]])
    top_w = np.sort(lw, axis=1)[:, -2:]
    decisive = (top_w[:, 1] - top_w[:, 0]) > tol
    agree = lg.argmax(axis=1) == lw.argmax(axis=1)
    prefill = np.abs(log_softmax(got[n:n + 1]) - lw[n - 1:n]).max()
    return {"max_tf": float(tf.max()), "max_vocab": float(np.abs(lg - lw).max()),
            "top1": f"{int(agree.sum())}/{n}", "top1_ok": bool(agree[decisive].all()),
            "prefill_row_max_vocab": float(prefill)}


HEADER = (f"{'family':8} {'file':7} {'plugin':13} {'against':16} {'max|dlp| tf':>11} {'max|dlp| V':>10} "
          f"{'top1':>6} {'prefill':>8} {'tol':>6}  ok")


def print_row(r):
    if "refused" in r:
        print(f"{r['family']:8} {r['file']:7} {r['plugin']:13} refused: {r['refused']}", flush=True)
        return
    print(f"{r['family']:8} {r['file']:7} {r['plugin']:13} {r['against']:16} {r['max_tf']:11.2e} "
          f"{r['max_vocab']:10.2e} {r['top1']:>6} {r['prefill_row_max_vocab']:8.1e} {r['tol']:6.0e}  "
          f"{'yes' if r['ok'] else 'NO'}", flush=True)


def run(cmd, log):
    r = subprocess.run(cmd, capture_output=True, text=True)
    log.write(f"$ {' '.join(cmd)}\n{r.stdout[-4000:]}{r.stderr[-4000:]}\n")
    return r.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--quantize", required=True, help="llama-quantize")
    ap.add_argument("--dump", required=True, help="eh_logits_dump")
    ap.add_argument("--tokenizer", required=True, help="a GPT-2 tokenizer directory (tokenizer.json, ...)")
    ap.add_argument("--plugin", action="append", required=True, help="NAME=path/to/lib.so")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "conformance.log"), "w")
    plugins = dict(p.split("=", 1) for p in args.plugin)
    env = dict(os.environ, PYTHONPATH=os.path.join(args.llama_cpp, "gguf-py") + ":" + os.environ.get("PYTHONPATH", ""))
    results, failures = [], []
    fams = families()
    print(HEADER, flush=True)
    for seed, name in enumerate(args.only or DEFAULT_FAMILIES):
        cls, cfg = fams[name]()
        model = mr.instantiate(cls, cfg)
        mr.randomize(model, 2000 + seed)
        model = model.to(torch.float32).eval()
        d = os.path.join(args.out, name)
        hf = os.path.join(d, "hf")
        model.save_pretrained(hf, safe_serialization=True)
        for f in os.listdir(args.tokenizer):
            shutil.copy(os.path.join(args.tokenizer, f), hf)
        want = mr.all_logits(model, TOKENS, "cpu").numpy()
        files = {}
        f32 = os.path.join(d, "F32.gguf")
        r = subprocess.run([sys.executable, os.path.join(args.llama_cpp, "convert_hf_to_gguf.py"), hf,
                            "--outtype", "f32", "--outfile", f32], capture_output=True, text=True, env=env)
        log.write(f"convert {name}: exit {r.returncode}\n{r.stderr[-6000:]}\n")
        if r.returncode != 0:
            failures.append(f"{name}: convert_hf_to_gguf failed (see conformance.log)")
            continue
        files["F32"] = f32
        # The low-bit types (every plugin here serves them): quantized for
        # the first family only, to keep the run short.
        for q in REQUIRED[1:] + (NEW_TYPES if seed == 0 else []):
            qf, deq = os.path.join(d, f"{q}.gguf"), os.path.join(d, f"{q}-deq.gguf")
            if run([args.quantize, f32, qf, q], log) and run([args.quantize, "--allow-requantize", qf, deq, "F32"], log):
                files[q] = qf
            elif q in REQUIRED:
                failures.append(f"{name}: llama-quantize {q} failed (see conformance.log)")
        for pname, lib in plugins.items():
            kind = "cuda" if "cuda" in pname else "cpu"
            for q, path in [("HF dir", hf)] + list(files.items()):
                got, err = dump(args.dump, lib, path, os.path.join(d, "dump.bin"))
                row = {"family": name, "file": q, "plugin": pname}
                if err is not None:
                    row["refused"] = err
                    results.append(row)
                    print_row(row)
                    expected = (name, pname) in EXPECTED_REFUSALS or (name, q) in EXPECTED_REFUSALS
                    if (q in REQUIRED or q in NEW_TYPES or q == "HF dir") and not expected:
                        failures.append(f"{name} {q} {pname}: {err}")
                    continue
                if q in ("F32", "HF dir"):
                    ref, tol, against = want, TOL[(kind, "hf")], "transformers"
                else:
                    ref, err = dump(args.dump, lib, os.path.join(d, f"{q}-deq.gguf"), os.path.join(d, "dump.bin"))
                    if err is not None:
                        failures.append(f"{name} {q}-deq {pname}: {err}")
                        continue
                    ref, tol, against = ref[:len(TOKENS)], TOL[(kind, "deq")], "dequantized F32"
                row.update(compare(got, ref, tol), against=against, tol=tol)
                ok = row["max_tf"] <= tol and row["top1_ok"] and row["prefill_row_max_vocab"] <= max(tol, 5e-2)
                row["ok"] = ok
                if not ok:
                    failures.append(f"{name} {q} {pname}: {row}")
                results.append(row)
                print_row(row)
        for f in os.listdir(d):  # keep the out folder small
            if f.endswith(".gguf") or f == "dump.bin":
                os.remove(os.path.join(d, f))
        shutil.rmtree(hf, ignore_errors=True)

    with open(os.path.join(args.out, "conformance.json"), "w") as f:
        json.dump({"tokens": TOKENS, "tolerances": {f"{k[0]}/{k[1]}": v for k, v in TOL.items()},
                   "results": results, "failures": failures,
                   "versions": mr.versions()}, f, indent=1)
    for x in failures:
        print("FAIL", x)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
