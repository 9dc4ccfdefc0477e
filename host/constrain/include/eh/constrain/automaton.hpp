// Constrained decoding, part 3: a Grammar bound to a TokenVocab, and the
// per-request Matcher over it.
//
// The matcher's state is a set of parse stacks (an Earley-free pushdown
// recognizer: rules are expanded when they come to the top, so a state is
// canonical and comparable). States are interned per Automaton, with a
// 256-entry transition table each filled on demand: advancing by a byte is
// one table load once seen, which makes the mask a walk of the vocabulary
// trie (vocab.hpp) through that table, skipping subtrees the grammar
// refuses. The finished mask of a state is cached too, so in steady state
// (inside a JSON string, between digits) a token costs a table walk over
// its bytes and a cache hit.
//
// Thread-safe: one mutex per Automaton (the scheduler thread is its only
// heavy user). Limits (documented in docs/http-api.md): at most
// kMaxStacks parse stacks per state (more ambiguous alternatives are
// dropped, which only narrows the output), stacks at most kMaxStackDepth
// deep (deeper nesting is refused), kMaxStates interned states (then the
// tables are reset between tokens), kMaxCachedMasks cached masks; one
// operation that needs more than kHardMaxStates states fails with
// Error(InvalidRequest) rather than use unbounded memory.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "eh/constrain/grammar.hpp"
#include "eh/constrain/vocab.hpp"

namespace eh::constrain {

inline constexpr size_t kMaxStacks = 256;
inline constexpr size_t kMaxStackDepth = 1024;
inline constexpr size_t kMaxStates = 16384;
inline constexpr size_t kHardMaxStates = 65536;
inline constexpr size_t kMaxCachedMasks = 512;

using Mask = std::vector<uint32_t>;  // bit i of word i/32: token i allowed (the ABI's layout)

class Automaton {
public:
    Automaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab);

    // A matcher's position: its parse stacks (canonical, flattened) and the
    // interned id they had in `epoch` (ids are reassigned after a reset).
    struct Position {
        std::vector<uint32_t> key;
        int32_t id = -1;
        uint64_t epoch = 0;
    };
    Position start();
    // false (and `p` unchanged) if the bytes leave the grammar.
    bool advance(Position& p, std::string_view bytes);
    std::shared_ptr<const Mask> mask(Position& p);
    bool accepting(Position& p);
    bool complete(Position& p);   // accepting, and no byte may follow

    const TokenVocab& vocab() const { return *vocab_; }
    struct Stats {
        size_t states = 0, masks = 0, resets = 0, mask_walks = 0, walk_nodes = 0;
    };
    Stats stats() const;

private:
    struct State {
        std::vector<uint32_t> key;
        std::unique_ptr<int32_t[]> next;  // 256 entries, kUnknown until computed; -1 dead
        std::shared_ptr<const Mask> mask;
        bool accepting = false;
        bool complete = false;
    };
    struct KeyHash {
        size_t operator()(const std::vector<uint32_t>& k) const noexcept;
    };

    int32_t resolve(Position& p);
    int32_t intern(std::vector<uint32_t> key);
    int32_t step(int32_t s, uint8_t byte);
    std::vector<uint32_t> advance_key(const std::vector<uint32_t>& key, uint8_t byte) const;
    void reset();

    std::shared_ptr<const Grammar> g_;
    std::shared_ptr<const TokenVocab> vocab_;
    mutable std::mutex mu_;
    std::vector<State> states_;
    std::unordered_map<std::vector<uint32_t>, int32_t, KeyHash> ids_;
    std::vector<uint32_t> start_key_;
    uint64_t epoch_ = 0;
    size_t masks_ = 0;
    Stats stats_;
    std::vector<int32_t> walk_ids_;
};

// One request's progress through its grammar.
class Matcher {
public:
    explicit Matcher(std::shared_ptr<Automaton> a) : a_(std::move(a)), pos_(a_->start()) {}
    // The tokens that keep the output valid: bit i of word i/32 (the ABI's
    // allowed-token layout); end-of-generation tokens exactly where the
    // output is complete JSON / a complete grammar match.
    std::shared_ptr<const Mask> mask() { return a_->mask(pos_); }
    // Feeds a sampled token; false (and no change) if it is not allowed.
    bool accept(int32_t token);
    bool accept_bytes(std::string_view bytes) { return a_->advance(pos_, bytes); }
    bool accepting() { return a_->accepting(pos_); }
    // Accepting with nothing allowed after: generation can end here.
    bool complete() { return a_->complete(pos_); }

private:
    std::shared_ptr<Automaton> a_;
    Automaton::Position pos_;
};

}  // namespace eh::constrain
