// The model side of `engine-host chat`: one model loaded through the best
// plugin and driven through the host's service in this process (no HTTP).
// The only coupling to host/service is Service's public header: submit a
// GenerationRequest, read the job's events, cancel by job id.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat_template_choice.hpp"
#include "eh/registry.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::cli {

struct ChatSettings {
    std::string model_path;
    std::vector<std::string> plugin_dirs;
    int gpu = 0;
    bool gpu_named = false;  // --gpu given: a request for that GPU (device_choice.hpp)
    DevicePolicy device = DevicePolicy::Auto;  // --device (device_choice.hpp)
    uint32_t threads = 0;
    uint32_t ctx_size = 0;        // 0: the model's trained context
    uint32_t kv_type = 0;         // --kv-cache-type (ABI 1.4 kv_type); 0: the plugin's default
    uint32_t max_tokens = 512;    // per reply
    double temperature = 0.7;
    double top_p = 0.95;
    int32_t top_k = 40;
    std::optional<uint64_t> seed;
    std::optional<ChatTemplateChoice> chat_template;  // --chat-template-file; nullopt: the model's own
};

class ChatSession {
public:
    // Throws service::ChatTemplateUnusable when the model's own template
    // does not compile and none was given: a chat has nothing else to do.
    explicit ChatSession(const ChatSettings& s);
    ~ChatSession();

    // Generates the assistant's reply to `messages`, passing text to `on_text`
    // as it is decoded. Returns the reply; stops early (keeping what was
    // written) when `stop` becomes true. The reply is at most max_tokens and
    // at most what the context has left after the rendered conversation;
    // `filled` (if given) says whether the context, not max_tokens, ended it.
    // Throws eh::Error: Code::ContextFull when the conversation leaves no
    // room for a reply, others for a request the model cannot take.
    std::string reply(const std::vector<service::ChatMessage>& messages, const std::function<void(const std::string&)>& on_text,
                      const std::atomic<bool>& stop, bool* filled = nullptr);

    std::string describe() const;  // "model via plugin, context N"
    uint32_t context_tokens() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace eh::cli
