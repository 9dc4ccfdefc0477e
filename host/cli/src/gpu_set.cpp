// --tensor-parallel and --gpus (gpu_set.hpp).
#include "gpu_set.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "eh/error.hpp"

namespace eh::cli {
namespace {

// GiB, or MiB below one GiB
std::string gib(uint64_t b) {
    if (b < (1ull << 30)) return fmt::format("{:.1f} MiB", double(b) / double(1ull << 20));
    return fmt::format("{:.1f} GiB", double(b) / double(1ull << 30));
}

}  // namespace

bool parse_gpu_list(std::string_view text, std::vector<int>& out, std::string& err) {
    out.clear();
    const std::string shown(text.substr(0, 64));
    if (text.empty()) {
        err = "--gpus is empty: name GPU ordinals, e.g. --gpus 0,1";
        return false;
    }
    size_t at = 0;
    for (;;) {
        const size_t comma = text.find(',', at);
        const std::string_view item = text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
        int v = -1;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0 || v > kMaxGpuOrdinal) {
            err = fmt::format("--gpus '{}': '{}' is not a GPU ordinal (0-{}); name them comma separated, e.g. 0,1",
                              shown, std::string(item.substr(0, 16)), kMaxGpuOrdinal);
            return false;
        }
        out.push_back(v);
        if (out.size() > kMaxTensorParallel) {
            err = fmt::format("--gpus '{}' names more than {} GPUs", shown, kMaxTensorParallel);
            return false;
        }
        if (comma == std::string_view::npos) break;
        at = comma + 1;
    }
    return true;
}

std::vector<GpuFacts> probe_gpus(const eh_plugin_api& api, const std::vector<int>& ordinals) {
    std::vector<GpuFacts> gpus;
    for (int d : ordinals) {
        eh_probe_result pr{};
        pr.struct_size = sizeof pr;
        GpuFacts g;
        g.ordinal = d;
        const eh_status st = api.probe(d, &pr);
        pr.reason[sizeof pr.reason - 1] = '\0';
        pr.device_name[sizeof pr.device_name - 1] = '\0';
        g.usable = st == EH_OK && pr.supported;
        g.reason = st != EH_OK ? std::string("probe failed with ") + eh_status_name(st)
                               : pr.reason[0] ? pr.reason : g.usable ? "" : "its probe refuses it";
        if (g.usable) {
            g.name = pr.device_name;
            g.total_bytes = pr.total_memory_bytes;
            g.free_bytes = pr.free_memory_bytes;
        }
        gpus.push_back(std::move(g));
    }
    return gpus;
}

std::vector<int> all_ordinals() {
    std::vector<int> d;
    for (int i = 0; i <= kMaxGpuOrdinal; ++i) d.push_back(i);
    return d;
}

const GpuFacts* find_gpu(const std::vector<GpuFacts>& gpus, int ordinal) {
    for (const GpuFacts& g : gpus)
        if (g.ordinal == ordinal) return &g;
    return nullptr;
}

std::vector<int> pick_gpus(const std::vector<GpuFacts>& gpus, uint32_t n) {
    std::vector<GpuFacts> usable;
    for (const GpuFacts& g : gpus)
        if (g.usable) usable.push_back(g);
    if (usable.size() < n)
        throw Error(Code::InsufficientVram,
                    fmt::format("--tensor-parallel {} needs {} GPUs; the plugin can use {}", n, n, usable.size()));
    std::stable_sort(usable.begin(), usable.end(),
                     [](const GpuFacts& a, const GpuFacts& b) { return a.free_bytes > b.free_bytes; });
    std::vector<int> out;
    for (uint32_t i = 0; i < n; ++i) out.push_back(usable[i].ordinal);
    std::sort(out.begin(), out.end());
    return out;
}

uint64_t rank_share(const FitNeed& need, uint64_t ranks) {
    return need.replicated_bytes + (need.sharded_bytes + ranks - 1) / ranks + (need.kv_bytes + ranks - 1) / ranks;
}

std::string fit_shortfall(const FitNeed& need, const std::vector<int>& devices, const std::vector<GpuFacts>& gpus) {
    if (devices.empty()) return "";
    const uint64_t ranks = devices.size();
    const uint64_t share = rank_share(need, ranks);
    std::map<int, uint64_t> count;
    for (int d : devices) ++count[d];
    for (const auto& [d, k] : count) {
        const GpuFacts* g = find_gpu(gpus, d);
        if (!g || g->free_bytes == 0) continue;
        if (share * k <= g->free_bytes) continue;
        return fmt::format("the model needs {} of weights split over the ranks + {} on every rank (embeddings, LM head, "
                           "norms) + {} of KV cache ({}), {} a rank over {} rank{}; GPU {}{} has {} free for {} rank{}: {} "
                           "short. Spread it over more GPUs (--tensor-parallel, --gpus), or take a smaller quantization or "
                           "context",
                           gib(need.sharded_bytes), gib(need.replicated_bytes), gib(need.kv_bytes), need.kv_what,
                           gib(share), ranks, ranks == 1 ? "" : "s", d, g->name.empty() ? "" : " (" + g->name + ")",
                           gib(g->free_bytes), k, k == 1 ? "" : "s", gib(share * k - g->free_bytes));
    }
    return "";
}

}  // namespace eh::cli

namespace eh::cli {

bool check_gpu_flags(uint32_t tp, bool tp_given, const std::string* gpus_text, bool gpu_device_named,
                     uint32_t& tp_out, std::vector<int>& gpus_out, std::string& err) {
    gpus_out.clear();
    if (tp < 1 || tp > kMaxTensorParallel) {
        err = fmt::format("--tensor-parallel must be between 1 and {}", kMaxTensorParallel);
        return false;
    }
    tp_out = tp;
    if (!gpus_text) return true;
    if (gpu_device_named) {
        err = "--gpus and --gpu-device both name GPUs: use one (--gpus 2 is GPU 2 alone)";
        return false;
    }
    if (!parse_gpu_list(*gpus_text, gpus_out, err)) return false;
    if (tp_given && tp != gpus_out.size()) {
        err = fmt::format("--tensor-parallel {} but --gpus names {} GPU{}: one rank per GPU named", tp, gpus_out.size(),
                          gpus_out.size() == 1 ? "" : "s");
        return false;
    }
    tp_out = uint32_t(gpus_out.size());
    return true;
}

}  // namespace eh::cli
