// The text codec the server uses: the real tokenizer when it is built
// (host/tokenizer), otherwise a minimal stand-in read from the GGUF vocabulary.
#pragma once

#include <memory>
#include <string>

#include "eh/model/model_file.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::cli {

std::shared_ptr<service::TextCodec> make_codec(const model::ModelFile& file);

}  // namespace eh::cli
