#include "eh/service/chat_prompt.hpp"

namespace eh::service {

ChatPrompt compose_chat_prompt(const std::vector<ChatMessage>& messages, const ChatLiterals& literals,
                               const ApplyTemplate& apply, const std::string& bos) {
    const std::vector<ChatMessage> marked = literals.mark(messages);
    const std::string out = apply ? apply(template_messages_json(marked)) : render_plain_chat(marked);
    ChatPrompt p = literals.unmark(out);
    // Chat prompts are encoded without add_special; a model that wants BOS
    // gets it here unless its template already wrote it.
    if (!bos.empty() && p.text.rfind(bos, 0) != 0) {
        p.text = bos + p.text;
        for (auto& s : p.literal) s.begin += bos.size(), s.end += bos.size();
    }
    return p;
}

}  // namespace eh::service
