#include "eh/service/prefix_cache.hpp"

#include <algorithm>

#include "eh/service/event_log.hpp"

namespace eh::service {
namespace {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
    const size_t n = std::min(a.size(), b.size());
    return size_t(std::mismatch(a.begin(), a.begin() + long(n), b.begin()).first - a.begin());
}

// `inner` holds nothing `outer` does not: its tokens start outer's.
bool contains(std::span<const int32_t> outer, std::span<const int32_t> inner) {
    return inner.size() <= outer.size() && common_prefix(outer, inner) == inner.size();
}

}  // namespace

PrefixCache::PrefixCache(SeqEngine& engine, uint32_t min_match, size_t max_entries,
                         std::unique_ptr<KvBlockIndex> index, uint64_t host_bytes, HostTierStats* host_stats)
    : engine_(engine),
      min_match_(min_match ? min_match : 1),
      max_entries_(max_entries),
      index_(std::move(index)),
      host_budget_(engine.can_park() ? host_bytes : 0),
      stats_(host_stats) {
    publish();
}

std::optional<PrefixCache::Match> PrefixCache::lookup(const std::string& scope, uint32_t adapter,
                                                      std::span<const int32_t> tokens, uint32_t limit,
                                                      uint32_t reserve_blocks) {
    auto best = entries_.end();
    size_t best_n = 0;
    const auto find_best = [&] {
        best = entries_.end();
        best_n = 0;
        for (auto it = entries_.begin(); it != entries_.end(); ++it) {
            if (it->scope != scope || it->adapter != adapter) continue;
            const size_t n = std::min<size_t>(common_prefix(it->tokens, tokens), limit);
            if (n > best_n) {
                best_n = n;
                best = it;
            }
        }
    };
    find_best();
    // A parked entry is worth its copy when it gives at least a block more.
    auto host = parked_.end();
    size_t host_n = best_n + min_match_ - 1;
    for (auto it = parked_.begin(); it != parked_.end(); ++it) {
        if (it->scope != scope || it->adapter != adapter) continue;
        const size_t n = std::min<size_t>(common_prefix(it->tokens, tokens), limit);
        if (n > host_n) {
            host_n = n;
            host = it;
        }
    }
    if (host != parked_.end() && host_n >= min_match_) {
        if (restore(host, reserve_blocks)) return Match{entries_.front().seq, uint32_t(host_n)};
        find_best();  // a failed restore may have evicted device entries for room
    }
    if (best != entries_.end() && best_n >= min_match_) {
        entries_.splice(entries_.begin(), entries_, best);
        return Match{entries_.front().seq, uint32_t(best_n)};
    }
    return std::nullopt;
}

bool PrefixCache::restore(std::list<ParkedEntry>::iterator it, uint32_t reserve_blocks) {
    if (max_entries_ == 0) return false;
    const uint32_t B = engine_.limits().block_tokens;
    const uint32_t need = uint32_t((it->tokens.size() + B - 1) / B) + reserve_blocks;
    parked_.splice(parked_.begin(), parked_, it);  // used: the last to leave for room
    const ParkedEntry& p = *it;
    // Device entries make room for it (blocks, and a sequence of the
    // cache's), least recently used first, parked in turn while the budget
    // takes them, never at its cost.
    while (!entries_.empty() && (engine_.free_blocks() < need || entries_.size() >= max_entries_)) evict_back(&p);
    if (engine_.free_blocks() < need) {
        publish();
        return false;
    }
    SeqId seq = 0;
    try {
        seq = engine_.unpark(p.id, p.tokens);
    } catch (const Error& e) {
        // The engine refused its own copy: it is of no use any more.
        log_event(spdlog::level::warn, "host_tier_restore_failed", {{"tokens", p.tokens.size()}, {"error", e.what()}});
        drop_parked(it);
        publish();
        return false;
    }
    if (!seq) {
        publish();
        return false;
    }
    if (stats_) {
        stats_->restores.fetch_add(1);
        stats_->restore_bytes.fetch_add(p.bytes);
    }
    if (index_) index_->add(p.tokens);
    entries_.push_front({p.scope, p.adapter, seq, p.tokens});
    publish();
    return true;
}

