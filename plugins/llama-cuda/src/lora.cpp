#include "lora.hpp"

#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/model_source.hpp>
#include <ehcuda/lora_sites.hpp>
#include <engine_host/plugin_abi.hpp>

namespace llama_cuda {
namespace {

static_assert(kLoraQ == 0 && kLoraK == 1 && kLoraV == 2 && kLoraOut == 3, "lora_sites.hpp's attention kinds");

ehcuda::LoraSite site_shape(const Model& m, int layer, int kind) {
    const Config& c = m.cfg;
    const Layer& L = m.layers[size_t(layer)];
    switch (kind) {
    case kLoraGate: return {c.n_embd, L.n_gate_up == 2 ? c.n_ff : 2 * c.n_ff, 0};
    case kLoraUp: return L.n_gate_up == 2 ? ehcuda::LoraSite{c.n_embd, c.n_ff, c.n_ff} : ehcuda::LoraSite{};
    case kLoraDown: return {c.n_ff, c.n_embd, 0};
    default: return ehcuda::lora_attention_site(L.qkv, L.n_qkv, kind, c.n_embd, c.q_dim());
    }
}

std::vector<ehcuda::LoraSite> sites_of(const Model& m) {
    return ehcuda::lora_sites(m.cfg.n_layer, kLoraPerLayer, m.cfg.n_embd, m.cfg.n_vocab,
                              [&](int l, int k) { return site_shape(m, l, k); });
}

// The site a base weight's name binds to, or -1.
int site_of(const Model& m, const std::string& name) {
    return ehcuda::lora_site_of(
        name, m.cfg.n_layer, kLoraPerLayer, [&](int l) { return m.layers[size_t(l)].n_qkv; },
        [&](int l, const std::string& k) -> int {
            const bool apart = m.layers[size_t(l)].n_gate_up == 2;  // (else phi3's fused gate|up)
            if (k == "ffn_gate" && apart) return kLoraGate;
            if (k == "ffn_up") return apart ? kLoraUp : kLoraGate;
            if (k == "ffn_down") return kLoraDown;
            return -1;
        });
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
