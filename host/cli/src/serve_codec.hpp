// The text codec the server uses: the model's tokenizer (host/tokenizer) and
// its chat template, adapted to the service's TextCodec interface.
#pragma once

#include <memory>

#include "eh/model/model_file.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::cli {

std::shared_ptr<service::TextCodec> make_codec(const model::ModelFile& file);

}  // namespace eh::cli
