// The chat template serve formats chat requests with: a --chat-template-file
// given on the command line, else the model's own (tokenizer.chat_template,
// or the template beside a tokenizer.json), compiled once at startup.
#pragma once

#include <boost/program_options/variables_map.hpp>

#include <memory>
#include <optional>
#include <string>

#include "eh/service/text_codec.hpp"
#include "eh/tokenizer/chat_template.hpp"

namespace eh::cli {

// The largest --chat-template-file: real templates are a few KiB to some
// tens of KiB (gpt-oss's is 16 KiB); 1 MiB leaves room and bounds memory.
inline constexpr size_t kMaxChatTemplateFileBytes = size_t(1) << 20;
inline constexpr const char* kChatTemplateFileHelp =
    "Jinja chat template (a regular file of at most 1 MiB) used for chat requests instead of the model's own";

struct ChatTemplateChoice {
    std::shared_ptr<const tokenizer::ChatTemplate> compiled;  // null unless state.kind is Ok
    std::string source;                                       // the template's text ("" for none)
    service::ChatTemplateState state;
};

// --chat-template-file PATH, read and compiled. Throws Error(InvalidRequest)
// naming the path and the reason (not a regular file, unreadable, empty,
// over kMaxChatTemplateFileBytes, or the compile error with its line): serve
// exits 2 before it binds its port.
ChatTemplateChoice chat_template_from_file(const std::string& path);

// --chat-template-file as serve and chat take it (kChatTemplateFileHelp):
// `out` stays nullopt when it is not given. For a file that cannot be used
// it prints the error and returns false (the caller exits 2).
bool chat_template_option(const boost::program_options::variables_map& vm, std::optional<ChatTemplateChoice>& out);

// The model's own template (`source`, "" when it has none). A template that
// does not compile is Kind::Rejected with the compile error; never throws
// for it.
ChatTemplateChoice chat_template_from_model(const std::string& source);

}  // namespace eh::cli
