// The LoRA sites (lora.hpp's LoraSet) every CUDA engine numbers alike: per
// layer the attention's four first, in its matmuls' order (kind 0: Q, or
// the fused attn_qkv; 1: K; 2: V; 3: attn_output; the engines' kLoraQ ..
// kLoraOut), then the engine's own kinds; after every layer's, the LM
// head's. Host code only (adapter_load). The templates take the engine's
// Model: cfg (n_layer, n_embd, n_vocab, q_dim()) and layers (qkv, n_qkv).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include <ehcuda/kernels.hpp>
#include <ehcuda/lora.hpp>

namespace ehcuda {

// The shape of attention site `kind` (0 .. 3) of a layer whose Q/K/V are
// n_qkv segments of qkv (1: fused, K and V then no site of their own); an
// empty site for any other kind.
inline LoraSite lora_attention_site(const MatSeg* qkv, int n_qkv, int kind, int n_embd, int q_dim) {
    auto seg = [&](const MatSeg& s) { return LoraSite{n_embd, s.w.rows, s.out_offset}; };
    switch (kind) {
    case 0: return seg(qkv[0]);
    case 1: return n_qkv == 3 ? seg(qkv[1]) : LoraSite{};
    case 2: return n_qkv == 3 ? seg(qkv[2]) : LoraSite{};
    case 3: return {q_dim, n_embd, 0};
    default: return {};
    }
}

// A base weight named "blk.<layer>.<kind>.weight" of a layer below
// n_layer: *layer and *kind ("attn_q", "ffn_up", ...); false for any
// other name.
inline bool lora_layer_weight(const std::string& name, int n_layer, int* layer, std::string* kind) {
    int l = -1, used = 0;
    char k[32] = {};
    if (std::sscanf(name.c_str(), "blk.%d.%31[a-z_].weight%n", &l, k, &used) != 2 || used != int(name.size()) ||
        l < 0 || l >= n_layer)
        return false;
    *layer = l;
    *kind = k;
    return true;
}

// The attention site kind (0 .. 3) a layer's weight kind binds to:
// attn_qkv where the layer keeps Q/K/V fused (n_qkv 1), attn_q / attn_k /
// attn_v where it keeps them apart (3), attn_output; else -1.
inline int lora_attention_kind(const std::string& kind, int n_qkv) {
    if (kind == "attn_qkv" && n_qkv == 1) return 0;
    if (kind == "attn_q" && n_qkv == 3) return 0;
    if (kind == "attn_k" && n_qkv == 3) return 1;
    if (kind == "attn_v" && n_qkv == 3) return 2;
    if (kind == "attn_output") return 3;
    return -1;
}

// adapter_load on a model of tp ranks: refused (a rank holds slices of the
// matrices the adapter's updates are not cut for), in the same words for
// every plugin. Checked before lora_sites, which reads the one-rank layers.
inline void lora_refuse_sharded(const char* plugin, int tp) {
    if (tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, std::string("LoRA adapter: ") + plugin +
                                             " does not apply adapters to a tensor-parallel load (" +
                                             std::to_string(tp) + " ranks); load the model on one device");
}

// Every site of model m: per layer its per_layer kinds (the attention's
// here, kinds from 4 own_shape(layer, kind)), then the LM head (n_embd ->
// n_vocab).
template <class Model, class OwnShape>
std::vector<LoraSite> lora_sites(const Model& m, int per_layer, const OwnShape& own_shape) {
    const auto& c = m.cfg;
    std::vector<LoraSite> s;
    for (int l = 0; l < c.n_layer; ++l) {
        const auto& L = m.layers[size_t(l)];
        for (int k = 0; k < per_layer; ++k)
            s.push_back(k < 4 ? lora_attention_site(L.qkv, L.n_qkv, k, c.n_embd, c.q_dim()) : own_shape(l, k));
    }
    s.push_back({c.n_embd, c.n_vocab, 0});  // the LM head
    return s;
}

// The site a base weight's name binds to (lora_sites' numbering), or -1:
// "output.weight" the LM head; a layer's attention weights by
// lora_attention_kind; its others by own_kind(layer, kind) (the engine's
// kind number, or -1).
template <class Model, class OwnKind>
int lora_site_of(const Model& m, const std::string& name, int per_layer, const OwnKind& own_kind) {
    const int n_layer = m.cfg.n_layer;
    if (name == "output.weight") return n_layer * per_layer;
    int layer = -1;
    std::string k;
    if (!lora_layer_weight(name, n_layer, &layer, &k)) return -1;
    int kind = lora_attention_kind(k, m.layers[size_t(layer)].n_qkv);
    if (kind < 0) kind = own_kind(layer, k);
    return kind < 0 ? -1 : layer * per_layer + kind;
}

}  // namespace ehcuda
