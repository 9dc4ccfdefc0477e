// The sampling pipeline of the ABI, in its stated order: a step's logit
// biases and allowed-token mask, repetition penalty, presence and frequency
// penalties, temperature, top-k, top-p, min-p, then greedy (temperature 0)
// or a draw from a std::mt19937_64 seeded with the request's seed; and
// ABI 1.6's speculative verification over that same distribution.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace cpuref {

struct Candidate {
    int32_t id;
    float logit;
};


// Stages, exposed for tests. Candidates are kept sorted by descending logit
// (ties by ascending id) from top_k on.
// CTRL-style penalty on every distinct token of the last `window` history
// entries (-1 = all): positive logits divided by `penalty`, others multiplied.
void apply_repetition_penalty(std::vector<float>& logits, const int32_t* history, size_t n_history,
                              float penalty, int32_t window);
inline void apply_repetition_penalty(std::vector<float>& logits, const std::vector<int32_t>& history,
                                     float penalty, int32_t window) {
    apply_repetition_penalty(logits, history.data(), history.size(), penalty, window);
}
// OpenAI's: logit -= presence * [count > 0] + frequency * count, counting
// the tokens of `generated`.
void apply_presence_frequency(std::vector<float>& logits, const int32_t* generated, size_t n_generated,
                              float presence, float frequency);
std::vector<Candidate> sorted_candidates(const std::vector<float>& logits);
void apply_temperature(std::vector<Candidate>& c, float temperature);
void apply_top_k(std::vector<Candidate>& c, int32_t k);
// keeps the shortest prefix whose probability mass reaches p
void apply_top_p(std::vector<Candidate>& c, float p);
// keeps candidates with probability >= min_p * (largest probability)
void apply_min_p(std::vector<Candidate>& c, float min_p);
std::vector<float> candidate_probs(const std::vector<Candidate>& c);
// argmax with ties to the lowest id
int32_t greedy(const std::vector<float>& logits);

// One step's extra inputs for one sequence (eh_step_entry's optional
// fields), already validated.
struct StepBias {
    uint32_t n_bias = 0;
    const int32_t* bias_tokens = nullptr;
    const float* bias_values = nullptr;
    const uint32_t* allowed = nullptr;  // bitset, NULL = all
};

// What the pipeline draws from at one position: greedy (every bit of mass
// on `argmax`), or the surviving candidates and their probabilities.
struct Distribution {
    bool greedy = false;
    int32_t argmax = -1;
    std::vector<Candidate> c;
    std::vector<float> p;
    float prob(int32_t id) const;
};

class Sampler {
public:
    void set(const eh_sampling_params& p);  // validates and reseeds
    bool ready() const { return ready_; }
    // `history` is the sequence's tokens; those from `gen_start` on are its
    // own output (presence/frequency penalties).
    int32_t sample(const float* logits, uint32_t n_vocab, const std::vector<int32_t>& history,
                   size_t gen_start = SIZE_MAX, const StepBias& bias = {}) {
        return draw(distribution(logits, n_vocab, history.data(), history.size(), gen_start, bias));
    }
    // The pipeline up to the draw, over the first n_history tokens.
    Distribution distribution(const float* logits, uint32_t n_vocab, const int32_t* history, size_t n_history,
                              size_t gen_start, const StepBias& bias) const;
    // One token from d (greedy: its argmax, and no draw from the generator).
    int32_t draw(const Distribution& d);
    // Speculative verification (ABI 1.6 EH_STEP_VERIFY) with a deterministic
    // proposal: accept `draft` with probability d.prob(draft) (one draw;
    // greedy: when it is the argmax, no draw) ...
    bool accept(const Distribution& d, int32_t draft);
    // ... and on a rejection, a token from d with `rejected` removed and the
    // rest renormalised (greedy: the argmax).
    int32_t draw_without(const Distribution& d, int32_t rejected);

private:
    eh_sampling_params params_{};
    std::mt19937_64 rng_;
    bool ready_ = false;
};

}  // namespace cpuref
