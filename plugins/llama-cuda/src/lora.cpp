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

// The sites besides the attention's (lora_sites.hpp): the FFN's gate, up
// (phi3's fused gate|up: one site, kLoraGate) and down.
ehcuda::LoraSite ffn_site(const Model& m, int layer, int kind) {
    const Config& c = m.cfg;
    const bool apart = m.layers[size_t(layer)].n_gate_up == 2;
    switch (kind) {
    case kLoraGate: return {c.n_embd, apart ? c.n_ff : 2 * c.n_ff, 0};
    case kLoraUp: return apart ? ehcuda::LoraSite{c.n_embd, c.n_ff, c.n_ff} : ehcuda::LoraSite{};
    case kLoraDown: return {c.n_ff, c.n_embd, 0};
    default: return {};
    }
}
int ffn_kind(const Model& m, int layer, const std::string& k) {
    const bool apart = m.layers[size_t(layer)].n_gate_up == 2;
    if (k == "ffn_gate" && apart) return kLoraGate;
    if (k == "ffn_up") return apart ? kLoraUp : kLoraGate;
    if (k == "ffn_down") return kLoraDown;
    return -1;
}

bool ends_with(const std::string& s, const char* suffix) {
    const std::string x(suffix);
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

}  // namespace

std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p) {
    ehcuda::lora_check_params(p);
    ehcuda::lora_refuse_sharded("llama-cuda", m.tp);
    if (!m.view) throw ehp::Error(EH_INTERNAL, "adapter_load: the model keeps no view");
    const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(*p.view, *m.view);
    m.lora.init(ehcuda::lora_sites(m, kLoraPerLayer, [&](int l, int k) { return ffn_site(m, l, k); }), &m.ledger);
    // A llama from a Hugging Face directory keeps q/k rows in HF order; the
    // adapter file's lora_b rows are in the GGUF converter's.
    const bool hf = m.cfg.arch == "llama" && ehp::from_safetensors(ehp::ModelView(m.view));
    ehcuda::LoraBindOptions o;
    o.site_of = [&](const std::string& base) {
        return ehcuda::lora_site_of(m, base, kLoraPerLayer,
                                    [&](int l, const std::string& k) { return ffn_kind(m, l, k); });
    };
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
