// Generation requests: the service's input, what host/http parses every
// endpoint's body into (host/http/src/parse/), and the rules they share.
// Every rule a request breaks is reported as eh::Error(InvalidRequest)
// naming the field (RequestError).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eh/error.hpp"
#include "eh/image/image.hpp"
#include "eh/service/text_codec.hpp"
#include "eh/service/tool_request.hpp"

namespace eh::constrain {
struct Grammar;
}

namespace eh::service {

// A validation failure, with the offending field ("" for the body itself).
class RequestError : public Error {
public:
    RequestError(std::string field, const std::string& message)
        : Error(Code::InvalidRequest, message), field_(std::move(field)) {}
    const std::string& field() const { return field_; }

private:
    std::string field_;
};

// The largest n_ctx a request may name (the ABI's session limit); the
// service also caps it at the model's trained context length.
inline constexpr uint32_t kMaxRequestContext = 1u << 24;

struct RequestLimits {
    size_t max_body_bytes = 1 << 20;
    // Code points of a prompt, chat message or rendered chat; 0, the default:
    // no cap of its own (max_body_bytes bounds the text, the context the
    // prompt's tokens).
    size_t max_prompt_chars = 0;
    // --max-tokens-out; by default only the context bounds max_tokens.
    uint32_t max_tokens = kMaxRequestContext;
    size_t max_stop = 4;
    size_t max_stop_bytes = 256;
    size_t max_job_id_bytes = 256;
    size_t max_messages = 256;
    size_t max_logit_bias = 1024;      // entries in one request's logit_bias
    image::Limits images;              // images in chat messages: bytes, pixels, how many
};

struct Sampling {
    double temperature = 1.0;
    double top_p = 1.0;
    int32_t top_k = 0;
    double min_p = 0.0;
    double repetition_penalty = 1.0;
    double presence_penalty = 0.0;     // OpenAI's, over the tokens generated so far
    double frequency_penalty = 0.0;
    std::optional<uint64_t> seed;      // generated when absent
    // Added to the logits before sampling: (token id, -100..100). Ids are
    // checked against the vocabulary when the request is submitted.
    std::vector<std::pair<int32_t, float>> logit_bias;
    bool needs_batched_engine() const {
        return presence_penalty != 0.0 || frequency_penalty != 0.0 || !logit_bias.empty();
    }
};

// What the output must match, enforced while decoding by an allowed-token
// mask (host/constrain). Compiled when the request is submitted; a schema or
// grammar the compiler refuses is a 400 naming `field`.
struct OutputConstraint {
    enum class Kind { None, JsonObject, JsonSchema, Grammar, Prebuilt };
    Kind kind = Kind::None;
    // JsonSchema: the schema as JSON text; Grammar: the grammar text;
    // Prebuilt: a key naming `grammar` (equal keys must mean equal grammars:
    // compiled matcher tables are cached under it).
    std::string text;
    std::string field;      // the request field that asked for it, for errors
    std::shared_ptr<const constrain::Grammar> grammar;  // Prebuilt only (e.g. tool calls)
    bool active() const { return kind != Kind::None; }
};

struct GenerationRequest {
    std::string job_id;
    std::string prompt;                // text handed to the tokenizer
    bool add_special = true;           // let the tokenizer add BOS
    bool parse_special = false;        // control-token text becomes ids (chat templates only)
    std::vector<TextSpan> literal;     // ...except in these spans of prompt (a chat's messages)
    std::optional<uint32_t> max_tokens;  // absent: as many as fit, up to the limit
    // The context (prompt + output) this job needs: at most the server's,
    // since every sequence lives in the one KV-cache pool (more is a 400).
    std::optional<uint32_t> n_ctx;
    // The worker contract's output_mode: "text", "json" or "edits" as the
    // client named it, "" when absent or unknown. Recorded in the job's log;
    // it never changes generation.
    std::string output_mode;
    Sampling sampling;
    std::vector<std::string> stop;
    int top_logprobs = -1;             // -1: no logprobs; 0: the chosen token's only
    bool ignore_eos = false;           // keep generating past end-of-generation tokens (benchmarks)
    OutputConstraint constraint;       // response_format, grammar, json_schema, tool calls
    // Output text keeps control tokens (<|channel|>...): set for chat on
    // harmony models, whose output parser needs them.
    bool control_text = false;
    std::string correlation_id;
    std::string origin = "execute";    // metrics/log label: execute, completions, chat
    // Who may cancel the job by its id (POST /cancel): set by the HTTP layer
    // from the submitter's credentials or address; never logged.
    std::string owner;
    // Whose cached prefixes it may reuse (SchedulerOptions::prefix_cache_shared
    // aside): set by the HTTP layer to a digest of the API key it presented
    // when keys are configured, else ""; never logged.
    std::string cache_scope;
    // The LoRA adapter (a --lora NAME) it runs with; "" = the base model.
    // Set by the HTTP layer from `lora` or a `model` of "<model>:<adapter>".
    std::string adapter;
    // Images of a chat, in the order their markers (kImageMarker, outside
    // `literal`) appear in `prompt`; decoded by the HTTP layer. A server
    // without an image encoder (--mmproj) refuses a request that has any.
    std::vector<std::shared_ptr<const image::Rgb8>> images;
};

// What a chat request (OpenAI's or Anthropic's) has once parsed: the
// messages and tools its prompt is rendered from (chat_prompt.hpp), and the
// generation settings.
struct ChatRequest {
    GenerationRequest gen;
    std::vector<ChatMessage> messages; // gen.prompt is rendered later
    std::string model;
    bool stream = false;
    ChatToolRequest tools;             // tools, tool_choice, reasoning_effort
};

// The prompt rules (non-empty unless `allow_empty`, no NUL, at most
// limits.max_prompt_chars code points) for a prompt, a chat message or the
// rendered chat; RequestError naming `field`.
void check_prompt(const std::string& text, std::string_view field, const RequestLimits& limits,
                  bool allow_empty = false);

}  // namespace eh::service
