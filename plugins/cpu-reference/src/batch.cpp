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

std::string entry_name(uint32_t i) { return "step entry " + std::to_string(i) + ": "; }

}  // namespace

Batch::Batch(const Model& model, const eh_kv_params& p) : model_(model) {
    const Config& c = model.config();
    if (p.max_seqs == 0 || p.max_step_tokens == 0 || p.max_step_entries == 0 || p.max_seq_tokens == 0)
        throw Error(EH_INVALID_ARGUMENT, "kv_init: max_seqs, max_step_tokens, max_step_entries and max_seq_tokens "
                                         "must all be > 0");
    if (!(p.memory_fraction >= 0.0f && p.memory_fraction <= 1.0f))
        throw Error(EH_INVALID_ARGUMENT, "kv_init: memory_fraction must be in [0, 1]");
    granted_.struct_size = sizeof(granted_);
    granted_.block_tokens = kBlockTokens;
    granted_.max_seqs = p.max_seqs;
    granted_.max_step_tokens = p.max_step_tokens;
    granted_.max_step_entries = std::min(p.max_step_entries, p.max_step_tokens);
    // gpt2 has a table of learned positions: no room past its end
    granted_.max_seq_tokens = c.arch == Arch::Gpt2 ? std::min(p.max_seq_tokens, c.n_ctx_train) : p.max_seq_tokens;

    const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * c.head_dim;
    const uint64_t block_bytes = 2ull * c.n_layer * kBlockTokens * kv_dim * sizeof(float);
    const uint64_t per_seq = (uint64_t(granted_.max_seq_tokens) + kBlockTokens - 1) / kBlockTokens;
    // No more blocks than every sequence at full length could hold.
    const uint64_t useful = per_seq * granted_.max_seqs;
    const uint64_t budget = p.budget_bytes
                                ? p.budget_bytes
                                : static_cast<uint64_t>(double(available_host_bytes()) *
                                                        (p.memory_fraction > 0.0f ? p.memory_fraction : 0.5));
    const uint64_t blocks = std::min<uint64_t>({useful, budget / block_bytes, UINT32_MAX});
    if (blocks == 0)
        throw Error(EH_INSUFFICIENT_VRAM, "kv_init: a budget of " + std::to_string(budget) +
                                              " bytes holds no KV block of " + std::to_string(block_bytes) + " bytes");
    // A pool smaller than one full sequence grants the context it holds.
    if (blocks < per_seq) granted_.max_seq_tokens = static_cast<uint32_t>(blocks * kBlockTokens);
    pool_ = std::make_unique<KvPool>(c.n_layer, kv_dim, kBlockTokens, static_cast<uint32_t>(blocks));
    granted_.total_blocks = pool_->total_blocks();
    granted_.block_bytes = pool_->block_bytes();
}

