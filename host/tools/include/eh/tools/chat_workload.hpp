// The chat-like workload of `engine-host loadgen --workload chat`: prompts
// of a few hundred to a few thousand words, a fraction of them behind one
// shared preamble (a system prompt every such request repeats, which the
// server's prefix cache can reuse), answers of a drawn length. Everything is
// drawn from the seed with a fixed generator (splitmix64), so the same
// workload gives the same requests on any machine; the text is words from a
// fixed list of 256 common English words, each one token (with its leading
// space) in the Qwen2.5, gpt-oss (o200k), GPT-2 and Phi-3 vocabularies, so a
// word is about a token on today's large models.
#pragma once

#include <cstdint>
#include <string>

namespace eh::tools {

struct ChatWorkload {
    // The request's own words, drawn log-uniformly from [min, max] (short
    // prompts as common as long ones: as many between 200 and 775 as between
    // 775 and 3,000).
    uint32_t prompt_words_min = 200, prompt_words_max = 3000;
    uint32_t preamble_words = 1000;  // the shared preamble's length; 0: none
    double shared_prefix = 0.5;      // chance that a request starts with the preamble
    // max_tokens of each request, uniform in [min, max] (ignore_eos makes it
    // the answer's length).
    uint32_t answer_tokens_min = 100, answer_tokens_max = 200;
    uint64_t seed = 1;
};

// What check() allows.
constexpr uint32_t kChatMaxWords = 200000;
constexpr uint32_t kChatMaxAnswerTokens = 65536;

// Empty when the workload is usable, else why not (the flag's name first).
std::string check(const ChatWorkload& w);

struct ChatRequest {
    std::string prompt;
    uint32_t own_words = 0;    // words after the preamble (all of them when not shared)
    bool shared = false;       // begins with the preamble, then a blank line
    uint32_t max_tokens = 0;
};

// The shared preamble (the seed's own; the same for every level).
std::string chat_preamble(const ChatWorkload& w);
// Request `index` of the level keyed `level` (loadgen: its place in --levels
// and its client count, so two levels never send the same prompt);
// `preamble` is chat_preamble(w).
ChatRequest chat_request(const ChatWorkload& w, const std::string& preamble, uint32_t level, uint32_t index);

}  // namespace eh::tools
