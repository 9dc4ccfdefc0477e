#include "eh/service/speculation.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "eh/service/event_log.hpp"

namespace eh::service {

const char* spec_source_name(SpecSource s) {
    switch (s) {
    case SpecSource::Off: return "off";
    case SpecSource::Ngram: return "ngram";
    case SpecSource::DraftModel: return "draft_model";
    }
    return "off";
}

void check_spec_options(const SpecOptions& o) {
    auto bad = [](const std::string& m) { throw Error(Code::InvalidRequest, m); };
    if (o.draft_max < 1 || o.draft_max > kSpecMaxDraftTokens)
        bad(fmt::format("--spec-draft-max must be between 1 and {}; got {}", kSpecMaxDraftTokens, o.draft_max));
    if (o.ngram_max < 1 || o.ngram_max > kSpecMaxNgram)
        bad(fmt::format("--spec-ngram-max must be between 1 and {}; got {}", kSpecMaxNgram, o.ngram_max));
    if (o.ngram_min < 1 || o.ngram_min > o.ngram_max)
        bad(fmt::format("--spec-ngram-min must be between 1 and --spec-ngram-max ({}); got {}", o.ngram_max, o.ngram_min));
    if (o.max_batch < 1) bad("--spec-max-batch must be at least 1");
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> t, uint32_t n_min, uint32_t n_max, uint32_t k) {
    const size_t len = t.size();
    if (k == 0 || n_min == 0) return {};
    for (size_t n = std::min<size_t>(n_max, len > 0 ? len - 1 : 0); n >= n_min; --n) {
        const std::span<const int32_t> suffix = t.subspan(len - n);
        // The latest earlier occurrence: its continuation is the freshest guess.
        for (size_t at = len - n; at-- > 0;) {
            if (!std::equal(suffix.begin(), suffix.end(), t.begin() + ptrdiff_t(at))) continue;
            const size_t from = at + n, upto = std::min(len, from + k);
            return std::vector<int32_t>(t.begin() + ptrdiff_t(from), t.begin() + ptrdiff_t(upto));
        }
    }
    return {};
}

uint32_t adapt_draft_length(uint32_t proposed, uint32_t accepted, uint32_t k_max) {
    const uint32_t next = accepted >= proposed ? proposed + 1 : accepted + 1;
    return std::clamp(next, 1u, std::max(1u, k_max));
}

void adapt_pause(SpecState& st, uint32_t proposed, uint32_t accepted) {
    if (!proposed) return;
    st.rate = 0.75 * st.rate + 0.25 * double(accepted) / double(proposed);
    if (accepted > 0) {
        st.backoff = 0;
        return;
    }
    if (st.rate >= kSpecPauseBelow) return;
    st.backoff = std::min(kSpecMaxPause, st.backoff ? 2 * st.backoff : 2u);
    st.pause = st.backoff;
}

Speculator::Speculator(SpecOptions o, uint32_t engine_max_draft)
    : o_(std::move(o)), k_max_(std::min(o_.draft_max, engine_max_draft)) {}

Speculator::~Speculator() = default;

void Speculator::draft(std::span<Ask> asks) {
    if (off()) {
        for (Ask& a : asks) a.st->step.assign(1, a.tokens.back());
        return;
    }
    for (Ask& a : asks) {
        a.st->step.assign(1, a.tokens.back());
        if (!a.st->k) a.st->k = k_max_;
        a.cap = std::min({a.cap, a.st->k, k_max_});
        if (a.st->pause) {  // its drafts kept failing: not this step
            --a.st->pause;
            a.cap = 0;
        }
    }
    if (o_.source == SpecSource::Ngram) {
        for (Ask& a : asks) {
            if (!a.cap) continue;
            const std::vector<int32_t> d = ngram_draft(a.tokens, o_.ngram_min, o_.ngram_max, a.cap);
            a.st->step.insert(a.st->step.end(), d.begin(), d.end());
        }
    } else if (o_.source == SpecSource::DraftModel) {
        draft_model(asks);
    }
}

void Speculator::draft_model(std::span<Ask> asks) {
    SeqEngine& e = *o_.draft;
    const SeqLimits& lim = e.limits();
    // Each draft sequence is cut back to what it shares with its request
    // (keeping at least the last token to feed) and caught up; its first
    // step samples d1, and each later step feeds one draft to get the next.
    struct Run {
        Ask* ask;
        std::vector<int32_t> feed;
        bool drafts = true;  // false: only catching up this step
    };
    std::vector<Run> runs;
    size_t catch_up = kSpecCatchUpTokens;
    try {
        for (Ask& a : asks) {
            SpecState& st = *a.st;
            if (!a.cap || a.tokens.size() + a.cap > lim.max_seq_tokens) continue;
            if (!st.draft_seq) {
                st.draft_seq = e.create();
                eh_sampling_params g{};
                g.struct_size = sizeof(g);
                g.top_p = 1.0f;
                g.repetition_penalty = 1.0f;
                g.repetition_window = -1;
                e.set_sampling(st.draft_seq, g);  // greedy: the proposal is deterministic
                st.draft_tokens.clear();
            }
            const auto mis = std::mismatch(st.draft_tokens.begin(), st.draft_tokens.end(), a.tokens.begin(), a.tokens.end());
            const size_t keep = std::min<size_t>(size_t(mis.first - st.draft_tokens.begin()), a.tokens.size() - 1);
            if (keep < st.draft_tokens.size()) {
                e.truncate(st.draft_seq, uint32_t(keep));
                st.draft_tokens.resize(keep);
            }
            Run r{&a, std::vector<int32_t>(a.tokens.begin() + ptrdiff_t(keep), a.tokens.end())};
            if (r.feed.size() > 1) {  // behind by more than the next token: a bounded catch-up
                const size_t n = std::min(r.feed.size(), catch_up);
                catch_up -= n;
                if (n < r.feed.size()) {
                    r.feed.resize(n);
                    r.drafts = false;
                }
                if (r.feed.empty()) continue;
            }
            runs.push_back(std::move(r));
        }
        for (uint32_t round = 0; !runs.empty(); ++round) {
            std::vector<StepItem> items;
            std::vector<Run*> owners;
            uint32_t budget = lim.max_step_tokens;
            for (Run& r : runs) {
                if (budget == 0 || items.size() >= lim.max_step_entries) break;
                StepItem it;
                it.seq = r.ask->st->draft_seq;
                const uint32_t n = std::min<uint32_t>(uint32_t(r.feed.size()), budget);
                it.tokens = std::span<const int32_t>(r.feed).first(n);
                it.sample = r.drafts && n == r.feed.size();
                budget -= n;
                items.push_back(it);
                owners.push_back(&r);
            }
            if (!e.step(items)) throw Error(Code::VramOom, "the draft model's KV cache is full");
            failures_ = 0;  // it ran: the failures in a row end
            for (size_t i = 0; i < items.size(); ++i) {
                Run& r = *owners[i];
                SpecState& st = *r.ask->st;
                const size_t n = items[i].tokens.size();
                st.draft_tokens.insert(st.draft_tokens.end(), r.feed.begin(), r.feed.begin() + ptrdiff_t(n));
                r.feed.erase(r.feed.begin(), r.feed.begin() + ptrdiff_t(n));
                if (!items[i].sample) continue;
                st.step.push_back(items[i].token);
                if (st.step.size() - 1 < r.ask->cap) r.feed.assign(1, items[i].token);
            }
            std::erase_if(runs, [](const Run& r) { return r.feed.empty(); });
        }
    } catch (const std::exception& ex) {
        // No drafts this step, and none for these requests for a while (a
        // full draft cache would fail again at once); their sequences are
        // rebuilt from nothing after.
        log_event(spdlog::level::warn, "draft_model_failed", {{"message", ex.what()}, {"paused_steps", kSpecMaxPause}});
        for (Ask& a : asks) {
            drop(*a.st);
            a.st->step.resize(1);
            a.st->pause = kSpecMaxPause;
        }
        if (++failures_ >= kSpecDraftFailures) {
            off_reason_ = fmt::format("the draft model failed {} times in a row (last: {})", failures_, ex.what());
            off_.store(true, std::memory_order_release);
            log_event(spdlog::level::warn, "speculation_off", {{"reason", off_reason_}});
        }
    }
}

void Speculator::verified(SpecState& st, uint32_t accepted) {
    const uint32_t proposed = uint32_t(st.step.size() - 1);
    if (proposed) st.k = adapt_draft_length(proposed, accepted, k_max_);
    adapt_pause(st, proposed, accepted);
}

void Speculator::forget(SpecState& st) { drop(st); }

void Speculator::drop(SpecState& st) {
    if (st.draft_seq && o_.draft) o_.draft->release(st.draft_seq);
    st.draft_seq = 0;
    st.draft_tokens.clear();
}

}  // namespace eh::service
