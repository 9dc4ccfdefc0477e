// Sampling on the device, a batched step's rows at once. First the logit
// edits (adjust_logits: biases, repetition penalty, presence/frequency),
// then one block per row runs the rest of the pipeline over the vocab:
// temperature, top-k, top-p, min-p, then greedy argmax (temperature 0) or
// an inverse-CDF draw with a Philox number keyed by (seed, draw counter).
// Every reduction has a fixed order and there are no float atomics, so the
// same logits and seed give the same token. Only the chosen ids cross to
// the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <engine_host/plugin_abi.h>

namespace ehcuda {

// One row's settings, in device memory. The repetition fields are the
// sequence's; the step applies them in adjust_logits and hands the sampler
// 1.0.
struct SamplerParams {
    float temperature = 0.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.0f;
    float repetition_penalty = 1.0f;
    int32_t repetition_window = -1;  // -1 = whole history
    uint64_t seed = 0;
};

// Validates p (ehp::check_sampling: INVALID_ARGUMENT naming the field) and
// converts it.
SamplerParams sampler_params_of(const eh_sampling_params& p);

// Device buffers a sampler needs: n_vocab floats and n_vocab ints of work.
struct SamplerWork {
    float* fwork = nullptr;
    int32_t* iwork = nullptr;
};

// One row's edits for adjust_logits: ranges of the shared token / value
// lists (bias: value added; repetition: distinct tokens of the window;
// presence/frequency: distinct output tokens, value = count), and the word
// offset of the row's allowed-token bitset in the mask array (-1: none),
// which the sampler applies.
struct RowEdits {
    int32_t bias_begin = 0, bias_end = 0;
    int32_t rep_begin = 0, rep_end = 0;
    int32_t pf_begin = 0, pf_end = 0;
    int32_t mask_word = -1;
    float repetition_penalty = 1.0f;
    float presence = 0.0f, frequency = 0.0f;
};
// Applies each row's edits to row r of logits (stride ld), in the ABI's
// order: biases, repetition penalty, presence/frequency. The allowed-token
// mask comes between biases and penalties in the ABI; it is applied by
// sample_rows instead, as it reads the logits (no pass of its own over the
// vocabulary): a disallowed token ends at -inf either way, and an allowed
// one's value does not depend on the mask.
void adjust_logits(float* logits, int ld, int n_rows, int n_vocab, const RowEdits* d_rows, const int32_t* d_tok,
                   const float* d_val, cudaStream_t stream);

// A batched step's sampling: row r of logits (stride ld) is sampled with
// d_params[r] and draw counter d_counters[r] into d_out[r], in one launch,
// over the tokens its allowed-token bitset allows (d_rows[r].mask_word into
// d_masks; d_rows or d_masks null: every token). The draw counters
// advance by one per draw (on the device). No repetition penalty here
// (adjust_logits applies it; the params' is not read); work holds n_rows *
// n_vocab floats and ints.
void sample_rows(const float* logits, int ld, int n_rows, int n_vocab, const SamplerParams* d_params,
                 unsigned long long* d_counters, SamplerWork work, int32_t* d_out, cudaStream_t stream,
                 const RowEdits* d_rows = nullptr, const uint32_t* d_masks = nullptr);

}  // namespace ehcuda
