// The forward pass over a batch of sequences: every slice appends tokens to
// one sequence (a prefill chunk or one decode token). Each token's result is
// computed row by row with the same arithmetic whatever else is in the batch,
// so a sequence's output is bit-identical alone or batched, and whether its
// prompt came in one chunk or several.
#pragma once

#include <cstdint>
#include <span>

#include <engine_host/plugin_abi.h>

#include "model.hpp"
#include "sequence.hpp"

namespace cpuref {

struct Slice {
    Sequence* seq;          // rows length() .. length()+n-1 already reserved
    const int32_t* tokens;  // ids already checked against the vocabulary
    uint32_t n;
    float* logits;          // n_vocab floats for the last token's logits, or NULL
    float* hidden = nullptr;  // n_embd floats for the last token's final hidden state (after the output norm), or NULL
    // Logits of every token, n * n_vocab floats in `logits` (speculative
    // verification, EH_STEP_VERIFY, reads them all).
    bool every_logits = false;
    // Rows in place of token embeddings for some of its tokens (ABI 1.6
    // seq_embd_spans), already checked against n; a BIDIRECTIONAL span's
    // tokens also attend to the span's later tokens.
    const eh_embd_span* spans = nullptr;
    uint32_t n_spans = 0;
};

// Writes every slice's K/V into its sequence's reserved rows and the asked-
// for logits and hidden states. Does not commit tokens. Polls `cancel` (may be NULL) between
// layers and throws ehp::Error(EH_CANCELLED).
void forward(const Model& model, std::span<const Slice> slices, eh_cancel_fn cancel, void* cancel_user);

}  // namespace cpuref
