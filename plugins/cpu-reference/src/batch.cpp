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


// An entry's spans (ABI 1.6 seq_embd_spans) lie within its tokens, in
// order, without overlap, on an entry that appends its own tokens.
void check_spans(const eh_step_entry& e, uint32_t i, const std::vector<eh_embd_span>& spans) {
    const std::string at = "step entry " + std::to_string(i) + ": ";
    if (spans.empty()) return;
    if (e.flags & (EH_STEP_CHAINED | EH_STEP_VERIFY))
        throw Error(EH_INVALID_ARGUMENT, at + "embedding spans on an EH_STEP_CHAINED or EH_STEP_VERIFY entry");
    uint64_t next = 0;
    for (size_t j = 0; j < spans.size(); ++j) {
        const eh_embd_span& s = spans[j];
        if (s.count == 0 || !s.rows || s.first < next || uint64_t(s.first) + s.count > e.n_tokens)
            throw Error(EH_INVALID_ARGUMENT, at + "embedding span " + std::to_string(j) + " (first " +
                                                 std::to_string(s.first) + ", count " + std::to_string(s.count) +
                                                 ") is empty, has no rows, overlaps the one before or ends past the " +
                                                 std::to_string(e.n_tokens) + " tokens");
        if ((s.flags & EH_SPAN_GRID) && (s.grid_width == 0 || s.count % s.grid_width != 0))
            throw Error(EH_INVALID_ARGUMENT, at + "embedding span " + std::to_string(j) + " is a grid of width " +
                                                 std::to_string(s.grid_width) + " that does not divide its " +
                                                 std::to_string(s.count) + " positions");
        next = uint64_t(s.first) + s.count;
    }
}

}  // namespace

Batch::Batch(const Model& model, const eh_kv_params& p) : model_(model) {
    const Config& c = model.config();
    const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * c.head_dim;
    // 0, the default, is F32 (eh_tensor_type 0): what this plugin always stored
    const uint32_t kv_type = ehp::asked_kv_type(p);
    const uint64_t block_bytes = 2ull * c.n_layer * kBlockTokens * KvPool::row_bytes(kv_type, kv_dim);
    const uint64_t budget = p.budget_bytes
                                ? p.budget_bytes
                                : static_cast<uint64_t>(double(available_host_bytes()) *
                                                        (p.memory_fraction > 0.0f ? p.memory_fraction : 0.5));
    // gpt2 has a table of learned positions: no room past its end
    const uint32_t seq_cap = c.arch == Arch::Gpt2 ? c.n_ctx_train : UINT32_MAX;
    granted_ = ehp::grant_kv(p, kBlockTokens, block_bytes, budget, seq_cap);
    pool_ = std::make_unique<KvPool>(c.n_layer, kv_dim, kBlockTokens, granted_.total_blocks, kv_type);
    granted_.kv_type = kv_type;
    granted_.max_draft_tokens = std::min(kMaxDraftTokens, granted_.max_step_tokens - 1);
}

eh_kv_info Batch::info() const {
    eh_kv_info i = granted_;
    i.free_blocks = pool_->blocks().free_blocks();
    return i;
}

