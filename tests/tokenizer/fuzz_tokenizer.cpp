// libFuzzer target: arbitrary bytes through encode / decode / stream decode of
// the hf-json and GGUF backends. Built only with EH_ENABLE_FUZZERS=ON (clang).
//   ./fuzz_tokenizer -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "eh/model/model_file.hpp"
#include "eh/tokenizer/stream_decoder.hpp"
#include "eh/tokenizer/tokenizer.hpp"

namespace {

struct Backends {
    std::vector<std::unique_ptr<eh::model::ModelFile>> files;
    std::vector<std::unique_ptr<eh::tokenizer::Tokenizer>> toks;
    Backends() {
        const std::string td = EH_TESTDATA_DIR;
        toks.push_back(eh::tokenizer::Tokenizer::from_hf_json(td + "/tokenizers/gpt2"));
        toks.push_back(eh::tokenizer::Tokenizer::from_hf_json(td + "/tokenizers/phi-3-mini"));
        for (const char* v : {"gpt-2", "llama-spm"}) {
            files.push_back(eh::model::ModelFile::open(td + "/vocab/ggml-vocab-" + v + ".gguf"));
            toks.push_back(eh::tokenizer::Tokenizer::from_view(files.back()->view()));
        }
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static Backends b;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    for (const auto& tok : b.toks) {
        for (bool special : {false, true}) {
            const auto ids = tok->encode(text, special, special);
            for (int32_t id : ids)
                if (id < 0 || static_cast<size_t>(id) >= tok->vocab_size()) __builtin_trap();
            (void)tok->decode(ids, special);
            eh::tokenizer::StreamDecoder d(*tok, special);
            std::string out;
            for (int32_t id : ids) out += d.feed(id);
            out += d.flush();
            if (eh::tokenizer::sanitize_utf8(out) != out) __builtin_trap();
        }
    }
    return 0;
}
