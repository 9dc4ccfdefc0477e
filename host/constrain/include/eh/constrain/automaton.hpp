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
// A state seen for the first time does not walk the whole trie when it can
// avoid it: the bottom its stacks share is cut (what is left says e.g.
// "inside a JSON string", whatever property the string belongs to), the
// cut state's walk (cached, shared by every state with the same top) gives
// the tokens decided within those frames, and only the subtrees where a
// token leaves them (a closing quote) are walked with the full state.
//
// Counted repeats (Grammar::chains): a state whose counts differ from
// another's only above the longest token's length shares that state's mask
// (detail::clamp_counts), so x{1000} is not a new walk at every token.
//
// Thread-safe: one mutex per Automaton (the scheduler thread is its only
// heavy user). Limits (documented in docs/http-api.md): at most
// kMaxStacks parse stacks per state (more ambiguous alternatives are
// dropped, which only narrows the output), stacks at most kMaxStackDepth
// deep (deeper nesting is refused), kMaxStates interned states (then the
// tables are reset between tokens), kMaxCachedMasks cached masks; one
// operation that needs more than kHardMaxStates states fails with
// Error(InvalidRequest) rather than use unbounded memory. One token's mask,
// and one token's advance, may each cost at most kMaxMaskWork units of work
// (a trie node visited; a grammar parse step taken; a parse-stack position
// written, sorted or hashed): past that they fail with
// Error(InvalidRequest) naming the limit, and every later mask() of that
// state fails at once (the request ends; the server's CPU per token stays
// bounded).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
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
inline constexpr size_t kMaxMaskWork = 3000000;

using Mask = std::vector<uint32_t>;  // bit i of word i/32: token i allowed (the ABI's layout)

class Automaton {
public:
    // max_mask_work: kMaxMaskWork, or less (tests).
    Automaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab,
              size_t max_mask_work = kMaxMaskWork);

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
        size_t last_mask_work = 0;  // work units of the last mask() that computed a mask
        size_t max_mask_work = 0;   // the most of any one
        size_t total_work = 0;      // of every mask() and advance() so far
    };
    Stats stats() const;

private:
    // A cut state's walk: tokens decided within its frames, and the trie
    // subtrees (node, bytes before it) where the input leaves them.
    struct Partial {
        Mask decided;
        std::vector<std::pair<uint32_t, std::string>> open;
    };
    struct State {
        std::vector<uint32_t> key;
        std::shared_ptr<const Mask> mask;
        std::shared_ptr<const Partial> partial;
        bool accepting = false;
        bool complete = false;
        bool left_frames = false;  // a stack popped to the cut (truncated states only)
        bool over_budget = false;  // its mask needed more than kMaxMaskWork
    };
    struct KeyHash {
        size_t operator()(const std::vector<uint32_t>& k) const noexcept;
    };

    int32_t resolve(Position& p);
    std::shared_ptr<const Mask> mask_of(int32_t s);
    int32_t intern(std::vector<uint32_t> key);
    int32_t step(int32_t s, uint8_t byte) {
        const int32_t t = trans_[size_t(s) * 256 + byte];
        return t != -2 ? t : compute_step(s, byte);
    }
    int32_t compute_step(int32_t s, uint8_t byte);
    void reset();
    // Allowed tokens in trie nodes [begin, end) from state s at begin's
    // parent, into m; with `cut`, subtrees where the input leaves a cut
    // state's frames go to cut->open instead.
    void walk(int32_t s, uint32_t begin, uint32_t end, Mask& m, Partial* cut = nullptr);
    std::shared_ptr<const Partial> partial(int32_t t);
    void cache_limit();
    // Counts n units of the current mask()'s or advance()'s work; throws
    // past the budget.
    void charge(size_t n) {
        if (!counting_) return;
        work_ += n;
        if (work_ > max_work_) over_budget();
    }
    [[noreturn]] void over_budget();
    // Counts one operation's work from construction to destruction: a
    // mask of state s (whose stats and over_budget flag it records), or an
    // advance (s < 0).
    class Counting {
    public:
        Counting(Automaton& a, int32_t s);
        ~Counting();

    private:
        Automaton& a_;
        int32_t s_;
    };

    std::shared_ptr<const Grammar> g_;
    std::shared_ptr<const TokenVocab> vocab_;
    mutable std::mutex mu_;
    std::vector<State> states_;
    // Transitions, 256 per state (state * 256 + byte): the next state, -1
    // dead, -2 not computed yet. One flat table keeps the trie walk's inner
    // loop to a load.
    std::vector<int32_t> trans_;
    std::unordered_map<std::vector<uint32_t>, int32_t, KeyHash> ids_;
    std::vector<uint32_t> start_key_;
    uint64_t epoch_ = 0;
    size_t masks_ = 0;
    Stats stats_;
    std::vector<int32_t> walk_ids_;
    std::string path_;
    bool counting_ = false;  // inside mask() or advance(): charge() counts
    size_t work_ = 0;
    size_t max_work_;
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
