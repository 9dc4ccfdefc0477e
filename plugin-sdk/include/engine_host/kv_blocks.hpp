// Header-only C++17 helper for plugins that implement ABI 1.2's batched
// calls. Optional, like plugin_abi.hpp. What it gives, with no opinion on
// where the KV rows live (host memory, device memory):
//   - ehp::BlockPool: reference counts and the free list of a fixed pool of
//     KV blocks;
//   - ehp::SeqBlocks: one sequence's tokens and the blocks holding them, with
//     fork (shared prefix), copy on write of a shared partial block, truncate;
//   - ehp::grant_kv: kv_init's arithmetic (what a budget holds, what is
//     granted);
//   - ehp::asked_kv_type / kv_type_name: kv_init's KV element type (1.4);
//   - ehp::check_step: every check step() (and 1.3's step_begin) must make
//     before it changes anything, with the ABI's messages.
#ifndef ENGINE_HOST_KV_BLOCKS_HPP
#define ENGINE_HOST_KV_BLOCKS_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <unordered_set>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/tensor_types.h>

namespace ehp {

class BlockPool {
public:
    BlockPool(uint32_t block_tokens, uint32_t n_blocks) : block_tokens_(block_tokens) {
        if (block_tokens == 0 || n_blocks == 0)
            throw Error(EH_INVALID_ARGUMENT, "KV pool needs at least one block of at least one token");
        refs_.assign(n_blocks, 0);
        free_.resize(n_blocks);
        // Lowest block ids on top of the stack.
        for (uint32_t i = 0; i < n_blocks; ++i) free_[i] = n_blocks - 1 - i;
    }
    uint32_t block_tokens() const { return block_tokens_; }
    uint32_t total_blocks() const { return static_cast<uint32_t>(refs_.size()); }
    uint32_t free_blocks() const { return static_cast<uint32_t>(free_.size()); }

    // A free block with one reference; the caller checked free_blocks().
    uint32_t take() {
        if (free_.empty()) throw Error(EH_KV_FULL, "no free KV block");
        const uint32_t b = free_.back();
        free_.pop_back();
        refs_[b] = 1;
        return b;
    }
    void retain(uint32_t block) { ++refs_[block]; }
    void release(uint32_t block) {
        if (refs_[block] == 0) throw Error(EH_INTERNAL, "KV block " + std::to_string(block) + " released twice");
        if (--refs_[block] == 0) free_.push_back(block);  // a stack: the last freed block is reused first
    }
    uint32_t refs(uint32_t block) const { return refs_[block]; }

private:
    uint32_t block_tokens_;
    std::vector<uint32_t> refs_;
    std::vector<uint32_t> free_;
};

// The tokens of one sequence and the blocks holding their KV rows. `copy`
// copies the first n_pos positions of every layer from block `from` to
// block `to` (copy on write of a shared, partly filled last block).
class SeqBlocks {
public:
    using CopyFn = std::function<void(uint32_t from, uint32_t to, uint32_t n_pos)>;

    SeqBlocks(BlockPool& pool, CopyFn copy) : pool_(pool), copy_(std::move(copy)) {}
    ~SeqBlocks() {
        for (uint32_t b : blocks_) pool_.release(b);
    }
    SeqBlocks(const SeqBlocks&) = delete;
    SeqBlocks& operator=(const SeqBlocks&) = delete;

    uint32_t length() const { return static_cast<uint32_t>(tokens_.size()); }
    const std::vector<int32_t>& tokens() const { return tokens_; }
    const std::vector<uint32_t>& blocks() const { return blocks_; }
    uint32_t block_tokens() const { return pool_.block_tokens(); }
    // Index of position `pos`'s row in a pool laid out block after block.
    uint64_t row(uint32_t pos) const {
        const uint32_t B = pool_.block_tokens();
        return uint64_t(blocks_[pos / B]) * B + pos % B;
    }

