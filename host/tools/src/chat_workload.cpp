#include "eh/tools/chat_workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace eh::tools {
namespace {

// One token each, with a leading space, in the vocabularies the header
// names (checked by tests/tools/chat_workload_test.cpp against Qwen2.5's
// and gpt-oss's tokenizer.json).
constexpr const char* kWords[256] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "it", "by", "at", "from", "his",
    "he", "this", "are", "be", "had", "an", "which", "or", "have", "not", "were", "they", "but", "her", "she",
    "their", "one", "all", "there", "been", "has", "who", "more", "when", "will", "would", "so", "what", "about",
    "if", "out", "them", "into", "some", "time", "only", "other", "than", "then", "its", "new", "two", "first",
    "like", "over", "also", "people", "after", "these", "many", "most", "may", "years", "any", "very", "could",
    "well", "such", "where", "between", "through", "year", "just", "made", "way", "because", "each", "back", "used",
    "those", "both", "world", "part", "same", "while", "during", "before", "under", "state", "city", "must", "since",
    "being", "three", "own", "down", "long", "good", "high", "great", "last", "find", "house", "even", "often",
    "without", "place", "around", "still", "small", "life", "found", "another", "later", "second", "best", "might",
    "number", "name", "work", "water", "against", "however", "until", "school", "following", "early", "set",
    "called", "end", "days", "family", "home", "use", "river", "light", "story", "night", "morning", "garden",
    "market", "road", "bridge", "window", "table", "letter", "music", "friend", "teacher", "doctor", "village",
    "forest", "mountain", "winter", "summer", "spring", "question", "answer", "reason", "problem", "plan", "idea",
    "word", "book", "paper", "voice", "color", "field", "island", "ocean", "station", "train", "boat", "horse",
    "bird", "tree", "stone", "fire", "rain", "wind", "snow", "cloud", "street", "door", "room", "kitchen", "lamp",
    "chair", "bread", "apple", "coffee", "dinner", "office", "money", "price", "power", "energy", "science",
    "history", "simple", "clear", "quiet", "bright", "dark", "warm", "cold", "quick", "slow", "happy", "careful",
    "strong", "young", "old", "open", "close", "walk", "read", "write", "speak", "listen", "carry", "build", "grow",
    "learn", "teach", "help", "move", "turn", "start", "stop", "leave", "bring", "keep", "hold", "follow", "watch",
    "glass", "paint", "sound", "picture", "travel", "dream", "circle", "square", "sister", "brother", "mother",
    "father", "child"};

// splitmix64: a fixed, portable generator (std::uniform_*_distribution
// differ between standard libraries).
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double unit() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
    uint32_t between(uint32_t lo, uint32_t hi) { return lo + uint32_t(next() % (uint64_t(hi) - lo + 1)); }
};

// A stream of its own for every (seed, level, index).
Rng stream(uint64_t seed, uint64_t level, uint64_t index) {
    Rng r{seed};
    r.s ^= Rng{(level << 32) ^ index ^ 0x5bd1e995ull}.next();
    r.next();
    return r;
}

void append_words(std::string& out, Rng& r, uint32_t n) {
    uint64_t bits = 0;
    for (uint32_t i = 0; i < n; ++i) {
        if (i % 8 == 0) bits = r.next();
        if (i) out += ' ';
        out += kWords[bits & 0xff];
        bits >>= 8;
    }
}

constexpr uint64_t kPreambleLevel = 0xffffffffull;

}  // namespace

std::string check(const ChatWorkload& w) {
    if (w.prompt_words_min < 1 || w.prompt_words_min > w.prompt_words_max || w.prompt_words_max > kChatMaxWords)
        return fmt::format("--prompt-words takes MIN:MAX with 1 <= MIN <= MAX <= {}", kChatMaxWords);
    if (w.preamble_words > kChatMaxWords) return fmt::format("--preamble-words must be 0-{}", kChatMaxWords);
    if (!(w.shared_prefix >= 0 && w.shared_prefix <= 1)) return "--shared-prefix must be between 0 and 1";
    if (w.answer_tokens_min < 1 || w.answer_tokens_min > w.answer_tokens_max ||
        w.answer_tokens_max > kChatMaxAnswerTokens)
        return fmt::format("--answer-tokens takes MIN:MAX with 1 <= MIN <= MAX <= {}", kChatMaxAnswerTokens);
    return {};
}

std::string chat_preamble(const ChatWorkload& w) {
    Rng r = stream(w.seed, kPreambleLevel, 0);
    std::string s;
    append_words(s, r, w.preamble_words);
    return s;
}

ChatRequest chat_request(const ChatWorkload& w, const std::string& preamble, uint32_t level, uint32_t index) {
    Rng r = stream(w.seed, level, index);
    ChatRequest q;
    // Each draw is taken whether or not it is used, so one setting does not
    // shift the others' draws.
    const double share = r.unit(), length = r.unit();
    q.max_tokens = r.between(w.answer_tokens_min, w.answer_tokens_max);
    q.shared = w.preamble_words > 0 && share < w.shared_prefix;
    const double lo = std::log(double(w.prompt_words_min)), hi = std::log(double(w.prompt_words_max));
    q.own_words = std::clamp(uint32_t(std::lround(std::exp(lo + length * (hi - lo)))), w.prompt_words_min,
                             w.prompt_words_max);
    if (q.shared) q.prompt = preamble + "\n\n";
    append_words(q.prompt, r, q.own_words);
    return q;
}

}  // namespace eh::tools
