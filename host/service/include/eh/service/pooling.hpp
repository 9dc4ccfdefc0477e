// Serving a model's final hidden states instead of text: embeddings (the
// last token's state, L2-normalised) and rerank scores (a yes/no classifier
// over that state). A server runs in one of these modes or generates text;
// the mode comes from the model's GGUF `<arch>.pooling_type` or the serve
// flags (--embedding, --rerank).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/text_codec.hpp"

namespace eh::service {

enum class PoolingMode { None, Embedding, Rerank };
const char* pooling_mode_name(PoolingMode m);  // "none", "embedding", "rerank"

// llama.cpp's numbering of `<arch>.pooling_type` (its converter writes it):
// 0 none, 1 mean, 2 cls, 3 last, 4 rank. Only last-token pooling is served
// (ABI 1.5 hands out the last position's state): mean and cls models are
// refused by name.
enum class GgufPooling : int64_t { None = 0, Mean = 1, Cls = 2, Last = 3, Rank = 4 };

// Per request: inputs (embeddings) or documents (rerank), and their tokens
// together. A single input is bounded by the context.
inline constexpr size_t kMaxPooledInputs = 2048;
inline constexpr uint64_t kMaxPooledTokens = 1u << 20;

struct PoolingSpec {
    PoolingMode mode = PoolingMode::None;
    // Rerank: the score is sigmoid(head . h), head = the classifier's "yes"
    // row minus its "no" row (softmax over the two logits, P(yes)).
    std::vector<float> rerank_head;
    // Rerank: the prompt, with {query} and {document} where they go.
    std::string rerank_template;
    std::string head_source;  // which tensor the head came from, for the log
};

// One input of an embeddings or rerank request: text to tokenize, or token
// ids as given.
struct PooledInput {
    std::string text;
    std::vector<TextSpan> literal;     // spans of `text` never read as control tokens
    bool add_special = true;
    bool parse_special = false;
    bool is_tokens = false;
    std::vector<int32_t> tokens;
};

// The Qwen3-Reranker prompt of its model card (llama.cpp's converter writes
// the same as the GGUF's `tokenizer.chat_template.rerank`).
extern const char* const kQwen3RerankTemplate;

// `v` scaled to unit L2 norm (a zero vector stays zero).
std::vector<float> l2_normalized(std::span<const float> v);

// sigmoid(head . h); throws Error(Internal) when the sizes differ.
double rerank_score(const PoolingSpec& spec, std::span<const float> hidden);

// The rerank prompt for one document: `tmpl` with {query} and {document}
// put in. `literal` gets the spans of the user's text, which the tokenizer
// never reads as control tokens.
std::string render_rerank(std::string_view tmpl, std::string_view query, std::string_view document,
                          std::vector<TextSpan>& literal);

// Little-endian float32 bytes, base64 (OpenAI's encoding_format "base64").
std::string base64_floats(std::span<const float> v);

}  // namespace eh::service
