#include "eh/constrain/automaton.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "stack_set.hpp"

namespace eh::constrain {
namespace {

constexpr int32_t kUnknown = -2;
constexpr int32_t kDead = -1;

}  // namespace

size_t Automaton::KeyHash::operator()(const std::vector<uint32_t>& k) const noexcept {
    uint64_t h = 0xcbf29ce484222325ull ^ k.size();
    for (uint32_t v : k) h = (h ^ v) * 0x100000001b3ull;
    return size_t(h ^ (h >> 29));
}

Automaton::Automaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                     size_t max_mask_work)
    : g_(std::move(grammar)), vocab_(std::move(vocab)), max_work_(std::min(max_mask_work, kMaxMaskWork)) {
    start_key_ = detail::start_key(*g_, kMaxStacks, kMaxStackDepth);
    if (start_key_.empty())
        throw GrammarError("grammar", fmt::format("the grammar nests deeper than the matcher's {}-level stack before "
                                                  "its first character", kMaxStackDepth));
    walk_ids_.resize(size_t(vocab_->max_depth()) + 1);
    path_.resize(size_t(vocab_->max_depth()) + 1);
}

void Automaton::reset() {
    states_.clear();
    trans_.clear();
    ids_.clear();
    masks_ = 0;
    ++epoch_;
    ++stats_.resets;
}

int32_t Automaton::intern(std::vector<uint32_t> key) {
    if (key.empty()) return kDead;
    if (auto it = ids_.find(key); it != ids_.end()) return it->second;
    if (states_.size() >= kHardMaxStates)
        throw Error(Code::InvalidRequest, fmt::format("the grammar needs more than {} matcher states for one token; "
                                                      "simplify it", kHardMaxStates));
    State st;
    st.accepting = detail::key_accepting(key);
    st.complete = detail::key_complete(key);
    st.left_frames = detail::key_has_context(key);
    st.key = std::move(key);
    const auto id = int32_t(states_.size());
    ids_.emplace(st.key, id);
    states_.push_back(std::move(st));
    trans_.resize(trans_.size() + 256, kUnknown);
    return id;
}

int32_t Automaton::resolve(Position& p) {
    if (p.epoch != epoch_ || p.id < 0) {
        p.id = intern(p.key);
        p.epoch = epoch_;
    }
    return p.id;
}

int32_t Automaton::compute_step(int32_t s, uint8_t byte) {
    size_t steps = 0;
    auto key = detail::advance_key(*g_, states_[size_t(s)].key, byte, kMaxStacks, kMaxStackDepth, &steps);
    // A parse step, and each position of the new state (copied, sorted,
    // hashed, interned), is a unit of work.
    steps += key.size();
    const int32_t t = intern(std::move(key));
    trans_[size_t(s) * 256 + byte] = t;  // (after intern: the table may have grown)
    charge(steps);
    return t;
}

void Automaton::over_budget() {
    throw Error(Code::InvalidRequest,
                fmt::format("the grammar needs more than {} steps of matching work for one token (the limit); "
                            "simplify its repeated or optional parts",
                            max_work_));
}

Automaton::Counting::Counting(Automaton& a, int32_t s) : a_(a), s_(s) {
    a_.counting_ = true;
    a_.work_ = 0;
}

Automaton::Counting::~Counting() {
    a_.counting_ = false;
    a_.stats_.total_work += a_.work_;
    if (s_ < 0) return;  // (advance)
    a_.stats_.last_mask_work = a_.work_;
    a_.stats_.max_mask_work = std::max(a_.stats_.max_mask_work, a_.work_);
    if (a_.work_ > a_.max_work_) a_.states_[size_t(s_)].over_budget = true;
}

Automaton::Position Automaton::start() {
    std::lock_guard lock(mu_);
    Position p;
    p.key = start_key_;
    return p;
}

bool Automaton::advance(Position& p, std::string_view bytes) {
    std::lock_guard lock(mu_);
    if (states_.size() > kMaxStates) reset();
    // A token's bytes whose steps the mask did not compute (a cut state's
    // walk decides tokens without the full state's steps): bounded as a
    // mask is.
    Counting counting(*this, -1);
    int32_t s = resolve(p);
    if (s < 0) return false;
    for (unsigned char b : bytes) {
        s = step(s, b);
        if (s < 0) return false;
    }
    p.key = states_[size_t(s)].key;
    p.id = s;
    return true;
}

bool Automaton::accepting(Position& p) {
    std::lock_guard lock(mu_);
    const int32_t s = resolve(p);
    return s >= 0 && states_[size_t(s)].accepting;
}

bool Automaton::complete(Position& p) {
    std::lock_guard lock(mu_);
    const int32_t s = resolve(p);
    return s >= 0 && states_[size_t(s)].complete;
}

