// How a tensor-parallel load divides a model among its ranks (cuda-common
// README, "Tensor parallelism"), for every CUDA plugin that shards: the
// rank mode of the load option "tensor_parallel", the KV heads per rank,
// each rank's whole experts (expert parallelism) or its rows of every
// expert (tensor parallelism within experts), and the host copy of a
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

// Bytes of `cols` values of `type` as a file stores them (any block type,
// MXFP4 too: a cut copies the file's rows); 0 when cols is not whole blocks.
inline size_t block_row_bytes(uint32_t type, int64_t cols) {
    const eh_type_traits tr = eh_tensor_type_traits(type);
    if (cols <= 0 || tr.block_elems == 0 || tr.block_bytes == 0 || cols % tr.block_elems) return 0;
    return size_t(cols / tr.block_elems) * tr.block_bytes;
}

// UNSUPPORTED: tensor t cannot be cut at columns c0 .. c0 + n (not whole
// blocks of its type), naming the tensor, its type and the cut.
[[noreturn]] inline void refuse_column_cut(const eh_tensor& t, int64_t c0, int64_t n) {
    throw ehp::Error(EH_UNSUPPORTED, "tensor parallelism: tensor '" + std::string(ehp::to_sv(t.name)) + "' (" +
                                         ehp::type_name(t.type) + ") cannot be cut at columns " + std::to_string(c0) +
                                         ".." + std::to_string(c0 + n) + ": not whole blocks of its type");
}

// Columns c0 .. c0 + n - 1 of every row of a rows x cols matrix (a
// row-parallel rank's share), copied row by row on the host into `out`
// (block_row_bytes(type, n) per row, returned). Each slice must start and
// end on whole blocks of the type (UNSUPPORTED naming the tensor
// otherwise). The caller has checked the tensor's type, shape and bytes
// (its file row bytes `rb`).
inline size_t column_slice(const eh_tensor& t, int64_t rows, size_t rb, int64_t c0, int64_t n, std::vector<uint8_t>& out) {
    const size_t skip = c0 ? block_row_bytes(t.type, c0) : 0, nb = block_row_bytes(t.type, n);
    if ((c0 && !skip) || !nb) refuse_column_cut(t, c0, n);
    out.resize(nb * size_t(rows));
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(out.data() + size_t(r) * nb, static_cast<const uint8_t*>(t.data) + size_t(r) * rb + skip, nb);
    return nb;
}

// Tensor parallelism within experts (gpt-cuda's load option
// "expert_split": "rows"): every rank holds every expert, rank r of
// `ranks` rows [first, first + count) of each expert's intermediate width
// n_ff (its gate and up rows) and the same columns of its down. Equal
// shares, each on whole blocks of `down`'s type (the tensor whose columns
// are cut): UNSUPPORTED otherwise, naming the tensor, its type and the cut
// (Qwen3-MoE's width 768 in Q4_K over 2 ranks: 384 is not whole 256-value
// blocks; gpt-oss's 2880 in MXFP4 over 2: 1440 is 45 blocks of 32).
struct RowRange {
    int64_t first = 0;
    int64_t count = 0;
};
inline RowRange expert_row_range(const eh_tensor& down, int64_t n_ff, int ranks, int r) {
    if (ranks < 1 || r < 0 || r >= ranks || n_ff % ranks)
        throw ehp::Error(EH_UNSUPPORTED, "tensor parallelism within experts: the experts' width of " +
                                             std::to_string(n_ff) + " rows does not split evenly over " +
                                             std::to_string(ranks) + " ranks");
    const RowRange own{r * (n_ff / ranks), n_ff / ranks};
    if (!block_row_bytes(down.type, own.count)) refuse_column_cut(down, own.first, own.count);
    return own;
}

// Tensor parallelism within experts, the host copy of a rank's rows: of
// each of n_expert experts' rows_stored rows (row_bytes each, expert after
// expert at src), rows [first, first + count) of every cut in order, expert
// by expert, into `out` (a fused gate|up's cuts: the rank's gate rows, then
// its up rows; a bias's cuts: its values, 4-byte rows). Returns the rows
// each expert keeps (the cuts' counts added).
inline int64_t expert_rows_copy(const void* src, size_t row_bytes, int64_t rows_stored, int64_t n_expert,
                                const std::vector<RowRange>& cuts, std::vector<uint8_t>& out) {
    int64_t per = 0;
    for (const RowRange& c : cuts) per += c.count;
    out.resize(row_bytes * size_t(per * n_expert));
    uint8_t* dst = out.data();
    for (int64_t e = 0; e < n_expert; ++e)
        for (const RowRange& c : cuts) {
            std::memcpy(dst, static_cast<const uint8_t*>(src) + size_t(e * rows_stored + c.first) * row_bytes,
                        size_t(c.count) * row_bytes);
            dst += size_t(c.count) * row_bytes;
        }
    return per;
}

}  // namespace ehcuda
