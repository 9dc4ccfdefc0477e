#include "eh/service/generation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "eh/service/event_log.hpp"
#include "eh/service/utf8.hpp"

namespace eh::service {
namespace {

using Clock = std::chrono::steady_clock;

std::span<const int32_t> last_prompt_tokens(const Job& job) {
    const size_t n = std::min<size_t>(job.prompt_tokens.size(), 4);
    return std::span<const int32_t>(job.prompt_tokens).last(n);
}

}  // namespace

Generation::Generation(Job& job, const TextCodec& codec, Metrics& metrics)
    : job_(job), codec_(codec), metrics_(metrics), text_(codec, last_prompt_tokens(job), job.request.control_text), stops_(job.request.stop) {}

TokenLogprob Generation::logprob_of(int32_t tok, std::span<const float> lg) const {
    TokenLogprob lp;
    lp.id = tok;
    // The bytes the token adds to the output (an SPM piece with its leading
    // space); `text` is them as valid UTF-8 (a partial character becomes
    // U+FFFD), `bytes` exactly.
    lp.bytes = codec_.token_bytes(tok);
    lp.text = sanitize_utf8(lp.bytes);
    if (lg.empty() || tok < 0 || size_t(tok) >= lg.size()) return lp;
    const float mx = *std::max_element(lg.begin(), lg.end());
    double sum = 0;
    for (float v : lg) sum += std::exp(double(v) - mx);
    const double lse = mx + std::log(sum);
    lp.logprob = double(lg[size_t(tok)]) - lse;
    if (job_.request.top_logprobs > 0) {
        std::vector<int32_t> idx(lg.size());
        std::iota(idx.begin(), idx.end(), 0);
        const size_t k = std::min(size_t(job_.request.top_logprobs), idx.size());
        std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                          [&](int32_t a, int32_t b) { return lg[size_t(a)] > lg[size_t(b)]; });
        for (size_t i = 0; i < k; ++i) {
            const int32_t id = idx[i];
            std::string b = codec_.token_bytes(id);
            lp.top.push_back({id, sanitize_utf8(b), double(lg[size_t(id)]) - lse, std::move(b)});
        }
    }
    return lp;
}

void Generation::emit(std::string chunk) {
    if (chunk.empty() && pending_lp_.empty()) return;
    if (log_settings().log_content) output_ += chunk;
    JobEvent ev;
    ev.kind = JobEvent::Kind::Token;
    ev.text = std::move(chunk);
    ev.index = n_out_ ? n_out_ - 1 : 0;
    ev.logprobs = std::move(pending_lp_);
    pending_lp_.clear();
    job_.push(std::move(ev));
}

void Generation::finish_text() {
    if (reason_ == "stop") return;
    auto r = stops_.feed(text_.finish());
    if (r.stopped) {
        reason_ = "stop";
        emit(std::move(r.emit));
    } else {
        emit(r.emit + stops_.flush());
    }
}

bool Generation::accept(int32_t tok, std::span<const float> logits) {
    if (done()) return true;
    if (codec_.is_eog(tok) && !job_.request.ignore_eos) {
        reason_ = "eos";
        finish_text();
        return true;
    }
    const auto now = Clock::now();
    if (n_out_ == 0) {
        first_ = now;
        // time to first token counts the time spent waiting in the queue
        metrics_.time_to_first_token(std::chrono::duration<double>(now - job_.submitted_at).count());
    } else {
        metrics_.inter_token_latency(std::chrono::duration<double>(now - prev_).count());
    }
    prev_ = now;
    ++n_out_;
    if (job_.request.top_logprobs >= 0) pending_lp_.push_back(logprob_of(tok, logits));
    auto r = stops_.feed(text_.push(tok));
    emit(std::move(r.emit));
    if (r.stopped) reason_ = "stop";
    else if (n_out_ >= job_.max_tokens) reason_ = "length";
    if (done()) finish_text();
    return done();
}

void Generation::end(const std::string& reason) {
    if (done()) return;
    reason_ = reason;
    finish_text();
}

JobEvent Generation::end_event(Clock::time_point admitted) {
    metrics_.tokens_generated(n_out_);
    const auto now = Clock::now();
    JobEvent end;
    end.kind = JobEvent::Kind::End;
    end.tokens_out = n_out_;
    end.stop_reason = reason_;
    if (reason_ == "stop") end.stop_sequence = stops_.matched();
    end.decode_time_ms = n_out_ ? std::chrono::duration<double, std::milli>(now - first_).count() : 0.0;
    end.time_to_first_token_ms =
        std::chrono::duration<double, std::milli>((n_out_ ? first_ : now) - admitted).count();
    if (log_settings().log_content)
        log_event(spdlog::level::info, "execute_output",
                  {{"job_id", job_.request.job_id}, {"correlation_id", job_.request.correlation_id}, {"text", output_}});
    return end;
}

}  // namespace eh::service
