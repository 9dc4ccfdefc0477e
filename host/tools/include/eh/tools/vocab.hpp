// Tokenizer metadata for forged and converted files, taken from a real
// vocabulary: a vocab-only GGUF (its tokenizer.* keys are copied as they
// are) or a Hugging Face tokenizer.json (written out the way llama.cpp's
// converter writes a BPE vocabulary: tokens padded to the embedding's row
// count with "[PAD<i>]", token types, merges, chat template).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"

namespace eh::tools {

struct Vocab {
    std::vector<std::pair<std::string, model::GgufValue>> kv;  // tokenizer.* keys
    uint64_t n_tokens = 0;   // entries in tokenizer.ggml.tokens
    std::string source;      // file it came from, or "synthetic"
};

// `pad_to`: minimum token count (tokenizer.json only; padded with
// [PAD<i>] entries of type UNUSED). `pre` is tokenizer.ggml.pre for a
// tokenizer.json. `extra` keys (special ids, ...) are appended, replacing
// same-named keys the source carries. Throws eh::Error(ModelLoadFailed)
// naming the file on malformed input.
Vocab load_vocab(const std::string& path, uint64_t pad_to, const std::string& pre,
                 const std::vector<std::pair<std::string, model::GgufValue>>& extra);

// A placeholder vocabulary ("<tok N>") for when no real one is available.
Vocab synthetic_vocab(uint64_t n_tokens);

// The shared test data folder: $EH_TESTDATA_DIR, else the path the build
// was configured with, else ../shared/testdata. "" when none exists.
std::string testdata_dir();

// One metadata value of an open file, as a value the writer can write.
model::GgufValue to_gguf_value(const eh_value& v);

}  // namespace eh::tools
