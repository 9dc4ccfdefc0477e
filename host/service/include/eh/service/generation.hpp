// One request's output side: sampled tokens in, job events out. It owns the
// incremental detokenizer, the stop strings, the logprobs and the end-of-
// generation rules (EOG token, stop string, max_tokens), so the scheduler
// only moves tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "eh/service/job.hpp"
#include "eh/service/metrics.hpp"
#include "eh/service/stop_matcher.hpp"
#include "eh/service/text_codec.hpp"
#include "eh/service/text_stream.hpp"

namespace eh::service {

class Generation {
public:
    Generation(Job& job, const TextCodec& codec, Metrics& metrics);

    // A token the engine sampled, with the raw logits it came from (empty
    // unless logprobs were asked for). Returns true once generation ended;
    // then end_event() is the terminal event.
    bool accept(int32_t token, std::span<const float> logits);
    bool done() const { return !reason_.empty(); }
    // Ends generation for a reason outside the token stream (the output
    // completed its grammar): flushes held text like an EOS would.
    void end(const std::string& reason);
    uint32_t tokens_out() const { return n_out_; }
    JobEvent end_event(std::chrono::steady_clock::time_point admitted) ;

private:
    TokenLogprob logprob_of(int32_t tok, std::span<const float> lg) const;
    void emit(std::string chunk);
    void finish_text();

    Job& job_;
    const TextCodec& codec_;
    Metrics& metrics_;
    TextStream text_;
    StopMatcher stops_;
    std::vector<TokenLogprob> pending_lp_;
    uint32_t n_out_ = 0;
    std::string reason_;
    std::string output_;  // kept only for --log-content
    std::chrono::steady_clock::time_point first_, prev_;
};

}  // namespace eh::service
