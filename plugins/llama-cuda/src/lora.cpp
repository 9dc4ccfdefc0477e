#include "lora.hpp"

#include <cstdio>
#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/model_source.hpp>
#include <engine_host/plugin_abi.hpp>

namespace llama_cuda {
namespace {

ehcuda::LoraSite site_shape(const Model& m, int layer, int kind) {
    const Config& c = m.cfg;
    const Layer& L = m.layers[size_t(layer)];
    auto seg = [](const ehcuda::MatSeg& s, int n_in) { return ehcuda::LoraSite{n_in, s.w.rows, s.out_offset}; };
    switch (kind) {
    case kLoraQ: return seg(L.qkv[0], c.n_embd);
    case kLoraK: return L.n_qkv == 3 ? seg(L.qkv[1], c.n_embd) : ehcuda::LoraSite{};
    case kLoraV: return L.n_qkv == 3 ? seg(L.qkv[2], c.n_embd) : ehcuda::LoraSite{};
    case kLoraOut: return {c.q_dim(), c.n_embd, 0};
    case kLoraGate: return {c.n_embd, L.n_gate_up == 2 ? c.n_ff : 2 * c.n_ff, 0};
    case kLoraUp: return L.n_gate_up == 2 ? ehcuda::LoraSite{c.n_embd, c.n_ff, c.n_ff} : ehcuda::LoraSite{};
    case kLoraDown: return {c.n_ff, c.n_embd, 0};
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

// The site a base weight's name binds to, or -1.
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
    if (k == "ffn_gate" && L.n_gate_up == 2) return lora_site(layer, kLoraGate);
    if (k == "ffn_up") return lora_site(layer, L.n_gate_up == 2 ? kLoraUp : kLoraGate);
    if (k == "ffn_down") return lora_site(layer, kLoraDown);
    return -1;
}

bool ends_with(const std::string& s, const char* suffix) {
    const std::string x(suffix);
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

}  // namespace

std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p) {
    ehcuda::lora_check_params(p);
    if (m.tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, "LoRA adapter: llama-cuda does not apply adapters to a tensor-parallel load (" +
                                             std::to_string(m.tp) + " ranks); load the model on one device");
    if (!m.view) throw ehp::Error(EH_INTERNAL, "adapter_load: the model keeps no view");
    const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(*p.view, *m.view);
    m.lora.init(sites_of(m), &m.ledger);
    // A llama from a Hugging Face directory keeps q/k rows in HF order; the
    // adapter file's lora_b rows are in the GGUF converter's.
    const bool hf = m.cfg.arch == "llama" && ehp::from_safetensors(ehp::ModelView(m.view));
    ehcuda::LoraBindOptions o;
    o.site_of = [&](const std::string& base) { return site_of(m, base); };
    if (hf)
        o.hf_rows = [](const std::string& base) {
            return ends_with(base, ".attn_q.weight") || ends_with(base, ".attn_k.weight");
        };
    o.head_dim = m.cfg.head_dim;
    o.engine = "llama-cuda";
    o.adapts = "the attention, feed-forward and output weights";
    return ehcuda::lora_upload(m.lora, m.device, &m.ledger, info, p, o);
}

}  // namespace llama_cuda
