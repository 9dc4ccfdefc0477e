#include "serve_pooling.hpp"

#include <fmt/format.h>

#include <engine_host/quant_blocks.hpp>

#include "eh/error.hpp"

namespace eh::cli {
namespace {

using service::GgufPooling;
using service::PoolingMode;

[[noreturn]] void refuse(const std::string& why) { throw Error(Code::ModelLoadFailed, why); }

// Row `row` of a 2-D weight {n, rows} as floats.
std::vector<float> weight_row(const eh_tensor& t, uint64_t row, const std::string& name) {
    const uint64_t n = t.dims[0];
    if (row >= t.dims[1]) refuse(fmt::format("{} has {} rows; row {} was asked for", name, t.dims[1], row));
    const uint64_t bytes = ehp::quant::row_bytes(t.type, n);
    if (!bytes || (row + 1) * bytes > t.nbytes) refuse(fmt::format("{} is shorter than its shape says", name));
    std::vector<float> out(n);
    if (!ehp::quant::dequantize_row(t.type, static_cast<const uint8_t*>(t.data) + row * bytes, out.data(), n))
        refuse(fmt::format("{} is stored as type {}, which the host cannot read", name, model::tensor_type_name(t.type)));
    return out;
}

// The id of `word` when it is one token of the vocabulary.
int32_t single_token(const service::TextCodec& codec, const char* word) {
    const std::vector<int32_t> ids = codec.encode(word, false);
    if (ids.size() != 1)
        refuse(fmt::format("the reranker's answer \"{}\" is {} tokens in this vocabulary, not one", word, ids.size()));
    return ids[0];
}

// head = the "yes" row minus the "no" row: llama.cpp's converter writes the
// two as cls.output.weight (labels in <arch>.classifier.output_labels, yes
// first); a checkpoint kept whole has them in its LM head.
void rerank_head(const model::ModelFile& file, const service::TextCodec& codec, service::PoolingSpec& spec) {
    if (const eh_tensor* cls = file.find_tensor("cls.output.weight")) {
        uint64_t yes = 0, no = 1;
        if (const eh_value* labels = file.find(file.arch_key("classifier.output_labels"));
            labels && labels->type == EH_VALUE_ARRAY && labels->elem_type == EH_VALUE_STRING) {
            const auto* s = static_cast<const eh_string*>(labels->v.array);
            yes = no = labels->count;
            for (uint64_t i = 0; i < labels->count; ++i) {
                if (model::to_sv(s[i]) == "yes") yes = i;
                if (model::to_sv(s[i]) == "no") no = i;
            }
            if (yes == labels->count || no == labels->count)
                refuse("the reranker's classifier.output_labels do not name \"yes\" and \"no\"");
        }
        const auto y = weight_row(*cls, yes, "cls.output.weight"), n = weight_row(*cls, no, "cls.output.weight");
        spec.rerank_head.resize(y.size());
        for (size_t i = 0; i < y.size(); ++i) spec.rerank_head[i] = y[i] - n[i];
        spec.head_source = "cls.output.weight";
        return;
    }
    const char* name = file.find_tensor("output.weight") ? "output.weight" : "token_embd.weight";
    const eh_tensor* head = file.find_tensor(name);
    if (!head) refuse("the reranker has no cls.output.weight, output.weight or token_embd.weight to score with");
    const auto y = weight_row(*head, uint64_t(single_token(codec, "yes")), name);
    const auto n = weight_row(*head, uint64_t(single_token(codec, "no")), name);
    spec.rerank_head.resize(y.size());
    for (size_t i = 0; i < y.size(); ++i) spec.rerank_head[i] = y[i] - n[i];
    spec.head_source = std::string(name) + " rows of \"yes\" and \"no\"";
}

}  // namespace

service::PoolingSpec pooling_spec(const model::ModelFile& file, const service::TextCodec& codec, PoolingFlag flag) {
    const std::string key = file.arch_key("pooling_type");
    const std::optional<int64_t> type = file.get_int(key);
    const auto pooling = GgufPooling(type.value_or(0));
    auto unserved = [&](const char* what) {
        refuse(fmt::format("the model's pooling type is {} ({} = {}): only last-token pooling is served (a step "
                           "hands out the last position's hidden state, ABI 1.5)",
                           what, key, *type));
    };
    if (pooling == GgufPooling::Mean) unserved("mean");
    if (pooling == GgufPooling::Cls) unserved("cls");
    if (type && (*type < 0 || *type > 4)) refuse(fmt::format("the model's {} is {}, not a pooling type (0-4)", key, *type));
    service::PoolingSpec spec;
    if (flag == PoolingFlag::Auto)
        spec.mode = pooling == GgufPooling::Last ? PoolingMode::Embedding
                    : pooling == GgufPooling::Rank ? PoolingMode::Rerank
                                                   : PoolingMode::None;
    else spec.mode = flag == PoolingFlag::Rerank ? PoolingMode::Rerank : PoolingMode::Embedding;
    if (spec.mode == PoolingMode::Embedding && pooling == GgufPooling::Rank)
        refuse(fmt::format("the model is a reranker ({} = 4, rank): serve it with --rerank", key));
    if (spec.mode == PoolingMode::Rerank && pooling == GgufPooling::Last)
        refuse(fmt::format("the model is an embedding model ({} = 3, last): serve it with --embedding", key));
    if (spec.mode != PoolingMode::Rerank) return spec;
    rerank_head(file, codec, spec);
    if (const auto n_embd = file.get_uint(file.arch_key("embedding_length")); n_embd && *n_embd != spec.rerank_head.size())
        refuse(fmt::format("the rerank head ({}) has {} values, the model's hidden state {}", spec.head_source,
                           spec.rerank_head.size(), *n_embd));
    const auto tmpl = file.get_string("tokenizer.chat_template.rerank");
    spec.rerank_template = tmpl ? std::string(*tmpl) : std::string(service::kQwen3RerankTemplate);
    if (spec.rerank_template.find("{query}") == std::string::npos ||
        spec.rerank_template.find("{document}") == std::string::npos)
        refuse("the model's rerank prompt (tokenizer.chat_template.rerank) lacks {query} or {document}");
    return spec;
}

}  // namespace eh::cli
