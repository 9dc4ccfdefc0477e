// Compiled output constraints, shared between requests: one matcher
// automaton (its state tables and cached masks) per distinct schema or
// grammar, over the model's vocabulary. Requests that repeat a schema (the
// usual case) find its masks already computed.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "eh/constrain/automaton.hpp"
#include "eh/service/request.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

class ConstraintCache {
public:
    // Distinct constraints kept (least recently used dropped first).
    static constexpr size_t kCapacity = 16;

    // n_logits: the engine's logits per position (masks are that long; it
    // may exceed the tokenizer's vocabulary, and those ids are never allowed).
    ConstraintCache(std::shared_ptr<const TextCodec> codec, uint32_t n_logits)
        : codec_(std::move(codec)), n_logits_(n_logits) {}

    // The automaton for `c` (which must be active), compiling it on first
    // use. Throws RequestError naming c.field for a schema or grammar the
    // compiler refuses.
    std::shared_ptr<constrain::Automaton> get(const OutputConstraint& c);

    // The vocabulary as the mask sees it, built on first use.
    std::shared_ptr<const constrain::TokenVocab> vocab();

private:
    std::shared_ptr<const TextCodec> codec_;
    uint32_t n_logits_;
    std::once_flag vocab_once_;
    std::shared_ptr<const constrain::TokenVocab> vocab_;
    std::mutex mu_;
    std::list<std::pair<std::string, std::shared_ptr<constrain::Automaton>>> lru_;
};

}  // namespace eh::service
