// The host side of the CUDA engines' LoRA adapters (lora.hpp): the device
// table's slots and the conversion of an adapter file's tensors.
#include "ehcuda/lora.hpp"

#include <algorithm>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

#include "ehcuda/check.hpp"

namespace ehcuda {

void LoraSet::init(int n_sites, MemoryLedger* ledger) {
    if (table_) {
        if (n_sites != n_sites_) throw ehp::Error(EH_INTERNAL, "LoRA table: the site count changed");
        return;
    }
    const size_t bytes = size_t(kLoraMaxAdapters) * size_t(n_sites) * sizeof(LoraDesc);
    DeviceBuffer t(bytes, ledger);
    EHC_CHECK(cudaMemset(t.get(), 0, bytes));
    table_ = std::move(t);
    n_sites_ = n_sites;
    host_.assign(size_t(kLoraMaxAdapters) * size_t(n_sites), LoraDesc{});
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
}

void LoraSet::release(int slot) noexcept {
    if (slot < 0 || slot >= kLoraMaxAdapters || !table_) return;
    // (synchronous: no step still in flight reads the slot afterwards)
    cudaMemset(table_.as<LoraDesc>() + size_t(slot) * n_sites_, 0, size_t(n_sites_) * sizeof(LoraDesc));
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

}  // namespace ehcuda