    // Free blocks that appending `n` tokens takes: new blocks past the ones
    // held, plus a copy of a shared, partly filled last block.
    uint32_t blocks_needed(uint32_t n) const {
        const uint32_t want = blocks_for(uint64_t(length()) + n);
        const uint32_t held = static_cast<uint32_t>(blocks_.size());
        return (want > held ? want - held : 0) + (n > 0 && shared_tail() ? 1 : 0);
    }
    // Takes those blocks so positions length() .. length()+n-1 are writable
    // by this sequence alone. The caller checked blocks_needed().
    void reserve(uint32_t n) {
        if (n == 0) return;
        if (shared_tail()) {
            const uint32_t B = pool_.block_tokens();
            const uint32_t i = length() / B;
            const uint32_t fresh = pool_.take();
            copy_(blocks_[i], fresh, length() % B);
            pool_.release(blocks_[i]);
            blocks_[i] = fresh;
        }
        const uint32_t want = blocks_for(uint64_t(length()) + n);
        while (blocks_.size() < want) blocks_.push_back(pool_.take());
    }
    // Appends tokens whose K/V the forward pass wrote into reserved rows.
    void commit(const int32_t* tokens, uint32_t n) { tokens_.insert(tokens_.end(), tokens, tokens + n); }
    // Sets the token at `pos`: a chained step (EH_STEP_CHAINED) commits its
    // token before the step in flight has sampled it.
    void set_token(uint32_t pos, int32_t token) {
        if (pos < tokens_.size()) tokens_[pos] = token;
    }
    // Keeps the first n tokens and returns the blocks past them.
    void truncate(uint32_t n) {
        if (n > length()) return;
        tokens_.resize(n);
        const uint32_t keep = blocks_for(n);
        while (blocks_.size() > keep) {
            pool_.release(blocks_.back());
            blocks_.pop_back();
        }
        // Output cut away entirely: the next sampling step starts it again.
        if (gen_start >= n) gen_start = kNoOutput;
    }
    // This (empty) sequence takes the first n tokens of src, sharing its blocks.
    void share_prefix(const SeqBlocks& src, uint32_t n) {
        tokens_.assign(src.tokens_.begin(), src.tokens_.begin() + std::min<size_t>(n, src.tokens_.size()));
        const uint32_t keep = blocks_for(tokens_.size());
        for (uint32_t i = 0; i < keep; ++i) {
            pool_.retain(src.blocks_[i]);
            blocks_.push_back(src.blocks_[i]);
        }
        if (src.gen_start < length()) gen_start = src.gen_start;
    }

    static constexpr uint32_t kNoOutput = std::numeric_limits<uint32_t>::max();
    // Tokens at positions >= gen_start were appended after the first step
    // that sampled for this sequence: its own output, which presence and
    // frequency penalties look at. Set by the step that first samples.
    uint32_t gen_start = kNoOutput;
    void mark_sampled() {
        if (gen_start == kNoOutput) gen_start = length();
    }

private:
    uint32_t blocks_for(uint64_t n_tokens) const {
        return static_cast<uint32_t>((n_tokens + pool_.block_tokens() - 1) / pool_.block_tokens());
    }
    bool shared_tail() const {
        const uint32_t B = pool_.block_tokens();
        const uint32_t len = length();
        if (len % B == 0 || len / B >= blocks_.size()) return false;
        return pool_.refs(blocks_[len / B]) > 1;
    }

