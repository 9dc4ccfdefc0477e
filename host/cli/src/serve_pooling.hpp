// Which mode a server runs in -- text, embeddings or rerank scores -- from
// the serve flags and the model file, and what the mode needs from the file
// (the reranker's yes/no head, its prompt).
#pragma once

#include "eh/model/model_file.hpp"
#include "eh/service/pooling.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::cli {

// --embedding, --rerank, or neither (Auto: the model's `<arch>.pooling_type`
// decides: last -> embeddings, rank -> rerank, none or absent -> text).
enum class PoolingFlag { Auto, Embedding, Rerank };

// Throws Error(ModelLoadFailed) naming the reason for a model that cannot
// serve the mode: mean or CLS pooling (only the last token's state is handed
// out), a reranker asked for embeddings or the other way round, no yes/no
// head, a rerank prompt without {query} and {document}.
service::PoolingSpec pooling_spec(const model::ModelFile& file, const service::TextCodec& codec, PoolingFlag flag);

}  // namespace eh::cli
