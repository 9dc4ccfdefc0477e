"""Trains the default model: a small llama-architecture transformer on the
text tales.py writes, tokenized with the vocabulary in tokenizer.json (made by
prepare.py). Writes a Hugging Face model directory (config.json,
model.safetensors in F16, tokenizer files) that `engine-host convert` turns
into the shipped GGUF.

    python3 data.py --tokenizer tokenizer.json --out DATA
    python3 train.py --tokenizer tokenizer.json --data DATA --out DIR [--seconds 200] [--tiny]

Needs PyTorch (a CUDA GPU makes it take minutes; --tiny is a CPU smoke test).
"""

import argparse
import json
import math
import os
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import spm_bpe

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


# ---- model ------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim, n_ctx, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    t = torch.arange(n_ctx, device=device).float()
    f = torch.outer(t, inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.h = c["hidden_size"], c["num_attention_heads"]
        self.hd = d // self.h
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        ff = c["intermediate_size"]
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.h, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.h, self.hd).transpose(1, 2)
        q = q * cos[:T] + rotate_half(q) * sin[:T]
        k = k * cos[:T] + rotate_half(k) * sin[:T]
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            a = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, D))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        cos, sin = rope_tables(c["hidden_size"] // c["num_attention_heads"], c["max_position_embeddings"],
                               c["rope_theta"], device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["num_hidden_layers"]) if n.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied output


# ---- output -----------------------------------------------------------------

def save_safetensors(path, tensors):
    """safetensors: u64 header length, JSON header, raw little-endian data."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to("cpu", torch.float16).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def hf_state(model):
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    for i, L in enumerate(model.layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{n}.weight"] = getattr(L, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[p + f"mlp.{n}.weight"] = getattr(L, n).weight
        out[p + "input_layernorm.weight"] = L.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = L.post_attention_layernorm.weight
    return out


@torch.no_grad()
def evaluate(model, val, ctx, batch, device):
    """Mean next-token loss over the whole held-out stream, in windows of ctx."""
    model.eval()
    n = (val.numel() - 1) // ctx
    total, count = 0.0, 0
    for i in range(0, n, batch):
        rows = range(i, min(n, i + batch))
        x = torch.stack([val[r * ctx:(r + 1) * ctx] for r in rows]).to(device)
        y = torch.stack([val[r * ctx + 1:(r + 1) * ctx + 1] for r in rows]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        total += F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / count


@torch.no_grad()
def sample(model, enc, tokens, prompt_ids, n, device, temperature=0.7):
    model.eval()
    ids = list(prompt_ids)
    for _ in range(n):
        x = torch.tensor([ids[-model.cos.size(0):]], device=device)
        logits = model(x)[0, -1].float() / temperature
        nxt = torch.multinomial(logits.softmax(-1), 1).item()
        if nxt == spm_bpe.EOS:
            break
        ids.append(nxt)
    model.train()
    return enc.decode(ids[len(prompt_ids):], tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--data", required=True, help="folder with train.bin and heldout.bin from data.py")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--tiny", action="store_true", help="a few CPU steps, to check the script")
    a = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(1)
    tokens, merges = spm_bpe.load(a.tokenizer)
    enc = spm_bpe.Encoder(tokens, merges)
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(tokens),
         "hidden_size": 288, "intermediate_size": 768, "num_hidden_layers": 6, "num_attention_heads": 6,
         "num_key_value_heads": 6, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": True, "bos_token_id": spm_bpe.BOS, "eos_token_id": spm_bpe.EOS,
         "torch_dtype": "float16"}
    if a.tiny:
        c.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, max_position_embeddings=128)
        a.batch = 8
    ctx = c["max_position_embeddings"]

    def stream(name):
        with open(os.path.join(a.data, name), "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.int16).long() & 0xFFFF  # uint16 on disk

    train, val = stream("train.bin"), stream("heldout.bin")
    print(f"data: {train.numel():,} train tokens, {val.numel():,} held-out tokens", flush=True)
    train_dev = train.to(device)

    model = Llama(c, device).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters, config {json.dumps(c)}", flush=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), **({"fused": True} if device.type == "cuda" else {}))
    g = torch.Generator(device=device)
    g.manual_seed(2)
    seconds = 5 if a.tiny else a.seconds
    warm = 0.03
    start, step, seen = time.time(), 0, 0
    while True:
        frac = (time.time() - start) / seconds
        if frac >= 1 or (a.tiny and step >= 20):
            break
        lr = a.lr * (frac / warm if frac < warm else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm))))
        for grp in opt.param_groups:
            grp["lr"] = lr
        ix = torch.randint(0, train_dev.numel() - ctx - 1, (a.batch,), device=device, generator=g)
        off = torch.arange(ctx + 1, device=device)
        chunk = train_dev[ix[:, None] + off]
        x, y = chunk[:, :-1], chunk[:, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += x.numel()
        if step % 200 == 0:
            print(f"step {step} {time.time() - start:.0f}s lr {lr:.2e} loss {loss.item():.3f} "
                  f"tokens {seen:,} ({seen / (time.time() - start):,.0f}/s)", flush=True)

    val_loss = evaluate(model, val, ctx, a.batch, device)
    # the shipped weights are F16: measure those too
    for p in model.parameters():
        p.data = p.data.half().float()
    val_loss16 = evaluate(model, val, ctx, a.batch, device)
    report = {"steps": step, "train_tokens_seen": seen, "train_tokens_unique": train.numel(),
              "heldout_tokens": val.numel(), "heldout_loss": val_loss, "heldout_perplexity": math.exp(val_loss),
              "heldout_perplexity_f16": math.exp(val_loss16), "parameters": n_params,
              "seconds": time.time() - start, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    print(json.dumps(report), flush=True)
    for prompt in ["Once upon a time", "User: Tell me a story about a brave fox named Rosa.\nAssistant:"]:
        ids = [spm_bpe.BOS] + enc.fragment(prompt)
        print(f"--- {prompt!r}\n{sample(model, enc, tokens, ids, 200, device)}", flush=True)

    os.makedirs(a.out, exist_ok=True)
    save_safetensors(os.path.join(a.out, "model.safetensors"), hf_state(model))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                   "add_eos_token": False, "chat_template": CHAT_TEMPLATE}, f, indent=1)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spm_bpe.to_json(tokens, merges), f, ensure_ascii=False)
    with open(os.path.join(a.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
