// The "Tokenizer" block of `inspect`: loads the tokenizer the server would
// use, so a file whose vocabulary cannot be loaded is caught here too, and
// compiles its chat template as serve does.
#include "chat_template_choice.hpp"
#include "cli.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tokenizer/tokenizer.hpp"

namespace eh::cli {
namespace {

// What serve does with the model's own chat template.
std::string template_verdict(const service::ChatTemplateState& t) {
    using Kind = service::ChatTemplateState::Kind;
    if (t.kind == Kind::Ok) return "compiles";
    if (t.kind == Kind::None) return "none (chat requests get a plain role: text transcript)";
    return "rejected: " + t.error + " (serve refuses chat requests unless --chat-template-file replaces it)";
}

}  // namespace

std::optional<Error> append_tokenizer_section(const model::ModelFile& file, std::vector<model::InspectSection>& out,
                                              const std::string& template_file) {
    model::InspectSection s{"Tokenizer", {}, {}};
    std::optional<std::filesystem::path> hf_dir;
    if (file.format() == EH_FORMAT_SAFETENSORS) hf_dir = file.path();
    try {
        auto tok = tokenizer::load_tokenizer(file.view(), hf_dir);
        auto id = [](int32_t v) { return v < 0 ? std::string("-") : std::to_string(v); };
        const auto& sp = tok->special();
        s.facts = {{"kind", std::string(tok->kind())},
                   {"vocab_size", std::to_string(tok->vocab_size())},
                   {"bos_id", id(sp.bos)},
                   {"eos_id", id(sp.eos)},
                   {"eot_id", id(sp.eot)},
                   {"pad_id", id(sp.pad)},
                   {"add_bos", tok->add_bos() ? "yes" : "no"},
                   {"chat_template", template_verdict(chat_template_from_model(tok->chat_template()).state)}};
        if (!template_file.empty())
            s.facts.push_back({"chat_template in use", "--chat-template-file " + template_file + ": compiles (replaces the model's)"});
        if (auto pre = file.get_string("tokenizer.ggml.pre")) s.facts.push_back({"pre-tokenizer", std::string(*pre)});
    } catch (const Error& e) {
        s.facts = {{"error", std::string(code_name(e.code())) + ": " + e.what()}};
        out.push_back(std::move(s));
        return e;
    }
    out.push_back(std::move(s));
    return std::nullopt;
}

}  // namespace eh::cli