std::unique_ptr<Sequence> Batch::create() {
    if (live_.size() >= granted_.max_seqs)
        throw Error(EH_NO_CAPACITY, "seq_create: " + std::to_string(live_.size()) +
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
        throw Error(EH_NO_CAPACITY, "seq_fork: " + std::to_string(live_.size()) +
                                             " sequences are alive, the most kv_init granted");
    auto s = src.fork(n_tokens);
    live_.insert(s.get());
    return s;
}

void Batch::expect_idle(const char* call) const {
    if (!flight_.empty())
        throw Error(EH_BUSY, std::string(call) + ": a step is in flight (call step_end first)");
}

void Batch::step(eh_step_entry* entries, uint32_t n_entries) {
    expect_idle("step");
    const std::vector<int32_t> tokens = run(entries, n_entries, false);
    const uint32_t stride = entries[0].struct_size;
    for (uint32_t i = 0; i < n_entries; ++i) ehp::step_entry(entries, stride, i).token = tokens[i];
}

void Batch::begin(eh_step_entry* entries, uint32_t n_entries) {
    if (flight_.size() >= 2) throw Error(EH_BUSY, "step_begin: two steps are in flight (call step_end first)");
    const uint32_t stride = entries && n_entries ? entries[0].struct_size : 0;
    for (uint32_t i = 0; i < n_entries && stride >= sizeof(eh_step_entry); ++i)
        if (ehp::step_entry(entries, stride, i).flags & EH_STEP_VERIFY)
            throw Error(EH_INVALID_ARGUMENT, "step entry " + std::to_string(i) +
                                                 ": EH_STEP_VERIFY is for step() only, not step_begin");
    std::vector<int32_t> tokens = run(entries, n_entries, true);
    flight_.push_back({next_step_, std::move(tokens)});
}

void Batch::end(int32_t* out_tokens, uint32_t n_entries) {
    if (flight_.empty()) throw Error(EH_INVALID_ARGUMENT, "step_end: no step is in flight");
    if (n_entries != flight_.front().tokens.size())
        throw Error(EH_INVALID_ARGUMENT, "step_end: n_entries " + std::to_string(n_entries) + " differs from the step's " +
                                             std::to_string(flight_.front().tokens.size()));
    if (!out_tokens) throw Error(EH_INVALID_ARGUMENT, "step_end: out_tokens is NULL");
    std::copy(flight_.front().tokens.begin(), flight_.front().tokens.end(), out_tokens);
    flight_.erase(flight_.begin());
}

std::vector<int32_t> Batch::run(eh_step_entry* entries, uint32_t n_entries, bool chain_ok) {
    const uint32_t n_vocab = model_.config().n_vocab;
    // Each sequence's spans are for this step only, whatever becomes of it.
    std::vector<std::vector<eh_embd_span>> spans(n_entries);
    if (entries && n_entries && entries[0].struct_size >= sizeof(eh_step_entry))
        for (uint32_t i = 0; i < n_entries; ++i)
            if (auto* s = static_cast<Sequence*>(ehp::step_entry(entries, entries[0].struct_size, i).seq); owns(s))
                spans[i].swap(s->spans);
    // A chained entry needs the step in flight (the newest one begun) to
    // have sampled for its sequence.
    const uint64_t in_flight = flight_.empty() ? 0 : flight_.back().id;
    const ehp::StepTotals totals = ehp::check_step(
        entries, n_entries, granted_, pool_->blocks().free_blocks(), n_vocab,
        [&](eh_seq* s) -> const ehp::SeqBlocks* {
            auto* seq = static_cast<Sequence*>(s);
            return owns(seq) ? &seq->blocks : nullptr;
        },
        [](eh_seq* s) { return static_cast<Sequence*>(s)->sampler.ready(); },
        [&](eh_seq* s) { return chain_ok && in_flight && static_cast<Sequence*>(s)->sampled_in == in_flight; },
        EH_STEP_HIDDEN | (granted_.max_draft_tokens ? EH_STEP_VERIFY : 0u));
    auto at = [&](uint32_t i) -> eh_step_entry& { return ehp::step_entry(entries, totals.stride, i); };
    for (uint32_t i = 0; i < n_entries; ++i) check_spans(at(i), i, spans[i]);
    if (in_flight)
        for (uint32_t i = 0; i < n_entries; ++i)
            if (at(i).flags & (EH_STEP_LOGITS | EH_STEP_HIDDEN))
                throw Error(EH_INVALID_ARGUMENT, "step entry " + std::to_string(i) + ": " +
                                                     ((at(i).flags & EH_STEP_LOGITS) ? "EH_STEP_LOGITS" : "EH_STEP_HIDDEN") +
                                                     " on a step begun while another is in flight");
    const uint64_t id = ++next_step_;

    std::vector<Slice> slices;
    std::vector<std::vector<float>> logits(n_entries), hidden(n_entries);
    std::vector<int32_t> chained(n_entries, -1);
    auto tokens_of = [&](uint32_t i) -> const int32_t* {
        return (at(i).flags & EH_STEP_CHAINED) ? &chained[i] : at(i).tokens;
    };
    for (uint32_t i = 0; i < n_entries; ++i) {
        eh_step_entry& e = at(i);
        auto* seq = static_cast<Sequence*>(e.seq);
        if (e.flags & EH_STEP_CHAINED) chained[i] = seq->last_sample;
        seq->blocks.reserve(e.n_tokens);
        const bool verify = (e.flags & EH_STEP_VERIFY) != 0;
        if (e.flags & (EH_STEP_SAMPLE | EH_STEP_LOGITS)) logits[i].resize(size_t(verify ? e.n_tokens : 1) * n_vocab);
        if (e.flags & EH_STEP_HIDDEN) hidden[i].resize(model_.config().n_embd);
        slices.push_back({seq, tokens_of(i), e.n_tokens, logits[i].empty() ? nullptr : logits[i].data(),
                          hidden[i].empty() ? nullptr : hidden[i].data(), verify, spans[i].data(),
                          uint32_t(spans[i].size())});
    }
    forward(model_, slices, nullptr, nullptr);
    std::vector<int32_t> out(n_entries, -1);
    for (uint32_t i = 0; i < n_entries; ++i) {
        eh_step_entry& e = at(i);
        auto* seq = static_cast<Sequence*>(e.seq);
        // A verify entry's drafts go in after its first token: they are the
        // sequence's own output as much as that one.
        const uint32_t first = (e.flags & EH_STEP_VERIFY) ? 1 : e.n_tokens;
        seq->blocks.commit(tokens_of(i), first);
        if (first < e.n_tokens) {
            seq->blocks.mark_sampled();
            seq->blocks.commit(tokens_of(i) + first, e.n_tokens - first);
        }
        seq->has_logits = false;
        seq->has_hidden = false;
        if (e.flags & EH_STEP_VERIFY) {
            e.n_accepted = verify(*seq, e, logits[i]);
            out[i] = e.token;
            seq->sampled_in = id;
            seq->last_sample = out[i];
        } else if (e.flags & EH_STEP_SAMPLE) {
            seq->blocks.mark_sampled();
            const StepBias bias{e.n_bias, e.bias_tokens, e.bias_values, e.allowed};
            out[i] = seq->sampler.sample(logits[i].data(), n_vocab, seq->tokens(), seq->blocks.gen_start, bias);
            seq->sampled_in = id;
            seq->last_sample = out[i];
        }
        if (e.flags & EH_STEP_LOGITS) {
            seq->logits.swap(logits[i]);
            seq->has_logits = true;
        }
        if (e.flags & EH_STEP_HIDDEN) {
            seq->hidden.swap(hidden[i]);
            seq->has_hidden = true;
        }
    }
    return out;
}

uint32_t Batch::verify(Sequence& seq, eh_step_entry& e, const std::vector<float>& logits) {
    const uint32_t n_vocab = model_.config().n_vocab, k = e.n_tokens - 1;
    // The sequence holds t, d1..dk; position j's history ends at d(j-1).
    const uint32_t base = seq.length() - k;
    const StepBias bias{e.n_bias, e.bias_tokens, e.bias_values, e.allowed};
    auto at = [&](uint32_t j) {  // p_j, after t, d1..d(j-1)
        return seq.sampler.distribution(&logits[size_t(j - 1) * n_vocab], n_vocab, seq.tokens().data(), base + j - 1,
                                        seq.blocks.gen_start, bias);
    };
    uint32_t m = 0;
    for (; m < k; ++m) {
        const Distribution d = at(m + 1);
        if (!seq.sampler.accept(d, e.tokens[m + 1])) {
            e.token = seq.sampler.draw_without(d, e.tokens[m + 1]);
            break;
        }
    }
    if (m == k) e.token = seq.sampler.draw(at(k + 1));
    seq.blocks.truncate(base + m);  // the rejected drafts leave no trace
    return m;
}

}  // namespace cpuref