    BlockPool& pool_;
    CopyFn copy_;
    std::vector<int32_t> tokens_;
    std::vector<uint32_t> blocks_;  // may run past length() after a reserve whose step failed
};

// The size of a 1.2 host's eh_kv_params: kv_init accepts any struct_size
// from here up (kv_type is read only from a 1.4 struct).
constexpr uint32_t kKvParamsMinSize = offsetof(eh_kv_params, reserved);

// The host's eh_kv_params as this plugin's struct: an older host's shorter
// struct is read only as far as it goes (never past its struct_size), the
// rest zero, struct_size kept. Throws INVALID_ARGUMENT below the 1.2 size.
inline eh_kv_params read_kv_params(const eh_kv_params* p) {
    if (!p) throw Error(EH_INVALID_ARGUMENT, "kv_init: NULL argument");
    if (p->struct_size < kKvParamsMinSize)
        throw Error(EH_INVALID_ARGUMENT, "kv_init: eh_kv_params.struct_size too small");
    eh_kv_params out{};
    std::memcpy(static_cast<void*>(&out), p, std::min<size_t>(p->struct_size, sizeof out));
    return out;
}

// (1.4) The KV element type kv_init is asked for; 0, the plugin's default,
// when the host's struct predates kv_type.
inline uint32_t asked_kv_type(const eh_kv_params& p) {
    return p.struct_size >= offsetof(eh_kv_params, reserved) + sizeof(p.reserved) ? p.kv_type : 0u;
}

// A KV type for messages: its eh_tensor_type name ("Q8_0"), "default" for 0
// as asked, "type N" for an id no one defined.
inline std::string kv_type_name(uint32_t type, bool asked = true) {
    if (type == 0 && asked) return "default";
    const eh_type_traits t = eh_tensor_type_traits(type);
    return t.name ? std::string(t.name) : "type " + std::to_string(type);
}

// kv_init's refusal of a type the plugin cannot store (EH_UNSUPPORTED).
[[noreturn]] inline void refuse_kv_type(uint32_t type, const std::string& why) {
    throw Error(EH_UNSUPPORTED, "kv_init: KV cache type " + kv_type_name(type) + " is not supported: " + why);
}

// kv_init's arithmetic. `limits` is what the host asked for, `block_bytes`
// the memory of one block (all layers), `budget` the bytes the blocks may
// take, `seq_cap` the longest sequence the model itself allows. Throws
// INVALID_ARGUMENT for zero limits, INSUFFICIENT_VRAM when the budget holds
// no block. A budget below one sequence of max_seq_tokens grants the
// shorter context it holds. total_blocks is filled; free_blocks is not.
inline eh_kv_info grant_kv(const eh_kv_params& p, uint32_t block_tokens, uint64_t block_bytes, uint64_t budget,
                           uint32_t seq_cap = std::numeric_limits<uint32_t>::max()) {
    if (p.max_seqs == 0 || p.max_step_tokens == 0 || p.max_step_entries == 0 || p.max_seq_tokens == 0)
        throw Error(EH_INVALID_ARGUMENT, "kv_init: max_seqs, max_step_tokens, max_step_entries and max_seq_tokens "
                                         "must all be > 0");
    if (!(p.memory_fraction >= 0.0f && p.memory_fraction <= 1.0f))
        throw Error(EH_INVALID_ARGUMENT, "kv_init: memory_fraction must be in [0, 1]");
    eh_kv_info g{};
    g.struct_size = sizeof(g);
    g.block_tokens = block_tokens;
    g.block_bytes = block_bytes;
    g.max_seqs = p.max_seqs;
    g.max_step_tokens = p.max_step_tokens;
    g.max_step_entries = std::min(p.max_step_entries, p.max_step_tokens);
    g.max_seq_tokens = std::min(p.max_seq_tokens, seq_cap);
    const uint64_t per_seq = (uint64_t(g.max_seq_tokens) + block_tokens - 1) / block_tokens;
    // No more blocks than every sequence at full length could hold.
    const uint64_t useful = per_seq * g.max_seqs;
    const uint64_t blocks = std::min<uint64_t>({useful, block_bytes ? budget / block_bytes : 0, UINT32_MAX});
    if (blocks == 0)
        throw Error(EH_INSUFFICIENT_VRAM, "kv_init: a budget of " + std::to_string(budget) +
                                              " bytes holds no KV block of " + std::to_string(block_bytes) + " bytes");
    if (blocks < per_seq) g.max_seq_tokens = static_cast<uint32_t>(blocks * block_tokens);
    g.total_blocks = static_cast<uint32_t>(blocks);
    return g;
}

// Entry i of a step's array (stride entries[0].struct_size).
inline eh_step_entry& step_entry(eh_step_entry* entries, uint32_t stride, uint32_t i) {
    return *reinterpret_cast<eh_step_entry*>(reinterpret_cast<char*>(entries) + size_t(i) * stride);
}

struct StepTotals {
    uint32_t stride = 0;
    uint64_t tokens = 0;
    uint64_t blocks = 0;  // free blocks the step takes
};

// Every check of step() (and step_begin) before anything changes.
// blocks_of(seq) returns the sequence's SeqBlocks, or NULL when seq is not a
// live sequence of this model; sampler_ready(seq) whether seq_set_sampling
// was called; chain_ready(seq) whether the step in flight samples for seq
// (an EH_STEP_CHAINED entry's condition; always false for step()).
// `extra_flags`: the flags past 1.3's the plugin serves (EH_STEP_HIDDEN, 1.5,
// for one with seq_hidden; EH_STEP_VERIFY, 1.6, for one that grants
// max_draft_tokens, whose entries are checked here against it); any other
// flag is refused as unknown. Throws
// INVALID_ARGUMENT naming the entry, KV_FULL when the free blocks do not
// suffice.
template <class BlocksOf, class SamplerReady, class ChainReady>
StepTotals check_step(eh_step_entry* entries, uint32_t n_entries, const eh_kv_info& granted, uint32_t free_blocks,
                      uint32_t n_vocab, BlocksOf&& blocks_of, SamplerReady&& sampler_ready,
                      ChainReady&& chain_ready, uint32_t extra_flags = 0) {
    auto name = [](uint32_t i) { return "step entry " + std::to_string(i) + ": "; };
    if (!entries || n_entries == 0) throw Error(EH_INVALID_ARGUMENT, "step: no entries");
    if (n_entries > granted.max_step_entries)
        throw Error(EH_INVALID_ARGUMENT, "step: " + std::to_string(n_entries) + " entries exceed max_step_entries " +
                                             std::to_string(granted.max_step_entries));
    StepTotals t;
    t.stride = entries[0].struct_size;
    if (t.stride < sizeof(eh_step_entry))
        throw Error(EH_INVALID_ARGUMENT, "step: eh_step_entry.struct_size " + std::to_string(t.stride) +
                                             " is smaller than ABI 1.2's " + std::to_string(sizeof(eh_step_entry)));
    std::unordered_set<const eh_seq*> seen;
    uint64_t drafts = 0;  // (1.6) over the step's verify entries
    for (uint32_t i = 0; i < n_entries; ++i) {
        const eh_step_entry& e = step_entry(entries, t.stride, i);
        if (e.struct_size != t.stride) throw Error(EH_INVALID_ARGUMENT, name(i) + "struct_size differs from entry 0's");
        const SeqBlocks* seq = e.seq ? blocks_of(e.seq) : nullptr;
        if (!seq) throw Error(EH_INVALID_ARGUMENT, name(i) + "not a live sequence of this model");
        if (!seen.insert(e.seq).second) throw Error(EH_INVALID_ARGUMENT, name(i) + "sequence appears twice");
        if (e.flags & ~(EH_STEP_SAMPLE | EH_STEP_LOGITS | EH_STEP_CHAINED | extra_flags))
            throw Error(EH_INVALID_ARGUMENT, name(i) + "unknown flags " + std::to_string(e.flags));
        const bool chained = (e.flags & EH_STEP_CHAINED) != 0;
        if (e.flags & EH_STEP_VERIFY) {  // 1.6: [t, d1..dk], sampled, for step() alone
            if (!(e.flags & EH_STEP_SAMPLE) || (e.flags & (EH_STEP_LOGITS | EH_STEP_HIDDEN | EH_STEP_CHAINED)))
                throw Error(EH_INVALID_ARGUMENT, name(i) + "EH_STEP_VERIFY needs EH_STEP_SAMPLE and takes none of "
                                                           "EH_STEP_LOGITS, EH_STEP_HIDDEN, EH_STEP_CHAINED");
            if (e.n_tokens < 2 || e.n_tokens - 1 > granted.max_draft_tokens)
                throw Error(EH_INVALID_ARGUMENT, name(i) + "EH_STEP_VERIFY carries " +
                                                     std::to_string(e.n_tokens ? e.n_tokens - 1 : 0) +
                                                     " draft tokens; 1 to max_draft_tokens " +
                                                     std::to_string(granted.max_draft_tokens) + " may be verified");
            drafts += e.n_tokens - 1;
        }
        if (chained) {
            if (e.n_tokens != 1)
                throw Error(EH_INVALID_ARGUMENT, name(i) + "a chained entry (EH_STEP_CHAINED) takes exactly 1 token, not " +
                                                     std::to_string(e.n_tokens));
            if (!chain_ready(e.seq))
                throw Error(EH_INVALID_ARGUMENT, name(i) + "EH_STEP_CHAINED, but no step in flight samples for "
                                                           "this sequence");
        } else if (e.n_tokens == 0 || !e.tokens) {
            throw Error(EH_INVALID_ARGUMENT, name(i) + "no tokens");
        }
        for (uint32_t k = 0; k < e.n_tokens && !chained; ++k)
            if (e.tokens[k] < 0 || static_cast<uint32_t>(e.tokens[k]) >= n_vocab)
                throw Error(EH_INVALID_ARGUMENT, name(i) + "token " + std::to_string(e.tokens[k]) + " at index " +
                                                     std::to_string(k) + " is outside the vocabulary (0.." +
                                                     std::to_string(n_vocab - 1) + ")");
        if (uint64_t(seq->length()) + e.n_tokens > granted.max_seq_tokens)
            throw Error(EH_INVALID_ARGUMENT, name(i) + "sequence of " + std::to_string(seq->length()) + " + " +
                                                 std::to_string(e.n_tokens) + " tokens exceeds max_seq_tokens " +
                                                 std::to_string(granted.max_seq_tokens));
        if (e.flags & EH_STEP_SAMPLE) {
            if (!sampler_ready(e.seq)) throw Error(EH_INVALID_ARGUMENT, name(i) + "seq_set_sampling was never called");
            if (e.n_bias && (!e.bias_tokens || !e.bias_values))
                throw Error(EH_INVALID_ARGUMENT, name(i) + "n_bias > 0 with NULL bias arrays");
            for (uint32_t b = 0; b < e.n_bias; ++b) {
                if (e.bias_tokens[b] < 0 || static_cast<uint32_t>(e.bias_tokens[b]) >= n_vocab)
                    throw Error(EH_INVALID_ARGUMENT, name(i) + "bias token " + std::to_string(e.bias_tokens[b]) +
                                                         " is outside the vocabulary");
                if (!std::isfinite(e.bias_values[b]))
                    throw Error(EH_INVALID_ARGUMENT, name(i) + "bias values must be finite");
            }
            if (e.allowed) {
                bool any = false;
                for (uint32_t w = 0; w < (n_vocab + 31) / 32 && !any; ++w) {
                    const uint32_t valid = w + 1 < (n_vocab + 31) / 32 || n_vocab % 32 == 0
                                               ? 0xffffffffu
                                               : (1u << (n_vocab % 32)) - 1u;
                    any = (e.allowed[w] & valid) != 0;
                }
                if (!any) throw Error(EH_INVALID_ARGUMENT, name(i) + "the allowed-token mask allows no token");
            }
        }
        t.tokens += e.n_tokens;
        t.blocks += seq->blocks_needed(e.n_tokens);
    }
    if (drafts > granted.max_step_entries)
        throw Error(EH_INVALID_ARGUMENT, "step: its verify entries carry " + std::to_string(drafts) +
                                             " draft tokens, more than max_step_entries " +
                                             std::to_string(granted.max_step_entries));
    if (t.tokens > granted.max_step_tokens)
        throw Error(EH_INVALID_ARGUMENT, "step: " + std::to_string(t.tokens) + " tokens exceed max_step_tokens " +
                                             std::to_string(granted.max_step_tokens));
    if (t.blocks > free_blocks)
        throw Error(EH_KV_FULL, "step: needs " + std::to_string(t.blocks) + " free KV blocks, " +
                                    std::to_string(free_blocks) + " of " + std::to_string(granted.total_blocks) +
                                    " are free");
    return t;
}

// step()'s checks: no step is in flight, so no entry may be chained.
template <class BlocksOf, class SamplerReady>
StepTotals check_step(eh_step_entry* entries, uint32_t n_entries, const eh_kv_info& granted, uint32_t free_blocks,
                      uint32_t n_vocab, BlocksOf&& blocks_of, SamplerReady&& sampler_ready) {
    return check_step(entries, n_entries, granted, free_blocks, n_vocab, blocks_of, sampler_ready,
                      [](eh_seq*) { return false; });
}

}  // namespace ehp

#endif  // ENGINE_HOST_KV_BLOCKS_HPP
