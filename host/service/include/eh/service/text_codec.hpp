// What the service needs from a tokenizer. The service never depends on a
// concrete tokenizer: cmd_serve adapts the real one (host/tokenizer) to this,
// and tests use ByteCodec.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eh/error.hpp"

namespace eh::service {

// A call an assistant message made (OpenAI's tool_calls[i]).
struct ChatToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // as the client sent it: JSON text, normally an object
};

struct ChatMessage {
    std::string role;     // system, user, assistant, developer, tool
    std::string content;
    std::string reasoning;               // assistant: reasoning_content (the template's `thinking`)
    std::vector<ChatToolCall> tool_calls;  // assistant only
    std::string tool_call_id;            // tool: the call this answers
    std::string name;                    // tool/user: the optional `name`
    // Where the request's images sit in `content` (byte offsets, ascending;
    // images are numbered over all messages in order): each becomes
    // kImageMarker when the chat is rendered.
    std::vector<size_t> image_at;
};

// What a chat template gets besides the messages.
struct ChatRenderOptions {
    std::string tools_json;  // JSON array of {type, function:{name, description, parameters}}, "" for none
    std::string extra_json;  // JSON object of extra template variables ({"reasoning_effort":"low"}), "" for none
};

// How a model writes tool calls, told by its chat template (chat_output.hpp
// parses each).
enum class ToolFormat {
    None,     // the template has no tool format (Phi-3, plain transcripts)
    Hermes,   // <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> (Qwen2.5)
    Harmony,  // gpt-oss: channels; calls on commentary to=functions.NAME ... <|call|>
};

// Whether chat requests can be templated, and how (/health's
// `chat_template`, the `ready` log line, `inspect`).
struct ChatTemplateState {
    enum class Kind {
        Ok,        // a template compiled: the model's own, or --chat-template-file
        None,      // the model has none: chats are the plain transcript (render_plain_chat)
        Rejected,  // the model's own failed to compile: chat requests are refused (ChatTemplateUnusable)
    };
    Kind kind = Kind::None;
    std::string source;  // Ok: "model" or "file" (--chat-template-file); Rejected: "model"
    std::string error;   // Rejected: the compile error ("chat template line 1: nesting deeper than 200 levels")
};

// "ok", "none" or "rejected": the stable words of /health and the logs.
const char* chat_template_kind_name(ChatTemplateState::Kind kind);

// A chat request to a model whose own chat template did not compile (and no
// --chat-template-file replaced it): never a plain transcript the model was
// not trained on. HTTP 400 with the code CHAT_TEMPLATE_UNUSABLE.
class ChatTemplateUnusable : public Error {
public:
    explicit ChatTemplateUnusable(const ChatTemplateState& state);
};

// Byte range [begin, end) of a prompt.
struct TextSpan {
    size_t begin = 0, end = 0;
    bool operator==(const TextSpan&) const = default;
};

// A rendered chat prompt. Its control-token text ("<|im_start|>") becomes
// ids, except inside `literal`: the parts of the messages' own text that
// spell a control token ("</s>" typed by a user is four characters, as on
// /execute, never the end-of-sequence id).
struct ChatPrompt {
    std::string text;
    std::vector<TextSpan> literal;  // sorted, not overlapping
};

class TextCodec {
public:
    virtual ~TextCodec() = default;
    // Text to token ids; `add_special` adds the model's BOS (if it uses one);
    // `parse_special` maps control-token text ("<|im_start|>") to its id —
    // only for text the server built (chat templates), never for raw prompts.
    // With parse_special, control-token text inside a `literal` span is
    // plain text all the same (a chat's messages: ChatPrompt).
    virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special = false,
                                        std::span<const TextSpan> literal = {}) const = 0;
    // Token ids to raw bytes. May end in the middle of a UTF-8 sequence (byte
    // tokens); TextStream takes care of that.
    virtual std::string decode(std::span<const int32_t> tokens) const = 0;
    // The same, with control tokens written as their text (<|channel|>): for
    // output formats whose structure is in control tokens (harmony).
    virtual std::string decode_with_control(std::span<const int32_t> tokens) const { return decode(tokens); }
    // The bytes the token adds to an output in mid-stream (SPM's "▁" as a
    // space, even where decode() would strip it at the start; a byte-fallback
    // token is its one byte); "" for control tokens. The constrained-decoding
    // mask matches these; logprobs report them.
    virtual std::string token_bytes(int32_t token) const = 0;
    // End-of-generation tokens (EOS, EOT, <|im_end|>, ...).
    virtual bool is_eog(int32_t token) const = 0;
    virtual uint32_t vocab_size() const = 0;
    // "bytes", "spm", "bpe", ... for /health.
    virtual std::string kind() const = 0;
    // The tokenizer's beginning- and end-of-sequence ids, -1 for none (for /health).
    virtual int32_t bos_id() const { return -1; }
    virtual int32_t eos_id() const { return -1; }
    // The prompt a chat model expects for these messages, ending with the
    // assistant turn's opening. Throws eh::Error(InvalidRequest) for messages
    // the template cannot express, Error(Cancelled) once `cancelled` answers
    // true (polled while a template runs). `options`: tools and extra
    // template variables. Requests reach it through render_chat_prompt; a
    // codec with a template builds it with compose_chat_prompt (both in
    // chat_prompt.hpp), supplying only the template's evaluation.
    virtual ChatPrompt render_chat(const std::vector<ChatMessage>& messages,
                                   const std::function<bool()>& cancelled = {},
                                   const ChatRenderOptions& options = {}) const = 0;
    // The model's tool-call format, from its chat template.
    virtual ToolFormat tool_format() const { return ToolFormat::None; }
    // Which template render_chat uses; with Kind::Rejected, render_chat and
    // render_chat_prompt throw ChatTemplateUnusable.
    virtual ChatTemplateState chat_template_state() const { return {}; }
};

// One token per byte (id = byte value), no special tokens except an optional
// end id. For tests and byte-level models.
class ByteCodec : public TextCodec {
public:
    explicit ByteCodec(uint32_t vocab = 256, int32_t eog = -1) : vocab_(vocab), eog_(eog) {}
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special = false,
                                std::span<const TextSpan> literal = {}) const override;
    std::string decode(std::span<const int32_t> tokens) const override;
    std::string token_bytes(int32_t token) const override { return decode(std::span<const int32_t>(&token, 1)); }
    bool is_eog(int32_t token) const override { return eog_ >= 0 && token == eog_; }
    uint32_t vocab_size() const override { return vocab_; }
    std::string kind() const override { return "bytes"; }
    ChatPrompt render_chat(const std::vector<ChatMessage>& messages, const std::function<bool()>& cancelled = {},
                           const ChatRenderOptions& options = {}) const override;

private:
    uint32_t vocab_;
    int32_t eog_;
};

}  // namespace eh::service
