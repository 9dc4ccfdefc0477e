// Speculative decoding's host half. The engine verifies (ABI 1.6
// EH_STEP_VERIFY: a step entry [t, d1..dk] returns how many drafts it
// accepted and the token after them); this decides where the drafts come
// from and how many:
//   - the source: an n-gram lookup in the request's own tokens (prompt
//     lookup: the tokens that followed the latest earlier occurrence of its
//     last n tokens; no model), or a draft model, a smaller model of the
//     same vocabulary with sequences of its own, decoding greedily;
//   - the length: each request's own, adapted to its acceptance (one more
//     after a step that accepted every draft, the accepted count plus one
//     after one that did not), within [1, draft_max];
//   - pauses: a request whose drafts keep failing (none accepted, and its
//     running acceptance below kSpecPauseBelow) stops drafting for 2 steps,
//     then 4, 8, .. kSpecMaxPause while it keeps failing; an accepted draft
//     ends that. A verify step costs more than a plain one (more tokens, and
//     no decode graph on the CUDA plugins), so drafts that never land cost;
//   - when: only while at most max_batch requests decode;
//   - catching up: a step feeds the draft model at most kSpecCatchUpTokens
//     of the requests' tokens it lacks (a new prompt); a request still
//     behind drafts nothing that step;
//   - failing: a draft model that fails (its cache full, a plugin error)
//     pauses those requests' drafting; kSpecDraftFailures failures in a row
//     turn speculation off, with the reason in /health. A verify entry of
//     k drafts costs the step k + 1 tokens; with many sequences a step is
//     no longer bound by reading the weights once, and extra tokens cost
//     time that fewer accepted tokens do not repay (docs/http-api.md).
// The draft model's sequences mirror the requests' tokens: before drafting,
// each is cut back to what it shares with its request and caught up.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eh/service/seq_engine.hpp"

namespace eh::service {

enum class SpecSource { Off, Ngram, DraftModel };
const char* spec_source_name(SpecSource s);  // "off", "ngram", "draft_model"

// The documented limits of the flags.
inline constexpr uint32_t kSpecMaxDraftTokens = 16;   // --spec-draft-max
inline constexpr uint32_t kSpecMaxNgram = 16;         // --spec-ngram-max

struct SpecOptions {
    SpecSource source = SpecSource::Off;
    uint32_t draft_max = 4;      // --spec-draft-max: most drafts one verify carries (1..kSpecMaxDraftTokens)
    uint32_t ngram_min = 1;      // --spec-ngram-min: the shortest suffix looked up
    uint32_t ngram_max = 3;      // --spec-ngram-max: the longest (tried first)
    uint32_t max_batch = 8;      // --spec-max-batch: off while more requests decode
    std::string draft_name;      // the draft model's file, for /health
    std::shared_ptr<SeqEngine> draft;  // DraftModel: its engine (its own KV)
};

// Throws eh::Error(InvalidRequest) naming the flag when a value is out of
// its documented range.
void check_spec_options(const SpecOptions& o);

// Prompt lookup: the (up to) k tokens that followed the latest earlier
// occurrence of the last n tokens, n from n_max down to n_min; empty if none.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, uint32_t n_min, uint32_t n_max, uint32_t k);

// A request's next draft length after a verify of `proposed` drafts that
// accepted `accepted`.
uint32_t adapt_draft_length(uint32_t proposed, uint32_t accepted, uint32_t k_max);

inline constexpr double kSpecPauseBelow = 0.3;   // running acceptance that pauses a failing request
inline constexpr uint32_t kSpecMaxPause = 64;    // steps, the longest pause
inline constexpr uint32_t kSpecDraftFailures = 3; // draft model failures in a row that turn speculation off
inline constexpr uint32_t kSpecCatchUpTokens = 256;  // tokens a step feeds the draft model to catch requests up

// One request's speculation state (lives in the scheduler's Active).
struct SpecState {
    uint32_t k = 0;                    // its draft length (0: not yet drafted, start at draft_max)
    double rate = 1.0;                 // running acceptance: newest verify weighs 1/4
    uint32_t backoff = 0;              // the last pause's length (0: none)
    uint32_t pause = 0;                // steps left without drafts
    SeqId draft_seq = 0;               // DraftModel: its sequence, 0 none
    std::vector<int32_t> draft_tokens; // what draft_seq holds
    std::vector<int32_t> step;         // [t, d1..dk] of the step being built
};

// After a verify of `proposed` drafts that accepted `accepted`: the running
// acceptance, and the pause that follows a failing request's (the rule above).
void adapt_pause(SpecState& st, uint32_t proposed, uint32_t accepted);

class Speculator {
public:
    // engine_max_draft: what the target engine verifies (SeqLimits::max_draft_tokens).
    Speculator(SpecOptions o, uint32_t engine_max_draft);
    ~Speculator();

    SpecSource source() const { return o_.source; }
    // Turned off while serving (the draft model failed kSpecDraftFailures
    // times in a row), and why; read from any thread.
    bool off() const { return off_.load(std::memory_order_acquire); }
    const std::string& off_reason() const { return off_reason_; }
    const SpecOptions& options() const { return o_; }
    // Whether a step with this many decoding requests speculates.
    bool on_for(size_t decoding) const { return decoding <= o_.max_batch; }

    struct Ask {
        SpecState* st;
        std::span<const int32_t> tokens;  // the request's tokens; the last is its next input
        uint32_t cap;                     // most drafts it may take (budget, max_tokens, context)
    };
    // Fills each ask's st->step with [last token, drafts...] (just the last
    // token when its source found nothing). A draft model that fails or
    // runs out of blocks drafts nothing this time (never an error).
    void draft(std::span<Ask> asks);
    // The step verified st.step: `accepted` of its drafts were taken.
    void verified(SpecState& st, uint32_t accepted);
    // The request ended: its draft sequence goes.
    void forget(SpecState& st);

private:
    void draft_model(std::span<Ask> asks);
    void drop(SpecState& st);

    SpecOptions o_;
    uint32_t k_max_;
    uint32_t failures_ = 0;            // the draft model's, in a row
    std::string off_reason_;           // written once, before off_
    std::atomic<bool> off_{false};
};

}  // namespace eh::service
