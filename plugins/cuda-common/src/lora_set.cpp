// The host side of the CUDA engines' LoRA adapters (lora.hpp): the device
// table's slots and the conversion of an adapter file's tensors.
#include "ehcuda/lora.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

#include "ehcuda/check.hpp"

namespace ehcuda {

void LoraSet::init(const std::vector<LoraSite>& sites, MemoryLedger* ledger) {
    const int n_sites = int(sites.size());
    if (table_) {
        if (n_sites != n_sites_) throw ehp::Error(EH_INTERNAL, "LoRA table: the site count changed");
        return;
    }
    const size_t bytes = size_t(kLoraMaxAdapters) * size_t(n_sites) * sizeof(LoraDesc);
    DeviceBuffer t(bytes, ledger);
    EHC_CHECK(cudaMemset(t.get(), 0, bytes));
    table_ = std::move(t);
    n_sites_ = n_sites;
    sites_ = sites;
    for (const LoraSite& x : sites) max_n_in_ = std::max(max_n_in_, x.n_in);
    host_.assign(size_t(kLoraMaxAdapters) * size_t(n_sites), LoraDesc{});
    users_.assign(size_t(n_sites), 0);
    used_.assign(kLoraMaxAdapters, false);
}

int LoraSet::claim() {
    for (int i = 0; i < kLoraMaxAdapters; ++i)
        if (!used_[size_t(i)]) {
            used_[size_t(i)] = true;
            return i;
        }
    throw ehp::Error(EH_NO_CAPACITY, "adapter_load: " + std::to_string(kLoraMaxAdapters) +
                                         " adapters are loaded, the most one model holds; release one first");
}

void LoraSet::write(int slot, const std::vector<LoraDesc>& sites) {
    if (int(sites.size()) != n_sites_) throw ehp::Error(EH_INTERNAL, "LoRA table: a slot of the wrong size");
    EHC_CHECK(cudaMemcpy(table_.as<LoraDesc>() + size_t(slot) * n_sites_, sites.data(), sites.size() * sizeof(LoraDesc),
                         cudaMemcpyHostToDevice));
    std::copy(sites.begin(), sites.end(), host_.begin() + std::ptrdiff_t(size_t(slot) * size_t(n_sites_)));
    bool any = false;
    for (int i = 0; i < n_sites_; ++i)
        if (sites[size_t(i)].rank > 0) {
            ++users_[size_t(i)];
            any = true;
        }
    if (any) ++generation_;  // (a new slot in the launches' lists: LoraStep::apply)
}

void LoraSet::release(int slot) noexcept {
    if (slot < 0 || slot >= kLoraMaxAdapters || !table_) return;
    // (synchronous: no step still in flight reads the slot afterwards)
    cudaMemset(table_.as<LoraDesc>() + size_t(slot) * n_sites_, 0, size_t(n_sites_) * sizeof(LoraDesc));
    for (int i = 0; i < n_sites_; ++i)
        if (host(slot, i).rank > 0) --users_[size_t(i)];
    std::fill_n(host_.begin() + std::ptrdiff_t(size_t(slot) * size_t(n_sites_)), n_sites_, LoraDesc{});
    used_[size_t(slot)] = false;
}

LoraAdapter::~LoraAdapter() {
    cudaSetDevice(device_);
    set_.release(slot_);
}

std::vector<float> lora_tensor_rows(const eh_tensor& t) {
    const uint64_t cols = t.dims[0], rows = t.dims[1];
    const uint64_t rb = ehp::quant::row_bytes(t.type, cols);
    const std::string name(ehp::to_sv(t.name));
    if (rb == 0 || !t.data || t.nbytes < rb * rows)
        throw ehp::Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: tensor '" + name + "' holds fewer bytes than its shape needs");
    std::vector<float> out(size_t(cols * rows));
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (uint64_t r = 0; r < rows; ++r)
        if (!ehp::quant::dequantize_row(t.type, p + r * rb, out.data() + r * cols, cols))
            throw ehp::Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: tensor '" + name + "' cannot be read as its type");
    return out;
}

void lora_check_params(const eh_adapter_params& p) {
    if (!p.view) throw ehp::Error(EH_INVALID_ARGUMENT, "adapter_load: the adapter view is NULL");
    if (!std::isfinite(p.scale) || p.scale < -1e6f || p.scale > 1e6f)
        throw ehp::Error(EH_INVALID_ARGUMENT, "adapter_load: scale must be a finite number in [-1e6, 1e6]");
    if (!(p.alpha >= 0.0f && p.alpha <= 1e6f))
        throw ehp::Error(EH_INVALID_ARGUMENT, "adapter_load: alpha must be a finite number in [0, 1e6]");
}

std::unique_ptr<LoraAdapter> lora_upload(LoraSet& set, int device, MemoryLedger* ledger,
                                         const ehp::LoraAdapterInfo& info, const eh_adapter_params& p,
                                         const LoraBindOptions& o) {
    struct Bound {
        int site;
        std::vector<__half> a, bt;
        int rank;
        float scale;
    };
    std::vector<Bound> bound;
    size_t halves = 0;
    auto pad8 = [](size_t n) { return (n + 7) / 8 * 8; };  // (16-byte aligned pieces)
    for (const ehp::LoraPair& pr : info.pairs) {
        const int site = o.site_of(pr.base);
        const LoraSite sh = site < 0 ? LoraSite{} : set.site(site);
        if (site < 0 || sh.n_out == 0)
            throw ehp::Error(EH_UNSUPPORTED, "LoRA adapter: " + o.engine + " does not adapt '" + pr.base + "' (it adapts " +
                                                 o.adapts + ")");
        if (uint64_t(sh.n_in) != pr.n_in || uint64_t(sh.n_out) != pr.n_out)
            throw ehp::Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: '" + pr.base + "' is {" + std::to_string(pr.n_in) +
                                                       ", " + std::to_string(pr.n_out) + "}; the loaded matrix is {" +
                                                       std::to_string(sh.n_in) + ", " + std::to_string(sh.n_out) + "}");
        const int r = int(pr.rank);
        if (r > kLoraMaxRank)
            throw ehp::Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: '" + pr.base + "': rank " + std::to_string(r) +
                                                       " is above " + std::to_string(kLoraMaxRank));
        const std::vector<float> a = lora_tensor_rows(*pr.a);  // r rows of n_in
        const std::vector<float> b = lora_tensor_rows(*pr.b);  // n_out rows of r
        const bool permute = o.hf_rows && o.hf_rows(pr.base);
        const int hd = o.head_dim, n_out = sh.n_out;
        if (permute && (hd < 2 || hd % 2 || n_out % hd))
            throw ehp::Error(EH_INTERNAL, "LoRA adapter: '" + pr.base + "': rows are not whole heads");
        Bound bd{site, std::vector<__half>(a.size()), std::vector<__half>(size_t(r) * size_t(n_out)), r,
                 p.alpha > 0 ? p.scale * p.alpha / float(r) : p.scale};
        for (size_t i = 0; i < a.size(); ++i) bd.a[i] = __float2half(a[i]);
        for (int j = 0; j < n_out; ++j) {
            int src = j;
            if (permute) {  // HF row h*hd + t*hd/2 + i is the GGUF converter's row h*hd + 2i + t
                const int h = j / hd, w = j % hd, t = w / (hd / 2), i = w % (hd / 2);
                src = h * hd + 2 * i + t;
            }
            for (int k = 0; k < r; ++k) bd.bt[size_t(k) * size_t(n_out) + size_t(j)] = __float2half(b[size_t(src) * size_t(r) + size_t(k)]);
        }
        halves += pad8(bd.a.size()) + pad8(bd.bt.size());
        bound.push_back(std::move(bd));
    }
    auto out = std::make_unique<LoraAdapter>(set, device);
    out->data = DeviceBuffer(halves * sizeof(__half), ledger);
    std::vector<LoraDesc> table(size_t(set.n_sites()));
    __half* at = out->data.as<__half>();
    for (const Bound& bd : bound) {
        LoraDesc& d = table[size_t(bd.site)];
        EHC_CHECK(cudaMemcpy(at, bd.a.data(), bd.a.size() * sizeof(__half), cudaMemcpyHostToDevice));
        d.a = at;
        at += pad8(bd.a.size());
        EHC_CHECK(cudaMemcpy(at, bd.bt.data(), bd.bt.size() * sizeof(__half), cudaMemcpyHostToDevice));
        d.bt = at;
        at += pad8(bd.bt.size());
        d.rank = bd.rank;
        d.scale = bd.scale;
    }
    set.write(out->slot(), table);
    return out;
}

}  // namespace ehcuda
