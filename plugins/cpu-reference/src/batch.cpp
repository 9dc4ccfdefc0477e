#include "batch.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include "forward.hpp"

namespace cpuref {
namespace {

using ehp::Error;

uint64_t available_host_bytes() {
    const long avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return avail > 0 && page > 0 ? static_cast<uint64_t>(avail) * static_cast<uint64_t>(page) : 0;
}


}  // namespace

Batch::Batch(const Model& model, const eh_kv_params& p) : model_(model) {
    const Config& c = model.config();
    const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * c.head_dim;
    const uint64_t block_bytes = 2ull * c.n_layer * kBlockTokens * kv_dim * sizeof(float);
    const uint64_t budget = p.budget_bytes
                                ? p.budget_bytes
                                : static_cast<uint64_t>(double(available_host_bytes()) *
                                                        (p.memory_fraction > 0.0f ? p.memory_fraction : 0.5));
    // gpt2 has a table of learned positions: no room past its end
    const uint32_t seq_cap = c.arch == Arch::Gpt2 ? c.n_ctx_train : UINT32_MAX;
    granted_ = ehp::grant_kv(p, kBlockTokens, block_bytes, budget, seq_cap);
    pool_ = std::make_unique<KvPool>(c.n_layer, kv_dim, kBlockTokens, granted_.total_blocks);
}

eh_kv_info Batch::info() const {
    eh_kv_info i = granted_;
    i.free_blocks = pool_->blocks().free_blocks();
    return i;
}

std::unique_ptr<Sequence> Batch::create() {
    if (live_.size() >= granted_.max_seqs)
        throw Error(EH_INVALID_ARGUMENT, "seq_create: " + std::to_string(live_.size()) +
                                             " sequences are alive, the most kv_init granted");
    auto s = std::make_unique<Sequence>(*pool_);
    live_.insert(s.get());
    return s;
}

std::unique_ptr<Sequence> Batch::fork(const Sequence& src, uint32_t n_tokens) {
    if (n_tokens > src.length())
        throw Error(EH_INVALID_ARGUMENT, "seq_fork: n_tokens " + std::to_string(n_tokens) +
                                             " exceeds the source's length " + std::to_string(src.length()));
    if (live_.size() >= granted_.max_seqs)
        throw Error(EH_INVALID_ARGUMENT, "seq_fork: " + std::to_string(live_.size()) +
                                             " sequences are alive, the most kv_init granted");
    auto s = src.fork(n_tokens);
    live_.insert(s.get());
    return s;
}

void Batch::step(eh_step_entry* entries, uint32_t n_entries) {
    const uint32_t n_vocab = model_.config().n_vocab;
    const ehp::StepTotals totals = ehp::check_step(
        entries, n_entries, granted_, pool_->blocks().free_blocks(), n_vocab,
        [&](eh_seq* s) -> const ehp::SeqBlocks* {
            auto* seq = static_cast<Sequence*>(s);
            return owns(seq) ? &seq->blocks : nullptr;
        },
        [](eh_seq* s) { return static_cast<Sequence*>(s)->sampler.ready(); });
    auto at = [&](uint32_t i) -> eh_step_entry& { return ehp::step_entry(entries, totals.stride, i); };

    std::vector<Slice> slices;
    std::vector<std::vector<float>> logits(n_entries);
    for (uint32_t i = 0; i < n_entries; ++i) {
        eh_step_entry& e = at(i);
        auto* seq = static_cast<Sequence*>(e.seq);
        seq->blocks.reserve(e.n_tokens);
        e.token = -1;
        if (e.flags) logits[i].resize(n_vocab);
        slices.push_back({seq, e.tokens, e.n_tokens, e.flags ? logits[i].data() : nullptr});
    }
    forward(model_, slices, nullptr, nullptr);
    for (uint32_t i = 0; i < n_entries; ++i) {
        eh_step_entry& e = at(i);
        auto* seq = static_cast<Sequence*>(e.seq);
        seq->blocks.commit(e.tokens, e.n_tokens);
        seq->has_logits = false;
        if (e.flags & EH_STEP_SAMPLE) {
            seq->blocks.mark_sampled();
            const StepBias bias{e.n_bias, e.bias_tokens, e.bias_values, e.allowed};
            e.token = seq->sampler.sample(logits[i].data(), n_vocab, seq->tokens(), seq->blocks.gen_start, bias);
        }
        if (e.flags & EH_STEP_LOGITS) {
            seq->logits.swap(logits[i]);
            seq->has_logits = true;
        }
    }
}

}  // namespace cpuref
