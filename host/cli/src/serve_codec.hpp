// The text codec the server uses: the model's tokenizer (host/tokenizer) and
// its chat template (chat_template_choice.hpp), adapted to the service's TextCodec interface.
#pragma once

#include <memory>
#include <optional>

#include "chat_template_choice.hpp"
#include "eh/model/model_file.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::cli {

// `chat`: the --chat-template-file template, which replaces the model's own;
// nullopt: the model's own, compiled here (a failure is the codec's
// chat_template_state(), Kind::Rejected, and chat requests are refused).
std::shared_ptr<service::TextCodec> make_codec(const model::ModelFile& file,
                                               std::optional<ChatTemplateChoice> chat = std::nullopt);

}  // namespace eh::cli
