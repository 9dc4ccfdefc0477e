#include "eh/service/chat_prompt.hpp"

namespace eh::service {

std::string render_plain_chat(const std::vector<ChatMessage>& messages) {
    std::string out;
    for (const auto& m : messages) out += m.role + ": " + m.content + "\n";
    out += "assistant:";
    return out;
}

}  // namespace eh::service