void Automaton::walk(int32_t s, uint32_t begin, uint32_t end, Mask& m, Partial* cut) {
    // Preorder: walk_ids_[d] is the state after the first d bytes of the
    // current node's path (path_ holds those bytes when cutting).
    const auto& nodes = vocab_->nodes();
    const auto& toks = vocab_->tokens();
    uint32_t* bits = m.data();
    walk_ids_[nodes[begin].depth - 1] = s;
    size_t visited = 0;
    for (uint32_t i = begin; i < end;) {
        const auto& n = nodes[i];
        ++visited;
        charge(1);
        const int32_t t = step(walk_ids_[n.depth - 1], n.byte);
        if (t < 0) {
            i = n.skip;
            continue;
        }
        if (cut) {
            path_[n.depth - 1] = char(n.byte);
            if (states_[size_t(t)].left_frames) {  // decided only by what lies below the cut
                cut->open.emplace_back(i, path_.substr(0, n.depth - 1));
                i = n.skip;
                continue;
            }
        }
        walk_ids_[n.depth] = t;
        for (uint32_t k = n.tok_begin; k < n.tok_end; ++k) bits[uint32_t(toks[k]) / 32] |= 1u << (uint32_t(toks[k]) % 32);
        ++i;
    }
    stats_.walk_nodes += visited;
}

std::shared_ptr<const Automaton::Partial> Automaton::partial(int32_t t) {
    if (states_[size_t(t)].partial) return states_[size_t(t)].partial;
    auto p = std::make_shared<Partial>();
    p->decided.assign((vocab_->size() + 31) / 32, 0u);
    walk(t, 0, uint32_t(vocab_->nodes().size()), p->decided, p.get());
    ++stats_.mask_walks;
    cache_limit();
    ++masks_;
    states_[size_t(t)].partial = p;
    return p;
}

void Automaton::cache_limit() {
    if (masks_ < kMaxCachedMasks) return;
    for (auto& st : states_) st.mask.reset(), st.partial.reset();
    masks_ = 0;
}

std::shared_ptr<const Mask> Automaton::mask(Position& p) {
    std::lock_guard lock(mu_);
    if (states_.size() > kMaxStates) reset();
    const int32_t s = resolve(p);
    if (s < 0 || vocab_->nodes().empty()) return std::make_shared<Mask>((vocab_->size() + 31) / 32, 0u);
    return mask_of(s);
}

std::shared_ptr<const Mask> Automaton::mask_of(int32_t s) {
    if (states_[size_t(s)].mask) return states_[size_t(s)].mask;
    if (states_[size_t(s)].over_budget) over_budget();
    // Counted repeats: a state whose counts differ only above the longest
    // token's length shares one mask (otherwise every token of x{1000}
    // is a new state and a walk of the trie).
    if (auto clamped = detail::clamp_counts(*g_, states_[size_t(s)].key, vocab_->max_depth());
        clamped != states_[size_t(s)].key) {
        auto m = mask_of(intern(std::move(clamped)));
        cache_limit();
        states_[size_t(s)].mask = m;
        ++masks_;
        return m;
    }
    auto m = std::make_shared<Mask>((vocab_->size() + 31) / 32, 0u);
    Counting counting(*this, s);  // the work of this one mask, bounded (kMaxMaskWork)
    size_t max_len = 0, n_stacks = 0;
    auto cut = detail::truncate_key(states_[size_t(s)].key, max_len, n_stacks);
    // Near the limits the cut state could keep stacks the full one drops:
    // walk the full state there (and where nothing was cut).
    if (cut == states_[size_t(s)].key || max_len + 8 >= kMaxStackDepth || n_stacks * 2 > kMaxStacks) {
        walk(s, 0, uint32_t(vocab_->nodes().size()), *m);
        ++stats_.mask_walks;
    } else {
        const auto part = partial(intern(std::move(cut)));
        *m = part->decided;
        for (const auto& [node, prefix] : part->open) {
            int32_t st = s;
            for (unsigned char b : prefix)
                if (st >= 0) st = step(st, b);
            if (st >= 0) walk(st, node, vocab_->nodes()[node].skip, *m);
        }
    }
    bool any = states_[size_t(s)].accepting && !vocab_->eog().empty();
    for (size_t w = 0; w < m->size() && !any; ++w) any = (*m)[w] != 0;
    // Only nesting past the stack limit leaves a state with no way on;
    // an all-zero mask would be refused by the engine for the whole step.
    if (!any)
        throw Error(Code::InvalidRequest, fmt::format("the output cannot continue: every allowed token would nest "
                                                      "deeper than the matcher's {}-level stack", kMaxStackDepth));
    if (states_[size_t(s)].accepting)
        for (int32_t id : vocab_->eog()) (*m)[uint32_t(id) / 32] |= 1u << (uint32_t(id) % 32);
    cache_limit();
    states_[size_t(s)].mask = m;
    ++masks_;
    return m;
}

Automaton::Stats Automaton::stats() const {
    std::lock_guard lock(mu_);
    Stats s = stats_;
    s.states = states_.size();
    s.masks = masks_;
    return s;
}

bool Matcher::accept(int32_t token) {
    if (token < 0 || size_t(token) >= a_->vocab().size()) return false;
    if (a_->vocab().is_eog(token)) return accepting();
    const std::string& b = a_->vocab().bytes(token);
    if (b.empty()) return false;
    return a_->advance(pos_, b);
}

}  // namespace eh::constrain
