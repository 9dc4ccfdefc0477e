#include "sampler.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include <engine_host/plugin_abi.hpp>

namespace cpuref {

void apply_presence_frequency(std::vector<float>& logits, const int32_t* generated, size_t n_generated,
                              float presence, float frequency) {
    if ((presence == 0.0f && frequency == 0.0f) || n_generated == 0) return;
    std::unordered_map<int32_t, uint32_t> counts;
    for (size_t i = 0; i < n_generated; ++i) ++counts[generated[i]];
    for (auto [t, n] : counts) {
        if (t < 0 || static_cast<size_t>(t) >= logits.size()) continue;
        logits[static_cast<size_t>(t)] -= presence + frequency * static_cast<float>(n);
    }
}

void apply_repetition_penalty(std::vector<float>& logits, const int32_t* history, size_t n_history,
                              float penalty, int32_t window) {
    if (penalty == 1.0f || window == 0 || n_history == 0) return;
    size_t start = 0;
    if (window > 0 && n_history > static_cast<size_t>(window)) start = n_history - static_cast<size_t>(window);
    std::unordered_set<int32_t> seen;
    for (size_t i = start; i < n_history; ++i) {
        const int32_t t = history[i];
        if (t < 0 || static_cast<size_t>(t) >= logits.size() || !seen.insert(t).second) continue;
        float& l = logits[static_cast<size_t>(t)];
        l = l > 0.0f ? l / penalty : l * penalty;
    }
}

static bool before(const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

std::vector<Candidate> sorted_candidates(const std::vector<float>& logits) {
    std::vector<Candidate> c(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) c[i] = {static_cast<int32_t>(i), logits[i]};
    std::sort(c.begin(), c.end(), before);
    return c;
}

void apply_temperature(std::vector<Candidate>& c, float temperature) {
    for (auto& x : c) x.logit /= temperature;
}

void apply_top_k(std::vector<Candidate>& c, int32_t k) {
    if (k > 0 && static_cast<size_t>(k) < c.size()) c.resize(static_cast<size_t>(k));
}

std::vector<float> candidate_probs(const std::vector<Candidate>& c) {
    std::vector<float> p(c.size());
    if (c.empty()) return p;
    float m = c[0].logit;
    for (auto& x : c) m = std::max(m, x.logit);
    double sum = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
        p[i] = std::exp(c[i].logit - m);
        sum += p[i];
    }
    for (auto& v : p) v = static_cast<float>(v / sum);
    return p;
}

void apply_top_p(std::vector<Candidate>& c, float top_p) {
    if (top_p >= 1.0f || c.size() <= 1) return;
    const std::vector<float> p = candidate_probs(c);
    double cum = 0.0;
    size_t keep = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
        cum += p[i];
        if (cum >= top_p) {
            keep = i + 1;
            break;
        }
    }
    c.resize(keep);
}

void apply_min_p(std::vector<Candidate>& c, float min_p) {
    if (min_p <= 0.0f || c.size() <= 1) return;
    const std::vector<float> p = candidate_probs(c);
    const float pmax = *std::max_element(p.begin(), p.end());
    std::vector<Candidate> kept;
    for (size_t i = 0; i < c.size(); ++i)
        if (p[i] >= min_p * pmax) kept.push_back(c[i]);
    c.swap(kept);
}

int32_t greedy(const std::vector<float>& logits) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
}

void Sampler::set(const eh_sampling_params& p) {
    ehp::check_sampling(p);
    // A caller built against 1.0/1.1 passes a shorter struct: the rest is neutral.
    params_ = eh_sampling_params{};
    std::memcpy(&params_, &p, std::min<size_t>(p.struct_size, sizeof(params_)));
    rng_.seed(p.seed);
    ready_ = true;
}

float Distribution::prob(int32_t id) const {
    if (greedy) return id == argmax ? 1.0f : 0.0f;
    for (size_t i = 0; i < c.size(); ++i)
        if (c[i].id == id) return p[i];
    return 0.0f;  // cut by the mask, top-k, top-p or min-p
}

Distribution Sampler::distribution(const float* logits_in, uint32_t n_vocab, const int32_t* history, size_t n_history,
                                   size_t gen_start, const StepBias& bias) const {
    if (!ready_) throw ehp::Error(EH_INVALID_ARGUMENT, "session_set_sampling must be called before sampling");
    std::vector<float> logits(logits_in, logits_in + n_vocab);
    for (uint32_t i = 0; i < bias.n_bias; ++i) logits[static_cast<size_t>(bias.bias_tokens[i])] += bias.bias_values[i];
    if (bias.allowed)
        for (uint32_t i = 0; i < n_vocab; ++i)
            if (!((bias.allowed[i / 32] >> (i % 32)) & 1u)) logits[i] = -INFINITY;
    apply_repetition_penalty(logits, history, n_history, params_.repetition_penalty, params_.repetition_window);
    if (gen_start < n_history)
        apply_presence_frequency(logits, history + gen_start, n_history - gen_start, params_.presence_penalty,
                                 params_.frequency_penalty);
    Distribution d;
    // top-k, top-p and min-p all keep the most likely token, so greedy is
    // the argmax of the penalized logits
    if (params_.temperature == 0.0f) {
        d.greedy = true;
        d.argmax = greedy(logits);
        return d;
    }
    d.c = sorted_candidates(logits);
    // Masked-out tokens sort last; drop them so rounding in the draw below
    // can never land on one.
    while (d.c.size() > 1 && d.c.back().logit == -INFINITY) d.c.pop_back();
    apply_temperature(d.c, params_.temperature);
    apply_top_k(d.c, params_.top_k);
    apply_top_p(d.c, params_.top_p);
    apply_min_p(d.c, params_.min_p);
    d.p = candidate_probs(d.c);
    d.argmax = d.c.front().id;
    return d;
}

namespace {
// 53 random bits -> uniform double in [0, 1): the same on every platform,
// unlike std::uniform_real_distribution
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); }
}  // namespace

int32_t Sampler::draw(const Distribution& d) {
    if (d.greedy) return d.argmax;
    const double u = uniform(rng_);
    double cum = 0.0;
    for (size_t i = 0; i < d.c.size(); ++i) {
        cum += d.p[i];
        if (u < cum) return d.c[i].id;
    }
    return d.c.back().id;
}

bool Sampler::accept(const Distribution& d, int32_t draft) {
    if (d.greedy) return draft == d.argmax;
    return uniform(rng_) < static_cast<double>(d.prob(draft));
}

int32_t Sampler::draw_without(const Distribution& d, int32_t rejected) {
    if (d.greedy) return d.argmax;
    double rest = 0.0;
    for (size_t i = 0; i < d.c.size(); ++i)
        if (d.c[i].id != rejected) rest += d.p[i];
    // A draft with all the mass is never rejected, rounding aside: then the
    // most likely other candidate stands in.
    if (!(rest > 0.0)) {
        for (const Candidate& x : d.c)
            if (x.id != rejected) return x.id;
        return rejected;
    }
    const double u = uniform(rng_) * rest;
    double cum = 0.0;
    int32_t last = rejected;
    for (size_t i = 0; i < d.c.size(); ++i) {
        if (d.c[i].id == rejected) continue;
        cum += d.p[i];
        last = d.c[i].id;
        if (u < cum) return d.c[i].id;
    }
    return last;
}

}  // namespace cpuref
