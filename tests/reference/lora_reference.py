#!/usr/bin/env python3
"""LoRA adapters against transformers (+ peft when installed), on the GPU machine.

    python3 tests/reference/lora_reference.py --dump build-cuda/bin/eh_lora_dump \
        --plugin build-cuda/plugins/libeh-cpu-reference.so [--llama-cpp SRC] [--out /tmp/lora_ref]

Takes the tiny seeded llama of tests/reference/data/llama (hf/ and model.gguf,
made by make_reference.py), gives it a random LoRA adapter (rank 8, alpha 16,
on q/k/v/o/gate/up/down of every layer, lora_B not zero) and compares, at every
position of make_reference.py's token sequence, the plugin's logits with the
adapter (eh_lora_dump, built from lora_dump.cpp: the adapter and the base
model side by side in one batched step) with transformers':

  reference   with peft installed: transformers + peft (get_peft_model with the
              adapter's weights), else the merged model in torch
              (W' = W + alpha / r * B A), which is what peft computes; the
              JSON says which ("reference").
  adapters    "script": the GGUF written here with gguf_io.py as the format is
              documented (lora_b of q/k permuted as llama.cpp's converter
              permutes those rows); "converter": with --llama-cpp, the PEFT
              directory converted by llama.cpp's own convert_lora_to_gguf.py
              (needs safetensors, which transformers brings).

It prints one JSON object and exits 0 when every adapter's max |logit - ref|
is <= --tol (0.02, the issue's bound) and the base rows match the base model
to 1e-3, else 1. Nothing is written into the repository.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_io  # noqa: E402

RANK, ALPHA, SCALE = 8, 16.0, 1.0
TOKENS = [1, 17, 93, 4, 250, 31, 31, 7, 128, 64, 200, 9]  # make_reference.py's
TARGETS = {  # HF module -> GGUF tensor (of blk.N)
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def permute_qk(w, n_head):
    """llama.cpp's converter order of a q/k row block: within each head, pair (2i, 2i+1) = HF rows (i, i + d/2)."""
    out_dim, in_dim = w.shape
    hd = out_dim // n_head
    return w.reshape(n_head, 2, hd // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def load(hf_dir):
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    except TypeError:  # transformers 4 names it torch_dtype
        return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)


def flat(t):
    return t.detach().to(torch.float32).contiguous().reshape(-1).tolist()


