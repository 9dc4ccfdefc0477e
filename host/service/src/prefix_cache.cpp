#include "eh/service/prefix_cache.hpp"

#include <algorithm>

namespace eh::service {
namespace {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
    const size_t n = std::min(a.size(), b.size());
    return size_t(std::mismatch(a.begin(), a.begin() + long(n), b.begin()).first - a.begin());
}

}  // namespace

std::optional<PrefixCache::Match> PrefixCache::lookup(const std::string& scope, uint32_t adapter,
                                                      std::span<const int32_t> tokens, uint32_t limit) {
    auto best = entries_.end();
    size_t best_n = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->scope != scope || it->adapter != adapter) continue;
        const size_t n = std::min<size_t>(common_prefix(it->tokens, tokens), limit);
        if (n > best_n) {
            best_n = n;
            best = it;
        }
    }
    if (best == entries_.end() || best_n < min_match_) return std::nullopt;
    entries_.splice(entries_.begin(), entries_, best);
    return Match{entries_.front().seq, uint32_t(best_n)};
}

void PrefixCache::insert(const std::string& scope, uint32_t adapter, SeqId seq, std::vector<int32_t> tokens) {
    if (max_entries_ == 0 || tokens.size() < min_match_) {
        engine_.release(seq);
        return;
    }
    // Told before the entries it contains leave, so the blocks they share stay.
    if (index_) index_->add(tokens);
    // Entries the new one contains add nothing.
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->scope == scope && it->adapter == adapter && it->tokens.size() <= tokens.size() &&
            common_prefix(it->tokens, tokens) == it->tokens.size()) {
            engine_.release(it->seq);
            if (index_) index_->remove(it->tokens);
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
    entries_.push_front({scope, adapter, seq, std::move(tokens)});
    while (entries_.size() > max_entries_) evict_one();
}

bool PrefixCache::evict_one() {
    if (entries_.empty()) return false;
    engine_.release(entries_.back().seq);
    if (index_) index_->remove(entries_.back().tokens);
    entries_.pop_back();
    return true;
}

void PrefixCache::clear() {
    if (entries_.empty()) return;
    for (const Entry& e : entries_) engine_.release(e.seq);
    entries_.clear();
    if (index_) index_->clear();
}

void PrefixCache::forget_all() {
    entries_.clear();
    if (index_) index_->clear();
}

}  // namespace eh::service