void PrefixCache::evict_back(const ParkedEntry* keep) {
    park(entries_.back(), keep);
    engine_.release(entries_.back().seq);
    if (index_) index_->remove(entries_.back().tokens);
    entries_.pop_back();
}

void PrefixCache::insert(const std::string& scope, uint32_t adapter, SeqId seq, std::vector<int32_t> tokens) {
    if (max_entries_ == 0 || tokens.size() < min_match_) {
        engine_.release(seq);
        return;
    }
    // Told before the entries it contains leave, so the blocks they share stay.
    if (index_) index_->add(tokens);
    // Entries the new one contains add nothing, on either tier.
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->scope == scope && it->adapter == adapter && contains(tokens, it->tokens)) {
            engine_.release(it->seq);
            if (index_) index_->remove(it->tokens);
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
    for (auto it = parked_.begin(); it != parked_.end();) {
        auto next = std::next(it);
        if (it->scope == scope && it->adapter == adapter && contains(tokens, it->tokens)) drop_parked(it);
        it = next;
    }
    entries_.push_front({scope, adapter, seq, std::move(tokens)});
    while (entries_.size() > max_entries_) evict_one();
    publish();
}

bool PrefixCache::evict_one() {
    if (entries_.empty()) return false;
    evict_back(nullptr);
    publish();
    return true;
}

bool PrefixCache::park(const Entry& e, const ParkedEntry* keep) {
    if (!host_budget_) return false;
    // A parked entry holding all of it already (it was restored, then
    // evicted unchanged): nothing to copy.
    for (auto& p : parked_)
        if (p.scope == e.scope && p.adapter == e.adapter && contains(p.tokens, e.tokens)) return false;
    for (;;) {
        SeqEngine::Parked got;
        try {
            got = engine_.park(e.seq, uint32_t(e.tokens.size()), host_budget_ - host_used_);
        } catch (const Error& err) {
            log_event(spdlog::level::warn, "host_tier_park_failed", {{"tokens", e.tokens.size()}, {"error", err.what()}});
            return false;
        }
        if (got.id) {
            // Parked entries it contains add nothing.
            for (auto it = parked_.begin(); it != parked_.end();) {
                auto next = std::next(it);
                if (&*it != keep && it->scope == e.scope && it->adapter == e.adapter && contains(e.tokens, it->tokens))
                    drop_parked(it);
                it = next;
            }
            parked_.push_front({e.scope, e.adapter, got.id, got.bytes, e.tokens});
            host_used_ += got.bytes;
            if (stats_) {
                stats_->parks.fetch_add(1);
                stats_->park_bytes.fetch_add(got.bytes);
            }
            return true;
        }
        if (got.bytes > host_budget_) {
            if (stats_) stats_->too_large.fetch_add(1);
            return false;
        }
        // It fits the budget: the least recently used parked entries leave
        // until it fits what is free. (None left and still refused: the
        // host memory itself ran out.)
        if (got.bytes <= host_budget_ - host_used_ || !drop_parked_lru(keep)) return false;
    }
}

bool PrefixCache::drop_parked_lru(const ParkedEntry* keep) {
    for (auto it = parked_.end(); it != parked_.begin();) {
        --it;
        if (&*it == keep) continue;
        drop_parked(it);
        return true;
    }
    return false;
}

void PrefixCache::drop_parked(std::list<ParkedEntry>::iterator it) {
    engine_.drop_parked(it->id);
    host_used_ -= it->bytes;
    parked_.erase(it);
    if (stats_) stats_->dropped.fetch_add(1);
}

void PrefixCache::clear() {
    for (const Entry& e : entries_) engine_.release(e.seq);
    entries_.clear();
    for (const ParkedEntry& p : parked_) engine_.drop_parked(p.id);
    parked_.clear();
    host_used_ = 0;
    if (index_) index_->clear();
    publish();
}

void PrefixCache::forget_all() {
    entries_.clear();
    parked_.clear();
    host_used_ = 0;
    if (index_) index_->clear();
    publish();
}

void PrefixCache::publish() {
    if (!stats_) return;
    stats_->budget_bytes = host_budget_;
    stats_->used_bytes = host_used_;
    stats_->entries = parked_.size();
}

}  // namespace eh::service
