#include "eh/service/chat_prompt.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

std::vector<int32_t> ByteCodec::encode(std::string_view text, bool, bool, std::span<const TextSpan>) const {
    std::vector<int32_t> out;
    out.reserve(text.size());
    for (unsigned char c : text) out.push_back(int32_t(c) % int32_t(vocab_));
    return out;
}

std::string ByteCodec::decode(std::span<const int32_t> tokens) const {
    std::string out;
    for (int32_t t : tokens)
        if (t >= 0 && t < 256 && !is_eog(t)) out.push_back(char(t));
    return out;
}

ChatPrompt ByteCodec::render_chat(const std::vector<ChatMessage>& messages, const std::function<bool()>&,
                                  const ChatRenderOptions&) const {
    return {render_plain_chat(messages), {}};  // no control tokens: nothing to keep literal
}

}  // namespace eh::service