def random_adapter(model, seed):
    """{(layer, module): (A [r, in], B [out, r])}, B large enough that the adapter matters."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, layer in enumerate(model.model.layers):
        for mod in TARGETS:
            lin = layer.get_submodule(mod)
            a = torch.randn(RANK, lin.in_features, generator=g) / math.sqrt(lin.in_features)
            b = torch.randn(lin.out_features, RANK, generator=g) * 0.2
            out[(i, mod)] = (a, b)
    return out


@torch.no_grad()
def logits_of(model, device):
    ids = torch.tensor([TOKENS], device=device)
    return model(input_ids=ids, use_cache=False).logits[0].float().cpu()


def peft_logits(hf_dir, adapter, device, adapter_dir):
    """transformers + peft; also saves the PEFT directory (for the converter). None without peft."""
    try:
        import peft
    except ImportError:
        return None, None
    model = load(hf_dir).to(device).eval()
    cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=[m.split(".")[-1] for m in TARGETS])
    pm = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for (i, mod), (a, b) in adapter.items():
            lin = pm.base_model.model.model.layers[i].get_submodule(mod)
            lin.lora_A["default"].weight.copy_(a)
            lin.lora_B["default"].weight.copy_(b)
    pm.eval()
    pm.save_pretrained(adapter_dir)
    return logits_of(pm, device), peft.__version__


def merged_logits(hf_dir, adapter, device):
    model = load(hf_dir)
    with torch.no_grad():
        for (i, mod), (a, b) in adapter.items():
            model.model.layers[i].get_submodule(mod).weight += (ALPHA / RANK) * (b @ a)
    return logits_of(model.to(device).eval(), device)


def write_peft_dir(adapter, adapter_dir, hf_dir):
    """A PEFT directory by hand (what save_pretrained writes), for the converter without peft."""
    os.makedirs(adapter_dir, exist_ok=True)
    tensors = []
    for (i, mod), (a, b) in adapter.items():
        p = f"base_model.model.model.layers.{i}.{mod}"
        for suffix, t in (("lora_A.weight", a), ("lora_B.weight", b)):
            v = flat(t)
            tensors.append((f"{p}.{suffix}", "F32", list(t.shape), struct.pack(f"<{len(v)}f", *v)))
    header, blobs, off = {}, [], 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(os.path.join(adapter_dir, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for blob in blobs:
            f.write(blob)
    with open(os.path.join(adapter_dir, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0, "bias": "none",
                   "target_modules": [m.split(".")[-1] for m in TARGETS], "task_type": "CAUSAL_LM",
                   "base_model_name_or_path": hf_dir}, f)


def write_script_gguf(adapter, config, path):
    w = gguf_io.Writer("llama")
    w.str("general.type", "adapter")
    w.str("adapter.type", "lora")
    w.f32("adapter.lora.alpha", ALPHA)
    for (i, mod), (a, b) in sorted(adapter.items()):
        name = f"blk.{i}.{TARGETS[mod]}.weight"
        if mod == "self_attn.q_proj":
            b = permute_qk(b, config.num_attention_heads)
        elif mod == "self_attn.k_proj":
            b = permute_qk(b, config.num_key_value_heads)
        w.tensor_f32(name + ".lora_a", [a.shape[1], a.shape[0]], flat(a))
        w.tensor_f32(name + ".lora_b", [b.shape[1], b.shape[0]], flat(b))
    w.write(path)


def run_dump(args, model_gguf, adapter_gguf, out_bin):
    r = subprocess.run([args.dump, args.plugin, model_gguf, adapter_gguf, str(SCALE), ",".join(map(str, TOKENS)),
                        out_bin], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, (r.stderr or r.stdout)[-2000:]
    with open(out_bin, "rb") as f:
        rows, vocab = struct.unpack("<II", f.read(8))
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    data = data.reshape(2, rows, vocab)
    return data[0], data[1], None


def compare(got, want):
    d = (got - want).abs().max().item()
    lp = (torch.log_softmax(got.double(), -1) - torch.log_softmax(want.double(), -1)).abs().max().item()
    top = bool((got.argmax(-1) == want.argmax(-1)).all())
    return {"max_abs_logit": d, "max_abs_logprob": lp, "max_abs_ref_logit": want.abs().max().item(),
            "same_top1": top}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="eh_lora_dump")
    ap.add_argument("--plugin", required=True, help="the plugin .so (cpu-reference)")
    ap.add_argument("--data", default=os.path.join(HERE, "data", "llama"), help="make_reference.py's llama directory")
    ap.add_argument("--llama-cpp", help="llama.cpp source tree (convert_lora_to_gguf.py, gguf-py, conversion/)")
    ap.add_argument("--out", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--base-tol", type=float, default=1e-3,
                    help="bound on the base rows against the base model (a GPU plugin's FP16 KV cache needs more)")
    ap.add_argument("--hf-model", action="store_true",
                    help="also serve the model from its HF directory (hf/), where q/k rows keep HF order")
    ap.add_argument("--seed", type=int, default=50)
    args = ap.parse_args()

    out = args.out or tempfile.mkdtemp(prefix="eh-lora-ref-")
    os.makedirs(out, exist_ok=True)
    hf_dir, model_gguf = os.path.join(args.data, "hf"), os.path.join(args.data, "model.gguf")
    base = load(hf_dir).eval()
    adapter = random_adapter(base, args.seed)
    base_ref = logits_of(base.to(args.device), args.device)

    adapter_dir = os.path.join(out, "peft")
    ref, peft_version = peft_logits(hf_dir, adapter, args.device, adapter_dir)
    merged = merged_logits(hf_dir, adapter, args.device)
    result = {"reference": "transformers+peft" if ref is not None else "merged weights in torch (peft not installed)",
              "peft": peft_version, "torch": torch.__version__, "transformers": transformers.__version__,
              "rank": RANK, "alpha": ALPHA, "scale": SCALE, "tokens": len(TOKENS), "tol": args.tol,
              "adapter_vs_base_max_abs_logit": (merged - base_ref).abs().max().item()}
    if ref is None:
        ref = merged
        write_peft_dir(adapter, adapter_dir, hf_dir)
    else:
        result["peft_vs_merged_max_abs_logit"] = (ref - merged).abs().max().item()

    ggufs = {"script": os.path.join(out, "adapter-script.gguf")}
    write_script_gguf(adapter, base.config, ggufs["script"])
    if args.llama_cpp:
        conv = os.path.join(out, "adapter-converter.gguf")
        env = dict(os.environ, PYTHONPATH=os.path.join(args.llama_cpp, "gguf-py") + ":" + args.llama_cpp + ":" +
                   os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, os.path.join(args.llama_cpp, "convert_lora_to_gguf.py"), "--base", hf_dir,
                            "--outfile", conv, "--outtype", "f32", adapter_dir], capture_output=True, text=True, env=env)
        if r.returncode == 0:
            ggufs["converter"] = conv
        else:
            result["converter_error"] = (r.stderr or r.stdout)[-3000:]

    ok = "converter_error" not in result
    models = [("", model_gguf)] + ([("@hf", hf_dir)] if args.hf_model else [])
    for name, path in [(n + m, p) for n, p in ggufs.items() for m, _ in models]:
        model = dict(models)[name[name.find("@"):] if "@" in name else ""]
        got, got_base, err = run_dump(args, model, path, os.path.join(out, name + ".bin"))
        if err:
            result[name] = {"error": err}
            ok = False
            continue
        c = compare(got, ref)
        c["base_rows_vs_base_model"] = compare(got_base, base_ref)
        c["pass"] = c["max_abs_logit"] <= args.tol and c["same_top1"] and \
            c["base_rows_vs_base_model"]["max_abs_logit"] <= args.base_tol
        ok = ok and c["pass"]
        result[name] = c
    result["pass"] = ok
    print(json.dumps(result, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
