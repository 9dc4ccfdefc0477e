// How a tensor-parallel load divides a model among its ranks (cuda-common
// README, "Tensor parallelism"), for every CUDA plugin that shards: the
// rank mode of the load option "tensor_parallel", the KV heads per rank,
// each rank's whole experts (expert parallelism), and the host copy of a
// row-parallel matrix's columns. Host code only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_set.hpp>
#include <ehcuda/kernel_route.hpp>
#include <ehcuda/options.hpp>

namespace ehcuda {

// The load option "tensor_parallel": "serial" (the shard mode: the ranks
// one after another on the step's stream; one GPU only) or "streams"
// (each rank on its own stream; distinct GPUs always run so). Without it:
// "streams" when the set names distinct GPUs, else "serial". Returns
// whether the ranks get streams of their own (never for one rank).
inline bool tp_streams_option(const Options& opts, const std::vector<int>& devices) {
    const bool distinct = std::any_of(devices.begin(), devices.end(), [&](int d) { return d != devices[0]; });
    const bool streams = opts.choice("tensor_parallel", distinct ? 1 : 0, {"serial", "streams"}) == 1;
    if (distinct && !streams)
        throw ehp::Error(EH_INVALID_ARGUMENT, "options: \"tensor_parallel\": \"serial\" runs every rank on one GPU; "
                                              "the device set names " + device_list(devices));
    return streams && devices.size() > 1;
}

// KV heads per rank: each rank takes whole KV heads (and their query
// groups), so the ranks must divide them (UNSUPPORTED otherwise).
inline int kv_heads_per_rank(int n_kv, int ranks) {
    if (ranks < 1 || n_kv % ranks)
        throw ehp::Error(EH_UNSUPPORTED, "tensor parallelism: " + std::to_string(n_kv) + " KV heads do not split over " +
                                             std::to_string(ranks) + " ranks (each rank takes whole KV heads)");
    return n_kv / ranks;
}

// Expert parallelism: rank r of `ranks` holds experts [first, first + count)
// whole, the counts as even as they can be (the first n_expert % ranks
// ranks one more). UNSUPPORTED when there are fewer experts than ranks.
struct ExpertRange {
    int first = 0;
    int count = 0;
    bool holds(int e) const { return e >= first && e < first + count; }
};
inline ExpertRange expert_range(int n_expert, int ranks, int r) {
    if (ranks < 1 || n_expert < ranks || r < 0 || r >= ranks)
        throw ehp::Error(EH_UNSUPPORTED, "tensor parallelism: " + std::to_string(n_expert) +
                                             " experts do not split over " + std::to_string(ranks) +
                                             " ranks (each rank holds at least one whole expert)");
    const int base = n_expert / ranks, extra = n_expert % ranks;
    return ExpertRange{r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

// Columns c0 .. c0 + n - 1 of every row of a rows x cols matrix (a
// row-parallel rank's share), copied row by row on the host into `out`
// (row_bytes(type, n) per row, returned). Each slice must start and end
// on whole blocks of the type (UNSUPPORTED naming the tensor otherwise).
// The caller has checked the tensor's shape and bytes (row_bytes `rb`).
inline size_t column_slice(const eh_tensor& t, int64_t rows, size_t rb, int64_t c0, int64_t n, std::vector<uint8_t>& out) {
    const size_t skip = c0 ? row_bytes(t.type, c0) : 0, nb = row_bytes(t.type, n);
    if ((c0 && !skip) || !nb)
        throw ehp::Error(EH_UNSUPPORTED, "tensor parallelism: tensor '" + std::string(ehp::to_sv(t.name)) + "' (" +
                                             ehp::type_name(t.type) + ") cannot be cut at columns " + std::to_string(c0) +
                                             ".." + std::to_string(c0 + n) + ": not whole blocks of its type");
    out.resize(nb * size_t(rows));
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(out.data() + size_t(r) * nb, static_cast<const uint8_t*>(t.data) + size_t(r) * rb + skip, nb);
    return nb;
}

}  // namespace ehcuda
