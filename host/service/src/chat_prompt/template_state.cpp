#include <fmt/format.h>

#include "eh/service/text_codec.hpp"

namespace eh::service {

const char* chat_template_kind_name(ChatTemplateState::Kind kind) {
    switch (kind) {
    case ChatTemplateState::Kind::Ok: return "ok";
    case ChatTemplateState::Kind::None: return "none";
    case ChatTemplateState::Kind::Rejected: return "rejected";
    }
    return "none";
}

ChatTemplateUnusable::ChatTemplateUnusable(const ChatTemplateState& state)
    : Error(Code::InvalidRequest,
            fmt::format("the model's chat template could not be compiled ({}), so chat requests cannot be "
                        "formatted; give a template with --chat-template-file FILE (a restart), or send a prompt "
                        "you format yourself to /v1/completions or /execute",
                        state.error)) {}

}  // namespace eh::service
