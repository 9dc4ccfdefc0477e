#include "chat_template_choice.hpp"

#include "cli.hpp"
#include "eh/error.hpp"
#include "eh/regular_file.hpp"

namespace eh::cli {

ChatTemplateChoice chat_template_from_file(const std::string& path) {
    auto fail = [&](const std::string& why) { return Error(Code::InvalidRequest, "--chat-template-file " + why); };
    std::string problem;
    std::optional<std::string> text = read_regular_file(path, kMaxChatTemplateFileBytes, problem);
    if (!text) throw fail(problem);
    if (text->empty()) throw fail(path + " is empty");
    ChatTemplateChoice c;
    try {
        c.compiled = tokenizer::ChatTemplate::compile(*text);
    } catch (const Error& e) {
        throw fail(path + ": " + e.what());  // "chat template line 3: unsupported statement 'foo'"
    }
    c.source = std::move(*text);
    c.state = {service::ChatTemplateState::Kind::Ok, "file", ""};
    return c;
}

bool chat_template_option(const boost::program_options::variables_map& vm, std::optional<ChatTemplateChoice>& out) {
    if (!vm.count("chat-template-file")) return true;
    try {
        out = chat_template_from_file(vm["chat-template-file"].as<std::string>());
        return true;
    } catch (const Error& e) {
        print_error(e.what());
        return false;
    }
}

ChatTemplateChoice chat_template_from_model(const std::string& source) {
    ChatTemplateChoice c;
    if (source.empty()) return c;  // Kind::None: the plain transcript
    try {
        c.compiled = tokenizer::ChatTemplate::compile(source);
        c.state = {service::ChatTemplateState::Kind::Ok, "model", ""};
        c.source = source;
    } catch (const Error& e) {
        c.state = {service::ChatTemplateState::Kind::Rejected, "model", e.what()};
    }
    return c;
}

}  // namespace eh::cli
