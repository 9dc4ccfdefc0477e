// M-RoPE positions of llama-cuda's sequences (qwen2vl; the rules are
// engine_host/mrope.hpp's). A token's rotation position differs from its KV
// index once an image laid out on a grid is in its sequence: the image's
// gh x gw tokens take gh * gw KV rows but move the text position on by
// max(gh, gw), and its own tokens turn by (p, p + r, p + c). The kernels
// rotate by the KV index (the fused decode attention, rope_store_kv), so
// the step hands them each token's shift from it per component
// (mrope_shift.cu turns Q and K by it first; two rotations of one pair add).
//
// As cpu-reference keeps it (sequence.hpp's next_pos): a sequence that ever
// held an image keeps, per position, the text position that follows it
// (ehp::mrope::place's `after`); entries past the sequence's length are
// stale, so a truncation (seq_truncate, a verify step's cut) needs nothing,
// and a step that is refused after place() leaves only stale entries. A
// sequence that never held an image keeps nothing: its shift is 0. Forks
// copy the prefix; a parked copy keeps the prefix it was parked with.
// Host only (tests/cuda/mrope_positions_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include <engine_host/mrope.hpp>
#include <engine_host/plugin_abi.h>

namespace llama_cuda {

class MropePositions {
public:
    // Per token, its rotation position minus its KV index: time, row, column.
    struct Shift {
        int32_t c[3] = {0, 0, 0};
    };

    // n tokens appended to `seq` (its length now `len`), with its spans
    // (checked: ImageSteps::take); out[i] gets token i's shift. Returns
    // whether any shift is nonzero.
    bool place(const void* seq, uint32_t len, uint32_t n, const eh_embd_span* spans, uint32_t n_spans, Shift* out) {
        bool grid = false;
        for (uint32_t j = 0; j < n_spans; ++j) grid = grid || (spans[j].flags & EH_SPAN_GRID);
        auto it = after_.find(seq);
        if (it == after_.end() && !grid) {
            for (uint32_t i = 0; i < n; ++i) out[i] = Shift{};
            return false;
        }
        std::vector<int32_t>& after = it != after_.end() ? it->second : after_[seq];
        for (size_t k = after.size(); k < len; ++k) after.push_back(int32_t(k) + 1);  // text before it knew
        after.resize(size_t(len) + n);
        pos_.resize(n);
        ehp::mrope::place(next(after, len), n, spans, n_spans, pos_.data(), after.data() + len);
        bool any = false;
        for (uint32_t i = 0; i < n; ++i) {
            const int32_t kv = int32_t(len + i);
            for (uint32_t c = 0; c < 3; ++c) {
                out[i].c[c] = pos_[i][c] - kv;
                any = any || out[i].c[c] != 0;
            }
        }
        return any;
    }

    // The text position the next token of `seq` (of length len) takes.
    int32_t next_position(const void* seq, uint32_t len) const {
        auto it = after_.find(seq);
        return it == after_.end() ? int32_t(len) : next(it->second, len);
    }

    // `dst` shares the first n positions of `src`.
    void fork(const void* src, const void* dst, uint32_t n) { copy(after_, src, after_, dst, n); }
    void forget(const void* seq) { after_.erase(seq); }
    // A parked copy of seq's first n positions (every park sets or clears
    // its handle's entry, so a handle the allocator hands out again never
    // reads an older copy's), and a sequence unparked from it.
    void park(const void* seq, uint32_t n, const void* parked) { copy(after_, seq, parked_, parked, n); }
    void unpark(const void* parked, const void* seq) { copy(parked_, parked, after_, seq, UINT32_MAX); }

    bool tracks(const void* seq) const { return after_.count(seq) != 0; }

private:
    using Map = std::unordered_map<const void*, std::vector<int32_t>>;
    static int32_t next(const std::vector<int32_t>& after, uint32_t len) {
        return len == 0 ? 0 : after.size() >= len ? after[len - 1] : int32_t(len);
    }
    static void copy(const Map& from, const void* src, Map& to, const void* dst, uint32_t n) {
        auto it = from.find(src);
        if (it == from.end()) {
            to.erase(dst);
            return;
        }
        const size_t k = std::min<size_t>(n, it->second.size());
        to[dst].assign(it->second.begin(), it->second.begin() + k);
    }

    Map after_, parked_;
    std::vector<ehp::mrope::Position> pos_;
};

}  // namespace llama_cuda
