#include "ehcuda/weight_mirror.hpp"

#include "ehcuda/options.hpp"

#include <cstring>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/check.hpp"
#include "prefill_gemm.hpp"

namespace ehcuda {

size_t WeightMirror::bytes_for(const WeightRef& w) {
    if (!w.data || w.type == EH_TYPE_F16 || w.rows <= 0 || w.cols <= 0 || w.cols % 32) return 0;
    if (!matmul_type_supported(w.type) || w.row_bytes != row_bytes(w.type, w.cols)) return 0;
    return size_t(w.rows) * size_t(w.cols) * sizeof(__half);
}

void WeightMirror::add(const WeightRef& w, cudaStream_t stream, MemoryLedger* ledger) {
    const size_t n = bytes_for(w);
    if (n == 0 || find(w)) return;
    DeviceBuffer copy(n, ledger);
    prefill::dequant_rows(w.type, w.data, w.row_bytes, w.rows, w.cols, copy.as<__half>(), stream);
    const auto* start = static_cast<const uint8_t*>(w.data);
    by_start_.emplace(start, Entry{start + size_t(w.rows) * w.row_bytes, w.row_bytes, w.cols, std::move(copy)});
    bytes_ += n;
}

const __half* WeightMirror::find(const WeightRef& w) const {
    if (by_start_.empty() || !w.data) return nullptr;
    const auto* p = static_cast<const uint8_t*>(w.data);
    auto it = by_start_.upper_bound(p);
    if (it == by_start_.begin()) return nullptr;
    --it;
    const Entry& e = it->second;
    const size_t off = size_t(p - it->first);
    if (w.cols != e.cols || w.row_bytes != e.row_bytes || off % e.row_bytes ||
        p + size_t(w.rows) * w.row_bytes > e.end)
        return nullptr;
    return e.copy.as<__half>() + off / e.row_bytes * size_t(e.cols);
}

MirrorDecision mirror_policy(MirrorPolicy policy, size_t mirror_bytes, size_t free_bytes) {
    const auto mib = [](size_t b) { return std::to_string((b + (1u << 19)) >> 20) + " MiB"; };
    MirrorDecision d;
    if (mirror_bytes == 0) {
        d.why = "fp16 weights: none to mirror";
        return d;
    }
    switch (policy) {
    case MirrorPolicy::Off:
        d.why = "fp16 weights: off (fp16_weights=off): multi-token GEMMs dequantize slab by slab";
        return d;
    case MirrorPolicy::On:
        d.on = true;
        d.why = "fp16 weights: on (fp16_weights=on): " + mib(mirror_bytes);
        return d;
    case MirrorPolicy::Auto:
        d.on = mirror_bytes <= free_bytes / 4;
        d.why = "fp16 weights: " + std::string(d.on ? "on" : "off") + " (auto): " + mib(mirror_bytes) + " against " +
                mib(free_bytes) + " free after the weights (on up to a quarter)";
        return d;
    }
    return d;
}

MirrorDecision build_mirror(WeightMirror& mirror, const std::vector<WeightRef>& mats, MirrorPolicy policy,
                            cudaStream_t stream, MemoryLedger* ledger) {
    size_t need = 0;
    for (const WeightRef& w : mats) need += WeightMirror::bytes_for(w);
    size_t free_bytes = 0, total_bytes = 0;
    EHC_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    MirrorDecision d = mirror_policy(policy, need, free_bytes);
    if (d.on) {
        for (const WeightRef& w : mats) mirror.add(w, stream, ledger);
        EHC_CHECK(cudaStreamSynchronize(stream));
    }
    return d;
}

MirrorPolicy mirror_policy_option(const Options& options) {
    return MirrorPolicy(options.choice("fp16_weights", int(MirrorPolicy::Auto), {"auto", "on", "off"}));
}

}  // namespace ehcuda
