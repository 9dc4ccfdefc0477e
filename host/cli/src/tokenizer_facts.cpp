// The "Tokenizer" block of `inspect`: loads the tokenizer the server would
// use, so a file whose vocabulary cannot be loaded is caught here too.
#include "cli.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tokenizer/tokenizer.hpp"

namespace eh::cli {

std::optional<Error> append_tokenizer_section(const model::ModelFile& file, std::vector<model::InspectSection>& out) {
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
                   {"chat_template", tok->chat_template().empty() ? "no" : "yes"}};
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
