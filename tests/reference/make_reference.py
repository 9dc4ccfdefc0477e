#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for the cpu-reference plugin.

Run on a machine with torch + transformers (no downloads are made):

    python3 tests/reference/make_reference.py --out tests/reference/data \
        [--testdata ../shared/testdata] [--device cpu] [--tokenizers]

For each architecture (llama, qwen2, phi3, gpt2, gpt-oss, and llama3 = llama
with Llama 3.x rope scaling, mistral = llama with its own head_dim, qwen3) it
builds a tiny
model from a config with seeded random weights, and writes into <out>/<arch>/:
  hf/            the model as a Hugging Face directory (config.json +
                 model.safetensors; with --tokenizers also a tokenizer.json
                 copied from <testdata>/tokenizers, which is large)
  model.gguf     the same weights laid out the way llama.cpp's converter lays
                 them out (llama Q/K rows permuted, GPT-2 Conv1D transposed,
                 gpt-oss experts split from the interleaved gate_up and stored
                 as MXFP4), written by gguf_io.py
  reference.json the token sequence, transformers' logits for every position,
                 and a greedy continuation
It also loads <testdata>/models/stories260K.gguf into LlamaForCausalLM (Q/K
permutation undone) and writes <out>/stories260K/reference.json with the
logits and greedy ids for BOS + "Once upon a time".

gpt-oss experts are rounded to MXFP4 first (values written back into the HF
model), so transformers and the plugin see bit-identical weights.

tests/cpu_reference/hf_reference_test.cpp compares the plugin with these files.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io  # noqa: E402

VOCAB = 256
HIDDEN = 64
LLAMA_THETA, QWEN2_THETA, PHI3_THETA, OSS_THETA = 10000.0, 1000000.0, 10000.0, 150000.0
OSS_YARN_FACTOR, OSS_YARN_ORIG = 32.0, 4096
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FF = 128
CTX = 64
# A fixed prompt; 12 tokens so that the sliding windows below (4 and 6) matter.
TOKENS = [1, 17, 93, 4, 250, 31, 31, 7, 128, 64, 200, 9]
GREEDY_PROMPT = TOKENS[:6]
GREEDY_NEW = 10


# --------------------------------------------------------------------------
# weights

def randomize(model, seed):
    """Seeded weights with O(1) activations (HF's 0.02 init gives near-flat logits)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            leaf = name.split(".")[-1]
            if "sinks" in name:
                p.copy_(r)
            elif p.dim() == 1 and ("norm" in name or name.split(".")[-2].startswith("ln_")) and leaf == "weight":
                p.copy_(1.0 + 0.1 * r)
            elif leaf == "bias" or leaf.endswith("_bias"):
                p.copy_(0.1 * r)
            elif "wte" in name or "embed_tokens" in name:
                p.copy_(r)
            elif "wpe" in name:
                p.copy_(0.3 * r)
            else:
                fan_in = fan_in_of(name, p)
                p.copy_(r / math.sqrt(fan_in))


def fan_in_of(name, p):
    if "experts" in name:           # gpt-oss experts: [E, in, out]
        return p.shape[1]
    if name.startswith("transformer.h.") and p.dim() == 2 and ("c_attn" in name or "c_proj" in name or "c_fc" in name):
        return p.shape[0]           # GPT-2 Conv1D: [in, out]
    return p.shape[-1]              # nn.Linear: [out, in]


def flat(t):
    return t.detach().to(torch.float32).contiguous().reshape(-1).tolist()


def dims_of_linear(w):
    """ggml dims of a torch [out, in] matrix: {in, out} (same bytes)."""
    return [w.shape[1], w.shape[0]]


def permute_qk(w, n_head):
    """llama.cpp's converter order: within each head, pair (2i, 2i+1) = HF rows (i, i + d/2)."""
    out_dim, in_dim = w.shape
    hd = out_dim // n_head
    return w.reshape(n_head, 2, hd // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def unpermute_qk(w, n_head):
    out_dim, in_dim = w.shape
    hd = out_dim // n_head
    return w.reshape(n_head, hd // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


# MXFP4: blocks of 32 values share an E8M0 exponent e (scale 2^(e-127));
# each value is an E2M1 code (sign bit 3, magnitudes below); ggml stores e
# then 16 bytes, value j in the low nibble of byte j, value j+16 in the high.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def mxfp4_rows(rows):
    """Quantizes a [n, k] tensor (k % 32 == 0). Returns (bytes, dequantized tensor)."""
    n, k = rows.shape
    out = bytearray()
    deq = torch.empty_like(rows, dtype=torch.float32)
    mags = torch.tensor(E2M1)
    for r in range(n):
        for b0 in range(0, k, 32):
            x = rows[r, b0:b0 + 32].to(torch.float32)
            amax = float(x.abs().max())
            e = 0 if amax == 0.0 else max(0, min(254, math.ceil(math.log2(amax / 6.0)) + 127))
            scale = 2.0 ** (e - 127)
            a = (x.abs() / scale)
            idx = (a.unsqueeze(1) - mags.unsqueeze(0)).abs().argmin(dim=1)  # ties: lower code
            codes = [int(i) | (8 if (float(x[j]) < 0 and int(i) != 0) else 0) for j, i in enumerate(idx)]
            out.append(e)
            out += bytes(codes[j] | (codes[j + 16] << 4) for j in range(16))
            vals = torch.tensor([(-1.0 if c & 8 else 1.0) * E2M1[c & 7] * scale for c in codes])
            deq[r, b0:b0 + 32] = vals
    return bytes(out), deq


# --------------------------------------------------------------------------
# models

def instantiate(cls, cfg):
    """Eager attention: the plain softmax(QK^T)V path (gpt-oss sinks need it)."""
    for dtype_kw in ("dtype", "torch_dtype"):  # transformers 5 renamed torch_dtype
        try:
            return cls._from_config(cfg, attn_implementation="eager", **{dtype_kw: torch.float32})
        except TypeError:
            pass
    cfg._attn_implementation = "eager"
    return cls(cfg)


def common_keys(w, arch, n_embd, n_layer, n_head, n_kv, n_ff, ctx):
    w.str("general.name", f"tiny-random-{arch}")
    w.str("general.source_format", "gguf")
    w.u32(f"{arch}.context_length", ctx)
    w.u32(f"{arch}.embedding_length", n_embd)
    w.u32(f"{arch}.block_count", n_layer)
    w.u32(f"{arch}.feed_forward_length", n_ff)
    w.u32(f"{arch}.attention.head_count", n_head)
    w.u32(f"{arch}.attention.head_count_kv", n_kv)


def build_llama(seed):
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CTX,
        rms_norm_eps=1e-5, rope_theta=LLAMA_THETA, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.LlamaForCausalLM, cfg)
    randomize(model, seed)
    return model, None


def gguf_llama(model):
    return gguf_llama_family(model, LLAMA_THETA)


# Llama 3.x: llama3 RoPE frequency scaling. theta 500000 and head dim 16
# put pairs in all three bands (kept, smoothed, divided by the factor) for
# an original context of 8192.
LLAMA3_THETA = 500000.0
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def build_llama3(seed):
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CTX,
        rms_norm_eps=1e-5, rope_theta=LLAMA3_THETA, rope_scaling=dict(LLAMA3_SCALING),
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.LlamaForCausalLM, cfg)
    randomize(model, seed)
    return model, None