eh_kv_info Batch::info() const {
    eh_kv_info i = granted_;
    i.free_blocks = pool_->free_blocks();
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
    if (!entries || n_entries == 0) throw Error(EH_INVALID_ARGUMENT, "step: no entries");
    if (n_entries > granted_.max_step_entries)
        throw Error(EH_INVALID_ARGUMENT, "step: " + std::to_string(n_entries) + " entries exceed max_step_entries " +
                                             std::to_string(granted_.max_step_entries));
    const uint32_t stride = entries[0].struct_size;
    if (stride < sizeof(eh_step_entry))
        throw Error(EH_INVALID_ARGUMENT, "step: eh_step_entry.struct_size " + std::to_string(stride) +
                                             " is smaller than ABI 1.2's " + std::to_string(sizeof(eh_step_entry)));
    auto at = [&](uint32_t i) -> eh_step_entry& {
        return *reinterpret_cast<eh_step_entry*>(reinterpret_cast<char*>(entries) + size_t(i) * stride);
    };

    // Validate everything before changing anything.
    const uint32_t n_vocab = model_.config().n_vocab;
    uint64_t total_tokens = 0, blocks = 0;
    std::unordered_set<const Sequence*> seen;
    for (uint32_t i = 0; i < n_entries; ++i) {
        const eh_step_entry& e = at(i);
        auto* seq = static_cast<Sequence*>(e.seq);
        if (e.struct_size != stride) throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "struct_size differs from entry 0's");
        if (!seq || !owns(seq)) throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "not a live sequence of this model");
        if (!seen.insert(seq).second) throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "sequence appears twice");
        if (e.n_tokens == 0 || !e.tokens) throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "no tokens");
        if (e.flags & ~(EH_STEP_SAMPLE | EH_STEP_LOGITS))
            throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "unknown flags " + std::to_string(e.flags));
        for (uint32_t t = 0; t < e.n_tokens; ++t)
            if (e.tokens[t] < 0 || static_cast<uint32_t>(e.tokens[t]) >= n_vocab)
                throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "token " + std::to_string(e.tokens[t]) + " at index " +
                                                     std::to_string(t) + " is outside the vocabulary (0.." +
                                                     std::to_string(n_vocab - 1) + ")");
        if (uint64_t(seq->length()) + e.n_tokens > granted_.max_seq_tokens)
            throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "sequence of " + std::to_string(seq->length()) + " + " +
                                                 std::to_string(e.n_tokens) + " tokens exceeds max_seq_tokens " +
                                                 std::to_string(granted_.max_seq_tokens));
        if (e.flags & EH_STEP_SAMPLE) {
            if (!seq->sampler.ready()) throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "seq_set_sampling was never called");
            if (e.n_bias && (!e.bias_tokens || !e.bias_values))
                throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "n_bias > 0 with NULL bias arrays");
            for (uint32_t b = 0; b < e.n_bias; ++b) {
                if (e.bias_tokens[b] < 0 || static_cast<uint32_t>(e.bias_tokens[b]) >= n_vocab)
                    throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "bias token " + std::to_string(e.bias_tokens[b]) +
                                                         " is outside the vocabulary");
                if (!std::isfinite(e.bias_values[b]))
                    throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "bias values must be finite");
            }
            if (e.allowed) {
                bool any = false;
                for (uint32_t t = 0; t < n_vocab && !any; ++t) any = (e.allowed[t / 32] >> (t % 32)) & 1u;
                if (!any) throw Error(EH_INVALID_ARGUMENT, entry_name(i) + "the allowed-token mask allows no token");
            }
        }
        total_tokens += e.n_tokens;
        blocks += seq->blocks_needed(e.n_tokens);
    }
    if (total_tokens > granted_.max_step_tokens)
        throw Error(EH_INVALID_ARGUMENT, "step: " + std::to_string(total_tokens) + " tokens exceed max_step_tokens " +
                                             std::to_string(granted_.max_step_tokens));
    if (blocks > pool_->free_blocks())
        throw Error(EH_KV_FULL, "step: needs " + std::to_string(blocks) + " free KV blocks, " +
                                    std::to_string(pool_->free_blocks()) + " of " +
                                    std::to_string(pool_->total_blocks()) + " are free");

    std::vector<Slice> slices;
    std::vector<std::vector<float>> logits(n_entries);
    for (uint32_t i = 0; i < n_entries; ++i) {
        eh_step_entry& e = at(i);
        auto* seq = static_cast<Sequence*>(e.seq);
        seq->reserve(e.n_tokens);
        e.token = -1;
        if (e.flags) logits[i].resize(n_vocab);
        slices.push_back({seq, e.tokens, e.n_tokens, e.flags ? logits[i].data() : nullptr});
    }
    forward(model_, slices, nullptr, nullptr);
    for (uint32_t i = 0; i < n_entries; ++i) {
        eh_step_entry& e = at(i);
        auto* seq = static_cast<Sequence*>(e.seq);
        seq->commit(e.tokens, e.n_tokens);
        seq->has_logits = false;
        if (e.flags & EH_STEP_SAMPLE) {
            if (seq->gen_start == UINT32_MAX) seq->gen_start = seq->length();
            const StepBias bias{e.n_bias, e.bias_tokens, e.bias_values, e.allowed};
            e.token = seq->sampler.sample(logits[i].data(), n_vocab, seq->tokens(), seq->gen_start, bias);
        }
        if (e.flags & EH_STEP_LOGITS) {
            seq->logits.swap(logits[i]);
            seq->has_logits = true;
        }
    }
}

}  // namespace cpuref
