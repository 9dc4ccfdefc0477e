#include "lora.hpp"

#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/plugin_abi.hpp>
#include <ehcuda/lora_sites.hpp>

namespace gpt_cuda {
namespace {

static_assert(kLoraQ == 0 && kLoraK == 1 && kLoraV == 2 && kLoraOut == 3, "lora_sites.hpp's attention kinds");

// The sites besides the attention's (lora_sites.hpp): GPT-2's MLP (the
// MoE models' experts are not adapted).
ehcuda::LoraSite mlp_site(const Config& c, int kind) {
    const bool mlp = c.arch == Arch::Gpt2;
    switch (kind) {
    case kLoraUp: return mlp ? ehcuda::LoraSite{c.n_embd, c.n_ff, 0} : ehcuda::LoraSite{};
    case kLoraDown: return mlp ? ehcuda::LoraSite{c.n_ff, c.n_embd, 0} : ehcuda::LoraSite{};
    default: return {};
    }
}
int mlp_kind(int, const std::string& k) { return k == "ffn_up" ? int(kLoraUp) : k == "ffn_down" ? int(kLoraDown) : -1; }

}  // namespace

std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p) {
    ehcuda::lora_check_params(p);
    ehcuda::lora_refuse_sharded("gpt-cuda", m.tp);
    if (!m.view) throw ehp::Error(EH_INTERNAL, "adapter_load: the model keeps no view");
    const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(*p.view, *m.view);
    m.lora.init(ehcuda::lora_sites(m, kLoraPerLayer, [&](int, int k) { return mlp_site(m.cfg, k); }), &m.ledger);
    ehcuda::LoraBindOptions o;
    o.site_of = [&](const std::string& base) { return ehcuda::lora_site_of(m, base, kLoraPerLayer, mlp_kind); };
    o.head_dim = m.cfg.head_dim;
    o.engine = "gpt-cuda";
    o.adapts = "the attention weights, GPT-2's MLP and the output weights; not the routers or experts";
    return ehcuda::lora_upload(m.lora, m.device, &m.ledger, info, p, o);
}

}  // namespace gpt_cuda
