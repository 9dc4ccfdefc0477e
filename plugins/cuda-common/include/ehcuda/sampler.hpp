// Sampling on the device. One block runs the whole pipeline over the vocab:
// repetition penalty, temperature, top-k, top-p, min-p, then greedy argmax
// (temperature 0) or an inverse-CDF draw with a Philox number keyed by
// (seed, draw counter). Every reduction has a fixed order and there are no
// float atomics, so the same logits, history and seed give the same token.
// Only the chosen id (4 bytes) needs to cross to the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <engine_host/plugin_abi.h>

namespace ehcuda {

// Lives in device memory so a captured graph picks up new settings.
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

// A decode step's inputs in device memory: the captured step reads them, so
// one graph serves every position. The sampler can advance them to the next
// step itself (position + 1, the drawn token), which lets the host enqueue
// that step before it has read this one's token.
struct StepState {
    int32_t pos0 = 0;    // position of the step's (first) token
    int32_t n_hist = 0;  // history length the sampler sees
    int32_t token = 0;   // the token a decode step consumes
    int32_t pad = 0;
    // The draw counter as this step's sampler found it: where to put it
    // back when the host drops a step it ran ahead.
    unsigned long long counter_before = 0;
};

// history[0 .. *d_n_hist) are the context's token ids. *d_counter is the draw
// counter; it is advanced by one per draw (on the device). next (optional):
// the drawn token also becomes next->token, next->pos0 and next->n_hist
// advance by one, and next->counter_before records *d_counter as found.
void sample_tokens(const float* logits, int n_vocab, const int32_t* history,
                   const int32_t* d_n_hist, const SamplerParams* d_params,
                   unsigned long long* d_counter, SamplerWork work, int32_t* d_out_token,
                   cudaStream_t stream, StepState* next = nullptr);

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
// d_masks; d_rows or d_masks null: every token).
// No repetition penalty here (the caller applies it, params must say 1.0);
// work holds n_rows * n_vocab floats and ints.
void sample_rows(const float* logits, int ld, int n_rows, int n_vocab, const SamplerParams* d_params,
                 unsigned long long* d_counters, SamplerWork work, int32_t* d_out, cudaStream_t stream,
                 const RowEdits* d_rows = nullptr, const uint32_t* d_masks = nullptr);

}  // namespace ehcuda
