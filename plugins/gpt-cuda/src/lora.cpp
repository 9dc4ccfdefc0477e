#include "lora.hpp"

#include <cstdio>
#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/plugin_abi.hpp>

namespace gpt_cuda {
namespace {

ehcuda::LoraSite site_shape(const Model& m, int layer, int kind) {
    const Config& c = m.cfg;
    const Layer& L = m.layers[size_t(layer)];
    const bool mlp = c.arch == Arch::Gpt2;
    auto seg = [](const ehcuda::MatSeg& s, int n_in) { return ehcuda::LoraSite{n_in, s.w.rows, s.out_offset}; };
    switch (kind) {
    case kLoraQ: return seg(L.qkv[0], c.n_embd);
    case kLoraK: return L.n_qkv == 3 ? seg(L.qkv[1], c.n_embd) : ehcuda::LoraSite{};
    case kLoraV: return L.n_qkv == 3 ? seg(L.qkv[2], c.n_embd) : ehcuda::LoraSite{};
    case kLoraOut: return {c.q_dim(), c.n_embd, 0};
    case kLoraUp: return mlp ? ehcuda::LoraSite{c.n_embd, c.n_ff, 0} : ehcuda::LoraSite{};
    case kLoraDown: return mlp ? ehcuda::LoraSite{c.n_ff, c.n_embd, 0} : ehcuda::LoraSite{};
    default: return {};
    }
}

std::vector<ehcuda::LoraSite> sites_of(const Model& m) {
    std::vector<ehcuda::LoraSite> s;
    for (int l = 0; l < m.cfg.n_layer; ++l)
        for (int k = 0; k < kLoraPerLayer; ++k) s.push_back(site_shape(m, l, k));
    s.push_back({m.cfg.n_embd, m.cfg.n_vocab, 0});  // the LM head
    return s;
}

int site_of(const Model& m, const std::string& name) {
    const Config& c = m.cfg;
    if (name == "output.weight") return lora_head_site(c);
    int layer = -1, used = 0;
    char kind[32] = {};
    if (std::sscanf(name.c_str(), "blk.%d.%31[a-z_].weight%n", &layer, kind, &used) != 2 || used != int(name.size()) ||
        layer < 0 || layer >= c.n_layer)
        return -1;
    const Layer& L = m.layers[size_t(layer)];
    const std::string k(kind);
    if (k == "attn_qkv" && L.n_qkv == 1) return lora_site(layer, kLoraQ);
    if (k == "attn_q" && L.n_qkv == 3) return lora_site(layer, kLoraQ);
    if (k == "attn_k" && L.n_qkv == 3) return lora_site(layer, kLoraK);
    if (k == "attn_v" && L.n_qkv == 3) return lora_site(layer, kLoraV);
    if (k == "attn_output") return lora_site(layer, kLoraOut);
    if (k == "ffn_up") return lora_site(layer, kLoraUp);
    if (k == "ffn_down") return lora_site(layer, kLoraDown);
    return -1;
}

}  // namespace

std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p) {
    ehcuda::lora_check_params(p);
    // (a sharded model's matrices are its ranks' slices, which the
    // adapter's updates are not cut for)
    if (m.tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: LoRA adapters are not built for tensor parallelism (the model is on " +
                                             std::to_string(m.tp) + " ranks); load the model on one device");
    if (!m.view) throw ehp::Error(EH_INTERNAL, "adapter_load: the model keeps no view");
    const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(*p.view, *m.view);
    m.lora.init(sites_of(m), &m.ledger);
    ehcuda::LoraBindOptions o;
    o.site_of = [&](const std::string& base) { return site_of(m, base); };
    o.head_dim = m.cfg.head_dim;
    o.engine = "gpt-cuda";
    o.adapts = "the attention weights, GPT-2's MLP and the output weights; not the routers or experts";
    return ehcuda::lora_upload(m.lora, m.device, &m.ledger, info, p, o);
}

}  // namespace gpt_cuda