def llama3_rope_factors(theta, head_dim, p):
    """The rope_freqs tensor llama.cpp's converter writes for rope_type llama3:
    per pair a divisor of the inverse frequency."""
    out = []
    low_wavelen = p["original_max_position_embeddings"] / p["low_freq_factor"]
    high_wavelen = p["original_max_position_embeddings"] / p["high_freq_factor"]
    for i in range(0, head_dim, 2):
        freq = 1.0 / (theta ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(p["factor"])
        else:
            smooth = (p["original_max_position_embeddings"] / wavelen - p["low_freq_factor"]) / (
                p["high_freq_factor"] - p["low_freq_factor"])
            out.append(1.0 / ((1 - smooth) / p["factor"] + smooth))
    return out


# Mistral-Nemo's shape: head_dim set on its own (here 32 with 64 hidden / 4
# heads, so q/k/v/o are 128 wide), architecture llama in GGUF.
MISTRAL_HEAD_DIM = 32
MISTRAL_THETA = 1000000.0


def build_mistral(seed):
    cfg = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=MISTRAL_HEAD_DIM,
        max_position_embeddings=CTX, rms_norm_eps=1e-5, rope_theta=MISTRAL_THETA, sliding_window=None,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.MistralForCausalLM, cfg)
    randomize(model, seed)
    return model, None


