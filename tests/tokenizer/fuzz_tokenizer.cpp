// libFuzzer target: arbitrary bytes through encode / decode / stream decode of
// the hf-json and GGUF backends, and encode_with_literals, which must equal
// encode() with parse_special when nothing is literal and without it when
// everything is. Built only with EH_ENABLE_FUZZERS=ON (clang).
// The tokenizer sources are compiled into the target (instrumented).
//   build-fuzz/bin/fuzz_tokenizer corpus tests/tokenizer/fuzz_tokenizer_seeds -max_total_time=60
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
        std::vector<int32_t> plain;  // encode(text, false, false), checked again below
        for (bool special : {false, true}) {
            const auto ids = tok->encode(text, special, special);
            if (!special) plain = ids;
            for (int32_t id : ids)
                if (id < 0 || static_cast<size_t>(id) >= tok->vocab_size()) __builtin_trap();
            (void)tok->decode(ids, special);
            eh::tokenizer::StreamDecoder d(*tok, special);
            std::string out;
            for (int32_t id : ids) out += d.feed(id);
            out += d.flush();
            if (eh::tokenizer::sanitize_utf8(out) != out) __builtin_trap();
        }
        using Range = eh::tokenizer::Tokenizer::Range;
        const Range all{0, text.size()};
        if (tok->encode_with_literals(text, false, {}) != tok->encode(text, false, true)) __builtin_trap();
        if (tok->encode_with_literals(text, false, std::span<const Range>(&all, 1)) != plain) __builtin_trap();
        const Range middle{text.size() / 3, 2 * text.size() / 3};
        for (int32_t id : tok->encode_with_literals(text, true, std::span<const Range>(&middle, 1)))
            if (id < 0 || static_cast<size_t>(id) >= tok->vocab_size()) __builtin_trap();
    }
    return 0;
}
