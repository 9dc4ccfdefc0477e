// A TokenVocab from a real tokenizer, as the server builds it: each token's
// piece (control tokens add nothing), end-of-generation ids apart.
#pragma once

#include <filesystem>
#include <memory>

#include "eh/constrain/vocab.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tokenizer/tokenizer.hpp"

namespace eh::constrain::test {

inline std::filesystem::path testdata() { return EH_TESTDATA_DIR; }

inline std::shared_ptr<const TokenVocab> vocab_of(const tokenizer::Tokenizer& tok) {
    std::vector<std::string> bytes(tok.vocab_size());
    std::vector<int32_t> eog;
    for (size_t i = 0; i < bytes.size(); ++i) {
        const auto id = int32_t(i);
        if (tok.is_eog(id)) eog.push_back(id);
        else if (!tok.is_special(id)) bytes[i] = tok.token_to_piece(id, false);
    }
    return std::make_shared<const TokenVocab>(std::move(bytes), std::move(eog));
}

inline std::unique_ptr<tokenizer::Tokenizer> load(const std::string& which) {
    if (which == "qwen2.5") return tokenizer::Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5/tokenizer.json");
    auto file = model::ModelFile::open((testdata() / "vocab" / ("ggml-vocab-" + which + ".gguf")).string());
    return tokenizer::Tokenizer::from_view(file->view());
}

}  // namespace eh::constrain::test