def gguf_llama_family(model, theta, head_dim=None, rope_freqs=None):
    """llama, Llama 3.x (rope_freqs) and Mistral (head_dim) as llama.cpp's
    converter writes them: architecture llama, Q/K rows permuted."""
    c = model.config
    hd = head_dim or c.hidden_size // c.num_attention_heads
    w = gguf_io.Writer("llama")
    common_keys(w, "llama", c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                c.num_key_value_heads, c.intermediate_size, c.max_position_embeddings)
    w.f32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.f32("llama.rope.freq_base", theta)
    w.u32("llama.rope.dimension_count", hd)
    if head_dim:
        w.u32("llama.attention.key_length", hd)
        w.u32("llama.attention.value_length", hd)
    sd = model.state_dict()
    lin = lambda name, t: w.tensor_f32(name, dims_of_linear(t), flat(t))
    vec = lambda name, t: w.tensor_f32(name, [t.shape[0]], flat(t))
    lin("token_embd.weight", sd["model.embed_tokens.weight"])
    if rope_freqs:
        w.tensor_f32("rope_freqs.weight", [len(rope_freqs)], rope_freqs)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        lin(b + "attn_q.weight", permute_qk(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        lin(b + "attn_k.weight", permute_qk(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        lin(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        lin(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        vec(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        lin(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        lin(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        lin(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    lin("output.weight", sd["lm_head.weight"])
    return w


# Qwen3: per-head RMSNorm of q and k (q_norm / k_norm) before RoPE, no QKV
# bias, head_dim set on its own (128 in every Qwen3; 32 here, with 64
# hidden / 4 heads).
QWEN3_HEAD_DIM = 32
QWEN3_THETA = 1000000.0


def build_qwen3(seed):
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=QWEN3_HEAD_DIM,
        max_position_embeddings=CTX, rms_norm_eps=1e-6, rope_theta=QWEN3_THETA, tie_word_embeddings=False,
        use_sliding_window=False, attention_bias=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.Qwen3ForCausalLM, cfg)
    randomize(model, seed)
    return model, None


# Qwen3-MoE (Qwen3-30B-A3B's structure): Qwen3 attention, every layer a
# softmax-routed MoE (top-k renormalised: norm_topk_prob), no shared expert.
Q3MOE_EXPERTS, Q3MOE_USED, Q3MOE_FF = 8, 2, 32


def build_qwen3moe(seed):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, moe_intermediate_size=Q3MOE_FF,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=QWEN3_HEAD_DIM, num_experts=Q3MOE_EXPERTS, num_experts_per_tok=Q3MOE_USED,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=CTX,
        rms_norm_eps=1e-6, rope_theta=QWEN3_THETA, tie_word_embeddings=False, use_sliding_window=False,
        attention_bias=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.Qwen3MoeForCausalLM, cfg)
    randomize(model, seed)
    return model, None


def build_qwen2(seed):
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CTX,
        rms_norm_eps=1e-6, rope_theta=QWEN2_THETA, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.Qwen2ForCausalLM, cfg)
    randomize(model, seed)
    return model, None


def gguf_qwen_family(model, arch, theta):
    """qwen2 (QKV biases, tied head), qwen3 (q/k norms, own head_dim) and
    qwen3moe (plus routed experts) as llama.cpp's converter writes them: no
    Q/K permutation (NEOX rotation)."""
    c = model.config
    qwen2 = arch == "qwen2"
    moe = arch == "qwen3moe"
    w = gguf_io.Writer(arch)
    common_keys(w, arch, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                c.num_key_value_heads, c.intermediate_size, c.max_position_embeddings)
    w.f32(f"{arch}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.f32(f"{arch}.rope.freq_base", theta)
    if qwen2:
        w.u32(f"{arch}.rope.dimension_count", c.hidden_size // c.num_attention_heads)
    else:
        w.u32(f"{arch}.attention.key_length", c.head_dim)
        w.u32(f"{arch}.attention.value_length", c.head_dim)
    if moe:
        w.u32(f"{arch}.expert_count", c.num_experts)
        w.u32(f"{arch}.expert_used_count", c.num_experts_per_tok)
        w.u32(f"{arch}.expert_feed_forward_length", c.moe_intermediate_size)
    sd = model.state_dict()
    lin = lambda name, t: w.tensor_f32(name, dims_of_linear(t), flat(t))
    vec = lambda name, t: w.tensor_f32(name, [t.shape[0]], flat(t))
    lin("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        for x in "qkv":
            lin(b + f"attn_{x}.weight", sd[p + f"self_attn.{x}_proj.weight"])
            if qwen2:
                vec(b + f"attn_{x}.bias", sd[p + f"self_attn.{x}_proj.bias"])
        if not qwen2:
            vec(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            vec(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        lin(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        vec(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if moe:
            qwen3moe_experts(w, c, sd, p, b)
            continue
        lin(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        lin(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        lin(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:  # small Qwen2s are tied: no output.weight
        lin("output.weight", sd["lm_head.weight"])
    return w


def qwen3moe_experts(w, c, sd, p, b):
    """The router and the stacked experts of one Qwen3-MoE layer."""
    H, F, X = c.hidden_size, c.moe_intermediate_size, c.num_experts
    w.tensor_f32(b + "ffn_gate_inp.weight", dims_of_linear(sd[p + "mlp.gate.weight"]), flat(sd[p + "mlp.gate.weight"]))
    if p + "mlp.experts.gate_up_proj" in sd:  # transformers 5: fused [X, 2F, H], gate rows first
        gu = sd[p + "mlp.experts.gate_up_proj"]
        down = sd[p + "mlp.experts.down_proj"]  # [X, H, F]
        if tuple(gu.shape) != (X, 2 * F, H) or tuple(down.shape) != (X, H, F):
            raise SystemExit(f"qwen3moe: unexpected expert shapes {tuple(gu.shape)} / {tuple(down.shape)}")
        gate, up = gu[:, :F, :], gu[:, F:, :]
    else:  # transformers 4: one module per expert
        e = [f"{p}mlp.experts.{x}." for x in range(X)]
        gate = torch.stack([sd[k + "gate_proj.weight"] for k in e])
        up = torch.stack([sd[k + "up_proj.weight"] for k in e])
        down = torch.stack([sd[k + "down_proj.weight"] for k in e])
    w.tensor_f32(b + "ffn_gate_exps.weight", [H, F, X], flat(gate))
    w.tensor_f32(b + "ffn_up_exps.weight", [H, F, X], flat(up))
    w.tensor_f32(b + "ffn_down_exps.weight", [F, H, X], flat(down))


PHI3_WINDOW = 6


def build_phi3(seed):
    cfg = transformers.Phi3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CTX,
        original_max_position_embeddings=CTX, rms_norm_eps=1e-5, rope_theta=PHI3_THETA,
        rope_scaling=None, sliding_window=PHI3_WINDOW, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.Phi3ForCausalLM, cfg)
    randomize(model, seed)
    return model, None


def gguf_phi3(model):
    c = model.config
    hd = c.hidden_size // c.num_attention_heads
    w = gguf_io.Writer("phi3")
    common_keys(w, "phi3", c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                c.num_key_value_heads, c.intermediate_size, c.max_position_embeddings)
    w.f32("phi3.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.f32("phi3.rope.freq_base", PHI3_THETA)
    w.u32("phi3.rope.dimension_count", int(hd * getattr(c, "partial_rotary_factor", 1.0)))
    w.u32("phi3.attention.sliding_window", c.sliding_window)
    sd = model.state_dict()
    lin = lambda name, t: w.tensor_f32(name, dims_of_linear(t), flat(t))
    vec = lambda name, t: w.tensor_f32(name, [t.shape[0]], flat(t))
    lin("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        lin(b + "attn_qkv.weight", sd[p + "self_attn.qkv_proj.weight"])
        lin(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        vec(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        lin(b + "ffn_up.weight", sd[p + "mlp.gate_up_proj.weight"])  # gate rows, then up rows
        lin(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    lin("output.weight", sd["lm_head.weight"])
    return w


def build_gpt2(seed):
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=CTX, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
        n_inner=FF, activation_function="gelu_new", layer_norm_epsilon=1e-5,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    model = instantiate(transformers.GPT2LMHeadModel, cfg)
    randomize(model, seed)
    return model, None


def gguf_gpt2(model):
    c = model.config
    w = gguf_io.Writer("gpt2")
    common_keys(w, "gpt2", c.n_embd, c.n_layer, c.n_head, c.n_head, c.n_inner, c.n_positions)
    w.f32("gpt2.attention.layer_norm_epsilon", c.layer_norm_epsilon)
    sd = model.state_dict()
    lin = lambda name, t: w.tensor_f32(name, dims_of_linear(t), flat(t))
    conv = lambda name, t: lin(name, t.t())  # Conv1D stores [in, out]
    vec = lambda name, t: w.tensor_f32(name, [t.shape[0]], flat(t))
    lin("token_embd.weight", sd["transformer.wte.weight"])
    lin("position_embd.weight", sd["transformer.wpe.weight"])
    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", sd[p + "ln_1.weight"])
        vec(b + "attn_norm.bias", sd[p + "ln_1.bias"])
        conv(b + "attn_qkv.weight", sd[p + "attn.c_attn.weight"])
        vec(b + "attn_qkv.bias", sd[p + "attn.c_attn.bias"])
        conv(b + "attn_output.weight", sd[p + "attn.c_proj.weight"])
        vec(b + "attn_output.bias", sd[p + "attn.c_proj.bias"])
        vec(b + "ffn_norm.weight", sd[p + "ln_2.weight"])
        vec(b + "ffn_norm.bias", sd[p + "ln_2.bias"])
        conv(b + "ffn_up.weight", sd[p + "mlp.c_fc.weight"])
        vec(b + "ffn_up.bias", sd[p + "mlp.c_fc.bias"])
        conv(b + "ffn_down.weight", sd[p + "mlp.c_proj.weight"])
        vec(b + "ffn_down.bias", sd[p + "mlp.c_proj.bias"])
    vec("output_norm.weight", sd["transformer.ln_f.weight"])
    vec("output_norm.bias", sd["transformer.ln_f.bias"])
    return w  # tied: no output.weight


OSS_WINDOW = 4
OSS_EXPERTS = 4
OSS_USED = 2
OSS_HEAD_DIM = 16
OSS_FF = 64


def build_gpt_oss(seed):
    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=OSS_FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=OSS_HEAD_DIM,
        num_local_experts=OSS_EXPERTS, num_experts_per_tok=OSS_USED, experts_per_token=OSS_USED,
        sliding_window=OSS_WINDOW, layer_types=["sliding_attention", "full_attention"],
        # max_position_embeddings = factor * original, as in the real config
        max_position_embeddings=int(OSS_YARN_FACTOR * OSS_YARN_ORIG), rms_norm_eps=1e-5, rope_theta=OSS_THETA,
        rope_scaling={"rope_type": "yarn", "factor": OSS_YARN_FACTOR, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": OSS_YARN_ORIG},
        attention_bias=True, swiglu_limit=7.0, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.GptOssForCausalLM, cfg)
    randomize(model, seed)
    # Round the experts to MXFP4 in GGUF layout, and write the dequantized
    # values back so transformers computes with exactly those weights.
    packed = {}
    with torch.no_grad():
        for i in range(LAYERS):
            ex = model.model.layers[i].mlp.experts
            gate_rows, up_rows, down_rows = [], [], []
            for e in range(OSS_EXPERTS):
                gu = ex.gate_up_proj[e]                      # [H, 2F], gate/up interleaved
                gate = gu[:, 0::2].t().contiguous()          # [F, H]
                up = gu[:, 1::2].t().contiguous()
                down = ex.down_proj[e].t().contiguous()      # [H, F]
                gb, gd = mxfp4_rows(gate)
                ub, ud = mxfp4_rows(up)
                db, dd = mxfp4_rows(down)
                gate_rows.append(gb)
                up_rows.append(ub)
                down_rows.append(db)
                ex.gate_up_proj[e, :, 0::2] = gd.t()
                ex.gate_up_proj[e, :, 1::2] = ud.t()
                ex.down_proj[e] = dd.t()
            packed[i] = (b"".join(gate_rows), b"".join(up_rows), b"".join(down_rows))
    return model, packed


def gguf_gpt_oss(model, packed):
    c = model.config
    a = "gpt-oss"
    w = gguf_io.Writer(a)
    common_keys(w, a, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                c.num_key_value_heads, c.intermediate_size, c.max_position_embeddings)
    w.u32(f"{a}.expert_feed_forward_length", c.intermediate_size)
    w.u32(f"{a}.expert_count", c.num_local_experts)
    w.u32(f"{a}.expert_used_count", c.num_experts_per_tok)
    w.u32(f"{a}.attention.key_length", c.head_dim)
    w.u32(f"{a}.attention.value_length", c.head_dim)
    w.u32(f"{a}.attention.sliding_window", c.sliding_window)
    w.f32(f"{a}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.f32(f"{a}.rope.freq_base", OSS_THETA)
    w.u32(f"{a}.rope.dimension_count", c.head_dim)
    w.str(f"{a}.rope.scaling.type", "yarn")
    w.f32(f"{a}.rope.scaling.factor", OSS_YARN_FACTOR)
    w.u32(f"{a}.rope.scaling.original_context_length", OSS_YARN_ORIG)
    sd = model.state_dict()
    lin = lambda name, t: w.tensor_f32(name, dims_of_linear(t), flat(t))
    vec = lambda name, t: w.tensor_f32(name, [t.shape[0]], flat(t))
    H, F, E = c.hidden_size, c.intermediate_size, c.num_local_experts
    lin("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        for x in "qkv":
            lin(b + f"attn_{x}.weight", sd[p + f"self_attn.{x}_proj.weight"])
            vec(b + f"attn_{x}.bias", sd[p + f"self_attn.{x}_proj.bias"])
        lin(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        vec(b + "attn_output.bias", sd[p + "self_attn.o_proj.bias"])
        vec(b + "attn_sinks.weight", sd[p + "self_attn.sinks"])
        vec(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
        lin(b + "ffn_gate_inp.weight", sd[p + "mlp.router.weight"])
        vec(b + "ffn_gate_inp.bias", sd[p + "mlp.router.bias"])
        gate, up, down = packed[i]
        w.tensor_raw(b + "ffn_gate_exps.weight", [H, F, E], gguf_io.TYPE_MXFP4, gate)
        w.tensor_raw(b + "ffn_up_exps.weight", [H, F, E], gguf_io.TYPE_MXFP4, up)
        w.tensor_raw(b + "ffn_down_exps.weight", [F, H, E], gguf_io.TYPE_MXFP4, down)
        gub = sd[p + "mlp.experts.gate_up_proj_bias"]  # [E, 2F] interleaved
        w.tensor_f32(b + "ffn_gate_exps.bias", [F, E], flat(gub[:, 0::2]))
        w.tensor_f32(b + "ffn_up_exps.bias", [F, E], flat(gub[:, 1::2]))
        w.tensor_f32(b + "ffn_down_exps.bias", [H, E], flat(sd[p + "mlp.experts.down_proj_bias"]))
    vec("output_norm.weight", sd["model.norm.weight"])
    lin("output.weight", sd["lm_head.weight"])
    return w


# Gemma 3 (Gemma3ForCausalLM): head size 32 at hidden 64 (q/k/v wider than
# the hidden state, as on every real Gemma 3), sliding layers with their own
# RoPE base on a period of 2 (layers 0 and 2 slide, window 4 < the 12
# tokens), global layers at 1e6 with linear x8, soft-capped logits (5.0, low
# enough to bite), query_pre_attn_scalar = the head size (what llama.cpp
# assumes for a GGUF, which carries no scale).
GEMMA3_LAYERS, GEMMA3_HEAD_DIM, GEMMA3_WINDOW, GEMMA3_PERIOD = 4, 32, 4, 2
GEMMA3_THETA, GEMMA3_LOCAL_THETA, GEMMA3_LINEAR, GEMMA3_SOFTCAP = 1000000.0, 10000.0, 8.0, 5.0


def gemma3_config(vocab, hidden, ff, layers, heads, kv_heads, head_dim, window, period, ctx, softcap,
                  bos=2, eos=1, pad=0):
    """A Gemma3TextConfig in the form the installed transformers takes: from
    version 5 one rope_parameters object per layer type and layer_types;
    before, rope_theta / rope_local_base_freq / rope_scaling and
    sliding_window_pattern."""
    layer_types = ["sliding_attention" if i % period < period - 1 else "full_attention" for i in range(layers)]
    kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
              query_pre_attn_scalar=head_dim, sliding_window=window, max_position_embeddings=ctx,
              rms_norm_eps=1e-6, final_logit_softcapping=softcap, attn_logit_softcapping=None,
              hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, attention_bias=False,
              bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    if int(transformers.__version__.split(".")[0]) >= 5:
        cfg = transformers.Gemma3TextConfig(
            layer_types=layer_types,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": GEMMA3_LINEAR, "rope_theta": GEMMA3_THETA},
                             "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_THETA}},
            **kw)
    else:
        cfg = transformers.Gemma3TextConfig(
            sliding_window_pattern=period, rope_theta=GEMMA3_THETA, rope_local_base_freq=GEMMA3_LOCAL_THETA,
            rope_scaling={"rope_type": "linear", "factor": GEMMA3_LINEAR}, **kw)
    got = getattr(cfg, "layer_types", None)
    if got is not None and list(got) != layer_types:
        raise SystemExit(f"gemma3: transformers made layer_types {got}, wanted {layer_types}")
    return cfg


def build_gemma3(seed):
    cfg = gemma3_config(VOCAB, HIDDEN, FF, GEMMA3_LAYERS, HEADS, KV_HEADS, GEMMA3_HEAD_DIM, GEMMA3_WINDOW,
                        GEMMA3_PERIOD, CTX, GEMMA3_SOFTCAP)
    model = instantiate(transformers.Gemma3ForCausalLM, cfg)
    randomize(model, seed)
    # Gemma's RMSNorm multiplies by (1 + w): centre the norm weights on 0
    # (randomize puts norms at 1 + 0.1 r, which here would mean 2 + 0.1 r).
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model, None


def gguf_gemma3(model):
    """As llama.cpp's converter writes gemma3: every norm weight stored as
    1 + w, no Q/K permutation (NEOX rotation), tied head (no output.weight),
    no attention scale and no local RoPE base (llama.cpp's defaults: the head
    size, 10000). The period is written because it is not 6."""
    c = model.config
    arch = "gemma3"
    w = gguf_io.Writer(arch)
    common_keys(w, arch, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                c.num_key_value_heads, c.intermediate_size, c.max_position_embeddings)
    w.f32(f"{arch}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.u32(f"{arch}.attention.key_length", c.head_dim)
    w.u32(f"{arch}.attention.value_length", c.head_dim)
    w.f32(f"{arch}.rope.freq_base", GEMMA3_THETA)
    w.str(f"{arch}.rope.scaling.type", "linear")
    w.f32(f"{arch}.rope.scaling.factor", GEMMA3_LINEAR)
    w.u32(f"{arch}.attention.sliding_window", GEMMA3_WINDOW)
    w.u32(f"{arch}.attention.sliding_window_pattern", GEMMA3_PERIOD)
    w.f32(f"{arch}.final_logit_softcapping", GEMMA3_SOFTCAP)
    sd = model.state_dict()
    lin = lambda name, t: w.tensor_f32(name, dims_of_linear(t), flat(t))
    norm = lambda name, t: w.tensor_f32(name, [t.shape[0]], flat(t + 1.0))
    lin("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        norm(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        for x in "qkv":
            lin(b + f"attn_{x}.weight", sd[p + f"self_attn.{x}_proj.weight"])
        norm(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
        norm(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        lin(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        norm(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
        norm(b + "ffn_norm.weight", sd[p + "pre_feedforward_layernorm.weight"])
        lin(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        lin(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        lin(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
        norm(b + "post_ffw_norm.weight", sd[p + "post_feedforward_layernorm.weight"])
    norm("output_norm.weight", sd["model.norm.weight"])
    return w


ARCHS = {
    "llama": (build_llama, lambda m, extra: gguf_llama(m), "llama"),
    "qwen2": (build_qwen2, lambda m, extra: gguf_qwen_family(m, "qwen2", QWEN2_THETA), "qwen2.5"),
    "phi3": (build_phi3, lambda m, extra: gguf_phi3(m), "phi-3-mini"),
    "gpt2": (build_gpt2, lambda m, extra: gguf_gpt2(m), "gpt2"),
    "gpt-oss": (build_gpt_oss, gguf_gpt_oss, "gpt-oss-20b"),
    "llama3": (build_llama3, lambda m, extra: gguf_llama_family(
        m, LLAMA3_THETA, rope_freqs=llama3_rope_factors(LLAMA3_THETA, HIDDEN // HEADS, LLAMA3_SCALING)), "llama"),
    "mistral": (build_mistral, lambda m, extra: gguf_llama_family(m, MISTRAL_THETA, head_dim=MISTRAL_HEAD_DIM), "llama"),
    "qwen3": (build_qwen3, lambda m, extra: gguf_qwen_family(m, "qwen3", QWEN3_THETA), "qwen2.5"),
    "qwen3moe": (build_qwen3moe, lambda m, extra: gguf_qwen_family(m, "qwen3moe", QWEN3_THETA), "qwen2.5"),
    "gemma3": (build_gemma3, lambda m, extra: gguf_gemma3(m), "gpt2"),
}
# Architectures whose HF directory the host cannot serve: no hf/ is kept for
# them. (qwen3moe's is served now; its recorded entry predates that, and
# HfReferenceQwen3Moe writes both of its expert layouts from model.gguf.)
NO_HF_DIR = set()


# --------------------------------------------------------------------------
# Hugging Face directories

def write_tiny_tokenizer(hf_dir, vocab):
    """A minimal WordLevel tokenizer.json ("t0".."tN"): the host requires one
    in every model directory; the tests feed token ids, never text."""
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    }
    with open(os.path.join(hf_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype string, shape, bytes). Format: u64 header
    length, JSON header {name: {dtype, shape, data_offsets}}, data."""
    header, blobs, off = {}, [], 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def hf_mxfp4_rows(rows):
    """HF/OpenAI MXFP4 of a [n, k] tensor: blocks [n, k/32, 16] (values 2j and
    2j+1 in the low and high nibble of byte j) and scales [n, k/32] (E8M0)."""
    packed, _ = mxfp4_rows(rows)  # ggml blocks: e, then value j low / j+16 high
    n, k = rows.shape
    blocks, scales = bytearray(), bytearray()
    for i in range(0, len(packed), 17):
        e, qs = packed[i], packed[i + 1:i + 17]
        code = [qs[j] & 15 for j in range(16)] + [qs[j] >> 4 for j in range(16)]
        scales.append(e)
        blocks += bytes(code[2 * j] | (code[2 * j + 1] << 4) for j in range(16))
    return bytes(blocks), bytes(scales)


def write_gpt_oss_mxfp4_dir(model, src_dir, out_dir):
    """The gpt-oss model as an MXFP4 checkpoint (experts as _blocks/_scales,
    config quantization_config.quant_method = mxfp4), like openai/gpt-oss-20b."""
    os.makedirs(out_dir, exist_ok=True)
    c = model.config
    tensors = []
    for name, t in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            rows = t.detach().float().transpose(1, 2).contiguous()  # [E, out, in]
            E, n_out, n_in = rows.shape
            blocks, scales = hf_mxfp4_rows(rows.reshape(E * n_out, n_in))
            tensors.append((name + "_blocks", "U8", [E, n_out, n_in // 32, 16], blocks))
            tensors.append((name + "_scales", "U8", [E, n_out, n_in // 32], scales))
        else:
            v = t.detach().float().contiguous()
            tensors.append((name, "F32", list(v.shape), struct.pack(f"<{v.numel()}f", *v.reshape(-1).tolist())))
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_tiny_tokenizer(out_dir, c.vocab_size)


def check_mxfp4_dir_with_transformers(mx_dir, want, device):
    """Loads the MXFP4 directory with transformers' own MXFP4 support
    (dequantized) and compares its logits with the dense model's: this checks
    our reading of the HF MXFP4 layout against transformers'."""
    try:
        qc = transformers.Mxfp4Config(dequantize=True)
        m = transformers.GptOssForCausalLM.from_pretrained(mx_dir, quantization_config=qc,
                                                           attn_implementation="eager")
        m = m.to(torch.float32).to(device).eval()
        got = all_logits(m, TOKENS, device)
        return {"loaded": True, "max_abs_diff_vs_dense": float((got - want).abs().max())}
    except Exception as exc:  # recorded, not fatal: the dense reference stands on its own
        return {"loaded": False, "error": f"{type(exc).__name__}: {exc}"[:500]}


# --------------------------------------------------------------------------
# running

@torch.no_grad()
def all_logits(model, tokens, device):
    ids = torch.tensor([tokens], device=device)
    return model(input_ids=ids, use_cache=False).logits[0].float().cpu()


@torch.no_grad()
def greedy(model, prompt, n_new, device):
    ids = list(prompt)
    out = []
    for _ in range(n_new):
        nxt = int(all_logits(model, ids, device)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


def tolerance(device):
    """Max |plugin - HF| / max |HF logit| the C++ test accepts. The plugin
    agrees with CPU float32 to ~1e-6; 1e-4 still catches e.g. YaRN's
    truncate flag (~2e-3). GPU kernels reorder sums, hence the looser bound."""
    return 1e-4 if device == "cpu" else 2e-3


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0]}


def make_arch(name, out_dir, testdata, device, with_tokenizer, seed):
    build, to_gguf, tok_dir = ARCHS[name]
    model, extra = build(seed)
    model = model.to(torch.float32).eval()
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    hf_dir = os.path.join(d, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    if with_tokenizer:
        src = os.path.join(testdata, "tokenizers", tok_dir)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(src, f)):
                shutil.copy(os.path.join(src, f), hf_dir)
    else:
        write_tiny_tokenizer(hf_dir, model.config.vocab_size)
    to_gguf(model, extra).write(os.path.join(d, "model.gguf"))

    model = model.to(device)
    logits = all_logits(model, TOKENS, device)
    extra_info = {}
    if name == "gpt-oss":
        mx_dir = os.path.join(d, "hf_mxfp4")
        write_gpt_oss_mxfp4_dir(model.cpu(), hf_dir, mx_dir)
        model = model.to(device)
        extra_info["hf_mxfp4_dir"] = "hf_mxfp4"
        extra_info["hf_mxfp4_transformers_check"] = check_mxfp4_dir_with_transformers(mx_dir, logits, device)
        print(f"gpt-oss MXFP4 directory vs dense: {extra_info['hf_mxfp4_transformers_check']}")
    if name in NO_HF_DIR:
        shutil.rmtree(hf_dir)
    write_json(os.path.join(d, "reference.json"), {
        "name": name,
        "model": "model.gguf",
        "hf_dir": None if name in NO_HF_DIR else "hf",
        "seed": seed,
        "tokens": TOKENS,
        "logits": [[float(x) for x in row] for row in logits],
        "greedy_prompt": GREEDY_PROMPT,
        "greedy_ids": greedy(model, GREEDY_PROMPT, GREEDY_NEW, device),
        "tolerance": tolerance(device),
        "note": "logits of every position of `tokens` from transformers "
                f"{type(model).__name__} in float32 on {device}",
        "versions": versions(),
        **extra_info,
    })
    print(f"{name}: wrote {d}")


def make_stories(out_dir, testdata, device):
    path = os.path.join(testdata, "models", "stories260K.gguf")
    r = gguf_io.Reader(path)
    m = r.meta
    n_head = m["llama.attention.head_count"]
    n_kv = m.get("llama.attention.head_count_kv", n_head)
    n_embd = m["llama.embedding_length"]
    emb, dims = r.floats("token_embd.weight")
    vocab = dims[1]
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=n_embd, intermediate_size=m["llama.feed_forward_length"],
        num_hidden_layers=m["llama.block_count"], num_attention_heads=n_head, num_key_value_heads=n_kv,
        max_position_embeddings=m["llama.context_length"],
        rms_norm_eps=m["llama.attention.layer_norm_rms_epsilon"],
        rope_theta=m.get("llama.rope.freq_base", 10000.0), tie_word_embeddings="output.weight" not in r.tensors,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = instantiate(transformers.LlamaForCausalLM, cfg).eval()

    def mat(name):
        v, dd = r.floats(name)
        return torch.tensor(v, dtype=torch.float32).reshape(dd[1], dd[0])  # ggml {in, out} -> [out, in]

    def vec(name):
        return torch.tensor(r.floats(name)[0], dtype=torch.float32)

    sd = {"model.embed_tokens.weight": mat("token_embd.weight"), "model.norm.weight": vec("output_norm.weight")}
    if "output.weight" in r.tensors:
        sd["lm_head.weight"] = mat("output.weight")
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        sd[p + "input_layernorm.weight"] = vec(b + "attn_norm.weight")
        sd[p + "self_attn.q_proj.weight"] = unpermute_qk(mat(b + "attn_q.weight"), n_head)
        sd[p + "self_attn.k_proj.weight"] = unpermute_qk(mat(b + "attn_k.weight"), n_kv)
        sd[p + "self_attn.v_proj.weight"] = mat(b + "attn_v.weight")
        sd[p + "self_attn.o_proj.weight"] = mat(b + "attn_output.weight")
        sd[p + "post_attention_layernorm.weight"] = vec(b + "ffn_norm.weight")
        sd[p + "mlp.gate_proj.weight"] = mat(b + "ffn_gate.weight")
        sd[p + "mlp.up_proj.weight"] = mat(b + "ffn_up.weight")
        sd[p + "mlp.down_proj.weight"] = mat(b + "ffn_down.weight")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k and not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"stories260K: state dict mismatch: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model = model.to(device)
    # BOS + "Once upon a time" in the model's SentencePiece vocabulary
    # ("▁Once" 403, "▁upon" 407, "▁a" 261, "▁time" 378)
    prompt = [1, 403, 407, 261, 378]
    toks = r.meta["tokenizer.ggml.tokens"]
    assert [toks[t] for t in prompt[1:]] == ["▁Once", "▁upon", "▁a", "▁time"], "unexpected vocabulary"
    logits = all_logits(model, prompt, device)
    ids = greedy(model, prompt, 24, device)
    d = os.path.join(out_dir, "stories260K")
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "reference.json"), {
        "name": "stories260K",
        "model": "testdata:models/stories260K.gguf",
        "tokens": prompt,
        "logits": [[float(x) for x in row] for row in logits],
        "greedy_prompt": prompt,
        "greedy_ids": ids,
        "greedy_text": "".join(toks[t] for t in ids).replace("▁", " "),
        "tolerance": tolerance(device),
        "note": "stories260K.gguf loaded into LlamaForCausalLM (Q/K permutation undone), float32",
        "versions": versions(),
    })
    print(f"stories260K: wrote {d}: Once upon a time" + "".join(toks[t] for t in ids).replace("▁", " "))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "data"))
    ap.add_argument("--testdata", default=os.path.join(here, "..", "..", "..", "shared", "testdata"))
    ap.add_argument("--device", default="cpu", help="cpu (default, exact float32) or cuda")
    ap.add_argument("--tokenizers", action="store_true",
                    help="copy tokenizer.json into each hf/ dir (large: up to 28 MB for gpt-oss)")
    ap.add_argument("--only", nargs="*", help="subset of: " + " ".join(list(ARCHS) + ["stories260K"]))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.makedirs(args.out, exist_ok=True)
    todo = args.only or (list(ARCHS) + ["stories260K"])
    for name in todo:
        if name == "stories260K":
            make_stories(args.out, args.testdata, args.device)
        else:
            seed = 1000 + list(ARCHS).index(name)
            make_arch(name, args.out, args.testdata, args.device, args.tokenizers, seed)
    index_path = os.path.join(args.out, "index.json")
    entries = []
    if os.path.exists(index_path):  # --only adds to what was recorded before
        with open(index_path) as f:
            entries = json.load(f).get("entries", [])
    entries += [n for n in todo if n not in entries]
    write_json(index_path, {"made_by": "tests/reference/make_reference.py", "entries": entries,
                            "versions": versions()})


if __name__ == "__main__":
    main()
