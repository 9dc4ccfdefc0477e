// Tokenizer facts for `inspect`. Until the tokenizer library is linked, the
// facts come straight from the metadata the file carries.
#include "cli.hpp"
#include "eh/model/model_file.hpp"

namespace eh::cli {

void append_tokenizer_section(const model::ModelFile& file, std::vector<model::InspectSection>& out) {
    model::InspectSection s{"Tokenizer", {}, {}};
    auto str = [&](const char* key) { auto v = file.get_string(key); return v ? std::string(*v) : std::string("-"); };
    auto num = [&](const char* key) { auto v = file.get_uint(key); return v ? std::to_string(*v) : std::string("-"); };
    if (file.format() == EH_FORMAT_SAFETENSORS) {
        s.facts.push_back({"kind", "hf-json"});
        s.facts.push_back({"file", file.path() + "/tokenizer.json"});
    } else {
        std::string model = str("tokenizer.ggml.model");
        s.facts.push_back({"kind", model == "gpt2" ? "gguf-bpe" : model == "llama" ? "gguf-spm" : model});
        s.facts.push_back({"pre-tokenizer", str("tokenizer.ggml.pre")});
        s.facts.push_back({"vocab_size", std::to_string(file.get_string_array("tokenizer.ggml.tokens").size())});
        s.facts.push_back({"merges", std::to_string(file.get_string_array("tokenizer.ggml.merges").size())});
    }
    s.facts.push_back({"bos_id", num("tokenizer.ggml.bos_token_id")});
    s.facts.push_back({"eos_id", num("tokenizer.ggml.eos_token_id")});
    s.facts.push_back({"chat_template", file.has("tokenizer.chat_template") ? "yes" : "no"});
    out.push_back(std::move(s));
}

}  // namespace eh::cli
