#include "sequence.hpp"

#include <algorithm>

namespace cpuref {

Sequence::~Sequence() {
    for (uint32_t b : blocks_) pool_.release(b);
}

bool Sequence::shared_tail() const {
    const uint32_t B = pool_.block_tokens();
    const uint32_t len = length();
    if (len % B == 0 || len / B >= blocks_.size()) return false;
    return pool_.refs(blocks_[len / B]) > 1;
}

uint32_t Sequence::blocks_needed(uint32_t n) const {
    const uint32_t want = blocks_for(uint64_t(length()) + n);
    const uint32_t held = static_cast<uint32_t>(blocks_.size());
    return (want > held ? want - held : 0) + (n > 0 && shared_tail() ? 1 : 0);
}

void Sequence::reserve(uint32_t n) {
    if (n == 0) return;
    if (shared_tail()) {
        // copy on write: the other holders keep the original
        const uint32_t B = pool_.block_tokens();
        const uint32_t i = length() / B;
        const uint32_t fresh = pool_.take();
        pool_.copy(blocks_[i], fresh, length() % B);
        pool_.release(blocks_[i]);
        blocks_[i] = fresh;
    }
    const uint32_t want = blocks_for(uint64_t(length()) + n);
    while (blocks_.size() < want) blocks_.push_back(pool_.take());
}

void Sequence::commit(const int32_t* tokens, uint32_t n) {
    tokens_.insert(tokens_.end(), tokens, tokens + n);
}

void Sequence::truncate(uint32_t n) {
    if (n > length()) return;
    tokens_.resize(n);
    const uint32_t keep = blocks_for(n);
    while (blocks_.size() > keep) {
        pool_.release(blocks_.back());
        blocks_.pop_back();
    }
    // Output cut away entirely: the next sampling step starts it again.
    if (gen_start >= n) gen_start = std::numeric_limits<uint32_t>::max();
    has_logits = false;
}

std::unique_ptr<Sequence> Sequence::fork(uint32_t n) const {
    auto s = std::make_unique<Sequence>(pool_);
    s->tokens_.assign(tokens_.begin(), tokens_.begin() + std::min<size_t>(n, tokens_.size()));
    const uint32_t keep = blocks_for(s->tokens_.size());
    for (uint32_t i = 0; i < keep; ++i) {
        pool_.retain(blocks_[i]);
        s->blocks_.push_back(blocks_[i]);
    }
    if (gen_start < s->length()) s->gen_start = gen_start;
    return s;
}

}  // namespace cpuref
